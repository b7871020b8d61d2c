//===- Program.h - a loaded, validated program file --------------*- C++ -*-===//
//
// The runtime's decoded form of a program file (schema: runtime/schema/
// program.fbs). Loading checks everything an executor later relies on — the
// envelope (identifier, version, checksum), the FlatBuffers structure, and
// the program's own consistency (buffer indices, shapes against sizes,
// buffers inside the arena, a kernel for every op, collective axes on the
// mesh) — so execution never meets a malformed instruction.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_PROGRAM_H
#define ERNIE_RUNTIME_PROGRAM_H

#include "ernie/runtime/Communicator.h"
#include "ernie/runtime/Kernel.h"
#include "ernie/runtime/Mesh.h"
#include "ernie/runtime/PipelineSchedule.h"

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ernie::runtime {

/// A program file that cannot be used: the message says which file and why.
struct ProgramError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// How a global tensor is split over the mesh (`#ernie.sharding`): per
/// dimension the axes splitting it, major to minor, and the axes holding a
/// pending reduction.
struct ShardingSpec {
  std::vector<Axes> dims;
  std::vector<std::pair<std::string, ReduceOp>> partials;

  bool isReplicated() const;
};

/// What an argument (or result) is to the caller.
enum class Role {
  Input,
  Parameter,
  OptimizerState,
  LearningRate,
  Step,
  Loss,
  Residual, // pipeline: a chunk's forward result kept for its backward
  Gradient, // pipeline: a parameter's gradient (backward result, update arg;
            // a call that takes one may write over it: the runtime refills
            // the step's sums before they are read again)
  MicroBatchMax, // pipeline: a maximum (an fp8 amax) per micro-batch; the
                 // update takes the step's largest
  MicroBatchSum, // pipeline: a sum over the batch (MoE routing's usage) per
                 // micro-batch; the update takes the step's sum
  Metric,        // a scalar result the step reports beside the loss, by name
};

/// The role's name in messages ("optimizer state", "micro-batch max").
const char *roleName(Role role);

/// Whether each micro-batch makes a value of this role that the runtime
/// combines over the step (by max or by sum) and hands to the update.
inline bool isMicroBatchReduced(Role role) {
  return role == Role::MicroBatchMax || role == Role::MicroBatchSum;
}

/// The parameter whose master weight (the f32 copy a narrow parameter's
/// update works on) state `name` is: "<p>" of "<p>:master", else "".
std::string masterWeightOf(const std::string &name);

/// A function argument or result: one rank's piece of a global tensor.
struct TensorSpec {
  std::string name; // parameter or state name; may be empty
  Role role = Role::Input;
  DType type = DType::F32;
  std::vector<int64_t> globalShape, localShape;
  ShardingSpec sharding;
  uint32_t buffer = 0;
  std::string updates; // results: the state it replaces for the next step
};

struct BufferSpec {
  DType type = DType::F32;
  std::vector<int64_t> shape;
  uint64_t offset = 0, bytes = 0;
};

struct Instruction {
  std::string op;
  std::vector<uint32_t> operands, results;
  Attrs attrs;
  Axes axes;                 // collectives
  std::vector<uint8_t> data; // constants
  std::string location;
  const Kernel *kernel = nullptr; // null for the executor's own ops
  // "ernie.fused": its body and the kernel compiled from it (`kernel`
  // points at it); shared, so copies of a program keep it alive.
  std::shared_ptr<const FusedBody> body;
  std::shared_ptr<const Kernel> fusedKernel;
};

struct Function {
  std::string name;
  std::vector<TensorSpec> arguments, results;
  std::vector<BufferSpec> buffers;
  std::vector<Instruction> instructions;
  /// What the runtime allocates per rank: every buffer lies below it but
  /// those in the arguments' region.
  uint64_t arenaBytes = 0;
  /// The arguments' region, [arenaBytes, arenaBytes + argumentBytes): each
  /// argument's buffer and its views, bound per call to the caller's tensor
  /// or to a copy staged for it, never allocated as a whole. 0 in files
  /// that plan arguments inside the arena.
  uint64_t argumentBytes = 0;

  /// Whether buffer `b` lies in the arguments' region (zero-byte buffers
  /// are nowhere: they are never read).
  bool inArgumentRegion(uint32_t b) const {
    return argumentBytes > 0 && buffers[b].bytes > 0 &&
           buffers[b].offset >= arenaBytes;
  }
};

/// A pipelined program (the file's Pipeline table): C = stages x
/// virtualStages model chunks, chunk c on the stage (stage-axis coordinate)
/// c mod stages. Per chunk c its stage holds "train_forward.<c>",
/// "train_backward.<c>" and "eval_forward.<c>"; per stage s "train_update.<s>"
/// and optionally "init.<s>" (pipelineFunction() spells the names).
struct PipelineSpec {
  int64_t microBatches = 1;
  int64_t virtualStages = 1;
  std::string schedule; // the schedule's name, as the file gives it
  /// Per stage, its training steps in order (checked by checkSchedule).
  PipelineSchedule steps;
  /// Per batch input k (the arguments named "input.<k>"): its micro-batch
  /// spec as the first function taking it has it. Every function taking
  /// input k agrees on its micro-batch global shape; a call's input k has
  /// microBatches times as many rows (dimension 0).
  std::vector<TensorSpec> inputs;
};

/// "train_forward.3", "train_update.1", ...: `kind` and the chunk or stage.
std::string pipelineFunction(const std::string &kind, int64_t index);

class Program {
public:
  /// Reads and validates `path`; throws ProgramError.
  static Program load(const std::string &path);
  /// Validates `size` bytes at `data` (8-byte aligned: FlatBuffers reads
  /// scalars in place); `source` names them in messages.
  static Program parse(const void *data, size_t size, const std::string &source);
  /// The same for bytes at any address: they are copied to aligned storage.
  static Program fromBytes(std::string_view bytes, const std::string &source);

  const Mesh &mesh() const { return mesh_; }
  const std::string &source() const { return source_; }
  const std::string &producer() const { return producer_; }
  int64_t numStages() const { return static_cast<int64_t>(stages_.size()); }
  /// The stage `rank` runs: its coordinate along the stage axis.
  int64_t stageOf(int64_t rank) const;
  /// `name` in `stage`, or null.
  const Function *function(int64_t stage, const std::string &name) const;
  /// `name` in `stage`; throws std::invalid_argument naming the functions
  /// there when it is missing.
  const Function &requireFunction(int64_t stage, const std::string &name) const;
  const std::vector<Function> &functions(int64_t stage) const {
    return stages_.at(stage);
  }
  /// The mesh axis whose coordinate is a rank's stage ("" : one stage).
  const std::string &stageAxis() const { return stageAxis_; }

  /// The pipeline, or null when the program is not pipelined.
  const PipelineSpec *pipeline() const {
    return pipeline_ ? &*pipeline_ : nullptr;
  }
  bool isPipelined() const { return pipeline_.has_value(); }
  /// Pipelined programs: the chunks `stage` runs, ascending.
  std::vector<int64_t> chunksOf(int64_t stage) const;
  int64_t numChunks() const;
  /// The rank with `rank`'s coordinates except `stage` along the stage axis.
  int64_t rankInStage(int64_t rank, int64_t stage) const;

  /// The stages whose functions take state (a parameter or an optimizer
  /// slot) `name`, ascending.
  std::vector<int64_t> stagesHolding(const std::string &name) const;
  /// Every state name any function takes, sorted.
  std::vector<std::string> stateNames() const;

private:
  Program(Mesh mesh) : mesh_(std::move(mesh)) {}
  Mesh mesh_;
  std::string source_, producer_, stageAxis_;
  std::vector<std::vector<Function>> stages_;
  std::optional<PipelineSpec> pipeline_;
};

/// True for the ops the executor runs itself rather than through a kernel:
/// constants, collectives (blocking, and started with their waits), the
/// mesh-position ops and the pipeline's point-to-point ops (ernie.send,
/// ernie.recv, ernie.stage_all_reduce, ernie.stage_broadcast).
bool isExecutorOp(const std::string &op);

/// Whether `inst` (of `fn`) is a reshape into a view of its operand (the
/// memory plan's views: the result at the operand's offset), which moves
/// no bytes: it writes nothing, and its result is its operand's memory.
bool isView(const Function &fn, const Instruction &inst);

/// The blocking collective a bucket op stands for ("ernie.all_reduce" for
/// "ernie.all_reduce_start", likewise reduce_scatter and all_gather: one
/// message carrying that collective of every operand), or null for any
/// other op. No allocation: the executor asks it per instruction.
const char *bucketedCollective(const std::string &op);

/// Why the CPU kernel of `inst` could not run on its buffers in `fn` (the
/// operand and result counts, element types and shapes its op's rule
/// requires, and its attributes), or "" when it can. Program::load applies it
/// to every kernel instruction; kernels then never read or write past a
/// buffer.
std::string kernelSignatureProblem(const Instruction &inst, const Function &fn);

/// An op the loader accepts, with the operand and result counts it checks
/// (-1: one or more; an executor op with -1 for both: as many results as
/// operands). `executor`: run by the executor itself, not a kernel.
struct RuntimeOp {
  std::string op;
  int operands, results;
  bool executor;
};

/// Every op a program file may hold (besides fused regions), as the loader
/// checks it: what test/Unit/OpSignatureTest compares with the dialect's
/// definitions, so that the two never drift apart.
std::vector<RuntimeOp> runtimeOps();

struct HostTensor;

/// Why a call of `fn` with these global batch `inputs` (in argument order;
/// pipelines: "train_step"/"eval_step" with the full batches), learning rate
/// `lr` and 1-based `step` cannot run, or "": the input count, each input's
/// shape and exact element type (integer ids are never taken from floats,
/// nor floats from integers), a finite learning rate, step >= 1. Sessions
/// (C++ and Python) check it before any rank starts.
std::string callProblem(const Program &program, const std::string &fn,
                        const std::vector<HostTensor> &inputs, double lr,
                        int64_t step);

/// Where ernie.shard_insert's operands are: the dialect's order ("%piece
/// into %dest"), which the program file keeps.
constexpr size_t kShardInsertPiece = 0, kShardInsertDest = 1;

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_PROGRAM_H

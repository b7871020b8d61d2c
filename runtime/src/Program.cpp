//===- Program.cpp - loading and validating program files --------------------===//

#include "ernie/runtime/Program.h"
#include "ernie/runtime/HostTensor.h"
#include "ernie/runtime/PipelineSchedule.h"

#include "ernie/program/program_generated.h"
#include "ernie/runtime/ProgramFormat.h"

#include <zlib.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

namespace ernie::runtime {
namespace fb = ernie::program;

bool ShardingSpec::isReplicated() const {
  return partials.empty() &&
         std::all_of(dims.begin(), dims.end(),
                     [](const Axes &axes) { return axes.empty(); });
}

namespace {

/// The ops the executor runs itself, besides constants: how many operands
/// and results each takes and whether it names a group by axes.
struct ExecutorOpSignature {
  const char *op;
  size_t operands, results;
  bool needsAxes;
};

constexpr ExecutorOpSignature kExecutorOps[] = {
    {"ernie.all_reduce", 1, 1, true},
    {"ernie.all_gather", 1, 1, true},
    {"ernie.reduce_scatter", 1, 1, true},
    {"ernie.all_to_all", 1, 1, true},
    {"ernie.collective_permute_start", 1, 1, true},
    {"ernie.wait", 1, 1, false},
    {"ernie.shard_slice", 1, 1, true},
    {"ernie.shard_insert", 2, 1, true},
    {"ernie.partial_init", 1, 1, true},
    {"ernie.axis_index", 0, 1, false},
    // Pipelines: point to point between stages (Program.h).
    {"ernie.send", 1, 0, false},
    {"ernie.recv", 0, 1, false},
    {"ernie.stage_all_reduce", 1, 1, false},
    {"ernie.stage_broadcast", 1, 1, false},
};

/// The pipeline's point-to-point ops: they talk across stages.
bool isStageOp(const std::string &op) {
  return op == "ernie.send" || op == "ernie.recv" ||
         op == "ernie.stage_all_reduce" || op == "ernie.stage_broadcast";
}

const ExecutorOpSignature *executorOpSignature(const std::string &op) {
  for (const ExecutorOpSignature &s : kExecutorOps)
    if (op == s.op)
      return &s;
  return nullptr;
}

} // namespace

bool isExecutorOp(const std::string &op) {
  return op == "ernie.constant" || executorOpSignature(op) != nullptr;
}

namespace {

/// Collects the first problem found, prefixed with where it is.
class Checker {
public:
  explicit Checker(std::string source) : source_(std::move(source)) {}
  [[noreturn]] void fail(const std::string &what) const {
    throw ProgramError(source_ + ": " + what);
  }
  void require(bool ok, const std::string &what) const {
    if (!ok)
      fail(what);
  }

private:
  std::string source_;
};

DType decode(fb::DType t, const Checker &check) {
  switch (t) {
  case fb::DType::F64: return DType::F64;
  case fb::DType::F32: return DType::F32;
  case fb::DType::F16: return DType::F16;
  case fb::DType::BF16: return DType::BF16;
  case fb::DType::F8E4M3FN: return DType::F8E4M3FN;
  case fb::DType::F8E5M2: return DType::F8E5M2;
  case fb::DType::I64: return DType::I64;
  case fb::DType::I32: return DType::I32;
  case fb::DType::I1: return DType::I1;
  }
  check.fail("unknown element type code " + std::to_string(int(t)));
}

ReduceOp decode(fb::ReduceKind k, const Checker &check) {
  switch (k) {
  case fb::ReduceKind::Sum: return ReduceOp::Sum;
  case fb::ReduceKind::Avg: return ReduceOp::Avg;
  case fb::ReduceKind::Max: return ReduceOp::Max;
  case fb::ReduceKind::Min: return ReduceOp::Min;
  }
  check.fail("unknown reduce kind code " + std::to_string(int(k)));
}

Role decode(fb::Role r, const Checker &check) {
  switch (r) {
  case fb::Role::Input: return Role::Input;
  case fb::Role::Parameter: return Role::Parameter;
  case fb::Role::OptimizerState: return Role::OptimizerState;
  case fb::Role::LearningRate: return Role::LearningRate;
  case fb::Role::Step: return Role::Step;
  case fb::Role::Loss: return Role::Loss;
  case fb::Role::Residual: return Role::Residual;
  case fb::Role::Gradient: return Role::Gradient;
  case fb::Role::MicroBatchMax: return Role::MicroBatchMax;
  }
  check.fail("unknown role code " + std::to_string(int(r)));
}

std::string str(const flatbuffers::String *s) { return s ? s->str() : ""; }

std::vector<int64_t> ints(const flatbuffers::Vector<int64_t> *v) {
  return v ? std::vector<int64_t>(v->begin(), v->end()) : std::vector<int64_t>{};
}

Axes strings(const flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>> *v) {
  Axes out;
  if (v)
    for (const flatbuffers::String *s : *v)
      out.push_back(s->str());
  return out;
}

int64_t elementsOf(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

Attrs decodeAttrs(const flatbuffers::Vector<flatbuffers::Offset<fb::Attr>> *attrs,
                  const Checker &check, const std::string &where) {
  Attrs out;
  if (!attrs)
    return out;
  for (const fb::Attr *a : *attrs) {
    const std::string name = a->name()->str();
    switch (a->value_type()) {
    case fb::AttrValue::IntValue:
      out.set(name, int64_t(a->value_as_IntValue()->value()));
      break;
    case fb::AttrValue::FloatValue:
      out.set(name, a->value_as_FloatValue()->value());
      break;
    case fb::AttrValue::BoolValue:
      out.set(name, a->value_as_BoolValue()->value());
      break;
    case fb::AttrValue::StringValue:
      out.set(name, str(a->value_as_StringValue()->value()));
      break;
    case fb::AttrValue::IntsValue:
      out.set(name, ints(a->value_as_IntsValue()->values()));
      break;
    default:
      check.fail(where + ": attribute '" + name + "' has an unknown kind");
    }
  }
  return out;
}

ShardingSpec decodeSharding(const fb::Sharding *s, const Mesh &mesh,
                            const Checker &check, const std::string &where) {
  ShardingSpec spec;
  if (!s)
    return spec;
  auto knownAxis = [&](const std::string &axis) {
    const auto &names = mesh.axisNames();
    check.require(std::find(names.begin(), names.end(), axis) != names.end(),
                  where + ": sharding names axis '" + axis +
                      "', which the mesh does not have");
  };
  if (s->dims())
    for (const fb::DimSharding *d : *s->dims()) {
      spec.dims.push_back(strings(d->axes()));
      for (const std::string &axis : spec.dims.back())
        knownAxis(axis);
    }
  if (s->partials())
    for (const fb::Partial *p : *s->partials()) {
      knownAxis(p->axis()->str());
      spec.partials.emplace_back(p->axis()->str(), decode(p->kind(), check));
    }
  return spec;
}

int64_t axesSize(const Mesh &mesh, const Axes &axes) {
  int64_t n = 1;
  for (const std::string &axis : axes)
    n *= mesh.axisSizes()[mesh.axisIndex(axis)];
  return n;
}

TensorSpec decodeTensor(const fb::TensorSpec *t, const Function &fn,
                        const Mesh &mesh, const Checker &check,
                        const std::string &where) {
  TensorSpec spec;
  spec.name = str(t->name());
  spec.role = decode(t->role(), check);
  spec.type = decode(t->dtype(), check);
  spec.globalShape = ints(t->global_shape());
  spec.localShape = ints(t->local_shape());
  spec.sharding = decodeSharding(t->sharding(), mesh, check, where);
  spec.buffer = t->buffer();
  spec.updates = str(t->updates());
  check.require(spec.buffer < fn.buffers.size(),
                where + ": buffer " + std::to_string(spec.buffer) +
                    " does not exist");
  const BufferSpec &b = fn.buffers[spec.buffer];
  check.require(b.shape == spec.localShape && b.type == spec.type,
                where + ": local " + shapeString(spec.localShape) + "x" +
                    std::string(name(spec.type)) + " does not match its buffer " +
                    shapeString(b.shape) + "x" + std::string(name(b.type)));
  check.require(spec.globalShape.size() == spec.localShape.size(),
                where + ": global and local ranks differ");
  check.require(spec.sharding.dims.empty() ||
                    spec.sharding.dims.size() == spec.localShape.size(),
                where + ": the sharding has the wrong number of dimensions");
  for (size_t d = 0; d < spec.localShape.size(); ++d) {
    int64_t parts =
        spec.sharding.dims.empty() ? 1 : axesSize(mesh, spec.sharding.dims[d]);
    check.require(spec.localShape[d] * parts == spec.globalShape[d],
                  where + ": global " + shapeString(spec.globalShape) +
                      " is not local " + shapeString(spec.localShape) +
                      " times its sharding");
  }
  return spec;
}

/// Why the executor could not run collective `inst` on its buffers (the
/// dialect verifier's shape rules: the executor writes the result from
/// them), or "" when it can.
std::string collectiveShapeProblem(const Instruction &inst, const Function &fn,
                                   const Mesh &mesh) {
  const BufferSpec &out = fn.buffers[inst.results[0]];
  if (inst.op == "ernie.axis_index")
    return out.type == DType::I64 && elementsOf(out.shape) == 1
               ? ""
               : "the result must be one i64";
  // The operand the result is shaped from (shard_insert: the destination).
  const BufferSpec &in =
      fn.buffers[inst.operands
                     [inst.op == "ernie.shard_insert" ? kShardInsertDest : 0]];
  if (in.type != out.type || in.shape.size() != out.shape.size())
    return "the result must keep the operand's rank and element type";
  int64_t n = axesSize(mesh, inst.axes), rank = in.shape.size();
  std::vector<int64_t> want = in.shape;
  auto dim = [&](const char *key, int64_t &d) {
    try {
      d = inst.attrs.getInt(key);
    } catch (const KernelError &) {
      return false; // missing, or not an integer
    }
    return d >= 0 && d < rank;
  };
  auto divide = [&](int64_t d) {
    if (want[d] % n != 0)
      return false;
    want[d] /= n;
    return true;
  };
  // `shift`: an integer, required by the permute, optional (0) elsewhere.
  bool shifted = inst.op == "ernie.collective_permute_start" ||
                 inst.op == "ernie.shard_slice" ||
                 inst.op == "ernie.shard_insert";
  if (shifted && (inst.attrs.has("shift") ||
                  inst.op == "ernie.collective_permute_start")) {
    try {
      inst.attrs.getInt("shift");
    } catch (const KernelError &) {
      return "'shift' is missing or not an integer";
    }
  }
  int64_t d = 0, concat = 0;
  if (inst.op == "ernie.all_gather" || inst.op == "ernie.reduce_scatter" ||
      inst.op == "ernie.shard_slice") {
    if (!dim("dim", d))
      return "'dim' is missing or out of range";
    if (inst.op == "ernie.all_gather")
      want[d] *= n;
    else if (!divide(d))
      return "dimension " + std::to_string(d) + " does not divide over " +
             std::to_string(n) + " ranks";
  } else if (inst.op == "ernie.shard_insert") {
    // out is dest; the piece is dest's n-th part along `dim`.
    if (!dim("dim", d))
      return "'dim' is missing or out of range";
    const BufferSpec &piece = fn.buffers[inst.operands[kShardInsertPiece]];
    std::vector<int64_t> part = in.shape;
    if (part[d] % n != 0)
      return "dimension " + std::to_string(d) + " does not divide over " +
             std::to_string(n) + " ranks";
    part[d] /= n;
    if (piece.type != in.type || piece.shape != part)
      return "the piece must be " + shapeString(part) + "x" +
             std::string(name(in.type)) + " (the destination " +
             shapeString(in.shape) + " split " + std::to_string(n) +
             " ways along dimension " + std::to_string(d) + "), not " +
             shapeString(piece.shape) + "x" + std::string(name(piece.type));
  } else if (inst.op == "ernie.all_to_all") {
    if (!dim("split_dim", d) || !dim("concat_dim", concat))
      return "'split_dim' or 'concat_dim' is missing or out of range";
    if (d != concat) {
      if (!divide(d))
        return "split_dim " + std::to_string(d) + " does not divide over " +
               std::to_string(n) + " ranks";
      want[concat] *= n;
    }
  }
  if (out.shape != want)
    return "the result must be " + shapeString(want) + ", not " +
           shapeString(out.shape);
  return "";
}

/// Why the executor could not run pipeline op `inst` (its attributes, and
/// for the stage collectives the result against the operand), or "". What
/// depends on the stage (peers, member lists) is checked per stage later.
std::string stageOpProblem(const Instruction &inst, const Function &fn) {
  auto integer = [&](const char *key, bool nonNegative) -> std::string {
    int64_t v;
    try {
      v = inst.attrs.getInt(key);
    } catch (const KernelError &) {
      return std::string("'") + key + "' is missing or not an integer";
    }
    if (nonNegative && v < 0)
      return std::string("'") + key + "' is negative";
    return "";
  };
  std::string problem = integer("channel", true);
  if (!problem.empty())
    return problem;
  if (inst.op == "ernie.send" || inst.op == "ernie.recv")
    return integer("peer", false);
  try {
    inst.attrs.getInts("stages");
  } catch (const KernelError &) {
    return "'stages' is missing or not a list of integers";
  }
  const BufferSpec &in = fn.buffers[inst.operands[0]];
  const BufferSpec &out = fn.buffers[inst.results[0]];
  if (in.type != out.type || in.shape != out.shape)
    return "the result must be " + shapeString(in.shape) + "x" +
           std::string(name(in.type)) + " like the operand, not " +
           shapeString(out.shape) + "x" + std::string(name(out.type));
  return "";
}

/// The two buffers share arena bytes.
bool overlap(const BufferSpec &a, const BufferSpec &b) {
  return a.bytes && b.bytes && a.offset < b.offset + b.bytes &&
         b.offset < a.offset + a.bytes;
}

/// Every ernie.wait takes the result of an earlier
/// ernie.collective_permute_start, and every start has exactly one later
/// wait. Between the two the communication thread reads the start's operand
/// and writes its result, so no instruction in between may write memory of
/// either or read memory of the result: the executor would race with the
/// transfer.
void checkStartsAndWaits(const Function &fn, const std::string &at,
                         const Checker &check) {
  auto where = [&](size_t index) {
    return at + ", instruction #" + std::to_string(index) + " (" +
           fn.instructions[index].op + ")";
  };
  auto buffer = [](uint32_t b) { return "buffer " + std::to_string(b); };
  std::map<uint32_t, size_t> inFlight; // a start's result -> its index
  for (size_t i = 0; i < fn.instructions.size(); ++i) {
    const Instruction &inst = fn.instructions[i];
    if (inst.op == "ernie.wait") {
      auto it = inFlight.find(inst.operands[0]);
      check.require(it != inFlight.end(),
                    where(i) + ": its operand (" + buffer(inst.operands[0]) +
                        ") is not the result of an earlier "
                        "ernie.collective_permute_start awaiting its wait");
      inFlight.erase(it); // Its result is written now: checked below.
    }
    if (inst.op == "ernie.collective_permute_start") {
      auto it = inFlight.find(inst.results[0]);
      if (it != inFlight.end())
        check.fail(where(i) + ": its result (" + buffer(inst.results[0]) +
                   ") is still in flight from instruction #" +
                   std::to_string(it->second));
    }
    for (const auto &[result, start] : inFlight) {
      uint32_t operand = fn.instructions[start].operands[0];
      auto conflict = [&](uint32_t b, const char *verb, uint32_t other,
                          const char *role) {
        std::string startAt = "the ernie.collective_permute_start at "
                              "instruction #" +
                              std::to_string(start);
        check.fail(where(i) + ": " + verb + " " + buffer(b) +
                   ", whose memory overlaps " + buffer(other) + ", the " +
                   role + " of " + startAt +
                   ", which is in flight until its ernie.wait");
      };
      for (uint32_t b : inst.results) {
        if (overlap(fn.buffers[b], fn.buffers[operand]))
          conflict(b, "writes", operand, "operand");
        if (overlap(fn.buffers[b], fn.buffers[result]))
          conflict(b, "writes", result, "result");
      }
      for (uint32_t b : inst.operands)
        if (overlap(fn.buffers[b], fn.buffers[result]))
          conflict(b, "reads", result, "result");
    }
    if (inst.op == "ernie.collective_permute_start")
      inFlight[inst.results[0]] = i;
  }
  for (const auto &[result, start] : inFlight)
    check.fail(where(start) + ": no later ernie.wait takes its result (" +
               buffer(result) + ")");
}

Function decodeFunction(const fb::Function *f, const Mesh &mesh,
                        const Checker &check) {
  Function fn;
  fn.name = f->name()->str();
  fn.arenaBytes = f->arena_bytes();
  const std::string at = "function @" + fn.name;
  if (f->buffers())
    for (const fb::Buffer *b : *f->buffers()) {
      BufferSpec spec{decode(b->dtype(), check), ints(b->shape()), b->offset(),
                      b->bytes()};
      const std::string where =
          at + ", buffer " + std::to_string(fn.buffers.size());
      for (int64_t d : spec.shape)
        check.require(d >= 0, where + ": negative dimension");
      check.require(uint64_t(elementsOf(spec.shape)) * byteSize(spec.type) ==
                        spec.bytes,
                    where + ": " + std::to_string(spec.bytes) +
                        " bytes do not hold " + shapeString(spec.shape) + "x" +
                        std::string(name(spec.type)));
      check.require(spec.offset % program::kBufferAlignment == 0,
                    where + ": offset is not aligned");
      check.require(spec.offset <= fn.arenaBytes &&
                        spec.bytes <= fn.arenaBytes - spec.offset,
                    where + ": lies outside the arena of " +
                        std::to_string(fn.arenaBytes) + " bytes");
      fn.buffers.push_back(std::move(spec));
    }
  if (f->arguments())
    for (const fb::TensorSpec *t : *f->arguments())
      fn.arguments.push_back(decodeTensor(
          t, fn, mesh, check,
          at + ", argument " + std::to_string(fn.arguments.size())));
  if (f->results())
    for (const fb::TensorSpec *t : *f->results())
      fn.results.push_back(decodeTensor(
          t, fn, mesh, check,
          at + ", result " + std::to_string(fn.results.size())));
  if (f->instructions())
    for (const fb::Instruction *i : *f->instructions()) {
      Instruction inst;
      inst.op = i->op()->str();
      inst.location = str(i->location());
      const std::string where = at + ", instruction #" +
                                std::to_string(fn.instructions.size()) + " (" +
                                inst.op + ")";
      if (i->operands())
        inst.operands.assign(i->operands()->begin(), i->operands()->end());
      if (i->results())
        inst.results.assign(i->results()->begin(), i->results()->end());
      for (uint32_t b : inst.operands)
        check.require(b < fn.buffers.size(),
                      where + ": operand buffer " + std::to_string(b) +
                          " does not exist");
      for (uint32_t b : inst.results)
        check.require(b < fn.buffers.size(),
                      where + ": result buffer " + std::to_string(b) +
                          " does not exist");
      inst.attrs = decodeAttrs(i->attrs(), check, where);
      inst.axes = strings(i->axes());
      for (const std::string &axis : inst.axes) {
        const auto &names = mesh.axisNames();
        check.require(std::find(names.begin(), names.end(), axis) != names.end(),
                      where + ": names axis '" + axis +
                          "', which the mesh does not have");
      }
      if (i->data())
        inst.data.assign(i->data()->begin(), i->data()->end());
      if (!isExecutorOp(inst.op)) {
        inst.kernel = findCpuKernel(inst.op);
        check.require(inst.kernel != nullptr,
                      where + ": the CPU backend has no kernel for '" +
                          inst.op + "'");
      } else if (inst.op == "ernie.constant") {
        check.require(inst.results.size() == 1 &&
                          inst.data.size() == fn.buffers[inst.results[0]].bytes,
                      where + ": the constant's data does not fill its buffer");
      } else {
        const ExecutorOpSignature &signature = *executorOpSignature(inst.op);
        check.require(inst.results.size() == signature.results &&
                          inst.operands.size() == signature.operands,
                      where + ": wrong number of operands or results");
        check.require(!inst.axes.empty() || !signature.needsAxes,
                      where + ": a collective needs mesh axes");
        std::string problem = isStageOp(inst.op)
                                  ? stageOpProblem(inst, fn)
                                  : collectiveShapeProblem(inst, fn, mesh);
        check.require(problem.empty(), where + ": " + problem);
      }
      fn.instructions.push_back(std::move(inst));
    }
  checkStartsAndWaits(fn, at, check);
  return fn;
}

/// k for an input named "input.<k>" (decimal, no sign, no leading zeros),
/// else -1.
int64_t batchInputIndex(const std::string &name) {
  const std::string prefix = "input.";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix))
    return -1;
  std::string digits = name.substr(prefix.size());
  if (digits.size() > 9 || (digits.size() > 1 && digits[0] == '0') ||
      !std::all_of(digits.begin(), digits.end(),
                   [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  return std::stoll(digits);
}

/// A program without a Pipeline table has no pipeline roles or ops.
void checkNotPipelined(const std::vector<std::vector<Function>> &stages,
                       const Checker &check) {
  for (size_t s = 0; s < stages.size(); ++s)
    for (const Function &fn : stages[s]) {
      const std::string at = "function @" + fn.name;
      auto roles = [&](const std::vector<TensorSpec> &specs, const char *what) {
        for (size_t i = 0; i < specs.size(); ++i)
          check.require(specs[i].role != Role::Residual &&
                            specs[i].role != Role::Gradient &&
                            specs[i].role != Role::MicroBatchMax,
                        at + ", " + what + " " + std::to_string(i) +
                            ": the role " + roleName(specs[i].role) +
                            " belongs to pipelined programs (this one has "
                            "no pipeline)");
      };
      roles(fn.arguments, "argument");
      roles(fn.results, "result");
      for (size_t i = 0; i < fn.instructions.size(); ++i)
        check.require(!isStageOp(fn.instructions[i].op),
                      at + ", instruction #" + std::to_string(i) + " (" +
                          fn.instructions[i].op +
                          "): only pipelined programs talk between stages");
    }
}

/// Decodes and checks the Pipeline table and everything a pipelined
/// program's stages must hold (Program.h, program.fbs).
PipelineSpec decodePipeline(const fb::Program *p,
                            const std::vector<std::vector<Function>> &stages,
                            const std::string &stageAxis,
                            const Checker &check) {
  const fb::Pipeline *fp = p->pipeline();
  PipelineSpec spec;
  spec.microBatches = fp->micro_batches();
  spec.virtualStages = fp->virtual_stages();
  spec.schedule = str(fp->schedule());
  constexpr int64_t kLimit = int64_t(1) << 30;
  check.require(spec.microBatches >= 1 && spec.microBatches <= kLimit,
                "has a pipeline of " + std::to_string(spec.microBatches) +
                    " micro-batches; it needs at least 1");
  check.require(spec.virtualStages >= 1 && spec.virtualStages <= kLimit,
                "has a pipeline of " + std::to_string(spec.virtualStages) +
                    " virtual stages per stage; it needs at least 1");
  const int64_t S = static_cast<int64_t>(stages.size());
  const int64_t C = S * spec.virtualStages;

  // The schedule: one list per stage, then the schedule checker.
  for (int64_t s = 0; s < S; ++s) {
    const fb::Stage *stage = p->stages()->Get(static_cast<flatbuffers::uoffset_t>(s));
    std::vector<PipelineStep> steps;
    if (stage->schedule())
      for (const fb::PipelineStep *step : *stage->schedule()) {
        PipelineAction action;
        switch (step->action()) {
        case fb::PipelineAction::Forward: action = PipelineAction::Forward; break;
        case fb::PipelineAction::Backward: action = PipelineAction::Backward; break;
        default:
          check.fail("stage " + std::to_string(s) +
                     "'s schedule has an unknown action code " +
                     std::to_string(int(step->action())));
        }
        steps.push_back({action, step->chunk(), step->micro_batch()});
      }
    spec.steps.push_back(std::move(steps));
  }
  PipelineShape shape;
  shape.stages = S;
  shape.virtualStages = spec.virtualStages;
  shape.microBatches = spec.microBatches;
  std::string problem = checkSchedule(spec.steps, shape);
  check.require(problem.empty(), "has a pipeline schedule (" + spec.schedule +
                                     ") that cannot run: " + problem);

  std::map<int64_t, const TensorSpec *> inputs; // k -> first spec seen
  std::map<int64_t, std::string> inputWhere;
  for (int64_t s = 0; s < S; ++s) {
    const std::vector<Function> &fns = stages[s];
    const std::string inStage = " (stage " + std::to_string(s) + ")";
    auto find = [&](const std::string &name) -> const Function * {
      for (const Function &fn : fns)
        if (fn.name == name)
          return &fn;
      return nullptr;
    };
    auto need = [&](const std::string &name) -> const Function & {
      const Function *fn = find(name);
      if (!fn)
        check.fail("stage " + std::to_string(s) + " has no @" + name +
                   ", which its pipeline needs");
      return *fn;
    };
    auto at = [&](const Function &fn) { return "function @" + fn.name + inStage; };
    auto argAt = [&](const Function &fn, size_t i, const char *what) {
      return at(fn) + ", " + what + " " + std::to_string(i);
    };
    /// Argument or result `i` of `fn` (`spec`) has one of the `allowed` roles.
    auto requireRole = [&](const Function &fn, size_t i, const TensorSpec &spec,
                           std::initializer_list<Role> allowed, const char *what) {
      check.require(std::find(allowed.begin(), allowed.end(), spec.role) !=
                        allowed.end(),
                    argAt(fn, i, what) + ": a " + roleName(spec.role) + " " +
                        what + " has no place here");
    };
    /// Every argument's role is one of `allowed`.
    auto argRoles = [&](const Function &fn, std::initializer_list<Role> allowed) {
      for (size_t i = 0; i < fn.arguments.size(); ++i) {
        const TensorSpec &arg = fn.arguments[i];
        requireRole(fn, i, arg, allowed, "argument");
        if (arg.role == Role::Parameter || arg.role == Role::OptimizerState ||
            arg.role == Role::Residual || arg.role == Role::Gradient ||
            arg.role == Role::MicroBatchMax)
          check.require(!arg.name.empty(), argAt(fn, i, "argument") +
                                               ": a " + roleName(arg.role) +
                                               " needs a name");
        if (arg.role == Role::Input) {
          int64_t k = batchInputIndex(arg.name);
          check.require(k >= 0, argAt(fn, i, "argument") + ": a batch input "
                                                           "is named input.<k>, "
                                                           "not '" +
                                    arg.name + "'");
          check.require(!arg.globalShape.empty(),
                        argAt(fn, i, "argument") +
                            ": a batch input needs a dimension 0 to split "
                            "into micro-batches");
          auto [it, fresh] = inputs.emplace(k, &arg);
          if (fresh)
            inputWhere[k] = argAt(fn, i, "argument");
          else
            check.require(it->second->globalShape == arg.globalShape,
                          argAt(fn, i, "argument") + ": micro-batch " +
                              shapeString(arg.globalShape) + " of " + arg.name +
                              " differs from " + inputWhere[k] + "'s " +
                              shapeString(it->second->globalShape));
        }
      }
    };
    /// The number of `role` results; each is a replicated scalar if a loss.
    auto countResults = [&](const Function &fn, Role role) {
      int64_t n = 0;
      for (size_t i = 0; i < fn.results.size(); ++i) {
        const TensorSpec &res = fn.results[i];
        if (res.role != role)
          continue;
        ++n;
        if (role == Role::Loss)
          check.require(elementsOf(res.localShape) == 1 &&
                            elementsOf(res.globalShape) == 1 &&
                            res.sharding.partials.empty(),
                        argAt(fn, i, "result") +
                            ": a pipelined loss must be a replicated scalar "
                            "(no pending reduction)");
      }
      return n;
    };
    auto onlyResults = [&](const Function &fn, std::initializer_list<Role> allowed) {
      for (size_t i = 0; i < fn.results.size(); ++i)
        requireRole(fn, i, fn.results[i], allowed, "result");
    };
    auto sameLocal = [](const TensorSpec &a, const TensorSpec &b) {
      return a.type == b.type && a.localShape == b.localShape;
    };
    auto typeString = [](const TensorSpec &t) {
      return shapeString(t.localShape) + "x" + std::string(name(t.type));
    };

    // What this stage's forwards and backwards hand to its update: gradients
    // (summed over micro-batches) and maxima, by name.
    std::map<std::string, const TensorSpec *> handed;
    auto hand = [&](const Function &fn, size_t i,
                    std::set<std::string> &own) {
      const TensorSpec &res = fn.results[i];
      const std::string what = roleName(res.role);
      check.require(!res.name.empty(),
                    argAt(fn, i, "result") + ": a " + what + " needs a name");
      check.require(own.insert(res.name).second,
                    argAt(fn, i, "result") + ": a second " + what + " '" +
                        res.name + "'");
      auto [it, fresh] = handed.emplace(res.name, &res);
      check.require(fresh || (it->second->role == res.role &&
                              sameLocal(*it->second, res)),
                    argAt(fn, i, "result") + ": the " + what + " '" +
                        res.name + "' is " + typeString(res) + " here but a " +
                        roleName(it->second->role) + " of " +
                        typeString(*it->second) +
                        " in another chunk of the stage");
    };
    for (int64_t c = s; c < C; c += S) {
      const bool last = c == C - 1;
      const Function &fwd = need(pipelineFunction("train_forward", c));
      const Function &bwd = need(pipelineFunction("train_backward", c));
      const Function &ev = need(pipelineFunction("eval_forward", c));
      // State the chunks read (fp8 amax histories) is updated once per
      // step, by the update.
      argRoles(fwd, {Role::Parameter, Role::OptimizerState, Role::Input});
      onlyResults(fwd, {Role::Residual, Role::Loss, Role::MicroBatchMax});
      std::set<std::string> fwdOwn;
      for (size_t i = 0; i < fwd.results.size(); ++i)
        if (fwd.results[i].role == Role::MicroBatchMax)
          hand(fwd, i, fwdOwn);
      int64_t losses = countResults(fwd, Role::Loss);
      if (last)
        check.require(losses == 1, at(fwd) + ": the last chunk's forward "
                                             "needs exactly one loss result, "
                                             "not " + std::to_string(losses));
      else
        check.require(losses == 0, at(fwd) + ": only the last chunk's (" +
                                       std::to_string(C - 1) +
                                       ") forward has a loss");
      std::map<std::string, const TensorSpec *> residuals;
      for (size_t i = 0; i < fwd.results.size(); ++i) {
        const TensorSpec &res = fwd.results[i];
        if (res.role != Role::Residual)
          continue;
        check.require(!res.name.empty(), argAt(fwd, i, "result") +
                                             ": a residual needs a name");
        check.require(residuals.emplace(res.name, &res).second,
                      argAt(fwd, i, "result") + ": a second residual named '" +
                          res.name + "'");
      }
      argRoles(bwd, {Role::Parameter, Role::OptimizerState, Role::Input,
                     Role::Residual});
      for (size_t i = 0; i < bwd.arguments.size(); ++i) {
        const TensorSpec &arg = bwd.arguments[i];
        if (arg.role != Role::Residual)
          continue;
        auto it = residuals.find(arg.name);
        check.require(it != residuals.end(),
                      argAt(bwd, i, "argument") + ": @" + fwd.name +
                          " has no residual named '" + arg.name + "'");
        check.require(sameLocal(*it->second, arg),
                      argAt(bwd, i, "argument") + ": residual '" + arg.name +
                          "' is " + typeString(arg) + " here but @" + fwd.name +
                          " makes it " + typeString(*it->second));
      }
      onlyResults(bwd, {Role::Gradient, Role::MicroBatchMax});
      std::set<std::string> bwdOwn;
      for (size_t i = 0; i < bwd.results.size(); ++i)
        hand(bwd, i, bwdOwn);
      argRoles(ev, {Role::Parameter, Role::Input});
      int64_t evalLosses = countResults(ev, Role::Loss);
      if (last)
        check.require(evalLosses == 1, at(ev) + ": the last chunk's eval "
                                                "forward needs exactly one "
                                                "loss result, not " +
                                           std::to_string(evalLosses));
    }
    const Function &update = need(pipelineFunction("train_update", s));
    argRoles(update, {Role::Parameter, Role::Gradient, Role::MicroBatchMax,
                      Role::OptimizerState, Role::LearningRate, Role::Step});
    for (size_t i = 0; i < update.arguments.size(); ++i) {
      const TensorSpec &arg = update.arguments[i];
      if (arg.role != Role::Gradient && arg.role != Role::MicroBatchMax)
        continue;
      auto it = handed.find(arg.name);
      check.require(it != handed.end() && it->second->role == arg.role,
                    argAt(update, i, "argument") + ": no forward or backward "
                        "of stage " + std::to_string(s) + " makes the " +
                        roleName(arg.role) + " '" + arg.name + "'");
      check.require(sameLocal(*it->second, arg),
                    argAt(update, i, "argument") + ": the " +
                        roleName(arg.role) + " '" + arg.name + "' is " +
                        typeString(arg) + " here but the stage makes " +
                        typeString(*it->second));
    }
    if (const Function *init = find(pipelineFunction("init", s)))
      argRoles(*init, {Role::Parameter});

    // Across stages only through the pipeline's own ops: no sharding or
    // collective names the stage axis; peers and members are other stages.
    for (const Function &fn : fns) {
      auto noStageAxis = [&](const std::vector<TensorSpec> &specs,
                             const char *what) {
        if (stageAxis.empty())
          return;
        for (size_t i = 0; i < specs.size(); ++i) {
          bool named = false;
          for (const Axes &axes : specs[i].sharding.dims)
            named |= std::find(axes.begin(), axes.end(), stageAxis) != axes.end();
          for (const auto &partial : specs[i].sharding.partials)
            named |= partial.first == stageAxis;
          check.require(!named, argAt(fn, i, what) +
                                    ": its sharding names the stage axis '" +
                                    stageAxis + "'");
        }
      };
      noStageAxis(fn.arguments, "argument");
      noStageAxis(fn.results, "result");
      for (size_t i = 0; i < fn.instructions.size(); ++i) {
        const Instruction &inst = fn.instructions[i];
        const std::string where = at(fn) + ", instruction #" +
                                  std::to_string(i) + " (" + inst.op + ")";
        check.require(stageAxis.empty() ||
                          std::find(inst.axes.begin(), inst.axes.end(),
                                    stageAxis) == inst.axes.end(),
                      where + ": a collective over the stage axis '" +
                          stageAxis + "' (stages talk through ernie.send, "
                                      "ernie.recv and the stage collectives)");
        if (inst.op == "ernie.send" || inst.op == "ernie.recv") {
          int64_t peer = inst.attrs.getInt("peer");
          check.require(peer >= 0 && peer < C,
                        where + ": peer chunk " + std::to_string(peer) +
                            " is not one of the " + std::to_string(C) +
                            " chunks");
          check.require(peer % S != s, where + ": peer chunk " +
                                           std::to_string(peer) +
                                           " is on this stage");
        } else if (inst.op == "ernie.stage_all_reduce" ||
                   inst.op == "ernie.stage_broadcast") {
          std::vector<int64_t> members = inst.attrs.getInts("stages");
          bool sorted = true;
          for (size_t j = 1; j < members.size(); ++j)
            sorted &= members[j - 1] < members[j];
          check.require(sorted && !members.empty() && members.front() >= 0 &&
                            members.back() < S,
                        where + ": 'stages' must be distinct stages in [0, " +
                            std::to_string(S) + "), ascending");
          check.require(std::find(members.begin(), members.end(), s) !=
                            members.end(),
                        where + ": 'stages' does not hold this stage");
        }
      }
    }
  }
  // Every send of a chunk's function meets a receive in the peer chunk's
  // functions (and the other way round) on the same channel, with as many
  // bytes: a mismatch would otherwise wait out a timeout, or fail one side.
  struct Transfer {
    int64_t from, to, channel;
    uint64_t bytes;
    std::string where;
  };
  std::vector<Transfer> sends, recvs;
  for (int64_t s = 0; s < S; ++s)
    for (const Function &fn : stages[s]) {
      int64_t chunk = -1;
      for (const char *kind : {"train_forward", "train_backward", "eval_forward"})
        for (int64_t c = s; c < C; c += S)
          if (fn.name == pipelineFunction(kind, c))
            chunk = c;
      if (chunk < 0)
        continue;
      for (size_t i = 0; i < fn.instructions.size(); ++i) {
        const Instruction &inst = fn.instructions[i];
        std::string where = "function @" + fn.name + " (stage " +
                            std::to_string(s) + "), instruction #" +
                            std::to_string(i) + " (" + inst.op + ")";
        if (inst.op == "ernie.send")
          sends.push_back({chunk, inst.attrs.getInt("peer"),
                           inst.attrs.getInt("channel"),
                           fn.buffers[inst.operands[0]].bytes, where});
        else if (inst.op == "ernie.recv")
          recvs.push_back({inst.attrs.getInt("peer"), chunk,
                           inst.attrs.getInt("channel"),
                           fn.buffers[inst.results[0]].bytes, where});
      }
    }
  auto match = [&](const std::vector<Transfer> &mine,
                   const std::vector<Transfer> &theirs, const char *other,
                   bool sending) {
    for (const Transfer &t : mine) {
      bool found = false;
      for (const Transfer &u : theirs) {
        if (u.from != t.from || u.to != t.to || u.channel != t.channel)
          continue;
        found = true;
        check.require(u.bytes == t.bytes,
                      t.where + ": moves " + std::to_string(t.bytes) +
                          " bytes on channel " + std::to_string(t.channel) +
                          ", but " + u.where + " " + std::to_string(u.bytes));
      }
      check.require(found, t.where + ": no " + other + " in chunk " +
                               std::to_string(sending ? t.to : t.from) +
                               "'s functions matches it (chunk " +
                               std::to_string(t.from) + " to chunk " +
                               std::to_string(t.to) + ", channel " +
                               std::to_string(t.channel) + ")");
    }
  };
  match(sends, recvs, "ernie.recv", true);
  match(recvs, sends, "ernie.send", false);

  for (const auto &[k, first] : inputs) {
    check.require(k == static_cast<int64_t>(spec.inputs.size()),
                  "has no function taking batch input input." +
                      std::to_string(spec.inputs.size()) +
                      " (inputs are numbered from 0 without gaps)");
    spec.inputs.push_back(*first);
  }
  return spec;
}

} // namespace

const char *roleName(Role role) {
  switch (role) {
  case Role::Input: return "input";
  case Role::Parameter: return "parameter";
  case Role::OptimizerState: return "optimizer state";
  case Role::LearningRate: return "learning rate";
  case Role::Step: return "step";
  case Role::Loss: return "loss";
  case Role::Residual: return "residual";
  case Role::Gradient: return "gradient";
  case Role::MicroBatchMax: return "micro-batch max";
  }
  return "?";
}

std::string pipelineFunction(const std::string &kind, int64_t index) {
  return kind + "." + std::to_string(index);
}

Program Program::parse(const void *data, size_t size,
                       const std::string &source) {
  Checker check(source);
  auto *bytes = static_cast<const uint8_t *>(data);
  check.require(size >= 8 && fb::ProgramFileBufferHasIdentifier(bytes),
                size < 8 ? "is truncated: " + std::to_string(size) + " bytes"
                         : "is not an ernie program file (no 'ERNP' identifier)");
  flatbuffers::Verifier envelopeVerifier(bytes, size);
  check.require(fb::VerifyProgramFileBuffer(envelopeVerifier),
                "is truncated or corrupted (the file structure does not verify)");
  const fb::ProgramFile *file = fb::GetProgramFile(bytes);
  check.require(file->format_version() == program::kFormatVersion,
                "has format version " + std::to_string(file->format_version()) +
                    "; this runtime reads version " +
                    std::to_string(program::kFormatVersion));
  check.require(file->program() != nullptr, "holds no program");
  const uint8_t *payload = file->program()->data();
  size_t payloadSize = file->program()->size();
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, payload, static_cast<uInt>(payloadSize));
  check.require(crc == file->checksum(),
                "is corrupted: the checksum does not match its contents");
  flatbuffers::Verifier verifier(payload, payloadSize);
  check.require(verifier.VerifyBuffer<fb::Program>(nullptr),
                "is corrupted: the program does not verify");
  const fb::Program *p = flatbuffers::GetRoot<fb::Program>(payload);

  std::vector<std::string> names;
  std::vector<int64_t> sizes;
  if (p->axes())
    for (const fb::Axis *a : *p->axes()) {
      names.push_back(a->name()->str());
      sizes.push_back(a->size());
    }
  check.require(!names.empty(), "has a mesh without axes");
  std::optional<Mesh> mesh;
  try {
    mesh.emplace(names, sizes);
  } catch (const std::invalid_argument &e) {
    check.fail(e.what());
  }
  Program program(*mesh);
  program.source_ = source;
  program.producer_ = str(p->producer());
  program.stageAxis_ = str(p->stage_axis());
  if (!program.stageAxis_.empty()) {
    check.require(std::find(names.begin(), names.end(), program.stageAxis_) !=
                      names.end(),
                  "names stage axis '" + program.stageAxis_ +
                      "', which the mesh does not have");
  }
  if (p->stages())
    for (const fb::Stage *s : *p->stages()) {
      std::vector<Function> fns;
      if (s->functions())
        for (const fb::Function *f : *s->functions())
          fns.push_back(decodeFunction(f, program.mesh_, check));
      program.stages_.push_back(std::move(fns));
    }
  int64_t expectedStages =
      program.stageAxis_.empty()
          ? 1
          : program.mesh_.axisSizes()[program.mesh_.axisIndex(program.stageAxis_)];
  check.require(program.numStages() == expectedStages,
                "has " + std::to_string(program.numStages()) +
                    " stages; its mesh needs " + std::to_string(expectedStages));
  if (p->pipeline())
    program.pipeline_ =
        decodePipeline(p, program.stages_, program.stageAxis_, check);
  else
    checkNotPipelined(program.stages_, check);
  return program;
}

Program Program::load(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw ProgramError(path + ": cannot open the program file");
  std::string bytes((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
  return fromBytes(bytes, path);
}

Program Program::fromBytes(std::string_view bytes, const std::string &source) {
  std::vector<uint64_t> aligned((bytes.size() + 7) / 8);
  std::copy(bytes.begin(), bytes.end(), reinterpret_cast<char *>(aligned.data()));
  return parse(aligned.data(), bytes.size(), source);
}

int64_t Program::stageOf(int64_t rank) const {
  if (stageAxis_.empty())
    return 0;
  return mesh_.coordinates(rank)[mesh_.axisIndex(stageAxis_)];
}

std::vector<int64_t> Program::chunksOf(int64_t stage) const {
  std::vector<int64_t> chunks;
  for (int64_t c = stage; c < numChunks(); c += numStages())
    chunks.push_back(c);
  return chunks;
}

int64_t Program::numChunks() const {
  return numStages() * (pipeline_ ? pipeline_->virtualStages : 1);
}

int64_t Program::rankInStage(int64_t rank, int64_t stage) const {
  if (stageAxis_.empty())
    return rank;
  std::vector<int64_t> coords = mesh_.coordinates(rank);
  coords[mesh_.axisIndex(stageAxis_)] = stage;
  return mesh_.rankOf(coords);
}

static bool takesState(const Function &fn, const std::string &name) {
  for (const TensorSpec &arg : fn.arguments)
    if (arg.name == name &&
        (arg.role == Role::Parameter || arg.role == Role::OptimizerState))
      return true;
  return false;
}

std::vector<int64_t> Program::stagesHolding(const std::string &name) const {
  std::vector<int64_t> out;
  for (int64_t s = 0; s < numStages(); ++s)
    for (const Function &fn : stages_[s])
      if (takesState(fn, name)) {
        out.push_back(s);
        break;
      }
  return out;
}

std::vector<std::string> Program::stateNames() const {
  std::set<std::string> names;
  for (const auto &fns : stages_)
    for (const Function &fn : fns)
      for (const TensorSpec &arg : fn.arguments)
        if (arg.role == Role::Parameter || arg.role == Role::OptimizerState)
          names.insert(arg.name);
  return {names.begin(), names.end()};
}

const Function *Program::function(int64_t stage, const std::string &name) const {
  for (const Function &fn : stages_.at(stage))
    if (fn.name == name)
      return &fn;
  return nullptr;
}

const Function &Program::requireFunction(int64_t stage,
                                         const std::string &name) const {
  if (const Function *fn = function(stage, name))
    return *fn;
  std::string known;
  for (const Function &fn : stages_.at(stage))
    known += (known.empty() ? "@" : ", @") + fn.name;
  throw std::invalid_argument("the program has no function @" + name +
                              " (it has " + (known.empty() ? "none" : known) +
                              ")");
}

} // namespace ernie::runtime

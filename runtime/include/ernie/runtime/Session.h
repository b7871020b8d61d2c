//===- Session.h - running a program's steps, with its state -----*- C++ -*-===//
//
// The API a driver (ernie-run, the Python binding) uses. Callers speak in
// global tensors; the runtime keeps each rank's pieces.
//
// A RankRunner is one rank: it keeps that rank's pieces of the program's
// state (parameters and optimizer slots, by name) between calls — on the
// rank's device (Communicator::device()), where the host sees them only
// when asked (localState, gather, Session::state, checkpoints) — feeds a
// function's arguments by role (state, batch input, learning rate, step),
// stores the results that update state, and can gather any result to its
// global value through the communicator. It is what each process of a
// multi-process run uses.
//
// A Session is the ranks of a mesh this process runs, each a RankRunner on
// its own thread: every rank (the thread engine), or in a multi-process job
// (SessionOptions::job, ProcessGroup.h) this process's block of ranks, whose
// groups inside the process meet in the thread engine and the others over
// Gloo or NCCL. It speaks in global tensors either way: results and state
// are assembled directly from the pieces when every rank is here, and
// gathered from the other processes when not (every process makes the same
// calls in the same order, as multi-controller SPMD has it).
//
// Pipelined programs (Program::pipeline()) run "train_step" and "eval_step"
// only. A rank keeps the state of its stage's functions. train_step splits
// each batch input along dimension 0 into the micro-batches, runs the rank's
// schedule (Forward(c, k): @train_forward.<c> on micro-batch k, its
// residuals kept for Backward(c, k): @train_backward.<c>, whose gradients are
// summed per name over micro-batches and chunks in schedule order), then
// @train_update.<s> on the sums. eval_step runs @eval_forward.<c> for every
// micro-batch, and the rank's chunks in ascending order within it. Both
// return on every rank the loss, the mean over micro-batches of the last
// chunk's losses (summed in micro-batch order in f64, stored as an f32
// scalar), which the last stage's ranks send to the other stages' ranks;
// train_step then the updates' metrics (Role::Metric, grad_norm), in stage
// order, each sent likewise by the stage that computes it.
// initState initialises the stage's state from every function of the stage,
// then runs @init.<s> (once per RankRunner) when there is one.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_SESSION_H
#define ERNIE_RUNTIME_SESSION_H

#include "ernie/runtime/Executor.h"
#include "ernie/runtime/ProcessGroup.h"
#include "ernie/runtime/ThreadCommunicator.h"

#include <functional>
#include <map>
#include <optional>

namespace ernie::runtime {

struct CheckpointInfo;
class IoMeter;
struct WeightPiece;
using WeightMap = std::map<std::string, std::vector<WeightPiece>>;

/// Where a state's first value comes from: a global tensor, or nullopt for
/// the default (parameters drawn from a seeded generator, slots zero).
using StateSource = std::function<std::optional<HostTensor>(const TensorSpec &)>;

/// A parameter's default initial value: uniform in ±1/sqrt(fan-in) for
/// matrices (fan-in = dimension 0), ones for vectors and scalars; the same
/// for a given (name, shape, seed) on every rank and every mesh.
HostTensor defaultParameter(const TensorSpec &spec, uint64_t seed);

/// Which results a call hands back (see RankRunner::call).
enum class Results { All, ExceptUpdates };

class RankRunner {
public:
  RankRunner(const Program &program, Communicator &comm,
             ExecutorOptions options = {});

  Executor &executor() { return executor_; }
  const Function &function(const std::string &name) const {
    return executor_.function(name);
  }

  /// Gives every state argument of `fn` that has none yet its first value
  /// (from `source`, else the default; a master weight starts as its
  /// parameter's value).
  void initState(const std::string &fn, const StateSource &source,
                 uint64_t seed = 0);
  /// Replaces the state `name` (as `fn`'s argument spec describes it).
  void setState(const std::string &fn, const std::string &name,
                const HostTensor &global);
  /// This rank's piece of state `name`, copied to the host; throws when
  /// there is none.
  HostTensor localState(const std::string &name) const;
  /// Replaces this rank's piece of state `name` (held already) with
  /// `piece`, of the same layout.
  void replaceLocalState(const std::string &name, HostTensor piece);
  /// The layout that piece belongs to.
  const TensorSpec &stateSpec(const std::string &name) const;
  std::vector<std::string> stateNames() const;

  /// Runs `fn`: state arguments from the state, learning rate and step from
  /// `lr` and `step`, every other argument from `inputs` (global values, in
  /// argument order). Results that update state replace it. Returns this
  /// rank's pieces of every result (`results`: Results::All), or of those
  /// that update nothing, the others left empty (Results::ExceptUpdates:
  /// a training loop that wants only the loss, and the state moves in
  /// place of being copied).
  std::vector<HostTensor> call(const std::string &fn,
                               const std::vector<HostTensor> &inputs,
                               double lr = 0.0, int64_t step = 1,
                               Results results = Results::All);

  /// The global value of a piece described by `spec`: an all-gather over
  /// every mesh axis, then assembly. Every rank must call it.
  HostTensor gather(const TensorSpec &spec, const HostTensor &local);
  /// The same over the ranks of this rank's stage only (every mesh axis but
  /// the stage axis): every rank of the stage must call it.
  HostTensor gatherInStage(const TensorSpec &spec, const HostTensor &local);
  /// Whether this rank holds state `name`.
  bool holdsState(const std::string &name) const { return state_.count(name); }
  /// What the next calls check for NaN and infinity.
  void setFiniteCheck(FiniteCheck check) { executor_.setFiniteCheck(check); }

private:
  /// Runs one function: what call() does for a program that is not
  /// pipelined.
  std::vector<HostTensor> callFunction(const std::string &fn,
                                       const std::vector<HostTensor> &inputs,
                                       double lr, int64_t step, Results results);
  /// Where one call's arguments come from, beside this rank's state.
  struct CallSources {
    /// The global value of batch input `arg` (of the call's micro-batch).
    std::function<const HostTensor &(const TensorSpec &)> input;
    double lr = 0.0;
    int64_t step = 1;
    /// A pipeline's residuals (for a backward), and its running gradient
    /// sums and maxima (for a backward that adds into them, and for the
    /// update), by name, on the device; null outside a pipeline's schedule.
    const std::map<std::string, DeviceTensor> *residuals = nullptr;
    const std::map<std::string, DeviceTensor> *sums = nullptr;
  };
  /// `fn`'s arguments, each this rank's piece, in `fn`'s order: the state
  /// by reference, the rest (scalars, batch pieces) held in `owned`.
  struct Arguments {
    std::vector<HostTensor> owned;
    std::vector<Argument> views;
  };
  Arguments arguments(const Function &fn, const CallSources &from);
  /// Batch inputs from micro-batch `k` of `micro` (per input, per
  /// micro-batch), which must outlive the sources.
  CallSources microBatch(const std::vector<std::vector<HostTensor>> &micro,
                         int64_t k) const;
  /// Where each result of `fn` that updates a state held in the same type
  /// and shape goes: into that state, in place (null elsewhere).
  std::vector<DeviceTensor *> updateTargets(const Function &fn);
  /// Results of `fn` that update state replace it: those written in place
  /// (empty in `results`) take the result's layout, the others move in.
  void keepUpdates(const Function &fn, std::vector<DeviceTensor> &results);
  /// train_step / eval_step of a pipelined program.
  std::vector<HostTensor> callPipelined(const std::string &fn,
                                        const std::vector<HostTensor> &inputs,
                                        double lr, int64_t step);
  /// The schedule of this rank; returns the last chunk's loss per
  /// micro-batch (empty on other stages) and fills `metrics` with those
  /// this stage's update computes.
  std::vector<double> trainPipelined(
      const std::vector<std::vector<HostTensor>> &micro, double lr,
      int64_t step, std::map<std::string, HostTensor> &metrics);
  std::vector<double> evalPipelined(
      const std::vector<std::vector<HostTensor>> &micro);
  void initPipelinedState(const StateSource &source, uint64_t seed);
  /// This stage's pipeline functions, train_update first.
  std::vector<const Function *> stageFunctions() const;
  /// The spec of state `name` as this stage's functions take it (the first
  /// of stageFunctions() that does), or null.
  const TensorSpec *stageStateSpec(const std::string &name) const;
  /// Throws std::invalid_argument when `fn` is not something a pipelined
  /// program runs.
  void requirePipelinedName(const std::string &fn) const;

  const Program &program_;
  Communicator &comm_;
  Executor executor_;
  bool initialised_ = false; // initState ran (pipelines: @init.<s> too)
  /// A state's piece on this rank, and the layout it is a piece of: each
  /// function's propagation may place a state differently, and a piece is
  /// re-laid out (gathered, re-sliced) when a function wants another.
  struct State {
    TensorSpec spec;
    DeviceTensor piece;
  };
  /// The piece of `name` in `spec`'s layout, re-laid out if needed.
  const DeviceTensor &stateFor(const TensorSpec &spec);
  Device &device() const { return executor_.device(); }
  std::map<std::string, State> state_;
};

struct SessionOptions {
  ExecutorOptions executor;
  /// Where every rank computes: "cpu", or "cuda" / "cuda:N" — every rank a
  /// thread on that one GPU, each with its own streams, collectives as
  /// device-to-device copies and ordered reductions (the shared-device
  /// engine). openDevice() says why when it cannot.
  std::string device = "cpu";
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
  /// GEMM threads per rank (setCpuBlasThreads); 0 leaves the setting alone.
  int blasThreads = 1;
  /// This process's place in a multi-process job: it runs only its own
  /// block of ranks (on a GPU: one rank, over NCCL). Unset: every rank.
  std::optional<ProcessGroupOptions> job;
  /// What every process of the job must agree on ("key=value" lines: the
  /// caller's hashes of the program and the initial state), compared at
  /// start-up with the mesh and the process count (ProcessGroup::join).
  std::string identity;
};

class Session {
public:
  explicit Session(Program program, SessionOptions options = {});
  /// The same on a device the caller made (options.device is ignored).
  Session(Program program, SessionOptions options,
          std::shared_ptr<Device> device);
  ~Session();

  const Program &program() const { return program_; }
  Device &device() const { return *device_; }
  int64_t numRanks() const { return program_.mesh().numRanks(); }
  /// The ranks this process runs: [firstRank(), firstRank() + localRanks()).
  int64_t firstRank() const { return firstRank_; }
  int64_t localRanks() const { return static_cast<int64_t>(ranks_.size()); }
  /// The job this session is a process of; null when it runs every rank.
  ProcessGroup *job() const { return job_.get(); }
  /// Fails every process's collectives with `reason` (this process found
  /// its input wrong): they stop instead of waiting for this one.
  void abort(const std::string &reason);
  /// Whether `flag` is true on any process of the job (this one alone
  /// without a job): a collective every process makes at the same point,
  /// so that a request one process received (a SIGTERM) is acted on by
  /// every process at the same step.
  bool anyProcess(bool flag);
  /// What the next calls check for NaN and infinity on every rank here
  /// (each process of a job sets its own; they should agree).
  void setFiniteCheck(FiniteCheck check);

  void initState(const std::string &fn, const StateSource &source,
                 uint64_t seed = 0);
  void setState(const std::string &fn, const std::string &name,
                const HostTensor &global);
  /// The global value of state `name` (in a job: gathered from the other
  /// processes, so every process must ask for it).
  HostTensor state(const std::string &fn, const std::string &name);

  /// Saves every rank's state as checkpoint `<root>/step-<step>`
  /// (Checkpoint.h) with the caller's `metadataJson`, keeping the newest
  /// `keep` (0: all); returns its directory.
  std::string saveCheckpoint(const std::string &root, int64_t step,
                             const std::string &metadataJson, int keep,
                             IoMeter *meter = nullptr);
  /// Replaces every rank's state from checkpoint `path` (one, or the newest
  /// complete one under it), resharded; nothing changes unless every rank
  /// read everything. Returns its step and metadata.
  CheckpointInfo loadCheckpoint(const std::string &path,
                                IoMeter *meter = nullptr);
  /// Replaces the states `weights` maps (and their master weights) on
  /// every rank, each rank reading only its pieces (readWeightShards); all
  /// or nothing. Every name must be a state of the program. Returns the
  /// states replaced.
  std::vector<std::string> loadWeights(const WeightMap &weights,
                                       IoMeter *meter = nullptr);

  /// Every rank's recorded intervals (SessionOptions::executor.trace); in a
  /// job, gathered from every process (every process must call it).
  std::vector<std::vector<TraceEvent>> traceEvents();

  /// RankRunner::call on every rank at once; returns the global results
  /// (pipelined programs: the loss, then train_step's metrics).
  /// The first rank to fail stops the others; its error is rethrown.
  std::vector<HostTensor> call(const std::string &fn,
                               const std::vector<HostTensor> &inputs,
                               double lr = 0.0, int64_t step = 1,
                               Results results = Results::All);

private:
  /// Runs `work(i)` for each local rank i (mesh rank firstRank_ + i) on a
  /// thread of its own; rethrows the root failure (in a job, with the
  /// processes that stopped when a collective failed).
  void onEveryRank(const std::function<void(int64_t)> &work);
  /// Whether every rank of the mesh is in this process.
  bool allLocal() const { return job_ == nullptr; }

  Program program_;
  std::unique_ptr<ProcessGroup> job_; // before the communicators using it
  std::shared_ptr<Device> device_;
  ThreadWorld world_;
  int64_t firstRank_ = 0;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<RankRunner>> ranks_;
};

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_SESSION_H

//===- Executor.h - runs one rank's instructions -----------------*- C++ -*-===//
//
// An Executor runs the functions of a loaded Program for one rank: it binds
// the rank's stage and mesh coordinates, allocates each function's arena once
// (every buffer at its planned offset), copies the arguments in, runs the
// instructions — kernels from the backend's table, collectives through the
// rank's Communicator — and copies the results out.
//
// ernie.collective_permute_start hands its transfer to the communicator's
// communication thread and the executor goes on; the matching ernie.wait
// blocks until it is done. Started transfers are pending by the buffer the
// start writes. Engines pair a group's collectives by their order, so before
// any blocking collective, and at the end of every function, the executor
// waits for everything it started: a blocking collective never overtakes a
// started one on any rank.
//
// Pipelined programs talk between stages point to point: ernie.send and
// ernie.recv name a peer chunk and a channel, the stage collectives a list of
// stages; the rank at the other end has this rank's coordinates except along
// the stage axis, and a transfer's tag is channel * micro_batches + the
// micro-batch being run (run()'s `microBatch`; 0 for the stage collectives),
// so transfers of different micro-batches never meet. Sends are eager (the
// engines copy and return), so every stage's schedule runs as checkSchedule
// proved it would.
//
// Buffers live on the communicator's device (Communicator::device(): the
// host, or a GPU). Each function's arena is one allocation on it, made at
// the function's first call and reused by every later one; what a program
// needs on a device with a known capacity is checked against it when the
// executor is made. Instructions run on the rank's compute stream, started
// transfers on its communication stream (ordered with events), and run()
// returns once the function's work is done. Kernels come from the device's
// table (Device::kernelFor); an op the device has no kernel for fails when
// the executor is made, naming the op.
//
// A failure on one rank stops every rank: the executor aborts its
// communicator with a message naming the rank, the instruction (index, op,
// source location) and the cause, and throws ExecutionError. Peers waiting in
// a collective then fail with that message instead of waiting out a timeout.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_EXECUTOR_H
#define ERNIE_RUNTIME_EXECUTOR_H

#include "ernie/runtime/Communicator.h"
#include "ernie/runtime/Device.h"
#include "ernie/runtime/HostTensor.h"
#include "ernie/runtime/Program.h"

#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace ernie::runtime {

/// A function failed on some rank; the message says where and why.
struct ExecutionError : std::runtime_error {
  ExecutionError(const std::string &message, bool inCollective)
      : std::runtime_error(message), inCollective(inCollective) {}
  /// The cause was a collective (a timeout, another rank's abort) rather
  /// than this rank's own computation: the root cause is likely elsewhere.
  bool inCollective;
};

/// What a run checks for NaN and infinity, failing (and stopping the other
/// ranks) at the first value that is not finite.
enum class FiniteCheck {
  Off,
  /// The loss and the step's metrics (grad_norm): a scalar or two per call.
  Results,
  /// Every float tensor an instruction writes, as it is written: the error
  /// names the first instruction whose result is not finite. Slow (a scan
  /// per result; a download per result on a GPU): for finding a NaN, not
  /// for every step.
  Tensors,
};

/// "off", "results" or "tensors"; parseFiniteCheck throws
/// std::invalid_argument naming the accepted words.
const char *finiteCheckName(FiniteCheck check);
FiniteCheck parseFiniteCheck(const std::string &name);

struct ExecutorOptions {
  FiniteCheck checkFinite = FiniteCheck::Off;
  /// Record every instruction's start and duration (traceEvents()); on a
  /// GPU, kernels are timed by events on the compute stream.
  bool trace = false;
};

/// An argument of Executor::runOnDevice: bytes on the host (uploaded, through
/// pinned staging on a GPU) or a tensor already on the executor's device.
struct Argument {
  Argument(const HostTensor &t) : host(&t) {}
  Argument(const DeviceTensor &t) : device(&t) {}
  const HostTensor *host = nullptr;
  const DeviceTensor *device = nullptr;
};

/// The arena one rank of `stage` allocates: its largest function's (the
/// functions share it).
uint64_t largestArena(const Program &program, int64_t stage);

/// Device bytes one rank of `stage` needs for `program`: its arena plus one
/// copy of each state argument (parameters, optimizer slots).
uint64_t deviceBytesNeeded(const Program &program, int64_t stage);

/// One instruction's interval on a rank's timeline, for a Chrome trace.
/// A started permute's interval is its transfer, timed on the communication
/// thread; the ernie.wait that blocks on it is compute time.
struct TraceEvent {
  std::string name;     // the op
  std::string function; // the function it belongs to
  /// On the communication track: a collective or a started transfer.
  bool collective = false;
  int64_t startMicros = 0; // steady clock: comparable across ranks of a host
  int64_t durationMicros = 0;
};

/// Writes `events` (per rank) as Chrome-trace / Perfetto JSON: a process
/// per rank, compute and communication on separate threads.
void writeChromeTrace(const std::string &path,
                      const std::vector<std::vector<TraceEvent>> &events,
                      int64_t firstRank = 0);

/// The trace's clock (TraceEvent::startMicros): steady, in microseconds.
int64_t traceClockMicros();

class Executor {
public:
  Executor(const Program &program, Communicator &comm,
           ExecutorOptions options = {});
  ~Executor();

  int64_t rank() const { return rank_; }
  int64_t stage() const { return stage_; }
  const Program &program() const { return program_; }
  /// `name` in this rank's stage; throws std::invalid_argument naming the
  /// functions there when it is missing.
  const Function &function(const std::string &name) const;

  Device &device() const { return device_; }

  /// Runs `name` on this rank's local `inputs` (one per argument, of the
  /// argument's local shape and type) and returns the local results, on the
  /// device. A result with a non-null `into[i]` of its type and shape is
  /// copied there instead (a state updated in place: no allocation), one
  /// with `toHost[i]` set (every one, when `toHost` is empty) is downloaded
  /// into `(*host)[i]` when `host` is given (resized to the results), and
  /// their entries are left empty. `microBatch` (pipelined
  /// programs) tags the function's transfers. Returns once the function's
  /// work is done.
  std::vector<DeviceTensor> runOnDevice(const std::string &name,
                                        const std::vector<Argument> &inputs,
                                        int64_t microBatch = 0,
                                        const std::vector<DeviceTensor *> &into = {},
                                        std::vector<HostTensor> *host = nullptr,
                                        const std::vector<bool> &toHost = {});
  /// The same on host tensors, the results downloaded.
  std::vector<HostTensor> run(const std::string &name,
                              const std::vector<HostTensor> &inputs,
                              int64_t microBatch = 0);

  /// The intervals recorded so far (ExecutorOptions::trace), in the order
  /// they ended.
  std::vector<TraceEvent> traceEvents() const;
  bool tracing() const { return options_.trace; }
  /// Changes the check from the next call on (a run replayed to find a NaN).
  void setFiniteCheck(FiniteCheck check) { options_.checkFinite = check; }
  /// Records an interval of the caller's (a pipeline step, say) on the
  /// compute track, when tracing.
  void recordSpan(const std::string &name, const std::string &function,
                  int64_t startMicros, int64_t endMicros);

private:
  struct Arena;
  /// A transfer on the communication thread, by the buffer it writes.
  struct Started {
    AsyncHandle handle;
    size_t instruction; // the start's index, for messages
    Event done;         // recorded on the communication stream after it
  };

  void execute(const Function &fn, size_t index, Arena &arena);
  /// ernie.{all_reduce,reduce_scatter,all_gather}_start: the bucket's one
  /// collective, on the communication thread; each result is started_ with
  /// the same handle.
  void startBucket(const Function &fn, size_t index,
                   const std::vector<TensorView> &buffers);
  void runCollective(const Instruction &inst, const TensorView &in,
                     const TensorView &out);
  /// scratch_ holding at least `bytes`.
  uint8_t *scratch(size_t bytes);
  void insertShard(const Instruction &inst, const TensorView &dest,
                   const TensorView &piece, const TensorView &out);
  /// ernie.send, ernie.recv and the stage collectives.
  void runStageOp(const Instruction &inst, std::vector<TensorView> &buffers);
  /// The rank of this rank's coordinates with `stage` along the stage axis.
  int64_t peerRank(int64_t stage) const;
  void start(const Function &fn, size_t index, const TensorView &in,
             const TensorView &out);
  /// The (ready, done) events of transfers into `buffer`, made once.
  std::pair<Event, Event> transferEvents(uint32_t buffer);
  void wait(const Instruction &inst, std::vector<TensorView> &buffers);
  /// Waits for every started transfer, oldest first; a failure is reported
  /// at its start. They stay pending for their ernie.wait unless `forget`.
  void waitForStarted(const Function &fn, const std::string &why, bool forget);
  /// Waits for every started transfer, ignoring failures, and forgets them.
  void abandonStarted();
  void record(TraceEvent event);
  /// FiniteCheck::Tensors: fails at instruction `index` when a float result
  /// it wrote is not finite.
  void checkWritten(const Function &fn, size_t index, const Arena &arena);
  [[noreturn]] void fail(const Function &fn, size_t index,
                         const std::string &cause, bool inCollective);

  const Program &program_;
  Communicator &comm_;
  Device &device_;
  ExecutorOptions options_;
  int64_t rank_, stage_;
  /// Per function of the stage: each instruction's kernel on device_ (null
  /// for the executor's own ops), and kernels made for it (fused bodies).
  struct Kernels {
    std::vector<const Kernel *> kernel;
    std::vector<std::shared_ptr<const Kernel>> held;
  };
  std::map<std::string, Kernels> kernels_;
  /// The arena all of this rank's functions share (the largest one's
  /// bytes, made on the first call), and each function's view of it.
  DeviceBuffer arenaMemory_;
  std::map<std::string, std::unique_ptr<Arena>> arenas_;
  Stream compute_, communication_;
  DeviceBuffer scratch_; // packing for collectives on inner dims
  /// Per bucket instruction (by function and index): its message's
  /// packed and collected bytes, made once.
  std::map<std::pair<std::string, size_t>, DeviceBuffer> buckets_;
  std::map<uint32_t, Started> started_;
  /// Per buffer a transfer writes: the events ordering it after the compute
  /// stream's work and the compute stream's later work after it.
  std::map<uint32_t, std::pair<Event, Event>> transferEvents_;
  int64_t microBatch_ = 0; // the run's, for transfer tags
  mutable std::mutex traceMutex_; // the communication thread records too
  std::vector<TraceEvent> trace_;
};

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_EXECUTOR_H

//===- ProcessGroup.h - the processes of one multi-process job ---*- C++ -*-===//
//
// A job is P processes running the same program (multi-controller SPMD, as
// torchrun and jax.distributed have it); process p owns the contiguous block
// of mesh ranks [p * R, (p + 1) * R), R = ranks / P. A ProcessGroup is this
// process's membership: the rendezvous store process 0 serves at
// host:port (RendezvousStore: the one Gloo and NCCL already use), shared by
// every communicator of the process.
//
// - join(): every process publishes an identity (the caller's hashes of the
//   program and the initial state, the mesh, the process count) and waits
//   for every other's; a process missing after the timeout, or one whose
//   identity differs from process 0's, is an error naming it — every
//   process refuses alike, before any collective could hang on it.
// - Heartbeats: a thread sets this process's counter every second. When a
//   collective fails, stoppedProcesses() tells a dead or frozen process
//   from a live one (its counter stops), so the error names the rank that
//   died rather than the peer that happened to notice.
// - Communicators: each local rank's collectives run in the thread engine
//   over groups inside this process and over Gloo (CPU) or NCCL (GPU;
//   unverified: compiled, never run on a GPU) over
//   groups that span processes (createMixedCommunicator). Both engines
//   reduce in group order, so a mixed group gives the bits the thread
//   engine gives for the whole mesh.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_PROCESSGROUP_H
#define ERNIE_RUNTIME_PROCESSGROUP_H

#include "ernie/runtime/Communicator.h"
#include "ernie/runtime/NcclCommunicator.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace ernie::runtime {

class RendezvousStore;

struct ProcessGroupOptions {
  int64_t process = 0;   // this process, 0 .. processes - 1
  int64_t processes = 1; // processes in the job
  int64_t ranksPerProcess = 1;
  /// Process 0's "host:port": it serves the store there, the others connect
  /// (retrying until the timeout while process 0 is not up yet).
  std::string storeAddress;
  /// The address this process's Gloo pairs listen on (its own host's).
  std::string hostname = "127.0.0.1";
  /// Bounds the join, every collective and the store's waits.
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
  /// How often this process's heartbeat counter moves.
  std::chrono::milliseconds heartbeat = std::chrono::seconds(1);
};

class ProcessGroup {
public:
  /// Serves (process 0) or reaches the store. std::invalid_argument for a
  /// bad process index or address; CommunicationError naming the address
  /// when the store cannot be served (a port in use) or reached in time.
  explicit ProcessGroup(ProcessGroupOptions options);
  /// Stops the heartbeat; process 0 serves the store until every other
  /// process has let go of it (at most the timeout).
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup &) = delete;
  ProcessGroup &operator=(const ProcessGroup &) = delete;

  const ProcessGroupOptions &options() const { return options_; }
  /// "process 1 (mesh ranks 2..3)", for messages.
  std::string describe(int64_t process) const;

  /// Publishes `identity` ("key=value" lines) and waits for every process's.
  /// CommunicationError naming the processes that never joined, the first
  /// that refused to start (a non-empty `refusal`: its reason, which this
  /// process's own), or the first whose identity differs from process 0's
  /// (and the line that differs). Starts the heartbeat.
  void join(const std::string &identity, const std::string &refusal = "");

  /// Rank `rank`'s communicator: thread-engine groups inside this process
  /// (from `local`, a communicator of `world`'s), Gloo over the groups that
  /// span processes. `rank` must be one of this process's.
  std::unique_ptr<Communicator>
  communicator(const Mesh &mesh, int64_t rank,
               std::unique_ptr<Communicator> local);
  /// Rank `rank`'s NCCL communicator (one rank per process, on its GPU).
  /// Unverified: compiled, never run on a GPU.
  std::unique_ptr<Communicator> ncclCommunicator(const Mesh &mesh,
                                                 int64_t rank,
                                                 NcclOptions options);

  /// Which other processes have stopped: those whose heartbeat does not
  /// move over a few periods (it waits that long), or process 0 when the
  /// store it serves is gone. "" when every process looks alive.
  std::string stoppedProcesses();

  /// Publishes an abort every process's next collective sees.
  void abort(const std::string &reason);

private:
  void beat();
  std::string heartbeatKey(int64_t process) const;

  ProcessGroupOptions options_;
  std::shared_ptr<RendezvousStore> store_;
  std::mutex mutex_;
  std::condition_variable stop_;
  bool stopping_ = false; // mutex_
  std::thread heartbeat_;
};

/// Routes each collective of one rank to `local` (a thread-engine
/// communicator) when every member of the group is one of `localRanks`
/// consecutive ranks from `firstLocal`, else to `remote` (Gloo over the
/// whole mesh); point to point by where the peer is. Aborts reach both.
std::unique_ptr<Communicator>
createMixedCommunicator(std::unique_ptr<Communicator> local,
                        std::unique_ptr<Communicator> remote,
                        int64_t firstLocal, int64_t localRanks);

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_PROCESSGROUP_H

//===- NcclCommunicator.h - one process per GPU over NCCL --------*- C++ -*-===//
//
// UNVERIFIED ON A GPU: built and linked without one (ERNIE_ENABLE_CUDA), its
// rendezvous tested on the CPU (NcclRendezvousTest); the collectives have
// not run on GPUs yet.
//
// One process per GPU (and host). The ncclUniqueId goes through the same
// rendezvous store as Gloo's (a shared directory, or rank 0's TCP store at
// host:port): rank 0 makes it, the others read it. Every mesh-axis group the
// program uses gets its own communicator, split from the world's
// (ncclCommSplit: color = the rank's coordinates on the other axes, key =
// its coordinate on the group's axes), all of them made when the executor
// loads (Communicator::prepareGroups), since a split is collective over
// every rank. Buffers are device memory; each call is enqueued on the
// caller's current stream.
//
// Reductions: by default all-reduce and reduce-scatter exchange the inputs
// (NCCL all-gather / grouped send-receive) and reduce in group order on
// the device, so every rank, every run and every engine (threads, Gloo)
// gives the same bits; `nativeReductions` uses NCCL's own reduction kernels
// instead (less traffic, NCCL's order). Sends are eager (the data is copied
// and the send is enqueued on a stream of its own); a pair's messages
// arrive in the order they were sent, which ernie's schedules keep (NCCL has
// no tags).
//
// Faults: a watchdog thread polls every communicator's asynchronous error
// (ncclCommGetAsyncError), the events of the calls in flight against the
// timeout, and the store for another rank's abort; any of them aborts every
// communicator (ncclCommAbort, never a hanging destroy) and publishes the
// reason, naming the rank and the collective, for every other rank.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_NCCLCOMMUNICATOR_H
#define ERNIE_RUNTIME_NCCLCOMMUNICATOR_H

#include "ernie/runtime/Communicator.h"

#include <chrono>
#include <memory>
#include <string>

namespace ernie::runtime {

struct NcclOptions {
  /// Exactly one, as GlooOptions: a directory every rank shares, or rank
  /// 0's "host:port".
  std::string storePath, storeAddress;
  /// The GPU: "cuda" (LOCAL_RANK's, else device 0) or "cuda:N".
  std::string device = "cuda";
  /// How long a call may stay in flight before every rank is aborted.
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
  /// NCCL's own all-reduce and reduce-scatter instead of exchanging and
  /// reducing in group order.
  bool nativeReductions = false;
};

/// DeviceError when built without CUDA or no GPU is visible;
/// std::invalid_argument for a bad rank or store; CommunicationError when
/// the rendezvous or NCCL's initialisation fails.
std::unique_ptr<Communicator> createNcclCommunicator(Mesh mesh, int64_t rank,
                                                     NcclOptions options);

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_NCCLCOMMUNICATOR_H

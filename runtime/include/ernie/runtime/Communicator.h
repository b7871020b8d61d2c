//===- Communicator.h - collectives behind one interface ---------*- C++ -*-===//
//
// What the executor asks of a collective engine, whatever carries the bytes:
// threads in one process, Gloo over TCP, NCCL on GPUs. Groups are named by
// mesh axes (Mesh.h), never by rank lists, and every engine reduces in group
// order so results are bitwise identical across engines and runs. Blocking
// calls have async forms that run on a communication thread.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_COMMUNICATOR_H
#define ERNIE_RUNTIME_COMMUNICATOR_H

#include "ernie/runtime/DType.h"
#include "ernie/runtime/Mesh.h"

#include <chrono>
#include <cstddef>
#include <functional>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace ernie::runtime {

enum class ReduceOp { Sum, Avg, Max, Min };

using Axes = std::vector<std::string>;

class Device;

/// A collective failed: a peer never arrived, another rank aborted, or the
/// arguments disagree. The message names the rank and the collective.
struct CommunicationError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A collective running on a communication thread. Copies share it: a
/// bucket's all-reduce is waited for by each of the futures it fills.
class AsyncHandle {
public:
  AsyncHandle() = default;
  explicit AsyncHandle(std::future<void> future) : future_(future.share()) {}
  /// Blocks until the collective is done; rethrows its error.
  void wait();
  bool valid() const { return future_.valid(); }

private:
  std::shared_future<void> future_;
};

class Communicator {
public:
  Communicator();
  virtual ~Communicator();

  virtual int64_t rank() const = 0;
  virtual const Mesh &mesh() const = 0;
  /// Where the buffers every call takes live (Device.h): the host for the
  /// thread engine on the CPU and for Gloo, a GPU for NCCL and the
  /// shared-device engine. A call on device buffers sees the work ordered
  /// before it on the caller's current stream, and work ordered after it
  /// there sees its results.
  virtual Device &device() const;
  /// The groups (mesh-axis lists) the caller will use, the same list on
  /// every rank: engines that must make a group's communicator collectively
  /// over every rank (NCCL's ncclCommSplit) make them here, in this order.
  /// The others make groups on first use and ignore it.
  virtual void prepareGroups(const std::vector<Axes> &groups) { (void)groups; }
  /// Throws the CommunicationError of a failure found since the calls
  /// returned — engines that enqueue work (NCCL) learn of errors, timeouts
  /// and other ranks' aborts later. The executor calls it once a function's
  /// work is done; the others never have one to raise.
  virtual void raiseAsyncError() {}

  /// out = reduce over the group of `in` (count elements of `type`).
  virtual void allReduce(const void *in, void *out, size_t count, DType type,
                         ReduceOp op, const Axes &axes) = 0;
  /// out = the members' `bytes`-long inputs, concatenated in group order.
  virtual void allGather(const void *in, void *out, size_t bytes,
                         const Axes &axes) = 0;
  /// in holds group-size chunks of `count` elements; out = the reduction of
  /// every member's chunk at this rank's group index.
  virtual void reduceScatter(const void *in, void *out, size_t count,
                             DType type, ReduceOp op, const Axes &axes) = 0;
  /// in holds group-size chunks of `bytes`; chunk j goes to member j; out
  /// holds what member i sent, in order i.
  virtual void allToAll(const void *in, void *out, size_t bytes,
                        const Axes &axes) = 0;
  /// Every member's `data` becomes the data of the member at `rootIndex`.
  virtual void broadcast(void *data, size_t bytes, int64_t rootIndex,
                         const Axes &axes) = 0;
  /// A cyclic shift over the group: member i sends its `bytes` at `in` to
  /// member (i + shift) mod n and receives member (i - shift) mod n's into
  /// `out` (n = group size; any shift, negative too). A shift that is a
  /// multiple of n copies `in` to `out` without communicating. `in` and `out`
  /// may overlap. Every member must pass the same shift.
  virtual void permute(const void *in, void *out, size_t bytes, int64_t shift,
                       const Axes &axes) = 0;
  /// Point to point. A send is eager on every engine: it copies `data` and
  /// returns without waiting for the receiver (pipeline stages send to each
  /// other at once). A recv blocks until the message from `peer` with `tag`
  /// arrives; messages of one (sender, receiver, tag) arrive in order, and
  /// their sizes must match.
  virtual void send(const void *data, size_t bytes, int64_t peer,
                    int64_t tag) = 0;
  virtual void recv(void *data, size_t bytes, int64_t peer, int64_t tag) = 0;
  virtual void barrier(const Axes &axes) = 0;

  /// Runs `collective` (a call of the methods above) on this communicator's
  /// communication thread, after every collective started before it: the
  /// engines pair collectives on a group by their order, so started ones
  /// keep the order of their start() calls. Wait for a started collective
  /// before calling a blocking one on the same group.
  AsyncHandle start(std::function<void()> collective);

  /// Stops every rank: their pending and later collectives fail with
  /// `reason` instead of waiting for a peer that will never come.
  virtual void abort(const std::string &reason) = 0;

protected:
  /// Runs what was started and stops the communication thread. Engines call
  /// it first in their destructors, while the collectives can still run.
  void finishStarted();

private:
  struct Worker;
  std::unique_ptr<Worker> worker_;
};

/// Applies `op` to `count` elements of `type`: dst = dst (op) src.
void reduceInto(void *dst, const void *src, size_t count, DType type,
                ReduceOp op);
/// Reduces `n` equally long inputs in order into `out` (`avg` divides the
/// sum once at the end): the one reduction every engine uses, so engines
/// agree bit for bit.
void reduceInOrder(const std::vector<const void *> &inputs, void *out,
                   size_t count, DType type, ReduceOp op);
/// The same, writing the result to every one of `outputs` (each may be one
/// of the inputs: a block is read from every input before it is written).
void reduceInOrder(const std::vector<const void *> &inputs,
                   const std::vector<void *> &outputs, size_t count, DType type,
                   ReduceOp op);
/// "[dp, mp]", for messages.
std::string describeAxes(const Axes &axes);
/// `index + shift` modulo `n` (in [0, n), for any sign of shift): the member
/// a permute sends to, or the piece a shifted shard_slice keeps.
int64_t shiftedIndex(int64_t index, int64_t shift, int64_t n);

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_COMMUNICATOR_H

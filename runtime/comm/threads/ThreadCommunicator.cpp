//===- ThreadCommunicator.cpp - every rank a thread of one process ----------===//
//
// A collective is a rendezvous keyed by (kind, group, sequence number): each
// member posts pointers to its input and output and waits until all members
// have (the only wait that times out or sees an abort). Then every member
// runs the collective's phases on the posted buffers — reading the others'
// memory directly, no copies — with a barrier after each phase, and leaves
// only when every member is done reading its buffers. A phase is bounded
// work, so once all have arrived every member finishes. A member whose
// output partly overlaps its input posts a copy of the input instead.
//
// All-reduce is a reduce-scatter fused with an all-gather in shared memory:
// member i sums slice i of every input (in group order, as reduceInOrder
// does) and writes the sum into slice i of every member's output, so every
// rank reduces 1/n of the data in parallel, each input is read once and each
// output written once, and one phase suffices. Only member i touches slice
// i of any buffer, so an in-place all-reduce is safe.
//
// A wake-up through the condition variable costs more than a small
// collective's work, so a member first spins briefly on the counters it
// waits for — only where every rank of the world can have a core: a group
// of 2 among 8 ranks on 2 cores would burn the cores the other ranks need.
//
// On a GPU (the shared-device engine: every rank a thread on one device,
// each with its own streams) the same rendezvous moves device memory: the
// copies are device copies and the reductions the device's reduceInOrder,
// launched by each member on its current stream. A member synchronises its
// stream before it posts (its input is complete) and after each phase (its
// reads and writes are done before anyone leaves), so a call returns with
// its results in place, as on the host. Messages of send/recv are device
// buffers. This path has not yet run on a GPU (unverified).
//
//===----------------------------------------------------------------------===//

#include "ernie/runtime/ThreadCommunicator.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

namespace ernie::runtime {

struct ThreadWorld::State {
  State(Mesh mesh, std::chrono::milliseconds timeout, Device &device)
      : mesh(std::move(mesh)), timeout(timeout), device(device),
        host(device.hostAddressable()),
        wake(new std::condition_variable[this->mesh.numRanks()]) {}

  /// What the members posted. `copies[i]` holds member i's input when
  /// its output overlaps it; `finished[k]`: members done with phase k.
  struct Rendezvous {
    std::vector<const void *> inputs;
    std::vector<void *> outputs;
    std::vector<std::vector<char>> copies;
    std::vector<DeviceBuffer> deviceCopies; // the same, on a GPU
    // Changed under the mutex, read without it by spinning members.
    std::atomic<int64_t> arrived{0};
    std::unique_ptr<std::atomic<int64_t>[]> finished;
    int64_t departed = 0;
    bool cancelled = false; // a member gave up waiting: every member fails
  };

  /// A sent message: host bytes, or a device buffer on a GPU.
  struct Message {
    std::vector<char> bytes;
    DeviceBuffer buffer;
    size_t size = 0;
  };

  Mesh mesh;
  std::chrono::milliseconds timeout;
  Device &device;
  const bool host; // buffers are host memory
  std::mutex mutex;
  /// One per rank, which its threads (the executor's and the communication
  /// thread) wait on: a change wakes only the ranks it concerns. With one
  /// shared variable every send and every arrival woke every blocked rank,
  /// which on 8 ranks over 2 cores is most of a pipeline's waiting time.
  std::unique_ptr<std::condition_variable[]> wake;
  std::map<std::string, Rendezvous> rendezvous;
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::deque<Message>> mailbox;
  bool aborted = false;
  std::string abortReason;

  void notify(int64_t rank) { wake[rank].notify_all(); }
  void notify(const std::vector<int64_t> &ranks) {
    for (int64_t r : ranks)
      wake[r].notify_all();
  }
  void notifyEveryone() {
    for (int64_t r = 0; r < mesh.numRanks(); ++r)
      wake[r].notify_all();
  }

  /// Waits (as `rank`) for `ready` under the lock, failing on abort or
  /// deadline.
  template <typename Pred>
  void waitFor(std::unique_lock<std::mutex> &lock, int64_t rank, Pred ready,
               const std::string &what) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!ready()) {
      if (aborted)
        throw CommunicationError(what + ": aborted: " + abortReason);
      if (wake[rank].wait_until(lock, deadline) == std::cv_status::timeout &&
          !ready()) {
        if (aborted)
          throw CommunicationError(what + ": aborted: " + abortReason);
        throw CommunicationError(
            what + ": timed out after " + std::to_string(timeout.count()) +
            " ms waiting for the other members");
      }
    }
  }
};

namespace {

class ThreadCommunicator final : public Communicator {
public:
  ThreadCommunicator(std::shared_ptr<ThreadWorld::State> state, int64_t rank)
      : state_(std::move(state)), rank_(rank) {}
  ~ThreadCommunicator() override { finishStarted(); }

  int64_t rank() const override { return rank_; }
  const Mesh &mesh() const override { return state_->mesh; }
  Device &device() const override { return state_->device; }

  void allReduce(const void *in, void *out, size_t count, DType type,
                 ReduceOp op, const Axes &axes) override {
    const size_t elem = byteSize(type), bytes = count * elem;
    collective("all_reduce", axes, in, bytes, out, bytes,
               {[&](const Posted &p, int64_t me, int64_t n) {
                 size_t lo = count * me / n, hi = count * (me + 1) / n;
                 std::vector<const void *> from;
                 std::vector<void *> to;
                 for (int64_t k = 0; k < n; ++k) {
                   from.push_back(static_cast<const char *>(p.inputs[k]) + lo * elem);
                   to.push_back(static_cast<char *>(p.outputs[k]) + lo * elem);
                 }
                 reduce(from, to, hi - lo, type, op);
               }});
  }

  void allGather(const void *in, void *out, size_t bytes,
                 const Axes &axes) override {
    collective("all_gather", axes, in, bytes, out, bytes * groupSize(axes),
               {[&](const Posted &p, int64_t, int64_t n) {
                 for (int64_t i = 0; i < n; ++i)
                   copyBytes(static_cast<char *>(out) + i * bytes, p.inputs[i],
                             bytes);
               }});
  }

  void reduceScatter(const void *in, void *out, size_t count, DType type,
                     ReduceOp op, const Axes &axes) override {
    size_t bytes = count * byteSize(type);
    collective("reduce_scatter", axes, in, bytes * groupSize(axes), out, bytes,
               {[&](const Posted &p, int64_t me, int64_t) {
                 reduceBlocks(p.inputs, me * bytes, out, count, type, op);
               }});
  }

  void allToAll(const void *in, void *out, size_t bytes,
                const Axes &axes) override {
    int64_t n = groupSize(axes);
    collective("all_to_all", axes, in, bytes * n, out, bytes * n,
               {[&](const Posted &p, int64_t me, int64_t) {
                 for (int64_t i = 0; i < n; ++i)
                   copyBytes(static_cast<char *>(out) + i * bytes,
                             static_cast<const char *>(p.inputs[i]) + me * bytes,
                             bytes);
               }});
  }

  void broadcast(void *data, size_t bytes, int64_t rootIndex,
                 const Axes &axes) override {
    if (rootIndex < 0 || rootIndex >= groupSize(axes))
      throw CommunicationError("rank " + std::to_string(rank_) +
                               ": broadcast root out of range");
    // Only the root's data is read and only the others' written.
    int64_t me = state_->mesh.indexInGroup(rank_, axes);
    bool root = me == rootIndex;
    collective("broadcast", axes, root ? data : nullptr, root ? bytes : 0,
               root ? nullptr : data, root ? 0 : bytes,
               {[&](const Posted &p, int64_t me, int64_t) {
                 if (me != rootIndex)
                   copyBytes(data, p.inputs[rootIndex], bytes);
               }});
  }

  /// A rendezvous like the collectives (its own sequence, keyed "permute"):
  /// each member copies out the posted input of the member `shift` before it.
  void permute(const void *in, void *out, size_t bytes, int64_t shift,
               const Axes &axes) override {
    int64_t n = groupSize(axes);
    if (shiftedIndex(0, shift, n) == 0) {
      if (state_->host) {
        if (in != out)
          std::memmove(out, in, bytes);
      } else {
        state_->device.copy(out, in, bytes);
        state_->device.synchronize(currentStream());
      }
      return;
    }
    collective("permute", axes, in, bytes, out, bytes,
               {[&](const Posted &p, int64_t me, int64_t) {
                 copyBytes(out, p.inputs[shiftedIndex(me, -(shift % n), n)],
                           bytes);
               }});
  }

  void barrier(const Axes &axes) override {
    collective("barrier", axes, nullptr, 0, nullptr, 0, {});
  }

  void send(const void *data, size_t bytes, int64_t peer,
            int64_t tag) override {
    checkPeer(peer, "send");
    ThreadWorld::State::Message message;
    message.size = bytes;
    if (state_->host) {
      const char *p = static_cast<const char *>(data);
      message.bytes.assign(p, p + bytes);
    } else {
      // Eager: the copy is done before the receiver may read it.
      message.buffer = DeviceBuffer(state_->device, bytes);
      state_->device.copy(message.buffer.data(), data, bytes);
      state_->device.synchronize(currentStream());
    }
    std::lock_guard<std::mutex> lock(state_->mutex);
    failIfAborted("send");
    state_->mailbox[{rank_, peer, tag}].push_back(std::move(message));
    state_->notify(peer);
  }

  void recv(void *data, size_t bytes, int64_t peer, int64_t tag) override {
    checkPeer(peer, "recv");
    std::unique_lock<std::mutex> lock(state_->mutex);
    failIfAborted("recv");
    auto key = std::make_tuple(peer, rank_, tag);
    state_->waitFor(
        lock, rank_, [&] { return !state_->mailbox[key].empty(); },
        "rank " + std::to_string(rank_) + ": recv from rank " +
            std::to_string(peer) + " (tag " + std::to_string(tag) + ")");
    ThreadWorld::State::Message message =
        std::move(state_->mailbox[key].front());
    state_->mailbox[key].pop_front();
    lock.unlock();
    if (message.size != bytes)
      throw CommunicationError("rank " + std::to_string(rank_) +
                               ": recv expected " + std::to_string(bytes) +
                               " bytes, rank " + std::to_string(peer) +
                               " sent " + std::to_string(message.size));
    if (state_->host) {
      std::memcpy(data, message.bytes.data(), bytes);
    } else {
      // Freed in stream order after the copy (the device's allocator).
      state_->device.copy(data, message.buffer.data(), bytes);
      state_->device.synchronize(currentStream());
    }
  }

  void abort(const std::string &reason) override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (!state_->aborted) {
      state_->aborted = true;
      state_->abortReason = "rank " + std::to_string(rank_) + ": " + reason;
    }
    state_->notifyEveryone();
  }

private:
  void checkPeer(int64_t peer, const char *what) const {
    if (peer < 0 || peer >= state_->mesh.numRanks() || peer == rank_)
      throw CommunicationError("rank " + std::to_string(rank_) + ": " + what +
                               " to invalid peer " + std::to_string(peer));
  }

  /// A phase's data movement: host memory directly, or the device's
  /// operations on the caller's current stream.
  void copyBytes(void *dst, const void *src, size_t bytes) const {
    if (state_->host)
      std::memcpy(dst, src, bytes);
    else
      state_->device.copy(dst, src, bytes);
  }
  void reduce(const std::vector<const void *> &from,
              const std::vector<void *> &to, size_t count, DType type,
              ReduceOp op) const {
    if (state_->host)
      reduceInOrder(from, to, count, type, op);
    else
      state_->device.reduceInOrder(from, to, count, type, op);
  }

  int64_t groupSize(const Axes &axes) const {
    return state_->mesh.group(rank_, axes).size();
  }

  /// Under the lock: after an abort nothing new starts.
  void failIfAborted(const std::string &what) const {
    if (state_->aborted)
      throw CommunicationError("rank " + std::to_string(rank_) + ": " + what +
                               ": aborted: " + state_->abortReason);
  }

  /// What a phase reads: every member's input and output, in group order.
  struct Posted {
    const std::vector<const void *> &inputs;
    const std::vector<void *> &outputs;
  };
  using Phase = std::function<void(const Posted &, int64_t me, int64_t n)>;

  /// `out` = the ordered reduction of `count` elements at byte `offset` of
  /// every input.
  void reduceBlocks(const std::vector<const void *> &inputs, size_t offset,
                    void *out, size_t count, DType type, ReduceOp op) const {
    std::vector<const void *> at(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i)
      at[i] = static_cast<const char *>(inputs[i]) + offset;
    reduce(at, {out}, count, type, op);
  }

  /// The rendezvous: post `in` (`inBytes`) and `out` (`outBytes`), wait for
  /// the group, run `phases` with a barrier after each, and leave when
  /// every member is done with every member's buffers. The last member to
  /// leave removes the rendezvous.
  void collective(const char *kind, const Axes &axes, const void *in,
                  size_t inBytes, void *out, size_t outBytes,
                  const std::vector<Phase> &phases) {
    int64_t n, me;
    std::string id;
    const std::vector<int64_t> *ranks;
    {
      std::lock_guard<std::mutex> lock(groupsMutex_);
      Group &g = groupOf(axes);
      n = g.members;
      me = g.index;
      ranks = &g.ranks; // std::map nodes do not move
      id = g.key + kind + '#' + std::to_string(g.sequences[kind]++);
    }

    // An input the member's own output overlaps (but is not: an in-place
    // all-reduce only writes slices no one else reads at the time) would
    // change under the others' reads: it is posted as a copy.
    const char *inBegin = static_cast<const char *>(in);
    const char *outBegin = static_cast<const char *>(out);
    bool overlaps = inBytes && outBytes && inBegin < outBegin + outBytes &&
                    outBegin < inBegin + inBytes &&
                    !(inBegin == outBegin && inBytes == outBytes &&
                      std::strcmp(kind, "all_reduce") == 0);
    std::vector<char> copy;
    DeviceBuffer deviceCopy;
    if (overlaps && state_->host) {
      copy.assign(inBegin, inBegin + inBytes);
    } else if (overlaps) {
      deviceCopy = DeviceBuffer(state_->device, inBytes);
      state_->device.copy(deviceCopy.data(), in, inBytes);
    }
    // On a GPU the input (and the copy) must be complete before anyone
    // reads it on another stream.
    if (!state_->host)
      state_->device.synchronize(currentStream());

    std::unique_lock<std::mutex> lock(state_->mutex);
    failIfAborted(std::string(kind) + " over " + describeAxes(axes));
    // std::map nodes do not move, so `slot` stays valid until erased, and
    // only the last member to leave erases it.
    auto &slot = state_->rendezvous[id];
    if (slot.inputs.empty()) {
      slot.inputs.resize(n);
      slot.outputs.resize(n);
      slot.copies.resize(n);
      slot.deviceCopies.resize(n);
      slot.finished.reset(new std::atomic<int64_t>[phases.size()]());
    }
    if (overlaps && state_->host) {
      slot.copies[me] = std::move(copy);
      in = slot.copies[me].data();
    } else if (overlaps) {
      slot.deviceCopies[me] = std::move(deviceCopy);
      in = slot.deviceCopies[me].data();
    }
    slot.inputs[me] = in;
    slot.outputs[me] = out;
    ++slot.arrived;
    state_->notify(*ranks);
    const bool spin = state_->mesh.numRanks() <= cores();
    if (spin) {
      lock.unlock();
      spinUntil([&] { return slot.arrived.load() == n; });
      lock.lock();
    }
    try {
      state_->waitFor(
          lock, rank_, [&] { return slot.arrived == n || slot.cancelled; },
          "rank " + std::to_string(rank_) + ": " + kind + " over " +
              describeAxes(axes));
      if (slot.cancelled && state_->aborted)
        failIfAborted(std::string(kind) + " over " + describeAxes(axes));
      if (slot.cancelled)
        throw CommunicationError("rank " + std::to_string(rank_) + ": " + kind +
                                 " over " + describeAxes(axes) +
                                 ": another member gave up waiting");
    } catch (...) {
      // Nobody has read anything yet: everyone still waiting fails too.
      slot.cancelled = true;
      state_->notify(*ranks);
      leave(id, slot);
      throw;
    }
    // Every member is here and runs every phase: no wait below can outlast
    // a phase's own work, so none needs a deadline.
    std::exception_ptr error;
    Posted posted{slot.inputs, slot.outputs};
    for (size_t k = 0; k < phases.size(); ++k) {
      lock.unlock();
      if (!error) {
        try {
          phases[k](posted, me, n);
          if (!state_->host)
            state_->device.synchronize(currentStream());
        } catch (...) {
          error = std::current_exception();
        }
      }
      lock.lock();
      ++slot.finished[k];
      state_->notify(*ranks);
      if (spin && slot.finished[k].load() != n) {
        lock.unlock();
        spinUntil([&] { return slot.finished[k].load() == n; });
        lock.lock();
      }
      state_->wake[rank_].wait(lock,
                               [&] { return slot.finished[k].load() == n; });
    }
    leave(id, slot);
    if (error)
      std::rethrow_exception(error);
  }

  static int64_t cores() {
    static const int64_t n = std::max(1u, std::thread::hardware_concurrency());
    return n;
  }

  /// Spins up to ~50 us for `ready`; the caller then waits on the
  /// condition variable if it is still false.
  template <typename Pred> static void spinUntil(Pred ready) {
    auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
    for (uint32_t i = 1; !ready(); ++i) {
      if (i % 64 == 0 && std::chrono::steady_clock::now() > until)
        return;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#else
      std::this_thread::yield();
#endif
    }
  }

  /// Under the lock: this member is done with the rendezvous. Every member
  /// that arrived leaves once; the last one erases it.
  void leave(const std::string &id, ThreadWorld::State::Rendezvous &slot) {
    if (++slot.departed == slot.arrived)
      state_->rendezvous.erase(id);
  }

  /// A group's members, this rank's index and the collectives' key prefix,
  /// computed once per axes.
  struct Group {
    int64_t members = 0, index = 0;
    std::vector<int64_t> ranks;
    std::string key;
    std::map<std::string, uint64_t> sequences;
  };
  Group &groupOf(const Axes &axes) { // under groupsMutex_
    auto [it, inserted] = groups_.try_emplace(axes);
    if (inserted) {
      std::vector<int64_t> group = state_->mesh.group(rank_, axes);
      it->second.members = group.size();
      it->second.ranks = group;
      it->second.index = state_->mesh.indexInGroup(rank_, axes);
      std::ostringstream key;
      for (int64_t r : group)
        key << r << ',';
      it->second.key = key.str();
    }
    return it->second;
  }

  std::shared_ptr<ThreadWorld::State> state_;
  int64_t rank_;
  // The executor's thread and its communication thread both start
  // collectives.
  std::mutex groupsMutex_;
  std::map<Axes, Group> groups_;
};

} // namespace

ThreadWorld::ThreadWorld(Mesh mesh, std::chrono::milliseconds timeout,
                         Device &device) {
  if (mesh.numRanks() > kMaxThreadRanks)
    throw std::invalid_argument(
        "the thread backend runs at most " + std::to_string(kMaxThreadRanks) +
        " ranks in one process; this mesh has " +
        std::to_string(mesh.numRanks()) + " (use --backend gloo over hosts)");
  state_ = std::make_shared<State>(std::move(mesh), timeout, device);
}

ThreadWorld::~ThreadWorld() = default;

std::unique_ptr<Communicator> ThreadWorld::communicator(int64_t rank) {
  if (rank < 0 || rank >= state_->mesh.numRanks())
    throw std::invalid_argument("rank " + std::to_string(rank) +
                                " is outside the mesh");
  return std::make_unique<ThreadCommunicator>(state_, rank);
}

const Mesh &ThreadWorld::mesh() const { return state_->mesh; }

} // namespace ernie::runtime

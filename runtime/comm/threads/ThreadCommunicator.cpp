//===- ThreadCommunicator.cpp - every rank a thread of one process ----------===//
//
// A collective is a rendezvous keyed by (kind, group, sequence number): each
// member posts its input pointer, waits until all members have, computes its
// own output from all inputs (in group order), then waits until every member
// is done reading before its buffers may be reused.
//
//===----------------------------------------------------------------------===//

#include "ernie/runtime/ThreadCommunicator.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <sstream>

namespace ernie::runtime {

struct ThreadWorld::State {
  State(Mesh mesh, std::chrono::milliseconds timeout)
      : mesh(std::move(mesh)), timeout(timeout) {}

  /// Members post copies of their inputs, so a member may overwrite its
  /// buffer (in-place collectives) or leave (a failure) while others read.
  struct Rendezvous {
    std::vector<std::vector<char>> inputs;
    int64_t arrived = 0;
    int64_t departed = 0;
  };

  Mesh mesh;
  std::chrono::milliseconds timeout;
  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::string, Rendezvous> rendezvous;
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::deque<std::vector<char>>>
      mailbox;
  bool aborted = false;
  std::string abortReason;

  /// Waits for `ready` under the lock, failing on abort or deadline.
  template <typename Pred>
  void waitFor(std::unique_lock<std::mutex> &lock, Pred ready,
               const std::string &what) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!ready()) {
      if (aborted)
        throw CommunicationError(what + ": aborted: " + abortReason);
      if (changed.wait_until(lock, deadline) == std::cv_status::timeout &&
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

  void allReduce(const void *in, void *out, size_t count, DType type,
                 ReduceOp op, const Axes &axes) override {
    collective("all_reduce", axes, in, count * byteSize(type),
               [&](const std::vector<const void *> &all, int64_t) {
                 reduceInOrder(all, out, count, type, op);
               });
  }

  void allGather(const void *in, void *out, size_t bytes,
                 const Axes &axes) override {
    collective("all_gather", axes, in, bytes,
               [&](const std::vector<const void *> &all, int64_t) {
                 for (size_t i = 0; i < all.size(); ++i)
                   std::memcpy(static_cast<char *>(out) + i * bytes, all[i],
                               bytes);
               });
  }

  void reduceScatter(const void *in, void *out, size_t count, DType type,
                     ReduceOp op, const Axes &axes) override {
    size_t bytes = count * byteSize(type);
    collective("reduce_scatter", axes, in, bytes * groupSize(axes),
               [&](const std::vector<const void *> &all, int64_t me) {
                 std::vector<const void *> chunks;
                 for (const void *member : all)
                   chunks.push_back(static_cast<const char *>(member) +
                                    me * bytes);
                 reduceInOrder(chunks, out, count, type, op);
               });
  }

  void allToAll(const void *in, void *out, size_t bytes,
                const Axes &axes) override {
    collective("all_to_all", axes, in, bytes * groupSize(axes),
               [&](const std::vector<const void *> &all, int64_t me) {
                 for (size_t i = 0; i < all.size(); ++i)
                   std::memcpy(static_cast<char *>(out) + i * bytes,
                               static_cast<const char *>(all[i]) + me * bytes,
                               bytes);
               });
  }

  void broadcast(void *data, size_t bytes, int64_t rootIndex,
                 const Axes &axes) override {
    collective("broadcast", axes, data, bytes,
               [&](const std::vector<const void *> &all, int64_t me) {
                 if (rootIndex < 0 ||
                     rootIndex >= static_cast<int64_t>(all.size()))
                   throw CommunicationError("broadcast root out of range");
                 if (me != rootIndex)
                   std::memcpy(data, all[rootIndex], bytes);
               });
  }

  /// A rendezvous like the collectives (its own sequence, keyed "permute"):
  /// each member copies out the posted input of the member `shift` before it.
  void permute(const void *in, void *out, size_t bytes, int64_t shift,
               const Axes &axes) override {
    int64_t n = groupSize(axes);
    if (shiftedIndex(0, shift, n) == 0) {
      if (in != out)
        std::memmove(out, in, bytes);
      return;
    }
    collective("permute", axes, in, bytes,
               [&](const std::vector<const void *> &all, int64_t me) {
                 std::memcpy(out, all[shiftedIndex(me, -(shift % n), n)],
                             bytes);
               });
  }

  void barrier(const Axes &axes) override {
    collective("barrier", axes, nullptr, 0,
               [](const std::vector<const void *> &, int64_t) {});
  }

  void send(const void *data, size_t bytes, int64_t peer,
            int64_t tag) override {
    checkPeer(peer, "send");
    std::lock_guard<std::mutex> lock(state_->mutex);
    failIfAborted("send");
    const char *p = static_cast<const char *>(data);
    state_->mailbox[{rank_, peer, tag}].emplace_back(p, p + bytes);
    state_->changed.notify_all();
  }

  void recv(void *data, size_t bytes, int64_t peer, int64_t tag) override {
    checkPeer(peer, "recv");
    std::unique_lock<std::mutex> lock(state_->mutex);
    failIfAborted("recv");
    auto key = std::make_tuple(peer, rank_, tag);
    state_->waitFor(
        lock, [&] { return !state_->mailbox[key].empty(); },
        "rank " + std::to_string(rank_) + ": recv from rank " +
            std::to_string(peer) + " (tag " + std::to_string(tag) + ")");
    std::vector<char> message = std::move(state_->mailbox[key].front());
    state_->mailbox[key].pop_front();
    if (message.size() != bytes)
      throw CommunicationError("rank " + std::to_string(rank_) +
                               ": recv expected " + std::to_string(bytes) +
                               " bytes, rank " + std::to_string(peer) +
                               " sent " + std::to_string(message.size()));
    std::memcpy(data, message.data(), bytes);
  }

  void abort(const std::string &reason) override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (!state_->aborted) {
      state_->aborted = true;
      state_->abortReason = "rank " + std::to_string(rank_) + ": " + reason;
    }
    state_->changed.notify_all();
  }

private:
  void checkPeer(int64_t peer, const char *what) const {
    if (peer < 0 || peer >= state_->mesh.numRanks() || peer == rank_)
      throw CommunicationError("rank " + std::to_string(rank_) + ": " + what +
                               " to invalid peer " + std::to_string(peer));
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

  /// The rendezvous: post a copy of `in` (`inBytes` long), wait for the
  /// group, `compute` this rank's output from every member's input. The last
  /// member to finish reading removes the rendezvous.
  template <typename Fn>
  void collective(const char *kind, const Axes &axes, const void *in,
                  size_t inBytes, Fn compute) {
    std::vector<int64_t> group = state_->mesh.group(rank_, axes);
    int64_t me = state_->mesh.indexInGroup(rank_, axes);
    int64_t n = group.size();
    std::ostringstream key;
    key << kind;
    for (int64_t r : group)
      key << ',' << r;
    std::string groupKey = key.str();
    uint64_t sequence;
    {
      std::lock_guard<std::mutex> lock(sequenceMutex_);
      sequence = sequences_[groupKey]++;
    }
    std::string id = groupKey + '#' + std::to_string(sequence);
    std::string what = "rank " + std::to_string(rank_) + ": " + kind +
                       " over " + describeAxes(axes);

    // Copied before taking the world's lock, which every rank's collective
    // needs: the lock only hands the copy over.
    const char *bytes = static_cast<const char *>(in);
    std::vector<char> posted(bytes, bytes + inBytes);
    std::unique_lock<std::mutex> lock(state_->mutex);
    failIfAborted(std::string(kind) + " over " + describeAxes(axes));
    // std::map nodes do not move, so `slot` stays valid until erased, and
    // only the last reader erases it.
    auto &slot = state_->rendezvous[id];
    if (slot.inputs.empty())
      slot.inputs.resize(n);
    slot.inputs[me] = std::move(posted);
    ++slot.arrived;
    state_->changed.notify_all();
    try {
      state_->waitFor(lock, [&] { return slot.arrived == n; }, what);
    } catch (...) {
      leave(id, slot, n);
      throw;
    }
    lock.unlock();
    std::vector<const void *> inputs;
    for (const std::vector<char> &input : slot.inputs)
      inputs.push_back(input.data());
    try {
      compute(inputs, me);
    } catch (...) {
      lock.lock();
      leave(id, slot, n);
      throw;
    }
    lock.lock();
    leave(id, slot, n);
  }

  /// Under the lock: this member is done with the rendezvous.
  void leave(const std::string &id, ThreadWorld::State::Rendezvous &slot,
             int64_t n) {
    if (++slot.departed == n)
      state_->rendezvous.erase(id);
  }

  std::shared_ptr<ThreadWorld::State> state_;
  int64_t rank_;
  std::mutex sequenceMutex_;
  std::map<std::string, uint64_t> sequences_;
};

} // namespace

ThreadWorld::ThreadWorld(Mesh mesh, std::chrono::milliseconds timeout) {
  if (mesh.numRanks() > kMaxThreadRanks)
    throw std::invalid_argument(
        "the thread backend runs at most " + std::to_string(kMaxThreadRanks) +
        " ranks in one process; this mesh has " +
        std::to_string(mesh.numRanks()) + " (use --backend gloo over hosts)");
  state_ = std::make_shared<State>(std::move(mesh), timeout);
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

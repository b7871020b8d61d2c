//===- MixedCommunicator.cpp - threads inside a process, Gloo across --------===//
//
// One rank of a process that runs several ranks of a multi-process job. A
// group whose members are all in this process meets in the thread engine
// (shared memory, no copies); a group that spans processes meets over the
// remote engine, every member a peer of its own there (the same process's
// members over loopback). Which engine a group uses depends only on the
// group, so every member picks the same one and collectives pair up in
// program order on each. Both engines reduce in group order: the bits are
// the same whichever carries a group.
//
//===----------------------------------------------------------------------===//

#include "ernie/runtime/ProcessGroup.h"

#include <map>
#include <mutex>

namespace ernie::runtime {

namespace {

class MixedCommunicator final : public Communicator {
public:
  MixedCommunicator(std::unique_ptr<Communicator> local,
                    std::unique_ptr<Communicator> remote, int64_t firstLocal,
                    int64_t localRanks)
      : local_(std::move(local)), remote_(std::move(remote)),
        firstLocal_(firstLocal), localRanks_(localRanks) {}

  ~MixedCommunicator() override { finishStarted(); }

  int64_t rank() const override { return local_->rank(); }
  const Mesh &mesh() const override { return local_->mesh(); }
  Device &device() const override { return local_->device(); }
  void raiseAsyncError() override {
    local_->raiseAsyncError();
    remote_->raiseAsyncError();
  }

  void allReduce(const void *in, void *out, size_t count, DType type,
                 ReduceOp op, const Axes &axes) override {
    over(axes).allReduce(in, out, count, type, op, axes);
  }
  void allGather(const void *in, void *out, size_t bytes,
                 const Axes &axes) override {
    over(axes).allGather(in, out, bytes, axes);
  }
  void reduceScatter(const void *in, void *out, size_t count, DType type,
                     ReduceOp op, const Axes &axes) override {
    over(axes).reduceScatter(in, out, count, type, op, axes);
  }
  void allToAll(const void *in, void *out, size_t bytes,
                const Axes &axes) override {
    over(axes).allToAll(in, out, bytes, axes);
  }
  void broadcast(void *data, size_t bytes, int64_t rootIndex,
                 const Axes &axes) override {
    over(axes).broadcast(data, bytes, rootIndex, axes);
  }
  void permute(const void *in, void *out, size_t bytes, int64_t shift,
               const Axes &axes) override {
    over(axes).permute(in, out, bytes, shift, axes);
  }
  void barrier(const Axes &axes) override { over(axes).barrier(axes); }

  void send(const void *data, size_t bytes, int64_t peer,
            int64_t tag) override {
    to(peer).send(data, bytes, peer, tag);
  }
  void recv(void *data, size_t bytes, int64_t peer, int64_t tag) override {
    to(peer).recv(data, bytes, peer, tag);
  }

  void abort(const std::string &reason) override {
    local_->abort(reason);
    remote_->abort(reason);
  }

private:
  bool isLocal(int64_t rank) const {
    return rank >= firstLocal_ && rank < firstLocal_ + localRanks_;
  }

  Communicator &to(int64_t peer) { return isLocal(peer) ? *local_ : *remote_; }

  /// The engine of the group over `axes`: decided once per group.
  Communicator &over(const Axes &axes) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto [it, inserted] = inProcess_.try_emplace(axes, true);
    if (inserted)
      for (int64_t member : mesh().group(rank(), axes))
        it->second = it->second && isLocal(member);
    return it->second ? *local_ : *remote_;
  }

  std::unique_ptr<Communicator> local_, remote_;
  int64_t firstLocal_, localRanks_;
  std::mutex mutex_;
  std::map<Axes, bool> inProcess_; // mutex_
};

} // namespace

std::unique_ptr<Communicator>
createMixedCommunicator(std::unique_ptr<Communicator> local,
                        std::unique_ptr<Communicator> remote,
                        int64_t firstLocal, int64_t localRanks) {
  if (!local || !remote || local->rank() != remote->rank())
    throw std::invalid_argument(
        "a mixed communicator joins two engines' communicators of one rank");
  return std::make_unique<MixedCommunicator>(std::move(local),
                                             std::move(remote), firstLocal,
                                             localRanks);
}

} // namespace ernie::runtime

//===- NcclCommunicator.cpp - one process per GPU over NCCL -----------------===//
//
// UNVERIFIED ON A GPU: compiled and linked without one; the rendezvous is
// tested on the CPU, the collectives have not run on GPUs yet.
// NcclCommunicator.h says what this engine promises.
//
//===----------------------------------------------------------------------===//

#include "ernie/runtime/NcclCommunicator.h"

#include "NcclRendezvous.h"

#include "ernie/runtime/Device.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

namespace ernie::runtime {

namespace {

using Clock = std::chrono::steady_clock;

cudaStream_t currentCudaStream() {
  return static_cast<cudaStream_t>(currentStream().handle);
}

ncclDataType_t ncclType(DType t) {
  switch (t) {
  case DType::F64: return ncclFloat64;
  case DType::F32: return ncclFloat32;
  case DType::F16: return ncclFloat16;
  case DType::BF16: return ncclBfloat16;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
  case DType::F8E4M3FN: return ncclFloat8e4m3;
  case DType::F8E5M2: return ncclFloat8e5m2;
#endif
  case DType::I64: return ncclInt64;
  case DType::I32: return ncclInt32;
  default: return ncclUint8;
  }
}

ncclRedOp_t ncclOp(ReduceOp op) {
  switch (op) {
  case ReduceOp::Sum: return ncclSum;
  case ReduceOp::Avg: return ncclAvg;
  case ReduceOp::Max: return ncclMax;
  case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

class NcclCommunicator final : public Communicator {
public:
  NcclCommunicator(Mesh mesh, int64_t rank,
                   std::shared_ptr<RendezvousStore> store, NcclOptions options)
      : mesh_(std::move(mesh)), rank_(rank), options_(std::move(options)),
        device_(openDevice(options_.device)), store_(std::move(store)) {
    // The device's first call makes it current on this thread.
    sendStream_ = device_->createStream();
    cudaGetDevice(&ordinal_); // for the watchdog thread
    std::vector<char> bytes;
    try {
      bytes = ncclIdThroughStore(*store_, "ernie.nccl.world", [] {
        ncclUniqueId id;
        ncclResult_t status = ncclGetUniqueId(&id);
        if (status != ncclSuccess)
          throw CommunicationError(std::string("ncclGetUniqueId: ") +
                                   ncclGetErrorString(status));
        return std::vector<char>(id.internal, id.internal + sizeof id.internal);
      });
    } catch (const CommunicationError &) {
      throw;
    } catch (const std::exception &e) {
      throw CommunicationError("rank " + std::to_string(rank_) +
                               ": the NCCL rendezvous: " + e.what());
    }
    ncclUniqueId id;
    std::memcpy(id.internal, bytes.data(), sizeof id.internal);
    require(ncclCommInitRank(&world_, int(mesh_.numRanks()), id, int(rank_)),
            "ncclCommInitRank");
    // Point to point: one communicator per direction (to a higher rank, to
    // a lower one), so that one rank's sends never queue behind its
    // receives from the same peer.
    for (ncclComm_t &c : p2p_)
      require(ncclCommSplit(world_, 0, int(rank_), &c, nullptr),
              "ncclCommSplit (point to point)");
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclCommunicator() override {
    finishStarted();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    if (watchdog_.joinable())
      watchdog_.join();
    std::vector<ncclComm_t> all = comms();
    if (aborted_.empty()) {
      try {
        device_->synchronize(sendStream_);
      } catch (...) {
      }
      for (ncclComm_t c : all)
        ncclCommDestroy(c);
    } else {
      for (ncclComm_t c : all)
        ncclCommAbort(c);
    }
    device_->destroyStream(sendStream_);
  }

  int64_t rank() const override { return rank_; }
  const Mesh &mesh() const override { return mesh_; }
  Device &device() const override { return *device_; }

  void prepareGroups(const std::vector<Axes> &groups) override {
    for (const Axes &axes : groups) {
      if (groups_.count(axes) || mesh_.group(rank_, axes).size() <= 1)
        continue;
      NcclSplit split = ncclSplitOf(mesh_, rank_, axes);
      ncclComm_t c = nullptr;
      require(ncclCommSplit(world_, split.color, split.key, &c, nullptr),
              "ncclCommSplit over " + describeAxes(axes));
      std::lock_guard<std::mutex> lock(mutex_);
      groups_[axes] = c;
    }
  }

  void allReduce(const void *in, void *out, size_t count, DType type,
                 ReduceOp op, const Axes &axes) override {
    reduction(false, in, out, count, type, op, axes);
  }

  void allGather(const void *in, void *out, size_t bytes,
                 const Axes &axes) override {
    Group g = group(axes, "all_gather");
    if (!g.comm)
      return device_->copy(out, in, bytes);
    call("all_gather", axes, [&] {
      return ncclAllGather(in, out, bytes, ncclUint8, g.comm,
                           currentCudaStream());
    });
  }

  void reduceScatter(const void *in, void *out, size_t count, DType type,
                     ReduceOp op, const Axes &axes) override {
    reduction(true, in, out, count, type, op, axes);
  }

  void allToAll(const void *in, void *out, size_t bytes,
                const Axes &axes) override {
    Group g = group(axes, "all_to_all");
    if (!g.comm)
      return device_->copy(out, in, bytes);
    exchange("all_to_all", axes, g, in, out, bytes);
  }

  void broadcast(void *data, size_t bytes, int64_t rootIndex,
                 const Axes &axes) override {
    Group g = group(axes, "broadcast");
    if (rootIndex < 0 || rootIndex >= g.size)
      throw CommunicationError("rank " + std::to_string(rank_) +
                               ": broadcast root out of range");
    if (!g.comm)
      return;
    call("broadcast", axes, [&] {
      return ncclBroadcast(data, data, bytes, ncclUint8, int(rootIndex),
                           g.comm, currentCudaStream());
    });
  }

  void permute(const void *in, void *out, size_t bytes, int64_t shift,
               const Axes &axes) override {
    Group g = group(axes, "permute");
    int64_t n = g.size;
    if (!g.comm || shiftedIndex(0, shift, n) == 0)
      return device_->copy(out, in, bytes);
    const char *src = static_cast<const char *>(in);
    char *dst = static_cast<char *>(out);
    if (src < dst + bytes && dst < src + bytes) { // overlapping: a copy first
      char *copy = scratch(bytes);
      device_->copy(copy, in, bytes);
      src = copy;
    }
    int64_t to = shiftedIndex(g.index, shift, n),
            from = shiftedIndex(g.index, -(shift % n), n);
    call("permute", axes, [&]() -> ncclResult_t {
      cudaStream_t s = currentCudaStream();
      ncclGroupStart();
      ncclSend(src, bytes, ncclUint8, int(to), g.comm, s);
      ncclRecv(dst, bytes, ncclUint8, int(from), g.comm, s);
      return ncclGroupEnd();
    });
  }

  void send(const void *data, size_t bytes, int64_t peer, int64_t) override {
    checkPeer(peer, "send");
    failIfAborted("send");
    // Eager: the data is copied on the caller's stream, and the send waits
    // for the copy on a stream of its own and keeps the copy until done.
    auto pending = std::make_unique<PendingSend>();
    pending->copy = DeviceBuffer(*device_, bytes ? bytes : 1);
    device_->copy(pending->copy.data(), data, bytes);
    Event copied = device_->createEvent();
    device_->record(copied, currentStream());
    device_->wait(sendStream_, copied);
    device_->destroyEvent(copied);
    {
      StreamGuard guard(sendStream_);
      call("send to rank " + std::to_string(peer), {}, [&] {
        return ncclSend(pending->copy.data(), bytes, ncclUint8, int(peer),
                        p2p_[peer > rank_ ? 0 : 1], currentCudaStream());
      });
      pending->done = device_->createEvent();
      device_->record(pending->done, sendStream_);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    sends_.push_back(std::move(pending));
    // Copies whose sends are done are freed here.
    while (!sends_.empty() &&
           cudaEventQuery(static_cast<cudaEvent_t>(sends_.front()->done.handle)) ==
               cudaSuccess) {
      device_->destroyEvent(sends_.front()->done);
      sends_.pop_front();
    }
  }

  void recv(void *data, size_t bytes, int64_t peer, int64_t) override {
    checkPeer(peer, "recv");
    call("recv from rank " + std::to_string(peer), {}, [&] {
      // The peer sends on the communicator of its direction.
      return ncclRecv(data, bytes, ncclUint8, int(peer),
                      p2p_[rank_ > peer ? 0 : 1], currentCudaStream());
    });
  }

  void barrier(const Axes &axes) override {
    Group g = group(axes, "barrier");
    if (!g.comm)
      return;
    DeviceBuffer one(*device_, sizeof(float));
    call("barrier", axes, [&] {
      return ncclAllReduce(one.data(), one.data(), 1, ncclFloat32, ncclSum,
                           g.comm, currentCudaStream());
    });
    device_->synchronize(currentStream());
    raiseAsyncError();
  }

  void abort(const std::string &reason) override {
    std::string message = "rank " + std::to_string(rank_) + ": " + reason;
    abortAll(message, /*publish=*/true);
  }

  void raiseAsyncError() override { failIfAborted("a collective"); }

private:
  struct Group {
    ncclComm_t comm = nullptr; // null: a group of one
    int64_t size = 1, index = 0;
  };
  struct PendingSend {
    DeviceBuffer copy;
    Event done;
  };
  /// A call in flight: the event after it, its deadline and its name.
  struct InFlight {
    cudaEvent_t done;
    Clock::time_point deadline;
    std::string what;
  };

  void require(ncclResult_t status, const std::string &what) {
    if (status != ncclSuccess)
      throw CommunicationError("rank " + std::to_string(rank_) + ": " + what +
                               ": " + ncclGetErrorString(status));
  }

  void checkPeer(int64_t peer, const char *what) const {
    if (peer < 0 || peer >= mesh_.numRanks() || peer == rank_)
      throw CommunicationError("rank " + std::to_string(rank_) + ": " + what +
                               " to invalid peer " + std::to_string(peer));
  }

  void failIfAborted(const std::string &what) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_.empty())
      throw CommunicationError("rank " + std::to_string(rank_) + ": " + what +
                               ": aborted: " + aborted_);
  }

  Group group(const Axes &axes, const char *what) {
    failIfAborted(std::string(what) + " over " + describeAxes(axes));
    Group g;
    g.size = int64_t(mesh_.group(rank_, axes).size());
    g.index = mesh_.indexInGroup(rank_, axes);
    if (g.size <= 1)
      return g;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = groups_.find(axes);
    if (it == groups_.end())
      throw CommunicationError(
          "rank " + std::to_string(rank_) + ": " + what + " over " +
          describeAxes(axes) +
          ": no NCCL communicator for this group (NCCL makes groups "
          "collectively when the program loads: prepareGroups)");
    g.comm = it->second;
    return g;
  }

  /// all_reduce (`scatter` false: every member's whole input) or
  /// reduce_scatter (chunk `me` of every member's input): NCCL's own kernel
  /// when asked, else every member's input gathered (exchanged) here and
  /// reduced on the device in group order.
  void reduction(bool scatter, const void *in, void *out, size_t count,
                 DType type, ReduceOp op, const Axes &axes) {
    const char *what = scatter ? "reduce_scatter" : "all_reduce";
    Group g = group(axes, what);
    const size_t bytes = count * byteSize(type);
    if (!g.comm)
      return local(in, out, bytes, type, op);
    if (options_.nativeReductions) {
      call(what, axes, [&] {
        cudaStream_t s = currentCudaStream();
        return scatter ? ncclReduceScatter(in, out, count, ncclType(type),
                                           ncclOp(op), g.comm, s)
                       : ncclAllReduce(in, out, count, ncclType(type),
                                       ncclOp(op), g.comm, s);
      });
      return;
    }
    char *all = scratch(bytes * g.size);
    if (scatter)
      exchange(what, axes, g, in, all, bytes);
    else
      call(what, axes, [&] {
        return ncclAllGather(in, all, bytes, ncclUint8, g.comm,
                             currentCudaStream());
      });
    reduceChunks(all, bytes, g.size, out, count, type, op);
  }

  /// A group of one: the reduction of one input is a copy.
  void local(const void *in, void *out, size_t bytes, DType type, ReduceOp op) {
    if (op == ReduceOp::Avg && (type == DType::I64 || type == DType::I32))
      throw CommunicationError("avg reductions need a float type");
    device_->copy(out, in, bytes);
  }

  /// Enqueues `enqueue()` (an NCCL call on the current stream), checks its
  /// status, and registers it with the watchdog.
  template <typename Fn>
  void call(const std::string &what, const Axes &axes, Fn enqueue) {
    std::string name = what + (axes.empty() ? "" : " over " + describeAxes(axes));
    failIfAborted(name);
    ncclResult_t status = enqueue();
    if (status != ncclSuccess && status != ncclInProgress) {
      std::string message = "rank " + std::to_string(rank_) + ": " + name +
                            ": " + ncclGetErrorString(status);
      abortAll(message, true);
      throw CommunicationError(message);
    }
    cudaEvent_t done = nullptr;
    if (cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventRecord(done, currentCudaStream()) != cudaSuccess)
      throw CommunicationError("rank " + std::to_string(rank_) + ": " + name +
                               ": cannot record its completion");
    std::lock_guard<std::mutex> lock(mutex_);
    inFlight_.push_back({done, Clock::now() + options_.timeout, name});
  }

  /// Grouped sends and receives: chunk j of `in` to member j, member j's
  /// chunk for this rank into chunk j of `out`.
  void exchange(const char *what, const Axes &axes, const Group &g,
                const void *in, void *out, size_t bytes) {
    call(what, axes, [&]() -> ncclResult_t {
      cudaStream_t s = currentCudaStream();
      ncclGroupStart();
      for (int64_t j = 0; j < g.size; ++j) {
        ncclSend(static_cast<const char *>(in) + j * bytes, bytes, ncclUint8,
                 int(j), g.comm, s);
        ncclRecv(static_cast<char *>(out) + j * bytes, bytes, ncclUint8, int(j),
                 g.comm, s);
      }
      return ncclGroupEnd();
    });
  }

  /// out = the ordered reduction of `n` chunks of `bytes` at `all`.
  void reduceChunks(const char *all, size_t bytes, int64_t n, void *out,
                    size_t count, DType type, ReduceOp op) {
    std::vector<const void *> inputs;
    for (int64_t j = 0; j < n; ++j)
      inputs.push_back(all + j * bytes);
    device_->reduceInOrder(inputs, {out}, count, type, op);
  }

  /// A device buffer of at least `bytes`, per calling thread (the
  /// executor's thread and its communication thread each have their own),
  /// kept for the communicator's life.
  char *scratch(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceBuffer &b = scratch_[std::this_thread::get_id()];
    b.reserve(*device_, bytes);
    return static_cast<char *>(b.data());
  }

  std::vector<ncclComm_t> comms() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<ncclComm_t> all;
    for (auto &entry : groups_)
      all.push_back(entry.second);
    for (ncclComm_t c : p2p_)
      if (c)
        all.push_back(c);
    if (world_)
      all.push_back(world_);
    return all;
  }

  /// Aborts every communicator once; with `publish`, tells the other ranks.
  void abortAll(const std::string &reason, bool publish) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!aborted_.empty())
        return;
      aborted_ = reason;
    }
    if (publish)
      store_->publishAbort(reason);
    // ncclCommAbort stops kernels still waiting for a peer: nothing hangs.
    for (ncclComm_t c : comms())
      ncclCommAbort(c);
    std::lock_guard<std::mutex> lock(mutex_);
    groups_.clear();
    p2p_[0] = p2p_[1] = world_ = nullptr;
    changed_.notify_all();
  }

  /// Every 10 ms: another rank's abort, NCCL's asynchronous errors, calls
  /// in flight past the timeout.
  void watch() {
    cudaSetDevice(ordinal_);
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_ && aborted_.empty()) {
      changed_.wait_for(lock, std::chrono::milliseconds(10));
      if (stopping_ || !aborted_.empty())
        break;
      std::string failure;
      for (auto it = inFlight_.begin(); it != inFlight_.end();) {
        cudaError_t state = cudaEventQuery(it->done);
        if (state == cudaSuccess) {
          cudaEventDestroy(it->done);
          it = inFlight_.erase(it);
          continue;
        }
        if (Clock::now() > it->deadline && failure.empty())
          failure = "rank " + std::to_string(rank_) + ": " + it->what +
                    ": timed out after " +
                    std::to_string(options_.timeout.count()) + " ms";
        ++it;
      }
      std::vector<ncclComm_t> all;
      for (auto &entry : groups_)
        all.push_back(entry.second);
      for (ncclComm_t c : p2p_)
        if (c)
          all.push_back(c);
      if (world_)
        all.push_back(world_);
      for (ncclComm_t c : all) {
        ncclResult_t async = ncclSuccess;
        if (failure.empty() && ncclCommGetAsyncError(c, &async) == ncclSuccess &&
            async != ncclSuccess && async != ncclInProgress)
          failure = "rank " + std::to_string(rank_) + ": NCCL error: " +
                    ncclGetErrorString(async);
      }
      lock.unlock();
      bool publish = true;
      if (failure.empty())
        if (std::optional<std::string> peer = store_->abortReason()) {
          failure = *peer;
          publish = false; // it is the peer's
        }
      if (!failure.empty())
        abortAll(failure, publish);
      lock.lock();
    }
    for (InFlight &f : inFlight_)
      cudaEventDestroy(f.done);
    inFlight_.clear();
  }

  Mesh mesh_;
  int64_t rank_;
  NcclOptions options_;
  std::shared_ptr<Device> device_;
  /// Shared by a process's communicators (ProcessGroup), else this rank's.
  std::shared_ptr<RendezvousStore> store_;
  ncclComm_t world_ = nullptr;
  ncclComm_t p2p_[2] = {nullptr, nullptr};
  std::map<Axes, ncclComm_t> groups_; // mutex_
  Stream sendStream_;
  int ordinal_ = 0;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool stopping_ = false;
  std::string aborted_; // mutex_
  std::deque<InFlight> inFlight_; // mutex_
  std::deque<std::unique_ptr<PendingSend>> sends_; // mutex_
  std::map<std::thread::id, DeviceBuffer> scratch_; // mutex_
  std::thread watchdog_;
};

} // namespace

std::unique_ptr<Communicator> createNcclCommunicator(Mesh mesh, int64_t rank,
                                                     NcclOptions options) {
  if (rank < 0 || rank >= mesh.numRanks())
    throw std::invalid_argument("rank " + std::to_string(rank) +
                                " is outside the mesh");
  auto store = std::make_shared<RendezvousStore>(
      rank, options.storePath, options.storeAddress, options.timeout);
  return createNcclCommunicator(std::move(mesh), rank, std::move(store),
                                std::move(options));
}

std::unique_ptr<Communicator>
createNcclCommunicator(Mesh mesh, int64_t rank,
                       std::shared_ptr<RendezvousStore> store,
                       NcclOptions options) {
  if (rank < 0 || rank >= mesh.numRanks())
    throw std::invalid_argument("rank " + std::to_string(rank) +
                                " is outside the mesh");
  return std::make_unique<NcclCommunicator>(std::move(mesh), rank,
                                            std::move(store),
                                            std::move(options));
}

} // namespace ernie::runtime

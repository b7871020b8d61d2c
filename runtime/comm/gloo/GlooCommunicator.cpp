//===- GlooCommunicator.cpp - one process per rank over TCP ------------------===//

#include "ernie/runtime/GlooCommunicator.h"

#include "RendezvousStore.h"
#include "TcpStore.h"

#include <gloo/allgather.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

namespace ernie::runtime {

namespace {

using Ctx = std::shared_ptr<gloo::Context>;

/// The slot prefix of permutes on a group's context: Gloo's collectives use
/// 0x01-0x08 (gloo/types.h), and point-to-point send/recv have contexts of
/// their own, so permute slots (this prefix, a per-group sequence number)
/// meet no other traffic.
constexpr uint8_t kPermuteSlotPrefix = 0x45;

class GlooCommunicator final : public Communicator {
public:
  GlooCommunicator(Mesh mesh, int64_t rank,
                   std::shared_ptr<RendezvousStore> store, GlooOptions options)
      : mesh_(std::move(mesh)), rank_(rank), options_(std::move(options)),
        store_(std::move(store)) {
    gloo::transport::tcp::attr attr;
    attr.hostname = options_.hostname;
    device_ = gloo::transport::tcp::CreateDevice(attr);
  }

  /// Rank 0 keeps its store server up until the peers have closed their
  /// connections (their communicators are gone) or the timeout passes: a
  /// peer may still be reading rank 0's keys for a context rank 0 has
  /// already finished making.
  ~GlooCommunicator() override {
    finishStarted();
    finishSends();
    // After an abort, close every pair now, not after the wait below: a
    // peer waiting inside Gloo for this rank wakes at once.
    bool aborted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      aborted = !aborted_.empty();
    }
    if (aborted)
      channels_.clear();
    // ~RendezvousStore: rank 0 serves the TCP store until the peers leave.
  }

  int64_t rank() const override { return rank_; }
  const Mesh &mesh() const override { return mesh_; }

  /// A reduce-scatter then an all-gather, as the thread engine does it:
  /// member i reduces slice i (elements [count i / n, count (i + 1) / n))
  /// of every member's input in group order, so each member receives and
  /// sends 2 (n - 1) / n of the data rather than every input, and the
  /// bits are the thread engine's. Slices travel padded to the largest.
  void allReduce(const void *in, void *out, size_t count, DType type,
                 ReduceOp op, const Axes &axes) override {
    run("all_reduce", axes, [&](const Ctx &ctx) {
      const size_t elem = byteSize(type), n = ctx->size, me = ctx->rank;
      auto lo = [&](size_t i) { return count * i / n; };
      const size_t slice = (count + n - 1) / n * elem;
      char *sent = scratch(ctx, 3 * slice * n + slice), *got = sent + slice * n,
           *all = got + slice * n, *mine = all + slice * n;
      for (size_t i = 0; i < n; ++i)
        std::memcpy(sent + i * slice,
                    static_cast<const char *>(in) + lo(i) * elem,
                    (lo(i + 1) - lo(i)) * elem);
      exchange(ctx, sent, got, slice);
      reduceInOrder(pieces(got, slice, n), mine, lo(me + 1) - lo(me), type,
                    op);
      gather(ctx, mine, all, slice);
      for (size_t i = 0; i < n; ++i)
        std::memcpy(static_cast<char *>(out) + lo(i) * elem, all + i * slice,
                    (lo(i + 1) - lo(i)) * elem);
    });
  }

  void allGather(const void *in, void *out, size_t bytes,
                 const Axes &axes) override {
    run("all_gather", axes,
        [&](const Ctx &ctx) { gather(ctx, in, out, bytes); });
  }

  void reduceScatter(const void *in, void *out, size_t count, DType type,
                     ReduceOp op, const Axes &axes) override {
    run("reduce_scatter", axes, [&](const Ctx &ctx) {
      size_t bytes = count * byteSize(type);
      char *mine = scratch(ctx, bytes * ctx->size);
      exchange(ctx, in, mine, bytes);
      reduceInOrder(pieces(mine, bytes, ctx->size), out, count, type, op);
    });
  }

  void allToAll(const void *in, void *out, size_t bytes,
                const Axes &axes) override {
    run("all_to_all", axes,
        [&](const Ctx &ctx) { exchange(ctx, in, out, bytes); });
  }

  void broadcast(void *data, size_t bytes, int64_t rootIndex,
                 const Axes &axes) override {
    run("broadcast", axes, [&](const Ctx &ctx) {
      if (rootIndex < 0 || rootIndex >= ctx->size)
        throw CommunicationError("broadcast root out of range");
      gloo::BroadcastOptions opts(ctx);
      opts.setOutput(static_cast<char *>(data), bytes);
      opts.setRoot(static_cast<int>(rootIndex));
      opts.setTimeout(options_.timeout);
      gloo::broadcast(opts);
    });
  }

  void barrier(const Axes &axes) override {
    // Everything sent before the barrier has arrived after it.
    waitForSends("rank " + std::to_string(rank_) + ": barrier over " +
                 describeAxes(axes));
    run("barrier", axes, [&](const Ctx &ctx) {
      gloo::BarrierOptions opts(ctx);
      opts.setTimeout(options_.timeout);
      gloo::barrier(opts);
    });
  }

  /// The receive and the send are both posted before either is waited for:
  /// a send on an unbound buffer waits for its receiver, so send-then-recv
  /// around a ring would deadlock.
  void permute(const void *in, void *out, size_t bytes, int64_t shift,
               const Axes &axes) override {
    std::vector<int64_t> members = mesh_.group(rank_, axes);
    int64_t n = members.size(), me = mesh_.indexInGroup(rank_, axes);
    if (shiftedIndex(0, shift, n) == 0) {
      if (in != out)
        std::memmove(out, in, bytes);
      return;
    }
    if (bytes == 0)
      return;
    uint64_t slot = gloo::Slot::build(kPermuteSlotPrefix, nextPermute(members));
    int to = static_cast<int>(shiftedIndex(me, shift % n, n));
    int from = static_cast<int>(shiftedIndex(me, -(shift % n), n));
    // The receive lands while the send may still read: overlapping buffers
    // send from a copy.
    const char *src = static_cast<const char *>(in);
    char *dst = static_cast<char *>(out);
    std::vector<char> copy;
    if (src < dst + bytes && dst < src + bytes) {
      copy.assign(src, src + bytes);
      src = copy.data();
    }
    run("permute", axes, [&](const Ctx &ctx) {
      auto recvBuf = ctx->createUnboundBuffer(dst, bytes);
      auto sendBuf = ctx->createUnboundBuffer(const_cast<char *>(src), bytes);
      recvBuf->recv(from, slot);
      sendBuf->send(to, slot);
      if (!recvBuf->waitRecv(nullptr, options_.timeout))
        throw CommunicationError("the receive from group member " +
                                 std::to_string(from) + " did not complete");
      if (!sendBuf->waitSend(nullptr, options_.timeout))
        throw CommunicationError("the send to group member " +
                                 std::to_string(to) + " did not complete");
    });
  }

  /// Eager: the data is copied, the send posted on the copy, and the call
  /// returns; the sender thread waits for it to complete (a Gloo send on
  /// an unbound buffer completes when its receiver has taken it). A
  /// failure surfaces at this rank's next send, receive or barrier.
  void send(const void *data, size_t bytes, int64_t peer,
            int64_t tag) override {
    std::string what = "rank " + std::to_string(rank_) + ": send to rank " +
                       std::to_string(peer) + " (tag " + std::to_string(tag) +
                       ")";
    throwIfSendFailed(what);
    if (bytes == 0) { // The receive takes nothing either.
      pointToPoint("send", peer, tag, [](const Ctx &, int) {});
      return;
    }
    auto pending = std::make_unique<PendingSend>();
    pending->what = what;
    pending->data.assign(static_cast<const char *>(data),
                         static_cast<const char *>(data) + bytes);
    pointToPoint("send", peer, tag, [&](const Ctx &ctx, int other) {
      pending->buffer = ctx->createUnboundBuffer(pending->data.data(), bytes);
      pending->buffer->send(other, static_cast<uint64_t>(tag));
    });
    std::lock_guard<std::mutex> lock(sendMutex_);
    if (!sender_.joinable())
      sender_ = std::thread([this] { completeSends(); });
    sends_.push_back(std::move(pending));
    sendsChanged_.notify_all();
  }

  void recv(void *data, size_t bytes, int64_t peer, int64_t tag) override {
    throwIfSendFailed("rank " + std::to_string(rank_) + ": recv from rank " +
                      std::to_string(peer) + " (tag " + std::to_string(tag) +
                      ")");
    if (bytes == 0) {
      pointToPoint("recv", peer, tag, [](const Ctx &, int) {});
      return;
    }
    pointToPoint("recv", peer, tag, [&](const Ctx &ctx, int other) {
      auto buf = ctx->createUnboundBuffer(data, bytes);
      buf->recv(other, static_cast<uint64_t>(tag));
      if (!buf->waitRecv(nullptr, options_.timeout))
        throw CommunicationError("recv did not complete");
    });
  }

  /// Fails this rank's later calls and publishes the reason in the store
  /// (a file in the directory, or a key on the TCP store), where every
  /// peer's next call finds it. (Calls already waiting inside Gloo still
  /// wait out their timeout.)
  void abort(const std::string &reason) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_.empty())
      return;
    aborted_ = "rank " + std::to_string(rank_) + ": " + reason;
    abortSends();
    store_->publishAbort(aborted_);
  }

private:
  /// A posted send and the copy it reads (the buffer goes first: Gloo
  /// holds only a weak reference to it).
  struct PendingSend {
    std::vector<char> data;
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
    std::string what;
  };

  /// The sender thread: waits for each posted send in order (each within
  /// the timeout) and frees it. After an abort it stops waiting: the
  /// receivers are not coming.
  void completeSends() {
    std::unique_lock<std::mutex> lock(sendMutex_);
    for (;;) {
      sendsChanged_.wait(lock, [&] { return stopSender_ || !sends_.empty(); });
      if (sends_.empty())
        return;
      PendingSend &front = *sends_.front();
      bool skip = sendsAborted_;
      waiting_ = &front;
      lock.unlock();
      std::string error;
      if (!skip) {
        try {
          if (!front.buffer->waitSend(nullptr, options_.timeout))
            error = "aborted";
        } catch (const std::exception &e) {
          error = e.what();
        }
      }
      lock.lock();
      waiting_ = nullptr;
      if (!error.empty() && sendError_.empty() && !sendsAborted_)
        sendError_ = front.what + ": " + error;
      sends_.pop_front();
      sendsChanged_.notify_all();
    }
  }

  /// Under mutex_ (abort): the sender thread gives up on every send.
  void abortSends() {
    std::lock_guard<std::mutex> lock(sendMutex_);
    sendsAborted_ = true;
    if (waiting_)
      waiting_->buffer->abortWaitSend();
    sendsChanged_.notify_all();
  }

  void throwIfSendFailed(const std::string &what) {
    std::lock_guard<std::mutex> lock(sendMutex_);
    if (!sendError_.empty())
      throw CommunicationError(what + ": an earlier send failed: " +
                               sendError_);
  }

  /// Blocks until every posted send has completed (or failed: then throws).
  void waitForSends(const std::string &what) {
    {
      std::unique_lock<std::mutex> lock(sendMutex_);
      sendsChanged_.wait(lock, [&] { return sends_.empty(); });
    }
    throwIfSendFailed(what);
  }

  /// The destructor's: the posted sends complete (or time out, or are
  /// given up after an abort) before the contexts go.
  void finishSends() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      try {
        probeAborted();
      } catch (const std::exception &) {
        // Finishing the sends matters more than a failed probe.
      }
    }
    {
      std::lock_guard<std::mutex> lock(sendMutex_);
      stopSender_ = true;
      sendsChanged_.notify_all();
    }
    if (sender_.joinable())
      sender_.join();
  }

  /// Pointers to the `n` consecutive `bytes`-long pieces at `all`.
  static std::vector<const void *> pieces(const char *all, size_t bytes,
                                          size_t n) {
    std::vector<const void *> out;
    for (size_t i = 0; i < n; ++i)
      out.push_back(all + i * bytes);
    return out;
  }

  /// Scratch memory of at least `bytes` for a collective on `ctx`, kept
  /// between calls: a fresh buffer per collective spent more time in page
  /// faults than on the wire (the 64 MiB all-reduce took 4x its
  /// transfers). One per group's context, used under that group's lock.
  char *scratch(const Ctx &ctx, size_t bytes) {
    std::vector<char> *buffer;
    {
      std::lock_guard<std::mutex> lock(contextMutex_);
      buffer = &scratch_[ctx.get()];
    }
    if (buffer->size() < bytes)
      buffer->resize(bytes);
    return buffer->data();
  }

  void gather(const Ctx &ctx, const void *in, void *out, size_t bytes) {
    gloo::AllgatherOptions opts(ctx);
    opts.setInput(const_cast<char *>(static_cast<const char *>(in)), bytes);
    opts.setOutput(static_cast<char *>(out), bytes * ctx->size);
    opts.setTimeout(options_.timeout);
    gloo::allgather(opts);
  }

  void exchange(const Ctx &ctx, const void *in, void *out, size_t bytes) {
    gloo::AlltoallOptions opts(ctx);
    opts.setInput(const_cast<char *>(static_cast<const char *>(in)),
                  bytes * ctx->size);
    opts.setOutput(static_cast<char *>(out), bytes * ctx->size);
    opts.setTimeout(options_.timeout);
    gloo::alltoall(opts);
  }

  /// A Gloo context and the lock that runs one operation on it at a time.
  /// Each group (and each point-to-point pair) has its own, so a rank can
  /// wait in one group while its communication thread works in another.
  struct Channel {
    std::mutex mutex;
    std::shared_ptr<gloo::Context> context;
  };

  /// Runs `body` on the context of `members` (this rank included), made on
  /// first use; `prefix` keeps point-to-point pairs apart from 2-rank groups.
  template <typename Fn>
  void withContext(const std::string &prefix,
                   const std::vector<int64_t> &members, Fn body) {
    std::string key = prefix;
    for (int64_t r : members)
      key += "." + std::to_string(r);
    Channel *channel;
    {
      std::lock_guard<std::mutex> lock(contextMutex_);
      std::unique_ptr<Channel> &slot = channels_[key];
      if (!slot)
        slot = std::make_unique<Channel>();
      channel = slot.get();
    }
    std::lock_guard<std::mutex> lock(channel->mutex);
    if (!channel->context) {
      int me = 0;
      while (members[me] != rank_)
        ++me;
      auto ctx = std::make_shared<gloo::rendezvous::Context>(
          me, static_cast<int>(members.size()));
      ctx->setTimeout(options_.timeout);
      gloo::rendezvous::PrefixStore prefixed(key, store());
      ctx->connectFullMesh(prefixed, device_);
      channel->context = ctx;
    }
    body(channel->context);
  }

  template <typename Fn>
  void run(const char *kind, const Axes &axes, Fn body) {
    std::string what = "rank " + std::to_string(rank_) + ": " + kind +
                       " over " + describeAxes(axes);
    checkAborted(what);
    try {
      withContext("g", mesh_.group(rank_, axes), body);
    } catch (const CommunicationError &) {
      throw;
    } catch (const std::exception &e) {
      throw CommunicationError(what + ": " + e.what());
    }
  }

  template <typename Fn>
  void pointToPoint(const char *kind, int64_t peer, int64_t tag, Fn body) {
    std::string what = "rank " + std::to_string(rank_) + ": " + kind +
                       " with rank " + std::to_string(peer) + " (tag " +
                       std::to_string(tag) + ")";
    checkAborted(what);
    if (peer < 0 || peer >= mesh_.numRanks() || peer == rank_)
      throw CommunicationError(what + ": invalid peer");
    try {
      std::vector<int64_t> pair{std::min(rank_, peer), std::max(rank_, peer)};
      int other = rank_ < peer ? 1 : 0;
      withContext("p", pair, [&](const Ctx &ctx) { body(ctx, other); });
    } catch (const CommunicationError &e) {
      throw CommunicationError(what + ": " + e.what());
    } catch (const std::exception &e) {
      throw CommunicationError(what + ": " + e.what());
    }
  }

  /// The tag of the next permute over `members`: every member numbers the
  /// group's permutes in the same (program) order.
  uint32_t nextPermute(const std::vector<int64_t> &members) {
    std::lock_guard<std::mutex> lock(contextMutex_);
    return permutes_[members]++;
  }

  gloo::rendezvous::Store &store() { return store_->store(); }

  /// Per call: one file probe (file store) or one non-blocking poll() on the
  /// TCP store's watch connection; small beside a collective either way.
  void checkAborted(const std::string &what) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (probeAborted())
      throw CommunicationError(what + ": aborted: " + aborted_);
  }

  /// Under mutex_: whether this rank or a peer aborted. A peer's abort,
  /// seen first here, also gives up this rank's posted sends.
  bool probeAborted() {
    if (!aborted_.empty())
      return true;
    if (std::optional<std::string> reason = store_->abortReason())
      aborted_ = *reason;
    if (aborted_.empty())
      return false;
    abortSends();
    return true;
  }

  Mesh mesh_;
  int64_t rank_;
  GlooOptions options_;
  /// Shared by the ranks of one process (ProcessGroup), else this rank's.
  std::shared_ptr<RendezvousStore> store_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::map<std::string, std::unique_ptr<Channel>> channels_; // contextMutex_
  std::map<std::vector<int64_t>, uint32_t> permutes_;        // contextMutex_
  // Per group context (contextMutex_ to find; its group's lock to use).
  std::map<const gloo::Context *, std::vector<char>> scratch_;
  std::mutex contextMutex_, mutex_;
  std::string aborted_;
  // Eager sends (send()): posted, waited for by sender_.
  std::mutex sendMutex_;
  std::condition_variable sendsChanged_;
  std::deque<std::unique_ptr<PendingSend>> sends_;
  PendingSend *waiting_ = nullptr; // the one sender_ waits for
  std::string sendError_;
  bool sendsAborted_ = false, stopSender_ = false;
  std::thread sender_;
};

} // namespace

std::unique_ptr<Communicator> createGlooCommunicator(Mesh mesh, int64_t rank,
                                                     GlooOptions options) {
  if (rank < 0 || rank >= mesh.numRanks())
    throw std::invalid_argument("rank " + std::to_string(rank) +
                                " is outside the mesh");
  if (options.storePath.empty() == options.storeAddress.empty())
    throw std::invalid_argument(
        "the Gloo communicator needs exactly one store: storePath (a "
        "directory every rank shares) or storeAddress (rank 0's host:port)");
  if (!options.storeAddress.empty())
    parseStoreAddress(options.storeAddress); // a bad address: invalid_argument
  auto store = std::make_shared<RendezvousStore>(
      rank, options.storePath, options.storeAddress, options.timeout);
  return createGlooCommunicator(std::move(mesh), rank, std::move(store),
                                std::move(options));
}

std::unique_ptr<Communicator>
createGlooCommunicator(Mesh mesh, int64_t rank,
                       std::shared_ptr<RendezvousStore> store,
                       GlooOptions options) {
  if (rank < 0 || rank >= mesh.numRanks())
    throw std::invalid_argument("rank " + std::to_string(rank) +
                                " is outside the mesh");
  return std::make_unique<GlooCommunicator>(std::move(mesh), rank,
                                            std::move(store),
                                            std::move(options));
}

} // namespace ernie::runtime

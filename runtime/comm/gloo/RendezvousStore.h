//===- RendezvousStore.h - the multi-process engines' shared store -*- C++ -*-===//
//
// How ranks in separate processes find each other, for Gloo and NCCL alike:
// exactly one of a directory every rank reaches (Gloo's file store, made
// safe for a rank's threads) or a TCP store rank 0 serves at its own
// host:port (TcpStore.h). Besides the engines' own keys it carries two
// things: a value rank 0 makes and every rank reads (NCCL's ncclUniqueId,
// as PyTorch passes it through its store), and aborts — a failing rank
// publishes its reason, and every rank's next probe sees it.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_COMM_GLOO_RENDEZVOUSSTORE_H
#define ERNIE_RUNTIME_COMM_GLOO_RENDEZVOUSSTORE_H

#include "ernie/runtime/GlooCommunicator.h"

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ernie::runtime {

class TcpStore;
class TcpStoreServer;
class ThreadSafeFileStore;

class RendezvousStore {
public:
  /// Exactly one of `storePath` (a directory shared by every rank, fresh for
  /// each run) and `storeAddress` ("host:port" of rank 0, which serves it;
  /// the others connect, retrying until `timeout`). std::invalid_argument
  /// for neither, both, or a bad address; CommunicationError (naming the
  /// rank) when the TCP store cannot be served or reached.
  RendezvousStore(int64_t rank, const std::string &storePath,
                  const std::string &storeAddress,
                  std::chrono::milliseconds timeout);
  /// Rank 0 keeps its server until the peers have closed their
  /// connections (at most the timeout): a peer may still be reading keys.
  ~RendezvousStore();
  RendezvousStore(const RendezvousStore &) = delete;
  RendezvousStore &operator=(const RendezvousStore &) = delete;

  gloo::rendezvous::Store &store();
  bool tcp() const { return tcp_ != nullptr; }

  /// Rank 0 sets `key` to `make()`; every rank (rank 0 too) returns the
  /// value, waiting up to the timeout for it. std::runtime_error naming
  /// the key when it never comes.
  std::vector<char> exchange(const std::string &key,
                             const std::function<std::vector<char>()> &make);

  /// Publishes `reason` as the run's abort, best effort (the server may be
  /// gone): a file in the directory, or a key the TCP server pushes to
  /// every rank's watch connection.
  void publishAbort(const std::string &reason);
  /// A published abort's reason, if any: one file probe, or one
  /// non-blocking poll() on the watch connection.
  std::optional<std::string> abortReason();

private:
  int64_t rank_;
  std::string path_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<ThreadSafeFileStore> file_;
  std::unique_ptr<TcpStoreServer> server_; // rank 0; outlives the client
  std::unique_ptr<TcpStore> tcp_;
};

/// A Gloo communicator of `rank` that rendezvouses through `store`, which
/// it shares: the ranks of one process of a job share their process's
/// store (ProcessGroup.h). `options`' store fields are ignored.
std::unique_ptr<Communicator>
createGlooCommunicator(Mesh mesh, int64_t rank,
                       std::shared_ptr<RendezvousStore> store,
                       GlooOptions options);

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_COMM_GLOO_RENDEZVOUSSTORE_H

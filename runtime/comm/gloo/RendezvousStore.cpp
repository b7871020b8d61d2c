//===- RendezvousStore.cpp - the multi-process engines' shared store ---------===//

#include "RendezvousStore.h"

#include "TcpStore.h"

#include "ernie/runtime/Communicator.h"

#include <gloo/rendezvous/file_store.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace ernie::runtime {

namespace {
/// The key (TCP store) or file name (file store) an abort is published as.
constexpr const char *kAbortKey = "ernie.abort";
} // namespace

/// Gloo's file store, safe to share between a rank's threads. Its set()
/// appends each key's path to an unguarded member vector, so a started
/// operation making its context while the rank's main thread made another
/// corrupted the heap. Each call holds a lock (get and the polls too, as
/// the class promises nothing about them); a wait holds it per poll only,
/// since the key it waits for may be published only after this rank's
/// other thread has set its own. The lock is recursive: FileStore::get
/// waits (virtually, so here) under it. A zero timeout waits for ever.
class ThreadSafeFileStore final : public gloo::rendezvous::FileStore {
public:
  using FileStore::FileStore;

  void set(const std::string &key, const std::vector<char> &data) override {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    FileStore::set(key, data);
  }

  std::vector<char> get(const std::string &key) override {
    wait({key});
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    return FileStore::get(key);
  }

  void wait(const std::vector<std::string> &keys) override {
    wait(keys, kDefaultTimeout);
  }

  void wait(const std::vector<std::string> &keys,
            const std::chrono::milliseconds &timeout) override {
    // Elapsed time against the timeout: no deadline arithmetic to overflow.
    auto start = std::chrono::steady_clock::now();
    while (true) {
      {
        std::lock_guard<std::recursive_mutex> lock(mutex_);
        if (check(keys))
          return;
      }
      if (timeout.count() > 0 &&
          std::chrono::steady_clock::now() - start >= timeout)
        throw std::runtime_error("file store: timed out after " +
                                 std::to_string(timeout.count()) +
                                 " ms waiting for " + describe(keys));
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

private:
  static std::string describe(const std::vector<std::string> &keys) {
    std::string names;
    for (const std::string &key : keys)
      names += (names.empty() ? "\"" : ", \"") + key + "\"";
    return names;
  }

  std::recursive_mutex mutex_;
};

RendezvousStore::RendezvousStore(int64_t rank, const std::string &storePath,
                                 const std::string &storeAddress,
                                 std::chrono::milliseconds timeout)
    : rank_(rank), path_(storePath), timeout_(timeout) {
  if (storePath.empty() == storeAddress.empty())
    throw std::invalid_argument(
        "a rendezvous needs exactly one store: a directory every rank "
        "shares, or rank 0's host:port");
  if (!storePath.empty()) {
    file_ = std::make_unique<ThreadSafeFileStore>(storePath);
    return;
  }
  StoreAddress address = parseStoreAddress(storeAddress);
  try {
    if (rank_ == 0)
      server_ = std::make_unique<TcpStoreServer>(address);
    tcp_ = std::make_unique<TcpStore>(address, timeout_, kAbortKey);
  } catch (const std::exception &e) {
    throw CommunicationError("rank " + std::to_string(rank_) + ": " + e.what());
  }
}

RendezvousStore::~RendezvousStore() {
  tcp_.reset(); // Our own connections must not count as a peer's.
  if (server_)
    server_->waitUntilClientsLeave(timeout_);
}

gloo::rendezvous::Store &RendezvousStore::store() {
  if (tcp_)
    return *tcp_;
  return *file_;
}

std::vector<char> RendezvousStore::exchange(
    const std::string &key, const std::function<std::vector<char>()> &make) {
  if (rank_ == 0)
    store().set(key, make());
  try {
    store().wait({key}, timeout_);
    return store().get(key);
  } catch (const std::exception &e) {
    throw std::runtime_error("rank " + std::to_string(rank_) +
                             ": waiting for rank 0's '" + key + "': " +
                             e.what());
  }
}

void RendezvousStore::publishAbort(const std::string &reason) {
  if (tcp_) {
    try {
      tcp_->publish(kAbortKey, reason);
    } catch (const std::exception &) {
      // The local abort stands even if rank 0's server is gone.
    }
    return;
  }
  const std::string path = path_ + "/" + kAbortKey;
  std::string tmp = path + "." + std::to_string(rank_);
  {
    std::ofstream file(tmp, std::ios::trunc);
    file << reason;
  }
  std::error_code ignored; // The local abort stands even if this fails.
  std::filesystem::rename(tmp, path, ignored);
}

std::optional<std::string> RendezvousStore::abortReason() {
  if (tcp_) {
    if (std::optional<std::string> reason = tcp_->watched())
      return reason->empty() ? "a peer aborted" : *reason;
    return std::nullopt;
  }
  std::ifstream file(path_ + "/" + kAbortKey);
  if (!file)
    return std::nullopt;
  std::string reason;
  std::getline(file, reason);
  return reason.empty() ? "a peer aborted" : reason;
}

} // namespace ernie::runtime

//===- TcpStore.h - Gloo rendezvous through rank 0 over TCP ------*- C++ -*-===//
//
// A key-value store for Gloo's rendezvous when ranks share no file system
// (Debian's Gloo has no TCPStore). Rank 0 runs the server, a thread with one
// poll() loop; every rank, rank 0 included, is a client.
//
// Protocol: each message is a 4-byte big-endian length and that many bytes:
// an opcode, then fields (strings as a 4-byte length and the bytes, times as
// 8-byte milliseconds, all big-endian). One request at a time per
// connection, each answered by one reply:
//   'S' key value          -> 'K'              (set; overwrites)
//   'G' timeoutMs key      -> 'V' value | 'T'  (get, waiting for the key)
//   'W' timeoutMs n keys.. -> 'K' | 'T'        (wait for every key)
// The server answers 'T' when the request's own timeout passes, so a client
// never reads a stale reply; if the server says nothing past that (dead or
// hung), the client drops the connection. A malformed message closes the
// connection.
//
// Bounds (TcpStoreLimits): the bytes of keys and values held, the bytes
// buffered for all connections (unparsed input and unsent replies), one
// connection's unsent replies, the number of connections, and how long a
// connection may sit idle or in the middle of a message. A client past any
// of them is dropped, so a flood from one client cannot grow rank 0 without
// bound. A client whose pooled connection was dropped for idleness retries
// on a fresh one (every request is idempotent).
//
// Authentication (optional): with a shared secret (ERNIE_STORE_SECRET, the
// same in every process of the job) the server opens each connection with
// 'C' and a 32-byte random nonce, and serves nothing until the client
// answers 'A' HMAC-SHA256(secret, nonce) ('K' back, or 'X' and the
// connection closed). The secret never crosses the network; a stranger
// without it can neither set keys nor abort the job. The traffic itself is
// not encrypted. Without a secret the store trusts its network.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_COMM_GLOO_TCPSTORE_H
#define ERNIE_RUNTIME_COMM_GLOO_TCPSTORE_H

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace ernie::runtime {

struct StoreAddress {
  std::string host;
  uint16_t port = 0;
  /// "host:port", for messages.
  std::string str() const;
};

/// Parses "host:port" ("[v6addr]:port" too); std::invalid_argument, saying
/// what is wrong, for anything else.
StoreAddress parseStoreAddress(const std::string &text);

/// What the server holds at most; a client past a bound is dropped.
struct TcpStoreLimits {
  /// Keys and values held, in bytes.
  uint64_t storedBytes = uint64_t(256) << 20;
  /// Unparsed input and unsent replies of every connection together.
  uint64_t bufferedBytes = uint64_t(256) << 20;
  /// One connection's unsent replies (a client sends one request at a
  /// time and reads its reply: more is a client that does not read).
  uint64_t pendingReplyBytes = (uint64_t(64) << 20) + 4096;
  size_t connections = 16384;
  /// A connection with no request in flight and nothing sent for this long.
  std::chrono::milliseconds idle = std::chrono::minutes(30);
  /// A message begun but not finished for this long.
  std::chrono::milliseconds partialMessage = std::chrono::seconds(60);
};

/// The shared secret of the environment's ERNIE_STORE_SECRET ("" when unset).
std::string storeSecretFromEnvironment();

/// The server, on rank 0: binds `address` (rank 0's own address) and serves
/// until destroyed. Errors are std::runtime_errors naming the address.
class TcpStoreServer {
public:
  explicit TcpStoreServer(const StoreAddress &address,
                          std::string secret = storeSecretFromEnvironment(),
                          TcpStoreLimits limits = {});
  /// Stops the thread and closes every connection: clients waiting on this
  /// server get an error, not a hang.
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer &) = delete;
  TcpStoreServer &operator=(const TcpStoreServer &) = delete;

  /// Blocks until no client is connected, or `timeout` passes.
  void waitUntilClientsLeave(std::chrono::milliseconds timeout);

private:
  struct State;
  void serve();

  StoreAddress address_;
  std::unique_ptr<State> state_; // Touched by the server thread only.
  int listenFd_ = -1, wakeRead_ = -1, wakeWrite_ = -1;
  std::mutex mutex_;
  std::condition_variable changed_;
  size_t clients_ = 0; // mutex_
  bool running_ = true; // mutex_
  std::thread thread_;
};

/// A client. Safe to use from several threads at once: each request takes a
/// connection of its own from a pool, so one rank's waits in two groups do
/// not queue behind each other (they would deadlock until the timeout when
/// the peers reach those groups in the other order). Errors are
/// std::runtime_errors naming the address.
class TcpStore final : public gloo::rendezvous::Store {
public:
  /// Connects and starts watching `watchKey`, retrying until `timeout`
  /// passes (rank 0 may start after this rank).
  TcpStore(StoreAddress address, std::chrono::milliseconds timeout,
           const std::string &watchKey,
           std::string secret = storeSecretFromEnvironment());
  ~TcpStore() override;

  void set(const std::string &key, const std::vector<char> &data) override;
  /// Waits (at most the timeout) for the key, as Gloo's file store does.
  std::vector<char> get(const std::string &key) override;
  void wait(const std::vector<std::string> &keys) override;
  void wait(const std::vector<std::string> &keys,
            const std::chrono::milliseconds &timeout) override;

  /// Sets `key` without waiting for a server that is not there: one connect
  /// attempt (for aborts, where the server may be gone).
  void publish(const std::string &key, const std::string &value);
  /// The watched key's value once some rank has set it. Costs one
  /// non-blocking poll() on the watch connection, no network traffic: the
  /// server pushes the value when the key is set. Once the server is gone
  /// (rank 0 destroyed its communicator) it stays nullopt.
  std::optional<std::string> watched();

private:
  struct Connection;
  std::unique_ptr<Connection> connect(bool retry);
  /// Answers the server's challenge with the secret; throws if refused.
  void authenticate(Connection &c, std::chrono::steady_clock::time_point deadline);
  /// Sends `request` on a pooled connection and returns the reply body.
  std::string call(const std::string &request,
                   std::chrono::steady_clock::time_point deadline,
                   bool retry);

  StoreAddress address_;
  std::chrono::milliseconds timeout_;
  std::string secret_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<Connection>> idle_; // mutex_
  std::unique_ptr<Connection> watch_;             // mutex_
  std::optional<std::string> watchedValue_;       // mutex_
};

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_COMM_GLOO_TCPSTORE_H

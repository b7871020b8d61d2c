//===- TcpStore.cpp - Gloo rendezvous through rank 0 over TCP ---------------===//

#include "TcpStore.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <map>
#include <stdexcept>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

namespace ernie::runtime {

namespace {

using Clock = std::chrono::steady_clock;

/// Bounds what one message may claim, so garbage on the port cannot make
/// the server allocate gigabytes. Gloo's values are a few hundred bytes per
/// rank.
constexpr uint32_t kMaxMessage = 64u << 20;
/// A request timeout that means "no deadline".
constexpr uint64_t kForever = UINT64_MAX;
/// How long past a request's own timeout the client waits for the server's
/// 'T' before it calls the connection dead.
constexpr std::chrono::milliseconds kReplyGrace(2000);

/// Timeouts this long (~35 years) or longer mean "never": keeps deadline
/// arithmetic from overflowing.
constexpr uint64_t kLongest = uint64_t(1) << 40;

/// The nonce that opens an authenticated connection, and its answer.
constexpr size_t kNonceBytes = 32, kMacBytes = 32;

/// HMAC-SHA256(secret, "ernie-store" + nonce).
std::string authenticator(const std::string &secret, const std::string &nonce) {
  std::string data = "ernie-store" + nonce;
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!::HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
              reinterpret_cast<const unsigned char *>(data.data()), data.size(),
              mac, &len) ||
      len != kMacBytes)
    throw std::runtime_error("TCP store: HMAC-SHA256 failed");
  return std::string(reinterpret_cast<char *>(mac), len);
}

std::string randomNonce() {
  std::string nonce(kNonceBytes, '\0');
  size_t done = 0;
  while (done < nonce.size()) {
    ssize_t n = ::getrandom(&nonce[done], nonce.size() - done, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      throw std::runtime_error("TCP store: no random bytes: " +
                               std::string(std::strerror(errno)));
    done += static_cast<size_t>(n);
  }
  return nonce;
}

/// Now plus `d` plus `grace`, saturating.
Clock::time_point after(std::chrono::milliseconds d,
                        std::chrono::milliseconds grace = {}) {
  if (d.count() >= static_cast<int64_t>(kLongest))
    return Clock::time_point::max();
  return Clock::now() + d + grace;
}

std::string errnoText(int err) { return std::strerror(err); }

/// Milliseconds from now to `deadline`, rounded up (so a poll() that
/// returns early is not retried in a busy loop), for poll().
int pollMillis(Clock::time_point deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline -
                                                           Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, INT_MAX));
}

void putU32(std::string &out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(static_cast<char>((v >> shift) & 0xff));
}
void putU64(std::string &out, uint64_t v) {
  putU32(out, static_cast<uint32_t>(v >> 32));
  putU32(out, static_cast<uint32_t>(v));
}
void putString(std::string &out, const std::string &s) {
  putU32(out, static_cast<uint32_t>(s.size()));
  out += s;
}
/// A message: its length, then `body`.
std::string framed(const std::string &body) {
  std::string out;
  putU32(out, static_cast<uint32_t>(body.size()));
  return out + body;
}

/// Reads the fields of one message; `ok` turns false, for good, at the
/// first field that runs past the end.
struct Reader {
  const std::string &data;
  size_t pos = 0;
  bool ok = true;

  bool has(size_t n) {
    ok = ok && data.size() - pos >= n;
    return ok;
  }
  uint8_t byte() { return has(1) ? static_cast<uint8_t>(data[pos++]) : 0; }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i)
      v = (v << 8) | byte();
    return v;
  }
  uint64_t u64() {
    uint64_t high = u32();
    return (high << 32) | u32();
  }
  std::string str() {
    uint32_t n = u32();
    if (!has(n))
      return {};
    pos += n;
    return data.substr(pos - n, n);
  }
  bool done() const { return ok && pos == data.size(); }
};

uint32_t readU32(const char *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

void closeFd(int &fd) {
  if (fd >= 0)
    ::close(fd);
  fd = -1;
}

void setNoDelay(int fd) {
  int one = 1; // Small request/reply messages: do not wait for Nagle.
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

struct AddrInfo {
  addrinfo *list = nullptr;
  ~AddrInfo() {
    if (list)
      ::freeaddrinfo(list);
  }
};

/// getaddrinfo's error code; 0 on success.
int resolve(const StoreAddress &address, bool passive, AddrInfo &out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  std::string port = std::to_string(address.port);
  return ::getaddrinfo(address.host.c_str(), port.c_str(), &hints, &out.list);
}

} // namespace

std::string storeSecretFromEnvironment() {
  const char *secret = std::getenv("ERNIE_STORE_SECRET");
  return secret ? secret : "";
}

//===----------------------------------------------------------------------===//
// Addresses
//===----------------------------------------------------------------------===//

std::string StoreAddress::str() const {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

StoreAddress parseStoreAddress(const std::string &text) {
  auto bad = [&](const std::string &why) {
    return std::invalid_argument("Gloo store address \"" + text +
                                 "\" is not host:port: " + why);
  };
  size_t colon = text.rfind(':');
  if (colon == std::string::npos)
    throw bad("no port");
  StoreAddress out;
  out.host = text.substr(0, colon);
  if (out.host.size() >= 2 && out.host.front() == '[' && out.host.back() == ']')
    out.host = out.host.substr(1, out.host.size() - 2);
  else if (out.host.find(':') != std::string::npos)
    throw bad("write an IPv6 host in brackets");
  if (out.host.empty())
    throw bad("no host");
  std::string port = text.substr(colon + 1);
  unsigned long value = 0;
  bool digits = !port.empty() && port.size() <= 5 &&
                std::all_of(port.begin(), port.end(),
                            [](char c) { return c >= '0' && c <= '9'; });
  if (digits)
    value = std::stoul(port);
  if (!digits || value == 0 || value > 65535)
    throw bad("port \"" + port + "\" is not a number in 1-65535");
  out.port = static_cast<uint16_t>(value);
  return out;
}

//===----------------------------------------------------------------------===//
// Server
//===----------------------------------------------------------------------===//

struct TcpStoreServer::State {
  struct Client {
    int fd = -1;
    std::string in, out;
    bool dead = false;
    /// With a secret: the nonce sent, until the client proves it knows it.
    bool authenticated = true;
    std::string nonce;
    /// The last complete message or reply; when the input began a message.
    Clock::time_point active = Clock::now(), partialSince = active;
    // The request waiting for keys, if any; later requests on this
    // connection wait behind it so replies keep their order.
    bool waiting = false;
    bool wantsValue = false;
    std::vector<std::string> keys;
    std::optional<Clock::time_point> deadline;
  };
  std::map<std::string, std::string> data;
  std::map<uint64_t, Client> clients;
  uint64_t nextId = 0;
  std::string secret;
  TcpStoreLimits limits;
  /// Bytes of `data`; of every client's `in` and `out`.
  uint64_t stored = 0, buffered = 0;

  void drop(Client &c) {
    if (c.dead)
      return;
    c.dead = true;
    buffered -= c.in.size() + c.out.size();
    // Its memory, not only its bytes: a cleared string keeps its capacity
    // until the connection is erased, and a flood drops one after another.
    std::string().swap(c.in);
    std::string().swap(c.out);
  }

  /// Gives back a buffer's spare capacity once it is mostly consumed: the
  /// bounds count bytes held, and an emptied string keeps its capacity.
  static void release(std::string &buffer) {
    if (buffer.capacity() > 4 * buffer.size() + (64u << 10))
      buffer.shrink_to_fit();
  }

  /// Appends `bytes` to `c.in`, or drops `c` when that passes a bound.
  void received(Client &c, const char *bytes, size_t n) {
    if (c.in.size() + n > size_t(kMaxMessage) + 4 ||
        buffered + n > limits.bufferedBytes) {
      drop(c);
      return;
    }
    if (c.in.empty())
      c.partialSince = Clock::now();
    c.in.append(bytes, n);
    buffered += n;
  }

  bool present(const std::vector<std::string> &keys) const {
    return std::all_of(keys.begin(), keys.end(),
                       [&](const std::string &k) { return data.count(k); });
  }

  void reply(Client &c, const std::string &body) {
    if (c.dead)
      return;
    std::string message = framed(body);
    if (c.out.size() + message.size() > limits.pendingReplyBytes ||
        buffered + message.size() > limits.bufferedBytes) {
      drop(c); // it does not read its replies
      return;
    }
    c.out += message;
    buffered += message.size();
    c.active = Clock::now();
    flush(c);
  }

  /// Writes what the socket takes now; the rest waits for POLLOUT. Writing
  /// at once puts a pushed abort in the peer's socket before the aborting
  /// rank's 'K' goes out.
  void flush(Client &c) {
    while (!c.out.empty() && !c.dead) {
      ssize_t n = ::send(c.fd, c.out.data(), c.out.size(),
                         MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        c.out.erase(0, static_cast<size_t>(n));
        buffered -= static_cast<uint64_t>(n);
        release(c.out);
      } else if (n < 0 && errno == EINTR)
        continue;
      else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return;
      else
        drop(c);
    }
  }

  /// Whether `c` has outstayed an idle or partial-message bound at `now`;
  /// the time it would, else, in `next`.
  bool expired(const Client &c, Clock::time_point now,
               std::optional<Clock::time_point> &next) const {
    if (c.waiting)
      return false; // its request's own deadline governs
    // An unauthenticated connection has the time of one message.
    Clock::time_point limit = c.in.empty() && c.authenticated
                                  ? c.active + limits.idle
                                  : c.partialSince + limits.partialMessage;
    if (now >= limit)
      return true;
    if (!next || limit < *next)
      next = limit;
    return false;
  }

  /// Answers `c`'s waiting request if its keys are there or its time is up.
  void settle(Client &c, Clock::time_point now) {
    if (!c.waiting)
      return;
    if (present(c.keys)) {
      std::string body = c.wantsValue ? "V" : "K";
      if (c.wantsValue)
        putString(body, data.at(c.keys[0]));
      reply(c, body);
    } else if (c.deadline && now >= *c.deadline)
      reply(c, "T");
    else
      return;
    c.waiting = false;
    c.keys.clear();
    process(c);
  }

  /// Handles the complete messages in `c.in`, up to the first that waits.
  void process(Client &c) {
    while (!c.dead && !c.waiting && c.in.size() >= 4) {
      uint32_t size = readU32(c.in.data());
      if (size > kMaxMessage) {
        drop(c);
        return;
      }
      if (c.in.size() - 4 < size)
        return;
      std::string body = c.in.substr(4, size);
      c.in.erase(0, 4 + size);
      buffered -= 4 + size;
      release(c.in);
      c.active = c.partialSince = Clock::now();
      if (!c.authenticated)
        authenticate(c, body);
      else
        handle(c, body);
    }
  }

  /// The first message of a connection when the store has a secret.
  void authenticate(Client &c, const std::string &body) {
    std::string want = authenticator(secret, c.nonce);
    if (body.size() == 1 + kMacBytes && body[0] == 'A' &&
        CRYPTO_memcmp(body.data() + 1, want.data(), kMacBytes) == 0) {
      c.authenticated = true;
      reply(c, "K");
      return;
    }
    reply(c, "X");
    flush(c);
    drop(c);
  }

  void handle(Client &c, const std::string &body) {
    Reader r{body};
    uint8_t op = r.byte();
    if (op == 'S') {
      std::string key = r.str(), value = r.str();
      if (!r.done()) {
        drop(c);
        return;
      }
      auto old = data.find(key);
      uint64_t before = old == data.end() ? 0 : key.size() + old->second.size();
      if (stored - before + key.size() + value.size() > limits.storedBytes) {
        drop(c); // the store is full
        return;
      }
      stored = stored - before + key.size() + value.size();
      data[key] = std::move(value);
      // Waiters first: see flush().
      Clock::time_point now = Clock::now();
      for (auto &[id, other] : clients)
        if (&other != &c)
          settle(other, now);
      reply(c, "K");
      return;
    }
    if (op != 'G' && op != 'W') {
      drop(c);
      return;
    }
    uint64_t timeout = r.u64();
    std::vector<std::string> keys;
    if (op == 'G') {
      keys.push_back(r.str());
    } else {
      uint32_t n = r.u32();
      for (uint32_t i = 0; i < n && r.ok; ++i)
        keys.push_back(r.str());
    }
    if (!r.done()) {
      drop(c);
      return;
    }
    c.waiting = true;
    c.wantsValue = op == 'G';
    c.keys = std::move(keys);
    if (timeout < kLongest)
      c.deadline = Clock::now() + std::chrono::milliseconds(timeout);
    else
      c.deadline.reset();
    settle(c, Clock::now());
  }
};

TcpStoreServer::TcpStoreServer(const StoreAddress &address, std::string secret,
                               TcpStoreLimits limits)
    : address_(address), state_(std::make_unique<State>()) {
  state_->secret = std::move(secret);
  state_->limits = limits;
  std::string where = "TCP store server on " + address_.str();
  AddrInfo found;
  if (int err = resolve(address_, /*passive=*/true, found))
    throw std::runtime_error(where + ": cannot resolve the host: " +
                             ::gai_strerror(err));
  std::string lastError = "no address";
  for (addrinfo *a = found.list; a && listenFd_ < 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                      a->ai_protocol);
    if (fd < 0) {
      lastError = errnoText(errno);
      continue;
    }
    // A restarted rank 0 can take the port back from TIME_WAIT sockets.
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 128) == 0) {
      listenFd_ = fd;
    } else {
      lastError = errnoText(errno);
      ::close(fd);
    }
  }
  if (listenFd_ < 0)
    throw std::runtime_error(where + ": cannot listen (the address must be "
                             "rank 0's own): " + lastError);
  int pipeFds[2];
  if (::pipe2(pipeFds, O_NONBLOCK | O_CLOEXEC) != 0) {
    int err = errno;
    closeFd(listenFd_);
    throw std::runtime_error(where + ": " + errnoText(err));
  }
  wakeRead_ = pipeFds[0];
  wakeWrite_ = pipeFds[1];
  thread_ = std::thread([this] { serve(); });
}

TcpStoreServer::~TcpStoreServer() {
  char byte = 0;
  while (::write(wakeWrite_, &byte, 1) < 0 && errno == EINTR) {
  }
  thread_.join();
  for (auto &[id, client] : state_->clients)
    closeFd(client.fd);
  closeFd(listenFd_);
  closeFd(wakeRead_);
  closeFd(wakeWrite_);
}

void TcpStoreServer::waitUntilClientsLeave(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait_for(lock, timeout, [&] { return clients_ == 0 || !running_; });
}

void TcpStoreServer::serve() {
  State &s = *state_;
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;
  try {
    for (;;) {
      fds.assign({{wakeRead_, POLLIN, 0}, {listenFd_, POLLIN, 0}});
      ids.clear();
      std::optional<Clock::time_point> next;
      Clock::time_point start = Clock::now();
      for (auto &[id, c] : s.clients) {
        s.expired(c, start, next); // only the next deadline, here
        short events = POLLIN;
        if (!c.out.empty())
          events |= POLLOUT;
        fds.push_back({c.fd, events, 0});
        ids.push_back(id);
        if (c.waiting && c.deadline && (!next || *c.deadline < *next))
          next = c.deadline;
      }
      int n = ::poll(fds.data(), fds.size(), next ? pollMillis(*next) : -1);
      if (n < 0 && errno != EINTR)
        break;
      if (n > 0 && fds[0].revents)
        break; // The destructor asks us to stop.
      if (n > 0 && (fds[1].revents & POLLIN)) {
        for (;;) {
          int fd = ::accept4(listenFd_, nullptr, nullptr,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (fd < 0)
            break; // EAGAIN, or a connection that died before we took it.
          if (s.clients.size() >= s.limits.connections) {
            ::close(fd);
            continue;
          }
          setNoDelay(fd);
          State::Client &c = s.clients[s.nextId++];
          c.fd = fd;
          if (!s.secret.empty()) {
            c.authenticated = false;
            c.nonce = randomNonce();
            s.reply(c, "C" + c.nonce);
          }
        }
      }
      for (size_t i = 0; n > 0 && i < ids.size(); ++i) {
        short revents = fds[i + 2].revents;
        State::Client &c = s.clients[ids[i]];
        if (revents & POLLOUT)
          s.flush(c);
        if (revents & (POLLIN | POLLHUP | POLLERR)) {
          char buffer[65536];
          for (;;) {
            ssize_t got = ::recv(c.fd, buffer, sizeof buffer, MSG_DONTWAIT);
            if (got > 0) {
              // More than one message's worth buffered (a client sending
              // past its waiting request, or garbage), or past the bound
              // of all connections' buffers: dropped.
              s.received(c, buffer, static_cast<size_t>(got));
              s.process(c);
              if (c.dead)
                break;
              continue;
            }
            if (got < 0 && errno == EINTR)
              continue;
            if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
              s.drop(c); // The client left (or its connection broke).
            break;
          }
        }
      }
      Clock::time_point now = Clock::now();
      std::optional<Clock::time_point> unused;
      for (auto &[id, c] : s.clients) {
        s.settle(c, now);
        if (s.expired(c, now, unused))
          s.drop(c);
      }
      for (auto it = s.clients.begin(); it != s.clients.end();) {
        if (it->second.dead) {
          closeFd(it->second.fd);
          it = s.clients.erase(it);
        } else {
          ++it;
        }
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        clients_ = s.clients.size();
      }
      changed_.notify_all();
    }
  } catch (...) {
    // Out of memory, most likely. Stop serving; the destructor closes the
    // connections, so clients see an error rather than silence.
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    running_ = false;
  }
  changed_.notify_all();
}

//===----------------------------------------------------------------------===//
// Client
//===----------------------------------------------------------------------===//

/// One connection to the server, non-blocking, every wait bounded.
struct TcpStore::Connection {
  int fd = -1;
  ~Connection() { closeFd(fd); }

  /// Waits for `events` until `deadline`; false if it passed.
  bool ready(short events, Clock::time_point deadline) {
    for (;;) {
      pollfd p{fd, events, 0};
      int n = ::poll(&p, 1, pollMillis(deadline));
      if (n > 0)
        return true; // POLLERR/POLLHUP too: the next read or write says.
      if (n == 0 || errno != EINTR)
        return false;
    }
  }

  /// Writes all of `data`; empty, or what went wrong.
  std::string write(const std::string &data, Clock::time_point deadline) {
    size_t done = 0;
    while (done < data.size()) {
      ssize_t n = ::send(fd, data.data() + done, data.size() - done,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        done += static_cast<size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!ready(POLLOUT, deadline))
          return "timed out sending";
      } else if (!(n < 0 && errno == EINTR)) {
        return "sending: " + errnoText(errno);
      }
    }
    return {};
  }

  /// Reads exactly `size` bytes into `out`; empty, or what went wrong.
  std::string read(std::string &out, size_t size, Clock::time_point deadline) {
    out.resize(size);
    size_t done = 0;
    while (done < size) {
      ssize_t n = ::recv(fd, &out[done], size - done, MSG_DONTWAIT);
      if (n > 0) {
        done += static_cast<size_t>(n);
      } else if (n == 0) {
        return "the server closed the connection (rank 0 gone?)";
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!ready(POLLIN, deadline))
          return "no reply in time";
      } else if (errno != EINTR) {
        return "receiving: " + errnoText(errno);
      }
    }
    return {};
  }

  /// Reads one message's body into `body`; empty, or what went wrong.
  std::string readMessage(std::string &body, Clock::time_point deadline) {
    std::string header;
    std::string error = read(header, 4, deadline);
    if (!error.empty())
      return error;
    uint32_t size = readU32(header.data());
    if (size > kMaxMessage)
      return "malformed reply";
    return read(body, size, deadline);
  }
};

TcpStore::TcpStore(StoreAddress address, std::chrono::milliseconds timeout,
                   const std::string &watchKey, std::string secret)
    : address_(std::move(address)), timeout_(timeout), secret_(std::move(secret)) {
  watch_ = connect(/*retry=*/true);
  std::string request = "G";
  putU64(request, kForever);
  putString(request, watchKey);
  std::string error =
      watch_->write(framed(request), after(timeout_));
  if (!error.empty())
    throw std::runtime_error("TCP store at " + address_.str() + ": " + error);
}

TcpStore::~TcpStore() = default;

std::unique_ptr<TcpStore::Connection> TcpStore::connect(bool retry) {
  std::string where = "TCP store at " + address_.str();
  Clock::time_point deadline = after(timeout_);
  auto backoff = std::chrono::milliseconds(10);
  std::string lastError;
  for (;;) {
    AddrInfo found;
    int err = resolve(address_, /*passive=*/false, found);
    if (err && err != EAI_AGAIN)
      throw std::runtime_error(where + ": cannot resolve the host: " +
                               ::gai_strerror(err));
    if (err)
      lastError = ::gai_strerror(err);
    for (addrinfo *a = found.list; a; a = a->ai_next) {
      auto c = std::make_unique<Connection>();
      c->fd = ::socket(a->ai_family,
                       a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                       a->ai_protocol);
      if (c->fd < 0) {
        lastError = errnoText(errno);
        continue;
      }
      int result = ::connect(c->fd, a->ai_addr, a->ai_addrlen);
      int error = result == 0 ? 0 : errno;
      if (error == EINPROGRESS) {
        if (!c->ready(POLLOUT, deadline)) {
          lastError = "connect timed out";
          continue;
        }
        socklen_t len = sizeof error;
        ::getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &error, &len);
      }
      if (error == 0) {
        setNoDelay(c->fd);
        if (!secret_.empty())
          authenticate(*c, deadline);
        return c;
      }
      lastError = errnoText(error);
    }
    if (!retry || Clock::now() >= deadline)
      break;
    // Rank 0 may not be listening yet: try again until the deadline.
    std::this_thread::sleep_for(
        std::min<Clock::duration>(backoff, deadline - Clock::now()));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
  throw std::runtime_error(
      where + ": cannot connect" +
      (retry ? " within " + std::to_string(timeout_.count()) + " ms" : "") +
      " (is rank 0 running?): " + lastError);
}

void TcpStore::authenticate(Connection &c, Clock::time_point deadline) {
  std::string where = "TCP store at " + address_.str();
  std::string challenge;
  std::string error = c.readMessage(challenge, deadline);
  if (!error.empty() || challenge.size() != 1 + kNonceBytes || challenge[0] != 'C')
    throw std::runtime_error(where + ": the server sent no challenge (" +
                             (error.empty() ? "another reply" : error) +
                             "): ERNIE_STORE_SECRET is set here; is it set "
                             "for rank 0?");
  std::string reply;
  error = c.write(framed("A" + authenticator(secret_, challenge.substr(1))),
                  deadline);
  if (error.empty())
    error = c.readMessage(reply, deadline);
  if (!error.empty() || reply != "K")
    throw std::runtime_error(where + ": refused: this process's "
                             "ERNIE_STORE_SECRET is not rank 0's");
}

std::string TcpStore::call(const std::string &request,
                           Clock::time_point deadline, bool retry) {
  std::unique_ptr<Connection> c;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!idle_.empty()) {
      c = std::move(idle_.back());
      idle_.pop_back();
    }
  }
  const bool pooled = c != nullptr;
  if (!c)
    c = connect(retry);
  std::string reply;
  std::string error = c->write(framed(request), deadline);
  if (error.empty())
    error = c->readMessage(reply, deadline);
  if (!error.empty() && pooled) {
    // The server may have closed a pooled connection for idleness; every
    // request is idempotent, so it is sent again on a fresh one.
    c = connect(retry);
    reply.clear();
    error = c->write(framed(request), deadline);
    if (error.empty())
      error = c->readMessage(reply, deadline);
  }
  // A failed connection is dropped (it may hold a late reply); the next
  // call opens a fresh one.
  if (!error.empty())
    throw std::runtime_error("TCP store at " + address_.str() + ": " + error);
  if (secret_.empty() && reply.size() == 1 + kNonceBytes && reply[0] == 'C')
    throw std::runtime_error("TCP store at " + address_.str() +
                             ": the server asks for a shared secret: set "
                             "ERNIE_STORE_SECRET as for rank 0");
  std::lock_guard<std::mutex> lock(mutex_);
  idle_.push_back(std::move(c));
  return reply;
}

void TcpStore::set(const std::string &key, const std::vector<char> &data) {
  std::string request = "S";
  putString(request, key);
  putString(request, std::string(data.begin(), data.end()));
  if (call(request, after(timeout_), /*retry=*/true) != "K")
    throw std::runtime_error("TCP store at " + address_.str() +
                             ": unexpected reply to set \"" + key + "\"");
}

std::vector<char> TcpStore::get(const std::string &key) {
  std::string request = "G";
  putU64(request, static_cast<uint64_t>(std::max<int64_t>(timeout_.count(), 0)));
  putString(request, key);
  std::string reply =
      call(request, after(timeout_, kReplyGrace), /*retry=*/true);
  std::string where = "TCP store at " + address_.str();
  if (reply == "T")
    throw std::runtime_error(where + ": timed out after " +
                             std::to_string(timeout_.count()) +
                             " ms waiting for key \"" + key + "\"");
  Reader r{reply};
  std::string value;
  if (r.byte() == 'V')
    value = r.str();
  if (!r.done())
    throw std::runtime_error(where + ": malformed reply to get \"" + key +
                             "\"");
  return std::vector<char>(value.begin(), value.end());
}

void TcpStore::wait(const std::vector<std::string> &keys) {
  wait(keys, timeout_);
}

void TcpStore::wait(const std::vector<std::string> &keys,
                    const std::chrono::milliseconds &timeout) {
  std::string request = "W";
  putU64(request, static_cast<uint64_t>(std::max<int64_t>(timeout.count(), 0)));
  putU32(request, static_cast<uint32_t>(keys.size()));
  for (const std::string &key : keys)
    putString(request, key);
  std::string reply =
      call(request, after(timeout, kReplyGrace), /*retry=*/true);
  if (reply == "K")
    return;
  std::string names;
  for (const std::string &key : keys)
    names += (names.empty() ? "\"" : ", \"") + key + "\"";
  throw std::runtime_error(
      "TCP store at " + address_.str() +
      (reply == "T" ? ": timed out after " + std::to_string(timeout.count()) +
                          " ms waiting for keys " + names
                    : ": unexpected reply while waiting for keys " + names));
}

void TcpStore::publish(const std::string &key, const std::string &value) {
  std::string request = "S";
  putString(request, key);
  putString(request, value);
  call(request, after(timeout_), /*retry=*/false);
}

std::optional<std::string> TcpStore::watched() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (watchedValue_ || !watch_)
    return watchedValue_;
  pollfd p{watch_->fd, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0)
    return std::nullopt;
  // Something came: the whole (small) reply is sent at once, so this read
  // does not wait in practice; the timeout bounds it anyway.
  std::string reply;
  std::string error = watch_->readMessage(reply, after(timeout_));
  Reader r{reply};
  if (error.empty() && r.byte() == 'V') {
    std::string value = r.str();
    if (r.done())
      watchedValue_ = std::move(value);
  }
  // Answered, or the server is gone: either way the watch is over.
  watch_.reset();
  return watchedValue_;
}

} // namespace ernie::runtime

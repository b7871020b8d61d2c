//===- TcpStoreTest.cpp - the rendezvous store's bounds and secret --------===//
//
// The TCP store on rank 0 holds up against clients that flood it: 16
// clients sending maximal messages and never reading keep the process under
// a fixed memory bound, and the store goes on serving. With a shared secret
// a client without it is refused.
//
//===----------------------------------------------------------------------===//

#include "comm/gloo/TcpStore.h"
#include "StoreHelpers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <malloc.h>

#include <atomic>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

using namespace ernie::runtime;
using ernie::runtime::testing::freePort;
using ::testing::HasSubstr;

namespace {

/// A raw connection to the loopback port, or -1.
int rawConnect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  struct timeval limit {
    10, 0
  };
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  return fd;
}

std::string u32(uint32_t v) {
  std::string out;
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(static_cast<char>((v >> shift) & 0xff));
  return out;
}

/// Sends all of `data`; false once the server has dropped the connection.
bool sendAll(int fd, const char *data, size_t n) {
  while (n > 0) {
    ssize_t put = ::send(fd, data, n, MSG_NOSIGNAL);
    if (put <= 0)
      return false;
    data += put;
    n -= static_cast<size_t>(put);
  }
  return true;
}

/// The process's peak resident memory since the last reset, in bytes.
uint64_t peakResident() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0)
      return std::stoull(line.substr(6)) * 1024;
  return 0;
}

void resetPeakResident() { std::ofstream("/proc/self/clear_refs") << "5"; }

StoreAddress loopback(int port) {
  return {"127.0.0.1", static_cast<uint16_t>(port)};
}

} // namespace

TEST(TcpStoreLimits, SixteenFloodingClientsKeepRankZeroBounded) {
  int port = freePort();
  TcpStoreLimits limits;
  limits.bufferedBytes = 16u << 20;
  limits.storedBytes = 8u << 20;
  limits.pendingReplyBytes = 1u << 20;
  TcpStoreServer server(loopback(port), "", limits);
  TcpStore store(loopback(port), std::chrono::seconds(20), "watch", "");
  store.set("big", std::vector<char>(512 << 10, 'v'));

  // Buffers of a few MiB come from mmap and go back when freed (glibc
  // otherwise raises its mmap threshold after the first free and keeps
  // freed buffers in the heap): the peak below then measures what the
  // store holds, not when the allocator returns memory.
  mallopt(M_MMAP_THRESHOLD, 256 << 10);
  resetPeakResident();
  uint64_t before = peakResident();
  // Per client: a maximal set (a 64 MiB value), then gets of the 512 KiB
  // value that it never reads, then sets of fresh 4 MiB values. Each is
  // past a bound (one connection's buffer, all connections', the replies
  // it leaves unread, the bytes stored): the server drops it.
  std::atomic<uint64_t> sent{0};
  std::vector<std::thread> clients;
  const std::string chunk(1 << 20, 'x');
  for (int i = 0; i < 16; ++i)
    clients.emplace_back([&, i] {
      int fd = rawConnect(port);
      if (fd < 0)
        return;
      std::string head = u32(1 + 4 + 3 + 4 + (64u << 20) - 64) + "S" + u32(3) +
                         "k" + std::to_string(i % 10) + "x" +
                         u32((64u << 20) - 64);
      bool alive = sendAll(fd, head.data(), head.size());
      for (int k = 0; alive && k < 64; ++k) {
        alive = sendAll(fd, chunk.data(), chunk.size());
        sent += alive ? chunk.size() : 0;
      }
      ::close(fd);
      fd = rawConnect(port);
      std::string get = "G" + std::string(8, '\0') + u32(3) + "big";
      std::string request = u32(get.size()) + get;
      for (int k = 0;
           fd >= 0 && k < 4096 && sendAll(fd, request.data(), request.size());
           ++k)
        sent += request.size();
      ::close(fd);
      fd = rawConnect(port);
      for (int k = 0; fd >= 0 && k < 16; ++k) {
        std::string key = "c" + std::to_string(i) + "-" + std::to_string(k);
        std::string set = "S" + u32(key.size()) + key + u32(4u << 20);
        std::string message = u32(set.size() + (4u << 20)) + set;
        if (!sendAll(fd, message.data(), message.size()))
          break;
        bool ok = true;
        for (int m = 0; ok && m < 4; ++m)
          ok = sendAll(fd, chunk.data(), chunk.size());
        if (!ok)
          break;
        sent += message.size() + (4u << 20);
      }
      if (fd >= 0)
        ::close(fd);
    });
  for (auto &t : clients)
    t.join();
  uint64_t grew = peakResident() - before;
  RecordProperty("grew_bytes", std::to_string(grew));
  // Without the bounds the floods above hold about 1 GiB. With them: the
  // buffers (a string's capacity up to twice its contents, three times
  // while it grows) and the store (its values, and a message's body while
  // it is copied in), and the allocator's and the test threads' own.
  uint64_t bound =
      3 * limits.bufferedBytes + 2 * limits.storedBytes + (64u << 20);
  EXPECT_LT(grew, bound) << "sent " << sent << " bytes";
  EXPECT_GT(sent.load(), uint64_t(64) << 20);
  // The store still serves: the job goes on.
  store.set("after", std::vector<char>{'o', 'k'});
  EXPECT_EQ(store.get("after"), (std::vector<char>{'o', 'k'}));
  EXPECT_EQ(store.get("big").size(), size_t(512 << 10));
}

TEST(TcpStoreLimits, IdleAndHalfSentConnectionsAreClosed) {
  int port = freePort();
  TcpStoreLimits limits;
  limits.idle = std::chrono::milliseconds(300);
  limits.partialMessage = std::chrono::milliseconds(300);
  TcpStoreServer server(loopback(port), "", limits);
  int fd = rawConnect(port);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(sendAll(fd, "\0\0", 2)); // half a length, then nothing
  char byte;
  EXPECT_EQ(::recv(fd, &byte, 1, 0), 0); // closed by the server
  ::close(fd);
  // A client's pooled connection closed for idleness is replaced.
  TcpStore store(loopback(port), std::chrono::seconds(5), "watch", "");
  store.set("a", {'1'});
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  store.set("b", {'2'});
  EXPECT_EQ(store.get("a"), std::vector<char>{'1'});
}

TEST(TcpStoreSecret, AClientWithoutTheSecretIsRefused) {
  int port = freePort();
  TcpStoreServer server(loopback(port), "job-secret");
  TcpStore good(loopback(port), std::chrono::seconds(5), "watch", "job-secret");
  good.set("k", {'v'});
  EXPECT_EQ(good.get("k"), std::vector<char>{'v'});

  auto errorOf = [](const std::function<void()> &f) -> std::string {
    try {
      f();
    } catch (const std::exception &e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_THAT(errorOf([&] {
                TcpStore none(loopback(port), std::chrono::seconds(2), "watch",
                              "");
                none.set("stranger", {'x'});
              }),
              HasSubstr("asks for a shared secret"));
  EXPECT_THAT(errorOf([&] {
                TcpStore wrong(loopback(port), std::chrono::seconds(2), "watch",
                               "guess");
                wrong.set("stranger", {'x'});
              }),
              HasSubstr("is not rank 0's"));
  // A raw request without the handshake sets nothing.
  int fd = rawConnect(port);
  ASSERT_GE(fd, 0);
  std::string set = "S" + u32(8) + "stranger" + u32(1) + "x";
  std::string message = u32(set.size()) + set;
  sendAll(fd, message.data(), message.size());
  char buffer[64];
  while (::recv(fd, buffer, sizeof buffer, 0) > 0) {
  }
  ::close(fd);
  EXPECT_THAT(
      errorOf([&] { good.wait({"stranger"}, std::chrono::milliseconds(200)); }),
      HasSubstr("timed out"));
  // A client with a secret meeting a server without one is told so.
  int open = freePort();
  TcpStoreServer plain(loopback(open), "");
  EXPECT_THAT(errorOf([&] {
                TcpStore s(loopback(open), std::chrono::milliseconds(500), "w",
                           "job-secret");
              }),
              HasSubstr("sent no challenge"));
}

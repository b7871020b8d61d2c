//===- StoreHelpers.h - rendezvous stores for tests -------------*- C++ -*-===//
//
// A fresh store directory per test and a free loopback port for rank 0's
// TCP store: what the Gloo and NCCL rendezvous tests meet through.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_TESTS_STOREHELPERS_H
#define ERNIE_RUNTIME_TESTS_STOREHELPERS_H

#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace ernie::runtime::testing {

/// An empty store directory for one test, removed when the test ends.
class FreshStore {
public:
  explicit FreshStore(const std::string &name)
      : dir_(std::filesystem::temp_directory_path() /
             ("ernie-gloo-" + name + "-" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  FreshStore(const FreshStore &) = delete; // Would remove the directory twice.
  FreshStore &operator=(const FreshStore &) = delete;
  ~FreshStore() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  operator std::string() const { return dir_.string(); }

private:
  std::filesystem::path dir_;
};

/// A loopback port nobody listens on now: the kernel's pick for port 0.
inline int freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr *>(&addr), len) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr *>(&addr), &len) != 0)
    throw std::runtime_error("no free port");
  ::close(fd);
  return ntohs(addr.sin_port);
}

inline std::string freeAddress() { return "127.0.0.1:" + std::to_string(freePort()); }

/// A loopback port someone listens on (for as long as this lives): a store
/// address that is taken.
class Listener {
public:
  Listener() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr *>(&addr), len) != 0 ||
        ::listen(fd_, 1) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr *>(&addr), &len) != 0)
      throw std::runtime_error("cannot listen on loopback");
    port_ = ntohs(addr.sin_port);
  }
  Listener(const Listener &) = delete;
  Listener &operator=(const Listener &) = delete;
  ~Listener() { ::close(fd_); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

private:
  int fd_;
  int port_ = 0;
};

} // namespace ernie::runtime::testing

#endif // ERNIE_RUNTIME_TESTS_STOREHELPERS_H

//===- GlooCommunicatorTest.cpp - the Gloo engine on loopback ---------------===//
//
// Every rank is a thread with its own Gloo device and context over TCP on
// 127.0.0.1, rendezvousing through a temporary directory or through the TCP
// store on a free loopback port: the same checks as the thread engine,
// bitwise the same float sums, and started permutes through the executor.
//
//===----------------------------------------------------------------------===//

#include "CollectiveChecks.h"
#include "ProgramBuilder.h"
#include "StoreHelpers.h"
#include "ernie/runtime/Executor.h"
#include "ernie/runtime/GlooCommunicator.h"
#include "ernie/runtime/HostTensor.h"
#include "ernie/runtime/ThreadCommunicator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <future>
#include <optional>
#include <thread>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

using namespace ernie::runtime;
using namespace ernie::runtime::testing;

namespace {

enum class StoreKind { File, Tcp };

/// The options of one test's ranks: a fresh store directory (removed when
/// the test ends) or a free loopback port for rank 0's TCP store.
class TestStore {
public:
  TestStore(StoreKind kind, const std::string &name) {
    if (kind == StoreKind::File)
      dir_.emplace(name);
    else
      address_ = freeAddress();
  }
  GlooOptions options(std::chrono::milliseconds timeout =
                          std::chrono::seconds(30)) const {
    GlooOptions options;
    if (dir_)
      options.storePath = *dir_;
    else
      options.storeAddress = address_;
    options.timeout = timeout;
    return options;
  }

private:
  std::optional<FreshStore> dir_;
  std::string address_;
};

template <typename Fn>
void onGlooRanks(const Mesh &mesh, const TestStore &store, Fn body) {
  onThreads(mesh.numRanks(), [&](int64_t r) {
    auto comm = createGlooCommunicator(mesh, r, store.options());
    body(*comm);
  });
}

/// The tests that hold for either store.
class GlooCommunicator : public ::testing::TestWithParam<StoreKind> {
protected:
  TestStore store(const std::string &name) const {
    return TestStore(GetParam(), name);
  }
};

// "Gloo/GlooCommunicator.Name/Tcp": the prefix keeps --gtest_filter='Gloo*'
// selecting these.
INSTANTIATE_TEST_SUITE_P(Gloo, GlooCommunicator,
                         ::testing::Values(StoreKind::File, StoreKind::Tcp),
                         [](const auto &info) {
                           return info.param == StoreKind::File ? "File"
                                                                : "Tcp";
                         });

TEST_P(GlooCommunicator, EveryCollectiveOnEveryAxisSubset) {
  for (std::vector<int64_t> sizes : {std::vector<int64_t>{2},
                                     std::vector<int64_t>{2, 2}}) {
    std::vector<std::string> names{"a", "b"};
    names.resize(sizes.size());
    Mesh mesh(names, sizes);
    onGlooRanks(mesh, store("all" + std::to_string(sizes.size())),
                [&](Communicator &comm) {
                  for (const Axes &axes : axisSubsets(mesh)) {
                    SCOPED_TRACE(::testing::Message() << "rank " << comm.rank());
                    checkEveryCollective(comm, mesh, axes);
                  }
                });
  }
}

// Every rank posts its receive before its send, so a ring does not
// deadlock; 4 ranks make the sender and the receiver different peers.
TEST_P(GlooCommunicator, PermutesShiftAroundTheGroup) {
  Mesh mesh({"a", "b"}, {2, 2});
  onGlooRanks(mesh, store("permute"), [&](Communicator &comm) {
    for (const Axes &axes : axisSubsets(mesh))
      checkPermutes(comm, mesh, axes);
  });
}

// Through the executor: a start, a blocking all_gather on the same group
// while the transfer is pending (the executor waits for it first: on one
// context, the two ranks could otherwise meet the two operations in
// different orders), then a second start shifting the piece back.
TEST_P(GlooCommunicator,
       AnExecutorRunsStartsAndWaitsAroundABlockingCollective) {
  ProgramBuilder pb({"sp"}, {4});
  FunctionBuilder &f = pb.function("ring");
  uint32_t x = f.buffer(DType::F64, {2}), r = f.buffer(DType::F64, {2}),
           g = f.buffer(DType::F64, {8}), n = f.buffer(DType::F64, {2}),
           back = f.buffer(DType::F64, {2});
  f.arg(x)
      .op("ernie.collective_permute_start", {x}, {r}, {{"shift", int64_t(1)}},
          {"sp"})
      .op("ernie.all_gather", {x}, {g}, {{"dim", int64_t(0)}}, {"sp"})
      .op("ernie.neg", {x}, {n})
      .op("ernie.wait", {r}, {r})
      .op("ernie.collective_permute_start", {r}, {back},
          {{"shift", int64_t(-1)}}, {"sp"})
      .op("ernie.wait", {back}, {back})
      .ret(r)
      .ret(g)
      .ret(back);
  Program program = pb.parse();
  TestStore where = store("executor");
  onThreads(4, [&](int64_t rank) {
    auto comm = createGlooCommunicator(program.mesh(), rank, where.options());
    Executor executor(program, *comm);
    HostTensor in(DType::F64, {2});
    in.as<double>()[0] = value(rank, 0);
    in.as<double>()[1] = value(rank, 1);
    std::vector<HostTensor> out = executor.run("ring", {in});
    int64_t from = (rank + 3) % 4;
    EXPECT_EQ(out[0].as<double>()[1], value(from, 1)) << "rank " << rank;
    for (int64_t m = 0; m < 4; ++m)
      EXPECT_EQ(out[1].as<double>()[2 * m], value(m, 0)) << "rank " << rank;
    EXPECT_EQ(out[2].bytes, in.bytes) << "rank " << rank;
  });
}

TEST_P(GlooCommunicator, SameBitsAsTheThreadEngine) {
  Mesh mesh({"dp"}, {4});
  auto input = [](int64_t rank) {
    std::vector<float> in(257);
    for (size_t i = 0; i < in.size(); ++i)
      in[i] = std::sin(0.3f * rank + 0.11f * i) * 1e4f + 1e-3f * i;
    return in;
  };
  std::vector<std::vector<float>> viaThreads(4), viaGloo(4);
  ThreadWorld world(mesh);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < 4; ++r)
    threads.emplace_back([&, r] {
      auto comm = world.communicator(r);
      std::vector<float> in = input(r), out(in.size());
      comm->allReduce(in.data(), out.data(), in.size(), DType::F32,
                      ReduceOp::Sum, {"dp"});
      viaThreads[r] = out;
    });
  for (auto &t : threads)
    t.join();
  onGlooRanks(mesh, store("bits"), [&](Communicator &comm) {
    std::vector<float> in = input(comm.rank()), out(in.size());
    comm.allReduce(in.data(), out.data(), in.size(), DType::F32,
                   ReduceOp::Sum, {"dp"});
    viaGloo[comm.rank()] = out;
  });
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(0, std::memcmp(viaThreads[r].data(), viaGloo[r].data(),
                             viaGloo[r].size() * sizeof(float)));
}

TEST_P(GlooCommunicator, SendAndReceive) {
  Mesh mesh({"pp"}, {2});
  onGlooRanks(mesh, store("p2p"), [&](Communicator &comm) {
    double x = 42.0 + comm.rank(), y = 0;
    if (comm.rank() == 0) {
      comm.send(&x, sizeof x, 1, 3);
    } else {
      comm.recv(&y, sizeof y, 0, 3);
      EXPECT_EQ(y, 42.0);
    }
  });
}

// Sends are eager: both ranks send before either receives (a pipeline's
// 1F1B step), several messages per pair and tag are received in order, and
// the sender's buffer is free for reuse as soon as send returns.
TEST_P(GlooCommunicator, SendsAreEagerAndKeepTheirOrder) {
  Mesh mesh({"pp"}, {2});
  onGlooRanks(mesh, store("eager"), [&](Communicator &comm) {
    int64_t peer = 1 - comm.rank();
    std::vector<double> data(1000);
    for (int i = 0; i < 3; ++i) {
      std::fill(data.begin(), data.end(), 10.0 * comm.rank() + i);
      comm.send(data.data(), data.size() * sizeof(double), peer, 5);
      std::fill(data.begin(), data.end(), -1.0); // already copied
    }
    comm.send(nullptr, 0, peer, 6);
    for (int i = 0; i < 3; ++i) {
      comm.recv(data.data(), data.size() * sizeof(double), peer, 5);
      EXPECT_EQ(data.front(), 10.0 * peer + i);
      EXPECT_EQ(data.back(), 10.0 * peer + i);
    }
    comm.recv(nullptr, 0, peer, 6);
    comm.barrier({"pp"});
  });
}

// A send nobody receives does not hold up an aborted rank's communicator,
// and a peer waiting inside Gloo for the aborted rank wakes when that
// communicator goes, not after its timeout.
TEST_P(GlooCommunicator, AnAbortGivesUpUnreceivedSends) {
  Mesh mesh({"pp"}, {2});
  TestStore where = store("unreceived");
  GlooOptions options = where.options(std::chrono::seconds(20));
  std::promise<void> received;
  auto start = std::chrono::steady_clock::now();
  onThreads(2, [&](int64_t r) {
    auto comm = createGlooCommunicator(mesh, r, options);
    double x = 1;
    if (r == 0) {
      comm->send(&x, sizeof x, 1, 1);
      comm->send(&x, sizeof x, 1, 2); // never received
      received.get_future().wait();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      comm->abort("gave up");
    } else {
      comm->recv(&x, sizeof x, 0, 1);
      received.set_value();
      EXPECT_THROW(comm->recv(&x, sizeof x, 0, 3), CommunicationError);
    }
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

// A started recv waits on its pair while the same rank joins a barrier: each
// group has its own context and lock, so neither blocks the other (one lock
// over every call deadlocked here until the timeout).
TEST_P(GlooCommunicator, StartedOperationsDoNotBlockOtherGroups) {
  Mesh mesh({"pp"}, {2});
  onGlooRanks(mesh, store("overlap"), [&](Communicator &comm) {
    double value = 0;
    if (comm.rank() == 0) {
      AsyncHandle pending = comm.start([&] { comm.recv(&value, sizeof value, 1, 3); });
      comm.barrier({"pp"});
      pending.wait();
      EXPECT_EQ(value, 42.0);
    } else {
      comm.barrier({"pp"});
      value = 42.0;
      comm.send(&value, sizeof value, 0, 3);
    }
  });
}

TEST_P(GlooCommunicator, StartedCollectivesKeepTheirOrder) {
  Mesh mesh({"dp"}, {2});
  onGlooRanks(mesh, store("order"), [&](Communicator &comm) {
    checkStartedCollectivesKeepTheirOrder(comm, "dp", 50);
  });
}

// An abort reaches the peers' next calls through the store at once, not
// after their timeout.
TEST_P(GlooCommunicator, AbortReachesPeersNextCalls) {
  Mesh mesh({"dp"}, {2});
  TestStore where = store("abort");
  GlooOptions options = where.options(std::chrono::seconds(10));
  auto zero = createGlooCommunicator(mesh, 0, options);
  auto one = createGlooCommunicator(mesh, 1, options);
  one->abort("NaN in the loss");
  double x = 1, y = 0;
  auto start = std::chrono::steady_clock::now();
  try {
    zero->allReduce(&x, &y, 1, DType::F64, ReduceOp::Sum, {"dp"});
    FAIL() << "expected the abort";
  } catch (const CommunicationError &e) {
    EXPECT_NE(std::string(e.what()).find("aborted: rank 1: NaN in the loss"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// Rank 1 aborts on the other side of rank 0's abort: the pushed reason
// reaches rank 1's watch as well as rank 0's (the aborting rank's own
// watch must not matter).
TEST(GlooTcpStore, AbortByRankZeroReachesThePeer) {
  Mesh mesh({"dp"}, {3});
  GlooOptions options = TestStore(StoreKind::Tcp, "").options(
      std::chrono::seconds(10));
  auto zero = createGlooCommunicator(mesh, 0, options);
  auto one = createGlooCommunicator(mesh, 1, options);
  auto two = createGlooCommunicator(mesh, 2, options);
  zero->abort("out of memory");
  for (Communicator *peer : {one.get(), two.get()}) {
    try {
      peer->barrier({"dp"});
      ADD_FAILURE() << "expected the abort";
    } catch (const CommunicationError &e) {
      EXPECT_NE(std::string(e.what()).find("aborted: rank 0: out of memory"),
                std::string::npos)
          << e.what();
    }
  }
}

/// Creating rank `rank`'s communicator fails with a CommunicationError
/// whose message holds every one of `needles`.
void expectCreationError(const Mesh &mesh, int64_t rank,
                         const GlooOptions &options,
                         const std::vector<std::string> &needles) {
  try {
    createGlooCommunicator(mesh, rank, options);
    FAIL() << "expected an error";
  } catch (const CommunicationError &e) {
    std::string what = e.what();
    for (const std::string &needle : needles)
      EXPECT_NE(what.find(needle), std::string::npos) << what;
  }
}

// Rank 0 never comes: creating rank 1 fails within its timeout, naming the
// address, instead of hanging.
TEST(GlooTcpStore, MissingServerIsAnErrorWithinTheTimeout) {
  Mesh mesh({"dp"}, {2});
  GlooOptions options;
  options.storeAddress = freeAddress();
  options.timeout = std::chrono::milliseconds(700);
  auto start = std::chrono::steady_clock::now();
  expectCreationError(mesh, 1, options,
                      {"rank 1", options.storeAddress, "cannot connect"});
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, std::chrono::milliseconds(600));
  EXPECT_LT(took, std::chrono::seconds(5));
}

// Rank 0 starts after the others: they keep trying to connect.
TEST(GlooTcpStore, RankZeroMayStartLast) {
  Mesh mesh({"dp"}, {3});
  GlooOptions options = TestStore(StoreKind::Tcp, "").options(
      std::chrono::seconds(20));
  onThreads(3, [&](int64_t r) {
    if (r == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto comm = createGlooCommunicator(mesh, r, options);
    double x = 1.0 + r, sum = 0;
    comm->allReduce(&x, &sum, 1, DType::F64, ReduceOp::Sum, {"dp"});
    EXPECT_EQ(sum, 6.0);
  });
}

// A peer that never joins: the others' first collective fails within the
// timeout, saying what it waited for (and the TCP store's address). The
// file store's wait is ours (Gloo's is not safe for two threads).
TEST_P(GlooCommunicator, MissingPeerTimesOutInTheRendezvous) {
  Mesh mesh({"dp"}, {2});
  TestStore where = store("missing-peer");
  GlooOptions options = where.options(std::chrono::milliseconds(500));
  auto zero = createGlooCommunicator(mesh, 0, options);
  double x = 1, y = 0;
  auto start = std::chrono::steady_clock::now();
  try {
    zero->allReduce(&x, &y, 1, DType::F64, ReduceOp::Sum, {"dp"});
    FAIL() << "expected a timeout";
  } catch (const CommunicationError &e) {
    std::string what = e.what();
    EXPECT_NE(what.find("rank 0: all_reduce over [dp]"), std::string::npos)
        << what;
    EXPECT_NE(what.find("timed out"), std::string::npos) << what;
    EXPECT_NE(what.find("waiting for"), std::string::npos) << what;
    EXPECT_NE(what.find(options.storeAddress), std::string::npos) << what;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// Something that is not a store client connects to rank 0's port and sends
// garbage: the server drops it and goes on serving the ranks.
TEST(GlooTcpStore, GarbageOnThePortDoesNotStopTheServer) {
  Mesh mesh({"dp"}, {2});
  int port = freePort();
  GlooOptions options;
  options.storeAddress = "127.0.0.1:" + std::to_string(port);
  options.timeout = std::chrono::seconds(20);
  auto zero = createGlooCommunicator(mesh, 0, options);
  {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr),
              0);
    const char junk[] = "\xff\xff\xff\xffGET / HTTP/1.0\r\n\r\n";
    ASSERT_GT(::send(fd, junk, sizeof junk, MSG_NOSIGNAL), 0);
    char byte;
    // The server closes the connection rather than waiting for 4 GiB.
    struct timeval limit {5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    EXPECT_EQ(::recv(fd, &byte, 1, 0), 0);
    ::close(fd);
  }
  onThreads(2, [&](int64_t r) {
    std::unique_ptr<Communicator> own;
    if (r == 1)
      own = createGlooCommunicator(mesh, 1, options);
    Communicator &comm = r == 0 ? *zero : *own;
    double x = 1.0 + r, sum = 0;
    comm.allReduce(&x, &sum, 1, DType::F64, ReduceOp::Sum, {"dp"});
    EXPECT_EQ(sum, 3.0);
  });
}

// Rank 0's address must be its own: binding elsewhere is a clear error.
TEST(GlooTcpStore, RankZeroCannotServeAForeignAddress) {
  Mesh mesh({"dp"}, {2});
  GlooOptions options;
  options.storeAddress = "192.0.2.1:" + std::to_string(freePort());
  options.timeout = std::chrono::seconds(2);
  expectCreationError(mesh, 0, options,
                      {"rank 0", options.storeAddress, "cannot listen"});
}

TEST(GlooCommunicatorOptions, BadArgumentsAreErrors) {
  Mesh mesh({"dp"}, {2});
  auto message = [&](GlooOptions options) -> std::string {
    try {
      createGlooCommunicator(mesh, 0, options);
    } catch (const std::invalid_argument &e) {
      return e.what();
    }
    return "no std::invalid_argument";
  };
  FreshStore dir("bad");
  GlooOptions options;
  options.storePath = dir;
  EXPECT_THROW(createGlooCommunicator(mesh, 5, options), std::invalid_argument);
  EXPECT_NE(message(GlooOptions{}).find("exactly one store"), std::string::npos);
  options.storeAddress = "127.0.0.1:1";
  EXPECT_NE(message(options).find("exactly one store"), std::string::npos);

  auto address = [&](const std::string &text) {
    GlooOptions tcp;
    tcp.storeAddress = text;
    return message(tcp);
  };
  EXPECT_EQ(address("nohost"),
            "Gloo store address \"nohost\" is not host:port: no port");
  EXPECT_EQ(address("1.2.3.4:notaport"),
            "Gloo store address \"1.2.3.4:notaport\" is not host:port: "
            "port \"notaport\" is not a number in 1-65535");
  EXPECT_NE(address(":80").find("no host"), std::string::npos);
  EXPECT_NE(address("host:").find("not a number"), std::string::npos);
  EXPECT_NE(address("host:0").find("not a number in 1-65535"),
            std::string::npos);
  EXPECT_NE(address("host:65536").find("not a number in 1-65535"),
            std::string::npos);
  EXPECT_NE(address("::1:80").find("brackets"), std::string::npos);
}

// A host that does not resolve is an error naming it. (At once where the
// resolver says the name does not exist; a resolver that cannot answer
// makes it a retry until the timeout.)
TEST(GlooTcpStore, UnknownHostIsAnError) {
  Mesh mesh({"dp"}, {2});
  GlooOptions options;
  options.storeAddress = "no-such-host.invalid:29500";
  options.timeout = std::chrono::seconds(2);
  auto start = std::chrono::steady_clock::now();
  expectCreationError(mesh, 1, options, {"no-such-host.invalid:29500: cannot"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
}

} // namespace

//===- GlooCommunicatorTest.cpp - the Gloo engine on loopback ---------------===//
//
// Every rank is a thread with its own Gloo device and context over TCP on
// 127.0.0.1, rendezvousing through a temporary directory: the same checks
// as the thread engine, and bitwise the same float sums.
//
//===----------------------------------------------------------------------===//

#include "CollectiveChecks.h"
#include "ernie/runtime/GlooCommunicator.h"
#include "ernie/runtime/ThreadCommunicator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <thread>

using namespace ernie::runtime;
using namespace ernie::runtime::testing;

namespace {

/// An empty store directory for one test, removed when the test ends.
class FreshStore {
public:
  explicit FreshStore(const std::string &name)
      : dir_(std::filesystem::temp_directory_path() /
             ("ernie-gloo-" + name + "-" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  ~FreshStore() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  operator std::string() const { return dir_.string(); }

private:
  std::filesystem::path dir_;
};

template <typename Fn>
void onGlooRanks(const Mesh &mesh, const std::string &store, Fn body) {
  onThreads(mesh.numRanks(), [&](int64_t r) {
    GlooOptions options;
    options.storePath = store;
    options.timeout = std::chrono::seconds(30);
    auto comm = createGlooCommunicator(mesh, r, options);
    body(*comm);
  });
}

TEST(GlooCommunicator, EveryCollectiveOnEveryAxisSubset) {
  for (std::vector<int64_t> sizes : {std::vector<int64_t>{2},
                                     std::vector<int64_t>{2, 2}}) {
    std::vector<std::string> names{"a", "b"};
    names.resize(sizes.size());
    Mesh mesh(names, sizes);
    onGlooRanks(mesh, FreshStore("all" + std::to_string(sizes.size())),
                [&](Communicator &comm) {
                  for (const Axes &axes : axisSubsets(mesh)) {
                    SCOPED_TRACE(::testing::Message() << "rank " << comm.rank());
                    checkEveryCollective(comm, mesh, axes);
                  }
                });
  }
}

TEST(GlooCommunicator, SameBitsAsTheThreadEngine) {
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
  onGlooRanks(mesh, FreshStore("bits"), [&](Communicator &comm) {
    std::vector<float> in = input(comm.rank()), out(in.size());
    comm.allReduce(in.data(), out.data(), in.size(), DType::F32,
                   ReduceOp::Sum, {"dp"});
    viaGloo[comm.rank()] = out;
  });
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(0, std::memcmp(viaThreads[r].data(), viaGloo[r].data(),
                             viaGloo[r].size() * sizeof(float)));
}

TEST(GlooCommunicator, SendAndReceive) {
  Mesh mesh({"pp"}, {2});
  onGlooRanks(mesh, FreshStore("p2p"), [&](Communicator &comm) {
    double x = 42.0 + comm.rank(), y = 0;
    if (comm.rank() == 0) {
      comm.send(&x, sizeof x, 1, 3);
    } else {
      comm.recv(&y, sizeof y, 0, 3);
      EXPECT_EQ(y, 42.0);
    }
  });
}

// A started recv waits on its pair while the same rank joins a barrier: each
// group has its own context and lock, so neither blocks the other (one lock
// over every call deadlocked here until the timeout).
TEST(GlooCommunicator, StartedOperationsDoNotBlockOtherGroups) {
  Mesh mesh({"pp"}, {2});
  onGlooRanks(mesh, FreshStore("overlap"), [&](Communicator &comm) {
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

TEST(GlooCommunicator, StartedCollectivesKeepTheirOrder) {
  Mesh mesh({"dp"}, {2});
  onGlooRanks(mesh, FreshStore("order"), [&](Communicator &comm) {
    checkStartedCollectivesKeepTheirOrder(comm, "dp", 50);
  });
}

// An abort reaches the peers' next calls through the store at once, not
// after their timeout.
TEST(GlooCommunicator, AbortReachesPeersNextCalls) {
  Mesh mesh({"dp"}, {2});
  GlooOptions options;
  FreshStore store("abort");
  options.storePath = store;
  options.timeout = std::chrono::seconds(30);
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

TEST(GlooCommunicator, BadArgumentsAreErrors) {
  Mesh mesh({"dp"}, {2});
  EXPECT_THROW(createGlooCommunicator(mesh, 5, {FreshStore("bad")}),
               std::invalid_argument);
  EXPECT_THROW(createGlooCommunicator(mesh, 0, GlooOptions{}),
               std::invalid_argument);
}

} // namespace

//===- NcclRendezvousTest.cpp - NCCL's set-up, for real, without a GPU ------===//
//
// What making NCCL communicators does before NCCL touches a GPU: the world's
// unique id made by rank 0 and read by every rank through the rendezvous
// store (a shared directory, or rank 0's TCP store on loopback), aborts
// travelling through the same store, and each mesh-axis group's
// ncclCommSplit color and key. Ranks are threads, each with its own store
// client, as processes would be. Where no GPU is visible (or CUDA was not
// built), creating the communicator must fail with a clear reason.
//
//===----------------------------------------------------------------------===//

#include "StoreHelpers.h"

#include "comm/nccl/NcclRendezvous.h"

#include "ernie/runtime/Device.h"
#include "ernie/runtime/NcclCommunicator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>

using namespace ernie::runtime;
using namespace ernie::runtime::testing;

namespace {

enum class Kind { File, Tcp };

std::vector<char> fakeId(int seed) {
  std::vector<char> id(kNcclUniqueIdBytes);
  for (size_t i = 0; i < id.size(); ++i)
    id[i] = static_cast<char>((i * 31 + seed) & 0xff);
  return id;
}

class NcclRendezvous : public ::testing::TestWithParam<Kind> {
protected:
  /// Runs body(rank, store) on `n` threads, each with its own store.
  template <typename Fn>
  void onRanks(int n, std::chrono::milliseconds timeout, Fn body) {
    FreshStore dir("nccl");
    std::string path = GetParam() == Kind::File ? std::string(dir) : "";
    std::string address = GetParam() == Kind::Tcp ? freeAddress() : "";
    std::vector<std::thread> threads;
    std::atomic<int> finished{0};
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        RendezvousStore store(r, path, address, timeout);
        body(r, store);
        // Rank 0's store serves the others over TCP: no store closes before
        // every rank is done with its reads (a rank 0 leaving first made
        // the others' reads throw on their threads).
        ++finished;
        while (finished.load() < n)
          std::this_thread::yield();
      });
    for (auto &t : threads)
      t.join();
  }
};

} // namespace

TEST_P(NcclRendezvous, EveryRankReadsRankZerosId) {
  const int n = 4;
  std::atomic<int> made{0};
  std::vector<std::vector<char>> got(n);
  onRanks(n, std::chrono::seconds(10), [&](int r, RendezvousStore &store) {
    got[r] = ncclIdThroughStore(store, "ernie.nccl.world", [&] {
      ++made;
      return fakeId(7);
    });
    // A second id (a re-made world) under another key.
    std::vector<char> again =
        ncclIdThroughStore(store, "ernie.nccl.again", [] { return fakeId(9); });
    EXPECT_EQ(again, fakeId(9));
  });
  EXPECT_EQ(made.load(), 1); // rank 0 only
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(got[r], fakeId(7)) << "rank " << r;
}

TEST_P(NcclRendezvous, AnAbortReachesEveryRank) {
  const int n = 3;
  std::vector<std::string> seen(n);
  onRanks(n, std::chrono::seconds(10), [&](int r, RendezvousStore &store) {
    ncclIdThroughStore(store, "ernie.nccl.world", [] { return fakeId(1); });
    if (r == 1)
      store.publishAbort("rank 1: @f instruction #3 'ernie.all_reduce': boom");
    // Everyone waits until the abort is visible (bounded).
    for (int i = 0; i < 2000 && seen[r].empty(); ++i) {
      if (std::optional<std::string> reason = store.abortReason())
        seen[r] = *reason;
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    // Every rank holds its store until all have looked (rank 0 serves).
    ncclIdThroughStore(store, "ernie.nccl.done", [] { return fakeId(2); });
  });
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(seen[r], "rank 1: @f instruction #3 'ernie.all_reduce': boom")
        << "rank " << r;
}

TEST_P(NcclRendezvous, AMissingRankZeroIsAnErrorNotAHang) {
  if (GetParam() == Kind::Tcp)
    GTEST_SKIP() << "without rank 0 there is no TCP store to reach: covered "
                    "by GlooTcpStore.MissingServerIsAnErrorWithinTheTimeout";
  FreshStore dir("nccl-missing");
  RendezvousStore store(1, dir, "", std::chrono::milliseconds(200));
  auto start = std::chrono::steady_clock::now();
  try {
    ncclIdThroughStore(store, "ernie.nccl.world", [] { return fakeId(0); });
    FAIL() << "rank 1 read an id no rank 0 made";
  } catch (const std::runtime_error &e) {
    EXPECT_NE(std::string(e.what()).find("ernie.nccl.world"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST_P(NcclRendezvous, AnIdOfTheWrongSizeIsRefused) {
  onRanks(1, std::chrono::seconds(5), [&](int, RendezvousStore &store) {
    EXPECT_THROW(ncclIdThroughStore(store, "ernie.nccl.world",
                                    [] { return std::vector<char>(5); }),
                 std::runtime_error);
  });
}

INSTANTIATE_TEST_SUITE_P(Stores, NcclRendezvous,
                         ::testing::Values(Kind::File, Kind::Tcp),
                         [](const auto &info) {
                           return info.param == Kind::File ? "File" : "Tcp";
                         });

TEST(NcclSplit, ColorsAndKeysFormTheMeshGroups) {
  Mesh mesh({"dp", "mp", "pp"}, {2, 3, 2});
  std::vector<Axes> subsets = {{"dp"},       {"mp"},       {"pp"},
                               {"dp", "mp"}, {"mp", "dp"}, {"dp", "pp"},
                               {"mp", "pp"}, {"pp", "mp"}, {"dp", "mp", "pp"},
                               {"pp", "dp", "mp"}};
  for (const Axes &axes : subsets) {
    SCOPED_TRACE(describeAxes(axes));
    std::map<int, std::map<int, int64_t>> byColor; // color -> key -> rank
    for (int64_t r = 0; r < mesh.numRanks(); ++r) {
      NcclSplit s = ncclSplitOf(mesh, r, axes);
      EXPECT_TRUE(byColor[s.color].emplace(s.key, r).second)
          << "two ranks share color " << s.color << " and key " << s.key;
    }
    for (int64_t r = 0; r < mesh.numRanks(); ++r) {
      NcclSplit s = ncclSplitOf(mesh, r, axes);
      std::vector<int64_t> members;
      for (const auto &[key, rank] : byColor[s.color])
        members.push_back(rank); // in key order: NCCL's rank order
      EXPECT_EQ(members, mesh.group(r, axes)) << "rank " << r;
    }
  }
}

TEST(NcclCommunicator, WithoutAGpuCreationSaysWhy) {
  std::string reason;
  if (cudaDeviceCount(&reason) > 0)
    GTEST_SKIP() << "a CUDA device is visible: scripts/gpu_check.sh runs NCCL";
  FreshStore dir("nccl-nogpu");
  NcclOptions options;
  options.storePath = dir;
  try {
    createNcclCommunicator(Mesh({"x"}, {1}), 0, options);
    FAIL() << "an NCCL communicator without a GPU";
  } catch (const DeviceError &e) {
    std::string message = e.what();
    EXPECT_NE(message.find(cudaBackendBuilt() ? "no CUDA device visible"
                                              : "built without CUDA"),
              std::string::npos)
        << message;
  }
}

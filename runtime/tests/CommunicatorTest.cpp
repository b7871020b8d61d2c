//===- CommunicatorTest.cpp - every collective on every axis subset ---------===//
//
// Meshes [2], [4], [2,2] and [2,2,2]; for every non-empty subset of axes (in
// both orders where it matters) every collective runs on all ranks at once,
// and each rank's output is checked against the definition computed from
// the mesh's groups directly. Plus permutes, async collectives,
// point-to-point, timeouts and aborts.
//
//===----------------------------------------------------------------------===//

#include "CollectiveChecks.h"
#include "ernie/runtime/FloatConvert.h"
#include "ernie/runtime/ThreadCommunicator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>

using namespace ernie::runtime;
using namespace ernie::runtime::testing;

namespace {

/// Runs `body(comm)` on every rank of the world, one thread each.
template <typename Fn>
void onAllRanks(ThreadWorld &world, Fn body) {
  onThreads(world.mesh().numRanks(), [&](int64_t r) {
    auto comm = world.communicator(r);
    body(*comm);
  });
}

class Collectives : public ::testing::TestWithParam<std::vector<int64_t>> {
protected:
  Mesh makeMesh() {
    std::vector<std::string> names;
    for (size_t i = 0; i < GetParam().size(); ++i)
      names.push_back(std::string(1, static_cast<char>('a' + i)));
    return Mesh(names, GetParam());
  }
};

TEST_P(Collectives, EveryCollectiveOnEveryAxisSubset) {
  Mesh mesh = makeMesh();
  for (const Axes &axes : axisSubsets(mesh)) {
    ThreadWorld world(mesh, std::chrono::seconds(20));
    onAllRanks(world, [&](Communicator &comm) {
      SCOPED_TRACE(::testing::Message() << "rank " << comm.rank());
      checkEveryCollective(comm, mesh, axes);
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Meshes, Collectives,
                         ::testing::Values(std::vector<int64_t>{2},
                                           std::vector<int64_t>{4},
                                           std::vector<int64_t>{2, 2},
                                           std::vector<int64_t>{2, 2, 2}));

// A 2-D mesh, so a group over one axis is not the whole world: each axis,
// both together, in both orders.
TEST(ThreadCommunicator, PermutesShiftAroundTheGroup) {
  Mesh mesh({"a", "b"}, {2, 3});
  ThreadWorld world(mesh, std::chrono::seconds(20));
  onAllRanks(world, [&](Communicator &comm) {
    for (const Axes &axes : axisSubsets(mesh))
      checkPermutes(comm, mesh, axes);
  });
}

TEST(ThreadCommunicator, FloatSumsAreBitwiseIdenticalOnEveryRank) {
  Mesh mesh({"dp"}, {8});
  ThreadWorld world(mesh);
  std::vector<std::vector<float>> results(8);
  onAllRanks(world, [&](Communicator &comm) {
    std::vector<float> in(64), out(64);
    for (size_t i = 0; i < in.size(); ++i)
      in[i] = std::sin(0.1f * comm.rank() + 0.37f * i) * 1e3f;
    comm.allReduce(in.data(), out.data(), in.size(), DType::F32,
                   ReduceOp::Sum, {"dp"});
    results[comm.rank()] = out;
  });
  for (int r = 1; r < 8; ++r)
    EXPECT_EQ(0, std::memcmp(results[0].data(), results[r].data(),
                             64 * sizeof(float)));
}

// Each member reduces its own slice into every member's output, in blocks:
// a count that no slice or block divides, in place and not, sums, averages
// and maxima, f32 and bf16 — every rank's result equals reduceInOrder over
// all inputs, bit for bit.
TEST(ThreadCommunicator, AllReduceEqualsTheOrderedReductionOnUnevenSlices) {
  const size_t count = 3 * 1024 + 517;
  for (int64_t ranks : {2, 3}) {
    Mesh mesh({"dp"}, {ranks});
    for (DType type : {DType::F32, DType::BF16})
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max})
        for (bool inPlace : {false, true}) {
          if (type == DType::BF16 && op == ReduceOp::Avg)
            continue;
          SCOPED_TRACE(::testing::Message() << ranks << " ranks, " << name(type)
                                            << (inPlace ? ", in place" : ""));
          const size_t bytes = count * byteSize(type);
          std::vector<std::vector<char>> inputs(ranks, std::vector<char>(bytes));
          for (int64_t r = 0; r < ranks; ++r)
            for (size_t i = 0; i < count; ++i) {
              float v = std::sin(0.37f * i + 1.3f * r) * 100.0f;
              if (type == DType::F32)
                std::memcpy(inputs[r].data() + 4 * i, &v, 4);
              else {
                uint16_t b = floatToBf16(v);
                std::memcpy(inputs[r].data() + 2 * i, &b, 2);
              }
            }
          std::vector<const void *> views;
          for (auto &in : inputs)
            views.push_back(in.data());
          std::vector<char> want(bytes);
          reduceInOrder(views, want.data(), count, type, op);
          std::vector<std::vector<char>> results(ranks);
          ThreadWorld world(mesh);
          onAllRanks(world, [&](Communicator &comm) {
            std::vector<char> in = inputs[comm.rank()], out(bytes);
            char *dst = inPlace ? in.data() : out.data();
            comm.allReduce(in.data(), dst, count, type, op, {"dp"});
            results[comm.rank()].assign(dst, dst + bytes);
          });
          for (int64_t r = 0; r < ranks; ++r)
            EXPECT_EQ(0, std::memcmp(results[r].data(), want.data(), bytes))
                << "rank " << r;
        }
  }
}

TEST(ThreadCommunicator, NarrowFloatsReduceInF32AndRoundOnce) {
  // 1 + 3 * 2^-9 in bf16 (ulp 2^-7 at 1): rounding after every addition
  // would leave 1.0 (each 2^-9 is below half an ulp); once gives 1 + 2^-7.
  Mesh mesh({"dp"}, {4});
  ThreadWorld world(mesh);
  std::vector<uint16_t> results(4);
  onAllRanks(world, [&](Communicator &comm) {
    uint16_t in = floatToBf16(comm.rank() == 0 ? 1.0f : 0x1.0p-9f), out = 0;
    comm.allReduce(&in, &out, 1, DType::BF16, ReduceOp::Sum, {"dp"});
    results[comm.rank()] = out;
  });
  for (uint16_t r : results)
    EXPECT_EQ(bf16ToFloat(r), 1.0f + 0x1.0p-7f);
}

TEST(ThreadCommunicator, AsyncCollectivesOverlapWithWork) {
  Mesh mesh({"mp"}, {4});
  ThreadWorld world(mesh);
  onAllRanks(world, [&](Communicator &comm) {
    std::vector<double> a(16, comm.rank()), b(16), c(4, 1.0), d(4);
    AsyncHandle first = comm.start([&] {
      comm.allReduce(a.data(), b.data(), a.size(), DType::F64, ReduceOp::Sum,
                     {"mp"});
    });
    AsyncHandle second = comm.start([&] {
      comm.allGather(c.data(), d.data() , sizeof(double), {"mp"});
    });
    first.wait();
    second.wait();
    EXPECT_EQ(b[0], 0 + 1 + 2 + 3);
    EXPECT_EQ(d[3], 1.0);
  });
}

TEST(ThreadCommunicator, StartedCollectivesKeepTheirOrder) {
  Mesh mesh({"dp"}, {2});
  ThreadWorld world(mesh);
  onAllRanks(world, [&](Communicator &comm) {
    checkStartedCollectivesKeepTheirOrder(comm, "dp", 200);
  });
}

// out == in: a fast rank overwrites its buffer while slower ones may still
// be reading the group's inputs.
TEST(ThreadCommunicator, InPlaceCollectives) {
  Mesh mesh({"mp"}, {4});
  ThreadWorld world(mesh);
  onAllRanks(world, [&](Communicator &comm) {
    for (int round = 0; round < 200; ++round) {
      std::vector<double> x(8, 1.0 + comm.rank());
      comm.allReduce(x.data(), x.data(), x.size(), DType::F64, ReduceOp::Sum,
                     {"mp"});
      ASSERT_EQ(x, std::vector<double>(8, 1 + 2 + 3 + 4)) << "round " << round;
    }
  });
}

TEST(ThreadCommunicator, NothingStartsAfterAnAbort) {
  Mesh mesh({"dp"}, {2});
  ThreadWorld world(mesh, std::chrono::seconds(30));
  auto zero = world.communicator(0), one = world.communicator(1);
  zero->abort("out of memory");
  double x = 1, y = 0;
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(one->allReduce(&x, &y, 1, DType::F64, ReduceOp::Sum, {"dp"}),
               CommunicationError);
  EXPECT_THROW(one->send(&x, sizeof x, 0, 1), CommunicationError);
  EXPECT_THROW(one->recv(&x, sizeof x, 0, 1), CommunicationError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(ThreadCommunicator, SendAndReceive) {
  Mesh mesh({"pp"}, {3});
  ThreadWorld world(mesh);
  onAllRanks(world, [&](Communicator &comm) {
    int64_t r = comm.rank();
    double mine = 10.0 * r, got = -1;
    if (r + 1 < 3)
      comm.send(&mine, sizeof mine, r + 1, /*tag=*/7);
    if (r > 0) {
      comm.recv(&got, sizeof got, r - 1, 7);
      EXPECT_EQ(got, 10.0 * (r - 1));
    }
  });
}

TEST(ThreadCommunicator, MissingPeerTimesOutInsteadOfHanging) {
  Mesh mesh({"dp"}, {2});
  ThreadWorld world(mesh, std::chrono::milliseconds(200));
  auto comm = world.communicator(0);
  double x = 1, y = 0;
  auto start = std::chrono::steady_clock::now();
  try {
    comm->allReduce(&x, &y, 1, DType::F64, ReduceOp::Sum, {"dp"});
    FAIL() << "expected a timeout";
  } catch (const CommunicationError &e) {
    EXPECT_NE(std::string(e.what()).find("rank 0: all_reduce over [dp]: timed out"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(ThreadCommunicator, AbortReachesEveryWaitingRank) {
  Mesh mesh({"dp"}, {3});
  ThreadWorld world(mesh, std::chrono::seconds(30));
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      auto comm = world.communicator(r);
      if (r == 2) {
        comm->abort("kernel matmul failed: NaN in the loss");
        return;
      }
      try {
        comm->barrier({"dp"});
      } catch (const CommunicationError &e) {
        if (std::string(e.what()).find("rank 2: kernel matmul failed") !=
            std::string::npos)
          ++failures;
      }
    });
  for (auto &t : threads)
    t.join();
  EXPECT_EQ(failures.load(), 2);
}

TEST(ThreadCommunicator, BadArgumentsAreErrors) {
  Mesh mesh({"dp"}, {2});
  ThreadWorld world(mesh);
  EXPECT_THROW(world.communicator(2), std::invalid_argument);
  auto comm = world.communicator(0);
  double x = 0;
  EXPECT_THROW(comm->send(&x, sizeof x, 0, 0), CommunicationError);
  EXPECT_THROW(comm->allReduce(&x, &x, 1, DType::F64, ReduceOp::Sum, {"tp"}),
               std::invalid_argument);
}

} // namespace

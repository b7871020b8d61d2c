//===- CollectiveChecks.h - what every collective engine must compute -----===//
//
// Shared by the engine tests: inputs distinct per rank and element, outputs
// checked against the definitions computed from the mesh's groups.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_TESTS_COLLECTIVECHECKS_H
#define ERNIE_RUNTIME_TESTS_COLLECTIVECHECKS_H

#include "ernie/runtime/Communicator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <exception>
#include <thread>

namespace ernie::runtime::testing {

/// Runs `body(rank)` on `ranks` threads; rethrows the first failure.
template <typename Fn>
void onThreads(int64_t ranks, Fn body) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(ranks);
  for (int64_t r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto &t : threads)
    t.join();
  for (auto &e : errors)
    if (e)
      std::rethrow_exception(e);
}

/// Rank r's input element i: distinct per rank and element.
inline double value(int64_t rank, size_t i) { return 100.0 * rank + i + 0.25; }

/// Every non-empty subset of the mesh's axes, in every order.
inline std::vector<Axes> axisSubsets(const Mesh &mesh) {
  std::vector<Axes> out;
  const auto &names = mesh.axisNames();
  for (unsigned mask = 1; mask < (1u << names.size()); ++mask) {
    Axes axes;
    for (size_t i = 0; i < names.size(); ++i)
      if (mask & (1u << i))
        axes.push_back(names[i]);
    do
      out.push_back(axes);
    while (std::next_permutation(axes.begin(), axes.end()));
  }
  return out;
}

/// Runs every collective over `axes` on this rank and checks its output
/// against the definition (shared by every engine's tests).
inline void checkEveryCollective(Communicator &comm, const Mesh &mesh,
                                 const Axes &axes) {
  constexpr size_t kChunk = 3;
      int64_t r = comm.rank();
  std::vector<int64_t> group = mesh.group(r, axes);
  int64_t n = group.size(), me = mesh.indexInGroup(r, axes);
  SCOPED_TRACE(::testing::Message() << "rank " << r);

  // all_reduce: sum, max and avg.
  std::vector<double> in(kChunk), out(kChunk);
  for (size_t i = 0; i < kChunk; ++i)
    in[i] = value(r, i);
  comm.allReduce(in.data(), out.data(), kChunk, DType::F64, ReduceOp::Sum,
                 axes);
  for (size_t i = 0; i < kChunk; ++i) {
    double want = 0;
    for (int64_t g : group)
      want += value(g, i);
    EXPECT_EQ(out[i], want);
  }
  comm.allReduce(in.data(), out.data(), kChunk, DType::F64, ReduceOp::Max,
                 axes);
  EXPECT_EQ(out[0], value(*std::max_element(group.begin(), group.end()), 0));
  comm.allReduce(in.data(), out.data(), kChunk, DType::F64, ReduceOp::Avg,
                 axes);
  double avg = 0;
  for (int64_t g : group)
    avg += value(g, 1);
  EXPECT_DOUBLE_EQ(out[1], avg / n);

  // all_gather: the members' inputs in group order.
  std::vector<double> gathered(kChunk * n);
  comm.allGather(in.data(), gathered.data(), kChunk * sizeof(double), axes);
  for (int64_t j = 0; j < n; ++j)
    EXPECT_EQ(gathered[j * kChunk + 2], value(group[j], 2));

  // reduce_scatter: my chunk of the sum of everyone's chunks.
  std::vector<double> full(kChunk * n), mine(kChunk);
  for (size_t i = 0; i < full.size(); ++i)
    full[i] = value(r, i);
  comm.reduceScatter(full.data(), mine.data(), kChunk, DType::F64,
                     ReduceOp::Sum, axes);
  for (size_t i = 0; i < kChunk; ++i) {
    double want = 0;
    for (int64_t g : group)
      want += value(g, me * kChunk + i);
    EXPECT_EQ(mine[i], want);
  }

  // all_to_all: chunk me of every member, in member order.
  std::vector<double> exchanged(kChunk * n);
  comm.allToAll(full.data(), exchanged.data(), kChunk * sizeof(double),
                axes);
  for (int64_t j = 0; j < n; ++j)
    EXPECT_EQ(exchanged[j * kChunk], value(group[j], me * kChunk));

  // broadcast from the last member.
  std::vector<double> shared(in);
  comm.broadcast(shared.data(), kChunk * sizeof(double), n - 1, axes);
  EXPECT_EQ(shared[0], value(group[n - 1], 0));

  comm.barrier(axes);
}

/// Permutes over `axes` by 1, -1, n + 1, 0 and -(2n + 1) (n = group size),
/// out of place and in place, then two started back to back: member i must
/// hold what member (i - shift) mod n sent.
inline void checkPermutes(Communicator &comm, const Mesh &mesh,
                          const Axes &axes) {
  constexpr size_t kChunk = 5;
  int64_t r = comm.rank();
  std::vector<int64_t> group = mesh.group(r, axes);
  int64_t n = group.size(), me = mesh.indexInGroup(r, axes);
  auto source = [&](int64_t shift) {
    int64_t from = (me - shift) % n;
    return group[from < 0 ? from + n : from];
  };
  std::vector<double> in(kChunk);
  for (size_t i = 0; i < kChunk; ++i)
    in[i] = value(r, i);
  for (int64_t shift :
       {int64_t(1), int64_t(-1), n + 1, int64_t(0), -(2 * n + 1)}) {
    SCOPED_TRACE(::testing::Message() << "rank " << r << ", shift " << shift
                                      << " over " << describeAxes(axes));
    std::vector<double> out(kChunk, -1.0), inPlace(in);
    comm.permute(in.data(), out.data(), kChunk * sizeof(double), shift, axes);
    comm.permute(inPlace.data(), inPlace.data(), kChunk * sizeof(double), shift,
                 axes);
    for (size_t i = 0; i < kChunk; ++i) {
      EXPECT_EQ(out[i], value(source(shift), i)) << "element " << i;
      EXPECT_EQ(inPlace[i], value(source(shift), i)) << "element " << i;
    }
  }
  // Started back to back: each pairs with the same start on the peers.
  std::vector<double> first(kChunk), second(kChunk);
  AsyncHandle a = comm.start([&] {
    comm.permute(in.data(), first.data(), kChunk * sizeof(double), 1, axes);
  });
  AsyncHandle b = comm.start([&] {
    comm.permute(in.data(), second.data(), kChunk * sizeof(double), -1, axes);
  });
  a.wait();
  b.wait();
  EXPECT_EQ(first[kChunk - 1], value(source(1), kChunk - 1));
  EXPECT_EQ(second[kChunk - 1], value(source(-1), kChunk - 1));
}

/// Two collectives started back to back on a 2-rank group over `axis`, many
/// rounds: every rank must pair them in start order (with a thread per
/// started collective they raced, and ranks paired the first with the
/// second).
inline void checkStartedCollectivesKeepTheirOrder(Communicator &comm,
                                                  const std::string &axis,
                                                  int rounds) {
  for (int round = 0; round < rounds; ++round) {
    double a = 1 + comm.rank(), b = 100 + comm.rank(), sumA = 0, sumB = 0;
    AsyncHandle first = comm.start([&] {
      comm.allReduce(&a, &sumA, 1, DType::F64, ReduceOp::Sum, {axis});
    });
    AsyncHandle second = comm.start([&] {
      comm.allReduce(&b, &sumB, 1, DType::F64, ReduceOp::Sum, {axis});
    });
    first.wait();
    second.wait();
    ASSERT_EQ(sumA, 3.0) << "round " << round;
    ASSERT_EQ(sumB, 201.0) << "round " << round;
  }
}

} // namespace ernie::runtime::testing

#endif // ERNIE_RUNTIME_TESTS_COLLECTIVECHECKS_H

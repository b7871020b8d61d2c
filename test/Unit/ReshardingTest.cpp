//===- ReshardingTest.cpp - every reshard of a rank-2 tensor, simulated -----===//
//
// For meshes [4] and [2, 2], every sharding of an 8x8 tensor (each axis on
// either dimension in any order, Partial(sum), or unused) to every other:
// the planner must find a plan, and running that plan on a simulated mesh —
// integer buffers per rank, collectives by their definitions — must leave
// every rank holding exactly its piece of the destination. An independent
// check of both the planner and the meaning of each step.
//
//===----------------------------------------------------------------------===//

#include "ernie/InitAll.h"
#include "ernie/Sharding/Resharding.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

using namespace mlir;
using namespace mlir::ernie;

namespace {

using Buffer = std::vector<int64_t>; // row-major, local shape

std::string debugString(Attribute attr) {
  std::string text;
  llvm::raw_string_ostream os(text);
  attr.print(os);
  return text;
}
constexpr int64_t kRows = 8, kCols = 8;

struct SimMesh {
  MeshShape shape;
  int64_t numRanks() const {
    int64_t n = 1;
    for (int64_t s : shape.sizes)
      n *= s;
    return n;
  }
  int64_t coord(int64_t rank, StringRef axis) const {
    for (int64_t i = shape.axes.size() - 1; i >= 0; --i) {
      int64_t c = rank % shape.sizes[i];
      rank /= shape.sizes[i];
      if (shape.axes[i] == axis)
        return c;
    }
    return 0;
  }
  /// The rank equal to `rank` except for coordinate `c` along `axis`.
  int64_t withCoord(int64_t rank, StringRef axis, int64_t c) const {
    int64_t result = 0;
    SmallVector<int64_t> coords(shape.axes.size());
    for (int64_t i = shape.axes.size() - 1; i >= 0; --i) {
      coords[i] = rank % shape.sizes[i];
      rank /= shape.sizes[i];
    }
    for (size_t i = 0; i < coords.size(); ++i) {
      if (shape.axes[i] == axis)
        coords[i] = c;
      result = result * shape.sizes[i] + coords[i];
    }
    return result;
  }
};

int64_t globalValue(int64_t i, int64_t j) { return 1000 * i + j + 7; }

/// [offset, size) of `rank`'s block of dimension `d` under `s`.
std::pair<int64_t, int64_t> block(const SimMesh &mesh, ShardingAttr s,
                                  int64_t rank, int64_t d, int64_t dimSize) {
  int64_t index = 0, parts = 1;
  for (StringRef axis : s.getDimAxes(d)) {
    index = index * mesh.shape.axisSize(axis) + mesh.coord(rank, axis);
    parts *= mesh.shape.axisSize(axis);
  }
  int64_t size = dimSize / parts;
  return {index * size, size};
}

/// The piece of the global tensor `rank` holds under `s` (Partial axes
/// excluded: this is the value the summands add up to).
Buffer expectedPiece(const SimMesh &mesh, ShardingAttr s, int64_t rank,
                     int64_t &rows, int64_t &cols) {
  auto [r0, nr] = block(mesh, s, rank, 0, kRows);
  auto [c0, nc] = block(mesh, s, rank, 1, kCols);
  rows = nr;
  cols = nc;
  Buffer b;
  for (int64_t i = 0; i < nr; ++i)
    for (int64_t j = 0; j < nc; ++j)
      b.push_back(globalValue(r0 + i, c0 + j));
  return b;
}

/// The linear coordinate of `rank` over `s`'s partial axes, and their count.
std::pair<int64_t, int64_t> partialCoord(const SimMesh &mesh, ShardingAttr s,
                                         int64_t rank) {
  int64_t index = 0, n = 1;
  for (auto [axis, kind] : s.getPartials()) {
    index = index * mesh.shape.axisSize(axis) + mesh.coord(rank, axis);
    n *= mesh.shape.axisSize(axis);
  }
  return {index, n};
}

struct Local {
  Buffer data;
  int64_t rows, cols;
  int64_t at(int64_t i, int64_t j) const { return data[i * cols + j]; }
};

/// Every rank's buffer for a tensor distributed as `s`: Partial summands are
/// scrambled so only their sum is the value.
std::vector<Local> distribute(const SimMesh &mesh, ShardingAttr s) {
  std::vector<Local> ranks;
  for (int64_t r = 0; r < mesh.numRanks(); ++r) {
    Local l;
    l.data = expectedPiece(mesh, s, r, l.rows, l.cols);
    auto [index, n] = partialCoord(mesh, s, r);
    for (size_t e = 0; e < l.data.size(); ++e) {
      int64_t noise = static_cast<int64_t>((e * 31 + 17) % 13) - 6;
      l.data[e] = index == 0 ? l.data[e] - (n - 1) * noise : noise;
    }
    ranks.push_back(std::move(l));
  }
  return ranks;
}

Local sliceBlock(const Local &in, int64_t dim, int64_t index, int64_t n) {
  Local out;
  out.rows = dim == 0 ? in.rows / n : in.rows;
  out.cols = dim == 1 ? in.cols / n : in.cols;
  for (int64_t i = 0; i < out.rows; ++i)
    for (int64_t j = 0; j < out.cols; ++j)
      out.data.push_back(in.at(dim == 0 ? index * out.rows + i : i,
                               dim == 1 ? index * out.cols + j : j));
  return out;
}

Local concat(const std::vector<Local> &parts, int64_t dim) {
  Local out;
  out.rows = dim == 0 ? parts[0].rows * parts.size() : parts[0].rows;
  out.cols = dim == 1 ? parts[0].cols * parts.size() : parts[0].cols;
  out.data.assign(out.rows * out.cols, 0);
  for (size_t p = 0; p < parts.size(); ++p)
    for (int64_t i = 0; i < parts[p].rows; ++i)
      for (int64_t j = 0; j < parts[p].cols; ++j) {
        int64_t oi = dim == 0 ? p * parts[p].rows + i : i;
        int64_t oj = dim == 1 ? p * parts[p].cols + j : j;
        out.data[oi * out.cols + oj] = parts[p].at(i, j);
      }
  return out;
}

/// Runs one step on every rank, by the definition of its collective.
std::vector<Local> apply(const SimMesh &mesh, const std::vector<Local> &in,
                         const ReshardStep &step) {
  int64_t n = mesh.shape.product(step.axes);
  std::vector<Local> out(in.size());
  for (int64_t r = 0; r < mesh.numRanks(); ++r) {
    // The group over the step's axes, in row-major order over them.
    std::vector<Local> group;
    for (int64_t c = 0; c < n; ++c) {
      int64_t member = r;
      for (int64_t i = step.axes.size() - 1, rest = c; i >= 0; --i) {
        int64_t size = mesh.shape.axisSize(step.axes[i]);
        member = mesh.withCoord(member, step.axes[i], rest % size);
        rest /= size;
      }
      group.push_back(in[member]);
    }
    int64_t me = 0;
    for (StringRef axis : step.axes)
      me = me * mesh.shape.axisSize(axis) + mesh.coord(r, axis);
    auto sum = [&] {
      Local total = group[0];
      for (size_t g = 1; g < group.size(); ++g)
        for (size_t e = 0; e < total.data.size(); ++e)
          total.data[e] += group[g].data[e];
      return total;
    };
    switch (step.kind) {
    case ReshardStep::Kind::AllReduce:
      out[r] = sum();
      break;
    case ReshardStep::Kind::ReduceScatter:
      out[r] = sliceBlock(sum(), step.dim, me, n);
      break;
    case ReshardStep::Kind::AllGather:
      out[r] = concat(group, step.dim);
      break;
    case ReshardStep::Kind::AllToAll: {
      std::vector<Local> received;
      for (const Local &member : group)
        received.push_back(sliceBlock(member, step.toDim, me, n));
      out[r] = concat(received, step.dim);
      break;
    }
    case ReshardStep::Kind::ShardSlice:
      out[r] = sliceBlock(in[r], step.dim, me, n);
      break;
    case ReshardStep::Kind::PartialInit:
      out[r] = in[r];
      if (me != 0)
        std::fill(out[r].data.begin(), out[r].data.end(), 0);
      break;
    }
  }
  return out;
}

/// Every sharding of an 8x8 tensor on `mesh`: each axis unused, on dim 0 or
/// dim 1 (both orders when two share a dim), or Partial(sum).
std::vector<ShardingAttr> allShardings(MLIRContext *context,
                                       const MeshShape &mesh) {
  std::vector<ShardingAttr> result;
  size_t k = mesh.axes.size();
  int64_t combos = 1;
  for (size_t i = 0; i < k; ++i)
    combos *= 4;
  for (int64_t code = 0; code < combos; ++code) {
    SmallVector<int64_t> place;
    for (int64_t c = code, i = 0; i < static_cast<int64_t>(k); ++i, c /= 4)
      place.push_back(c % 4); // 0 unused, 1 dim0, 2 dim1, 3 partial
    SmallVector<StringRef> axes(mesh.axes);
    llvm::sort(axes);
    do {
      SmallVector<SmallVector<StringRef>> dims(2);
      SmallVector<std::pair<StringRef, ReduceKind>> partial;
      for (StringRef axis : axes) {
        int64_t p = place[llvm::find(mesh.axes, axis) - mesh.axes.begin()];
        if (p == 1 || p == 2)
          dims[p - 1].push_back(axis);
        else if (p == 3)
          partial.emplace_back(axis, ReduceKind::sum);
      }
      llvm::sort(partial);
      ShardingAttr s = ShardingAttr::get(context, mesh.name, dims, partial);
      if (!llvm::is_contained(result, s))
        result.push_back(s);
    } while (std::next_permutation(axes.begin(), axes.end()));
  }
  return result;
}

class ReshardingTest : public ::testing::TestWithParam<int> {
protected:
  ReshardingTest() {
    DialectRegistry registry;
    registerAllDialects(registry);
    context.appendDialectRegistry(registry);
    context.loadAllAvailableDialects();
  }
  MLIRContext context;
};

void checkAllPairs(MLIRContext *context, const SimMesh &mesh,
                   size_t expectedShardings) {
  auto type = RankedTensorType::get({kRows, kCols},
                                    IntegerType::get(context, 64));
  std::vector<ShardingAttr> shardings = allShardings(context, mesh.shape);
  ASSERT_EQ(shardings.size(), expectedShardings);
  int64_t checked = 0;
  for (ShardingAttr from : shardings) {
    for (ShardingAttr to : shardings) {
      FailureOr<SmallVector<ReshardStep>> plan =
          planReshard(from, to, type, mesh.shape);
      ASSERT_TRUE(succeeded(plan)) << "no plan for " << debugString(from)
                                   << " -> " << debugString(to);
      std::vector<Local> ranks = distribute(mesh, from);
      for (const ReshardStep &step : *plan)
        ranks = apply(mesh, ranks, step);
      if (!plan->empty()) {
        EXPECT_EQ(plan->back().after, to);
      }
      // Each rank's piece (summed over the destination's Partial group).
      for (int64_t r = 0; r < mesh.numRanks(); ++r) {
        int64_t rows, cols;
        Buffer want = expectedPiece(mesh, to, r, rows, cols);
        Buffer got(want.size(), 0);
        for (int64_t q = 0; q < mesh.numRanks(); ++q) {
          // q is in r's Partial group when only partial coords differ.
          bool same = true;
          for (StringRef axis : mesh.shape.axes) {
            bool isPartial = llvm::any_of(
                to.getPartials(), [&](auto p) { return p.first == axis; });
            if (!isPartial && mesh.coord(q, axis) != mesh.coord(r, axis))
              same = false;
          }
          if (!same)
            continue;
          ASSERT_EQ(ranks[q].data.size(), want.size())
              << debugString(from) << " -> " << debugString(to);
          for (size_t e = 0; e < want.size(); ++e)
            got[e] += ranks[q].data[e];
        }
        ASSERT_EQ(got, want) << "rank " << r << ": " << debugString(from)
                             << " -> " << debugString(to);
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, static_cast<int64_t>(expectedShardings *
                                          expectedShardings));
}

TEST_F(ReshardingTest, EveryPairOnMesh4) {
  SimMesh mesh;
  mesh.shape.name = FlatSymbolRefAttr::get(&context, "mesh");
  mesh.shape.axes = {"a"};
  mesh.shape.sizes = {4};
  // a unused, on dim 0, on dim 1, Partial.
  checkAllPairs(&context, mesh, 4);
}

TEST_F(ReshardingTest, EveryPairOnMesh2x2) {
  SimMesh mesh;
  mesh.shape.name = FlatSymbolRefAttr::get(&context, "mesh");
  mesh.shape.axes = {"x", "y"};
  mesh.shape.sizes = {2, 2};
  // 4 x 4 placements, plus the second order when both axes share a dim.
  checkAllPairs(&context, mesh, 18);
}

TEST_F(ReshardingTest, CanonicalPlans) {
  MeshShape mesh;
  mesh.name = FlatSymbolRefAttr::get(&context, "mesh");
  mesh.axes = {"x", "y"};
  mesh.sizes = {2, 2};
  auto type = RankedTensorType::get({8, 8}, Float32Type::get(&context));
  auto s = [&](SmallVector<SmallVector<StringRef>> dims,
               SmallVector<std::pair<StringRef, ReduceKind>> partial = {}) {
    return ShardingAttr::get(&context, mesh.name, dims, partial);
  };
  auto kinds = [&](ShardingAttr from, ShardingAttr to) {
    SmallVector<ReshardStep::Kind> k;
    FailureOr<SmallVector<ReshardStep>> plan =
        planReshard(from, to, type, mesh);
    EXPECT_TRUE(succeeded(plan));
    if (succeeded(plan))
      for (const ReshardStep &step : *plan)
        k.push_back(step.kind);
    return k;
  };
  using K = ReshardStep::Kind;
  // Partial -> Replicate is one all-reduce; Partial -> Shard one
  // reduce-scatter; moving an axis between dims one all-to-all; adding a
  // split is free.
  EXPECT_EQ(kinds(s({{}, {}}, {{"x", ReduceKind::sum}}), s({{}, {}})),
            SmallVector<K>{K::AllReduce});
  EXPECT_EQ(kinds(s({{}, {}}, {{"x", ReduceKind::sum}}), s({{"x"}, {}})),
            SmallVector<K>{K::ReduceScatter});
  EXPECT_EQ(kinds(s({{"x"}, {}}), s({{}, {"x"}})),
            SmallVector<K>{K::AllToAll});
  EXPECT_EQ(kinds(s({{}, {}}), s({{"y"}, {"x"}})),
            (SmallVector<K>{K::ShardSlice, K::ShardSlice}));
  // Swapping two axes between dims: gather one, move the other with an
  // all-to-all into the freed dim, slice the first back in (a rank sends
  // 2 x its piece; gathering both would send 4x).
  EXPECT_EQ(kinds(s({{"x"}, {"y"}}), s({{"y"}, {"x"}})),
            (SmallVector<K>{K::AllGather, K::AllToAll, K::ShardSlice}));
  // Reordering two axes on one dim: 160 bytes through the other dimension
  // (e.g. gather y 64, move x across 64, slice y, move x back 32), where
  // gathering both and slicing would send 192.
  FailureOr<SmallVector<ReshardStep>> reorder =
      planReshard(s({{"x", "y"}, {}}), s({{"y", "x"}, {}}), type, mesh);
  ASSERT_TRUE(succeeded(reorder));
  int64_t bytes = 0;
  for (const ReshardStep &step : *reorder)
    bytes += step.bytes;
  EXPECT_EQ(bytes, 160);
  EXPECT_EQ(reorder->size(), 4u);
}

} // namespace

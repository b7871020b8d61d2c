//===- InferSpmdTest.cpp - one op's SPMD rule through the C++ API -----------===//
//
// The Paddle-style checks: Megatron's column- and row-parallel matmuls,
// elementwise merging, softmax's axis, the vocab-parallel embedding, and the
// dims_mapping conversions.
//
//===----------------------------------------------------------------------===//

#include "ernie/InitAll.h"
#include "ernie/Sharding/InferSpmd.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

using namespace mlir;
using namespace mlir::ernie;

namespace {

class InferSpmdTest : public ::testing::Test {
protected:
  InferSpmdTest() {
    DialectRegistry registry;
    registerAllDialects(registry);
    context.appendDialectRegistry(registry);
    context.loadAllAvailableDialects();
    mesh.name = FlatSymbolRefAttr::get(&context, "mesh");
    mesh.axes = {"dp", "mp"};
    mesh.sizes = {2, 4};
  }

  RankedTensorType f32(ArrayRef<int64_t> shape) {
    return RankedTensorType::get(shape, Float32Type::get(&context));
  }
  RankedTensorType i64(ArrayRef<int64_t> shape) {
    return RankedTensorType::get(shape, IntegerType::get(&context, 64));
  }
  /// dims_mapping plus partial mesh dims, on the [dp=2, mp=4] mesh.
  ShardingAttr s(ArrayRef<int64_t> dims, ArrayRef<int64_t> partial = {}) {
    DimsMapping m{SmallVector<int64_t>(dims), SmallVector<int64_t>(partial)};
    return *shardingFromDimsMapping(&context, mesh, m);
  }
  SpmdResult infer(StringRef op, ArrayRef<RankedTensorType> types,
                   ArrayRef<ShardingAttr> shardings,
                   DictionaryAttr attrs = {}) {
    std::string error;
    FailureOr<SpmdResult> result =
        inferSpmd(&context, op, types, shardings, attrs, mesh, error);
    EXPECT_TRUE(succeeded(result)) << error;
    return succeeded(result) ? *result : SpmdResult{};
  }

  MLIRContext context;
  MeshShape mesh;
};

TEST_F(InferSpmdTest, ColumnParallelMatmul) {
  // x [b/dp, s, h] @ W [h, n/mp] -> [b/dp, s, n/mp], nothing pending.
  SpmdResult r = infer("ernie.matmul", {f32({4, 8, 16}), f32({16, 32})},
                       {s({0, -1, -1}), s({-1, 1})});
  ASSERT_EQ(r.outputs.size(), 1u);
  EXPECT_EQ(r.outputs[0], s({0, -1, 1}));
  EXPECT_EQ(r.inputs[0], s({0, -1, -1}));
  EXPECT_EQ(r.inputs[1], s({-1, 1}));
}

TEST_F(InferSpmdTest, RowParallelMatmulIsPartial) {
  // x [b/dp, s, h/mp] @ W [h/mp, n] -> [b/dp, s, n] Partial(sum) over mp.
  SpmdResult r = infer("ernie.matmul", {f32({4, 8, 16}), f32({16, 32})},
                       {s({0, -1, 1}), s({1, -1})});
  EXPECT_EQ(r.outputs[0], s({0, -1, -1}, {1}));
  EXPECT_TRUE(r.outputs[0].isPartial());
}

TEST_F(InferSpmdTest, ElementwiseFirstInputWinsOnConflict) {
  // Equal cost: the first operand seeds the choice; the second is resharded.
  SpmdResult r = infer("ernie.add", {f32({8, 8}), f32({8, 8})},
                       {s({0, -1}), s({-1, 0})});
  EXPECT_EQ(r.outputs[0], s({0, -1}));
  EXPECT_EQ(r.inputs[1], s({0, -1}));
}

TEST_F(InferSpmdTest, ElementwiseMergesDisjointAxes) {
  SpmdResult r = infer("ernie.mul", {f32({8, 8}), f32({8, 8})},
                       {s({0, -1}), s({-1, 1})});
  EXPECT_EQ(r.outputs[0], s({0, 1}));
}

TEST_F(InferSpmdTest, SoftmaxAxisStaysWhole) {
  Builder b(&context);
  DictionaryAttr attrs =
      b.getDictionaryAttr(b.getNamedAttr("axis", b.getI64IntegerAttr(1)));
  SpmdResult r = infer("ernie.softmax", {f32({8, 16})}, {s({0, 1})}, attrs);
  EXPECT_EQ(r.inputs[0], s({0, -1}));
  EXPECT_EQ(r.outputs[0], s({0, -1}));
}

TEST_F(InferSpmdTest, VocabParallelEmbeddingIsPartial) {
  SpmdResult r = infer("ernie.embedding", {i64({4, 8}), f32({64, 16})},
                       {s({0, -1}), s({1, -1})});
  EXPECT_EQ(r.outputs[0], s({0, -1, -1}, {1}));
}

TEST_F(InferSpmdTest, ReshapeKeepsMajorFactorSplit) {
  // [b, s, h/mp] -> [b, s, heads/mp, head_dim]: 64 = 4 heads x 16.
  std::string error;
  FailureOr<SpmdResult> r =
      inferSpmd(&context, "ernie.reshape", {f32({2, 8, 64})},
                {s({-1, -1, 1})}, {}, mesh, error, {f32({2, 8, 4, 16})});
  ASSERT_TRUE(succeeded(r)) << error;
  EXPECT_EQ(r->outputs[0], s({-1, -1, 1, -1}));
}

TEST_F(InferSpmdTest, BadInputsAreErrorsNotCrashes) {
  std::string error;
  EXPECT_TRUE(failed(inferSpmd(&context, "ernie.matmul",
                               {f32({4, 3}), f32({5, 6})}, {s({-1, -1}), s({-1, -1})},
                               {}, mesh, error)));
  EXPECT_NE(error.find("matmul contraction sizes differ: lhs has 3, rhs has 5"),
            std::string::npos)
      << error;
  EXPECT_TRUE(failed(inferSpmd(&context, "ernie.nope", {}, {}, {}, mesh, error)));
  EXPECT_NE(error.find("unknown op 'ernie.nope'"), std::string::npos) << error;
}

TEST_F(InferSpmdTest, DimsMappingRoundTrips) {
  ShardingAttr sharding = s({1, -1, 0});
  FailureOr<DimsMapping> back = dimsMappingFromSharding(sharding, mesh);
  ASSERT_TRUE(succeeded(back));
  EXPECT_EQ(back->dims, SmallVector<int64_t>({1, -1, 0}));
  // A mesh dimension used twice, or one the mesh does not have, is refused.
  EXPECT_TRUE(failed(shardingFromDimsMapping(&context, mesh, {{0, 0}, {}})));
  EXPECT_TRUE(failed(shardingFromDimsMapping(&context, mesh, {{2}, {}})));
  EXPECT_TRUE(failed(shardingFromDimsMapping(&context, mesh, {{0}, {0}})));
}

} // namespace

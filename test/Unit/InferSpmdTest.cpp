//===- InferSpmdTest.cpp - one op's SPMD rule through the C++ API ---------===//
//
// The Paddle-style checks: Megatron's column- and row-parallel matmuls,
// elementwise merging, softmax's axis, the vocab-parallel embedding, the
// dims_mapping conversions, attributes as Paddle spells them, reverse
// inference, and a sweep of every registered ernie op (SpmdCases.h).
//
//===----------------------------------------------------------------------===//

#include "SpmdCases.h"

#include "ernie/InitAll.h"
#include "ernie/Sharding/InferSpmd.h"

#include "mlir/AsmParser/AsmParser.h"

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

TEST_F(InferSpmdTest, AccumulatingMatmulNeverSplitsItsSum) {
  // acc + x @ W with h split: each rank's partial product would carry acc,
  // so the contraction is gathered whole; acc follows the result's split.
  SpmdResult r = infer("ernie.matmul_accumulate",
                       {f32({8, 16}), f32({16, 32}), f32({8, 32})},
                       {s({0, 1}), s({1, -1}), s({-1, -1})});
  EXPECT_EQ(r.inputs[0], s({0, -1}));
  EXPECT_EQ(r.inputs[1], s({-1, -1}));
  EXPECT_EQ(r.inputs[2], s({0, -1}));
  EXPECT_EQ(r.outputs[0], s({0, -1}));
  EXPECT_FALSE(r.outputs[0].isPartial());
}

TEST_F(InferSpmdTest, ElementwiseFirstInputWinsOnConflict) {
  // Equal cost: the first operand seeds the choice; the second is resharded.
  SpmdResult r =
      infer("ernie.add", {f32({8, 8}), f32({8, 8})}, {s({0, -1}), s({-1, 0})});
  EXPECT_EQ(r.outputs[0], s({0, -1}));
  EXPECT_EQ(r.inputs[1], s({0, -1}));
}

TEST_F(InferSpmdTest, ElementwiseMergesDisjointAxes) {
  SpmdResult r =
      infer("ernie.mul", {f32({8, 8}), f32({8, 8})}, {s({0, -1}), s({-1, 1})});
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
      inferSpmd(&context, "ernie.reshape", {f32({2, 8, 64})}, {s({-1, -1, 1})},
                {}, mesh, error, {f32({2, 8, 4, 16})});
  ASSERT_TRUE(succeeded(r)) << error;
  EXPECT_EQ(r->outputs[0], s({-1, -1, 1, -1}));
}

TEST_F(InferSpmdTest, BadInputsAreErrorsNotCrashes) {
  std::string error;
  EXPECT_TRUE(
      failed(inferSpmd(&context, "ernie.matmul", {f32({4, 3}), f32({5, 6})},
                       {s({-1, -1}), s({-1, -1})}, {}, mesh, error)));
  EXPECT_NE(error.find("matmul contraction sizes differ: lhs has 3, rhs has 5"),
            std::string::npos)
      << error;
  EXPECT_TRUE(
      failed(inferSpmd(&context, "ernie.nope", {}, {}, {}, mesh, error)));
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
  // Found by the fuzzer: a mesh repeating an axis name asserted in
  // ShardingAttr::get (one axis used twice); an unnamed axis likewise.
  MeshShape twice = mesh;
  twice.axes = {"dp", "dp"};
  EXPECT_TRUE(failed(shardingFromDimsMapping(&context, twice, {{0, 1}, {}})));
  MeshShape unnamed = mesh;
  unnamed.axes = {"", "mp"};
  EXPECT_TRUE(failed(shardingFromDimsMapping(&context, unnamed, {{0}, {}})));
  std::string error;
  EXPECT_TRUE(failed(
      inferSpmd(&context, "ernie.exp", {f32({4, 4})}, {}, {}, twice, error)));
  EXPECT_NE(error.find("declared twice"), std::string::npos) << error;
}

TEST_F(InferSpmdTest, PaddleSpellingsAndNegativeAxes) {
  Builder b(&context);
  // Paddle's matmul case: trans_x, abcmk[1, -1, -1, 0] -> abcmn[1, -1, 0, -1].
  SpmdResult r = infer(
      "ernie.matmul", {f32({4, 2, 64, 32}), f32({64, 48})},
      {s({1, -1, -1, 0}), s({-1, -1})},
      b.getDictionaryAttr(b.getNamedAttr("trans_x", b.getBoolAttr(true))));
  EXPECT_EQ(r.outputs[0], s({1, -1, 0, -1}));
  r = infer(
      "ernie.reduce_max", {f32({8, 16})}, {s({0, 1})},
      b.getDictionaryAttr({b.getNamedAttr("axis", b.getI64IntegerAttr(-1)),
                           b.getNamedAttr("keepdim", b.getBoolAttr(true))}));
  ShardingAttr want = ShardingAttr::get(
      &context, mesh.name, SmallVector<SmallVector<StringRef>>{{"dp"}, {}},
      {{"mp", ReduceKind::max}});
  EXPECT_EQ(r.outputs[0], want);
}

TEST_F(InferSpmdTest, ReverseFromOutputs) {
  // Paddle's matmul infer_backward: mn[1, 0] -> mk[1, -1], kn[-1, 0].
  std::string error;
  FailureOr<SpmdResult> r =
      inferSpmdReverse(&context, "ernie.matmul", {f32({64, 32}), f32({32, 48})},
                       {s({1, 0})}, {}, mesh, error);
  ASSERT_TRUE(succeeded(r)) << error;
  EXPECT_EQ(r->inputs[0], s({1, -1}));
  EXPECT_EQ(r->inputs[1], s({-1, 0}));
  EXPECT_EQ(r->outputs[0], s({1, 0}));
  // Wrong output count or rank: an error, not a crash.
  EXPECT_TRUE(failed(inferSpmdReverse(&context, "ernie.exp", {f32({4})},
                                      {s({0}), s({0})}, {}, mesh, error)));
  EXPECT_NE(error.find("has 1 outputs; got 2"), std::string::npos) << error;
  EXPECT_TRUE(failed(inferSpmdReverse(&context, "ernie.exp", {f32({4})},
                                      {s({0, 1})}, {}, mesh, error)));
  EXPECT_NE(error.find("output 0 has a sharding of rank 2"), std::string::npos)
      << error;
}

TEST_F(InferSpmdTest, AttributeErrorsNameOpAndAttribute) {
  Builder b(&context);
  std::string error;
  auto attrs = [&](StringRef name, Attribute value) {
    return b.getDictionaryAttr(b.getNamedAttr(name, value));
  };
  EXPECT_TRUE(
      failed(inferSpmd(&context, "ernie.softmax", {f32({4, 8})}, {s({0, 1})},
                       attrs("dim", b.getI64IntegerAttr(1)), mesh, error)));
  EXPECT_EQ(error, "'ernie.softmax': has no attribute 'dim' (it has axis)");
  EXPECT_TRUE(
      failed(inferSpmd(&context, "ernie.softmax", {f32({4, 8})}, {s({0, 1})},
                       attrs("axis", b.getStringAttr("last")), mesh, error)));
  EXPECT_NE(error.find("'ernie.softmax': attribute 'axis' cannot be"),
            std::string::npos)
      << error;
  EXPECT_TRUE(failed(inferSpmd(&context, "ernie.reduce_sum", {f32({4, 8})},
                               {s({0, 1})}, {}, mesh, error)));
  EXPECT_NE(error.find("'ernie.reduce_sum' op requires attribute 'axes'"),
            std::string::npos)
      << error;
  // A dynamic shape is refused before any op sees it.
  auto dynamic = RankedTensorType::get({ShapedType::kDynamic, 4},
                                       Float32Type::get(&context));
  EXPECT_TRUE(
      failed(inferSpmd(&context, "ernie.exp", {dynamic}, {}, {}, mesh, error)));
  EXPECT_NE(error.find("needs a static shape"), std::string::npos) << error;
}

//===----------------------------------------------------------------------===//
// The sweep: every registered ernie op.
//===----------------------------------------------------------------------===//

class InferSpmdSweep : public InferSpmdTest {
protected:
  const ernie_test::SpmdCase *find(StringRef op) {
    for (const ernie_test::SpmdCase &c : ernie_test::spmdCases())
      if (op == c.op)
        return &c;
    return nullptr;
  }
  /// Runs `c` forward; returns the error, or "" with `result` set.
  std::string run(const ernie_test::SpmdCase &c, SpmdResult &result,
                  SmallVectorImpl<RankedTensorType> &types) {
    SmallVector<ShardingAttr> shardings;
    for (auto [text, mapping] : llvm::zip(c.types, c.mappings)) {
      types.push_back(cast<RankedTensorType>(parseType(text, &context)));
      shardings.push_back(s(mapping));
    }
    auto attrs = cast<DictionaryAttr>(parseAttribute(c.attrs, &context));
    std::string error;
    FailureOr<SpmdResult> r =
        inferSpmd(&context, c.op, types, shardings, attrs, mesh, error);
    if (failed(r))
      return error.empty() ? "failed without a message" : error;
    result = *r;
    return "";
  }
};

TEST_F(InferSpmdSweep, EveryOpHasACase) {
  int64_t withRules = 0;
  for (RegisteredOperationName name : context.getRegisteredOperations()) {
    if (name.getDialectNamespace() != "ernie" ||
        !name.hasInterface<ShardingRuleOpInterface>())
      continue;
    ++withRules;
    EXPECT_TRUE(find(name.getStringRef())) << name.getStringRef().str();
  }
  EXPECT_GE(withRules, 57);
}

TEST_F(InferSpmdSweep, EveryOpRunsForwardAndBackward) {
  for (const ernie_test::SpmdCase &c : ernie_test::spmdCases()) {
    SCOPED_TRACE(c.op);
    auto name = RegisteredOperationName::lookup(c.op, &context);
    ASSERT_TRUE(name);
    SpmdResult r;
    SmallVector<RankedTensorType> types;
    std::string error = run(c, r, types);
    if (!name->hasInterface<ShardingRuleOpInterface>()) {
      EXPECT_FALSE(error.empty());
      continue;
    }
    ASSERT_EQ(error, "");
    ASSERT_EQ(r.inputs.size(), types.size());
    for (auto [sharding, type] : llvm::zip(r.inputs, types))
      EXPECT_EQ(sharding.getRank(), type.getRank());
    std::string typesError;
    auto attrs = cast<DictionaryAttr>(parseAttribute(c.attrs, &context));
    FailureOr<SmallVector<RankedTensorType>> outTypes =
        inferSpmdResultTypes(&context, c.op, types, attrs, typesError);
    ASSERT_TRUE(succeeded(outTypes)) << typesError;
    ASSERT_EQ(r.outputs.size(), outTypes->size());
    for (auto [sharding, type] : llvm::zip(r.outputs, *outTypes))
      EXPECT_EQ(sharding.getRank(), type.getRank());
    // Backward from the forward's outputs gives them back.
    FailureOr<SpmdResult> back =
        inferSpmdReverse(&context, c.op, types, r.outputs, attrs, mesh, error);
    ASSERT_TRUE(succeeded(back)) << error;
    for (auto [got, want] : llvm::zip(back->outputs, r.outputs))
      EXPECT_EQ(got.getDims(), want.getDims());
  }
}

} // namespace

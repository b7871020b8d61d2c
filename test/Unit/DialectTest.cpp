//===- DialectTest.cpp - the ernie dialect through its C++ API --------------===//
//
// Builds ops the way the Python frontend will (through builders, not text)
// and checks the inferred types, the cost interface and the folders.
//
//===----------------------------------------------------------------------===//

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/InitAll.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

using namespace mlir;
using namespace mlir::ernie;

namespace {

class ErnieDialectTest : public ::testing::Test {
protected:
  ErnieDialectTest() {
    DialectRegistry registry;
    registerAllDialects(registry);
    context.appendDialectRegistry(registry);
    context.loadAllAvailableDialects();
  }

  RankedTensorType tensor(ArrayRef<int64_t> shape, Type element = {}) {
    return RankedTensorType::get(shape, element ? element
                                                : Float32Type::get(&context));
  }

  /// A function whose arguments have `types`, with the builder inside it.
  Block *makeFunction(OpBuilder &builder, ArrayRef<Type> types) {
    module = ModuleOp::create(builder.getUnknownLoc());
    builder.setInsertionPointToEnd(module->getBody());
    auto func = func::FuncOp::create(builder, builder.getUnknownLoc(), "f",
                                     builder.getFunctionType(types, {}));
    Block *entry = func.addEntryBlock();
    builder.setInsertionPointToEnd(entry);
    return entry;
  }

  MLIRContext context;
  OwningOpRef<ModuleOp> module;
};

TEST_F(ErnieDialectTest, MatmulInfersBatchedShape) {
  OpBuilder b(&context);
  Block *entry = makeFunction(b, {tensor({2, 16, 64}), tensor({128, 64})});
  auto mm = MatmulOp::create(b, b.getUnknownLoc(), entry->getArgument(0),
                             entry->getArgument(1), /*transpose_a=*/false,
                             /*transpose_b=*/true);
  EXPECT_EQ(mm.getType(), tensor({2, 16, 128}));
  EXPECT_EQ(cast<CostOpInterface>(mm.getOperation()).getFlops(),
            2 * 2 * 16 * 128 * 64);
  // Operand and result bytes: (2*16*64 + 128*64 + 2*16*128) f32 values.
  EXPECT_EQ(cast<CostOpInterface>(mm.getOperation()).getBytesAccessed(),
            4 * (2 * 16 * 64 + 128 * 64 + 2 * 16 * 128));
  func::ReturnOp::create(b, b.getUnknownLoc());
}

TEST_F(ErnieDialectTest, AttentionInfersGroupedQueryShape) {
  OpBuilder b(&context);
  Block *entry = makeFunction(
      b, {tensor({2, 16, 8, 32}), tensor({2, 16, 2, 32}), tensor({2, 16, 2, 24})});
  auto attn = AttentionOp::create(b, b.getUnknownLoc(), entry->getArgument(0),
                                  entry->getArgument(1), entry->getArgument(2),
                                  /*causal=*/true, /*scale=*/nullptr,
                                  /*window=*/nullptr);
  EXPECT_EQ(attn.getType(), tensor({2, 16, 8, 24}));
  func::ReturnOp::create(b, b.getUnknownLoc());
  EXPECT_TRUE(succeeded(verify(*module)));
}

TEST_F(ErnieDialectTest, ReductionAndSplitInference) {
  OpBuilder b(&context);
  Block *entry = makeFunction(b, {tensor({4, 8, 6})});
  Value x = entry->getArgument(0);
  auto keep = ReduceSumOp::create(b, b.getUnknownLoc(), x,
                                  b.getDenseI64ArrayAttr({0, 2}), true);
  EXPECT_EQ(keep.getType(), tensor({1, 8, 1}));
  auto drop = ReduceMaxOp::create(b, b.getUnknownLoc(), x,
                                  b.getDenseI64ArrayAttr({1}), false);
  EXPECT_EQ(drop.getType(), tensor({4, 6}));
  auto split = SplitOp::create(b, b.getUnknownLoc(), x, 2,
                               b.getDenseI64ArrayAttr({2, 4}));
  ASSERT_EQ(split.getNumResults(), 2u);
  EXPECT_EQ(split.getResult(1).getType(), tensor({4, 8, 4}));
  func::ReturnOp::create(b, b.getUnknownLoc());
  EXPECT_TRUE(succeeded(verify(*module)));
}

TEST_F(ErnieDialectTest, FullBuilderRoundsToElementType) {
  OpBuilder b(&context);
  makeFunction(b, {});
  auto full = FullOp::create(b, b.getUnknownLoc(),
                             tensor({3}, BFloat16Type::get(&context)), 0.1);
  auto value = cast<FloatAttr>(full.getValue());
  EXPECT_EQ(value.getType(), BFloat16Type::get(&context));
  // 0.1 rounded to bf16 (8 significant bits) is 0.10009765625.
  EXPECT_EQ(value.getValueAsDouble(), 0.10009765625);
  func::ReturnOp::create(b, b.getUnknownLoc());
  EXPECT_TRUE(succeeded(verify(*module)));
}

TEST_F(ErnieDialectTest, AddressableSizeRejectsOverflow) {
  EXPECT_TRUE(hasAddressableSize(tensor({1 << 20, 1 << 10})));
  EXPECT_FALSE(hasAddressableSize(tensor({int64_t(1) << 40, int64_t(1) << 30})));
  EXPECT_TRUE(hasAddressableSize(tensor({0, 5})));
  // Element types without a byte size are never addressable (no crash).
  EXPECT_FALSE(hasAddressableSize(tensor({4}, IndexType::get(&context))));
  EXPECT_EQ(getElementByteSize(IntegerType::get(&context, 1)), 1);
  EXPECT_EQ(getElementByteSize(BFloat16Type::get(&context)), 2);
}

TEST_F(ErnieDialectTest, InvalidMatmulFailsInferenceWithoutCrashing) {
  const char *source = R"mlir(
    func.func @f(%a: tensor<2x3xf32>, %b: tensor<4x5xf32>) -> tensor<2x5xf32> {
      %0 = ernie.matmul %a, %b : tensor<2x3xf32>, tensor<4x5xf32> -> tensor<2x5xf32>
      return %0 : tensor<2x5xf32>
    })mlir";
  std::string diagnostics;
  ScopedDiagnosticHandler handler(&context, [&](Diagnostic &diag) {
    diagnostics += diag.str();
    return success();
  });
  OwningOpRef<ModuleOp> parsed = parseSourceString<ModuleOp>(source, &context);
  EXPECT_FALSE(parsed);
  EXPECT_NE(diagnostics.find("contraction sizes differ"), std::string::npos)
      << diagnostics;
}

} // namespace

//===- ErnieFolds.cpp - folders and canonicalization patterns ---------------===//
//
// Algebraic identities (x + 0, x * 1, neg(neg x)), identity shape ops,
// composition of chained shape ops, and constant folding where the compiler
// computes exactly what the runtime would: f32/f64 and integer arithmetic
// only (narrower floats are computed in f32 and rounded by the runtime, which
// APFloat's direct rounding would not always match).
//
//===----------------------------------------------------------------------===//

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"

#include "mlir/Dialect/CommonFolders.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/TypeUtilities.h"

#include <cmath>
#include "mlir/IR/PatternMatch.h"

using namespace mlir;
using namespace mlir::ernie;

//===----------------------------------------------------------------------===//
// Helpers.
//===----------------------------------------------------------------------===//

/// True when constant folding `type`'s elements matches the runtime bit for bit.
static bool isExactlyFoldable(Type type) {
  Type element = getElementTypeOrSelf(type);
  return element.isF32() || element.isF64() || element.isSignlessInteger(32) ||
         element.isSignlessInteger(64);
}

/// True when `attr` is a constant whose every element equals `value`; for
/// floats the sign of a zero counts (x + (-0.0) is x, x + 0.0 is not for
/// x = -0.0).
static bool isSplatOf(Attribute attr, double value) {
  auto splat = dyn_cast_or_null<SplatElementsAttr>(attr);
  if (!splat)
    return false;
  Type element = splat.getElementType();
  if (isa<FloatType>(element)) {
    APFloat v = splat.getSplatValue<APFloat>();
    return v.isExactlyValue(value) &&
           (!v.isZero() || v.isNegative() == std::signbit(value));
  }
  if (isa<IntegerType>(element) && !element.isInteger(1))
    return splat.getSplatValue<APInt>().getSExtValue() ==
           static_cast<int64_t>(value);
  return false;
}

/// Elementwise binary constant folding on f32/f64/i32/i64 operands.
template <typename FloatFn, typename IntFn>
static Attribute foldBinary(Type type, ArrayRef<Attribute> operands,
                            FloatFn floatFn, IntFn intFn) {
  if (!isExactlyFoldable(type) || !operands[0] || !operands[1])
    return {};
  if (isa<FloatType>(getElementTypeOrSelf(type)))
    return constFoldBinaryOp<FloatAttr, APFloat, void>(operands, floatFn);
  return constFoldBinaryOpConditional<IntegerAttr, APInt, void>(operands,
                                                                intFn);
}

/// The splat constant `attr` reshaped to `type`, if `attr` is a splat.
static Attribute reshapeSplat(Attribute attr, Type type) {
  auto splat = dyn_cast_or_null<SplatElementsAttr>(attr);
  if (!splat)
    return {};
  return SplatElementsAttr::get(cast<ShapedType>(type),
                                splat.getSplatValue<Attribute>());
}

//===----------------------------------------------------------------------===//
// Creation.
//===----------------------------------------------------------------------===//

OpFoldResult ConstantOp::fold(FoldAdaptor) { return getValue(); }

OpFoldResult FullOp::fold(FoldAdaptor) {
  return SplatElementsAttr::get(getType(), getValue());
}

//===----------------------------------------------------------------------===//
// Elementwise.
//===----------------------------------------------------------------------===//

OpFoldResult NegOp::fold(FoldAdaptor adaptor) {
  if (auto inner = getOperand().getDefiningOp<NegOp>())
    return inner.getOperand();
  if (!isExactlyFoldable(getType()) || !adaptor.getOperand())
    return {};
  if (isa<FloatType>(getType().getElementType()))
    return constFoldUnaryOp<FloatAttr, APFloat, void>(
        adaptor.getOperands(), [](const APFloat &a) { return -a; });
  return constFoldUnaryOp<IntegerAttr, APInt, void>(
      adaptor.getOperands(), [](const APInt &a) { return -a; });
}

OpFoldResult CastOp::fold(FoldAdaptor) {
  if (getOperand().getType() == getType())
    return getOperand();
  return {};
}

/// The additive identity: -0.0 for floats (x + -0.0 == x for every x,
/// -0.0 included), 0 for integers.
static double additiveIdentity(Type type) {
  return isa<FloatType>(getElementTypeOrSelf(type)) ? -0.0 : 0.0;
}

OpFoldResult AddOp::fold(FoldAdaptor adaptor) {
  double zero = additiveIdentity(getType());
  if (isSplatOf(adaptor.getRhs(), zero))
    return getLhs();
  if (isSplatOf(adaptor.getLhs(), zero))
    return getRhs();
  return foldBinary(
      getType(), adaptor.getOperands(),
      [](const APFloat &a, const APFloat &b) { return a + b; },
      [](const APInt &a, const APInt &b) -> std::optional<APInt> {
        return a + b;
      });
}

/// x - (+0.0) == x for every x, -0.0 included.
OpFoldResult SubOp::fold(FoldAdaptor adaptor) {
  if (isSplatOf(adaptor.getRhs(), 0.0))
    return getLhs();
  return foldBinary(
      getType(), adaptor.getOperands(),
      [](const APFloat &a, const APFloat &b) { return a - b; },
      [](const APInt &a, const APInt &b) -> std::optional<APInt> {
        return a - b;
      });
}

OpFoldResult MulOp::fold(FoldAdaptor adaptor) {
  if (isSplatOf(adaptor.getRhs(), 1.0))
    return getLhs();
  if (isSplatOf(adaptor.getLhs(), 1.0))
    return getRhs();
  return foldBinary(
      getType(), adaptor.getOperands(),
      [](const APFloat &a, const APFloat &b) { return a * b; },
      [](const APInt &a, const APInt &b) -> std::optional<APInt> {
        return a * b;
      });
}

OpFoldResult DivOp::fold(FoldAdaptor adaptor) {
  if (isSplatOf(adaptor.getRhs(), 1.0))
    return getLhs();
  return foldBinary(
      getType(), adaptor.getOperands(),
      [](const APFloat &a, const APFloat &b) { return a / b; },
      [](const APInt &a, const APInt &b) -> std::optional<APInt> {
        // Division by zero and INT_MIN / -1 are the runtime's to report.
        if (b.isZero() || (a.isMinSignedValue() && b.isAllOnes()))
          return std::nullopt;
        return a.sdiv(b);
      });
}

OpFoldResult MaximumOp::fold(FoldAdaptor adaptor) {
  if (getLhs() == getRhs())
    return getLhs();
  return foldBinary(
      getType(), adaptor.getOperands(),
      [](const APFloat &a, const APFloat &b) { return llvm::maximum(a, b); },
      [](const APInt &a, const APInt &b) -> std::optional<APInt> {
        return a.sge(b) ? a : b;
      });
}

OpFoldResult MinimumOp::fold(FoldAdaptor adaptor) {
  if (getLhs() == getRhs())
    return getLhs();
  return foldBinary(
      getType(), adaptor.getOperands(),
      [](const APFloat &a, const APFloat &b) { return llvm::minimum(a, b); },
      [](const APInt &a, const APInt &b) -> std::optional<APInt> {
        return a.sle(b) ? a : b;
      });
}

OpFoldResult PowOp::fold(FoldAdaptor adaptor) {
  if (isSplatOf(adaptor.getRhs(), 1.0))
    return getLhs();
  return {};
}

OpFoldResult SelectOp::fold(FoldAdaptor adaptor) {
  if (getOnTrue() == getOnFalse())
    return getOnTrue();
  if (auto cond = dyn_cast_or_null<SplatElementsAttr>(adaptor.getCond()))
    return cond.getSplatValue<bool>() ? getOnTrue() : getOnFalse();
  return {};
}

//===----------------------------------------------------------------------===//
// Reductions.
//===----------------------------------------------------------------------===//

/// A reduction that keeps the type (no axes, or only size-1 axes kept) is the
/// identity.
template <typename ReduceOp>
static OpFoldResult foldIdentityReduce(ReduceOp op) {
  if (op.getInput().getType() != op.getType())
    return {};
  auto type = cast<ShapedType>(op.getType());
  for (int64_t axis : op.getAxes())
    if (type.getDimSize(axis) != 1)
      return {};
  return op.getInput();
}

OpFoldResult ReduceSumOp::fold(FoldAdaptor) { return foldIdentityReduce(*this); }
OpFoldResult ReduceMeanOp::fold(FoldAdaptor) {
  return foldIdentityReduce(*this);
}
OpFoldResult ReduceMaxOp::fold(FoldAdaptor) { return foldIdentityReduce(*this); }

//===----------------------------------------------------------------------===//
// Shape ops.
//===----------------------------------------------------------------------===//

OpFoldResult ReshapeOp::fold(FoldAdaptor adaptor) {
  if (getInput().getType() == getType())
    return getInput();
  if (auto inner = getInput().getDefiningOp<ReshapeOp>()) {
    getInputMutable().assign(inner.getInput());
    return getResult();
  }
  if (auto dense = dyn_cast_or_null<DenseElementsAttr>(adaptor.getInput()))
    return dense.reshape(cast<ShapedType>(getType()));
  return {};
}

OpFoldResult TransposeOp::fold(FoldAdaptor adaptor) {
  ArrayRef<int64_t> perm = getPerm();
  if (llvm::equal(perm, llvm::seq<int64_t>(0, perm.size())))
    return getInput();
  if (auto inner = getInput().getDefiningOp<TransposeOp>()) {
    // result[i] = inner[perm[i]] = x[innerPerm[perm[i]]]
    SmallVector<int64_t> composed;
    for (int64_t p : perm)
      composed.push_back(inner.getPerm()[p]);
    getInputMutable().assign(inner.getInput());
    setPerm(composed);
    if (llvm::equal(composed, llvm::seq<int64_t>(0, composed.size())))
      return getInput();
    return getResult();
  }
  return reshapeSplat(adaptor.getInput(), getType());
}

OpFoldResult BroadcastOp::fold(FoldAdaptor adaptor) {
  if (getInput().getType() == getType())
    return getInput();
  return reshapeSplat(adaptor.getInput(), getType());
}

namespace {
/// broadcast(broadcast(x, d1), d2) -> broadcast(x, d2 ∘ d1).
struct ComposeBroadcasts : OpRewritePattern<BroadcastOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(BroadcastOp op,
                                PatternRewriter &rewriter) const override {
    auto inner = op.getInput().getDefiningOp<BroadcastOp>();
    if (!inner)
      return failure();
    SmallVector<int64_t> dims;
    for (int64_t d : inner.getDims())
      dims.push_back(op.getDims()[d]);
    rewriter.replaceOpWithNewOp<BroadcastOp>(op, op.getType(),
                                             inner.getInput(), dims);
    return success();
  }
};
} // namespace

void BroadcastOp::getCanonicalizationPatterns(RewritePatternSet &results,
                                              MLIRContext *context) {
  results.add<ComposeBroadcasts>(context);
}

OpFoldResult SliceOp::fold(FoldAdaptor adaptor) {
  if (getInput().getType() == getType() &&
      llvm::all_of(getStart(), [](int64_t s) { return s == 0; }))
    return getInput();
  return reshapeSplat(adaptor.getInput(), getType());
}

OpFoldResult ConcatOp::fold(FoldAdaptor) {
  if (getInputs().size() == 1)
    return getInputs().front();
  return {};
}

//===----------------------------------------------------------------------===//
// Collectives: only the local ones fold.
//===----------------------------------------------------------------------===//

OpFoldResult ShardSliceOp::fold(FoldAdaptor adaptor) {
  return reshapeSplat(adaptor.getInput(), getType());
}

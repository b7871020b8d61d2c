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

namespace {
/// Whether every use of `value` is a shard_slice taking the same piece as
/// `slice` (same group, dimension, shift and type): then whatever computes
/// `value` may compute just that piece.
bool onlySlicedLike(Value value, ShardSliceOp slice) {
  return llvm::all_of(value.getUsers(), [&](Operation *user) {
    auto other = dyn_cast<ShardSliceOp>(user);
    return other && other.getMesh() == slice.getMesh() &&
           other.getAxes() == slice.getAxes() &&
           other.getDim() == slice.getDim() &&
           other.getShift() == slice.getShift() &&
           other.getType() == slice.getType();
  });
}

/// `slice`'s piece of `value` (same group, dimension and shift), a value of
/// `value`'s element type.
Value slicedLike(PatternRewriter &rewriter, ShardSliceOp slice, Value value,
                 int64_t dim) {
  auto type = cast<RankedTensorType>(value.getType());
  SmallVector<int64_t> shape(type.getShape());
  shape[dim] = slice.getType().getDimSize(slice.getDim());
  return ShardSliceOp::create(
      rewriter, slice.getLoc(),
      RankedTensorType::get(shape, type.getElementType()), value,
      slice.getMeshAttr(), slice.getAxesAttr(),
      rewriter.getI64IntegerAttr(dim), slice.getShiftAttr());
}

/// Replaces every slice of `producer`'s result (all alike) by `local`.
void replaceSlices(PatternRewriter &rewriter, Operation *producer,
                   Value local) {
  for (Operation *user :
       llvm::make_early_inc_range(producer->getResult(0).getUsers()))
    rewriter.replaceOp(user, local);
  rewriter.eraseOp(producer);
}

/// `producer` (its attributes and marks kept) recomputed on `operands` as
/// `slice`'s piece, in place of its slices.
void computeSlicedProducer(PatternRewriter &rewriter, Operation *producer,
                           ValueRange operands, ShardSliceOp slice) {
  Operation *local = rewriter.clone(*producer);
  local->setOperands(operands);
  local->getResult(0).setType(slice.getType());
  replaceSlices(rewriter, producer, local->getResult(0));
}

/// slice(f(a, b, ...)) -> f(slice(a), slice(b), ...) for an elementwise f
/// whose result is only ever sliced this way: the same elements, computed on
/// 1/n of the data (a norm's gradient computed whole and then cut to the
/// rank's hidden piece; it also exposes the all-reduce at its root).
struct SliceElementwiseOperands : OpRewritePattern<ShardSliceOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(ShardSliceOp slice,
                                PatternRewriter &rewriter) const override {
    Operation *producer = slice.getInput().getDefiningOp();
    if (!producer || producer->getNumResults() != 1 ||
        producer->getNumRegions() != 0 ||
        !producer->hasTrait<OpTrait::Elementwise>() || !isPure(producer) ||
        producer->getNumOperands() == 0)
      return failure();
    ArrayRef<int64_t> shape = slice.getInput().getType().getShape();
    for (Value operand : producer->getOperands()) {
      auto type = dyn_cast<RankedTensorType>(operand.getType());
      if (!type || type.getShape() != shape)
        return failure();
    }
    if (!onlySlicedLike(slice.getInput(), slice))
      return failure();
    rewriter.setInsertionPoint(producer);
    SmallVector<Value> operands;
    for (Value operand : producer->getOperands())
      operands.push_back(slicedLike(rewriter, slice, operand, slice.getDim()));
    computeSlicedProducer(rewriter, producer, operands, slice);
    return success();
  }
};

/// slice(broadcast(x)) -> broadcast(slice(x)), or broadcast(x) straight to
/// the piece where the sliced dimension is new or expanded from size 1.
struct SliceBroadcastInput : OpRewritePattern<ShardSliceOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(ShardSliceOp slice,
                                PatternRewriter &rewriter) const override {
    auto broadcast = slice.getInput().getDefiningOp<BroadcastOp>();
    if (!broadcast || !onlySlicedLike(broadcast.getResult(), slice))
      return failure();
    rewriter.setInsertionPoint(broadcast);
    Value input = broadcast.getInput();
    auto inputType = cast<RankedTensorType>(input.getType());
    for (auto [k, d] : llvm::enumerate(broadcast.getDims()))
      if (d == static_cast<int64_t>(slice.getDim()) &&
          inputType.getDimSize(k) != 1)
        input = slicedLike(rewriter, slice, input, k);
    computeSlicedProducer(rewriter, broadcast, input, slice);
    return success();
  }
};

/// slice(all_reduce(x)) over the same axes -> reduce_scatter(x): each rank
/// receives only the piece it keeps. The engines reduce both in group
/// order, so the piece has the same bits.
struct ReduceScatterSlicedAllReduce : OpRewritePattern<ShardSliceOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(ShardSliceOp slice,
                                PatternRewriter &rewriter) const override {
    auto reduce = slice.getInput().getDefiningOp<AllReduceOp>();
    if (!reduce || slice.getShift() != 0 ||
        reduce.getMesh() != slice.getMesh() ||
        reduce.getAxes() != slice.getAxes() ||
        !onlySlicedLike(reduce.getResult(), slice))
      return failure();
    rewriter.setInsertionPoint(reduce);
    Value local = ReduceScatterOp::create(
        rewriter, reduce.getLoc(), slice.getType(), reduce.getInput(),
        reduce.getMeshAttr(), reduce.getAxesAttr(), slice.getDimAttr(),
        reduce.getKindAttr());
    replaceSlices(rewriter, reduce, local);
    return success();
  }
};
} // namespace

namespace {
/// all_reduce(cast(r)) with r a reduction's wider float result, narrowed by
/// the cast -> cast(all_reduce(r)): the ranks' partial sums are added in
/// the reduction's own precision and rounded once (Megatron's f32 loss and
/// norm statistics), instead of each partial being rounded first. Only for
/// sums and means of reductions: their results are small (a loss, per-row
/// statistics), so the wider message costs nothing; a narrowed gradient is
/// left to the bucket's `accumulate`.
struct SumReductionsBeforeNarrowing : OpRewritePattern<AllReduceOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(AllReduceOp reduce,
                                PatternRewriter &rewriter) const override {
    CastOp cast = getNarrowingCast(reduce.getInput());
    if (!cast || (reduce.getKind() != ReduceKind::sum &&
                  reduce.getKind() != ReduceKind::avg))
      return failure();
    Value wide = cast.getOperand();
    if (!isa_and_nonnull<ReduceSumOp, ReduceMeanOp>(wide.getDefiningOp()))
      return failure();
    Value summed = AllReduceOp::create(rewriter, reduce.getLoc(),
                                       wide.getType(), wide,
                                       reduce.getMeshAttr(),
                                       reduce.getAxesAttr(),
                                       reduce.getKindAttr());
    rewriter.replaceOpWithNewOp<CastOp>(reduce, reduce.getType(), summed);
    return success();
  }
};
} // namespace

void AllReduceOp::getCanonicalizationPatterns(RewritePatternSet &results,
                                              MLIRContext *context) {
  results.add<SumReductionsBeforeNarrowing>(context);
}

void ShardSliceOp::getCanonicalizationPatterns(RewritePatternSet &results,
                                               MLIRContext *context) {
  results.add<SliceElementwiseOperands, SliceBroadcastInput,
              ReduceScatterSlicedAllReduce>(context);
}

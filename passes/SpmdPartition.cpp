//===- SpmdPartition.cpp - the per-rank program ------------------------------===//
//
// Global shapes become local ones, reshards become collectives, and the few
// ops whose local form is not the op itself on local shapes are expanded.
//
//===----------------------------------------------------------------------===//

#include "ernie/Cost/CostModel.h"
#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Dialect/Ernie/IR/Sharding.h"
#include "ernie/Passes/Passes.h"
#include "ernie/Sharding/Resharding.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/StringExtras.h"

#include <map>
#include <optional>

#define DEBUG_TYPE "ernie-spmd-partition"

namespace mlir::ernie {
#define GEN_PASS_DEF_SPMDPARTITIONPASS
#include "ernie/Passes/Passes.h.inc"
} // namespace mlir::ernie

using namespace mlir;
using namespace mlir::ernie;

namespace {

class Partitioner {
public:
  Partitioner(ModuleOp module, const MeshShape &mesh)
      : module(module), mesh(mesh) {}

  LogicalResult run();

private:
  LogicalResult collectShardings();
  LogicalResult partitionFunction(func::FuncOp func);
  LogicalResult partitionDeclaration(func::FuncOp func);
  LogicalResult setLocalType(Value value, Operation *where);
  FailureOr<Value> emitReshard(OpBuilder &builder, Location loc, Value input,
                               ShardingAttr from, ShardingAttr to,
                               RankedTensorType globalType);
  LogicalResult expandEmbedding(EmbeddingOp op);
  Attribute paddedGlobalShape(Value local);
  Value maskPadding(OpBuilder &b, Location loc, Value local, int64_t dim,
                    Attribute fill);
  void maskPaddedOperands(Operation *op);
  Value paddedTo(OpBuilder &b, Location loc, Value v, int64_t dim,
                 int64_t size);
  Value slicedTo(OpBuilder &b, Location loc, Value v, int64_t dim,
                 int64_t size);
  LogicalResult checkTiles(ReshapeOp cut);
  LogicalResult expandCrossEntropy(Operation *op);

  ModuleOp module;
  MeshShape mesh;
  llvm::DenseMap<Value, ShardingAttr> shardings;
  llvm::DenseMap<Value, RankedTensorType> globalTypes;
};

LogicalResult Partitioner::collectShardings() {
  WalkResult walk = module.walk([&](Operation *op) -> WalkResult {
    if (auto func = dyn_cast<func::FuncOp>(op)) {
      if (func.isDeclaration())
        return WalkResult::advance();
      for (BlockArgument arg : func.getArguments())
        if (auto s = func.getArgAttrOfType<ShardingAttr>(arg.getArgNumber(),
                                                         kShardingAttrName))
          shardings[arg] = s;
      return WalkResult::advance();
    }
    if (auto reshard = dyn_cast<ReshardOp>(op)) {
      shardings[reshard.getResult()] = reshard.getSharding();
      return WalkResult::advance();
    }
    auto given = op->getAttrOfType<ArrayAttr>(kResultShardingsAttrName);
    for (auto [i, result] : llvm::enumerate(op->getResults())) {
      if (!isa<RankedTensorType>(result.getType()))
        continue;
      if (!given) {
        op->emitError() << "result #" << i
                        << " has no sharding; run "
                           "--ernie-sharding-propagation first";
        return WalkResult::interrupt();
      }
      shardings[result] = cast<ShardingAttr>(given[i]);
    }
    return WalkResult::advance();
  });
  return failure(walk.wasInterrupted());
}

LogicalResult Partitioner::setLocalType(Value value, Operation *where) {
  auto type = dyn_cast<RankedTensorType>(value.getType());
  ShardingAttr sharding = shardings.lookup(value);
  if (!type || !sharding)
    return success();
  globalTypes[value] = type;
  FailureOr<RankedTensorType> local = getLocalType(type, sharding, mesh);
  if (failed(local)) {
    InFlightDiagnostic diag = where->emitError();
    diag << "value of type " << type << " cannot be split as " << sharding
         << ": a dimension does not divide over its mesh axes (the mesh "
            "asks for even splits: '"
         << kEvenSplitsAttrName << "')";
    return diag;
  }
  value.setType(*local);
  return success();
}

FailureOr<Value> Partitioner::emitReshard(OpBuilder &builder, Location loc,
                                          Value input, ShardingAttr from,
                                          ShardingAttr to,
                                          RankedTensorType globalType) {
  FailureOr<SmallVector<ReshardStep>> plan =
      planReshard(from, to, globalType, mesh);
  if (failed(plan))
    return emitError(loc) << "no way to reshard " << globalType << " from "
                          << from << " to " << to;
  Value current = input;
  for (const ReshardStep &step : *plan) {
    auto localType = *getLocalType(globalType, step.after, mesh);
    auto kind = ReduceKindAttr::get(builder.getContext(), step.reduce);
    SmallVector<Attribute> names;
    for (StringRef axis : step.axes)
      names.push_back(builder.getStringAttr(axis));
    ArrayAttr axes = builder.getArrayAttr(names);
    // Uneven splits: a scatter needs n equal parts of what it splits (pad
    // the piece first); a gather yields n padded pieces, of which the new
    // piece is the front (slice the rest off).
    int64_t n = mesh.product(step.axes);
    auto extent = [&](Value v, int64_t d) {
      return cast<RankedTensorType>(v.getType()).getDimSize(d);
    };
    switch (step.kind) {
    case ReshardStep::Kind::ReduceScatter:
    case ReshardStep::Kind::ShardSlice:
      current = paddedTo(builder, loc, current, step.dim,
                         n * localType.getDimSize(step.dim));
      break;
    case ReshardStep::Kind::AllToAll:
      current = paddedTo(builder, loc, current, step.toDim,
                         n * localType.getDimSize(step.toDim));
      break;
    default:
      break;
    }
    auto gathered = [&](int64_t d) {
      SmallVector<int64_t> shape(localType.getShape());
      shape[d] = n * extent(current, d);
      return RankedTensorType::get(shape, localType.getElementType());
    };
    switch (step.kind) {
    case ReshardStep::Kind::AllReduce:
      current = AllReduceOp::create(builder, loc, current.getType(), current,
                                    mesh.name, axes, kind);
      break;
    case ReshardStep::Kind::ReduceScatter:
      current = ReduceScatterOp::create(builder, loc, localType, current,
                                        mesh.name, axes,
                                        builder.getI64IntegerAttr(step.dim), kind);
      break;
    case ReshardStep::Kind::AllGather:
      current = AllGatherOp::create(builder, loc, gathered(step.dim), current,
                                    mesh.name, axes,
                                    builder.getI64IntegerAttr(step.dim));
      current = slicedTo(builder, loc, current, step.dim,
                         localType.getDimSize(step.dim));
      break;
    case ReshardStep::Kind::AllToAll:
      current = AllToAllOp::create(builder, loc, gathered(step.dim), current,
                                   mesh.name, axes,
                                   builder.getI64IntegerAttr(step.toDim),
                                   builder.getI64IntegerAttr(step.dim));
      current = slicedTo(builder, loc, current, step.dim,
                         localType.getDimSize(step.dim));
      break;
    case ReshardStep::Kind::ShardSlice:
      current = ShardSliceOp::create(builder, loc, localType, current,
                                     mesh.name, axes,
                                     builder.getI64IntegerAttr(step.dim));
      break;
    case ReshardStep::Kind::PartialInit:
      current = PartialInitOp::create(builder, loc, current.getType(),
                                      current, mesh.name, axes, kind);
      break;
    }
  }
  return current;
}

/// `v` with dimension `dim` grown to `size` by trailing zeros (a no-op when
/// it already has that size).
Value Partitioner::paddedTo(OpBuilder &b, Location loc, Value v, int64_t dim,
                            int64_t size) {
  auto type = cast<RankedTensorType>(v.getType());
  if (type.getDimSize(dim) == size)
    return v;
  SmallVector<int64_t> low(type.getRank(), 0), high(type.getRank(), 0);
  high[dim] = size - type.getDimSize(dim);
  return PadOp::create(b, loc, v, b.getDenseI64ArrayAttr(low),
                       b.getDenseI64ArrayAttr(high),
                       b.getDenseI64ArrayAttr(low));
}

/// The first `size` entries of `v` along `dim`.
Value Partitioner::slicedTo(OpBuilder &b, Location loc, Value v, int64_t dim,
                            int64_t size) {
  auto type = cast<RankedTensorType>(v.getType());
  if (type.getDimSize(dim) == size)
    return v;
  SmallVector<int64_t> start(type.getRank(), 0), step(type.getRank(), 1);
  SmallVector<int64_t> limit(type.getShape());
  limit[dim] = size;
  return SliceOp::create(b, loc, v, b.getDenseI64ArrayAttr(start),
                         b.getDenseI64ArrayAttr(limit),
                         b.getDenseI64ArrayAttr(step));
}

/// `local` (this rank's piece of an unevenly split value) with the padding
/// of dimension `dim` replaced by `fill`: the entries at or past the global
/// size, found from the rank's index over the dimension's axes.
Value Partitioner::maskPadding(OpBuilder &b, Location loc, Value local,
                               int64_t dim, Attribute fill) {
  auto type = cast<RankedTensorType>(local.getType());
  RankedTensorType global = globalTypes.lookup(local);
  SmallVector<Attribute> names;
  for (StringRef axis : shardings.lookup(local).getDimAxes(dim))
    names.push_back(b.getStringAttr(axis));
  auto i64 = b.getI64Type();
  auto scalar = RankedTensorType::get({}, i64);
  auto positions = RankedTensorType::get(type.getShape(), i64);
  Value index =
      AxisIndexOp::create(b, loc, scalar, mesh.name, b.getArrayAttr(names));
  Value first = MulOp::create(
      b, loc, index,
      FullOp::create(b, loc, scalar,
                     IntegerAttr::get(i64, type.getDimSize(dim))));
  // Entries this rank holds for real: global size - first, counted locally.
  Value real = SubOp::create(
      b, loc,
      FullOp::create(b, loc, scalar,
                     IntegerAttr::get(i64, global.getDimSize(dim))),
      first);
  Value inside = CompareOp::create(
      b, loc, CompareDirection::lt, IotaOp::create(b, loc, positions, dim),
      BroadcastOp::create(b, loc, positions, real, b.getDenseI64ArrayAttr({})));
  Value masked = SelectOp::create(b, loc, inside, local,
                                  FullOp::create(b, loc, type, cast<TypedAttr>(fill)));
  shardings[masked] = shardings.lookup(local);
  globalTypes[masked] = global;
  return masked;
}

/// The identity of a reduction, as an attribute of `element`: what padding
/// must hold for it not to change the result.
static Attribute reductionIdentity(ReduceKind kind, Type element) {
  if (auto f = dyn_cast<FloatType>(element)) {
    const llvm::fltSemantics &sem = f.getFloatSemantics();
    switch (kind) {
    case ReduceKind::max:
      return FloatAttr::get(f, llvm::APFloat::getInf(sem, /*Negative=*/true));
    case ReduceKind::min:
      return FloatAttr::get(f, llvm::APFloat::getInf(sem, /*Negative=*/false));
    default:
      return FloatAttr::get(f, 0.0);
    }
  }
  auto i = cast<IntegerType>(element);
  unsigned w = i.getWidth();
  switch (kind) {
  case ReduceKind::max:
    return IntegerAttr::get(i, w == 1 ? llvm::APInt(1, 0)
                                      : llvm::APInt::getSignedMinValue(w));
  case ReduceKind::min:
    return IntegerAttr::get(i, w == 1 ? llvm::APInt(1, 1)
                                      : llvm::APInt::getSignedMaxValue(w));
  default:
    return IntegerAttr::get(i, 0);
  }
}

/// Padding must not reach a result: where an op reduces over an unevenly
/// split dimension (a Reduction factor of its rule), that dimension's
/// padding in each operand becomes the reduction's identity (zero for a
/// sum or a contraction, -inf for a max). Elementwise work on padding only
/// makes more padding, so nothing else needs it. The cross-entropies reduce
/// their vocabulary through a log-sum-exp (padding -inf) and their tokens
/// through the labels (padding ignore_index); a mean over padding divides
/// by the padded count, so it is rescaled to the real one. Lookup indices
/// get zeros: padding computed from padding could index out of range.
void Partitioner::maskPaddedOperands(Operation *op) {
  auto ruleOp = dyn_cast<ShardingRuleOpInterface>(op);
  if (!ruleOp)
    return;
  auto paddedDim = [&](Value v, int64_t d) {
    RankedTensorType global = globalTypes.lookup(v);
    ShardingAttr s = shardings.lookup(v);
    return global && s && d < s.getRank() &&
           global.getDimSize(d) % mesh.product(s.getDimAxes(d)) != 0;
  };
  bool anyPadded = false;
  for (Value v : op->getOperands())
    if (auto t = dyn_cast<RankedTensorType>(v.getType()))
      for (int64_t d = 0; d < t.getRank(); ++d)
        anyPadded |= paddedDim(v, d);
  if (!anyPadded)
    return;

  OpShardingRule rule = ruleOp.getShardingRule();
  bool crossEntropy = isa<CrossEntropyOp, CrossEntropyGradOp>(op);
  OpBuilder b(op);
  Location loc = op->getLoc();
  double meanScale = 1.0;
  for (auto [i, dims] : llvm::enumerate(rule.operands)) {
    Value v = op->getOperand(i);
    auto type = dyn_cast<RankedTensorType>(v.getType());
    if (!type)
      continue;
    for (auto [d, factors] : llvm::enumerate(dims)) {
      if (!paddedDim(v, d))
        continue;
      int64_t rank = type.getRank();
      Attribute fill;
      if (crossEntropy) {
        if (i == 0 && static_cast<int64_t>(d) == rank - 1)
          fill = reductionIdentity(ReduceKind::max, type.getElementType());
        else if (i == 1)
          fill = IntegerAttr::get(
              type.getElementType(),
              isa<CrossEntropyOp>(op)
                  ? cast<CrossEntropyOp>(op).getIgnoreIndex()
                  : cast<CrossEntropyGradOp>(op).getIgnoreIndex());
      } else if ((isa<EmbeddingOp>(op) && i == 0) ||
                 (isa<GatherOp>(op) && i == 1)) {
        // Indices: padding computed from padding could be out of range.
        fill = IntegerAttr::get(type.getElementType(), 0);
      } else {
        for (int64_t f : factors)
          if (rule.factors[f].kind == FactorKind::Reduction) {
            fill = reductionIdentity(rule.factors[f].reduceKind,
                                     type.getElementType());
            if (isa<ReduceMeanOp>(op)) {
              int64_t global = globalTypes.lookup(v).getDimSize(d);
              int64_t parts = mesh.product(shardings.lookup(v).getDimAxes(d));
              meanScale *= static_cast<double>(type.getDimSize(d) * parts) /
                           static_cast<double>(global);
            }
          }
      }
      if (!fill)
        continue;
      v = maskPadding(b, loc, v, d, fill);
      op->setOperand(i, v);
    }
  }
  if (meanScale != 1.0) {
    b.setInsertionPointAfter(op);
    Value mean = op->getResult(0);
    Value scaled = MulOp::create(
        b, loc, mean,
        FullOp::create(b, loc, cast<RankedTensorType>(mean.getType()),
                       FloatAttr::get(getElementTypeOrSelf(mean), meanScale)));
    shardings[scaled] = shardings.lookup(mean);
    globalTypes[scaled] = globalTypes.lookup(mean);
    mean.replaceAllUsesExcept(scaled, scaled.getDefiningOp());
  }
}

/// A vocabulary-split table: look up the rows this rank owns (ids shifted by
/// its first row), zero the others; the sum over the vocabulary axes is the
/// global lookup, as the result's Partial sharding says.
LogicalResult Partitioner::expandEmbedding(EmbeddingOp op) {
  ShardingAttr table = shardings.lookup(op.getWeight());
  SmallVector<StringRef> vocabAxes = table.getDimAxes(0);
  OpBuilder b(op);
  Location loc = op.getLoc();
  auto ids = cast<RankedTensorType>(op.getIndices().getType());
  auto weight = cast<RankedTensorType>(op.getWeight().getType());
  auto result = cast<RankedTensorType>(op.getType());
  Type idType = ids.getElementType();
  auto scalar = [&](Type element) { return RankedTensorType::get({}, element); };

  SmallVector<Attribute> axisNames;
  for (StringRef axis : vocabAxes)
    axisNames.push_back(b.getStringAttr(axis));
  Value index = AxisIndexOp::create(b, loc, scalar(b.getI64Type()), mesh.name,
                                    b.getArrayAttr(axisNames));
  if (idType != b.getI64Type())
    index = CastOp::create(b, loc, scalar(idType), index);
  int64_t rows = weight.getDimSize(0);
  Value rowsScalar = FullOp::create(b, loc, scalar(idType),
                                    IntegerAttr::get(idType, rows));
  Value firstRow = MulOp::create(b, loc, index, rowsScalar);
  Value offset = BroadcastOp::create(b, loc, ids, firstRow,
                                     b.getDenseI64ArrayAttr({}));
  Value local = SubOp::create(b, loc, op.getIndices(), offset);
  Value zero = FullOp::create(b, loc, ids, IntegerAttr::get(idType, 0));
  Value limit = FullOp::create(b, loc, ids, IntegerAttr::get(idType, rows));
  Value geZero = CompareOp::create(b, loc, CompareDirection::ge, local, zero);
  Value ltRows = CompareOp::create(b, loc, CompareDirection::lt, local, limit);
  auto maskType = cast<RankedTensorType>(geZero.getType());
  Value no = FullOp::create(b, loc, maskType, b.getBoolAttr(false));
  Value owned = SelectOp::create(b, loc, geZero, ltRows, no);
  Value safe = SelectOp::create(b, loc, owned, local, zero);
  Value rowsOut = EmbeddingOp::create(b, loc, result, safe, op.getWeight(),
                                      IntegerAttr());
  SmallVector<int64_t> keep = llvm::to_vector(llvm::seq<int64_t>(0, ids.getRank()));
  auto wideMask = RankedTensorType::get(result.getShape(), b.getI1Type());
  Value ownedWide = BroadcastOp::create(b, loc, wideMask, owned,
                                        b.getDenseI64ArrayAttr(keep));
  Value zeros = FullOp::create(
      b, loc, result, FloatAttr::get(result.getElementType(), 0.0));
  Value out = SelectOp::create(b, loc, ownedWide, rowsOut, zeros);
  shardings[out] = shardings.lookup(op.getResult());
  globalTypes[out] = globalTypes.lookup(op.getResult());
  op.getResult().replaceAllUsesWith(out);
  op.erase();
  return success();
}

/// A vocabulary-split cross-entropy (Megatron's vocab-parallel loss): the
/// log-sum-exp is completed with a max and a sum all-reduce over the
/// vocabulary axes; each rank picks the label logits it owns. The loss
/// contributes `lse / n - picked` per rank (a pending sum, as the result's
/// sharding says); the gradient is `softmax - one_hot` on the local columns.
LogicalResult Partitioner::expandCrossEntropy(Operation *op) {
  bool isGrad = isa<CrossEntropyGradOp>(op);
  Value logits = op->getOperand(0), labels = op->getOperand(1);
  SmallVector<StringRef> vocabAxes = shardings.lookup(logits).getDimAxes(
      cast<RankedTensorType>(globalTypes.lookup(logits)).getRank() - 1);
  int64_t ignore = isGrad ? static_cast<int64_t>(
                                cast<CrossEntropyGradOp>(op).getIgnoreIndex())
                          : static_cast<int64_t>(
                                cast<CrossEntropyOp>(op).getIgnoreIndex());
  LossReduction reduction = isGrad ? cast<CrossEntropyGradOp>(op).getReduction()
                                   : cast<CrossEntropyOp>(op).getReduction();
  OpBuilder b(op);
  Location loc = op->getLoc();
  MLIRContext *ctx = op->getContext();
  // Narrow logits (bf16, f16) compute in f32, as Megatron's vocab-parallel
  // loss does: the max, the sum of exponentials and their all-reduces are
  // f32, and only the result is rounded to its type.
  auto narrow = [](Type t) { return isa<FloatType>(t) && !t.isF32() && !t.isF64(); };
  auto widen = [&](Value v) -> Value {
    auto t = cast<RankedTensorType>(v.getType());
    if (!narrow(t.getElementType()))
      return v;
    return CastOp::create(b, loc, RankedTensorType::get(t.getShape(), b.getF32Type()), v);
  };
  logits = widen(logits);
  auto lt = cast<RankedTensorType>(logits.getType());
  auto yt = cast<RankedTensorType>(labels.getType());
  Type f = lt.getElementType(), id = yt.getElementType();
  int64_t rank = lt.getRank(), vocab = lt.getShape().back(), parts = 1;
  for (StringRef axis : vocabAxes)
    parts *= mesh.axisSize(axis);
  auto scalarOf = [&](Type t) { return RankedTensorType::get({}, t); };
  auto ones = [&](RankedTensorType t, bool v) {
    return FullOp::create(b, loc, t, IntegerAttr::get(b.getI1Type(), v));
  };
  SmallVector<Attribute> names;
  for (StringRef axis : vocabAxes)
    names.push_back(b.getStringAttr(axis));
  ArrayAttr axes = b.getArrayAttr(names);
  auto allReduce = [&](Value v, ReduceKind kind) -> Value {
    return AllReduceOp::create(b, loc, v.getType(), v, mesh.name, axes,
                               ReduceKindAttr::get(ctx, kind));
  };
  auto leading = llvm::to_vector(llvm::seq<int64_t>(0, rank - 1));

  auto spread = [&](Value v) -> Value { // [..., 1] -> logits shape
    auto dims = llvm::to_vector(llvm::seq<int64_t>(0, rank));
    return BroadcastOp::create(b, loc, lt, v, b.getDenseI64ArrayAttr(dims));
  };

  // Which label each rank owns, as a local column.
  Value index = AxisIndexOp::create(b, loc, scalarOf(b.getI64Type()),
                                    mesh.name, axes);
  if (id != b.getI64Type())
    index = CastOp::create(b, loc, scalarOf(id), index);
  Value first = MulOp::create(
      b, loc, index, FullOp::create(b, loc, scalarOf(id), IntegerAttr::get(id, vocab)));
  Value local = SubOp::create(
      b, loc, labels,
      BroadcastOp::create(b, loc, yt, first, b.getDenseI64ArrayAttr({})));
  Value zero = FullOp::create(b, loc, yt, IntegerAttr::get(id, 0));
  Value keep = CompareOp::create(b, loc, CompareDirection::ne, labels,
                                 FullOp::create(b, loc, yt, IntegerAttr::get(id, ignore)));
  auto maskType = cast<RankedTensorType>(keep.getType());
  Value inRange = SelectOp::create(
      b, loc, CompareOp::create(b, loc, CompareDirection::ge, local, zero),
      CompareOp::create(b, loc, CompareDirection::lt, local,
                        FullOp::create(b, loc, yt, IntegerAttr::get(id, vocab))),
      ones(maskType, false));
  Value owned = SelectOp::create(b, loc, keep, inRange, ones(maskType, false));
  Value safe = SelectOp::create(b, loc, owned, local, zero);
  // Where each token's label logit sits in the flattened local logits (a
  // view): token t's row starts at t * vocab. Indexing there picks the label
  // logit and places the gradient's -1, with no [tokens, vocab] mask.
  int64_t n = yt.getNumElements();
  auto flatIds = RankedTensorType::get({n}, b.getI64Type());
  auto flatMask = RankedTensorType::get({n}, b.getI1Type());
  auto flatTokens = RankedTensorType::get({n}, f);
  auto flatLogits = RankedTensorType::get({n * vocab}, f);
  Value safe64 = ReshapeOp::create(
      b, loc, RankedTensorType::get({n}, id), safe);
  if (id != b.getI64Type())
    safe64 = CastOp::create(b, loc, flatIds, safe64);
  Value at = AddOp::create(
      b, loc,
      MulOp::create(b, loc, IotaOp::create(b, loc, flatIds, 0),
                    FullOp::create(b, loc, flatIds,
                                   IntegerAttr::get(b.getI64Type(), vocab))),
      safe64);
  Value ownedFlat = ReshapeOp::create(b, loc, flatMask, owned);
  Value zeroTokens = FullOp::create(b, loc, flatTokens, FloatAttr::get(f, 0.0));

  // The softmax normaliser across the split.
  Value localMax = ReduceMaxOp::create(b, loc, logits,
                                       b.getDenseI64ArrayAttr({rank - 1}), true);
  Value globalMax = allReduce(localMax, ReduceKind::max);
  Value shifted = ExpOp::create(b, loc, SubOp::create(b, loc, logits, spread(globalMax)));
  Value sumExp = allReduce(
      ReduceSumOp::create(b, loc, shifted, b.getDenseI64ArrayAttr({rank - 1}), true),
      ReduceKind::sum);
  auto tokens = RankedTensorType::get(yt.getShape(), f);
  Value keepF = CastOp::create(b, loc, tokens, keep);
  Value count;
  if (reduction == LossReduction::mean)
    count = ReduceSumOp::create(b, loc, keepF, b.getDenseI64ArrayAttr(leading),
                                false);
  Value result;
  if (!isGrad) {
    Value lse = ReshapeOp::create(
        b, loc, tokens,
        AddOp::create(b, loc, LogOp::create(b, loc, sumExp), globalMax));
    Value labelLogit = GatherOp::create(
        b, loc, ReshapeOp::create(b, loc, flatLogits, logits), at, 0);
    Value picked = ReshapeOp::create(
        b, loc, tokens, SelectOp::create(b, loc, ownedFlat, labelLogit, zeroTokens));
    Value share = MulOp::create(
        b, loc, lse, FullOp::create(b, loc, tokens, FloatAttr::get(f, 1.0 / parts)));
    Value contribution = SubOp::create(
        b, loc,
        SelectOp::create(b, loc, keep, share,
                         FullOp::create(b, loc, tokens, FloatAttr::get(f, 0.0))),
        picked);
    if (reduction == LossReduction::none) {
      result = contribution;
    } else {
      result = ReduceSumOp::create(b, loc, contribution,
                                   b.getDenseI64ArrayAttr(leading), false);
      if (count)
        result = DivOp::create(b, loc, result, count);
    }
  } else {
    Value dloss = widen(op->getOperand(2));
    Value probs = DivOp::create(b, loc, shifted, spread(sumExp));
    // Each kept token's scale (dloss per token, or the mean's / count).
    Value scale = dloss;
    if (count)
      scale = DivOp::create(b, loc, dloss, count);
    if (reduction != LossReduction::none)
      scale = BroadcastOp::create(b, loc, tokens, scale, b.getDenseI64ArrayAttr({}));
    Value kept = MulOp::create(b, loc, keepF, scale);
    // (softmax - one_hot) * scale: the softmax scaled, then -scale added
    // at each owned label.
    Value g = MulOp::create(
        b, loc, probs,
        BroadcastOp::create(b, loc, lt, kept, b.getDenseI64ArrayAttr(leading)));
    Value minus = SelectOp::create(
        b, loc, ownedFlat,
        NegOp::create(b, loc, ReshapeOp::create(b, loc, flatTokens, kept)),
        zeroTokens);
    result = ReshapeOp::create(
        b, loc, lt,
        IndexAddOp::create(b, loc, ReshapeOp::create(b, loc, flatLogits, g), at,
                           minus, 0));
  }
  Value old = op->getResult(0);
  if (result.getType() != old.getType())
    result = CastOp::create(b, loc, old.getType(), result);
  shardings[result] = shardings.lookup(old);
  globalTypes[result] = globalTypes.lookup(old);
  old.replaceAllUsesWith(result);
  op->erase();
  return success();
}

/// A blockwise-fp8 tile must lie within one rank's shard: its scale is one
/// number, and a tile cut by a shard boundary would need its amax from two
/// ranks. Follows the operand back through casts and reshards to the layout
/// the value was computed in (propagation reshards a value that does not
/// tile, which would gather it silently).
LogicalResult Partitioner::checkTiles(ReshapeOp cut) {
  ArrayRef<int64_t> tile =
      cut->getAttrOfType<DenseI64ArrayAttr>(ErnieDialect::kFp8TileAttrName)
          .asArrayRef();
  // The tiled matrix [..., rows, cols], as the result's shape says.
  auto tiled = cast<RankedTensorType>(cut.getType()).getShape();
  SmallVector<int64_t> matrix(tiled.drop_back(4));
  matrix.append({tiled[tiled.size() - 4] * tiled[tiled.size() - 3],
                 tiled[tiled.size() - 2] * tiled[tiled.size() - 1]});
  // Arguments are already local here.
  auto globalType = [&](Value v) {
    RankedTensorType type = globalTypes.lookup(v);
    return type ? type : dyn_cast<RankedTensorType>(v.getType());
  };
  // Back to where that matrix was computed, through reshards, casts, and
  // the data movement and scaling of an fp8 round trip (a weight gradient
  // re-tiles the forward's codes; folding may have merged the reshapes).
  Value source = cut.getInput();
  while (Operation *def = source.getDefiningOp()) {
    RankedTensorType type = globalType(source);
    if (type && type.getShape() == ArrayRef<int64_t>(matrix) &&
        !isa<ReshardOp, CastOp>(def))
      break;
    if (!isa<ReshardOp, CastOp, ReshapeOp, DivOp, MulOp>(def))
      break;
    source = def->getOperand(0);
  }
  ShardingAttr layout = shardings.lookup(source);
  RankedTensorType type = globalType(source);
  if (!layout || !type || type.getShape() != ArrayRef<int64_t>(matrix))
    return success();
  int64_t rank = type.getRank();
  for (int64_t i = 0; i < 2; ++i) {
    int64_t dim = rank - 2 + i;
    SmallVector<StringRef> axes = layout.getDimAxes(dim);
    int64_t ways = mesh.product(axes);
    int64_t local = type.getDimSize(dim) / ways;
    if (ways > 1 && local % tile[i] != 0)
      return cut.emitError()
             << "fp8 blockwise: tiles of " << tile[0] << "x" << tile[1]
             << " straddle the shards of dimension " << dim << ": its "
             << type.getDimSize(dim) << " split " << ways << " ways over ["
             << llvm::join(axes, ", ") << "] leave " << local
             << " per rank; use a block size dividing " << local
             << " or a plan that does not split this dimension";
  }
  return success();
}

/// A partitioned signature: each argument's and result's "sharding" becomes
/// "shard of", with the padded global shape `globalShape` gives (if any).
static void
markShardsOf(func::FuncOp func,
             function_ref<Attribute(bool isResult, unsigned i)> globalShape) {
  for (auto which :
       {FunctionAttrEditor::Arguments, FunctionAttrEditor::Results}) {
    FunctionAttrEditor attrs(func, which);
    bool isResult = which == FunctionAttrEditor::Results;
    unsigned n = isResult ? func.getNumResults() : func.getNumArguments();
    for (unsigned i = 0; i < n; ++i)
      if (Attribute s = attrs.get(i, kShardingAttrName)) {
        attrs.remove(i, kShardingAttrName);
        attrs.set(i, kShardOfAttrName, s);
        if (Attribute shape = globalShape(isResult, i))
          attrs.set(i, kGlobalShapeAttrName, shape);
      }
  }
}

LogicalResult Partitioner::partitionFunction(func::FuncOp func) {
  if (!func.getBody().hasOneBlock())
    return func.emitError("partition handles single-block functions");
  Block &body = func.getBody().front();
  for (BlockArgument arg : body.getArguments())
    if (failed(setLocalType(arg, func)))
      return failure();

  SmallVector<Operation *> ops;
  for (Operation &op : body)
    ops.push_back(&op);
  for (Operation *op : ops)
    if (op->hasAttr(ErnieDialect::kFp8TileAttrName) &&
        failed(checkTiles(cast<ReshapeOp>(op))))
      return failure();
  for (Operation *op : ops) {
    if (auto reshard = dyn_cast<ReshardOp>(op)) {
      OpBuilder builder(reshard);
      Value input = reshard.getInput();
      ShardingAttr from = shardings.lookup(input);
      RankedTensorType global = globalTypes.lookup(input);
      if (!from || !global)
        return reshard.emitError("reshard of a value without a sharding");
      FailureOr<Value> lowered = emitReshard(
          builder, reshard.getLoc(), input, from, reshard.getSharding(),
          global);
      if (failed(lowered))
        return failure();
      globalTypes[*lowered] = global;
      shardings[*lowered] = reshard.getSharding();
      reshard.getResult().replaceAllUsesWith(*lowered);
      reshard.erase();
      continue;
    }
    if (op->getNumRegions() != 0)
      return op->emitError("partition does not handle ops with regions");
    for (Value result : op->getResults())
      if (failed(setLocalType(result, op)))
        return failure();
    op->removeAttr(kResultShardingsAttrName);
    maskPaddedOperands(op);

    // Ops whose local form needs more than local types.
    if (auto slice = dyn_cast<SliceOp>(op)) {
      auto in = cast<RankedTensorType>(slice.getInput().getType());
      SmallVector<int64_t> limit(slice.getLimit());
      for (int64_t d = 0; d < in.getRank(); ++d)
        if (slice.getStart()[d] == 0 && slice.getStep()[d] == 1 &&
            limit[d] == globalTypes.lookup(slice.getInput()).getDimSize(d))
          limit[d] = in.getDimSize(d);
      slice.setLimit(limit);
    } else if (isa<CrossEntropyOp, CrossEntropyGradOp>(op)) {
      Value logits = op->getOperand(0);
      int64_t last = globalTypes.lookup(logits).getRank() - 1;
      if (!shardings.lookup(logits).getDimAxes(last).empty() &&
          failed(expandCrossEntropy(op)))
        return failure();
    } else if (auto embedding = dyn_cast<EmbeddingOp>(op)) {
      if (!shardings.lookup(embedding.getWeight()).getDimAxes(0).empty() &&
          failed(expandEmbedding(embedding)))
        return failure();
    } else if (auto constant = dyn_cast<ConstantOp>(op)) {
      // Values are global: build the whole and slice this rank's piece.
      ShardingAttr want = shardings.lookup(constant.getResult());
      RankedTensorType global = globalTypes.lookup(constant.getResult());
      if (!want.isReplicated()) {
        constant.getResult().setType(global);
        OpBuilder builder(op->getContext());
        builder.setInsertionPointAfter(op);
        ShardingAttr whole =
            ShardingAttr::getReplicated(op->getContext(), mesh.name,
                                        global.getRank());
        Value result = constant.getResult();
        FailureOr<Value> piece =
            emitReshard(builder, op->getLoc(), result, whole, want, global);
        if (failed(piece))
          return failure();
        result.replaceAllUsesExcept(*piece, piece->getDefiningOp());
      }
    }
  }

  // The signature follows the local types; shardings become "shard of".
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  func.setType(FunctionType::get(func.getContext(), body.getArgumentTypes(),
                                 ret.getOperandTypes()));
  markShardsOf(func, [&](bool isResult, unsigned i) {
    return paddedGlobalShape(isResult ? ret.getOperand(i)
                                      : Value(body.getArgument(i)));
  });
  return success();
}

/// The global shape of `local` when padding makes it more than the local
/// shape times the parts (the program file records it), else null.
Attribute Partitioner::paddedGlobalShape(Value local) {
  RankedTensorType global = globalTypes.lookup(local);
  auto type = dyn_cast<RankedTensorType>(local.getType());
  ShardingAttr sharding = shardings.lookup(local);
  if (!global || !type || !sharding)
    return {};
  for (int64_t d = 0; d < type.getRank(); ++d)
    if (type.getDimSize(d) * mesh.product(sharding.getDimAxes(d)) !=
        global.getDimSize(d))
      return DenseI64ArrayAttr::get(local.getContext(), global.getShape());
  return {};
}

/// An external function: its signature becomes the local one its shardings
/// say, so calls to it type-check after partition.
LogicalResult Partitioner::partitionDeclaration(func::FuncOp func) {
  auto localize = [&](Type type, ShardingAttr s) -> FailureOr<Type> {
    auto tensor = dyn_cast<RankedTensorType>(type);
    if (!tensor || !s)
      return type;
    FailureOr<RankedTensorType> local = getLocalType(tensor, s, mesh);
    if (failed(local))
      return func.emitError() << "signature type " << type
                              << " cannot be split as " << s;
    return Type(*local);
  };
  SmallVector<Type> inputs, results;
  for (auto [i, type] : llvm::enumerate(func.getArgumentTypes())) {
    auto s = func.getArgAttrOfType<ShardingAttr>(i, kShardingAttrName);
    FailureOr<Type> local = localize(type, s);
    if (failed(local))
      return failure();
    inputs.push_back(*local);
  }
  for (auto [i, type] : llvm::enumerate(func.getResultTypes())) {
    auto s = func.getResultAttrOfType<ShardingAttr>(i, kShardingAttrName);
    FailureOr<Type> local = localize(type, s);
    if (failed(local))
      return failure();
    results.push_back(*local);
  }
  markShardsOf(func, [](bool, unsigned) { return Attribute(); });
  func.setType(FunctionType::get(func.getContext(), inputs, results));
  return success();
}

LogicalResult Partitioner::run() {
  if (failed(collectShardings()))
    return failure();
  for (auto func : llvm::make_early_inc_range(module.getOps<func::FuncOp>()))
    if (failed(func.isDeclaration() ? partitionDeclaration(func)
                                    : partitionFunction(func)))
      return failure();
  return success();
}

struct SpmdPartitionPass
    : ernie::impl::SpmdPartitionPassBase<SpmdPartitionPass> {
  using SpmdPartitionPassBase::SpmdPartitionPassBase;
  explicit SpmdPartitionPass(std::shared_ptr<const cost::ClusterSpec> parsed)
      : parsedCluster(std::move(parsed)) {}

  /// A cluster handed over already parsed; it wins over the `cluster` file.
  std::shared_ptr<const cost::ClusterSpec> parsedCluster;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto meshes = module.getOps<MeshOp>();
    if (meshes.empty())
      return; // Nothing is distributed.
    if (std::next(meshes.begin()) != meshes.end()) {
      module.emitError("partition supports one mesh per module");
      return signalPassFailure();
    }
    FailureOr<MeshShape> shape =
        cost::meshShapeOnCluster(*meshes.begin(), cluster,
                                   parsedCluster.get());
    if (failed(shape))
      return signalPassFailure();
    Partitioner partitioner(module, *shape);
    if (failed(partitioner.run()))
      return signalPassFailure();
    for (auto fn : module.getOps<func::FuncOp>()) {
      regatherForBackward(fn);
      reuseGathers(fn);
    }
  }

  /// The dimension of `reshape`'s input that its result dimension `dim` is,
  /// when the reshape keeps that dimension whole (it merges or splits only
  /// the dimensions before it, and those after it); else none.
  static std::optional<int64_t> wholeDimThrough(ReshapeOp reshape,
                                                int64_t dim) {
    auto in = cast<RankedTensorType>(reshape.getInput().getType());
    auto out = cast<RankedTensorType>(reshape.getType());
    int64_t before = 1;
    for (int64_t d = 0; d < dim; ++d)
      before *= out.getDimSize(d);
    int64_t prefix = 1;
    for (int64_t k = 0; k < in.getRank(); ++k) {
      if (prefix == before && in.getDimSize(k) == out.getDimSize(dim))
        return k;
      prefix *= in.getDimSize(k);
    }
    return std::nullopt;
  }

  /// The pipeline stage (`ernie.stage`) of every op that reads `gather`,
  /// through the reshapes partition added; a null attribute when none has
  /// one (no pipeline), none when they are on several stages.
  static std::optional<Attribute> readersStage(AllGatherOp gather) {
    std::optional<Attribute> stage;
    SmallVector<Operation *> readers(gather->getUsers());
    while (!readers.empty()) {
      Operation *reader = readers.pop_back_val();
      Attribute mine = reader->getAttr(ErnieDialect::kStageAttrName);
      if (!mine && isa<ReshapeOp>(reader)) {
        llvm::append_range(readers, reader->getUsers());
        continue;
      }
      if (stage && *stage != mine)
        return std::nullopt;
      stage = mine;
    }
    return stage.value_or(Attribute());
  }

  /// A gather of a reshaped value is the reshaped gather of the value when
  /// the reshape keeps the gathered dimension whole: the backward of a
  /// row-parallel layer reads its output gradient as [b, s, h] for the data
  /// gradient and as [b * s, h] for the weight gradient, and gathers it
  /// once. Gathers on the two sides of the loss stay apart (the backward's
  /// own gather is regatherForBackward's memory trade).
  static void reuseGathers(func::FuncOp fn) {
    if (fn.isDeclaration())
      return;
    Operation *loss = getLocalLossOp(fn);
    using Key = std::tuple<const void *, int64_t, const void *, const void *,
                           const void *, bool>;
    std::map<Key, AllGatherOp> first;
    for (auto gather :
         llvm::make_early_inc_range(fn.getBody().front().getOps<AllGatherOp>())) {
      Value root = gather.getInput();
      int64_t dim = gather.getDim();
      while (auto reshape = root.getDefiningOp<ReshapeOp>()) {
        std::optional<int64_t> inner = wholeDimThrough(reshape, dim);
        if (!inner)
          break;
        root = reshape.getInput();
        dim = *inner;
      }
      bool backward = loss && loss->isBeforeInBlock(gather);
      std::optional<Attribute> stage = readersStage(gather);
      if (!stage)
        continue; // read on several pipeline stages: each gathers its own
      Key key{root.getAsOpaquePointer(), dim,
              gather.getMeshAttr().getAsOpaquePointer(),
              gather.getAxesAttr().getAsOpaquePointer(),
              stage->getAsOpaquePointer(), backward};
      auto [it, inserted] = first.try_emplace(key, gather);
      if (inserted)
        continue;
      Value reused = it->second.getResult();
      if (reused.getType() != gather.getType()) {
        OpBuilder b(gather);
        reused = ReshapeOp::create(b, gather.getLoc(), gather.getType(), reused);
      }
      gather.getResult().replaceAllUsesWith(reused);
      gather.erase();
    }
  }

  /// A value all-gathered in the forward and read again in the backward
  /// (a weight gradient reads a column-parallel matmul's input; ZeRO-3 reads
  /// a parameter) is gathered again where the backward first needs it, so
  /// the forward keeps the 1/n piece, not the whole: Megatron's sequence
  /// parallelism and ZeRO-3 trade this communication for that memory. The
  /// trade needs something to trade against: where what the step makes
  /// between the forward's last reader and the backward's first is smaller
  /// than the gathered value (a divided LM head's logits, read by the loss
  /// and then by its gradient), keeping the value costs no more than that
  /// and gathering again costs a collective on the critical path.
  static void regatherForBackward(func::FuncOp fn) {
    Operation *loss = getLocalLossOp(fn);
    if (!loss)
      return;
    Block &body = fn.getBody().front();
    for (auto gather : llvm::make_early_inc_range(body.getOps<AllGatherOp>())) {
      if (!gather->isBeforeInBlock(loss))
        break;
      Operation *firstLate = nullptr, *lastEarly = gather;
      for (Operation *user : gather->getUsers()) {
        Operation *top = body.findAncestorOpInBlock(*user);
        if (!loss->isBeforeInBlock(top)) {
          if (lastEarly->isBeforeInBlock(top))
            lastEarly = top;
        } else if (!firstLate || top->isBeforeInBlock(firstLate)) {
          firstLate = top;
        }
      }
      if (!firstLate)
        continue;
      auto bytes = [](RankedTensorType type) {
        return (type.getNumElements() * type.getElementTypeBitWidth() + 7) / 8;
      };
      // Up to the gathered value's bytes (a reshape makes a view, not bytes).
      int64_t wanted = bytes(cast<RankedTensorType>(gather.getType()));
      int64_t between = 0;
      for (Operation *op = lastEarly->getNextNode();
           op != firstLate && between < wanted; op = op->getNextNode())
        for (Value result : op->getResults())
          if (auto type = dyn_cast<RankedTensorType>(result.getType());
              type && !isa<ReshapeOp>(op))
            between += bytes(type);
      if (between < wanted)
        continue;
      OpBuilder b(firstLate);
      Operation *again = b.clone(*gather);
      gather.getResult().replaceUsesWithIf(
          again->getResult(0), [&](OpOperand &use) {
            Operation *top = body.findAncestorOpInBlock(*use.getOwner());
            return loss->isBeforeInBlock(top);
          });
    }
  }
};

} // namespace

std::unique_ptr<Pass> mlir::ernie::createSpmdPartitionPass(
    std::shared_ptr<const cost::ClusterSpec> cluster) {
  return std::make_unique<SpmdPartitionPass>(std::move(cluster));
}

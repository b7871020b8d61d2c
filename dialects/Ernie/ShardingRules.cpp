//===- ShardingRules.cpp - the SPMD rule of every ernie op ------------------===//
//
// Each op states, as a factor map (ShardingRule.h), which of its dimensions
// move together. Propagation, partition and inferSpmd read only these tables.
//
//===----------------------------------------------------------------------===//

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"

#include <numeric>

using namespace mlir;
using namespace mlir::ernie;

namespace {

/// A dimension of an operand or a result.
struct DimRef {
  bool isResult;
  unsigned index;
  int64_t dim;
};
DimRef operand(unsigned index, int64_t dim) { return {false, index, dim}; }
DimRef result(unsigned index, int64_t dim) { return {true, index, dim}; }

/// Builds an OpShardingRule for `op`'s current types. Dimensions of size 1
/// never take a factor: they cannot be split.
class RuleBuilder {
public:
  explicit RuleBuilder(Operation *op) : op(op) {
    for (Type type : op->getOperandTypes())
      rule.operands.emplace_back(rankOf(type));
    for (Type type : op->getResultTypes())
      rule.results.emplace_back(rankOf(type));
  }

  int64_t dimSize(DimRef ref) const {
    Value v = ref.isResult ? op->getResult(ref.index) : op->getOperand(ref.index);
    return cast<ShapedType>(v.getType()).getDimSize(ref.dim);
  }

  /// A new factor of `size` placed (as the minor-most factor so far) on every
  /// dimension in `refs` that is not of size 1.
  void add(int64_t size, FactorKind kind, ArrayRef<DimRef> refs,
           ReduceKind reduce = ReduceKind::sum) {
    if (size <= 1)
      return;
    int64_t id = rule.factors.size();
    rule.factors.push_back({size, kind, reduce});
    for (DimRef ref : refs) {
      TensorFactors &tensor =
          ref.isResult ? rule.results[ref.index] : rule.operands[ref.index];
      tensor[ref.dim].push_back(id);
    }
  }

  /// One factor per dimension, shared by the same dimension of `refs`' tensors.
  void parallel(DimRef first, ArrayRef<DimRef> others = {}) {
    SmallVector<DimRef> refs{first};
    llvm::append_range(refs, others);
    add(dimSize(first), FactorKind::Parallel, refs);
  }

  void replicated(ArrayRef<DimRef> refs) {
    add(dimSize(refs.front()), FactorKind::NeedReplication, refs);
  }

  OpShardingRule take() { return std::move(rule); }

private:
  static int64_t rankOf(Type type) {
    auto shaped = dyn_cast<ShapedType>(type);
    return shaped && shaped.hasRank() ? shaped.getRank() : 0;
  }

  Operation *op;
  OpShardingRule rule;
};

int64_t rankOf(Value v) { return cast<ShapedType>(v.getType()).getRank(); }

/// Every dimension parallel except those in `replicatedDims`, across all
/// operands and results of one shape (softmax, topk, ...).
OpShardingRule sameShapeRule(Operation *op, ArrayRef<int64_t> replicatedDims) {
  RuleBuilder b(op);
  int64_t rank = op->getNumResults() ? rankOf(op->getResult(0))
                                     : rankOf(op->getOperand(0));
  for (int64_t d = 0; d < rank; ++d) {
    SmallVector<DimRef> refs;
    for (unsigned i = 0; i < op->getNumOperands(); ++i)
      refs.push_back(operand(i, d));
    for (unsigned i = 0; i < op->getNumResults(); ++i)
      refs.push_back(result(i, d));
    int64_t size = b.dimSize(refs.front());
    bool sameSize = llvm::all_of(
        refs, [&](DimRef ref) { return b.dimSize(ref) == size; });
    if (!llvm::is_contained(replicatedDims, d)) {
      b.add(size, FactorKind::Parallel, refs);
    } else if (sameSize) {
      b.add(size, FactorKind::NeedReplication, refs);
    } else {
      // Sizes differ along the dimension (concat's inputs, topk's k): one
      // whole factor per tensor.
      for (DimRef ref : refs)
        b.add(b.dimSize(ref), FactorKind::NeedReplication, ref);
    }
  }
  return b.take();
}

} // namespace

OpShardingRule mlir::ernie::detail::getElementwiseShardingRule(Operation *op) {
  return sameShapeRule(op, {});
}

//===----------------------------------------------------------------------===//
// Creation.
//===----------------------------------------------------------------------===//

/// A constant's values are global: a rank's shard is sliced from the whole,
/// so the constant itself stays replicated and consumers reshard it.
OpShardingRule ConstantOp::getShardingRule() {
  RuleBuilder b(*this);
  for (int64_t d = 0; d < getType().getRank(); ++d)
    b.replicated(result(0, d));
  return b.take();
}

/// Values depend on the index along `dimension`; other dimensions split freely.
OpShardingRule IotaOp::getShardingRule() {
  RuleBuilder b(*this);
  for (int64_t d = 0, e = getType().getRank(); d < e; ++d) {
    if (d == static_cast<int64_t>(getDimension()))
      b.replicated(result(0, d));
    else
      b.parallel(result(0, d));
  }
  return b.take();
}

//===----------------------------------------------------------------------===//
// Linear algebra and reductions.
//===----------------------------------------------------------------------===//

/// Batch, m and n are parallel; k is a sum reduction (a k-split matmul yields
/// partial sums). A rank-2 rhs has no batch dimensions.
/// Operands 0 and 1 multiplied as a matmul (batch, m, n parallel; k summed).
/// An accumulator (operand `accumulator`, if any) is split as the result.
template <typename OpTy>
static OpShardingRule matmulRule(OpTy op,
                                 std::optional<unsigned> accumulator = {}) {
  RuleBuilder b(op);
  int64_t ra = rankOf(op.getLhs()), rb = rankOf(op.getRhs()),
          rr = rankOf(op.getResult());
  // The result's dimension d, and the accumulator's with it.
  auto out = [&](int64_t d) {
    SmallVector<DimRef> dims{result(0, d)};
    if (accumulator)
      dims.push_back(operand(*accumulator, d));
    return dims;
  };
  for (int64_t d = 0; d < ra - 2; ++d) {
    SmallVector<DimRef> with = out(d);
    if (rb != 2)
      with.insert(with.begin(), operand(1, d));
    b.parallel(operand(0, d), with);
  }
  int64_t mDim = op.getTransposeA() ? ra - 1 : ra - 2;
  int64_t kDimA = op.getTransposeA() ? ra - 2 : ra - 1;
  int64_t kDimB = op.getTransposeB() ? rb - 1 : rb - 2;
  int64_t nDim = op.getTransposeB() ? rb - 2 : rb - 1;
  b.parallel(operand(0, mDim), out(rr - 2));
  b.parallel(operand(1, nDim), out(rr - 1));
  // Added to an accumulator, a k-split product's partial sums would each
  // carry the accumulator: the sum over k is whole on every rank.
  b.add(b.dimSize(operand(0, kDimA)),
        accumulator ? FactorKind::NeedReplication : FactorKind::Reduction,
        {operand(0, kDimA), operand(1, kDimB)}, ReduceKind::sum);
  return b.take();
}

OpShardingRule MatmulOp::getShardingRule() { return matmulRule(*this); }

/// The scalar scales have no dimensions: every rank holds them whole.
OpShardingRule ScaledMatmulOp::getShardingRule() { return matmulRule(*this); }

/// `acc` is split as the result; k is never split (see matmulRule).
OpShardingRule MatmulAccumulateOp::getShardingRule() {
  return matmulRule(*this, /*accumulator=*/2);
}

template <typename ReduceOp>
static OpShardingRule reduceRule(ReduceOp op, ReduceKind kind) {
  RuleBuilder b(op);
  int64_t out = 0;
  for (int64_t d = 0, e = rankOf(op.getInput()); d < e; ++d) {
    if (llvm::is_contained(op.getAxes(), d)) {
      // Reduced: the factor leaves the result (a kept size-1 dim takes none).
      b.add(b.dimSize(operand(0, d)), FactorKind::Reduction, {operand(0, d)},
            kind);
      if (op.getKeepdim())
        ++out;
      continue;
    }
    b.parallel(operand(0, d), {result(0, out++)});
  }
  return b.take();
}

OpShardingRule ReduceSumOp::getShardingRule() {
  return reduceRule(*this, ReduceKind::sum);
}
/// Equal shards make the mean of local means the global mean.
OpShardingRule ReduceMeanOp::getShardingRule() {
  return reduceRule(*this, ReduceKind::avg);
}
OpShardingRule ReduceMaxOp::getShardingRule() {
  return reduceRule(*this, ReduceKind::max);
}

OpShardingRule SoftmaxOp::getShardingRule() {
  return sameShapeRule(*this, {static_cast<int64_t>(getAxis())});
}
OpShardingRule LogSoftmaxOp::getShardingRule() {
  return sameShapeRule(*this, {static_cast<int64_t>(getAxis())});
}

//===----------------------------------------------------------------------===//
// Normalisation: leading dims parallel, the normalised dim whole, weights
// replicated along it.
//===----------------------------------------------------------------------===//

static OpShardingRule normRule(Operation *op, unsigned numParams) {
  RuleBuilder b(op);
  int64_t rank = rankOf(op->getOperand(0));
  for (int64_t d = 0; d < rank - 1; ++d)
    b.parallel(operand(0, d), {result(0, d)});
  SmallVector<DimRef> last{operand(0, rank - 1), result(0, rank - 1)};
  for (unsigned p = 1; p <= numParams; ++p)
    last.push_back(operand(p, 0));
  b.replicated(last);
  return b.take();
}

OpShardingRule RmsNormOp::getShardingRule() { return normRule(*this, 1); }
OpShardingRule LayerNormOp::getShardingRule() { return normRule(*this, 2); }

//===----------------------------------------------------------------------===//
// Shape ops.
//===----------------------------------------------------------------------===//

/// Splits input and output shapes into common factors, major to minor: a dim
/// of 64 reshaped to 4x16 is factors (4, 16) in the input dim and one factor
/// each in the output dims. Sizes that share only part of a factor (6x4 ->
/// 4x6) share their gcd (2: both halves are the same 12 elements); past the
/// first coprime remainder the dims are misaligned, so they stay whole until
/// the element counts of both sides meet again.
OpShardingRule ReshapeOp::getShardingRule() {
  RuleBuilder b(*this);
  ArrayRef<int64_t> in = cast<ShapedType>(getInput().getType()).getShape();
  ArrayRef<int64_t> out = cast<ShapedType>(getType()).getShape();
  int64_t i = 0, o = 0, ni = in.size(), no = out.size();
  // What is left of the current input and output dimension.
  int64_t restIn = ni ? in[0] : 1, restOut = no ? out[0] : 1;
  auto nextIn = [&] { restIn = ++i < ni ? in[i] : 1; };
  auto nextOut = [&] { restOut = ++o < no ? out[o] : 1; };
  auto skipOnes = [&] {
    while (i < ni && restIn == 1)
      nextIn();
    while (o < no && restOut == 1)
      nextOut();
  };
  skipOnes();
  while (i < ni && o < no) {
    int64_t common = std::gcd(restIn, restOut);
    if (common > 1) {
      b.add(common, FactorKind::Parallel, {operand(0, i), result(0, o)});
      restIn /= common;
      restOut /= common;
    } else {
      // Misaligned: keep dims whole on both sides until the counts meet.
      int64_t countIn = restIn, countOut = restOut;
      b.add(restIn, FactorKind::NeedReplication, {operand(0, i)});
      b.add(restOut, FactorKind::NeedReplication, {result(0, o)});
      nextIn();
      nextOut();
      while (countIn != countOut && (i < ni || o < no)) {
        if ((countIn < countOut && i < ni) || o >= no) {
          b.add(restIn, FactorKind::NeedReplication, {operand(0, i)});
          countIn *= restIn;
          nextIn();
        } else {
          b.add(restOut, FactorKind::NeedReplication, {result(0, o)});
          countOut *= restOut;
          nextOut();
        }
      }
      restIn = i < ni ? restIn : 1;
      restOut = o < no ? restOut : 1;
    }
    skipOnes();
  }
  return b.take();
}

OpShardingRule TransposeOp::getShardingRule() {
  RuleBuilder b(*this);
  for (auto [out, in] : llvm::enumerate(getPerm()))
    b.parallel(operand(0, in), {result(0, out)});
  return b.take();
}

/// Kept dimensions are shared; expanded (size-1) and new dimensions exist only
/// in the result, where splitting them splits the copies.
OpShardingRule BroadcastOp::getShardingRule() {
  RuleBuilder b(*this);
  auto in = cast<ShapedType>(getInput().getType());
  auto out = cast<ShapedType>(getType());
  for (int64_t d = 0; d < out.getRank(); ++d) {
    const auto *it = llvm::find(getDims(), d);
    if (it != getDims().end() &&
        in.getDimSize(it - getDims().begin()) == out.getDimSize(d))
      b.parallel(operand(0, it - getDims().begin()), {result(0, d)});
    else
      b.parallel(result(0, d));
  }
  return b.take();
}

/// A dimension taken whole is parallel; a sliced one stays replicated.
OpShardingRule SliceOp::getShardingRule() {
  RuleBuilder b(*this);
  auto in = cast<ShapedType>(getInput().getType());
  for (int64_t d = 0; d < in.getRank(); ++d) {
    bool whole = getStart()[d] == 0 && getLimit()[d] == in.getDimSize(d) &&
                 getStep()[d] == 1;
    if (whole) {
      b.parallel(operand(0, d), {result(0, d)});
    } else {
      b.replicated(operand(0, d));
      b.replicated(result(0, d));
    }
  }
  return b.take();
}

OpShardingRule ConcatOp::getShardingRule() {
  return sameShapeRule(*this, {static_cast<int64_t>(getAxis())});
}
OpShardingRule SplitOp::getShardingRule() {
  return sameShapeRule(*this, {static_cast<int64_t>(getAxis())});
}

/// input[:axis] and input[axis+1:] pass through; the indices' dims become the
/// result's middle dims; the gathered axis stays whole.
OpShardingRule GatherOp::getShardingRule() {
  RuleBuilder b(*this);
  int64_t axis = getAxis(), rank = rankOf(getInput()),
          idxRank = rankOf(getIndices());
  for (int64_t d = 0; d < axis; ++d)
    b.parallel(operand(0, d), {result(0, d)});
  for (int64_t d = 0; d < idxRank; ++d)
    b.parallel(operand(1, d), {result(0, axis + d)});
  b.replicated(operand(0, axis));
  for (int64_t d = axis + 1; d < rank; ++d)
    b.parallel(operand(0, d), {result(0, d - 1 + idxRank)});
  return b.take();
}

/// A vocabulary-split table leaves each rank the rows it owns and zeros
/// elsewhere: the result is a partial sum (Megatron's vocab-parallel
/// embedding).
OpShardingRule EmbeddingOp::getShardingRule() {
  RuleBuilder b(*this);
  int64_t idxRank = rankOf(getIndices());
  for (int64_t d = 0; d < idxRank; ++d)
    b.parallel(operand(0, d), {result(0, d)});
  b.add(b.dimSize(operand(1, 0)), FactorKind::Reduction, {operand(1, 0)},
        ReduceKind::sum);
  b.parallel(operand(1, 1), {result(0, idxRank)});
  return b.take();
}

OpShardingRule TopkOp::getShardingRule() {
  return sameShapeRule(*this, {static_cast<int64_t>(getAxis())});
}

//===----------------------------------------------------------------------===//
// Mixture of experts.
//===----------------------------------------------------------------------===//

// Groups split freely: each has its own slots. Within a group the tokens,
// the k choices, the experts and the capacity stay whole (a slot counts
// every earlier choice of the group, and a token may go to any expert);
// hidden splits (every element moves alone). Sharding the buffers by
// experts is a reshard away from these rules: the all-to-all.

namespace {
/// The factors every MoE op shares: groups on `groups` and dimension 0 of
/// the [groups, tokens, k] `choices` operands; tokens (dimension 1 of the
/// choices and `tokens`) and k (dimension 2 and `ks`) replicated.
void choiceFactors(RuleBuilder &b, ArrayRef<unsigned> choices,
                   SmallVector<DimRef> groups, SmallVector<DimRef> tokens,
                   SmallVector<DimRef> ks = {}) {
  for (unsigned i : choices) {
    groups.push_back(operand(i, 0));
    tokens.push_back(operand(i, 1));
    ks.push_back(operand(i, 2));
  }
  b.parallel(groups.front(), ArrayRef(groups).drop_front());
  b.replicated(tokens);
  b.replicated(ks);
}
} // namespace

/// input [E, G, C, in], weight [E, in, out] (or [E, out, in]), rows [E, G]
/// -> [E, G, C, out]. The filled rows are a prefix of each slot column, so
/// the capacity is never split; a split `in` leaves partial sums.
OpShardingRule ExpertMatmulOp::getShardingRule() {
  RuleBuilder b(*this);
  bool t = getTransposeWeight();
  b.parallel(operand(0, 0), {operand(1, 0), operand(2, 0), result(0, 0)});
  b.parallel(operand(0, 1), {operand(2, 1), result(0, 1)});
  b.replicated({operand(0, 2), result(0, 2)});
  b.add(b.dimSize(operand(0, 3)), FactorKind::Reduction,
        {operand(0, 3), operand(1, t ? 2 : 1)});
  b.parallel(operand(1, t ? 1 : 2), {result(0, 3)});
  return b.take();
}

/// input [E, G, C, in], grad [E, G, C, out], rows [E, G] -> [E, in, out]:
/// split groups leave partial sums (the data-parallel gradient's).
OpShardingRule ExpertWeightGradOp::getShardingRule() {
  RuleBuilder b(*this);
  b.parallel(operand(0, 0), {operand(1, 0), operand(2, 0), result(0, 0)});
  b.add(b.dimSize(operand(0, 1)), FactorKind::Reduction,
        {operand(0, 1), operand(1, 1), operand(2, 1)});
  b.replicated({operand(0, 2), operand(1, 2)});
  b.parallel(operand(0, 3), {result(0, 1)});
  b.parallel(operand(1, 3), {result(0, 2)});
  return b.take();
}

OpShardingRule MoeRouteOp::getShardingRule() {
  RuleBuilder b(*this);
  b.parallel(operand(0, 0), {result(0, 0)});
  b.replicated({operand(0, 1), result(0, 1)});
  b.replicated({operand(0, 2), result(0, 2)});
  return b.take();
}

/// input [G, T, H]; experts, slots, weights [G, T, k] -> [E, G, C, H].
OpShardingRule MoeDispatchOp::getShardingRule() {
  RuleBuilder b(*this);
  choiceFactors(b, {1, 2, 3}, {operand(0, 0), result(0, 1)}, {operand(0, 1)});
  b.parallel(operand(0, 2), {result(0, 3)});
  b.replicated(result(0, 0));
  b.replicated(result(0, 2));
  return b.take();
}

/// input [E, G, C, H]; experts, slots, weights [G, T, k] -> [G, T, H].
OpShardingRule MoeCombineOp::getShardingRule() {
  RuleBuilder b(*this);
  choiceFactors(b, {1, 2, 3}, {operand(0, 1), result(0, 0)}, {result(0, 1)});
  b.parallel(operand(0, 3), {result(0, 2)});
  b.replicated(operand(0, 0));
  b.replicated(operand(0, 2));
  return b.take();
}

/// tokens [G, T, H], buffers [E, G, C, H], experts, slots [G, T, k] ->
/// [G, T, k]: a split hidden leaves partial sums.
OpShardingRule MoeWeightsGradOp::getShardingRule() {
  RuleBuilder b(*this);
  choiceFactors(b, {2, 3}, {operand(0, 0), operand(1, 1), result(0, 0)},
                {operand(0, 1), result(0, 1)}, {result(0, 2)});
  b.add(b.dimSize(operand(0, 2)), FactorKind::Reduction,
        {operand(0, 2), operand(1, 3)}, ReduceKind::sum);
  b.replicated(operand(1, 0));
  b.replicated(operand(1, 2));
  return b.take();
}

//===----------------------------------------------------------------------===//
// Transformer ops.
//===----------------------------------------------------------------------===//

/// Batch, sequence and heads are parallel (positions share batch/sequence);
/// head_dim pairs rotate together and stay whole.
OpShardingRule RopeOp::getShardingRule() {
  RuleBuilder b(*this);
  bool batched = rankOf(getPositions()) == 2;
  if (batched) {
    b.parallel(operand(0, 0), {operand(1, 0), result(0, 0)});
    b.parallel(operand(0, 1), {operand(1, 1), result(0, 1)});
  } else {
    b.parallel(operand(0, 0), {result(0, 0)});
    b.parallel(operand(0, 1), {operand(1, 0), result(0, 1)});
  }
  b.parallel(operand(0, 2), {result(0, 2)});
  b.replicated({operand(0, 3), result(0, 3)});
  return b.take();
}

/// Batch is parallel. Query heads are (kv_heads, group) factors: splitting
/// kv_heads splits key/value heads with their query groups; splitting the
/// group splits query heads alone. Sequences and head_dim stay whole (the
/// sequence-parallel issue splits them); value's head_dim is parallel.
OpShardingRule AttentionOp::getShardingRule() {
  RuleBuilder b(*this);
  auto q = cast<ShapedType>(getQuery().getType());
  auto k = cast<ShapedType>(getKey().getType());
  b.parallel(operand(0, 0), {operand(1, 0), operand(2, 0), result(0, 0)});
  b.replicated({operand(0, 1), result(0, 1)});
  b.replicated({operand(1, 1), operand(2, 1)});
  int64_t kvHeads = k.getDimSize(2), group = q.getDimSize(2) / kvHeads;
  b.add(kvHeads, FactorKind::Parallel,
        {operand(0, 2), operand(1, 2), operand(2, 2), result(0, 2)});
  b.add(group, FactorKind::Parallel, {operand(0, 2), result(0, 2)});
  b.replicated({operand(0, 3), operand(1, 3)});
  b.parallel(operand(2, 3), {result(0, 3)});
  return b.take();
}

/// Token dims are parallel with reduction = none and sum reductions otherwise
/// (mean divides by a global count, so its token dims stay whole until the
/// loss is expanded into sum / count). A vocabulary split is a sum
/// reduction: partition computes the vocab-parallel loss (Megatron's), in
/// which each rank contributes its share of every token's loss.
OpShardingRule CrossEntropyOp::getShardingRule() {
  RuleBuilder b(*this);
  int64_t rank = rankOf(getLogits());
  for (int64_t d = 0; d < rank - 1; ++d) {
    switch (getReduction()) {
    case LossReduction::none:
      b.parallel(operand(0, d), {operand(1, d), result(0, d)});
      break;
    case LossReduction::sum:
      b.add(b.dimSize(operand(0, d)), FactorKind::Reduction,
            {operand(0, d), operand(1, d)}, ReduceKind::sum);
      break;
    case LossReduction::mean:
      b.replicated({operand(0, d), operand(1, d)});
      break;
    }
  }
  b.add(b.dimSize(operand(0, rank - 1)), FactorKind::Reduction,
        {operand(0, rank - 1)}, ReduceKind::sum);
  return b.take();
}

//===----------------------------------------------------------------------===//
// Gradient ops.
//===----------------------------------------------------------------------===//

/// Unpadded dimensions pass through; padded ones stay whole.
OpShardingRule PadOp::getShardingRule() {
  RuleBuilder b(*this);
  for (int64_t d = 0, e = rankOf(getInput()); d < e; ++d) {
    if (getLow()[d] == 0 && getHigh()[d] == 0 && getInterior()[d] == 0) {
      b.parallel(operand(0, d), {result(0, d)});
    } else {
      b.replicated(operand(0, d));
      b.replicated(result(0, d));
    }
  }
  return b.take();
}

/// base and result share every dim but the indexed axis (whole); the
/// indices' dims are summed into it: split, they leave partial sums.
OpShardingRule IndexAddOp::getShardingRule() {
  RuleBuilder b(*this);
  int64_t axis = getAxis(), rank = rankOf(getBase()),
          idxRank = rankOf(getIndices());
  for (int64_t d = 0; d < axis; ++d)
    b.parallel(operand(0, d), {operand(2, d), result(0, d)});
  b.replicated({operand(0, axis), result(0, axis)});
  for (int64_t d = 0; d < idxRank; ++d)
    b.add(b.dimSize(operand(1, d)), FactorKind::Reduction,
          {operand(1, d), operand(2, axis + d)}, ReduceKind::sum);
  for (int64_t d = axis + 1; d < rank; ++d)
    b.parallel(operand(0, d), {operand(2, d - 1 + idxRank), result(0, d)});
  return b.take();
}

/// As attention: batch and key/value heads parallel. Query groups stay
/// whole (the key/value gradients sum over them), as do sequences and head
/// dims (contracted on both sides of the backward).
OpShardingRule AttentionGradOp::getShardingRule() {
  RuleBuilder b(*this);
  auto q = cast<ShapedType>(getQuery().getType());
  auto k = cast<ShapedType>(getKey().getType());
  b.parallel(operand(0, 0), {operand(1, 0), operand(2, 0), operand(3, 0),
                             result(0, 0), result(1, 0), result(2, 0)});
  b.replicated({operand(0, 1), operand(3, 1), result(0, 1)});
  b.replicated({operand(1, 1), operand(2, 1), result(1, 1), result(2, 1)});
  int64_t kvHeads = k.getDimSize(2), group = q.getDimSize(2) / kvHeads;
  b.add(kvHeads, FactorKind::Parallel,
        {operand(0, 2), operand(1, 2), operand(2, 2), operand(3, 2),
         result(0, 2), result(1, 2), result(2, 2)});
  b.add(group, FactorKind::NeedReplication,
        {operand(0, 2), operand(3, 2), result(0, 2)});
  b.replicated({operand(0, 3), operand(1, 3), result(0, 3), result(1, 3)});
  b.replicated({operand(2, 3), operand(3, 3), result(2, 3)});
  return b.take();
}

/// Token dims parallel (dloss shares them when per-token); for a mean the
/// count is global, so token dims stay whole. The vocabulary splits with
/// the logits (partition normalises the softmax across the split).
OpShardingRule CrossEntropyGradOp::getShardingRule() {
  RuleBuilder b(*this);
  int64_t rank = rankOf(getLogits());
  bool perToken = getReduction() == LossReduction::none;
  for (int64_t d = 0; d < rank - 1; ++d) {
    SmallVector<DimRef> refs{operand(0, d), operand(1, d), result(0, d)};
    if (perToken)
      refs.push_back(operand(2, d));
    if (getReduction() == LossReduction::mean)
      b.replicated(refs);
    else
      b.add(b.dimSize(operand(0, d)), FactorKind::Parallel, refs);
  }
  b.parallel(operand(0, rank - 1), {result(0, rank - 1)});
  return b.take();
}

//===----------------------------------------------------------------------===//
// Optimizer updates: elementwise over the parameter; scalars take no part.
//===----------------------------------------------------------------------===//

static OpShardingRule optimizerRule(Operation *op) {
  RuleBuilder b(op);
  int64_t rank = rankOf(op->getOperand(0));
  for (int64_t d = 0; d < rank; ++d) {
    SmallVector<DimRef> refs;
    for (unsigned i = 0; i < op->getNumOperands(); ++i)
      if (rankOf(op->getOperand(i)) == rank)
        refs.push_back(operand(i, d));
    for (unsigned i = 0; i < op->getNumResults(); ++i)
      refs.push_back(result(i, d));
    b.add(b.dimSize(refs.front()), FactorKind::Parallel, refs);
  }
  return b.take();
}

OpShardingRule SgdUpdateOp::getShardingRule() { return optimizerRule(*this); }
OpShardingRule AdamWUpdateOp::getShardingRule() { return optimizerRule(*this); }

//===- ErnieInterfaces.cpp - ernie op interfaces and their defaults ---------===//
//
// The generated interface definitions, the default cost model, and the ops
// whose flop counts are not one per result element.
//
//===----------------------------------------------------------------------===//

#include "ernie/Dialect/Ernie/IR/ErnieInterfaces.h"
#include "ernie/Dialect/Ernie/IR/ErnieOps.h"

using namespace mlir;
using namespace mlir::ernie;

#include "ernie/Dialect/Ernie/IR/ErnieInterfaces.cpp.inc"

static int64_t tensorBytes(Type type) {
  auto shaped = dyn_cast<ShapedType>(type);
  if (!shaped || !shaped.hasStaticShape())
    return 0;
  return shaped.getNumElements() *
         getElementByteSize(shaped.getElementType());
}

int64_t mlir::ernie::detail::countResultElements(Operation *op) {
  int64_t total = 0;
  for (Type type : op->getResultTypes())
    if (auto shaped = dyn_cast<ShapedType>(type);
        shaped && shaped.hasStaticShape())
      total += shaped.getNumElements();
  return total;
}

int64_t mlir::ernie::detail::countOperandAndResultBytes(Operation *op) {
  int64_t total = 0;
  for (Type type : op->getOperandTypes())
    total += tensorBytes(type);
  for (Type type : op->getResultTypes())
    total += tensorBytes(type);
  return total;
}

/// 2·m·n·k per batch: one multiply and one add per term.
template <typename OpTy> static int64_t matmulFlops(OpTy op) {
  auto lhs = cast<ShapedType>(op.getLhs().getType());
  int64_t k = op.getTransposeA() ? lhs.getShape()[lhs.getRank() - 2]
                                 : lhs.getShape().back();
  return 2 * cast<ShapedType>(op.getType()).getNumElements() * k;
}
int64_t MatmulOp::getFlops() { return matmulFlops(*this); }
int64_t ScaledMatmulOp::getFlops() { return matmulFlops(*this); }
/// The product's flops and one add per result element.
int64_t MatmulAccumulateOp::getFlops() {
  return matmulFlops(*this) + cast<ShapedType>(getType()).getNumElements();
}

/// The expert GEMMs count the rows routing fills on average (`fill` of the
/// buffers): 2 x in x out per filled row. They read only those rows and
/// write the whole result (zeros where no row is filled).
static int64_t elementsOf(Value v) {
  return cast<ShapedType>(v.getType()).getNumElements();
}
static int64_t filled(double fill, int64_t n) {
  return static_cast<int64_t>(fill * static_cast<double>(n));
}
int64_t ExpertMatmulOp::getFlops() {
  auto input = cast<ShapedType>(getInput().getType());
  return 2 * filled(getFill().convertToDouble(), elementsOf(getResult())) *
         input.getDimSize(3);
}
int64_t ExpertMatmulOp::getBytesAccessed() {
  int64_t element = getElementByteSize(getElementTypeOrSelf(getInput()));
  return element * (elementsOf(getWeight()) + elementsOf(getResult()) +
                    filled(getFill().convertToDouble(), elementsOf(getInput())));
}
int64_t ExpertWeightGradOp::getFlops() {
  auto result = cast<ShapedType>(getType());
  return 2 * filled(getFill().convertToDouble(), elementsOf(getGrad())) *
         result.getDimSize(1);
}
int64_t ExpertWeightGradOp::getBytesAccessed() {
  int64_t element = getElementByteSize(getElementTypeOrSelf(getInput()));
  return element *
         (elementsOf(getResult()) +
          filled(getFill().convertToDouble(),
                 elementsOf(getInput()) + elementsOf(getGrad())));
}

/// Attention's GEMM and softmax flops: q·kᵀ and p·v per head plus the
/// softmax; causal masking halves the useful work but not what a dense
/// kernel computes.
static std::pair<int64_t, int64_t> attentionFlops(Value query, Value key,
                                                  Value value) {
  auto q = cast<ShapedType>(query.getType());
  auto k = cast<ShapedType>(key.getType());
  int64_t batch = q.getDimSize(0), seq = q.getDimSize(1),
          heads = q.getDimSize(2), headDim = q.getDimSize(3),
          kvSeq = k.getDimSize(1);
  int64_t scores = batch * heads * seq * kvSeq;
  int64_t valueDim = cast<ShapedType>(value.getType()).getDimSize(3);
  return {2 * scores * headDim + 2 * scores * valueDim, 5 * scores};
}
int64_t AttentionOp::getFlops() {
  auto [gemm, softmax] = attentionFlops(getQuery(), getKey(), getValue());
  return gemm + softmax;
}
/// The kernels save nothing of the forward: they recompute both forward
/// GEMMs (the probabilities and the output the softmax gradient needs) and
/// run four more (dV = pᵀ·dO, dP = dO·vᵀ, dQ = dS·k, dK = dSᵀ·q): three
/// times the forward's GEMM work.
int64_t AttentionGradOp::getFlops() {
  auto [gemm, softmax] = attentionFlops(getQuery(), getKey(), getValue());
  return 3 * gemm + 2 * softmax;
}

//===- GradientRules.cpp - the vector-Jacobian product of every op ----------===//
//
// Each differentiable op builds the gradients of its operands from the
// gradients of its results (GradientOpInterface). Rules are written with
// ernie ops only, so their results shard, partition and run like any other
// computation; three gradients that would be wasteful to compose
// (attention, cross-entropy, indexed accumulation) have ops of their own.
// A null result gradient means the result does not reach the loss; a null
// operand gradient means the operand takes none (integers, indices).
//
//===----------------------------------------------------------------------===//

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"

#include "mlir/IR/Builders.h"

#include <cmath>

using namespace mlir;
using namespace mlir::ernie;

namespace {

RankedTensorType typeOf(Value v) { return cast<RankedTensorType>(v.getType()); }

bool isFloatTensor(Value v) {
  return isa<FloatType>(typeOf(v).getElementType());
}

/// Small builder vocabulary for writing rules.
struct G {
  OpBuilder &b;
  Location loc;

  Value full(RankedTensorType type, double value) {
    return FullOp::create(b, loc, type, value);
  }
  Value like(Value x, double value) { return full(typeOf(x), value); }
  Value add(Value x, Value y) { return AddOp::create(b, loc, x, y); }
  Value sub(Value x, Value y) { return SubOp::create(b, loc, x, y); }
  Value mul(Value x, Value y) { return MulOp::create(b, loc, x, y); }
  Value div(Value x, Value y) { return DivOp::create(b, loc, x, y); }
  Value neg(Value x) { return NegOp::create(b, loc, x); }
  Value scale(Value x, double c) { return mul(x, like(x, c)); }
  Value cmp(CompareDirection d, Value x, Value y) {
    return CompareOp::create(b, loc, d, x, y);
  }
  Value select(Value c, Value x, Value y) {
    return SelectOp::create(b, loc, c, x, y);
  }
  Value cast(Value x, Type element) {
    auto t = typeOf(x);
    if (t.getElementType() == element)
      return x;
    return CastOp::create(b, loc, RankedTensorType::get(t.getShape(), element),
                          x);
  }
  /// Sum over `axes` keeping them as size 1.
  Value sumKeep(Value x, ArrayRef<int64_t> axes) {
    if (axes.empty())
      return x;
    return ReduceSumOp::create(b, loc, x, b.getDenseI64ArrayAttr(axes),
                               /*keepdim=*/true);
  }
  /// Broadcasts `x` (same rank, some dims of size 1) to `type`.
  Value expand(Value x, RankedTensorType type) {
    if (typeOf(x) == type)
      return x;
    auto dims = llvm::to_vector(llvm::seq<int64_t>(0, type.getRank()));
    return BroadcastOp::create(b, loc, type, x, b.getDenseI64ArrayAttr(dims));
  }
  Value reshape(Value x, RankedTensorType type) {
    if (typeOf(x) == type)
      return x;
    return ReshapeOp::create(b, loc, type, x);
  }
  /// Sums `g` down to `type`'s shape, where `type` is a broadcast source of
  /// the same rank (size-1 dims expanded).
  Value sumTo(Value g, RankedTensorType type) {
    SmallVector<int64_t> axes;
    for (int64_t d = 0; d < type.getRank(); ++d)
      if (type.getDimSize(d) == 1 && typeOf(g).getDimSize(d) != 1)
        axes.push_back(d);
    return reshape(sumKeep(g, axes), type);
  }
  /// Swaps the last two dimensions.
  Value transposeLast2(Value x) {
    int64_t r = typeOf(x).getRank();
    auto perm = llvm::to_vector(llvm::seq<int64_t>(0, r));
    std::swap(perm[r - 1], perm[r - 2]);
    return TransposeOp::create(b, loc, x, b.getDenseI64ArrayAttr(perm));
  }
  Value zerosLike(Value x) { return like(x, 0.0); }
  /// `g` or, when null, zeros shaped like `x`.
  Value orZeros(Value g, Value x) { return g ? g : zerosLike(x); }
};

/// The common shape of rules for ops with one result.
template <typename Fn>
LogicalResult unaryRule(Operation *op, OpBuilder &builder, ValueRange grads,
                        SmallVectorImpl<Value> &out, Fn fn) {
  Value g = grads[0];
  if (!g) {
    out.append(op->getNumOperands(), Value());
    return success();
  }
  G h{builder, op->getLoc()};
  fn(h, g);
  return success();
}

} // namespace

//===----------------------------------------------------------------------===//
// Elementwise unary.
//===----------------------------------------------------------------------===//

#define ERNIE_UNARY_GRAD(OP, BODY)                                             \
  LogicalResult OP::buildGradient(OpBuilder &builder, ValueRange grads,       \
                                  SmallVectorImpl<Value> &out) {               \
    return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {          \
      Value x = getOperand();                                                  \
      Value y = getResult();                                                   \
      (void)x;                                                                 \
      (void)y;                                                                 \
      out.push_back(BODY);                                                     \
    });                                                                        \
  }

ERNIE_UNARY_GRAD(NegOp, h.neg(g))
ERNIE_UNARY_GRAD(ExpOp, h.mul(g, y))
ERNIE_UNARY_GRAD(LogOp, h.div(g, x))
ERNIE_UNARY_GRAD(SqrtOp, h.div(g, h.scale(y, 2.0)))
// d rsqrt(x) = -1/2 x^-3/2 = -1/2 y^3
ERNIE_UNARY_GRAD(RsqrtOp, h.mul(g, h.scale(h.mul(y, h.mul(y, y)), -0.5)))
ERNIE_UNARY_GRAD(TanhOp, h.mul(g, h.sub(h.like(y, 1.0), h.mul(y, y))))
ERNIE_UNARY_GRAD(SigmoidOp, h.mul(g, h.mul(y, h.sub(h.like(y, 1.0), y))))
ERNIE_UNARY_GRAD(ReciprocalOp, h.neg(h.mul(g, h.mul(y, y))))
// d erf(x) = 2/sqrt(pi) exp(-x^2)
ERNIE_UNARY_GRAD(ErfOp,
                 h.mul(g, h.scale(ExpOp::create(h.b, h.loc, h.neg(h.mul(x, x))),
                                  2.0 / std::sqrt(M_PI))))
ERNIE_UNARY_GRAD(ReluOp,
                 h.select(h.cmp(CompareDirection::gt, x, h.zerosLike(x)), g,
                          h.zerosLike(g)))
// The subgradient at 0 is +1.
ERNIE_UNARY_GRAD(AbsOp, h.select(h.cmp(CompareDirection::lt, x, h.zerosLike(x)),
                                 h.neg(g), g))
#undef ERNIE_UNARY_GRAD

/// silu(x) = x s(x): d = s (1 + x (1 - s)).
LogicalResult SiluOp::buildGradient(OpBuilder &builder, ValueRange grads,
                                    SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    Value x = getOperand();
    Value s = SigmoidOp::create(h.b, h.loc, x);
    Value one = h.like(x, 1.0);
    out.push_back(h.mul(g, h.mul(s, h.add(one, h.mul(x, h.sub(one, s))))));
  });
}

/// Exact: Phi(x) + x phi(x). Tanh form: the derivative of
/// 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
LogicalResult GeluOp::buildGradient(OpBuilder &builder, ValueRange grads,
                                    SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    Value x = getOperand();
    Value one = h.like(x, 1.0);
    Value x2 = h.mul(x, x);
    if (!getApproximate()) {
      Value cdf = h.scale(
          h.add(one, ErfOp::create(h.b, h.loc, h.scale(x, M_SQRT1_2))), 0.5);
      Value pdf = h.scale(ExpOp::create(h.b, h.loc, h.scale(x2, -0.5)),
                          1.0 / std::sqrt(2.0 * M_PI));
      out.push_back(h.mul(g, h.add(cdf, h.mul(x, pdf))));
      return;
    }
    const double k = std::sqrt(2.0 / M_PI), c = 0.044715;
    Value u = h.scale(h.add(x, h.scale(h.mul(x2, x), c)), k);
    Value t = TanhOp::create(h.b, h.loc, u);
    Value du = h.scale(h.add(one, h.scale(x2, 3 * c)), k);
    Value left = h.scale(h.add(one, t), 0.5);
    Value right =
        h.mul(h.scale(x, 0.5), h.mul(h.sub(one, h.mul(t, t)), du));
    out.push_back(h.mul(g, h.add(left, right)));
  });
}

/// Float to float: cast back. From or to integers: nothing flows.
LogicalResult CastOp::buildGradient(OpBuilder &builder, ValueRange grads,
                                    SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    if (!isFloatTensor(getOperand()) || !isFloatTensor(getResult())) {
      out.push_back(Value());
      return;
    }
    out.push_back(h.cast(g, typeOf(getOperand()).getElementType()));
  });
}

LogicalResult StopGradientOp::buildGradient(OpBuilder &, ValueRange,
                                            SmallVectorImpl<Value> &out) {
  out.push_back(Value());
  return success();
}

// A stage boundary passes its gradient through (it is removed before
// autodiff in a pipelined compile; a plain compile may keep it).
LogicalResult SplitPointOp::buildGradient(OpBuilder &, ValueRange resultGrads,
                                          SmallVectorImpl<Value> &out) {
  out.push_back(resultGrads[0]);
  return success();
}

//===----------------------------------------------------------------------===//
// Elementwise binary.
//===----------------------------------------------------------------------===//

#define ERNIE_BINARY_GRAD(OP, LHS, RHS)                                        \
  LogicalResult OP::buildGradient(OpBuilder &builder, ValueRange grads,       \
                                  SmallVectorImpl<Value> &out) {               \
    return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {          \
      Value a = getLhs(), b = getRhs(), y = getResult();                       \
      (void)a;                                                                 \
      (void)b;                                                                 \
      (void)y;                                                                 \
      if (!isFloatTensor(a)) {                                                 \
        out.append(2, Value());                                                \
        return;                                                                \
      }                                                                        \
      out.push_back(LHS);                                                      \
      out.push_back(RHS);                                                      \
    });                                                                        \
  }

ERNIE_BINARY_GRAD(AddOp, g, g)
ERNIE_BINARY_GRAD(SubOp, g, h.neg(g))
ERNIE_BINARY_GRAD(MulOp, h.mul(g, b), h.mul(g, a))
ERNIE_BINARY_GRAD(DivOp, h.div(g, b), h.neg(h.div(h.mul(g, y), b)))
// Ties send the gradient to the lhs.
ERNIE_BINARY_GRAD(MaximumOp,
                  h.select(h.cmp(CompareDirection::ge, a, b), g, h.zerosLike(g)),
                  h.select(h.cmp(CompareDirection::ge, a, b), h.zerosLike(g), g))
ERNIE_BINARY_GRAD(MinimumOp,
                  h.select(h.cmp(CompareDirection::le, a, b), g, h.zerosLike(g)),
                  h.select(h.cmp(CompareDirection::le, a, b), h.zerosLike(g), g))
// d a^b = b a^(b-1) da + a^b ln(a) db
ERNIE_BINARY_GRAD(PowOp,
                  h.mul(g, h.mul(b, PowOp::create(h.b, h.loc, a,
                                                  h.sub(b, h.like(b, 1.0))))),
                  h.mul(g, h.mul(y, LogOp::create(h.b, h.loc, a))))
#undef ERNIE_BINARY_GRAD

LogicalResult SelectOp::buildGradient(OpBuilder &builder, ValueRange grads,
                                      SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    out.push_back(Value());
    if (!isFloatTensor(getOnTrue())) {
      out.append(2, Value());
      return;
    }
    Value zero = h.zerosLike(g);
    out.push_back(h.select(getCond(), g, zero));
    out.push_back(h.select(getCond(), zero, g));
  });
}

//===----------------------------------------------------------------------===//
// Linear algebra and reductions.
//===----------------------------------------------------------------------===//

/// With A' = op(A) [m, k] and B' = op(B) [k, n]: dA' = g B'^T, dB' = A'^T g,
/// each transposed back when the operand was read transposed. A rank-2 rhs
/// applied to a batched lhs sums its gradient over the batch.
LogicalResult MatmulOp::buildGradient(OpBuilder &builder, ValueRange grads,
                                      SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    Value a = getLhs(), b = getRhs();
    if (!isFloatTensor(a)) {
      out.append(2, Value());
      return;
    }
    bool ta = getTransposeA(), tb = getTransposeB();
    auto mm = [&](Value x, Value y, bool tx, bool ty) -> Value {
      return MatmulOp::create(h.b, h.loc, x, y, tx, ty);
    };
    // dA' = g . B'^T  ([..., m, k]); B'^T is B read with !tb.
    Value dAeff = mm(g, b, false, !tb);
    out.push_back(ta ? h.transposeLast2(dAeff) : dAeff);

    int64_t ra = typeOf(a).getRank(), rb = typeOf(b).getRank();
    Value aEff = ta ? h.transposeLast2(a) : a; // [..., m, k]
    Value gg = g;                              // [..., m, n]
    if (rb == 2 && ra > 2) {
      // Fold the batch into m: one 2-D product sums over it.
      auto at = typeOf(aEff), gt = typeOf(g);
      int64_t rows = at.getNumElements() / at.getShape().back();
      aEff = h.reshape(aEff, RankedTensorType::get(
                                 {rows, at.getShape().back()},
                                 at.getElementType()));
      gg = h.reshape(g, RankedTensorType::get({rows, gt.getShape().back()},
                                              gt.getElementType()));
    }
    // dB' = A'^T . g ([..., k, n]).
    Value dBeff = mm(aEff, gg, true, false);
    out.push_back(tb ? h.transposeLast2(dBeff) : dBeff);
  });
}

/// The gradient of a reduction, broadcast back over the reduced axes.
template <typename ReduceOp>
static Value expandReduced(G &h, ReduceOp op, Value g) {
  auto in = typeOf(op.getInput());
  if (!op.getKeepdim()) {
    SmallVector<int64_t> kept;
    for (int64_t d = 0; d < in.getRank(); ++d)
      kept.push_back(llvm::is_contained(op.getAxes(), d) ? 1
                                                         : in.getDimSize(d));
    g = h.reshape(g, RankedTensorType::get(kept, in.getElementType()));
  }
  return h.expand(g, in);
}

LogicalResult ReduceSumOp::buildGradient(OpBuilder &builder, ValueRange grads,
                                         SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    if (!isFloatTensor(getInput())) {
      out.push_back(Value());
      return;
    }
    out.push_back(expandReduced(h, *this, g));
  });
}

LogicalResult ReduceMeanOp::buildGradient(OpBuilder &builder, ValueRange grads,
                                          SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    int64_t count = 1;
    for (int64_t axis : getAxes())
      count *= typeOf(getInput()).getDimSize(axis);
    out.push_back(h.scale(expandReduced(h, *this, g), 1.0 / count));
  });
}

/// Ties share the gradient evenly (as PyTorch's amax does).
LogicalResult ReduceMaxOp::buildGradient(OpBuilder &builder, ValueRange grads,
                                         SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    Value x = getInput();
    if (!isFloatTensor(x)) {
      out.push_back(Value());
      return;
    }
    Value peak = expandReduced(h, *this, getResult());
    Value hit = h.cmp(CompareDirection::eq, x, peak);
    Value ones = h.cast(hit, typeOf(x).getElementType());
    Value count = h.expand(h.sumKeep(ones, getAxes()), typeOf(x));
    Value share = h.div(expandReduced(h, *this, g), count);
    out.push_back(h.select(hit, share, h.zerosLike(x)));
  });
}

/// dx = y (g - sum(g y)).
LogicalResult SoftmaxOp::buildGradient(OpBuilder &builder, ValueRange grads,
                                       SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    Value y = getResult();
    int64_t axis = getAxis();
    Value dot = h.expand(h.sumKeep(h.mul(g, y), {axis}), typeOf(y));
    out.push_back(h.mul(y, h.sub(g, dot)));
  });
}

/// dx = g - exp(y) sum(g).
LogicalResult LogSoftmaxOp::buildGradient(OpBuilder &builder,
                                          ValueRange grads,
                                          SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    Value y = getResult();
    int64_t axis = getAxis();
    Value total = h.expand(h.sumKeep(g, {axis}), typeOf(y));
    out.push_back(h.sub(g, h.mul(ExpOp::create(h.b, h.loc, y), total)));
  });
}

//===----------------------------------------------------------------------===//
// Normalisation, recomputed from the input (nothing saved but the input).
//===----------------------------------------------------------------------===//

/// The parameter gradient: sum over every leading dimension, in the
/// parameter's own element type.
static Value sumLeading(G &h, Value x, Type element) {
  auto t = typeOf(x);
  auto axes = llvm::to_vector(llvm::seq<int64_t>(0, t.getRank() - 1));
  Value s = axes.empty() ? x
                         : ReduceSumOp::create(h.b, h.loc, x,
                                               h.b.getDenseI64ArrayAttr(axes),
                                               /*keepdim=*/false);
  return h.cast(s, element);
}

/// `w` [d] broadcast over `like` [..., d], in `like`'s element type.
static Value spread(G &h, Value w, Value like) {
  auto t = typeOf(like);
  Value cast = h.cast(w, t.getElementType());
  return BroadcastOp::create(h.b, h.loc, t, cast,
                             h.b.getDenseI64ArrayAttr({t.getRank() - 1}));
}

/// Mean over the last dimension, kept, broadcast back.
static Value meanLast(G &h, Value x) {
  auto t = typeOf(x);
  int64_t last = t.getRank() - 1;
  Value s = h.expand(h.sumKeep(x, {last}), t);
  return h.scale(s, 1.0 / t.getDimSize(last));
}

/// The element type a norm's backward computes in: f32 for narrow floats
/// (bf16, f16, fp8), as Hugging Face's RMSNorm upcasts and Megatron and
/// Transformer Engine keep norm statistics, so the sums (and under
/// partition their all-reduced partials) are f32; f32 and f64 as they are.
static Type normComputeType(Value x) {
  Type e = typeOf(x).getElementType();
  return e.isF32() || e.isF64() ? e : Float32Type::get(x.getContext());
}

/// y = xhat w, xhat = x r, r = rsqrt(mean(x^2) + eps):
/// dw = sum(g xhat); dx = r (g w - xhat mean(g w xhat)).
LogicalResult RmsNormOp::buildGradient(OpBuilder &builder, ValueRange grads,
                                       SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    Type wide = normComputeType(getInput());
    Value x = h.cast(getInput(), wide);
    g = h.cast(g, wide);
    double eps = getEpsilon().convertToDouble();
    Value r = RsqrtOp::create(
        h.b, h.loc, h.add(meanLast(h, h.mul(x, x)), h.like(x, eps)));
    Value xhat = h.mul(x, r);
    Value gw = h.mul(g, spread(h, getWeight(), x));
    Value dx = h.mul(r, h.sub(gw, h.mul(xhat, meanLast(h, h.mul(gw, xhat)))));
    out.push_back(h.cast(dx, typeOf(getInput()).getElementType()));
    out.push_back(sumLeading(h, h.mul(g, xhat),
                             typeOf(getWeight()).getElementType()));
  });
}

/// xhat = (x - mean) r: dx = r (gw - mean(gw) - xhat mean(gw xhat)).
LogicalResult LayerNormOp::buildGradient(OpBuilder &builder, ValueRange grads,
                                         SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    Type wide = normComputeType(getInput());
    Value x = h.cast(getInput(), wide);
    g = h.cast(g, wide);
    double eps = getEpsilon().convertToDouble();
    Value centered = h.sub(x, meanLast(h, x));
    Value r = RsqrtOp::create(
        h.b, h.loc,
        h.add(meanLast(h, h.mul(centered, centered)), h.like(x, eps)));
    Value xhat = h.mul(centered, r);
    Value gw = h.mul(g, spread(h, getWeight(), x));
    Value dx = h.mul(
        r, h.sub(h.sub(gw, meanLast(h, gw)), h.mul(xhat, meanLast(h, h.mul(gw, xhat)))));
    Type paramType = typeOf(getWeight()).getElementType();
    out.push_back(h.cast(dx, typeOf(getInput()).getElementType()));
    out.push_back(sumLeading(h, h.mul(g, xhat), paramType));
    out.push_back(sumLeading(h, g, paramType));
  });
}

//===----------------------------------------------------------------------===//
// Shape ops: each gradient is the transposed data movement.
//===----------------------------------------------------------------------===//

LogicalResult ReshapeOp::buildGradient(OpBuilder &builder, ValueRange grads,
                                       SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    out.push_back(isFloatTensor(getInput())
                      ? h.reshape(g, typeOf(getInput()))
                      : Value());
  });
}

LogicalResult TransposeOp::buildGradient(OpBuilder &builder, ValueRange grads,
                                         SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    if (!isFloatTensor(getInput())) {
      out.push_back(Value());
      return;
    }
    SmallVector<int64_t> inverse(getPerm().size());
    for (auto [i, p] : llvm::enumerate(getPerm()))
      inverse[p] = i;
    out.push_back(TransposeOp::create(h.b, h.loc, g,
                                      h.b.getDenseI64ArrayAttr(inverse)));
  });
}

/// Sum over the new and the expanded dimensions.
LogicalResult BroadcastOp::buildGradient(OpBuilder &builder, ValueRange grads,
                                         SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    auto in = typeOf(getInput());
    if (!isFloatTensor(getInput())) {
      out.push_back(Value());
      return;
    }
    auto outType = typeOf(getResult());
    SmallVector<int64_t> axes;
    for (int64_t d = 0; d < outType.getRank(); ++d) {
      const auto *it = llvm::find(getDims(), d);
      if (it == getDims().end() ||
          in.getDimSize(it - getDims().begin()) != outType.getDimSize(d))
        axes.push_back(d);
    }
    out.push_back(h.reshape(h.sumKeep(g, axes), in));
  });
}

/// Zeros where the slice skipped.
LogicalResult SliceOp::buildGradient(OpBuilder &builder, ValueRange grads,
                                     SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    auto in = typeOf(getInput());
    if (!isFloatTensor(getInput())) {
      out.push_back(Value());
      return;
    }
    auto res = typeOf(getResult());
    SmallVector<int64_t> low, high, interior;
    for (int64_t d = 0; d < in.getRank(); ++d) {
      int64_t n = res.getDimSize(d), step = getStep()[d];
      int64_t last = n ? getStart()[d] + (n - 1) * step + 1 : getStart()[d];
      low.push_back(getStart()[d]);
      interior.push_back(step - 1);
      high.push_back(in.getDimSize(d) - last);
    }
    if (llvm::is_contained(res.getShape(), 0)) {
      out.push_back(h.zerosLike(getInput()));
      return;
    }
    out.push_back(PadOp::create(h.b, h.loc, g, h.b.getDenseI64ArrayAttr(low),
                                h.b.getDenseI64ArrayAttr(high),
                                h.b.getDenseI64ArrayAttr(interior)));
  });
}

LogicalResult PadOp::buildGradient(OpBuilder &builder, ValueRange grads,
                                   SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    auto in = typeOf(getInput());
    if (llvm::is_contained(in.getShape(), 0)) {
      out.push_back(h.zerosLike(getInput()));
      return;
    }
    SmallVector<int64_t> start, limit, step;
    for (int64_t d = 0; d < in.getRank(); ++d) {
      int64_t s = getInterior()[d] + 1;
      start.push_back(getLow()[d]);
      step.push_back(s);
      limit.push_back(getLow()[d] + (in.getDimSize(d) - 1) * s + 1);
    }
    out.push_back(SliceOp::create(h.b, h.loc, g, h.b.getDenseI64ArrayAttr(start),
                                  h.b.getDenseI64ArrayAttr(limit),
                                  h.b.getDenseI64ArrayAttr(step)));
  });
}

LogicalResult ConcatOp::buildGradient(OpBuilder &builder, ValueRange grads,
                                      SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    auto res = typeOf(getResult());
    int64_t axis = getAxis(), offset = 0;
    for (Value input : getInputs()) {
      auto t = typeOf(input);
      SmallVector<int64_t> start(t.getRank(), 0), limit(res.getShape()),
          step(t.getRank(), 1);
      start[axis] = offset;
      limit[axis] = offset + t.getDimSize(axis);
      offset += t.getDimSize(axis);
      out.push_back(isFloatTensor(input)
                        ? SliceOp::create(h.b, h.loc, g,
                                          h.b.getDenseI64ArrayAttr(start),
                                          h.b.getDenseI64ArrayAttr(limit),
                                          h.b.getDenseI64ArrayAttr(step))
                              .getResult()
                        : Value());
    }
  });
}

/// Concatenate the pieces' gradients, zeros for pieces that reach no loss.
LogicalResult SplitOp::buildGradient(OpBuilder &builder, ValueRange grads,
                                     SmallVectorImpl<Value> &out) {
  if (llvm::all_of(grads, [](Value g) { return !g; }) ||
      !isFloatTensor(getInput())) {
    out.push_back(Value());
    return success();
  }
  G h{builder, getLoc()};
  SmallVector<Value> pieces;
  for (auto [g, result] : llvm::zip(grads, getResults()))
    pieces.push_back(h.orZeros(g, result));
  out.push_back(ConcatOp::create(builder, getLoc(), pieces, getAxis()));
  return success();
}

LogicalResult GatherOp::buildGradient(OpBuilder &builder, ValueRange grads,
                                      SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    if (!isFloatTensor(getInput())) {
      out.append(2, Value());
      return;
    }
    out.push_back(IndexAddOp::create(h.b, h.loc, h.zerosLike(getInput()),
                                     getIndices(), g, getAxis()));
    out.push_back(Value());
  });
}

LogicalResult IndexAddOp::buildGradient(OpBuilder &builder, ValueRange grads,
                                        SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    if (!isFloatTensor(getBase())) {
      out.append(3, Value());
      return;
    }
    out.push_back(g);
    out.push_back(Value());
    out.push_back(GatherOp::create(h.b, h.loc, g, getIndices(), getAxis()));
  });
}

/// Rows accumulate the gradients of every position that looked them up; the
/// padding row gets none.
LogicalResult EmbeddingOp::buildGradient(OpBuilder &builder, ValueRange grads,
                                         SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    out.push_back(Value());
    if (std::optional<uint64_t> pad = getPaddingIdx()) {
      auto ids = typeOf(getIndices());
      Value padId = FullOp::create(
          h.b, h.loc, ids,
          IntegerAttr::get(ids.getElementType(), static_cast<int64_t>(*pad)));
      Value keep = h.cmp(CompareDirection::ne, getIndices(), padId);
      auto wide = RankedTensorType::get(typeOf(g).getShape(),
                                        h.b.getI1Type());
      auto dims = llvm::to_vector(llvm::seq<int64_t>(0, ids.getRank()));
      Value keepWide = BroadcastOp::create(h.b, h.loc, wide, keep,
                                           h.b.getDenseI64ArrayAttr(dims));
      g = h.select(keepWide, g, h.zerosLike(g));
    }
    out.push_back(IndexAddOp::create(h.b, h.loc, h.zerosLike(getWeight()),
                                     getIndices(), g, 0));
  });
}

/// With y = x W per expert over the filled rows: dx = dy W^T over the same
/// rows, dW = x^T dy summed over them; the rows have no gradient.
LogicalResult ExpertMatmulOp::buildGradient(OpBuilder &builder,
                                            ValueRange grads,
                                            SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    bool t = getTransposeWeight();
    out.push_back(ExpertMatmulOp::create(
        h.b, h.loc, g, getWeight(), getRows(),
        t ? UnitAttr() : h.b.getUnitAttr(), getFillAttr()));
    // A transposed weight [E, out, in] takes dy^T x.
    out.push_back(
        t ? ExpertWeightGradOp::create(h.b, h.loc, g, getInput(), getRows(),
                                       getFillAttr())
          : ExpertWeightGradOp::create(h.b, h.loc, getInput(), g, getRows(),
                                       getFillAttr()));
    out.push_back(Value());
  });
}

// Dispatch and combine are each other's transpose in the data and bilinear
// in (data, weights): the data's gradient is the other op with the same
// weights, the weights' gradient the dot product of each choice's token
// with its slot.

LogicalResult MoeDispatchOp::buildGradient(OpBuilder &builder,
                                           ValueRange grads,
                                           SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    out.push_back(MoeCombineOp::create(h.b, h.loc, g, getExperts(),
                                       getSlots(), getWeights()));
    out.append(2, Value());
    out.push_back(MoeWeightsGradOp::create(h.b, h.loc, getInput(), g,
                                           getExperts(), getSlots()));
  });
}

LogicalResult MoeCombineOp::buildGradient(OpBuilder &builder, ValueRange grads,
                                          SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    auto buffers = typeOf(getInput());
    out.push_back(MoeDispatchOp::create(
        h.b, h.loc, g, getExperts(), getSlots(), getWeights(),
        buffers.getDimSize(0), buffers.getDimSize(2)));
    out.append(2, Value());
    out.push_back(MoeWeightsGradOp::create(h.b, h.loc, g, getInput(),
                                           getExperts(), getSlots()));
  });
}

/// The value gradients go back to where they were taken from: compare each
/// index with every position along the axis and sum over k.
LogicalResult TopkOp::buildGradient(OpBuilder &builder, ValueRange grads,
                                    SmallVectorImpl<Value> &out) {
  Value g = grads[0];
  if (!g || !isFloatTensor(getInput())) {
    out.push_back(Value());
    return success();
  }
  G h{builder, getLoc()};
  auto in = typeOf(getInput());
  auto idx = typeOf(getIndices());
  int64_t rank = in.getRank(), axis = getAxis(), n = in.getDimSize(axis);
  // [..., k, ...] -> [..., k, ..., n]: one-hot positions along a new last dim.
  SmallVector<int64_t> wideShape(idx.getShape());
  wideShape.push_back(n);
  auto keepDims = llvm::to_vector(llvm::seq<int64_t>(0, rank));
  auto wideIdx = RankedTensorType::get(wideShape, idx.getElementType());
  Value idxWide = BroadcastOp::create(builder, getLoc(), wideIdx, getIndices(),
                                      builder.getDenseI64ArrayAttr(keepDims));
  Value positions = IotaOp::create(builder, getLoc(), wideIdx, rank);
  Value hit = h.cmp(CompareDirection::eq, idxWide, positions);
  auto wideG = RankedTensorType::get(wideShape, in.getElementType());
  Value gWide = BroadcastOp::create(builder, getLoc(), wideG, g,
                                    builder.getDenseI64ArrayAttr(keepDims));
  Value placed = h.select(hit, gWide, h.full(wideG, 0.0));
  // Sum over k (the axis), leaving [..., ..., n]; then move n to the axis.
  Value summed = ReduceSumOp::create(builder, getLoc(), placed,
                                     builder.getDenseI64ArrayAttr({axis}),
                                     /*keepdim=*/false);
  SmallVector<int64_t> perm;
  for (int64_t d = 0; d < rank; ++d)
    perm.push_back(d < axis ? d : (d == axis ? rank - 1 : d - 1));
  out.push_back(TransposeOp::create(builder, getLoc(), summed,
                                    builder.getDenseI64ArrayAttr(perm)));
  return success();
}

//===----------------------------------------------------------------------===//
// Transformer ops.
//===----------------------------------------------------------------------===//

/// A rotation's transpose is the rotation by the opposite angle.
LogicalResult RopeOp::buildGradient(OpBuilder &builder, ValueRange grads,
                                    SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    Value back = NegOp::create(h.b, h.loc, getPositions());
    out.push_back(RopeOp::create(h.b, h.loc, g.getType(), g, back,
                                 getThetaAttr(), getInterleavedAttr()));
    out.push_back(Value());
  });
}

LogicalResult AttentionOp::buildGradient(OpBuilder &builder, ValueRange grads,
                                         SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    auto grad = AttentionGradOp::create(h.b, h.loc, getQuery(), getKey(),
                                        getValue(), g, getCausalAttr(),
                                        getScaleAttr(), getWindowAttr());
    out.append({grad.getDquery(), grad.getDkey(), grad.getDvalue()});
  });
}

LogicalResult CrossEntropyOp::buildGradient(OpBuilder &builder,
                                            ValueRange grads,
                                            SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    out.push_back(CrossEntropyGradOp::create(
        h.b, h.loc, getLogits(), getLabels(), g, getIgnoreIndexAttr(),
        getReductionAttr()));
    out.push_back(Value());
  });
}

//===----------------------------------------------------------------------===//
// Placement ops: the value is unchanged, so the gradient passes through.
//===----------------------------------------------------------------------===//

/// The gradient keeps the constraint's split dimensions (the backward of a
/// column-parallel activation is column-parallel, as Megatron and GSPMD lay
/// it out) but not its pending reductions: the adjoint of "sum the summands
/// across ranks" hands every rank the whole gradient. A constraint that
/// splits nothing asks for a whole value — sequence parallelism's gather
/// before a column-parallel matmul — and the adjoint of that gather is a
/// reduce-scatter, not an all-reduce: its gradient is left to propagation,
/// so the pending sum goes straight to the split the backward needs next.
LogicalResult ShardingConstraintOp::buildGradient(OpBuilder &builder,
                                                  ValueRange grads,
                                                  SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out, [&](G &h, Value g) {
    ShardingAttr sharding = getSharding();
    bool splitsNothing = llvm::all_of(
        llvm::seq<int64_t>(0, sharding.getRank()),
        [&](int64_t d) { return sharding.getDimAxes(d).empty(); });
    if (splitsNothing) {
      out.push_back(g);
      return;
    }
    ShardingAttr split = ShardingAttr::get(
        sharding.getContext(), sharding.getMesh(), sharding.getDims(),
        ArrayAttr::get(sharding.getContext(), {}),
        ArrayAttr::get(sharding.getContext(), {}));
    out.push_back(ShardingConstraintOp::create(h.b, h.loc, g, split,
                                               getPriorityAttr()));
  });
}

/// A reshard only moves data; where the gradient lives is left to
/// propagation.
LogicalResult ReshardOp::buildGradient(OpBuilder &builder, ValueRange grads,
                                       SmallVectorImpl<Value> &out) {
  return unaryRule(*this, builder, grads, out,
                   [&](G &, Value g) { out.push_back(g); });
}

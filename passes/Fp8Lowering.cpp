//===- Fp8Lowering.cpp - the linear layers' GEMMs in FP8 ---------------------===//
//
// Finds the GEMMs of each selected linear layer — forward, data gradient,
// weight gradient — and makes each an ernie.scaled_matmul of operands
// quantised with per-tensor scales computed from this step's amax. The
// quantisation is written in ordinary ernie ops (abs, reduce_max, div,
// mul, cast), so propagation shards the amax like any reduction and CSE
// shares a quantised tensor between the forward and the weight gradient.
//
//===----------------------------------------------------------------------===//

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/Support/Regex.h"

#include <cfloat>
#include <limits>

namespace mlir::ernie {
#define GEN_PASS_DEF_FP8LOWERINGPASS
#include "ernie/Passes/Passes.h.inc"
} // namespace mlir::ernie

using namespace mlir;
using namespace mlir::ernie;

namespace {

constexpr StringLiteral kGradOfAttrName = "ernie.grad_of";

/// An fp8 format by its option name: the element type and largest finite.
struct Fp8Format {
  Type type;
  double max;
};

FailureOr<Fp8Format> parseFormat(MLIRContext *ctx, StringRef name) {
  if (name == "e4m3")
    return Fp8Format{Float8E4M3FNType::get(ctx), 448.0};
  if (name == "e5m2")
    return Fp8Format{Float8E5M2Type::get(ctx), 57344.0};
  return failure();
}

/// One GEMM to lower, with the format of each operand.
struct Gemm {
  MatmulOp op;
  Fp8Format lhs, rhs;
};

/// `x` quantised per tensor: (codes, 1 / s) with s = max / amax(x).
/// Per-tensor scaling commutes with reshapes, so a reshaped value is
/// quantised before its reshape: the weight gradient's 2-D view of a layer
/// input then shares the forward's codes (CSE), and the backward keeps the
/// input in fp8.
std::pair<Value, Value> quantize(OpBuilder &b, Location loc, Value x,
                                 Fp8Format format) {
  if (auto reshape = x.getDefiningOp<ReshapeOp>()) {
    auto [codes, inverse] = quantize(b, loc, reshape.getInput(), format);
    auto type = cast<RankedTensorType>(x.getType()).clone(format.type);
    return {ReshapeOp::create(b, loc, type, codes), inverse};
  }
  auto type = cast<RankedTensorType>(x.getType());
  Type f32 = b.getF32Type();
  auto scalar = RankedTensorType::get({}, f32);
  auto wide = type.clone(f32);
  if (type.getElementType() != f32)
    x = CastOp::create(b, loc, wide, x);
  auto all = llvm::to_vector(llvm::seq<int64_t>(0, type.getRank()));
  Value amax = ReduceMaxOp::create(b, loc, scalar, AbsOp::create(b, loc, x),
                                   b.getDenseI64ArrayAttr(all), false);
  auto constant = [&](double v) { return FullOp::create(b, loc, scalar, v); };
  // s = max / amax, but 1 where amax is 0 or infinite, and at most FLT_MAX
  // (NaN stays NaN: the step's non-finite check reports it).
  Value s = DivOp::create(b, loc, constant(format.max), amax);
  s = MinimumOp::create(b, loc, s, constant(FLT_MAX));
  for (double bad : {0.0, std::numeric_limits<double>::infinity()}) {
    Value hit = CompareOp::create(b, loc, CompareDirection::eq, amax,
                                  constant(bad));
    s = SelectOp::create(b, loc, hit, constant(1.0), s);
  }
  Value scaled = MulOp::create(
      b, loc, x, BroadcastOp::create(b, loc, wide, s, b.getDenseI64ArrayAttr({})));
  Value codes = CastOp::create(b, loc, type.clone(format.type), scaled);
  Value inverse = DivOp::create(b, loc, constant(1.0), s);
  return {codes, inverse};
}

void lower(const Gemm &gemm) {
  MatmulOp op = gemm.op;
  OpBuilder b(op);
  Location loc = op.getLoc();
  auto [a, sa] = quantize(b, loc, op.getLhs(), gemm.lhs);
  auto [c, sc] = quantize(b, loc, op.getRhs(), gemm.rhs);
  auto type = cast<RankedTensorType>(op.getType());
  Type out = type.getElementType().isBF16() ? type.getElementType()
                                            : Type(b.getF32Type());
  Value y = ScaledMatmulOp::create(b, loc, type.clone(out), a, c, sa, sc,
                                   op.getTransposeAAttr(),
                                   op.getTransposeBAttr());
  if (out != type.getElementType())
    y = CastOp::create(b, loc, type, y);
  op.getResult().replaceAllUsesWith(y);
  op.erase();
}

/// The matmuls a gradient is the (possibly summed, reshaped, constrained)
/// result of: the weight-gradient GEMMs of its parameter.
void collectProducers(Value v, SmallVectorImpl<MatmulOp> &out) {
  Operation *def = v.getDefiningOp();
  if (!def)
    return;
  if (auto matmul = dyn_cast<MatmulOp>(def)) {
    out.push_back(matmul);
    return;
  }
  if (isa<ShardingConstraintOp, ReshapeOp, CastOp, TransposeOp>(def))
    return collectProducers(def->getOperand(0), out);
  if (auto add = dyn_cast<AddOp>(def)) {
    collectProducers(add.getLhs(), out);
    collectProducers(add.getRhs(), out);
  }
}

struct Fp8LoweringPass : ernie::impl::Fp8LoweringPassBase<Fp8LoweringPass> {
  using Fp8LoweringPassBase::Fp8LoweringPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    MLIRContext *ctx = &getContext();
    if (recipe != "current") {
      module.emitError() << "fp8 recipe '" << recipe
                         << "' is not available (known: current; delayed and "
                            "blockwise are not implemented yet)";
      return signalPassFailure();
    }
    FailureOr<Fp8Format> fwd = parseFormat(ctx, fwdFormat);
    FailureOr<Fp8Format> grad = parseFormat(ctx, gradFormat);
    if (failed(fwd) || failed(grad)) {
      module.emitError() << "unknown fp8 format '"
                         << (failed(fwd) ? fwdFormat : gradFormat)
                         << "' (known: e4m3, e5m2)";
      return signalPassFailure();
    }
    llvm::Regex excluded(exclude), included(include);
    std::string why;
    for (auto [name, re] : {std::pair<StringRef, llvm::Regex *>{"exclude", &excluded},
                            {"include", &included}})
      if (!re->isValid(why)) {
        module.emitError() << "fp8 " << name << " is not a regex: " << why;
        return signalPassFailure();
      }

    for (auto fn : module.getOps<func::FuncOp>()) {
      if (fn.isExternal())
        continue;
      if (failed(lowerFunction(fn, included, excluded, *fwd, *grad)))
        return signalPassFailure();
    }
  }

  LogicalResult lowerFunction(func::FuncOp fn, llvm::Regex &included,
                              llvm::Regex &excluded, Fp8Format fwd,
                              Fp8Format grad) {
    // Ops after the loss are the backward: a matmul there reading W on
    // the right is a data gradient, its left operand a gradient.
    Operation *loss = getLocalLossOp(fn);
    auto inBackward = [&](Operation *op) {
      return loss && loss->isBeforeInBlock(op);
    };
    SmallVector<Gemm> gemms;
    llvm::StringMap<BlockArgument> selected;
    for (BlockArgument arg : fn.getArguments()) {
      auto name = fn.getArgAttrOfType<StringAttr>(arg.getArgNumber(),
                                                  ErnieDialect::kParamAttrName);
      if (!name || !included.match(name.getValue()) ||
          excluded.match(name.getValue()))
        continue;
      SmallVector<MatmulOp> reads;
      for (OpOperand &use : arg.getUses()) {
        auto matmul = dyn_cast<MatmulOp>(use.getOwner());
        if (!matmul || use.getOperandNumber() != 1) {
          // Only an explicit include can ask this of a non-matmul use; the
          // default selects the parameters linear layers multiply.
          if (include == ".*") {
            reads.clear();
            break;
          }
          return use.getOwner()->emitError()
                 << "fp8 is requested for parameter '" << name.getValue()
                 << "', but this '" << use.getOwner()->getName()
                 << "' reads it, and only matmuls run in fp8";
        }
        reads.push_back(matmul);
      }
      if (reads.empty())
        continue;
      selected[name.getValue()] = arg;
      for (MatmulOp m : reads)
        gemms.push_back({m, inBackward(m) ? grad : fwd, fwd});
    }
    // Weight gradients: the matmuls whose products are W's gradient.
    Operation *ret = fn.getBody().front().getTerminator();
    for (unsigned i = 0; i < fn.getNumResults(); ++i) {
      auto of = fn.getResultAttrOfType<StringAttr>(i, kGradOfAttrName);
      if (!of || !selected.count(of.getValue()))
        continue;
      SmallVector<MatmulOp> producers;
      collectProducers(ret->getOperand(i), producers);
      for (MatmulOp m : producers)
        if (!llvm::any_of(gemms, [&](const Gemm &g) { return g.op == m; }))
          gemms.push_back({m, fwd, grad});
    }
    for (const Gemm &g : gemms)
      lower(g);
    return success();
  }
};

} // namespace

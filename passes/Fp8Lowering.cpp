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
#include "mlir/IR/SymbolTable.h"
#include "llvm/Support/Regex.h"

#include <array>
#include <cfloat>
#include <tuple>
#include <cmath>
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

/// How scales are chosen.
struct Recipe {
  bool delayed = false;
  /// Blockwise: tiles of `block` along a GEMM's contraction (activations,
  /// gradients) and block x block squares (weights), 0 for per-tensor.
  int64_t block = 0;
  int64_t historyLength = 16;
  int64_t margin = 0;
  bool mostRecent = false; // amax-compute=most_recent, else max
  bool pow2 = false;       // scales rounded down to powers of two
};

/// Quantises the GEMM operands of one function, each tensor once: the
/// forward's codes of a layer input serve its weight gradient too, so the
/// backward keeps the input in fp8.
class Quantizer {
public:
  Quantizer(const Recipe &recipe, func::FuncOp fn, bool delayed)
      : recipe(recipe), fn(fn), delayed(delayed) {}

  /// (codes, 1 / s) of `x` in `format`; with delayed scaling `name` names
  /// the amax history its scale comes from. Per-tensor scaling commutes
  /// with reshapes, so a reshaped value is quantised before its reshape.
  std::pair<Value, Value> get(OpBuilder &b, Location loc, Value x,
                              Fp8Format format, StringRef name) {
    if (auto reshape = x.getDefiningOp<ReshapeOp>()) {
      auto [codes, inverse] = get(b, loc, reshape.getInput(), format, name);
      auto type = cast<RankedTensorType>(x.getType()).clone(format.type);
      return {ReshapeOp::create(b, loc, type, codes), inverse};
    }
    auto key = std::make_pair(x, format.type);
    if (auto it = cache.find(key); it != cache.end())
      return it->second;
    return cache[key] = quantize(b, loc, x, format, name);
  }

  bool isBlockwise() const { return recipe.block > 0; }
  int64_t blockSize() const { return recipe.block; }

  /// Delayed scaling: each history (name, argument, updated value).
  SmallVector<std::tuple<std::string, BlockArgument, Value>> histories;

private:
  Value scalar(OpBuilder &b, Location loc, double v) {
    return FullOp::create(b, loc, RankedTensorType::get({}, b.getF32Type()), v);
  }

public:
  /// Blockwise: `x` quantised in tiles of `tile` over its last two
  /// dimensions (one scale per tile: s = max / amax), returned dequantised
  /// as f32 — codes times their tile's 1 / s — for an f32 GEMM: the product
  /// of the exact fp8 values and their scales, accumulated in f32.
  FailureOr<Value> blockwise(OpBuilder &b, Location loc, Value x,
                             Fp8Format format, std::array<int64_t, 2> tile,
                             StringRef what, Operation *gemm) {
    auto key = std::make_tuple(x, format.type, tile[0], tile[1]);
    bool forward = isForward(gemm);
    if (auto it = tiled.find(key); it != tiled.end()) {
      Tiled &done = it->second;
      // The backward reads a forward operand again (a weight, in the data
      // gradient): from its fp8 codes, so only those are kept.
      if (done.forward && !forward) {
        if (!done.again)
          done.again = dequantiseByScale(b, loc, done.codes, done.scale,
                                         cast<RankedTensorType>(x.getType()));
        return done.again;
      }
      return done.whole;
    }
    Value source = x;
    // A layer input the forward tiled along its rows and the weight
    // gradient reads transposed (block x 1) starts from the forward's fp8
    // codes and scales, so the step keeps only those from forward to
    // backward (DeepSeek-V3 caches activations in fp8). It is dequantised
    // by dividing by the scale: the forward's multiplication by 1 / s would
    // be merged with this by CSE and keep the f32 operand alive after all.
    if (tile[0] > 1 && tile[1] == 1) {
      // The weight gradient flattens the tokens first: rows merge, the
      // tiled last dimension stays, so the forward's tiles still apply.
      Value forwardOperand = x;
      auto merged = x.getDefiningOp<ReshapeOp>();
      if (merged && cast<RankedTensorType>(merged.getInput().getType())
                            .getShape()
                            .back() ==
                        cast<RankedTensorType>(x.getType()).getShape().back())
        forwardOperand = merged.getInput();
      if (auto it = forwardCodes.find({forwardOperand, format.type});
          it != forwardCodes.end()) {
        Value values = dequantiseByScale(
            b, loc, it->second.first, it->second.second,
            cast<RankedTensorType>(forwardOperand.getType()));
        x = forwardOperand == x
                ? values
                : ReshapeOp::create(
                      b, loc,
                      cast<RankedTensorType>(x.getType()).clone(b.getF32Type()),
                      values)
                      .getResult();
      }
    }
    auto type = cast<RankedTensorType>(x.getType());
    int64_t rank = type.getRank();
    SmallVector<int64_t> tiledShape(type.getShape().drop_back(2));
    for (int64_t i = 0; i < 2; ++i) {
      int64_t size = type.getDimSize(rank - 2 + i);
      if (size % tile[i] != 0)
        return gemm->emitError()
               << "fp8 blockwise: dimension " << rank - 2 + i << " of the "
               << what << " has size " << size
               << ", which tiles of " << tile[0] << "x" << tile[1]
               << " do not divide";
      tiledShape.append({size / tile[i], tile[i]});
    }
    Type f32 = b.getF32Type();
    auto wideTiled = RankedTensorType::get(tiledShape, f32);
    if (type.getElementType() != f32)
      x = CastOp::create(b, loc, type.clone(f32), x);
    auto cut = ReshapeOp::create(b, loc, wideTiled, x);
    cut->setAttr(ErnieDialect::kFp8TileAttrName, b.getDenseI64ArrayAttr(tile));
    Value tiles = cut;
    // One amax per tile: reduce the in-tile dimensions (rank - 1, rank + 1).
    SmallVector<int64_t> scaleShape(type.getShape().drop_back(2));
    scaleShape.append({tiledShape[rank - 2], tiledShape[rank]});
    auto scaleType = RankedTensorType::get(scaleShape, f32);
    Value amax = ReduceMaxOp::create(
        b, loc, scaleType, AbsOp::create(b, loc, tiles),
        b.getDenseI64ArrayAttr({rank - 1, rank + 1}), false);
    Value s = scaleFor(b, loc, amax, format);
    SmallVector<int64_t> toTiles = llvm::to_vector(llvm::seq<int64_t>(0, rank - 2));
    toTiles.append({rank - 2, rank});
    auto spread = [&](Value perTile) {
      return BroadcastOp::create(b, loc, wideTiled, perTile,
                                 b.getDenseI64ArrayAttr(toTiles));
    };
    Value codes = CastOp::create(b, loc, wideTiled.clone(format.type),
                                 MulOp::create(b, loc, tiles, spread(s)));
    Value inverse = DivOp::create(b, loc, constant(b, loc, scaleType, 1.0), s);
    Value dequantised = MulOp::create(
        b, loc, CastOp::create(b, loc, wideTiled, codes), spread(inverse));
    Value whole = ReshapeOp::create(b, loc, type.clone(f32), dequantised);
    tiled[key] = {whole, codes, s, forward, Value()};
    if (tile[0] == 1 && tile[1] > 1 && forward)
      forwardCodes[{source, format.type}] = {codes, s};
    return whole;
  }

  /// `codes` (tiled as [..., rows/r, r, cols/c, c]) over their per-tile
  /// scales `s`, back in `type`'s shape as f32.
  Value dequantiseByScale(OpBuilder &b, Location loc, Value codes, Value s,
                          RankedTensorType type) {
    auto tiledType = cast<RankedTensorType>(codes.getType());
    auto wide = tiledType.clone(b.getF32Type());
    // The scales with unit in-tile dimensions, then expanded: not the
    // forward's broadcast of `s`, which CSE would reuse (a full-size f32
    // tensor kept from forward to backward).
    SmallVector<int64_t> unitTiles(tiledType.getShape());
    int64_t n = unitTiles.size();
    unitTiles[n - 3] = unitTiles[n - 1] = 1;
    Value units = ReshapeOp::create(
        b, loc, RankedTensorType::get(unitTiles, b.getF32Type()), s);
    Value scale = BroadcastOp::create(
        b, loc, wide, units,
        b.getDenseI64ArrayAttr(llvm::to_vector(llvm::seq<int64_t>(0, n))));
    // Likewise the codes are widened as a matrix, not as the forward's
    // tiles: only the one-byte codes live from forward to backward.
    Value matrix = ReshapeOp::create(b, loc, type.clone(tiledType.getElementType()),
                                     codes);
    Value widened = ReshapeOp::create(
        b, loc, wide,
        CastOp::create(b, loc, type.clone(b.getF32Type()), matrix));
    Value values = DivOp::create(b, loc, widened, scale);
    return ReshapeOp::create(b, loc, type.clone(b.getF32Type()), values);
  }

  /// Before the loss: a forward GEMM.
  bool isForward(Operation *gemm) {
    if (!lossOp)
      lossOp = getLocalLossOp(fn);
    return lossOp && gemm->isBeforeInBlock(lossOp);
  }

private:
  Value constant(OpBuilder &b, Location loc, RankedTensorType type, double v) {
    return FullOp::create(b, loc, type, v);
  }

  /// The largest power of two not above `s` (DeepSeek-V3's scales: the
  /// dequantisation multiplier 1 / s is then exact): 2^trunc(log2 s) through
  /// ln / ln 2, at most 2^127, then one halving or doubling where rounding
  /// or truncation put it on the wrong side of s. NaN stays NaN.
  Value pow2Floor(OpBuilder &b, Location loc, Value s) {
    auto type = cast<RankedTensorType>(s.getType());
    auto c = [&](double v) { return constant(b, loc, type, v); };
    auto compare = [&](CompareDirection d, Value x, Value y) {
      return CompareOp::create(b, loc, d, x, y);
    };
    Value log2 =
        DivOp::create(b, loc, LogOp::create(b, loc, s), c(std::log(2.0)));
    Value k = CastOp::create(
        b, loc, type,
        CastOp::create(b, loc, type.clone(b.getI32Type()),
                       MinimumOp::create(b, loc, log2, c(127.0))));
    Value p = PowOp::create(b, loc, c(2.0), k);
    p = SelectOp::create(b, loc, compare(CompareDirection::gt, p, s),
                         MulOp::create(b, loc, p, c(0.5)), p);
    Value twice = MulOp::create(b, loc, p, c(2.0));
    p = SelectOp::create(b, loc, compare(CompareDirection::le, twice, s),
                         twice, p);
    return SelectOp::create(b, loc, compare(CompareDirection::ne, s, s), s, p);
  }

  /// s = max / amax / 2^margin, but 1 where amax is 0 or infinite, and at
  /// most FLT_MAX (NaN stays NaN: the step's non-finite check reports it);
  /// elementwise for blockwise amaxes; with pow2, rounded down to a power
  /// of two.
  Value scaleFor(OpBuilder &b, Location loc, Value amax, Fp8Format format) {
    auto type = cast<RankedTensorType>(amax.getType());
    Value s = DivOp::create(
        b, loc, constant(b, loc, type, std::ldexp(format.max, -recipe.margin)),
        amax);
    s = MinimumOp::create(b, loc, s, constant(b, loc, type, FLT_MAX));
    for (double bad : {0.0, std::numeric_limits<double>::infinity()}) {
      Value hit = CompareOp::create(b, loc, CompareDirection::eq, amax,
                                    constant(b, loc, type, bad));
      s = SelectOp::create(b, loc, hit, constant(b, loc, type, 1.0), s);
    }
    return recipe.pow2 ? pow2Floor(b, loc, s) : s;
  }

  std::pair<Value, Value> quantize(OpBuilder &b, Location loc, Value x,
                                   Fp8Format format, StringRef name) {
    auto type = cast<RankedTensorType>(x.getType());
    Type f32 = b.getF32Type();
    auto wide = type.clone(f32);
    if (type.getElementType() != f32)
      x = CastOp::create(b, loc, wide, x);
    auto all = llvm::to_vector(llvm::seq<int64_t>(0, type.getRank()));
    auto scalarType = RankedTensorType::get({}, f32);
    Value amax = ReduceMaxOp::create(b, loc, scalarType,
                                     AbsOp::create(b, loc, x),
                                     b.getDenseI64ArrayAttr(all), false);
    Value s = delayed ? historyScale(b, loc, amax, format, name)
                      : scaleFor(b, loc, amax, format);
    Value scaled = MulOp::create(
        b, loc, x,
        BroadcastOp::create(b, loc, wide, s, b.getDenseI64ArrayAttr({})));
    Value codes = CastOp::create(b, loc, type.clone(format.type), scaled);
    Value inverse = DivOp::create(b, loc, scalar(b, loc, 1.0), s);
    return {codes, inverse};
  }

  /// Transformer Engine's delayed scaling: the scale comes from the amax
  /// history of earlier steps (its max, or the most recent), a new argument
  /// of the function; this step's amax enters the history at the front.
  Value historyScale(OpBuilder &b, Location loc, Value amaxNow,
                     Fp8Format format, StringRef name) {
    int64_t n = recipe.historyLength;
    auto historyType = RankedTensorType::get({n}, b.getF32Type());
    auto one = RankedTensorType::get({1}, b.getF32Type());
    unsigned index = fn.getNumArguments();
    (void)fn.insertArgument(
        index, historyType,
        b.getDictionaryAttr(b.getNamedAttr(ErnieDialect::kOptStateAttrName,
                                           b.getStringAttr(name))),
        fn.getLoc());
    BlockArgument history = fn.getArgument(index);
    auto slice = [&](int64_t from, int64_t to) {
      return SliceOp::create(b, loc,
                             RankedTensorType::get({to - from}, b.getF32Type()),
                             history, b.getDenseI64ArrayAttr({from}),
                             b.getDenseI64ArrayAttr({to}),
                             b.getDenseI64ArrayAttr({1}))
          .getResult();
    };
    Value past =
        recipe.mostRecent
            ? ReshapeOp::create(b, loc, RankedTensorType::get({}, b.getF32Type()),
                                slice(0, 1))
                  .getResult()
            : ReduceMaxOp::create(b, loc,
                                  RankedTensorType::get({}, b.getF32Type()),
                                  history, b.getDenseI64ArrayAttr({0}), false)
                  .getResult();
    Value now = ReshapeOp::create(b, loc, one, amaxNow);
    Value updated =
        n == 1 ? now
               : ConcatOp::create(b, loc, historyType,
                                  ValueRange{now, slice(0, n - 1)},
                                  b.getI64IntegerAttr(0))
                     .getResult();
    histories.push_back({name.str(), history, updated});
    return scaleFor(b, loc, past, format);
  }

  const Recipe &recipe;
  func::FuncOp fn;
  bool delayed;
  llvm::DenseMap<std::pair<Value, Type>, std::pair<Value, Value>> cache;
  /// Blockwise: a quantisation — the dequantised operand, its codes and
  /// per-tile scales, whether a forward GEMM made it, and the backward's
  /// own dequantisation of those codes.
  struct Tiled {
    Value whole, codes, scale;
    bool forward;
    Value again;
  };
  llvm::DenseMap<std::tuple<Value, Type, int64_t, int64_t>, Tiled> tiled;
  /// Blockwise: each forward 1 x block quantisation's (codes, scales).
  llvm::DenseMap<std::pair<Value, Type>, std::pair<Value, Value>> forwardCodes;
  Operation *lossOp = nullptr;
};

/// One GEMM to lower — a matmul, or an expert GEMM (`expert_matmul`,
/// `expert_weight_grad`) — with the format and history name of each
/// operand.
struct Gemm {
  Operation *op;
  Fp8Format lhs, rhs;
  std::string lhsName, rhsName;
  /// The right operand is the layer's weight (forward, data gradient).
  bool rhsIsWeight = true;

  Value lhsValue() const { return op->getOperand(0); }
  Value rhsValue() const { return op->getOperand(1); }
  /// Whether the contraction runs along the left operand's rows (a
  /// transposed read: the weight gradient's) and across the right one's.
  bool lhsTransposed() const {
    if (auto m = dyn_cast<MatmulOp>(op))
      return m.getTransposeA();
    return isa<ExpertWeightGradOp>(op);
  }
  bool rhsTransposed() const {
    if (auto m = dyn_cast<MatmulOp>(op))
      return m.getTransposeB();
    if (auto e = dyn_cast<ExpertMatmulOp>(op))
      return e.getTransposeWeight();
    return false;
  }
  /// The same GEMM of other (f32) operands: its type inferred from them.
  Value rebuild(OpBuilder &b, Value lhs, Value rhs) const {
    Location loc = op->getLoc();
    if (auto m = dyn_cast<MatmulOp>(op))
      return MatmulOp::create(b, loc, lhs, rhs, m.getTransposeAAttr(),
                              m.getTransposeBAttr());
    if (auto e = dyn_cast<ExpertMatmulOp>(op))
      return ExpertMatmulOp::create(b, loc, lhs, rhs, e.getRows(),
                                    e.getTransposeWeightAttr(),
                                    e.getFillAttr());
    auto w = cast<ExpertWeightGradOp>(op);
    return ExpertWeightGradOp::create(b, loc, lhs, rhs, w.getRows(),
                                      w.getFillAttr());
  }
};

/// Gives every op a builder creates the pipeline placement (stage, backward)
/// of the GEMM it lowers, so the quantisation of a gradient runs on the
/// GEMM's stage rather than wherever its operand came from.
struct InheritPlacement : OpBuilder::Listener {
  explicit InheritPlacement(Operation *gemm) : gemm(gemm) {}
  void notifyOperationInserted(Operation *op, OpBuilder::InsertPoint) override {
    for (StringRef name :
         {ErnieDialect::kStageAttrName, ErnieDialect::kBackwardAttrName})
      if (Attribute a = gemm->getAttr(name); a && !op->hasAttr(name))
        op->setAttr(name, a);
  }
  Operation *gemm;
};

/// Replaces the GEMM `op` by `y` (its product in another element type),
/// cast back to the GEMM's type where they differ.
void replaceGemm(OpBuilder &b, Operation *op, Value y) {
  Type type = op->getResult(0).getType();
  if (y.getType() != type)
    y = CastOp::create(b, op->getLoc(), type, y);
  op->getResult(0).replaceAllUsesWith(y);
  op->erase();
}

/// Blockwise: tiles along the contraction as the GEMM reads each operand
/// (1 x block, or block x 1 for a transposed read), block x block for the
/// weight; the dequantised operands meet in an f32 GEMM.
LogicalResult lowerBlockwise(const Gemm &gemm, Quantizer &quantizer,
                             int64_t block) {
  Operation *op = gemm.op;
  OpBuilder b(op);
  InheritPlacement placement(op);
  b.setListener(&placement);
  Location loc = op->getLoc();
  std::array<int64_t, 2> along = {1, block}, across = {block, 1},
                         square = {block, block};
  FailureOr<Value> a = quantizer.blockwise(
      b, loc, gemm.lhsValue(), gemm.lhs, gemm.lhsTransposed() ? across : along,
      "left operand", op);
  FailureOr<Value> c = quantizer.blockwise(
      b, loc, gemm.rhsValue(), gemm.rhs,
      gemm.rhsIsWeight ? square : (gemm.rhsTransposed() ? along : across),
      "right operand", op);
  if (failed(a) || failed(c))
    return failure();
  replaceGemm(b, op, gemm.rebuild(b, *a, *c));
  return success();
}

/// Per-tensor codes `codes` times their dequantisation multiplier, in f32.
Value dequantise(OpBuilder &b, Location loc, Value codes, Value inverse) {
  auto wide = cast<RankedTensorType>(codes.getType()).clone(b.getF32Type());
  return MulOp::create(
      b, loc, CastOp::create(b, loc, wide, codes),
      BroadcastOp::create(b, loc, wide, inverse, b.getDenseI64ArrayAttr({})));
}

void lower(const Gemm &gemm, Quantizer &quantizer) {
  Operation *op = gemm.op;
  OpBuilder b(op);
  InheritPlacement placement(op);
  b.setListener(&placement);
  Location loc = op->getLoc();
  auto [a, sa] = quantizer.get(b, loc, gemm.lhsValue(), gemm.lhs, gemm.lhsName);
  auto [c, sc] = quantizer.get(b, loc, gemm.rhsValue(), gemm.rhs, gemm.rhsName);
  auto matmul = dyn_cast<MatmulOp>(op);
  if (!matmul) {
    // No scaled grouped GEMM yet: the expert GEMMs multiply the
    // dequantised codes in f32 — fp8's rounding, not yet its speed.
    replaceGemm(b, op, gemm.rebuild(b, dequantise(b, loc, a, sa),
                                    dequantise(b, loc, c, sc)));
    return;
  }
  auto type = cast<RankedTensorType>(matmul.getType());
  Type out = type.getElementType().isBF16() ? type.getElementType()
                                            : Type(b.getF32Type());
  replaceGemm(b, op,
              ScaledMatmulOp::create(b, loc, type.clone(out), a, c, sa, sc,
                                     matmul.getTransposeAAttr(),
                                     matmul.getTransposeBAttr()));
}

/// The GEMMs a gradient is the (possibly summed, reshaped, constrained)
/// result of: the weight-gradient GEMMs of its parameter.
void collectProducers(Value v, SmallVectorImpl<Operation *> &out) {
  Operation *def = v.getDefiningOp();
  if (!def)
    return;
  if (isa<MatmulOp, ExpertWeightGradOp>(def)) {
    out.push_back(def);
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
    if (recipe != "current" && recipe != "delayed" && recipe != "blockwise") {
      module.emitError() << "fp8 recipe '" << recipe
                         << "' is not available (known: current, delayed, "
                            "blockwise)";
      return signalPassFailure();
    }
    if (recipe == "blockwise" && blockSize < 1) {
      module.emitError() << "fp8 block-size must be at least 1";
      return signalPassFailure();
    }
    if (amaxCompute != "max" && amaxCompute != "most_recent") {
      module.emitError() << "fp8 amax-compute must be max or most_recent, not '"
                         << amaxCompute << "'";
      return signalPassFailure();
    }
    if (historyLength < 1) {
      module.emitError() << "fp8 history-length must be at least 1";
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
    Recipe scaling{recipe == "delayed",
                   recipe == "blockwise" ? static_cast<int64_t>(blockSize) : 0,
                   static_cast<int64_t>(historyLength),
                   static_cast<int64_t>(margin), amaxCompute == "most_recent",
                   pow2Scale};

    for (auto fn : llvm::to_vector(module.getOps<func::FuncOp>())) {
      if (fn.isExternal())
        continue;
      // Delayed scaling keeps histories in the gradient function, which a
      // training step calls; other functions (a forward, an evaluation)
      // scale by the current amax.
      bool delayed = scaling.delayed && isGradientFunction(fn);
      Quantizer quantizer(scaling, fn, delayed);
      if (failed(lowerFunction(fn, quantizer, included, excluded, *fwd, *grad)))
        return signalPassFailure();
      if (!quantizer.histories.empty())
        threadHistories(module, fn, quantizer.histories);
    }
  }

  static bool isGradientFunction(func::FuncOp fn) {
    for (unsigned i = 0; i < fn.getNumResults(); ++i)
      if (fn.getResultAttr(i, kGradOfAttrName))
        return true;
    return false;
  }

  LogicalResult lowerFunction(func::FuncOp fn, Quantizer &quantizer,
                              llvm::Regex &included, llvm::Regex &excluded,
                              Fp8Format fwd, Fp8Format grad) {
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
      SmallVector<Operation *> reads;
      for (OpOperand &use : arg.getUses()) {
        Operation *user = use.getOwner();
        if (!isa<MatmulOp, ExpertMatmulOp>(user) ||
            use.getOperandNumber() != 1) {
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
        reads.push_back(user);
      }
      if (reads.empty())
        continue;
      selected[name.getValue()] = arg;
      std::string w = name.getValue().str() + ":fp8_amax.";
      for (Operation *m : reads)
        gemms.push_back(inBackward(m)
                            ? Gemm{m, grad, fwd, w + "output_grad", w + "weight"}
                            : Gemm{m, fwd, fwd, w + "input", w + "weight"});
    }
    // Weight gradients: the matmuls whose products are W's gradient.
    Operation *ret = fn.getBody().front().getTerminator();
    for (unsigned i = 0; i < fn.getNumResults(); ++i) {
      auto of = fn.getResultAttrOfType<StringAttr>(i, kGradOfAttrName);
      if (!of || !selected.count(of.getValue()))
        continue;
      SmallVector<Operation *> producers;
      collectProducers(ret->getOperand(i), producers);
      std::string w = of.getValue().str() + ":fp8_amax.";
      for (Operation *m : producers)
        if (!llvm::any_of(gemms, [&](const Gemm &g) { return g.op == m; }))
          gemms.push_back({m, fwd, grad, w + "input", w + "output_grad",
                           /*rhsIsWeight=*/false});
    }
    // In program order, so a tensor is quantised where it is first used
    // and later GEMMs (the backward) read those codes.
    llvm::sort(gemms, [](const Gemm &a, const Gemm &b) {
      return a.op->isBeforeInBlock(b.op);
    });
    for (const Gemm &g : gemms) {
      if (!quantizer.isBlockwise())
        lower(g, quantizer);
      else if (failed(lowerBlockwise(g, quantizer, quantizer.blockSize())))
        return failure();
    }
    return success();
  }

  /// The gradient function returns its updated histories; every caller
  /// takes them as arguments (optimizer state, `<param>:fp8_amax.<which>`,
  /// zeros at the start) and returns the updates as its results
  /// (`ernie.updates`), so they are carried from step to step.
  void threadHistories(
      ModuleOp module, func::FuncOp fn,
      ArrayRef<std::tuple<std::string, BlockArgument, Value>> histories) {
    Builder b(module.getContext());
    Operation *ret = fn.getBody().front().getTerminator();
    unsigned first = fn.getNumResults();
    for (auto [i, h] : llvm::enumerate(histories)) {
      Value updated = std::get<2>(h);
      (void)fn.insertResult(first + i, updated.getType(), DictionaryAttr());
      ret->insertOperands(ret->getNumOperands(), updated);
    }
    auto uses = SymbolTable::getSymbolUses(fn, module);
    if (!uses)
      return;
    for (const SymbolTable::SymbolUse &use : *uses) {
      auto call = dyn_cast<func::CallOp>(use.getUser());
      if (!call)
        continue;
      auto caller = call->getParentOfType<func::FuncOp>();
      SmallVector<Value> operands(call.getOperands());
      SmallVector<Value> historyArgs;
      for (auto &[name, arg, updated] : histories) {
        unsigned index = caller.getNumArguments();
        (void)caller.insertArgument(
            index, arg.getType(),
            b.getDictionaryAttr(b.getNamedAttr(ErnieDialect::kOptStateAttrName,
                                               b.getStringAttr(name))),
            caller.getLoc());
        operands.push_back(caller.getArgument(index));
      }
      OpBuilder builder(call);
      auto wider = func::CallOp::create(builder, call.getLoc(), fn, operands);
      for (unsigned i = 0; i < call.getNumResults(); ++i)
        call.getResult(i).replaceAllUsesWith(wider.getResult(i));
      call.erase();
      Operation *callerRet = caller.getBody().front().getTerminator();
      for (auto [i, h] : llvm::enumerate(histories)) {
        unsigned index = caller.getNumResults();
        (void)caller.insertResult(
            index, std::get<1>(h).getType(),
            b.getDictionaryAttr(b.getNamedAttr(ErnieDialect::kUpdatesAttrName,
                                               b.getStringAttr(std::get<0>(h)))));
        callerRet->insertOperands(callerRet->getNumOperands(),
                                  wider.getResult(first + i));
      }
    }
  }
};

} // namespace

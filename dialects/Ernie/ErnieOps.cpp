//===- ErnieOps.cpp - ernie op verifiers, type inference, syntax ------------===//
//
// The shape and type rules of every op: verifiers for ops whose result type
// is given, inferReturnTypes for ops whose result type is determined, and the
// few custom assembly pieces (`full`'s literal, `slice`'s ranges).
//
//===----------------------------------------------------------------------===//

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/RegionKindInterface.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/MathExtras.h"

using namespace mlir;
using namespace mlir::ernie;

//===----------------------------------------------------------------------===//
// Shared helpers.
//===----------------------------------------------------------------------===//

int64_t mlir::ernie::getElementByteSize(Type element) {
  if (!element.isIntOrFloat())
    return 0;
  return std::max<int64_t>(1,
                           llvm::divideCeil(element.getIntOrFloatBitWidth(), 8));
}

bool mlir::ernie::hasAddressableSize(ShapedType type) {
  if (!type.hasStaticShape() || getElementByteSize(type.getElementType()) == 0)
    return false;
  // Bytes at the widest element (8), whatever this one's: passes retype
  // tensors (a bf16 gradient's f32 sum, f32 statistics of bf16 values, i64
  // indices), and a retyped tensor must stay inside the bound too.
  int64_t bytes = 8;
  for (int64_t dim : type.getShape())
    if (dim < 0 || llvm::MulOverflow(bytes, dim, bytes))
      return false;
  return true;
}

bool mlir::ernie::hasZeroSizeDimension(Type type) {
  auto shaped = dyn_cast<ShapedType>(type);
  return shaped && shaped.hasRank() && llvm::is_contained(shaped.getShape(), 0);
}

/// The message every zero-size check ends with.
static constexpr llvm::StringLiteral kNoZeroSize =
    "ernie tensors have no zero-size dimensions";

LogicalResult mlir::ernie::verifyNoZeroSizeTensors(Operation *op) {
  for (auto [i, type] : llvm::enumerate(op->getOperandTypes()))
    if (hasZeroSizeDimension(type))
      return op->emitOpError("operand #") << i << " has a zero-size dimension ("
                                          << type << "): " << kNoZeroSize;
  for (auto [i, type] : llvm::enumerate(op->getResultTypes()))
    if (hasZeroSizeDimension(type))
      return op->emitOpError("result #") << i << " has a zero-size dimension ("
                                         << type << "): " << kNoZeroSize;
  return success();
}

LogicalResult mlir::ernie::verifyOperandsDominate(Operation *op) {
  Region *region = op->getParentRegion();
  if (op->getNumOperands() == 0 || !region || !region->getParentOp() ||
      mayHaveSSADominance(*region))
    return success();
  return op->emitOpError("reads values, so it belongs in a function's body, "
                         "not in the graph region of '")
         << region->getParentOp()->getName()
         << "', where a value may be its own operand";
}

LogicalResult mlir::ernie::verifyMeshRankCount(Operation *op) {
  int64_t ranks = 1;
  for (int64_t size : cast<MeshOp>(op).getAxisSizes()) {
    if (size < 1)
      continue; // MeshOp::verify names the axis.
    if (llvm::MulOverflow(ranks, size, ranks) || ranks > MeshOp::kMaxRanks)
      return op->emitOpError("has more than ")
             << MeshOp::kMaxRanks << " ranks (the product of its axis sizes)";
  }
  return success();
}

/// Formats a shape as `[2, 16, 64]` for diagnostics.
static std::string shapeStr(ArrayRef<int64_t> shape) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << '[';
  llvm::interleaveComma(shape, os);
  os << ']';
  return text;
}

/// The ranked tensor type of an inferred op's operand, or an error when the
/// parser (or a builder) handed something else: type constraints and the
/// zero-size check run after inference there.
static FailureOr<RankedTensorType> rankedOperand(std::optional<Location> loc,
                                                 Value value, StringRef name) {
  auto type = dyn_cast_or_null<RankedTensorType>(
      value ? value.getType() : Type());
  if (!type || !hasAddressableSize(type))
    return emitOptionalError(loc, "'", name,
                             "' must be a statically shaped ranked tensor of "
                             "integers or floats with fewer than 2^60 "
                             "elements");
  if (hasZeroSizeDimension(type))
    return emitOptionalError(loc, "'", name, "' has a zero-size dimension (",
                             type, "): ", kNoZeroSize);
  return type;
}

/// Checks that `axis` names a dimension of a rank-`rank` tensor.
static LogicalResult checkAxis(std::optional<Location> loc, int64_t axis,
                               int64_t rank, StringRef what = "axis") {
  if (axis < 0 || axis >= rank)
    return emitOptionalError(loc, what, " ", axis,
                             " is out of range for a tensor of rank ", rank);
  return success();
}

//===----------------------------------------------------------------------===//
// CompareOp
//===----------------------------------------------------------------------===//

LogicalResult CompareOp::inferReturnTypes(MLIRContext *context,
                                          std::optional<Location> loc,
                                          Adaptor adaptor,
                                          SmallVectorImpl<Type> &inferred) {
  auto lhs = rankedOperand(loc, adaptor.getLhs(), "lhs");
  if (failed(lhs))
    return failure();
  inferred.push_back(
      RankedTensorType::get(lhs->getShape(), IntegerType::get(context, 1)));
  return success();
}

//===----------------------------------------------------------------------===//
// FullOp
//===----------------------------------------------------------------------===//

void FullOp::build(OpBuilder &builder, OperationState &state,
                   RankedTensorType type, double value) {
  Type element = type.getElementType();
  TypedAttr attr;
  if (auto floatType = dyn_cast<FloatType>(element)) {
    APFloat v(value);
    bool lost;
    v.convert(floatType.getFloatSemantics(), APFloat::rmNearestTiesToEven,
              &lost);
    attr = FloatAttr::get(floatType, v);
  } else {
    attr = IntegerAttr::get(element, static_cast<int64_t>(value));
  }
  build(builder, state, type, attr);
}

LogicalResult FullOp::verify() {
  Type element = getType().getElementType();
  if (getValue().getType() != element)
    return emitOpError("fill value has type ")
           << getValue().getType() << " but the result's element type is "
           << element;
  if (isa<FloatType>(element) ? !isa<FloatAttr>(getValue())
                              : !isa<IntegerAttr>(getValue()))
    return emitOpError("fill value ")
           << getValue() << " is not a scalar of type " << element;
  return success();
}

/// `ernie.full <literal> attr-dict : <tensor type>`. The literal (an integer,
/// a float, `true` or `false`) is written without its type and converted to
/// the element type once that is parsed. Non-finite floats, whose only
/// spelling is a bit pattern, are written typed in parentheses:
/// `ernie.full (0x7FC00000 : f32) : tensor<4xf32>`.
ParseResult FullOp::parse(OpAsmParser &parser, OperationState &result) {
  SMLoc literalLoc = parser.getCurrentLocation();
  TypedAttr typed;
  std::optional<APInt> intLiteral;
  std::optional<double> floatLiteral;
  if (succeeded(parser.parseOptionalLParen())) {
    if (parser.parseAttribute(typed) || parser.parseRParen())
      return failure();
  } else if (succeeded(parser.parseOptionalKeyword("true"))) {
    intLiteral = APInt(64, 1);
  } else if (succeeded(parser.parseOptionalKeyword("false"))) {
    intLiteral = APInt(64, 0);
  } else {
    bool negative = succeeded(parser.parseOptionalMinus());
    APInt i;
    OptionalParseResult parsedInt = parser.parseOptionalInteger(i);
    if (parsedInt.has_value()) {
      if (failed(*parsedInt))
        return failure();
      intLiteral = negative ? -i.sext(std::max(64u, i.getBitWidth() + 1)) : i;
    } else {
      double d;
      if (parser.parseFloat(d))
        return failure();
      floatLiteral = negative ? -d : d;
    }
  }
  RankedTensorType type;
  if (parser.parseOptionalAttrDict(result.attributes) ||
      parser.parseColonType(type))
    return failure();
  Type element = type.getElementType();

  TypedAttr value;
  if (typed) {
    if (typed.getType() != element)
      return parser.emitError(literalLoc, "fill value has type ")
             << typed.getType() << " but the result's element type is "
             << element;
    value = typed;
  } else if (auto floatType = dyn_cast<FloatType>(element)) {
    const llvm::fltSemantics &semantics = floatType.getFloatSemantics();
    APFloat v(semantics);
    if (floatLiteral) {
      v = APFloat(*floatLiteral);
      bool lost;
      v.convert(semantics, APFloat::rmNearestTiesToEven, &lost);
    } else {
      // Integers convert exactly-rounded, whatever their width.
      v.convertFromAPInt(*intLiteral, /*IsSigned=*/true,
                         APFloat::rmNearestTiesToEven);
    }
    value = FloatAttr::get(floatType, v);
  } else if (auto intType = dyn_cast<IntegerType>(element)) {
    if (!intLiteral)
      return parser.emitError(literalLoc, "expected an integer to fill ")
             << type;
    unsigned width = intType.getWidth();
    const APInt &v = *intLiteral;
    bool fits = width == 1 ? (v.isZero() || v.isOne()) : v.isSignedIntN(width);
    if (!fits)
      return parser.emitError(literalLoc, "fill value ")
             << llvm::toString(v, 10, /*Signed=*/true) << " does not fit in "
             << element;
    value = IntegerAttr::get(intType, v.sextOrTrunc(width));
  } else {
    return parser.emitError(literalLoc, "cannot fill a tensor of ") << element;
  }
  result.addAttribute(getValueAttrName(result.name), value);
  result.addTypes(type);
  return success();
}

/// A finite float in decimal that re-parses to the same value: MLIR's own
/// form where it is decimal, else every digit APFloat needs (MLIR would fall
/// back to a bit pattern, which reads back as an integer here).
static std::string formatFloat(FloatAttr attr) {
  std::string text;
  llvm::raw_string_ostream os(text);
  attr.print(os, /*elideType=*/true);
  if (!StringRef(text).starts_with("0x") && !StringRef(text).starts_with("-0x"))
    return text;
  SmallString<32> digits;
  attr.getValue().toString(digits, /*FormatPrecision=*/0,
                           /*FormatMaxPadding=*/0);
  if (!StringRef(digits).contains_insensitive('e') &&
      !StringRef(digits).contains('.'))
    digits += ".0";
  return std::string(digits);
}

void FullOp::print(OpAsmPrinter &p) {
  p << ' ';
  auto f = dyn_cast<FloatAttr>(getValue());
  if (f && !f.getValue().isFinite()) {
    p << '(';
    p.printAttribute(getValue());
    p << ')';
  } else if (f) {
    p << formatFloat(f);
  } else if (getValue().getType().isInteger(1)) {
    p << (cast<IntegerAttr>(getValue()).getValue().isZero() ? "false"
                                                             : "true");
  } else {
    p.printAttributeWithoutType(getValue());
  }
  p.printOptionalAttrDict((*this)->getAttrs(), {getValueAttrName()});
  p << " : " << getType();
}

//===----------------------------------------------------------------------===//
// IotaOp
//===----------------------------------------------------------------------===//

LogicalResult IotaOp::verify() {
  auto type = cast<RankedTensorType>(getType());
  return checkAxis(getLoc(), getDimension(), type.getRank(), "dimension");
}

//===----------------------------------------------------------------------===//
// MatmulOp
//===----------------------------------------------------------------------===//

/// The shape of `lhs x rhs` under the matmul rules (shared by matmul and
/// scaled_matmul).
static FailureOr<SmallVector<int64_t>>
matmulShape(std::optional<Location> loc, RankedTensorType lhs,
            RankedTensorType rhs, bool transposeA, bool transposeB) {
  if (lhs.getRank() < 2 || rhs.getRank() < 2)
    return emitOptionalError(loc, "matmul operands need rank >= 2, got ",
                             lhs.getRank(), " and ", rhs.getRank());
  ArrayRef<int64_t> a = lhs.getShape(), b = rhs.getShape();
  int64_t ra = a.size(), rb = b.size();
  int64_t m = a[ra - 2], ka = a[ra - 1];
  if (transposeA)
    std::swap(m, ka);
  int64_t kb = b[rb - 2], n = b[rb - 1];
  if (transposeB)
    std::swap(kb, n);
  if (ka != kb)
    return emitOptionalError(loc, "matmul contraction sizes differ: lhs has ",
                             ka, ", rhs has ", kb);
  ArrayRef<int64_t> batchA = a.drop_back(2), batchB = b.drop_back(2);
  if (rb != 2 && batchA != batchB)
    return emitOptionalError(
        loc, "matmul batch dimensions differ: ", shapeStr(batchA), " vs ",
        shapeStr(batchB), " (only a rank-2 rhs is applied to every batch)");
  SmallVector<int64_t> shape(batchA);
  shape.append({m, n});
  return shape;
}

LogicalResult ScaledMatmulOp::verify() {
  FailureOr<SmallVector<int64_t>> shape =
      matmulShape(getLoc(), cast<RankedTensorType>(getLhs().getType()),
                  cast<RankedTensorType>(getRhs().getType()), getTransposeA(),
                  getTransposeB());
  if (failed(shape))
    return failure();
  auto result = cast<RankedTensorType>(getType());
  if (result.getShape() != ArrayRef<int64_t>(*shape))
    return emitOpError("result must have shape ")
           << shapeStr(*shape) << ", got " << shapeStr(result.getShape());
  for (Value scale : {getLhsScaleInv(), getRhsScaleInv()})
    if (cast<RankedTensorType>(scale.getType()).getRank() != 0)
      return emitOpError("takes per-tensor scales (rank-0 f32 tensors)");
  return success();
}

LogicalResult MatmulOp::inferReturnTypes(MLIRContext *context,
                                         std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &inferred) {
  auto lhs = rankedOperand(loc, adaptor.getLhs(), "lhs");
  auto rhs = rankedOperand(loc, adaptor.getRhs(), "rhs");
  if (failed(lhs) || failed(rhs))
    return failure();
  if (lhs->getRank() >= 2 && rhs->getRank() >= 2 &&
      lhs->getElementType() != rhs->getElementType())
    return emitOptionalError(loc, "matmul operands have different element "
                                  "types: ",
                             lhs->getElementType(), " and ",
                             rhs->getElementType());
  FailureOr<SmallVector<int64_t>> shape = matmulShape(
      loc, *lhs, *rhs, adaptor.getTransposeA(), adaptor.getTransposeB());
  if (failed(shape))
    return failure();
  inferred.push_back(RankedTensorType::get(*shape, lhs->getElementType()));
  return success();
}

LogicalResult MatmulAccumulateOp::inferReturnTypes(
    MLIRContext *context, std::optional<Location> loc, Adaptor adaptor,
    SmallVectorImpl<Type> &inferred) {
  auto lhs = rankedOperand(loc, adaptor.getLhs(), "lhs");
  auto rhs = rankedOperand(loc, adaptor.getRhs(), "rhs");
  auto acc = rankedOperand(loc, adaptor.getAcc(), "acc");
  if (failed(lhs) || failed(rhs) || failed(acc))
    return failure();
  Type element = lhs->getElementType();
  if (rhs->getElementType() != element)
    return emitOptionalError(loc, "matmul_accumulate operands have different "
                                  "element types: ",
                             element, " and ", rhs->getElementType());
  if (!isa<Float64Type, Float32Type, Float16Type, BFloat16Type>(element))
    return emitOptionalError(loc, "matmul_accumulate multiplies f64, f32, "
                                  "f16 or bf16 operands, not ",
                             element);
  // The product is accumulated in the accumulator's type: the operands' own,
  // or f32 for narrow ones (never narrower than what is multiplied).
  Type sum = acc->getElementType();
  if (sum != element &&
      !(sum.isF32() && isa<Float16Type, BFloat16Type>(element)))
    return emitOptionalError(loc, "matmul_accumulate accumulates ", element,
                             " products in ", element,
                             (element.isF32() || element.isF64()
                                  ? ""
                                  : " or f32"),
                             ", not ", sum);
  FailureOr<SmallVector<int64_t>> shape = matmulShape(
      loc, *lhs, *rhs, adaptor.getTransposeA(), adaptor.getTransposeB());
  if (failed(shape))
    return failure();
  if (acc->getShape() != ArrayRef<int64_t>(*shape))
    return emitOptionalError(loc, "the accumulator must have the product's "
                                  "shape ",
                             shapeStr(*shape), ", got ",
                             shapeStr(acc->getShape()));
  inferred.push_back(*acc);
  return success();
}

//===----------------------------------------------------------------------===//
// Reductions
//===----------------------------------------------------------------------===//

/// The type left after reducing `axes` of `input`.
static LogicalResult inferReduceType(std::optional<Location> loc, Value input,
                                     ArrayRef<int64_t> axes, bool keepdim,
                                     SmallVectorImpl<Type> &inferred) {
  auto type = rankedOperand(loc, input, "input");
  if (failed(type))
    return failure();
  int64_t rank = type->getRank();
  for (auto [i, axis] : llvm::enumerate(axes)) {
    if (failed(checkAxis(loc, axis, rank)))
      return failure();
    if (i > 0 && axes[i - 1] >= axis)
      return emitOptionalError(loc, "reduction axes must be sorted and "
                                    "distinct, got ",
                               shapeStr(axes));
  }
  SmallVector<int64_t> shape;
  for (int64_t d = 0; d < rank; ++d) {
    if (!llvm::is_contained(axes, d))
      shape.push_back(type->getDimSize(d));
    else if (keepdim)
      shape.push_back(1);
  }
  inferred.push_back(RankedTensorType::get(shape, type->getElementType()));
  return success();
}

#define ERNIE_REDUCE_INFER(OP)                                                 \
  LogicalResult OP::inferReturnTypes(MLIRContext *,                           \
                                     std::optional<Location> loc,             \
                                     Adaptor adaptor,                         \
                                     SmallVectorImpl<Type> &inferred) {       \
    return inferReduceType(loc, adaptor.getInput(), adaptor.getAxes(),        \
                           adaptor.getKeepdim(), inferred);                   \
  }
ERNIE_REDUCE_INFER(ReduceSumOp)
ERNIE_REDUCE_INFER(ReduceMeanOp)
ERNIE_REDUCE_INFER(ReduceMaxOp)
#undef ERNIE_REDUCE_INFER

//===----------------------------------------------------------------------===//
// Softmax, normalisation
//===----------------------------------------------------------------------===//

LogicalResult SoftmaxOp::verify() {
  return checkAxis(getLoc(), getAxis(), getType().getRank());
}
LogicalResult LogSoftmaxOp::verify() {
  return checkAxis(getLoc(), getAxis(), getType().getRank());
}

/// A norm's weight (and bias) is `[d]` for an input `[..., d]`.
static LogicalResult verifyNormParam(Operation *op, ShapedType input,
                                     ShapedType param, StringRef name) {
  if (input.getRank() < 1)
    return op->emitOpError("input must have rank >= 1");
  int64_t d = input.getShape().back();
  if (param.getRank() != 1 || param.getDimSize(0) != d)
    return op->emitOpError() << name << " must have shape [" << d
                             << "] (the input's last dimension), got "
                             << shapeStr(param.getShape());
  return success();
}

static LogicalResult verifyEpsilon(Operation *op, double epsilon) {
  if (!(epsilon >= 0.0))
    return op->emitOpError("epsilon must be non-negative, got ") << epsilon;
  return success();
}

LogicalResult RmsNormOp::verify() {
  if (failed(verifyNormParam(*this, getInput().getType(),
                             getWeight().getType(), "weight")))
    return failure();
  return verifyEpsilon(*this, getEpsilon().convertToDouble());
}

LogicalResult LayerNormOp::verify() {
  if (failed(verifyNormParam(*this, getInput().getType(),
                             getWeight().getType(), "weight")) ||
      failed(verifyNormParam(*this, getInput().getType(), getBias().getType(),
                             "bias")))
    return failure();
  return verifyEpsilon(*this, getEpsilon().convertToDouble());
}

//===----------------------------------------------------------------------===//
// ReshapeOp, TransposeOp, BroadcastOp
//===----------------------------------------------------------------------===//

LogicalResult ReshapeOp::verify() {
  auto in = cast<ShapedType>(getInput().getType());
  auto out = cast<ShapedType>(getType());
  if (in.getElementType() != out.getElementType())
    return emitOpError("cannot change the element type (")
           << in.getElementType() << " to " << out.getElementType()
           << "); use ernie.cast";
  if (in.getNumElements() != out.getNumElements())
    return emitOpError("element count changes from ")
           << in.getNumElements() << " " << shapeStr(in.getShape()) << " to "
           << out.getNumElements() << " " << shapeStr(out.getShape());
  return success();
}

LogicalResult TransposeOp::inferReturnTypes(MLIRContext *,
                                            std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &inferred) {
  auto type = rankedOperand(loc, adaptor.getInput(), "input");
  if (failed(type))
    return failure();
  ArrayRef<int64_t> perm = adaptor.getPerm();
  int64_t rank = type->getRank();
  SmallVector<bool> seen(rank, false);
  bool isPermutation = static_cast<int64_t>(perm.size()) == rank;
  for (int64_t p : perm) {
    if (!isPermutation || p < 0 || p >= rank || seen[p]) {
      isPermutation = false;
      break;
    }
    seen[p] = true;
  }
  if (!isPermutation)
    return emitOptionalError(loc, "perm ", shapeStr(perm),
                             " is not a permutation of ", rank, " dimensions");
  SmallVector<int64_t> shape;
  for (int64_t p : perm)
    shape.push_back(type->getDimSize(p));
  inferred.push_back(RankedTensorType::get(shape, type->getElementType()));
  return success();
}

LogicalResult BroadcastOp::verify() {
  auto in = cast<ShapedType>(getInput().getType());
  auto out = cast<ShapedType>(getType());
  ArrayRef<int64_t> dims = getDims();
  if (in.getElementType() != out.getElementType())
    return emitOpError("cannot change the element type (")
           << in.getElementType() << " to " << out.getElementType() << ")";
  if (static_cast<int64_t>(dims.size()) != in.getRank())
    return emitOpError("dims has ")
           << dims.size() << " entries but the input has rank "
           << in.getRank();
  for (auto [i, d] : llvm::enumerate(dims)) {
    if (d < 0 || d >= out.getRank())
      return emitOpError("dims[") << i << "] = " << d
                                  << " is out of range for a result of rank "
                                  << out.getRank();
    if (i > 0 && dims[i - 1] >= d)
      return emitOpError("dims must be strictly increasing, got ")
             << shapeStr(dims);
    int64_t from = in.getDimSize(i), to = out.getDimSize(d);
    if (from != to && from != 1)
      return emitOpError("input dimension ")
             << i << " of size " << from << " cannot broadcast to result "
             << "dimension " << d << " of size " << to;
  }
  return success();
}

//===----------------------------------------------------------------------===//
// SliceOp
//===----------------------------------------------------------------------===//

LogicalResult SliceOp::inferReturnTypes(MLIRContext *,
                                        std::optional<Location> loc,
                                        Adaptor adaptor,
                                        SmallVectorImpl<Type> &inferred) {
  auto type = rankedOperand(loc, adaptor.getInput(), "input");
  if (failed(type))
    return failure();
  ArrayRef<int64_t> start = adaptor.getStart(), limit = adaptor.getLimit(),
                    step = adaptor.getStep();
  int64_t rank = type->getRank();
  if (static_cast<int64_t>(start.size()) != rank ||
      static_cast<int64_t>(limit.size()) != rank ||
      static_cast<int64_t>(step.size()) != rank)
    return emitOptionalError(loc, "slice needs one range per dimension (",
                             rank, "), got ", start.size());
  SmallVector<int64_t> shape;
  for (int64_t d = 0; d < rank; ++d) {
    int64_t size = type->getDimSize(d);
    if (start[d] < 0 || start[d] > limit[d] || limit[d] > size || step[d] < 1)
      return emitOptionalError(loc, "slice range ", start[d], ":", limit[d],
                               ":", step[d], " is invalid for dimension ", d,
                               " of size ", size);
    shape.push_back(llvm::divideCeil(limit[d] - start[d], step[d]));
  }
  inferred.push_back(RankedTensorType::get(shape, type->getElementType()));
  return success();
}

/// `[start:limit(:step)?, ...]`
static ParseResult parseSliceRanges(OpAsmParser &parser,
                                    DenseI64ArrayAttr &start,
                                    DenseI64ArrayAttr &limit,
                                    DenseI64ArrayAttr &step) {
  SmallVector<int64_t> starts, limits, steps;
  auto parseRange = [&]() -> ParseResult {
    int64_t s, l, st = 1;
    if (parser.parseInteger(s) || parser.parseColon() ||
        parser.parseInteger(l))
      return failure();
    if (succeeded(parser.parseOptionalColon()) && parser.parseInteger(st))
      return failure();
    starts.push_back(s);
    limits.push_back(l);
    steps.push_back(st);
    return success();
  };
  if (parser.parseCommaSeparatedList(OpAsmParser::Delimiter::Square,
                                     parseRange))
    return failure();
  MLIRContext *ctx = parser.getContext();
  start = DenseI64ArrayAttr::get(ctx, starts);
  limit = DenseI64ArrayAttr::get(ctx, limits);
  step = DenseI64ArrayAttr::get(ctx, steps);
  return success();
}

static void printSliceRanges(OpAsmPrinter &p, SliceOp, DenseI64ArrayAttr start,
                             DenseI64ArrayAttr limit, DenseI64ArrayAttr step) {
  p << '[';
  for (int64_t d = 0, e = start.size(); d < e; ++d) {
    if (d > 0)
      p << ", ";
    p << start[d] << ':' << limit[d];
    if (step[d] != 1)
      p << ':' << step[d];
  }
  p << ']';
}

//===----------------------------------------------------------------------===//
// Collective syntax: `@mesh[axis, ...]` and a bare reduce kind.
//===----------------------------------------------------------------------===//

static ParseResult parseMeshAxes(OpAsmParser &parser, FlatSymbolRefAttr &mesh,
                                 ArrayAttr &axes) {
  SmallVector<Attribute> names;
  if (parser.parseAttribute(mesh) ||
      parser.parseCommaSeparatedList(
          OpAsmParser::Delimiter::Square, [&]() -> ParseResult {
            std::string axis;
            if (parser.parseKeywordOrString(&axis))
              return failure();
            names.push_back(parser.getBuilder().getStringAttr(axis));
            return success();
          }))
    return failure();
  axes = parser.getBuilder().getArrayAttr(names);
  return success();
}

static void printMeshAxes(OpAsmPrinter &p, Operation *, FlatSymbolRefAttr mesh,
                          ArrayAttr axes) {
  p << mesh << '[';
  llvm::interleaveComma(axes, p, [&](Attribute axis) {
    p.printKeywordOrString(cast<StringAttr>(axis).getValue());
  });
  p << ']';
}

static ParseResult parseReduceKindKeyword(OpAsmParser &parser,
                                          ReduceKindAttr &kind) {
  std::string name;
  SMLoc loc = parser.getCurrentLocation();
  if (parser.parseKeywordOrString(&name))
    return failure();
  std::optional<ReduceKind> value = symbolizeReduceKind(name);
  if (!value)
    return parser.emitError(loc, "unknown reduce kind '")
           << name << "' (expected sum, avg, max or min)";
  kind = ReduceKindAttr::get(parser.getContext(), *value);
  return success();
}

static void printReduceKindKeyword(OpAsmPrinter &p, Operation *,
                                   ReduceKindAttr kind) {
  p << stringifyReduceKind(kind.getValue());
}

/// A bucket's futures, written as the tensors they will hold.
static ParseResult parseFutureTypes(OpAsmParser &parser,
                                    SmallVectorImpl<Type> &futures) {
  return parser.parseCommaSeparatedList([&]() -> ParseResult {
    RankedTensorType tensor;
    if (parser.parseType(tensor))
      return failure();
    futures.push_back(FutureType::get(parser.getContext(), tensor));
    return success();
  });
}

static void printFutureTypes(OpAsmPrinter &p, Operation *, TypeRange futures) {
  llvm::interleaveComma(futures, p, [&](Type future) {
    p << cast<FutureType>(future).getValueType();
  });
}

//===----------------------------------------------------------------------===//
// ConcatOp, SplitOp
//===----------------------------------------------------------------------===//

LogicalResult ConcatOp::inferReturnTypes(MLIRContext *,
                                         std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &inferred) {
  if (adaptor.getInputs().empty())
    return emitOptionalError(loc, "concat needs at least one input");
  auto first = rankedOperand(loc, adaptor.getInputs().front(), "inputs");
  if (failed(first))
    return failure();
  int64_t axis = adaptor.getAxis();
  if (failed(checkAxis(loc, axis, first->getRank())))
    return failure();
  SmallVector<int64_t> shape(first->getShape());
  for (auto [i, input] : llvm::enumerate(adaptor.getInputs().drop_front())) {
    auto type = rankedOperand(loc, input, "inputs");
    if (failed(type))
      return failure();
    if (type->getElementType() != first->getElementType() ||
        type->getRank() != first->getRank())
      return emitOptionalError(loc, "concat input ", i + 1, " has type ",
                               *type, ", incompatible with ", *first);
    for (int64_t d = 0; d < first->getRank(); ++d) {
      if (d == axis)
        continue;
      if (type->getDimSize(d) != first->getDimSize(d))
        return emitOptionalError(loc, "concat input ", i + 1,
                                 " differs in dimension ", d, " (",
                                 type->getDimSize(d), " vs ",
                                 first->getDimSize(d), ")");
    }
    shape[axis] += type->getDimSize(axis);
  }
  inferred.push_back(RankedTensorType::get(shape, first->getElementType()));
  return success();
}

LogicalResult SplitOp::inferReturnTypes(MLIRContext *,
                                        std::optional<Location> loc,
                                        Adaptor adaptor,
                                        SmallVectorImpl<Type> &inferred) {
  auto type = rankedOperand(loc, adaptor.getInput(), "input");
  if (failed(type))
    return failure();
  int64_t axis = adaptor.getAxis();
  if (failed(checkAxis(loc, axis, type->getRank())))
    return failure();
  ArrayRef<int64_t> sizes = adaptor.getSizes();
  if (sizes.empty())
    return emitOptionalError(loc, "split needs at least one size");
  int64_t total = 0;
  for (int64_t size : sizes) {
    if (size < 0)
      return emitOptionalError(loc, "split sizes must be non-negative, got ",
                               shapeStr(sizes));
    total += size;
  }
  if (total != type->getDimSize(axis))
    return emitOptionalError(loc, "split sizes ", shapeStr(sizes),
                             " add up to ", total, ", not to the size ",
                             type->getDimSize(axis), " of axis ", axis);
  for (int64_t size : sizes) {
    SmallVector<int64_t> shape(type->getShape());
    shape[axis] = size;
    inferred.push_back(RankedTensorType::get(shape, type->getElementType()));
  }
  return success();
}

//===----------------------------------------------------------------------===//
// GatherOp, EmbeddingOp, TopkOp
//===----------------------------------------------------------------------===//

LogicalResult GatherOp::inferReturnTypes(MLIRContext *,
                                         std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &inferred) {
  auto input = rankedOperand(loc, adaptor.getInput(), "input");
  auto indices = rankedOperand(loc, adaptor.getIndices(), "indices");
  if (failed(input) || failed(indices))
    return failure();
  int64_t axis = adaptor.getAxis();
  if (failed(checkAxis(loc, axis, input->getRank())))
    return failure();
  SmallVector<int64_t> shape(input->getShape().take_front(axis));
  llvm::append_range(shape, indices->getShape());
  llvm::append_range(shape, input->getShape().drop_front(axis + 1));
  inferred.push_back(RankedTensorType::get(shape, input->getElementType()));
  return success();
}

LogicalResult EmbeddingOp::inferReturnTypes(MLIRContext *,
                                            std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &inferred) {
  auto indices = rankedOperand(loc, adaptor.getIndices(), "indices");
  auto weight = rankedOperand(loc, adaptor.getWeight(), "weight");
  if (failed(indices) || failed(weight))
    return failure();
  if (weight->getRank() != 2)
    return emitOptionalError(loc, "embedding table must be [vocab, hidden], "
                                  "got rank ",
                             weight->getRank());
  if (auto pad = adaptor.getPaddingIdx();
      pad && (static_cast<int64_t>(*pad) < 0 ||
              static_cast<int64_t>(*pad) >= weight->getDimSize(0)))
    return emitOptionalError(loc, "padding_idx ", static_cast<int64_t>(*pad),
                             " is outside the vocabulary of ",
                             weight->getDimSize(0));
  SmallVector<int64_t> shape(indices->getShape());
  shape.push_back(weight->getDimSize(1));
  inferred.push_back(RankedTensorType::get(shape, weight->getElementType()));
  return success();
}

LogicalResult TopkOp::inferReturnTypes(MLIRContext *context,
                                       std::optional<Location> loc,
                                       Adaptor adaptor,
                                       SmallVectorImpl<Type> &inferred) {
  auto input = rankedOperand(loc, adaptor.getInput(), "input");
  if (failed(input))
    return failure();
  int64_t axis = adaptor.getAxis();
  if (failed(checkAxis(loc, axis, input->getRank())))
    return failure();
  int64_t k = adaptor.getK();
  if (k > input->getDimSize(axis))
    return emitOptionalError(loc, "k = ", k, " exceeds the size ",
                             input->getDimSize(axis), " of axis ", axis);
  SmallVector<int64_t> shape(input->getShape());
  shape[axis] = k;
  inferred.push_back(RankedTensorType::get(shape, input->getElementType()));
  inferred.push_back(
      RankedTensorType::get(shape, IntegerType::get(context, 64)));
  return success();
}

//===----------------------------------------------------------------------===//
// MoeRouteOp, MoeDispatchOp, MoeCombineOp, MoeWeightsGradOp
//===----------------------------------------------------------------------===//

namespace {
/// The `[groups, tokens, k]` operands of the MoE ops: each is rank 3, the
/// first sets the shape the others repeat (their element kinds are the
/// ODS constraints' business).
struct ChoiceShape {
  std::optional<Location> loc;
  SmallVector<int64_t, 3> shape;

  LogicalResult add(Value value, StringRef name) {
    auto type = rankedOperand(loc, value, name);
    if (failed(type))
      return failure();
    if (type->getRank() != 3)
      return emitOptionalError(loc, "'", name,
                               "' must be [groups, tokens, k], got ", *type);
    if (shape.empty())
      shape.assign(type->getShape().begin(), type->getShape().end());
    else if (type->getShape() != ArrayRef<int64_t>(shape))
      return emitOptionalError(loc, "'", name, "' must be ", shapeStr(shape),
                               " like the expert choices, got ",
                               shapeStr(type->getShape()));
    return success();
  }
  /// experts, slots and (when given) weights, in that order.
  LogicalResult addChoices(Value experts, Value slots, Value weights = {}) {
    return failure(failed(add(experts, "experts")) ||
                   failed(add(slots, "slots")) ||
                   (weights && failed(add(weights, "weights"))));
  }
  int64_t groups() const { return shape[0]; }
  int64_t tokens() const { return shape[1]; }
  int64_t k() const { return shape[2]; }
};

/// An expert buffer `[experts, groups, capacity, hidden]` for `choices`.
FailureOr<RankedTensorType> expertBuffers(std::optional<Location> loc,
                                          Value value, StringRef name,
                                          const ChoiceShape &choices) {
  auto type = rankedOperand(loc, value, name);
  if (failed(type))
    return failure();
  if (type->getRank() != 4)
    return emitOptionalError(loc, "'", name,
                             "' must be [experts, groups, capacity, hidden], "
                             "got ",
                             *type);
  if (type->getDimSize(1) != choices.groups())
    return emitOptionalError(loc, "'", name, "' has ", type->getDimSize(1),
                             " groups, the choices ", choices.groups());
  if (type->getDimSize(0) < choices.k())
    return emitOptionalError(loc, "top-", choices.k(), " routing needs at "
                             "least ", choices.k(), " experts, '", name,
                             "' has ", type->getDimSize(0));
  return type;
}

/// Dispatch's and combine's weights scale the data: one element type.
LogicalResult checkWeightsType(std::optional<Location> loc, Value weights,
                               Type element) {
  if (getElementTypeOrSelf(weights.getType()) != element)
    return emitOptionalError(loc, "weights must have the input's element "
                                  "type ",
                             element);
  return success();
}

LogicalResult checkTopK(std::optional<Location> loc, int64_t k,
                        int64_t numExperts) {
  if (k > numExperts)
    return emitOptionalError(loc, "top-", k, " routing needs at least ", k,
                             " experts, num_experts is ", numExperts);
  return success();
}
} // namespace

LogicalResult MoeRouteOp::inferReturnTypes(MLIRContext *context,
                                           std::optional<Location> loc,
                                           Adaptor adaptor,
                                           SmallVectorImpl<Type> &inferred) {
  ChoiceShape choices{loc, {}};
  if (failed(choices.add(adaptor.getExperts(), "experts")) ||
      failed(checkTopK(loc, choices.k(), adaptor.getNumExperts())))
    return failure();
  inferred.push_back(
      RankedTensorType::get(choices.shape, IntegerType::get(context, 64)));
  return success();
}

LogicalResult MoeDispatchOp::inferReturnTypes(MLIRContext *,
                                              std::optional<Location> loc,
                                              Adaptor adaptor,
                                              SmallVectorImpl<Type> &inferred) {
  ChoiceShape choices{loc, {}};
  auto input = rankedOperand(loc, adaptor.getInput(), "input");
  if (failed(input) ||
      failed(choices.addChoices(adaptor.getExperts(), adaptor.getSlots(),
                                adaptor.getWeights())) ||
      failed(checkTopK(loc, choices.k(), adaptor.getNumExperts())))
    return failure();
  if (input->getRank() != 3 ||
      input->getShape().take_front(2) != ArrayRef(choices.shape).take_front(2))
    return emitOptionalError(loc, "input must be [groups, tokens, hidden] = ",
                             shapeStr(ArrayRef(choices.shape).take_front(2)),
                             " x hidden like the choices, got ", *input);
  Type element = input->getElementType();
  if (failed(checkWeightsType(loc, adaptor.getWeights(), element)))
    return failure();
  inferred.push_back(RankedTensorType::get(
      {static_cast<int64_t>(adaptor.getNumExperts()), choices.groups(),
       static_cast<int64_t>(adaptor.getCapacity()), input->getDimSize(2)},
      element));
  return success();
}

LogicalResult MoeCombineOp::inferReturnTypes(MLIRContext *,
                                             std::optional<Location> loc,
                                             Adaptor adaptor,
                                             SmallVectorImpl<Type> &inferred) {
  ChoiceShape choices{loc, {}};
  if (failed(choices.addChoices(adaptor.getExperts(), adaptor.getSlots(),
                                adaptor.getWeights())))
    return failure();
  auto input = expertBuffers(loc, adaptor.getInput(), "input", choices);
  if (failed(input))
    return failure();
  Type element = input->getElementType();
  if (failed(checkWeightsType(loc, adaptor.getWeights(), element)))
    return failure();
  inferred.push_back(RankedTensorType::get(
      {choices.groups(), choices.tokens(), input->getDimSize(3)}, element));
  return success();
}

LogicalResult MoeWeightsGradOp::inferReturnTypes(
    MLIRContext *, std::optional<Location> loc, Adaptor adaptor,
    SmallVectorImpl<Type> &inferred) {
  ChoiceShape choices{loc, {}};
  if (failed(choices.addChoices(adaptor.getExperts(), adaptor.getSlots())))
    return failure();
  auto tokens = rankedOperand(loc, adaptor.getTokens(), "tokens");
  auto buffers = expertBuffers(loc, adaptor.getBuffers(), "buffers", choices);
  if (failed(tokens) || failed(buffers))
    return failure();
  if (tokens->getRank() != 3 ||
      tokens->getShape().take_front(2) !=
          ArrayRef(choices.shape).take_front(2) ||
      tokens->getDimSize(2) != buffers->getDimSize(3) ||
      tokens->getElementType() != buffers->getElementType())
    return emitOptionalError(loc, "tokens must be [groups, tokens, hidden] = ",
                             shapeStr(ArrayRef(choices.shape).take_front(2)),
                             " x ", buffers->getDimSize(3), " of ",
                             buffers->getElementType(), ", got ", *tokens);
  inferred.push_back(
      RankedTensorType::get(choices.shape, tokens->getElementType()));
  return success();
}

//===----------------------------------------------------------------------===//
// ExpertMatmulOp, ExpertWeightGradOp
//===----------------------------------------------------------------------===//

namespace {
/// The operands every expert GEMM shares: buffers `[experts, groups,
/// capacity, features]`, the filled rows `[experts, groups]` and the
/// average fill the cost model counts.
FailureOr<RankedTensorType> expertGemmBuffers(std::optional<Location> loc,
                                              Value buffers, StringRef name,
                                              Value rows, double fill) {
  auto type = rankedOperand(loc, buffers, name);
  auto rowsType = rankedOperand(loc, rows, "rows");
  if (failed(type) || failed(rowsType))
    return failure();
  if (type->getRank() != 4)
    return emitOptionalError(loc, "'", name,
                             "' must be [experts, groups, capacity, features], "
                             "got ",
                             *type);
  if (rowsType->getShape() != type->getShape().take_front(2))
    return emitOptionalError(loc, "rows must be [experts, groups] = ",
                             shapeStr(type->getShape().take_front(2)),
                             ", got ", shapeStr(rowsType->getShape()));
  if (!(fill > 0 && fill <= 1))
    return emitOptionalError(loc, "fill must be in (0, 1], got ", fill);
  return type;
}
} // namespace

LogicalResult ExpertMatmulOp::inferReturnTypes(
    MLIRContext *, std::optional<Location> loc, Adaptor adaptor,
    SmallVectorImpl<Type> &inferred) {
  auto input = expertGemmBuffers(loc, adaptor.getInput(), "input",
                                 adaptor.getRows(),
                                 adaptor.getFill().convertToDouble());
  auto weight = rankedOperand(loc, adaptor.getWeight(), "weight");
  if (failed(input) || failed(weight))
    return failure();
  bool transposed = adaptor.getTransposeWeight();
  int64_t in = input->getDimSize(3);
  if (weight->getRank() != 3 || weight->getDimSize(0) != input->getDimSize(0) ||
      weight->getDimSize(transposed ? 2 : 1) != in)
    return emitOptionalError(
        loc, "weight must be ",
        transposed ? "[experts, out, in] = [" : "[experts, in, out] = [",
        input->getDimSize(0), transposed ? ", out, " : ", ", in,
        transposed ? "]" : ", out]", " for input ", *input, ", got ", *weight);
  if (weight->getElementType() != input->getElementType())
    return emitOptionalError(loc, "weight must have the input's element type ",
                             input->getElementType(), ", got ", *weight);
  SmallVector<int64_t> shape(input->getShape());
  shape.back() = weight->getDimSize(transposed ? 1 : 2);
  inferred.push_back(RankedTensorType::get(shape, input->getElementType()));
  return success();
}

LogicalResult ExpertWeightGradOp::inferReturnTypes(
    MLIRContext *, std::optional<Location> loc, Adaptor adaptor,
    SmallVectorImpl<Type> &inferred) {
  auto input = expertGemmBuffers(loc, adaptor.getInput(), "input",
                                 adaptor.getRows(),
                                 adaptor.getFill().convertToDouble());
  auto grad = rankedOperand(loc, adaptor.getGrad(), "grad");
  if (failed(input) || failed(grad))
    return failure();
  if (grad->getRank() != 4 ||
      grad->getShape().take_front(3) != input->getShape().take_front(3) ||
      grad->getElementType() != input->getElementType())
    return emitOptionalError(loc, "grad must be [experts, groups, capacity] = ",
                             shapeStr(input->getShape().take_front(3)),
                             " x out of ", input->getElementType(),
                             " like the input, got ", *grad);
  inferred.push_back(RankedTensorType::get(
      {input->getDimSize(0), input->getDimSize(3), grad->getDimSize(3)},
      input->getElementType()));
  return success();
}

//===----------------------------------------------------------------------===//
// RopeOp, AttentionOp, CrossEntropyOp
//===----------------------------------------------------------------------===//

LogicalResult RopeOp::verify() {
  auto input = cast<ShapedType>(getInput().getType());
  auto positions = cast<ShapedType>(getPositions().getType());
  if (input.getRank() != 4)
    return emitOpError("input must be [batch, seq, heads, head_dim], got ")
           << shapeStr(input.getShape());
  if (input.getDimSize(3) % 2 != 0)
    return emitOpError("head_dim must be even, got ") << input.getDimSize(3);
  ArrayRef<int64_t> want = input.getShape().take_front(2);
  ArrayRef<int64_t> got = positions.getShape();
  if (got != want && got != want.drop_front())
    return emitOpError("positions must be [seq] or [batch, seq] = ")
           << shapeStr(want) << ", got " << shapeStr(got);
  if (!(getTheta().convertToDouble() > 0.0))
    return emitOpError("theta must be positive, got ")
           << getTheta().convertToDouble();
  return success();
}

/// The result type of attention over `query`, `key`, `value`, or an error.
static FailureOr<RankedTensorType>
inferAttentionType(std::optional<Location> loc, Value query, Value key,
                   Value value, bool causal, std::optional<APFloat> scale,
                   std::optional<int64_t> window) {
  auto q = rankedOperand(loc, query, "query");
  auto k = rankedOperand(loc, key, "key");
  auto v = rankedOperand(loc, value, "value");
  if (failed(q) || failed(k) || failed(v))
    return failure();
  if (q->getRank() != 4 || k->getRank() != 4 || v->getRank() != 4)
    return emitOptionalError(loc, "attention operands must be [batch, seq, "
                                  "heads, head_dim]");
  if (q->getElementType() != k->getElementType() ||
      q->getElementType() != v->getElementType())
    return emitOptionalError(loc, "query, key and value must have one "
                                  "element type");
  int64_t batch = q->getDimSize(0), seq = q->getDimSize(1),
          heads = q->getDimSize(2), headDim = q->getDimSize(3);
  if (k->getDimSize(0) != batch || v->getDimSize(0) != batch)
    return emitOptionalError(loc, "attention batch sizes differ");
  if (k->getShape().take_front(3) != v->getShape().take_front(3))
    return emitOptionalError(loc, "key ", shapeStr(k->getShape()),
                             " and value ", shapeStr(v->getShape()),
                             " must agree on batch, seq and heads");
  if (k->getDimSize(3) != headDim)
    return emitOptionalError(loc, "query head_dim ", headDim,
                             " differs from key head_dim ", k->getDimSize(3));
  int64_t kvHeads = k->getDimSize(2);
  if (kvHeads == 0 || heads % kvHeads != 0)
    return emitOptionalError(loc, "query heads (", heads,
                             ") must be a multiple of key/value heads (",
                             kvHeads, ")");
  if (causal && k->getDimSize(1) != seq)
    return emitOptionalError(loc, "causal attention needs query and key "
                                  "sequences of one length, got ",
                             seq, " and ", k->getDimSize(1));
  if (scale && !(scale->convertToDouble() > 0))
    return emitOptionalError(loc, "scale must be positive");
  if (window && (!causal || *window < 1))
    return emitOptionalError(loc, "a sliding window needs causal attention "
                                  "and at least one key, got window ",
                             *window, causal ? "" : " without causal");
  return RankedTensorType::get({batch, seq, heads, v->getDimSize(3)},
                               q->getElementType());
}

LogicalResult AttentionOp::inferReturnTypes(MLIRContext *,
                                            std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &inferred) {
  FailureOr<RankedTensorType> type = inferAttentionType(
      loc, adaptor.getQuery(), adaptor.getKey(), adaptor.getValue(),
      adaptor.getCausal(), adaptor.getScale(), adaptor.getWindow());
  if (failed(type))
    return failure();
  inferred.push_back(*type);
  return success();
}

LogicalResult AttentionGradOp::inferReturnTypes(
    MLIRContext *, std::optional<Location> loc, Adaptor adaptor,
    SmallVectorImpl<Type> &inferred) {
  FailureOr<RankedTensorType> out = inferAttentionType(
      loc, adaptor.getQuery(), adaptor.getKey(), adaptor.getValue(),
      adaptor.getCausal(), adaptor.getScale(), adaptor.getWindow());
  if (failed(out))
    return failure();
  if (adaptor.getDout().getType() != *out)
    return emitOptionalError(loc, "dout must have attention's result type ",
                             *out, ", got ", adaptor.getDout().getType());
  inferred.append({adaptor.getQuery().getType(), adaptor.getKey().getType(),
                   adaptor.getValue().getType()});
  return success();
}

/// The loss type of cross_entropy over `logits` and `labels`, or an error.
static FailureOr<RankedTensorType>
inferCrossEntropyType(std::optional<Location> loc, Value logitsValue,
                      Value labelsValue, LossReduction reduction,
                      int64_t ignoreIndex) {
  auto logits = rankedOperand(loc, logitsValue, "logits");
  auto labels = rankedOperand(loc, labelsValue, "labels");
  if (failed(logits) || failed(labels))
    return failure();
  unsigned width = labels->getElementType().getIntOrFloatBitWidth();
  if (!llvm::isIntN(width, ignoreIndex))
    return emitOptionalError(loc, "ignore_index ", ignoreIndex,
                             " does not fit in the labels' type ",
                             labels->getElementType());
  if (logits->getRank() < 1)
    return emitOptionalError(loc, "logits need a vocabulary dimension");
  if (labels->getShape() != logits->getShape().drop_back())
    return emitOptionalError(loc, "labels ", shapeStr(labels->getShape()),
                             " must have the logits' shape without the "
                             "vocabulary dimension, ",
                             shapeStr(logits->getShape().drop_back()));
  ArrayRef<int64_t> shape;
  if (reduction == LossReduction::none)
    shape = labels->getShape();
  return RankedTensorType::get(shape, logits->getElementType());
}

LogicalResult CrossEntropyOp::inferReturnTypes(
    MLIRContext *, std::optional<Location> loc, Adaptor adaptor,
    SmallVectorImpl<Type> &inferred) {
  FailureOr<RankedTensorType> type = inferCrossEntropyType(
      loc, adaptor.getLogits(), adaptor.getLabels(), adaptor.getReduction(),
      static_cast<int64_t>(adaptor.getIgnoreIndex()));
  if (failed(type))
    return failure();
  inferred.push_back(*type);
  return success();
}

/// The loss type of cross_entropy, checked against `dloss`'s (a gradient's
/// seed has the loss's type), or an error.
static FailureOr<RankedTensorType>
inferCrossEntropyGradType(std::optional<Location> loc, Value logits,
                          Value labels, Value dloss, LossReduction reduction,
                          int64_t ignoreIndex) {
  FailureOr<RankedTensorType> loss =
      inferCrossEntropyType(loc, logits, labels, reduction, ignoreIndex);
  if (failed(loss))
    return failure();
  if (dloss.getType() != *loss)
    return emitOptionalError(loc, "dloss must have the loss type ", *loss,
                             ", got ", dloss.getType());
  return loss;
}

LogicalResult CrossEntropyGradOp::inferReturnTypes(
    MLIRContext *, std::optional<Location> loc, Adaptor adaptor,
    SmallVectorImpl<Type> &inferred) {
  if (failed(inferCrossEntropyGradType(
          loc, adaptor.getLogits(), adaptor.getLabels(), adaptor.getDloss(),
          adaptor.getReduction(),
          static_cast<int64_t>(adaptor.getIgnoreIndex()))))
    return failure();
  inferred.push_back(adaptor.getLogits().getType());
  return success();
}

LogicalResult CrossEntropyAndGradOp::inferReturnTypes(
    MLIRContext *, std::optional<Location> loc, Adaptor adaptor,
    SmallVectorImpl<Type> &inferred) {
  FailureOr<RankedTensorType> loss = inferCrossEntropyGradType(
      loc, adaptor.getLogits(), adaptor.getLabels(), adaptor.getDloss(),
      adaptor.getReduction(), static_cast<int64_t>(adaptor.getIgnoreIndex()));
  if (failed(loss))
    return failure();
  inferred.append({*loss, adaptor.getLogits().getType()});
  return success();
}

//===----------------------------------------------------------------------===//
// PadOp, IndexAddOp
//===----------------------------------------------------------------------===//

LogicalResult PadOp::inferReturnTypes(MLIRContext *,
                                      std::optional<Location> loc,
                                      Adaptor adaptor,
                                      SmallVectorImpl<Type> &inferred) {
  auto type = rankedOperand(loc, adaptor.getInput(), "input");
  if (failed(type))
    return failure();
  ArrayRef<int64_t> low = adaptor.getLow(), high = adaptor.getHigh(),
                    interior = adaptor.getInterior();
  int64_t rank = type->getRank();
  if (static_cast<int64_t>(low.size()) != rank ||
      static_cast<int64_t>(high.size()) != rank ||
      static_cast<int64_t>(interior.size()) != rank)
    return emitOptionalError(loc, "pad needs low, high and interior for each "
                                  "of the ",
                             rank, " dimensions");
  SmallVector<int64_t> shape;
  for (int64_t d = 0; d < rank; ++d) {
    if (low[d] < 0 || high[d] < 0 || interior[d] < 0)
      return emitOptionalError(loc, "padding of dimension ", d,
                               " must be non-negative");
    int64_t size = type->getDimSize(d);
    shape.push_back(low[d] + size + std::max<int64_t>(size - 1, 0) * interior[d] +
                    high[d]);
  }
  inferred.push_back(RankedTensorType::get(shape, type->getElementType()));
  return success();
}

LogicalResult IndexAddOp::inferReturnTypes(MLIRContext *,
                                           std::optional<Location> loc,
                                           Adaptor adaptor,
                                           SmallVectorImpl<Type> &inferred) {
  auto base = rankedOperand(loc, adaptor.getBase(), "base");
  auto indices = rankedOperand(loc, adaptor.getIndices(), "indices");
  auto updates = rankedOperand(loc, adaptor.getUpdates(), "updates");
  if (failed(base) || failed(indices) || failed(updates))
    return failure();
  int64_t axis = adaptor.getAxis();
  if (failed(checkAxis(loc, axis, base->getRank())))
    return failure();
  SmallVector<int64_t> want(base->getShape().take_front(axis));
  llvm::append_range(want, indices->getShape());
  llvm::append_range(want, base->getShape().drop_front(axis + 1));
  if (updates->getShape() != ArrayRef<int64_t>(want) ||
      updates->getElementType() != base->getElementType())
    return emitOptionalError(loc, "updates must be ",
                             RankedTensorType::get(want,
                                                   base->getElementType()),
                             " (what gather would produce), got ", *updates);
  inferred.push_back(*base);
  return success();
}

//===----------------------------------------------------------------------===//
// Optimizer updates
//===----------------------------------------------------------------------===//

/// State has the parameter's shape; lr and step are scalars; hyperparameters
/// are in range.
static LogicalResult verifyOptimizer(Operation *op, Value param,
                                     ValueRange state, ValueRange scalars,
                                     ArrayRef<std::pair<StringRef, double>> unit,
                                     ArrayRef<std::pair<StringRef, double>> nonNegative) {
  auto shape = cast<ShapedType>(param.getType()).getShape();
  for (Value s : state)
    if (cast<ShapedType>(s.getType()).getShape() != shape)
      return op->emitOpError("optimizer state must have the parameter's shape ")
             << shapeStr(shape) << ", got "
             << shapeStr(cast<ShapedType>(s.getType()).getShape());
  for (Value s : scalars)
    if (cast<ShapedType>(s.getType()).getRank() != 0)
      return op->emitOpError("learning rate and step must be scalar tensors, "
                             "got ")
             << s.getType();
  for (auto [name, value] : unit)
    if (!(value >= 0.0 && value < 1.0))
      return op->emitOpError() << name << " must be in [0, 1), got " << value;
  for (auto [name, value] : nonNegative)
    if (!(value >= 0.0))
      return op->emitOpError() << name << " must be non-negative, got "
                               << value;
  return success();
}

LogicalResult SgdUpdateOp::verify() {
  return verifyOptimizer(*this, getParam(), getMomentumBuffer(), getLr(),
                         {{"momentum", getMomentum().convertToDouble()}},
                         {{"weight_decay", getWeightDecay().convertToDouble()}});
}

LogicalResult AdamWUpdateOp::verify() {
  return verifyOptimizer(
      *this, getParam(), ValueRange{getMoment1(), getMoment2()},
      ValueRange{getLr(), getStep()},
      {{"beta1", getBeta1().convertToDouble()},
       {"beta2", getBeta2().convertToDouble()}},
      {{"epsilon", getEpsilon().convertToDouble()},
       {"weight_decay", getWeightDecay().convertToDouble()}});
}

#define GET_OP_CLASSES
#include "ernie/Dialect/Ernie/IR/ErnieOps.cpp.inc"

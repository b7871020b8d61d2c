//===- Collectives.cpp - collective ops: verification and cost --------------===//
//
// Each collective names a mesh and some of its axes; its verifier checks the
// shapes it promises (a gather multiplies a dimension by the group size, a
// scatter divides it), and its cost is the bytes one rank sends with the
// usual ring algorithms.
//
//===----------------------------------------------------------------------===//

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Dialect/Ernie/IR/Sharding.h"

#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/StringSet.h"

using namespace mlir;
using namespace mlir::ernie;

namespace {

/// Axes exist, are distinct, and `dims` are dimensions of `type`.
template <typename OpTy>
LogicalResult verifyGroup(OpTy op, MeshOp mesh) {
  if (!mesh)
    return op.emitOpError("names mesh ")
           << op.getMeshAttr() << ", which is not defined";
  if (op.getAxes().empty())
    return op.emitOpError("needs at least one mesh axis");
  llvm::StringSet<> seen;
  for (Attribute attr : op.getAxes()) {
    StringRef axis = cast<StringAttr>(attr).getValue();
    if (!mesh.getAxisSize(axis))
      return op.emitOpError("mesh ")
             << op.getMeshAttr() << " has no axis '" << axis << "'";
    if (!seen.insert(axis).second)
      return op.emitOpError("axis '") << axis << "' is named twice";
  }
  return success();
}

int64_t groupSize(ArrayAttr axes, MeshOp mesh) {
  int64_t size = 1;
  for (Attribute axis : axes)
    size *= mesh.getAxisSize(cast<StringAttr>(axis).getValue()).value_or(1);
  return size;
}

int64_t bytesOf(Type type) {
  auto shaped = cast<ShapedType>(type);
  return shaped.getNumElements() *
         getElementByteSize(shaped.getElementType());
}


LogicalResult checkDim(Operation *op, int64_t dim, int64_t rank,
                       StringRef name) {
  if (dim >= rank)
    return op->emitOpError() << name << " " << dim
                             << " is out of range for rank " << rank;
  return success();
}

/// `result` equals `input` but for `dim`, which is `input`'s times `factor`
/// (a gather) or divided by it (a scatter, `factor` < 0 means divide).
LogicalResult checkResized(Operation *op, ShapedType input, ShapedType result,
                           int64_t dim, int64_t multiply, int64_t divide) {
  if (input.getElementType() != result.getElementType() ||
      input.getRank() != result.getRank())
    return op->emitOpError("result ")
           << result << " must keep the input's rank and element type";
  for (int64_t d = 0; d < input.getRank(); ++d) {
    int64_t want = input.getDimSize(d);
    if (d == dim) {
      if (want % divide != 0)
        return op->emitOpError("dimension ")
               << d << " of size " << want << " does not divide over "
               << divide << " ranks";
      want = want * multiply / divide;
    }
    if (result.getDimSize(d) != want)
      return op->emitOpError("result dimension ")
             << d << " must be " << want << ", got " << result.getDimSize(d);
  }
  return success();
}

} // namespace

#define ERNIE_COLLECTIVE_COMMON(OP)                                            \
  LogicalResult OP::verifySymbolUses(SymbolTableCollection &symbols) {        \
    return verifyGroup(*this,                                                  \
                       symbols.lookupNearestSymbolFrom<MeshOp>(*this,         \
                                                               getMeshAttr())); \
  }                                                                            \
  int64_t OP::getGroupSize(MeshOp mesh) { return groupSize(getAxes(), mesh); }
ERNIE_COLLECTIVE_COMMON(AllReduceOp)
ERNIE_COLLECTIVE_COMMON(AllGatherOp)
ERNIE_COLLECTIVE_COMMON(ReduceScatterOp)
ERNIE_COLLECTIVE_COMMON(AllToAllOp)
ERNIE_COLLECTIVE_COMMON(ShardSliceOp)
ERNIE_COLLECTIVE_COMMON(ShardInsertOp)
ERNIE_COLLECTIVE_COMMON(CollectivePermuteStartOp)
ERNIE_COLLECTIVE_COMMON(AllReduceStartOp)
ERNIE_COLLECTIVE_COMMON(ReduceScatterStartOp)
ERNIE_COLLECTIVE_COMMON(AllGatherStartOp)
ERNIE_COLLECTIVE_COMMON(PartialInitOp)
ERNIE_COLLECTIVE_COMMON(AxisIndexOp)
#undef ERNIE_COLLECTIVE_COMMON

/// The mesh for shape checks, when the op already sits in a module.
template <typename OpTy>
static MeshOp meshOf(OpTy op) {
  return SymbolTable::lookupNearestSymbolFrom<MeshOp>(op, op.getMeshAttr());
}

LogicalResult AllReduceOp::verify() { return success(); }
LogicalResult PartialInitOp::verify() { return success(); }
LogicalResult AxisIndexOp::verify() {
  if (cast<ShapedType>(getType()).getRank() != 0)
    return emitOpError("result must be a scalar tensor<i64>");
  return success();
}

/// One dimension multiplied (a gather) or divided (a scatter, a slice) by
/// the group size, every other one kept.
template <typename OpTy>
static LogicalResult verifyResizedDim(OpTy op, bool gathers) {
  auto in = cast<ShapedType>(op.getInput().getType());
  if (failed(checkDim(op, op.getDim(), in.getRank(), "dim")))
    return failure();
  MeshOp mesh = meshOf(op);
  if (!mesh)
    return success(); // verifySymbolUses reports it.
  int64_t n = op.getGroupSize(mesh);
  return checkResized(op, in, cast<ShapedType>(op.getType()), op.getDim(),
                      gathers ? n : 1, gathers ? 1 : n);
}

LogicalResult AllGatherOp::verify() {
  return verifyResizedDim(*this, /*gathers=*/true);
}

LogicalResult ReduceScatterOp::verify() {
  return verifyResizedDim(*this, /*gathers=*/false);
}

LogicalResult ShardSliceOp::verify() {
  return verifyResizedDim(*this, /*gathers=*/false);
}

LogicalResult ShardInsertOp::verify() {
  auto piece = cast<ShapedType>(getPiece().getType());
  if (failed(checkDim(*this, getDim(), piece.getRank(), "dim")))
    return failure();
  MeshOp mesh = meshOf(*this);
  if (!mesh)
    return success();
  return checkResized(*this, piece, cast<ShapedType>(getType()), getDim(),
                      getGroupSize(mesh), 1);
}

/// A future must be read exactly once, by a wait later in its block: the
/// memory plan keeps the start's inputs alive until there, and the runtime
/// pairs each start with its waits.
static LogicalResult verifyWaitedOnce(Operation *op, Value future) {
  if (!future.hasOneUse())
    return op->emitOpError("result must be waited for exactly once, found ")
           << std::distance(future.use_begin(), future.use_end()) << " uses";
  Operation *user = *future.user_begin();
  if (!isa<WaitOp>(user) || user->getBlock() != op->getBlock())
    return op->emitOpError("result must be used by an 'ernie.wait' in the "
                           "same block");
  return success();
}

int64_t mlir::ernie::getBucketBytes(Operation *start) {
  auto accumulate = start->getAttrOfType<TypeAttr>("accumulate");
  int64_t bytes = 0;
  for (Value v : start->getOperands()) {
    auto shaped = cast<ShapedType>(v.getType());
    Type element = shaped.getElementType();
    bool widened = accumulate && isa<FloatType>(element) &&
                   element.getIntOrFloatBitWidth() <
                       accumulate.getValue().getIntOrFloatBitWidth();
    bytes += shaped.getNumElements() *
             getElementByteSize(widened ? accumulate.getValue() : element);
  }
  return bytes;
}

Operation *mlir::ernie::getFirstWait(Operation *start) {
  Operation *first = nullptr;
  for (Value future : start->getResults())
    for (Operation *wait : future.getUsers())
      if (!first || wait->isBeforeInBlock(first))
        first = wait;
  return first;
}

LogicalResult CollectivePermuteStartOp::verify() {
  return verifyWaitedOnce(*this, getResult());
}

LogicalResult AllReduceStartOp::inferReturnTypes(
    MLIRContext *context, std::optional<Location>, ValueRange operands,
    DictionaryAttr, OpaqueProperties, RegionRange,
    SmallVectorImpl<Type> &results) {
  for (Value v : operands)
    if (auto t = dyn_cast<RankedTensorType>(v.getType()))
      results.push_back(FutureType::get(context, t));
  return success();
}

void AllReduceStartOp::build(OpBuilder &b, OperationState &state,
                             ValueRange inputs, StringRef mesh, ArrayAttr axes,
                             ReduceKind kind, Type accumulate) {
  build(b, state, inputs, FlatSymbolRefAttr::get(b.getContext(), mesh), axes,
        ReduceKindAttr::get(b.getContext(), kind),
        accumulate ? TypeAttr::get(accumulate) : TypeAttr());
}

LogicalResult AllReduceStartOp::verify() {
  if (getInputs().empty())
    return emitOpError("starts nothing: a bucket needs at least one input");
  if (Type acc = getAccumulate().value_or(Type()); acc && !acc.isF32())
    return emitOpError("accumulates in f32 or in the inputs' own types, not ")
           << acc;
  for (Value future : getResults())
    if (failed(verifyWaitedOnce(*this, future)))
      return failure();
  return success();
}

/// A bucket of scatters or gathers: one future per input, each holding
/// what the blocking op would make of its input; every future waited once.
template <typename OpTy>
static LogicalResult verifyResizedBucket(OpTy op, bool gathers) {
  if (op.getInputs().empty())
    return op.emitOpError("starts nothing: a bucket needs at least one input");
  if (op.getResults().size() != op.getInputs().size())
    return op.emitOpError("needs one future per input, got ")
           << op.getResults().size() << " for " << op.getInputs().size();
  MeshOp mesh = meshOf(op);
  int64_t n = mesh ? op.getGroupSize(mesh) : 0;
  for (auto [input, future] : llvm::zip(op.getInputs(), op.getResults())) {
    auto in = cast<ShapedType>(input.getType());
    if (failed(checkDim(op, op.getDim(), in.getRank(), "dim")))
      return failure();
    if (n && failed(checkResized(op, in,
                                 cast<FutureType>(future.getType()).getValueType(),
                                 op.getDim(), gathers ? n : 1, gathers ? 1 : n)))
      return failure();
    if (failed(verifyWaitedOnce(op, future)))
      return failure();
  }
  return success();
}

LogicalResult ReduceScatterStartOp::verify() {
  if (Type acc = getAccumulate().value_or(Type()); acc && !acc.isF32())
    return emitOpError("accumulates in f32 or in the inputs' own types, not ")
           << acc;
  return verifyResizedBucket(*this, /*gathers=*/false);
}

LogicalResult AllGatherStartOp::verify() {
  return verifyResizedBucket(*this, /*gathers=*/true);
}

LogicalResult AllToAllOp::verify() {
  auto in = cast<ShapedType>(getInput().getType());
  auto out = cast<ShapedType>(getType());
  if (failed(checkDim(*this, getSplitDim(), in.getRank(), "split_dim")) ||
      failed(checkDim(*this, getConcatDim(), in.getRank(), "concat_dim")))
    return failure();
  MeshOp mesh = meshOf(*this);
  if (!mesh)
    return success();
  int64_t n = getGroupSize(mesh);
  if (getSplitDim() == getConcatDim())
    return checkResized(*this, in, out, getSplitDim(), 1, 1);
  if (in.getDimSize(getSplitDim()) % n != 0)
    return emitOpError("split_dim ")
           << getSplitDim() << " of size " << in.getDimSize(getSplitDim())
           << " does not divide over " << n << " ranks";
  SmallVector<int64_t> shape(in.getShape());
  shape[getSplitDim()] /= n;
  shape[getConcatDim()] *= n;
  if (out.getShape() != ArrayRef<int64_t>(shape) ||
      out.getElementType() != in.getElementType())
    return emitOpError("result must be ")
           << RankedTensorType::get(shape, in.getElementType()) << ", got "
           << out;
  return success();
}

// Bytes one rank sends (ring algorithms): the quantity plans are judged by.
int64_t AllReduceOp::getBytesAccessed() {
  MeshOp mesh = meshOf(*this);
  int64_t n = mesh ? getGroupSize(mesh) : 1;
  return 2 * bytesOf(getType()) * (n - 1) / n;
}
int64_t AllGatherOp::getBytesAccessed() {
  MeshOp mesh = meshOf(*this);
  int64_t n = mesh ? getGroupSize(mesh) : 1;
  return bytesOf(getType()) * (n - 1) / n;
}
int64_t ReduceScatterOp::getBytesAccessed() {
  MeshOp mesh = meshOf(*this);
  int64_t n = mesh ? getGroupSize(mesh) : 1;
  return bytesOf(getInput().getType()) * (n - 1) / n;
}
int64_t AllToAllOp::getBytesAccessed() {
  MeshOp mesh = meshOf(*this);
  int64_t n = mesh ? getGroupSize(mesh) : 1;
  return bytesOf(getType()) * (n - 1) / n;
}
int64_t CollectivePermuteStartOp::getBytesAccessed() {
  MeshOp mesh = meshOf(*this);
  int64_t n = mesh ? getGroupSize(mesh) : 1;
  return (n > 1 && getShift() % n != 0) ? bytesOf(getInput().getType()) : 0;
}
int64_t AllReduceStartOp::getBytesAccessed() {
  MeshOp mesh = meshOf(*this);
  int64_t n = mesh ? getGroupSize(mesh) : 1;
  return 2 * getBucketBytes(*this) * (n - 1) / n;
}
int64_t ReduceScatterStartOp::getBytesAccessed() {
  MeshOp mesh = meshOf(*this);
  int64_t n = mesh ? getGroupSize(mesh) : 1;
  return getBucketBytes(*this) * (n - 1) / n;
}
int64_t AllGatherStartOp::getBytesAccessed() {
  MeshOp mesh = meshOf(*this);
  int64_t n = mesh ? getGroupSize(mesh) : 1;
  return getBucketBytes(*this) * (n - 1);
}
int64_t ShardSliceOp::getBytesAccessed() { return 0; }
int64_t ShardInsertOp::getBytesAccessed() { return 0; }
int64_t PartialInitOp::getBytesAccessed() { return 0; }
int64_t AxisIndexOp::getBytesAccessed() { return 0; }

//===----------------------------------------------------------------------===//
// Pipeline transfers
//===----------------------------------------------------------------------===//

static LogicalResult verifyChannel(Operation *op, int64_t channel) {
  if (channel < 0)
    return op->emitOpError("channel must be non-negative, got ") << channel;
  return success();
}

LogicalResult SendOp::verify() {
  // I64Attr's getter is unsigned: read the stored signed value.
  if (int64_t peer = getPeerAttr().getInt(); peer < 0)
    return emitOpError("peer stage must be non-negative, got ") << peer;
  return verifyChannel(*this, getChannel());
}

LogicalResult RecvOp::verify() {
  // I64Attr's getter is unsigned: read the stored signed value.
  if (int64_t peer = getPeerAttr().getInt(); peer < 0)
    return emitOpError("peer stage must be non-negative, got ") << peer;
  return verifyChannel(*this, getChannel());
}

/// A group of pipeline stages: non-empty, sorted, distinct, non-negative.
static LogicalResult verifyStageGroup(Operation *op, ArrayRef<int64_t> stages,
                                      int64_t channel) {
  if (stages.empty())
    return op->emitOpError("needs at least one stage");
  for (auto [i, s] : llvm::enumerate(stages)) {
    if (s < 0)
      return op->emitOpError("stage ") << s << " is negative";
    if (i > 0 && s <= stages[i - 1])
      return op->emitOpError("stages must be sorted and distinct, got [")
             << stages << "]";
  }
  return verifyChannel(op, channel);
}

LogicalResult StageAllReduceOp::verify() {
  return verifyStageGroup(*this, getStages(), getChannel());
}
LogicalResult StageBroadcastOp::verify() {
  return verifyStageGroup(*this, getStages(), getChannel());
}

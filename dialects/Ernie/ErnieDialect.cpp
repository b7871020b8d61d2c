//===- ErnieDialect.cpp - the ernie dialect ---------------------------------===//
//
// Registration of ops and attributes, and constant materialisation.
//
//===----------------------------------------------------------------------===//

#include "ernie/Dialect/Ernie/IR/ErnieDialect.h"
#include "ernie/Dialect/Ernie/IR/ErnieAttrs.h"
#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Dialect/Ernie/IR/Sharding.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/Interfaces/CallInterfaces.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "mlir/Transforms/InliningUtils.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::ernie;

#include "ernie/Dialect/Ernie/IR/ErnieEnums.cpp.inc"
#include "ernie/Dialect/Ernie/IR/ErnieOpsDialect.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "ernie/Dialect/Ernie/IR/ErnieAttrs.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "ernie/Dialect/Ernie/IR/ErnieTypes.cpp.inc"

namespace {
/// Every ernie op may be inlined: they are value-semantic and region-free
/// (autodiff and propagation inline calls to see whole computations).
struct ErnieInlinerInterface : DialectInlinerInterface {
  using DialectInlinerInterface::DialectInlinerInterface;
  bool isLegalToInline(Operation *, Operation *, bool) const final {
    return true;
  }
  bool isLegalToInline(Region *, Region *, bool, IRMapping &) const final {
    return true;
  }
  bool isLegalToInline(Operation *, Region *, bool, IRMapping &) const final {
    return true;
  }
};
} // namespace

void ErnieDialect::initialize() {
  addInterfaces<ErnieInlinerInterface>();
  addOperations<
#define GET_OP_LIST
#include "ernie/Dialect/Ernie/IR/ErnieOps.cpp.inc"
      >();
  addAttributes<
#define GET_ATTRDEF_LIST
#include "ernie/Dialect/Ernie/IR/ErnieAttrs.cpp.inc"
      >();
  addTypes<
#define GET_TYPEDEF_LIST
#include "ernie/Dialect/Ernie/IR/ErnieTypes.cpp.inc"
      >();
}

LogicalResult ErnieDialect::verifyRegionArgAttribute(Operation *op,
                                                    unsigned regionIndex,
                                                    unsigned argIndex,
                                                    NamedAttribute attr) {
  StringRef name = attr.getName().strref();
  if (name == kShardOfAttrName) {
    if (!isa<ShardingAttr>(attr.getValue()))
      return op->emitError() << "'" << name
                             << "' on an argument must be an #ernie.sharding";
    return success();
  }
  if (name == kGlobalShapeAttrName)
    return verifyGlobalShape(op, attr, "argument", argIndex);
  if (name == kShardingAttrName) {
    auto sharding = dyn_cast<ShardingAttr>(attr.getValue());
    auto func = dyn_cast<FunctionOpInterface>(op);
    if (!sharding || !func)
      return op->emitError() << "'" << name
                             << "' on an argument must be an #ernie.sharding";
    return verifySharding(op, sharding, func.getArgumentTypes()[argIndex],
                          ("argument #" + Twine(argIndex)).str());
  }
  if (name == kLearningRateAttrName || name == kStepAttrName) {
    if (!isa<UnitAttr>(attr.getValue()))
      return op->emitError() << "'" << name << "' on argument #" << argIndex
                             << " is a unit attribute";
    return success();
  }
  if (name == kPipelineStagesAttrName || name == kSharedStagesAttrName) {
    auto stages = dyn_cast<DenseI64ArrayAttr>(attr.getValue());
    if (!stages || llvm::any_of(stages.asArrayRef(),
                                [](int64_t s) { return s < 0; }))
      return op->emitError() << "'" << name << "' on argument #" << argIndex
                             << " must be an array of stage indices";
    return success();
  }
  if (name == kResidualAttrName || name == kGradientAttrName ||
      name == kMicroBatchMaxAttrName) {
    auto value = dyn_cast<StringAttr>(attr.getValue());
    if (!value || value.getValue().empty())
      return op->emitError() << "'" << name << "' on argument #" << argIndex
                             << " must be a non-empty string";
    return success();
  }
  if (name == kBufferOffsetAttrName || name == kPipelineRankAttrName ||
      name == kInputAttrName) {
    if (!isa<IntegerAttr>(attr.getValue()))
      return op->emitError() << "'" << name << "' on argument #" << argIndex
                             << " must be an integer";
    return success();
  }
  if (name == kOptStateAttrName) {
    auto value = dyn_cast<StringAttr>(attr.getValue());
    if (!value || !value.getValue().contains(':'))
      return op->emitError() << "'ernie.opt_state' on argument #" << argIndex
                             << " must be \"<param>:<slot>\"";
    return success();
  }
  if (name != kParamAttrName && name != kTiedAttrName)
    return op->emitError() << "unknown ernie argument attribute '" << name
                           << "' on argument #" << argIndex;
  auto value = dyn_cast<StringAttr>(attr.getValue());
  if (!value || value.getValue().empty())
    return op->emitError() << "'" << name << "' on argument #" << argIndex
                           << " must be a non-empty string";
  if (name == kTiedAttrName) {
    auto func = dyn_cast<FunctionOpInterface>(op);
    if (func && !func.getArgAttr(argIndex, kParamAttrName))
      return op->emitError() << "argument #" << argIndex << " is tied ('"
                             << value.getValue()
                             << "') but is not a parameter (no '"
                             << kParamAttrName << "')";
  }
  return success();
}

/// Folded values come back as `ernie.full` when they are splats (so a folded
/// zero still reads as a fill) and as `ernie.constant` otherwise.
Operation *ErnieDialect::materializeConstant(OpBuilder &builder,
                                             Attribute value, Type type,
                                             Location loc) {
  auto elements = dyn_cast<ElementsAttr>(value);
  if (!elements || elements.getType() != type)
    return nullptr;
  if (elements.isSplat()) {
    auto splat = dyn_cast<DenseElementsAttr>(elements);
    if (splat)
      return FullOp::create(builder, loc, type,
                            cast<TypedAttr>(splat.getSplatValue<Attribute>()));
  }
  return ConstantOp::create(builder, loc, type, elements);
}

Operation *mlir::ernie::getLocalLossOp(func::FuncOp fn) {
  if (fn.isExternal())
    return nullptr;
  Operation *ret = fn.getBody().front().getTerminator();
  for (auto [i, operand] : llvm::enumerate(ret->getOperands())) {
    if (!fn.getResultAttr(i, ErnieDialect::kLossAttrName))
      continue;
    Operation *loss = operand.getDefiningOp();
    // Partition reduces the loss over the batch where it is returned,
    // after the backward.
    while (isa_and_nonnull<AllReduceOp>(loss))
      loss = loss->getOperand(0).getDefiningOp();
    if (!loss || isa<CallOpInterface>(loss))
      return nullptr;
    return fn.getBody().front().findAncestorOpInBlock(*loss);
  }
  return nullptr;
}

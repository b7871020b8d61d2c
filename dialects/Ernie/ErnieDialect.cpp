//===- ErnieDialect.cpp - the ernie dialect ---------------------------------===//
//
// Registration of ops and attributes, and constant materialisation.
//
//===----------------------------------------------------------------------===//

#include "ernie/Dialect/Ernie/IR/ErnieDialect.h"
#include "ernie/Dialect/Ernie/IR/ErnieAttrs.h"
#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Dialect/Ernie/IR/PipelineInfo.h"
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
    // Replicas of a shared weight are named by their parameter.
    auto func = dyn_cast<FunctionOpInterface>(op);
    if (func && !func.getArgAttr(argIndex, kParamAttrName))
      return op->emitError()
             << "argument #" << argIndex << " has '" << name
             << "' but is not a parameter (no '" << kParamAttrName << "')";
    return success();
  }
  if (name == kResidualAttrName || name == kGradientAttrName ||
      name == kMicroBatchMaxAttrName || name == kMicroBatchSumAttrName) {
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
  if (name == kParamAttrName) {
    auto func = dyn_cast<FunctionOpInterface>(op);
    if (func && argIndex < func.getNumArguments() &&
        hasZeroSizeDimension(func.getArgumentTypes()[argIndex]))
      return op->emitError()
             << "parameter argument #" << argIndex << " ('" << value.getValue()
             << "') has a zero-size dimension ("
             << func.getArgumentTypes()[argIndex]
             << "): ernie tensors have no zero-size dimensions";
  }
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

FunctionAttrEditor::FunctionAttrEditor(func::FuncOp fn, Which which)
    : fn(fn), which(which) {
  unsigned n = which == Arguments ? fn.getNumArguments() : fn.getNumResults();
  for (unsigned i = 0; i < n; ++i)
    lists.emplace_back(which == Arguments ? fn.getArgAttrDict(i)
                                          : fn.getResultAttrDict(i));
}

void FunctionAttrEditor::set(unsigned i, StringRef name, Attribute value) {
  lists[i].set(name, value);
  dirty = true;
}

void FunctionAttrEditor::remove(unsigned i, StringRef name) {
  if (lists[i].erase(name))
    dirty = true;
}

void FunctionAttrEditor::commit() {
  if (!dirty)
    return;
  SmallVector<DictionaryAttr> dicts;
  for (NamedAttrList &list : lists)
    dicts.push_back(list.getDictionary(fn.getContext()));
  if (which == Arguments)
    fn.setAllArgAttrs(dicts);
  else
    fn.setAllResultAttrs(dicts);
  dirty = false;
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

//===----------------------------------------------------------------------===//
// The module's pipeline (PipelineInfo.h)
//===----------------------------------------------------------------------===//

/// Bounds on what a pipeline dictionary may say: a schedule (stages x
/// virtual stages x micro-batches steps per direction) small enough to
/// write out as text, and stages few enough for the schedule check
/// (runtime::checkSchedule sweeps every rank per round: 2^16 stages took
/// 100 s).
static constexpr int64_t kMaxPipelineSteps = int64_t(1) << 22;
static constexpr int64_t kMaxPipelineStages = int64_t(1) << 12;

FailureOr<PipelineInfo>
mlir::ernie::parsePipelineInfo(DictionaryAttr dict,
                               function_ref<InFlightDiagnostic()> emitError) {
  StringRef attrName = ErnieDialect::kPipelineAttrName;
  auto fail = [&](StringRef key, StringRef what) -> FailureOr<PipelineInfo> {
    return emitError() << "'" << attrName << "' key '" << key << "' " << what;
  };
  PipelineInfo info;
  // A positive integer key; required unless `optional`.
  auto readInt = [&](StringRef key, bool optional,
                     std::optional<int64_t> &out) -> LogicalResult {
    Attribute value = dict.get(key);
    if (!value) {
      if (optional)
        return success();
      return fail(key, "is missing");
    }
    auto integer = dyn_cast<IntegerAttr>(value);
    if (!integer || !integer.getType().isSignlessInteger(64))
      return fail(key, "must be an i64 integer");
    if (integer.getInt() < 1 || integer.getInt() > MeshOp::kMaxRanks)
      return fail(key, "must be in [1, " + std::to_string(MeshOp::kMaxRanks) +
                           "], got " + std::to_string(integer.getInt()));
    out = integer.getInt();
    return success();
  };
  auto readString = [&](StringRef key, bool optional,
                        std::optional<std::string> &out) -> LogicalResult {
    Attribute value = dict.get(key);
    if (!value) {
      if (optional)
        return success();
      return fail(key, "is missing");
    }
    auto text = dyn_cast<StringAttr>(value);
    if (!text || text.getValue().empty())
      return fail(key, "must be a non-empty string");
    out = text.getValue().str();
    return success();
  };
  for (NamedAttribute entry : dict)
    if (!llvm::is_contained(
            {"stages", "virtual_stages", "axis", "micro_batches", "schedule"},
            entry.getName().strref()))
      return fail(entry.getName().strref(),
                  "is unknown (expected stages, virtual_stages, axis, "
                  "micro_batches, schedule)");
  std::optional<int64_t> stages, virtualStages;
  std::optional<std::string> axis;
  if (failed(readInt("stages", false, stages)) ||
      failed(readInt("virtual_stages", false, virtualStages)) ||
      failed(readString("axis", false, axis)) ||
      failed(readInt("micro_batches", true, info.microBatches)) ||
      failed(readString("schedule", true, info.schedule)))
    return failure();
  if (info.microBatches.has_value() != info.schedule.has_value())
    return fail(info.microBatches ? "schedule" : "micro_batches",
                "is missing (a scheduled pipeline has both micro_batches "
                "and schedule)");
  if (*stages > kMaxPipelineStages)
    return fail("stages", "must be at most " +
                              std::to_string(kMaxPipelineStages) + ", got " +
                              std::to_string(*stages));
  info.stages = *stages;
  info.virtualStages = *virtualStages;
  info.axis = *axis;
  int64_t steps = info.stages * info.virtualStages; // both <= 2^20
  if (steps > MeshOp::kMaxRanks ||
      (info.microBatches &&
       llvm::MulOverflow(steps, *info.microBatches, steps)) ||
      steps > kMaxPipelineSteps)
    return emitError() << "'" << attrName
                       << "' has too many steps: stages x virtual_stages "
                          "x micro_batches must be at most "
                       << kMaxPipelineSteps;
  return info;
}

FailureOr<std::vector<std::string>>
mlir::ernie::parsePipelineSteps(Attribute steps,
                                function_ref<InFlightDiagnostic()> emitError) {
  auto array = dyn_cast<ArrayAttr>(steps);
  std::vector<std::string> out;
  for (Attribute entry : array ? array.getValue() : ArrayRef<Attribute>()) {
    auto text = dyn_cast<StringAttr>(entry);
    if (!text) {
      array = nullptr;
      break;
    }
    out.push_back(text.getValue().str());
  }
  if (!array)
    return emitError() << "'" << ErnieDialect::kPipelineScheduleAttrName
                       << "' must be an array of strings, one per pipeline "
                          "rank";
  return out;
}

FailureOr<std::optional<PipelineInfo>>
mlir::ernie::readPipelineInfo(ModuleOp module) {
  auto emitError = [&] { return module.emitError(); };
  Attribute steps = module->getAttr(ErnieDialect::kPipelineScheduleAttrName);
  Attribute value = module->getAttr(ErnieDialect::kPipelineAttrName);
  if (!value) // (steps for schedule=custom may come before the split)
    return std::optional<PipelineInfo>();
  auto dict = dyn_cast<DictionaryAttr>(value);
  if (!dict)
    return module.emitError() << "'" << ErnieDialect::kPipelineAttrName
                              << "' must be a dictionary";
  FailureOr<PipelineInfo> info = parsePipelineInfo(dict, emitError);
  if (failed(info))
    return failure();
  // The stages are the coordinates of the mesh's pipeline axis (as
  // --ernie-pipeline-split made them): nothing larger is scheduled.
  if (info->stages > 1) {
    auto meshes = module.getOps<MeshOp>();
    std::optional<int64_t> size;
    if (!meshes.empty())
      size = (*meshes.begin()).getAxisSize(info->axis);
    if (size != info->stages)
      return module.emitError()
             << "'" << ErnieDialect::kPipelineAttrName << "' has "
             << info->stages << " stages, but the module's mesh has no axis '"
             << info->axis << "' of that size";
  }
  if (steps) {
    FailureOr<std::vector<std::string>> parsed =
        parsePipelineSteps(steps, emitError);
    if (failed(parsed))
      return failure();
    info->rankSteps = std::move(*parsed);
  }
  return std::optional<PipelineInfo>(std::move(*info));
}

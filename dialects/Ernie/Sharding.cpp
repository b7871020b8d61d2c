//===- Sharding.cpp - meshes, sharding annotations and their checks ---------===//
//
// The mesh op, sharding_constraint and reshard, and the checks of a sharding
// against its mesh and its value's type wherever a sharding is written: on
// function arguments and results (`ernie.sharding`), on op results
// (`ernie.shardings`) and on the annotation ops.
//
//===----------------------------------------------------------------------===//

#include "ernie/Dialect/Ernie/IR/Sharding.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/ADT/StringSet.h"

using namespace mlir;
using namespace mlir::ernie;

//===----------------------------------------------------------------------===//
// MeshOp
//===----------------------------------------------------------------------===//

/// `ernie.mesh @name(axis = size, ...)`
ParseResult MeshOp::parse(OpAsmParser &parser, OperationState &result) {
  StringAttr name;
  SmallVector<Attribute> axisNames;
  SmallVector<int64_t> axisSizes;
  if (parser.parseSymbolName(name, getSymNameAttrName(result.name),
                             result.attributes))
    return failure();
  auto parseAxis = [&]() -> ParseResult {
    std::string axis;
    int64_t size;
    if (parser.parseKeywordOrString(&axis) || parser.parseEqual() ||
        parser.parseInteger(size))
      return failure();
    axisNames.push_back(parser.getBuilder().getStringAttr(axis));
    axisSizes.push_back(size);
    return success();
  };
  if (parser.parseCommaSeparatedList(OpAsmParser::Delimiter::Paren,
                                     parseAxis) ||
      parser.parseOptionalAttrDict(result.attributes))
    return failure();
  Builder &b = parser.getBuilder();
  result.addAttribute(getAxisNamesAttrName(result.name),
                      b.getArrayAttr(axisNames));
  result.addAttribute(getAxisSizesAttrName(result.name),
                      b.getDenseI64ArrayAttr(axisSizes));
  return success();
}

void MeshOp::print(OpAsmPrinter &p) {
  p << ' ';
  p.printSymbolName(getSymName());
  p << '(';
  for (auto [i, name] : llvm::enumerate(getAxisNames())) {
    if (i > 0)
      p << ", ";
    p.printKeywordOrString(cast<StringAttr>(name).getValue());
    p << " = " << getAxisSizes()[i];
  }
  p << ')';
  p.printOptionalAttrDict((*this)->getAttrs(),
                          {getSymNameAttrName(), getAxisNamesAttrName(),
                           getAxisSizesAttrName()});
}

LogicalResult MeshOp::verify() {
  if (getAxisNames().size() != getAxisSizes().size())
    return emitOpError("has ") << getAxisNames().size() << " axis names but "
                               << getAxisSizes().size() << " sizes";
  if (getAxisNames().empty())
    return emitOpError("needs at least one axis");
  llvm::StringSet<> seen;
  int64_t ranks = 1;
  for (auto [name, size] : llvm::zip(getAxisNames(), getAxisSizes())) {
    StringRef axis = cast<StringAttr>(name).getValue();
    if (axis.empty())
      return emitOpError("axis names must be non-empty");
    if (!seen.insert(axis).second)
      return emitOpError("axis '") << axis << "' is declared twice";
    if (size < 1)
      return emitOpError("axis '") << axis << "' has size " << size
                                   << "; sizes must be positive";
    if (llvm::MulOverflow(ranks, size, ranks))
      return emitOpError("has more ranks than fit in an int64");
  }
  return success();
}

std::optional<int64_t> MeshOp::getAxisSize(StringRef name) {
  for (auto [axis, size] : llvm::zip(getAxisNames(), getAxisSizes()))
    if (cast<StringAttr>(axis).getValue() == name)
      return size;
  return std::nullopt;
}

int64_t MeshOp::getNumRanks() {
  int64_t ranks = 1;
  for (int64_t size : getAxisSizes())
    ranks *= size;
  return ranks;
}

//===----------------------------------------------------------------------===//
// Checking a sharding against its mesh and type.
//===----------------------------------------------------------------------===//

MeshOp mlir::ernie::lookupMesh(Operation *from, ShardingAttr sharding) {
  return SymbolTable::lookupNearestSymbolFrom<MeshOp>(from,
                                                      sharding.getMesh());
}

LogicalResult
mlir::ernie::verifySharding(function_ref<InFlightDiagnostic()> emitError,
                            ShardingAttr sharding, MeshOp mesh, Type type,
                            StringRef what) {
  if (!mesh)
    return emitError() << what << ": sharding names mesh "
                       << sharding.getMesh() << ", which is not defined";
  auto tensor = dyn_cast<RankedTensorType>(type);
  if (!tensor)
    return emitError() << what << ": only ranked tensors can be sharded, got "
                       << type;
  if (sharding.getRank() != tensor.getRank())
    return emitError() << what << ": sharding has " << sharding.getRank()
                       << " dimensions but the value has rank "
                       << tensor.getRank();
  for (StringRef axis : sharding.getUsedAxes())
    if (!mesh.getAxisSize(axis))
      return emitError() << what << ": mesh " << sharding.getMesh()
                         << " has no axis '" << axis << "'";
  // A dimension its axes do not divide is split unevenly, the last pieces
  // padded, unless the mesh asks for even splits.
  if (!mesh->hasAttr(kEvenSplitsAttrName))
    return success();
  for (int64_t d = 0; d < tensor.getRank(); ++d) {
    int64_t parts = 1;
    SmallVector<StringRef> axes = sharding.getDimAxes(d);
    for (StringRef axis : axes)
      parts *= *mesh.getAxisSize(axis);
    if (tensor.getDimSize(d) % parts != 0) {
      InFlightDiagnostic diag = emitError();
      diag << what << ": dimension " << d << " of size "
           << tensor.getDimSize(d) << " does not divide over mesh axes {";
      llvm::interleaveComma(axes, diag);
      return diag << "} of " << parts << " ranks, and mesh "
                  << sharding.getMesh() << " asks for even splits ('"
                  << kEvenSplitsAttrName << "')";
    }
  }
  return success();
}

LogicalResult mlir::ernie::verifySharding(Operation *op, ShardingAttr sharding,
                                          Type type, StringRef what) {
  return verifySharding([&] { return op->emitError(); }, sharding,
                        lookupMesh(op, sharding), type, what);
}

LogicalResult
ShardingConstraintOp::verifySymbolUses(SymbolTableCollection &symbols) {
  auto mesh =
      symbols.lookupNearestSymbolFrom<MeshOp>(*this, getSharding().getMesh());
  return verifySharding([&] { return emitOpError(); }, getSharding(), mesh,
                        getType(), "result");
}

LogicalResult ReshardOp::verifySymbolUses(SymbolTableCollection &symbols) {
  auto mesh =
      symbols.lookupNearestSymbolFrom<MeshOp>(*this, getSharding().getMesh());
  return verifySharding([&] { return emitOpError(); }, getSharding(), mesh,
                        getType(), "result");
}

//===----------------------------------------------------------------------===//
// Dialect attribute hooks.
//===----------------------------------------------------------------------===//

LogicalResult mlir::ernie::verifyGlobalShape(Operation *op, NamedAttribute attr,
                                             StringRef what, unsigned index) {
  auto shape = dyn_cast<DenseI64ArrayAttr>(attr.getValue());
  if (!shape || llvm::any_of(shape.asArrayRef(),
                             [](int64_t d) { return d < 1; }))
    return op->emitError() << "'" << kGlobalShapeAttrName << "' on " << what
                           << " #" << index
                           << " must be an array of positive sizes";
  return success();
}

LogicalResult ErnieDialect::verifyRegionResultAttribute(Operation *op,
                                                        unsigned regionIndex,
                                                        unsigned resultIndex,
                                                        NamedAttribute attr) {
  if (attr.getName() == kLossAttrName) {
    if (!isa<UnitAttr>(attr.getValue()))
      return op->emitError() << "'" << kLossAttrName << "' on result #"
                             << resultIndex << " is a unit attribute";
    return success();
  }
  if (attr.getName() == kMetricAttrName) {
    auto name = dyn_cast<StringAttr>(attr.getValue());
    if (!name || name.getValue().empty())
      return op->emitError() << "'" << kMetricAttrName << "' on result #"
                             << resultIndex << " must name the metric";
    auto func = dyn_cast<FunctionOpInterface>(op);
    auto type = func ? dyn_cast<RankedTensorType>(func.getResultTypes()[resultIndex])
                     : RankedTensorType();
    if (func && (!type || type.getRank() != 0 ||
                 !isa<FloatType>(type.getElementType())))
      return op->emitError() << "metric '" << name.getValue() << "' (result #"
                             << resultIndex << ") must be a scalar float tensor";
    return success();
  }
  if (attr.getName() == "ernie.grad_of" || attr.getName() == kUpdatesAttrName ||
      attr.getName() == kResidualAttrName ||
      attr.getName() == kGradientAttrName ||
      attr.getName() == kMicroBatchMaxAttrName ||
      attr.getName() == kMicroBatchSumAttrName) {
    auto name = dyn_cast<StringAttr>(attr.getValue());
    if (!name || name.getValue().empty())
      return op->emitError() << "'" << attr.getName().strref()
                             << "' on result #" << resultIndex
                             << " must name a parameter";
    return success();
  }
  if (attr.getName() == kGlobalShapeAttrName)
    return verifyGlobalShape(op, attr, "result", resultIndex);
  if (attr.getName() == kShardOfAttrName) {
    if (!isa<ShardingAttr>(attr.getValue()))
      return op->emitError() << "'" << kShardOfAttrName
                             << "' on a function result must be an "
                                "#ernie.sharding";
    return success();
  }
  if (attr.getName() != kShardingAttrName)
    return op->emitError() << "unknown ernie result attribute '"
                           << attr.getName().strref() << "' on result #"
                           << resultIndex;
  auto sharding = dyn_cast<ShardingAttr>(attr.getValue());
  auto func = dyn_cast<FunctionOpInterface>(op);
  if (!sharding || !func)
    return op->emitError() << "'" << kShardingAttrName
                           << "' on a function result must be an "
                              "#ernie.sharding";
  return verifySharding(op, sharding, func.getResultTypes()[resultIndex],
                        ("result #" + Twine(resultIndex)).str());
}

LogicalResult ErnieDialect::verifyOperationAttribute(Operation *op,
                                                     NamedAttribute attr) {
  StringRef name = attr.getName().strref();
  if (name == kArenaBytesAttrName || name == kArgumentBytesAttrName ||
      name == kLivePeakBytesAttrName || name == kActivationBytesAttrName) {
    if (!isa<IntegerAttr>(attr.getValue()) || !isa<FunctionOpInterface>(op))
      return op->emitError() << "'" << name
                             << "' is an integer on a function";
    return success();
  }
  if (name == kStageAttrName || name == kPipelineStageAttrName) {
    auto stage = dyn_cast<IntegerAttr>(attr.getValue());
    if (!stage || stage.getInt() < 0)
      return op->emitError() << "'" << name
                             << "' must be a non-negative integer";
    return success();
  }
  if (name == kFp8TileAttrName) {
    auto tile = dyn_cast<DenseI64ArrayAttr>(attr.getValue());
    if (!tile || tile.size() != 2 || tile[0] < 1 || tile[1] < 1 ||
        !isa<ReshapeOp>(op))
      return op->emitError() << "'" << name
                             << "' is two positive tile sizes on a reshape";
    return success();
  }
  if (name == kLayerAttrName) {
    auto layer = dyn_cast<StringAttr>(attr.getValue());
    if (!layer || layer.getValue().empty())
      return op->emitError() << "'" << name << "' is a layer name (a non-empty string)";
    return success();
  }
  if (name == kRecomputedAttrName) {
    if (!isa<UnitAttr>(attr.getValue()))
      return op->emitError() << "'" << name << "' is a unit attribute";
    return success();
  }
  if (name == kBackwardAttrName) {
    if (!isa<UnitAttr>(attr.getValue()))
      return op->emitError() << "'" << name << "' is a unit attribute";
    return success();
  }
  if (name == kPipelineAttrName || name == kPipelineScheduleAttrName) {
    if (!isa<ModuleOp>(op))
      return op->emitError() << "'" << name << "' belongs on the module";
    return success(); // Read and checked by the pipeline passes.
  }
  if (name == kEvenSplitsAttrName) {
    if (!isa<UnitAttr>(attr.getValue()) || !isa<MeshOp>(op))
      return op->emitError() << "'" << name
                             << "' is a unit attribute on an ernie.mesh";
    return success();
  }
  if (name == kBufferOffsetsAttrName) {
    auto offsets = dyn_cast<DenseI64ArrayAttr>(attr.getValue());
    if (!offsets || offsets.size() != static_cast<int64_t>(op->getNumResults()))
      return op->emitError() << "'" << name
                             << "' must list one offset per result";
    return success();
  }
  if (attr.getName() != kResultShardingsAttrName)
    return op->emitError() << "unknown ernie op attribute '"
                           << attr.getName().strref() << "'";
  auto shardings = dyn_cast<ArrayAttr>(attr.getValue());
  if (!shardings || shardings.size() != op->getNumResults())
    return op->emitError() << "'" << kResultShardingsAttrName
                           << "' must list one sharding per result ("
                           << op->getNumResults() << ")";
  for (auto [i, entry] : llvm::enumerate(shardings)) {
    auto sharding = dyn_cast<ShardingAttr>(entry);
    if (!sharding)
      return op->emitError() << "'" << kResultShardingsAttrName << "' entry "
                             << i << " is not an #ernie.sharding";
    if (failed(verifySharding(op, sharding, op->getResult(i).getType(),
                              ("result #" + Twine(i)).str())))
      return failure();
  }
  return success();
}

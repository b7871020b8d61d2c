//===- InferSpmd.cpp - one op's SPMD rule, called alone ----------------------===//

#include "ernie/Sharding/InferSpmd.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"

using namespace mlir;
using namespace mlir::ernie;

FailureOr<SpmdResult> mlir::ernie::inferSpmd(
    MLIRContext *context, StringRef opName,
    ArrayRef<RankedTensorType> inputTypes,
    ArrayRef<ShardingAttr> inputShardings, DictionaryAttr attrs,
    const MeshShape &mesh, std::string &error,
    ArrayRef<RankedTensorType> resultTypes) {
  context->getOrLoadDialect<ErnieDialect>();
  context->getOrLoadDialect<func::FuncDialect>();
  std::string diagnostics;
  ScopedDiagnosticHandler handler(context, [&](Diagnostic &diag) {
    if (!diagnostics.empty())
      diagnostics += "\n";
    diagnostics += diag.str();
    return success();
  });
  auto fail = [&](const Twine &why) -> FailureOr<SpmdResult> {
    error = diagnostics.empty() ? why.str() : diagnostics;
    return failure();
  };

  std::optional<RegisteredOperationName> name =
      RegisteredOperationName::lookup(opName, context);
  if (!name)
    return fail("unknown op '" + opName + "'");
  if (inputShardings.size() != inputTypes.size())
    return fail("got " + Twine(inputShardings.size()) + " shardings for " +
                Twine(inputTypes.size()) + " inputs");

  // A throwaway function holding the op, so its verifier sees real values.
  OpBuilder builder(context);
  Location loc = builder.getUnknownLoc();
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  builder.setInsertionPointToEnd(module->getBody());
  SmallVector<Type> argTypes(inputTypes.begin(), inputTypes.end());
  auto func = func::FuncOp::create(builder, loc, "infer_spmd",
                                   builder.getFunctionType(argTypes, {}));
  Block *entry = func.addEntryBlock();
  builder.setInsertionPointToEnd(entry);

  OperationState state(loc, *name);
  state.addOperands(entry->getArguments());
  if (attrs)
    state.addAttributes(attrs.getValue());
  if (!resultTypes.empty()) {
    state.addTypes(SmallVector<Type>(resultTypes.begin(), resultTypes.end()));
  } else {
    auto infer = name->getInterface<InferTypeOpInterface>();
    if (!infer)
      return fail("'" + opName + "' needs its result types");
    SmallVector<Type> inferred;
    if (failed(infer->inferReturnTypes(
            context, loc, state.operands,
            state.attributes.getDictionary(context), state.getRawProperties(),
            state.regions, inferred)))
      return fail("'" + opName + "' rejects these inputs");
    state.addTypes(inferred);
  }
  Operation *op = builder.create(state);
  func::ReturnOp::create(builder, loc);
  if (failed(verify(op)))
    return fail("'" + opName + "' rejects these inputs");
  auto ruleOp = dyn_cast<ShardingRuleOpInterface>(op);
  if (!ruleOp)
    return fail("'" + opName + "' has no sharding rule");

  SmallVector<RankedTensorType> outTypes;
  for (Type type : op->getResultTypes())
    outTypes.push_back(cast<RankedTensorType>(type));
  SmallVector<ShardingAttr> noResults(op->getNumResults());
  OpShardings resolved =
      resolveShardings(context, ruleOp.getShardingRule(), inputShardings,
                       noResults, inputTypes, outTypes, mesh);
  return SpmdResult{resolved.operands, resolved.results};
}

FailureOr<ShardingAttr>
mlir::ernie::shardingFromDimsMapping(MLIRContext *context,
                                     const MeshShape &mesh,
                                     const DimsMapping &mapping) {
  int64_t meshRank = mesh.axes.size();
  SmallVector<bool> used(meshRank, false);
  auto take = [&](int64_t meshDim) {
    if (meshDim < 0 || meshDim >= meshRank || used[meshDim])
      return false;
    used[meshDim] = true;
    return true;
  };
  SmallVector<SmallVector<StringRef>> dims;
  for (int64_t meshDim : mapping.dims) {
    SmallVector<StringRef> &axes = dims.emplace_back();
    if (meshDim == -1)
      continue;
    if (!take(meshDim))
      return failure();
    axes.push_back(mesh.axes[meshDim]);
  }
  SmallVector<std::pair<StringRef, ReduceKind>> partial;
  for (int64_t meshDim : mapping.partialDims) {
    if (!take(meshDim))
      return failure();
    partial.emplace_back(mesh.axes[meshDim], ReduceKind::sum);
  }
  return ShardingAttr::get(context, mesh.name, dims, partial);
}

FailureOr<DimsMapping>
mlir::ernie::dimsMappingFromSharding(ShardingAttr sharding,
                                     const MeshShape &mesh) {
  auto meshDim = [&](StringRef axis) -> int64_t {
    const auto *it = llvm::find(mesh.axes, axis);
    return it == mesh.axes.end() ? -1 : it - mesh.axes.begin();
  };
  DimsMapping mapping;
  for (int64_t d = 0; d < sharding.getRank(); ++d) {
    SmallVector<StringRef> axes = sharding.getDimAxes(d);
    if (axes.size() > 1)
      return failure();
    mapping.dims.push_back(axes.empty() ? -1 : meshDim(axes.front()));
  }
  for (auto [axis, kind] : sharding.getPartials())
    mapping.partialDims.push_back(meshDim(axis));
  return mapping;
}

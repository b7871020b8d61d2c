//===- ZeroSharding.cpp - ZeRO as placements on the training step ------------===//
//
// ZeRO (Rajbhandari et al.) is a memory layout, and here it is only that:
// this pass marks which state is split over the data-parallel axis, and
// sharding propagation and partition derive the reduce-scatters and
// all-gathers the update needs — the same machinery every other plan uses.
//
//===----------------------------------------------------------------------===//

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Dialect/Ernie/IR/Sharding.h"
#include "ernie/Passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

namespace mlir::ernie {
#define GEN_PASS_DEF_ZEROSHARDINGPASS
#include "ernie/Passes/Passes.h.inc"
} // namespace mlir::ernie

using namespace mlir;
using namespace mlir::ernie;

namespace {

/// `sharding` with `axis` added (minor-most) to the first dimension of
/// `type` it divides; `sharding` itself when it already uses the axis (a
/// slot of a parameter split at level 3); null when no dimension divides.
ShardingAttr splitOver(ShardingAttr sharding, RankedTensorType type,
                       MeshOp mesh, StringRef axis) {
  if (llvm::is_contained(sharding.getUsedAxes(), axis))
    return sharding;
  auto names = mesh.getAxisNames().getAsValueRange<StringAttr>();
  auto sizeOf = [&](StringRef a) {
    return mesh.getAxisSizes()[std::distance(names.begin(), llvm::find(names, a))];
  };
  SmallVector<SmallVector<StringRef>> dims;
  for (int64_t d = 0; d < type.getRank(); ++d)
    dims.push_back(sharding.getDimAxes(d));
  auto splitAt = [&](int64_t d) {
    dims[d].push_back(axis);
    return ShardingAttr::get(sharding.getContext(), sharding.getMesh(), dims,
                             sharding.getPartials());
  };
  for (int64_t d = 0; d < type.getRank(); ++d) {
    int64_t parts = sizeOf(axis);
    for (StringRef a : dims[d])
      parts *= sizeOf(a);
    if (type.getDimSize(d) % parts == 0)
      return splitAt(d);
  }
  // No dimension divides: split the largest one not split yet, unevenly
  // (its last pieces padded), unless the mesh asks for even splits.
  if (mesh->hasAttr(kEvenSplitsAttrName))
    return {};
  int64_t best = -1;
  for (int64_t d = 0; d < type.getRank(); ++d)
    if (dims[d].empty() && type.getDimSize(d) > 1 &&
        (best < 0 || type.getDimSize(d) > type.getDimSize(best)))
      best = d;
  return best < 0 ? ShardingAttr() : splitAt(best);
}

struct ZeroShardingPass
    : ernie::impl::ZeroShardingPassBase<ZeroShardingPass> {
  using ZeroShardingPassBase::ZeroShardingPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    paramArgs.clear();
    if (level < 1 || level > 3) {
      module.emitError() << "ZeRO level must be 1, 2 or 3, not "
                         << static_cast<unsigned>(level);
      return signalPassFailure();
    }
    auto step = module.lookupSymbol<func::FuncOp>(function);
    if (!step || step.isExternal()) {
      module.emitError() << "no function @" << function
                         << " to shard (run --ernie-autodiff with an "
                            "optimizer first)";
      return signalPassFailure();
    }
    SmallVector<MeshOp> meshes(module.getOps<MeshOp>());
    if (meshes.size() != 1) {
      module.emitError() << "ZeRO needs exactly one ernie.mesh, found "
                         << meshes.size();
      return signalPassFailure();
    }
    MeshOp mesh = meshes.front();
    if (!llvm::is_contained(mesh.getAxisNames().getAsValueRange<StringAttr>(),
                            StringRef(axis))) {
      mesh.emitError() << "the mesh has no axis '" << axis << "' to shard over";
      return signalPassFailure();
    }
    MLIRContext *ctx = &getContext();
    auto meshRef = FlatSymbolRefAttr::get(mesh.getSymNameAttr());
    auto currentSharding = [&](DictionaryAttr attrs, Type type) {
      if (auto s = attrs ? attrs.getAs<ShardingAttr>(kShardingAttrName) : ShardingAttr())
        return s;
      return ShardingAttr::getReplicated(ctx, meshRef,
                                         cast<RankedTensorType>(type).getRank());
    };

    // Which states to split: slots from level 1, parameters at level 3.
    llvm::StringMap<ShardingAttr> placed;
    FunctionAttrEditor stepArgs(step, FunctionAttrEditor::Arguments);
    args = &stepArgs;
    for (unsigned i = 0; i < step.getNumArguments(); ++i) {
      DictionaryAttr attrs = step.getArgAttrDict(i);
      StringAttr name;
      if (attrs) {
        name = attrs.getAs<StringAttr>(ErnieDialect::kOptStateAttrName);
        if (!name && level == 3)
          name = attrs.getAs<StringAttr>(ErnieDialect::kParamAttrName);
      }
      auto type = dyn_cast<RankedTensorType>(step.getArgumentTypes()[i]);
      if (!type)
        continue;
      // Below level 3 a parameter stays as the plan lays it out, said
      // explicitly: left open, the optimizer update would hand it its
      // slots' split.
      if (!name && attrs && attrs.get(ErnieDialect::kParamAttrName)) {
        ShardingAttr kept = currentSharding(attrs, type);
        stepArgs.set(i, kShardingAttrName, kept);
        placed[attrs.getAs<StringAttr>(ErnieDialect::kParamAttrName).getValue()] = kept;
        continue;
      }
      if (!name)
        continue;
      // A slot ("w:moment1") starts from its parameter's layout, so a
      // dp x mp plan keeps the slot's mp split and adds dp to it.
      ShardingAttr base = currentSharding(attrs, type);
      if (attrs && attrs.get(ErnieDialect::kOptStateAttrName)) {
        StringRef param = name.getValue().rsplit(':').first;
        if (ShardingAttr p = paramSharding(step, param, meshRef);
            p && p.getRank() == type.getRank())
          base = p;
      }
      ShardingAttr split = splitOver(base, type, mesh, axis);
      if (!split) {
        emitRemark(step.getLoc())
            << "ZeRO: '" << name.getValue() << "' " << type
            << " stays replicated: no dimension divides over " << axis
            << (mesh->hasAttr(kEvenSplitsAttrName)
                    ? " (and the mesh asks for even splits)"
                    : " or is free to split unevenly");
        continue;
      }
      stepArgs.set(i, kShardingAttrName, split);
      placed[name.getValue()] = split;
    }
    // The results that carry those states to the next step, laid out alike.
    {
      FunctionAttrEditor results(step, FunctionAttrEditor::Results);
      for (unsigned i = 0; i < step.getNumResults(); ++i)
        if (auto updates =
                results.getAs<StringAttr>(i, ErnieDialect::kUpdatesAttrName))
          if (ShardingAttr s = placed.lookup(updates.getValue()))
            results.set(i, kShardingAttrName, s);
    }
    // Every other public function taking the parameters (@eval_step; not
    // the gradient the step calls, which propagation lays out from the
    // call) takes them as the step keeps them: the runtime stores one
    // layout per state, and an evaluation that took whole parameters would
    // gather the model into every rank's state (and split it again at the
    // next step).
    llvm::SmallPtrSet<Operation *, 4> called;
    step.walk([&](func::CallOp call) {
      if (auto callee = module.lookupSymbol<func::FuncOp>(call.getCallee()))
        called.insert(callee);
    });
    for (auto fn : module.getOps<func::FuncOp>()) {
      if (fn == step || fn.isPrivate() || fn.isExternal() ||
          called.contains(fn))
        continue;
      FunctionAttrEditor fnArgs(fn, FunctionAttrEditor::Arguments);
      for (unsigned i = 0; i < fn.getNumArguments(); ++i)
        if (auto p = fnArgs.getAs<StringAttr>(i, ErnieDialect::kParamAttrName))
          if (ShardingAttr s = placed.lookup(p.getValue());
              s && s.getRank() == cast<RankedTensorType>(
                                      fn.getArgumentTypes()[i]).getRank())
            fnArgs.set(i, kShardingAttrName, s);
    }

    // Gradients: whole at level 1 (all-reduced), shards from level 2 on:
    // the gradient function returns each gradient split like its
    // parameter's slots, so its pending sum becomes a reduce-scatter.
    if (level == 1) {
      replicateGradients(step, meshRef);
      return;
    }
    step.walk([&](func::CallOp call) {
      auto grad = module.lookupSymbol<func::FuncOp>(call.getCallee());
      if (!grad)
        return;
      FunctionAttrEditor results(grad, FunctionAttrEditor::Results);
      for (unsigned i = 0; i < grad.getNumResults(); ++i) {
        auto of = results.getAs<StringAttr>(i, "ernie.grad_of");
        auto type = dyn_cast<RankedTensorType>(grad.getResultTypes()[i]);
        if (!of || !type)
          continue;
        ShardingAttr param = paramSharding(step, of.getValue(), meshRef);
        if (!param)
          continue;
        // (At level 3 the parameter is already split: its layout is kept.)
        if (ShardingAttr split = splitOver(param, type, mesh, axis))
          results.set(i, kShardingAttrName, split);
      }
    });
  }

  /// The sharding of parameter `name` as @train_step takes it (as it is
  /// now: the pass sets them as it goes).
  ShardingAttr paramSharding(func::FuncOp step, StringRef name,
                             FlatSymbolRefAttr meshRef) {
    if (paramArgs.empty())
      for (unsigned i = 0; i < step.getNumArguments(); ++i)
        if (auto p = step.getArgAttrOfType<StringAttr>(
                i, ErnieDialect::kParamAttrName))
          paramArgs.try_emplace(p.getValue(), i);
    auto it = paramArgs.find(name);
    if (it == paramArgs.end())
      return {};
    unsigned i = it->second;
    if (auto s = args->getAs<ShardingAttr>(i, kShardingAttrName))
      return s;
    return ShardingAttr::getReplicated(
        &getContext(), meshRef,
        cast<RankedTensorType>(step.getArgumentTypes()[i]).getRank());
  }
  /// Each parameter's argument of @train_step (the first, as a search
  /// would find it), built on first use: a lookup per slot and gradient
  /// made the pass quadratic in the model's depth.
  llvm::StringMap<unsigned> paramArgs;
  /// @train_step's arguments as the pass is setting them.
  FunctionAttrEditor *args = nullptr;

  /// Level 1 keeps full gradients over `axis`: a constraint on every
  /// gradient the step's call returns lays it out like its parameter (whole
  /// over dp, any mp split kept), so the pending sum is all-reduced.
  void replicateGradients(func::FuncOp step, FlatSymbolRefAttr meshRef) {
    ModuleOp module = getOperation();
    step.walk([&](func::CallOp call) {
      auto grad = module.lookupSymbol<func::FuncOp>(call.getCallee());
      if (!grad)
        return;
      OpBuilder b(call);
      b.setInsertionPointAfter(call);
      for (unsigned i = 0; i < call.getNumResults(); ++i) {
        auto of = grad.getResultAttrOfType<StringAttr>(i, "ernie.grad_of");
        ShardingAttr layout =
            of ? paramSharding(step, of.getValue(), meshRef) : ShardingAttr();
        Value g = call.getResult(i);
        if (!layout || !isa<RankedTensorType>(g.getType()))
          continue;
        auto constraint = ShardingConstraintOp::create(b, call.getLoc(), g,
                                                       layout, uint64_t(0));
        g.replaceAllUsesExcept(constraint.getResult(), constraint);
      }
    });
  }
};

} // namespace

//===- PlanReport.cpp - per-rank memory and communication as JSON ------------===//

#include "ernie/Dialect/Ernie/IR/ErnieDialect.h"
#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Dialect/Ernie/IR/Sharding.h"
#include "ernie/Export/MemoryPlan.h"
#include "ernie/Passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/ToolOutputFile.h"

#include <cmath>
#include <map>

namespace mlir::ernie {
#define GEN_PASS_DEF_PLANREPORTPASS
#include "ernie/Passes/Passes.h.inc"
} // namespace mlir::ernie

using namespace mlir;
using namespace mlir::ernie;

namespace {

int64_t bytesOf(Type type) {
  RankedTensorType t = storageType(type);
  if (!t || !t.hasStaticShape())
    return 0;
  return t.getNumElements() * storageBytes(t.getElementType());
}

/// The bytes of argument `i`'s piece that are padding on an average rank:
/// its piece less its share of the global tensor (0 unless a dimension is
/// split unevenly, when partition records `ernie.global_shape`).
double paddingBytes(func::FuncOp fn, unsigned i, MeshOp mesh) {
  auto global = fn.getArgAttrOfType<DenseI64ArrayAttr>(i, kGlobalShapeAttrName);
  auto sharding = fn.getArgAttrOfType<ShardingAttr>(i, kShardOfAttrName);
  if (!global || !sharding || !mesh)
    return 0;
  double share = 1;
  for (auto [d, size] : llvm::enumerate(global.asArrayRef())) {
    int64_t parts = 1;
    for (StringRef axis : sharding.getDimAxes(d))
      parts *= mesh.getAxisSize(axis).value_or(1);
    share *= static_cast<double>(size) / static_cast<double>(parts);
  }
  RankedTensorType t = storageType(fn.getArgumentTypes()[i]);
  return (static_cast<double>(t.getNumElements()) - share) *
         storageBytes(t.getElementType());
}

/// "all_reduce[dp]" -> (count, bytes) over `fn` and everything it calls.
void collectCollectives(ModuleOp module, func::FuncOp fn,
                        std::map<std::string, std::pair<int64_t, int64_t>> &out,
                        llvm::SmallPtrSetImpl<Operation *> &seen) {
  if (!seen.insert(fn).second || fn.isExternal())
    return;
  fn.walk([&](Operation *op) {
    if (auto call = dyn_cast<func::CallOp>(op)) {
      if (auto callee = module.lookupSymbol<func::FuncOp>(call.getCallee()))
        collectCollectives(module, callee, out, seen);
      return;
    }
    if (!isStartedCollective(op) &&
        !isa<AllReduceOp, AllGatherOp, ReduceScatterOp, AllToAllOp>(op))
      return;
    // A bucket is one collective of all its inputs, named as the blocking
    // op it stands for.
    bool bucket = isa<AllReduceStartOp, ReduceScatterStartOp, AllGatherStartOp>(op);
    StringRef name = op->getName().stripDialect();
    std::string key = (bucket ? name.drop_back(strlen("_start")) : name).str() + "[";
    auto axes = op->getAttrOfType<ArrayAttr>("axes");
    for (auto [i, a] : llvm::enumerate(axes))
      key += (i ? "," : "") + cast<StringAttr>(a).getValue().str();
    key += "]";
    auto &entry = out[key];
    entry.first += 1;
    for (Value v : bucket ? op->getOperands() : op->getOperands().take_front())
      entry.second += bytesOf(v.getType());
  });
}

struct PlanReportPass : ernie::impl::PlanReportPassBase<PlanReportPass> {
  using PlanReportPassBase::PlanReportPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    llvm::json::Object functions;
    auto meshes = module.getOps<MeshOp>();
    MeshOp mesh = meshes.empty() ? MeshOp() : *meshes.begin();
    for (auto fn : module.getOps<func::FuncOp>()) {
      if (fn.isExternal())
        continue;
      FailureOr<MemoryPlan> plan = planMemory(fn);
      if (failed(plan))
        return signalPassFailure();
      int64_t params = 0, slots = 0, inputs = 0;
      double padding = 0;
      for (unsigned i = 0; i < fn.getNumArguments(); ++i) {
        padding += paddingBytes(fn, i, mesh);
        int64_t b = bytesOf(fn.getArgumentTypes()[i]);
        if (fn.getArgAttr(i, ErnieDialect::kParamAttrName))
          params += b;
        else if (fn.getArgAttr(i, ErnieDialect::kOptStateAttrName))
          slots += b;
        else
          inputs += b;
      }
      int64_t grads = 0;
      for (unsigned i = 0; i < fn.getNumResults(); ++i)
        if (fn.getResultAttr(i, "ernie.grad_of"))
          grads += bytesOf(fn.getResultTypes()[i]);
      std::map<std::string, std::pair<int64_t, int64_t>> collectives;
      llvm::SmallPtrSet<Operation *, 8> seen;
      collectCollectives(module, fn, collectives, seen);
      llvm::json::Object comm;
      for (auto &[key, value] : collectives)
        comm[key] = llvm::json::Object{{"count", value.first},
                                       {"bytes", value.second}};
      functions[fn.getSymName()] = llvm::json::Object{
          {"parameter_bytes", params},
          {"optimizer_state_bytes", slots},
          {"input_bytes", inputs},
          {"gradient_bytes", grads},
          {"arena_bytes", plan->arenaBytes},
          {"argument_bytes", plan->argumentBytes},
          {"live_peak_bytes", plan->livePeakBytes},
          {"activation_bytes", plan->activationBytes},
          {"padding_bytes", static_cast<int64_t>(std::llround(padding))},
          {"collectives", std::move(comm)}};
    }
    int64_t ranks = 1;
    for (auto mesh : module.getOps<MeshOp>())
      for (int64_t n : mesh.getAxisSizes())
        ranks *= n;
    llvm::json::Value report =
        llvm::json::Object{{"ranks", ranks}, {"functions", std::move(functions)}};
    std::string error;
    std::unique_ptr<llvm::ToolOutputFile> out = openOutputFile(file, &error);
    if (!out) {
      module.emitError() << "cannot write the plan report: " << error;
      return signalPassFailure();
    }
    out->os() << llvm::formatv("{0:2}", report) << "\n";
    out->keep();
    markAllAnalysesPreserved();
  }
};

} // namespace

//===- PlanReport.cpp - per-rank memory and communication as JSON ------------===//

#include "ernie/Export/PlanReport.h"

#include "ernie/Dialect/Ernie/IR/ErnieDialect.h"
#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Dialect/Ernie/IR/Sharding.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/SmallPtrSet.h"

#include <cmath>
#include <map>

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

/// "kind" -> (count, bytes per rank).
using Traffic = std::map<std::string, std::pair<int64_t, int64_t>>;

/// What `op` puts on the wire, under its key: a collective as
/// "kind[axes]" and the bytes of its (first) input; a bucket (a started
/// all-reduce, reduce-scatter or all-gather of several inputs) as the
/// blocking op it stands for and all its inputs, narrow floats it
/// accumulates in f32 at four bytes; with `transfers`, a pipeline transfer
/// as "send" or "stage_all_reduce" (else only collectives count).
void addTraffic(Operation *op, bool transfers, Traffic &out) {
  bool bucket = isa<AllReduceStartOp, ReduceScatterStartOp, AllGatherStartOp>(op);
  bool transfer = isa<SendOp, StageAllReduceOp>(op);
  if (transfer != transfers)
    return;
  if (!bucket && !transfer &&
      !isa<AllReduceOp, AllGatherOp, ReduceScatterOp, AllToAllOp,
           CollectivePermuteStartOp>(op))
    return;
  StringRef name = op->getName().stripDialect();
  std::string key =
      (bucket ? name.drop_back(strlen("_start")) : name).str();
  if (!transfer) {
    key += "[";
    auto axes = op->getAttrOfType<ArrayAttr>("axes");
    for (auto [i, a] : llvm::enumerate(axes))
      key += (i ? ", " : "") + cast<StringAttr>(a).getValue().str();
    key += "]";
  }
  auto accumulate = op->getAttrOfType<TypeAttr>("accumulate");
  bool widened = accumulate && accumulate.getValue().isF32();
  auto &entry = out[key];
  entry.first += 1;
  for (Value v : bucket ? op->getOperands() : op->getOperands().take_front()) {
    int64_t bytes = bytesOf(v.getType());
    Type element = storageType(v.getType()).getElementType();
    if (widened && (element.isBF16() || element.isF16()))
      bytes *= 2;
    entry.second += bytes;
  }
}

/// The collectives (or the pipeline `transfers`) of `fn`'s body and, with
/// `callees`, of everything it calls.
void collectTraffic(ModuleOp module, func::FuncOp fn, bool callees,
                    bool transfers, Traffic &out,
                    llvm::SmallPtrSetImpl<Operation *> &seen) {
  if (!seen.insert(fn).second || fn.isExternal())
    return;
  fn.walk([&](Operation *op) {
    if (auto call = dyn_cast<func::CallOp>(op)) {
      if (callees)
        if (auto callee = module.lookupSymbol<func::FuncOp>(call.getCallee()))
          collectTraffic(module, callee, callees, transfers, out, seen);
      return;
    }
    addTraffic(op, transfers, out);
  });
}

/// The traffic of one call of `fn` (callees included), or of its body.
Traffic trafficOf(ModuleOp module, func::FuncOp fn, bool callees,
                  bool transfers) {
  Traffic out;
  llvm::SmallPtrSet<Operation *, 8> seen;
  collectTraffic(module, fn, callees, transfers, out, seen);
  return out;
}

llvm::json::Object toJSON(const Traffic &traffic) {
  llvm::json::Object out;
  for (auto &[key, value] : traffic)
    out[key] = llvm::json::Object{{"count", value.first},
                                  {"bytes", value.second}};
  return out;
}

/// The plan figures of `fn`: the writer's, or planned on a copy of the
/// module (made once, on the first function the writer did not plan).
FailureOr<PlanFigures>
figuresOf(func::FuncOp fn, const llvm::StringMap<PlanFigures> *planned,
          OwningOpRef<ModuleOp> &copy) {
  if (planned) {
    auto it = planned->find(fn.getSymName());
    if (it != planned->end())
      return it->second;
  }
  if (!copy)
    copy = cast<ModuleOp>(fn->getParentOp()->clone());
  auto same = copy->lookupSymbol<func::FuncOp>(fn.getSymName());
  FailureOr<MemoryPlan> plan = planMemory(same);
  if (failed(plan))
    return failure();
  return PlanFigures{plan->arenaBytes, plan->argumentBytes,
                     plan->livePeakBytes, plan->activationBytes};
}

} // namespace

FailureOr<llvm::json::Value>
mlir::ernie::buildPlanReport(ModuleOp module,
                             const llvm::StringMap<PlanFigures> *planned) {
  llvm::json::Object functions;
  auto meshes = module.getOps<MeshOp>();
  MeshOp mesh = meshes.empty() ? MeshOp() : *meshes.begin();
  OwningOpRef<ModuleOp> copy;
  for (auto fn : module.getOps<func::FuncOp>()) {
    if (fn.isExternal())
      continue;
    FailureOr<PlanFigures> plan = figuresOf(fn, planned, copy);
    if (failed(plan))
      return failure();
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
    // What --ernie-recompute copied: ops of the body (a fused region of
    // copies counts once).
    int64_t recomputed = 0;
    for (Operation &op : fn.getBody().front())
      if (op.getNumResults() && op.hasAttr(ErnieDialect::kRecomputedAttrName))
        ++recomputed;
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
        {"collectives", toJSON(trafficOf(module, fn, true, false))},
        {"collectives_in_body", toJSON(trafficOf(module, fn, false, false))},
        {"transfers_in_body", toJSON(trafficOf(module, fn, false, true))},
        {"recomputed_ops", recomputed}};
  }
  int64_t ranks = 1;
  for (auto mesh : module.getOps<MeshOp>())
    for (int64_t n : mesh.getAxisSizes())
      ranks *= n;
  return llvm::json::Value(
      llvm::json::Object{{"ranks", ranks}, {"functions", std::move(functions)}});
}

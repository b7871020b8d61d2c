//===- Recompute.cpp - activations recomputed in the backward ---------------===//
//
// A recomputation unit is a set of forward ops: a layer (full) or an
// attention core (selective). Of the unit's results the backward reads,
// those that do not leave the unit in the forward are recomputed: the ops
// that make them are copied, in program order, right before their first
// backward reader, and every backward reader reads the copy. What the
// copies read from outside the unit (the layer's input, parameters, q and
// k) stays live, as before; the rest dies in the forward. The memory plan
// sees the shorter lifetimes; nothing else needs to know.
//
//===----------------------------------------------------------------------===//

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SetVector.h"

namespace mlir::ernie {
#define GEN_PASS_DEF_RECOMPUTEPASS
#include "ernie/Passes/Passes.h.inc"
} // namespace mlir::ernie

using namespace mlir;
using namespace mlir::ernie;

namespace {

using Unit = llvm::SetVector<Operation *>; // program order

/// One function's forward/backward split: the forward is what runs up to
/// and including the loss.
class Recomputer {
public:
  Recomputer(func::FuncOp fn, Operation *loss) : body(fn.getBody().front()) {
    int64_t at = 0;
    for (Operation &op : body)
      position[&op] = at++;
    lossAt = position[loss];
  }

  bool inForward(Operation *op) const { return position.lookup(op) <= lossAt; }

  /// A reader the recomputed value replaces: after the loss, not the return
  /// (a value returned as it was computed stays as it was computed).
  bool isBackwardReader(Operation *user) const {
    Operation *top = topOf(user);
    return top && !isa<func::ReturnOp>(top) && position.lookup(top) > lossAt;
  }

  /// Copies what `unit` must recompute before its first backward reader.
  void recompute(const Unit &unit);

private:
  /// The op of the function body that holds `user` (itself, or the region
  /// op it is nested in).
  Operation *topOf(Operation *user) const {
    return body.findAncestorOpInBlock(*user);
  }

  static bool recomputable(Operation *op) {
    return op->getNumRegions() == 0 && isMemoryEffectFree(op) &&
           !isa<SplitPointOp>(op);
  }

  /// Ops that make a large value from small ones without arithmetic: made
  /// again wherever a copy reads them, even outside the unit, rather than
  /// kept alive for the backward (a causal mask broadcast to [b, heads, s,
  /// s] that every layer adds would otherwise live as long as the
  /// backward).
  static bool isExpansion(Operation *op) {
    return isa<BroadcastOp, FullOp, IotaOp>(op);
  }

  /// A value the unit keeps as it is: made outside it (unless an
  /// expansion), by an op that cannot be repeated, or read by the forward
  /// outside the unit (its output).
  bool kept(const Unit &unit, Value v) const {
    Operation *def = v.getDefiningOp();
    if (!def || !recomputable(def))
      return true;
    if (!unit.contains(def))
      return !isExpansion(def);
    return llvm::any_of(v.getUsers(), [&](Operation *user) {
      Operation *top = topOf(user);
      return top && inForward(top) && !unit.contains(top);
    });
  }

  Block &body;
  llvm::DenseMap<Operation *, int64_t> position;
  int64_t lossAt = 0;
};

void Recomputer::recompute(const Unit &unit) {
  // The values to replace and the first op that reads one in the backward.
  llvm::SetVector<Value> replaced;
  Operation *first = nullptr;
  for (Operation *op : unit)
    for (Value r : op->getResults()) {
      if (kept(unit, r))
        continue;
      for (Operation *user : r.getUsers()) {
        if (!isBackwardReader(user))
          continue;
        replaced.insert(r);
        Operation *top = topOf(user);
        if (!first || position[top] < position[first])
          first = top;
      }
    }
  if (replaced.empty())
    return;

  // The ops those values need: the unit's, and expansions they read.
  llvm::DenseSet<Operation *> needed;
  SmallVector<Value> todo(replaced.begin(), replaced.end());
  while (!todo.empty()) {
    Operation *def = todo.pop_back_val().getDefiningOp();
    if (!needed.insert(def).second)
      continue;
    for (Value operand : def->getOperands())
      if (!kept(unit, operand))
        todo.push_back(operand);
  }

  OpBuilder builder(first);
  IRMapping copies;
  UnitAttr mark = builder.getUnitAttr();
  SmallVector<Operation *> inOrder(needed.begin(), needed.end());
  llvm::sort(inOrder, [&](Operation *a, Operation *b) {
    return position[a] < position[b];
  });
  for (Operation *op : inOrder) {
    Operation *copy = builder.clone(*op, copies);
    copy->setAttr(ErnieDialect::kRecomputedAttrName, mark);
    position[copy] = position[first]; // a backward op, for the next units
    // In a pipelined program the copy runs in its stage's backward chunk.
    if (copy->hasAttr(ErnieDialect::kStageAttrName))
      copy->setAttr(ErnieDialect::kBackwardAttrName, mark);
  }
  for (Value v : replaced) {
    Value copy = copies.lookup(v);
    v.replaceUsesWithIf(copy, [&](OpOperand &use) {
      return isBackwardReader(use.getOwner()) &&
             !use.getOwner()->hasAttr(ErnieDialect::kRecomputedAttrName);
    });
  }
}

/// The layers: ops by their `ernie.layer` name, in program order.
llvm::MapVector<StringAttr, Unit> layersOf(func::FuncOp fn,
                                           const Recomputer &split) {
  llvm::MapVector<StringAttr, Unit> layers;
  for (Operation &op : fn.getBody().front())
    if (auto name = op.getAttrOfType<StringAttr>(ErnieDialect::kLayerAttrName))
      if (split.inForward(&op))
        layers[name].insert(&op);
  return layers;
}

/// Selective recomputation's units: around each softmax that a matmul feeds
/// and a matmul reads, the forward ops whose results have the softmax's
/// shape (the scores, their scaling and mask, the probabilities), from the
/// scores' matmul to the matmul that reads the probabilities. Only the
/// latter's result leaves the core: everything of the softmax's shape is
/// recomputed. Within one layer, or anywhere when nothing is marked.
SmallVector<Unit> attentionCores(func::FuncOp fn, const Recomputer &split) {
  SmallVector<Unit> cores;
  fn.walk([&](SoftmaxOp softmax) {
    if (!split.inForward(softmax))
      return;
    Attribute layer = softmax->getAttr(ErnieDialect::kLayerAttrName);
    auto shape = cast<RankedTensorType>(softmax.getType()).getShape();
    auto belongs = [&](Operation *op) {
      if (!op || op->getBlock() != softmax->getBlock() || !split.inForward(op) ||
          op->getAttr(ErnieDialect::kLayerAttrName) != layer ||
          op->getNumResults() != 1)
        return false;
      auto t = dyn_cast<RankedTensorType>(op->getResult(0).getType());
      return t && t.getShape() == shape;
    };
    llvm::DenseSet<Operation *> members{softmax};
    bool fromMatmul = false, toMatmul = false;
    SmallVector<Operation *> todo{softmax};
    while (!todo.empty()) { // up to the scores' matmul
      Operation *op = todo.pop_back_val();
      if (isa<MatmulOp, ScaledMatmulOp>(op)) {
        fromMatmul = true;
        continue;
      }
      for (Value operand : op->getOperands())
        if (Operation *def = operand.getDefiningOp();
            belongs(def) && members.insert(def).second)
          todo.push_back(def);
    }
    todo.push_back(softmax);
    while (!todo.empty()) { // down to the matmul that reads the probabilities
      Operation *op = todo.pop_back_val();
      for (Operation *user : op->getUsers()) {
        if (isa<MatmulOp, ScaledMatmulOp>(user) && split.inForward(user)) {
          toMatmul = true; // in the core, so the probabilities do not leave it
          members.insert(user);
        } else if (belongs(user) && members.insert(user).second)
          todo.push_back(user);
      }
    }
    if (!fromMatmul || !toMatmul)
      return; // a softmax that is not attention's (a router's, say)
    Unit core;
    for (Operation &op : *softmax->getBlock())
      if (members.contains(&op))
        core.insert(&op);
    cores.push_back(std::move(core));
  });
  return cores;
}

struct RecomputePass : ernie::impl::RecomputePassBase<RecomputePass> {
  using RecomputePassBase::RecomputePassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (mode != "none" && mode != "selective" && mode != "full") {
      module.emitError() << "unknown recompute mode '" << mode
                         << "' (expected none, selective or full)";
      return signalPassFailure();
    }
    for (auto fn : module.getOps<func::FuncOp>()) {
      if (fn.isExternal() || mode == "none")
        continue;
      Operation *loss = getLocalLossOp(fn);
      if (!loss || loss->getNextNode() == fn.getBody().front().getTerminator())
        continue; // no loss, or nothing after it: no backward to serve
      Recomputer split(fn, loss);
      if (mode == "full") {
        auto layers = layersOf(fn, split);
        if (layers.empty()) {
          fn.emitError() << "full recomputation recomputes layers, and no "
                            "forward op carries a layer name ("
                         << ErnieDialect::kLayerAttrName << ")";
          return signalPassFailure();
        }
        for (auto &[name, unit] : layers)
          split.recompute(unit);
      } else {
        for (const Unit &core : attentionCores(fn, split))
          split.recompute(core);
      }
    }
    module.walk([](Operation *op) {
      op->removeAttr(ErnieDialect::kLayerAttrName);
    });
  }
};

} // namespace

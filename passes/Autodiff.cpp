//===- Autodiff.cpp - reverse-mode AD of a loss function --------------------===//
//
// Clones the loss function, walks it backwards from the loss, and asks each
// op on the way for its vector-Jacobian product. Only "active" ops are
// differentiated: those fed by a parameter (forward closure) that also feed
// the loss (backward closure).
//
//===----------------------------------------------------------------------===//

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Dialect/Ernie/IR/Sharding.h"
#include "ernie/Passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/ADT/DenseSet.h"

#include <cmath>
#include <map>
#include <set>

#define DEBUG_TYPE "ernie-autodiff"

namespace mlir::ernie {
#define GEN_PASS_DEF_AUTODIFFPASS
#include "ernie/Passes/Passes.h.inc"
} // namespace mlir::ernie

using namespace mlir;
using namespace mlir::ernie;

namespace {

constexpr StringLiteral kGradOfAttrName = "ernie.grad_of";

bool isFloatTensor(Type type) {
  auto t = dyn_cast<RankedTensorType>(type);
  return t && isa<FloatType>(t.getElementType());
}

/// How many of the forward's results are metrics (`ernie.metric`, last).
unsigned countMetrics(func::FuncOp forward) {
  unsigned n = 0;
  for (unsigned r = 1; r < forward.getNumResults(); ++r)
    n += bool(forward.getResultAttr(r, ErnieDialect::kMetricAttrName));
  return n;
}

/// The forward's results after the loss: each the new value of a state
/// argument (`ernie.opt_state` = name) it names by `ernie.updates`, of that
/// argument's type — a rule, not a gradient, updates it (MoE's aux-free
/// balancing bias) — then the metrics it reports (`ernie.metric`, float
/// scalars: an auxiliary loss apart from the loss). Not differentiated; the
/// step carries them.
LogicalResult checkStateUpdates(func::FuncOp forward) {
  unsigned firstMetric = forward.getNumResults() - countMetrics(forward);
  for (unsigned r = 1; r < forward.getNumResults(); ++r) {
    if (auto metric = forward.getResultAttrOfType<StringAttr>(
            r, ErnieDialect::kMetricAttrName)) {
      auto type = dyn_cast<RankedTensorType>(forward.getResultTypes()[r]);
      if (r < firstMetric || !type || type.getRank() != 0 ||
          !isa<FloatType>(type.getElementType()))
        return forward.emitError("result #")
               << r << " (metric '" << metric.getValue()
               << "') must be a float scalar after the state updates";
      continue;
    }
    auto name = forward.getResultAttrOfType<StringAttr>(
        r, ErnieDialect::kUpdatesAttrName);
    if (!name)
      return forward.emitError("result #")
             << r << " of the loss function is not the loss: extra results "
             << "must update a state argument (ernie.updates) or be a "
             << "metric (ernie.metric)";
    bool found = false;
    for (unsigned i = 0; i < forward.getNumArguments() && !found; ++i)
      if (auto arg = forward.getArgAttrOfType<StringAttr>(
              i, ErnieDialect::kOptStateAttrName);
          arg && arg == name) {
        if (forward.getArgumentTypes()[i] != forward.getResultTypes()[r])
          return forward.emitError("result #")
                 << r << " updates '" << name.getValue() << "' of type "
                 << forward.getArgumentTypes()[i] << " with "
                 << forward.getResultTypes()[r];
        found = true;
      }
    if (!found)
      return forward.emitError("result #")
             << r << " updates '" << name.getValue()
             << "', which no argument holds (ernie.opt_state)";
  }
  return success();
}

/// Builds `@<name>_grad` next to `forward`.
FailureOr<func::FuncOp> buildGradientFunction(func::FuncOp forward,
                                               double lossScale) {
  if (forward.isDeclaration())
    return forward.emitError("cannot differentiate a declaration");
  if (!forward.getBody().hasOneBlock())
    return forward.emitError("autodiff handles single-block functions");
  if (forward.getNumResults() < 1 ||
      !isFloatTensor(forward.getResultTypes()[0]) ||
      cast<RankedTensorType>(forward.getResultTypes()[0]).getRank() != 0)
    return forward.emitError("the loss function must return one scalar "
                             "float tensor (tensor<f32>), got ")
           << forward.getFunctionType();
  if (failed(checkStateUpdates(forward)))
    return failure();

  std::string gradName = (forward.getSymName() + "_grad").str();
  if (SymbolTable::lookupNearestSymbolFrom(forward, StringAttr::get(
                                                         forward.getContext(),
                                                         gradName)))
    return forward.emitError("the module already has a @") << gradName;

  // The gradient function starts as a clone of the forward.
  OpBuilder builder(forward);
  builder.setInsertionPointAfter(forward);
  auto gradFn = cast<func::FuncOp>(builder.clone(*forward));
  gradFn.setSymName(gradName);
  Block &body = gradFn.getBody().front();
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  Value loss = ret.getOperand(0);

  // Parameters, in argument order.
  SmallVector<BlockArgument> params;
  SmallVector<StringAttr> names;
  for (BlockArgument arg : body.getArguments()) {
    auto name = gradFn.getArgAttrOfType<StringAttr>(
        arg.getArgNumber(), ErnieDialect::kParamAttrName);
    if (!name)
      continue;
    if (!isFloatTensor(arg.getType())) {
      Type type = arg.getType();
      gradFn.erase();
      return forward.emitError("parameter '")
             << name.getValue() << "' is not a floating-point tensor: "
             << type;
    }
    params.push_back(arg);
    names.push_back(name);
  }

  // Active values: fed by a parameter and (below) feeding the loss.
  llvm::DenseSet<Value> varied(params.begin(), params.end());
  for (Operation &op : body.without_terminator()) {
    if (isa<StopGradientOp>(op))
      continue;
    if (llvm::any_of(op.getOperands(),
                     [&](Value v) { return varied.contains(v); }))
      for (Value r : op.getResults())
        if (isFloatTensor(r.getType()))
          varied.insert(r);
  }
  llvm::DenseSet<Value> useful{loss};
  for (Operation &op : llvm::reverse(body.without_terminator()))
    if (llvm::any_of(op.getResults(),
                     [&](Value v) { return useful.contains(v); }))
      for (Value v : op.getOperands())
        useful.insert(v);

  // The reverse sweep, emitted before the return.
  builder.setInsertionPoint(ret);
  llvm::DenseMap<Value, Value> grads;
  grads[loss] = FullOp::create(builder, ret.getLoc(),
                               cast<RankedTensorType>(loss.getType()),
                               lossScale);
  auto accumulate = [&](Value v, Value g) {
    if (!g || !varied.contains(v))
      return;
    auto [it, inserted] = grads.try_emplace(v, g);
    if (!inserted)
      it->second = AddOp::create(builder, g.getLoc(), it->second, g);
  };
  SmallVector<Operation *> forwardOps;
  for (Operation &op : body.without_terminator())
    forwardOps.push_back(&op);
  // In a pipelined program (--ernie-pipeline-split ran) every op the
  // backward of a forward op builds runs on that op's stage.
  auto placeBackward = [&](Operation *after, Attribute stage) {
    if (!stage)
      return;
    for (Operation *op = after ? after->getNextNode() : &body.front();
         op != ret.getOperation(); op = op->getNextNode()) {
      op->setAttr(ErnieDialect::kStageAttrName, stage);
      op->setAttr(ErnieDialect::kBackwardAttrName,
                  UnitAttr::get(op->getContext()));
    }
  };
  if (Operation *lossOp = loss.getDefiningOp())
    placeBackward(grads[loss].getDefiningOp()->getPrevNode(),
                  lossOp->getAttr(ErnieDialect::kStageAttrName));
  for (Operation *op : llvm::reverse(forwardOps)) {
    bool active =
        llvm::any_of(op->getResults(),
                     [&](Value v) {
                       return varied.contains(v) && useful.contains(v) &&
                              grads.count(v);
                     });
    if (!active)
      continue;
    auto rule = dyn_cast<GradientOpInterface>(op);
    if (!rule) {
      op->emitError() << "'" << op->getName()
                      << "' has no gradient rule, but lies between a "
                         "parameter and the loss";
      gradFn.erase();
      return failure();
    }
    SmallVector<Value> resultGrads;
    for (Value r : op->getResults())
      resultGrads.push_back(grads.lookup(r));
    SmallVector<Value> operandGrads;
    Operation *lastBefore = ret->getPrevNode();
    if (failed(rule.buildGradient(builder, resultGrads, operandGrads))) {
      gradFn.erase();
      return failure();
    }
    if (operandGrads.size() != op->getNumOperands()) {
      op->emitError("gradient rule returned ")
          << operandGrads.size() << " gradients for " << op->getNumOperands()
          << " operands";
      gradFn.erase();
      return failure();
    }
    for (auto [operand, g] : llvm::zip(op->getOperands(), operandGrads))
      accumulate(operand, g);
    placeBackward(lastBefore, op->getAttr(ErnieDialect::kStageAttrName));
  }

  // Loss, then one gradient per parameter (zeros where the loss is blind).
  SmallVector<Value> results{loss};
  for (BlockArgument p : params) {
    Value g = grads.lookup(p);
    // A gradient is laid out like its parameter. Without this, results are
    // unconstrained and come out replicated: every column-parallel weight's
    // gradient would be all-gathered here and sliced again by the update.
    // The constraint is weaker (priority 1) than the plan's own
    // placements, so a gradient still pending a sum over dp is all-reduced
    // into this layout rather than forcing the activations to be gathered.
    auto constrain = [&](Value v) -> Value {
      auto layout = gradFn.getArgAttrOfType<ShardingAttr>(p.getArgNumber(),
                                                          kShardingAttrName);
      if (!layout)
        return v;
      return ShardingConstraintOp::create(builder, ret.getLoc(), v, layout,
                                          uint64_t(1));
    };
    if (!g) {
      g = FullOp::create(builder, ret.getLoc(),
                         cast<RankedTensorType>(p.getType()), 0.0);
    } else if (lossScale != 1.0) {
      auto type = cast<RankedTensorType>(p.getType());
      g = DivOp::create(builder, ret.getLoc(), g,
                        FullOp::create(builder, ret.getLoc(), type,
                                       lossScale));
    }
    results.push_back(constrain(g));
  }
  // State updates follow the gradients.
  llvm::append_range(results, ret.getOperands().drop_front());
  func::ReturnOp::create(builder, ret.getLoc(), results);
  ret.erase();
  SmallVector<Type> resultTypes;
  for (Value v : results)
    resultTypes.push_back(v.getType());
  gradFn.setType(FunctionType::get(gradFn.getContext(),
                                   body.getArgumentTypes(), resultTypes));
  gradFn.removeResAttrsAttr(); // The forward's result attributes do not apply.
  {
    FunctionAttrEditor attrs(gradFn, FunctionAttrEditor::Results);
    attrs.set(0, ErnieDialect::kLossAttrName, UnitAttr::get(gradFn.getContext()));
    for (auto [i, name] : llvm::enumerate(names))
      attrs.set(i + 1, kGradOfAttrName, name);
  }
  return gradFn;
}

struct StepOptions {
  std::string optimizer;
  double momentum, weightDecay, beta1, beta2, epsilon, clipNorm;
  bool multiPrecision, gradNorm;
};


/// Where a pipelined step's ops run: each parameter's own ops on its
/// replica's pipeline rank. Empty (no ranks) when the step is not pipelined.
struct UpdatePlacement {
  SmallVector<int64_t> rankOf;   // per parameter, -1 if not pipelined
  SmallVector<bool> countsInNorm; // false for all but one replica of each
  Block *block = nullptr;

  bool pipelined() const {
    return llvm::any_of(rankOf, [](int64_t r) { return r >= 0; });
  }
  /// Places the ops appended to the block after `mark` on `rank`.
  void place(Operation *mark, int64_t rank) const {
    if (rank < 0)
      return;
    auto stage = IntegerAttr::get(IntegerType::get(block->getParentOp()->getContext(), 64), rank);
    for (Operation *op = mark ? mark->getNextNode() : &block->front(); op;
         op = op->getNextNode())
      op->setAttr(ErnieDialect::kStageAttrName, stage);
  }
  Operation *mark() const { return block->empty() ? nullptr : &block->back(); }
};

/// The gradients' global L2 norm (f32). In a pipeline each rank sums its
/// own gradients' squares (a shared parameter's once) and the partial sums
/// are added in rank order on the last rank that has any; `rank` is where
/// the norm is (-1: not pipelined).
Value globalNorm(OpBuilder &b, Location loc, ArrayRef<Value> grads,
                 const UpdatePlacement &where, int64_t &rank) {
  auto scalar = RankedTensorType::get({}, b.getF32Type());
  std::map<int64_t, Value> partials; // by pipeline rank (-1: not pipelined)
  for (auto [k, g] : llvm::enumerate(grads)) {
    if (!where.countsInNorm[k])
      continue;
    int64_t at = where.rankOf[k];
    Operation *mark = where.mark();
    Value &total = partials[at];
    if (!total)
      total = FullOp::create(b, loc, scalar, 0.0);
    auto t = cast<RankedTensorType>(g.getType());
    Value g32 = g;
    if (!t.getElementType().isF32())
      g32 = CastOp::create(
          b, loc, RankedTensorType::get(t.getShape(), b.getF32Type()), g);
    Value sq = MulOp::create(b, loc, g32, g32);
    auto all = llvm::to_vector(llvm::seq<int64_t>(0, t.getRank()));
    Value s = all.empty() ? sq
                          : ReduceSumOp::create(b, loc, sq,
                                                b.getDenseI64ArrayAttr(all),
                                                /*keepdim=*/false)
                                .getResult();
    total = AddOp::create(b, loc, total, s);
    where.place(mark, at);
  }
  Operation *mark = where.mark();
  Value total;
  for (auto &[at, partial] : partials)
    total = total ? AddOp::create(b, loc, total, partial).getResult() : partial;
  if (!total)
    total = FullOp::create(b, loc, scalar, 0.0);
  Value norm = SqrtOp::create(b, loc, total);
  rank = partials.empty() ? -1 : partials.rbegin()->first;
  where.place(mark, rank);
  return norm;
}

/// Scales every gradient by min(1, clip / (norm + 1e-6)), the scale
/// computed on `normRank` (where the norm is).
void clipToNorm(OpBuilder &b, Location loc, MutableArrayRef<Value> grads,
                Value norm, int64_t normRank, double clip,
                const UpdatePlacement &where) {
  auto scalar = RankedTensorType::get({}, b.getF32Type());
  Operation *mark = where.mark();
  Value denom = AddOp::create(b, loc, norm, FullOp::create(b, loc, scalar, 1e-6));
  Value ratio = DivOp::create(b, loc, FullOp::create(b, loc, scalar, clip), denom);
  Value scale = MinimumOp::create(b, loc, ratio, FullOp::create(b, loc, scalar, 1.0));
  where.place(mark, normRank);
  for (auto [k, g] : llvm::enumerate(grads)) {
    mark = where.mark();
    auto t = cast<RankedTensorType>(g.getType());
    Value s = scale;
    if (!t.getElementType().isF32())
      s = CastOp::create(b, loc, RankedTensorType::get({}, t.getElementType()),
                         scale);
    Value wide = BroadcastOp::create(b, loc, t, s, b.getDenseI64ArrayAttr({}));
    g = MulOp::create(b, loc, g, wide);
    where.place(mark, where.rankOf[k]);
  }
}

/// Adds @train_step and @eval_step around `forward` and its gradient.
LogicalResult buildSteps(func::FuncOp forward, func::FuncOp gradFn,
                         const StepOptions &opts) {
  MLIRContext *ctx = forward.getContext();
  Location loc = forward.getLoc();
  OpBuilder b(ctx);
  bool sgd = opts.optimizer == "sgd";
  SmallVector<unsigned> paramIdx, stateIdx, batchIdx;
  for (unsigned i = 0; i < forward.getNumArguments(); ++i)
    (forward.getArgAttr(i, ErnieDialect::kParamAttrName)     ? paramIdx
     : forward.getArgAttr(i, ErnieDialect::kOptStateAttrName) ? stateIdx
                                                              : batchIdx)
        .push_back(i);
  unsigned nMetrics = countMetrics(forward);
  unsigned nUpdates = forward.getNumResults() - 1 - nMetrics;
  // Parameters are float tensors (checked); batch arguments may be anything.
  auto argType = [&](unsigned i) {
    return cast<RankedTensorType>(forward.getArgumentTypes()[i]);
  };
  auto anyType = [&](unsigned i) { return forward.getArgumentTypes()[i]; };
  auto paramName = [&](unsigned i) {
    return forward.getArgAttrOfType<StringAttr>(i, ErnieDialect::kParamAttrName)
        .getValue();
  };
  auto f32Like = [&](RankedTensorType t) {
    return RankedTensorType::get(t.getShape(), b.getF32Type());
  };
  // Only types narrower than f32 get a master copy (f64 is kept as is).
  auto hasMaster = [&](unsigned i) {
    return opts.multiPrecision &&
           argType(i).getElementType().getIntOrFloatBitWidth() < 32;
  };

  // Signature: params, optimizer state, batch, lr, step.
  SmallVector<Type> inputs;
  SmallVector<DictionaryAttr> inputAttrs;
  auto attrsOf = [&](unsigned i) { return forward.getArgAttrDict(i); };
  for (unsigned i : paramIdx) {
    inputs.push_back(argType(i));
    inputAttrs.push_back(attrsOf(i));
  }
  struct Slot {
    unsigned param;
    std::string name;
    RankedTensorType type;
  };
  SmallVector<Slot> slots;
  for (unsigned i : paramIdx) {
    RankedTensorType stateType = hasMaster(i) ? f32Like(argType(i)) : argType(i);
    if (hasMaster(i))
      slots.push_back({i, "master", stateType});
    if (sgd) {
      slots.push_back({i, "momentum", stateType});
    } else {
      slots.push_back({i, "moment1", stateType});
      slots.push_back({i, "moment2", stateType});
    }
  }
  // State is laid out like its parameter, in and out of the step: an
  // unannotated argument or result of a public function is replicated, so
  // without this every mp-split parameter would be all-gathered after its
  // update and its slots kept whole on every rank.
  auto layoutOf = [&](unsigned i) {
    return forward.getArgAttrOfType<ShardingAttr>(i, kShardingAttrName);
  };
  for (const Slot &slot : slots) {
    inputs.push_back(slot.type);
    SmallVector<NamedAttribute> attrs{b.getNamedAttr(
        ErnieDialect::kOptStateAttrName,
        b.getStringAttr(paramName(slot.param) + ":" + slot.name))};
    if (ShardingAttr layout = layoutOf(slot.param))
      attrs.push_back(b.getNamedAttr(kShardingAttrName, layout));
    if (Attribute rank = forward.getArgAttr(
            slot.param, ErnieDialect::kPipelineRankAttrName))
      attrs.push_back(b.getNamedAttr(ErnieDialect::kPipelineRankAttrName, rank));
    inputAttrs.push_back(b.getDictionaryAttr(attrs));
  }
  // The forward's own state (updated by its rules, not by the optimizer)
  // after the optimizer's.
  for (unsigned i : stateIdx) {
    inputs.push_back(anyType(i));
    inputAttrs.push_back(attrsOf(i));
  }
  for (unsigned i : batchIdx) {
    inputs.push_back(anyType(i));
    inputAttrs.push_back(attrsOf(i));
  }
  auto scalarF32 = RankedTensorType::get({}, b.getF32Type());
  auto scalarI64 = RankedTensorType::get({}, b.getI64Type());
  // The runtime feeds these two itself: say which they are.
  inputs.push_back(scalarF32);
  inputAttrs.push_back(b.getDictionaryAttr(
      b.getNamedAttr(ErnieDialect::kLearningRateAttrName, b.getUnitAttr())));
  inputs.push_back(scalarI64);
  inputAttrs.push_back(
      b.getDictionaryAttr(b.getNamedAttr(ErnieDialect::kStepAttrName, b.getUnitAttr())));

  b.setInsertionPointAfter(gradFn);
  auto train = func::FuncOp::create(b, loc, "train_step",
                                    b.getFunctionType(inputs, {}));
  train.setAllArgAttrs(inputAttrs);
  Block *entry = train.addEntryBlock();
  b.setInsertionPointToEnd(entry);
  unsigned nParams = paramIdx.size(), nSlots = slots.size(),
           nStates = stateIdx.size();
  auto paramArg = [&](unsigned k) { return entry->getArgument(k); };
  auto slotArg = [&](unsigned s) { return entry->getArgument(nParams + s); };
  unsigned firstBatch = nParams + nSlots + nStates;
  Value lr = entry->getArgument(firstBatch + batchIdx.size());
  Value step = entry->getArgument(firstBatch + batchIdx.size() + 1);

  // The gradient, called with the forward's argument order.
  SmallVector<Value> callArgs(forward.getNumArguments());
  for (auto [k, i] : llvm::enumerate(paramIdx))
    callArgs[i] = paramArg(k);
  for (auto [k, i] : llvm::enumerate(stateIdx))
    callArgs[i] = entry->getArgument(nParams + nSlots + k);
  for (auto [k, i] : llvm::enumerate(batchIdx))
    callArgs[i] = entry->getArgument(firstBatch + k);
  auto call = func::CallOp::create(b, loc, gradFn, callArgs);
  Value loss = call.getResult(0);
  SmallVector<Value> grads(call.getResults().slice(1, nParams));
  SmallVector<Value> stateUpdates(call.getResults().slice(1 + nParams, nUpdates));
  SmallVector<Value> metrics(call.getResults().take_back(nMetrics));

  UpdatePlacement where;
  where.block = entry;
  for (unsigned i : paramIdx) {
    auto rank = forward.getArgAttrOfType<IntegerAttr>(
        i, ErnieDialect::kPipelineRankAttrName);
    auto group = forward.getArgAttrOfType<DenseI64ArrayAttr>(
        i, ErnieDialect::kSharedStagesAttrName);
    where.rankOf.push_back(rank ? rank.getInt() : -1);
    where.countsInNorm.push_back(!group || !rank ||
                                 group.asArrayRef().front() == rank.getInt());
  }
  // A shared parameter's channel: its rank among the shared names, the same
  // on every replica.
  std::set<StringRef> sharedNames;
  for (unsigned i : paramIdx)
    if (forward.getArgAttr(i, ErnieDialect::kSharedStagesAttrName))
      sharedNames.insert(paramName(i));
  for (auto [k, i] : llvm::enumerate(paramIdx)) {
    Operation *mark = where.mark();
    // A shared parameter's replicas take one step: their gradients summed.
    if (auto group = forward.getArgAttrOfType<DenseI64ArrayAttr>(
            i, ErnieDialect::kSharedStagesAttrName))
      grads[k] = StageAllReduceOp::create(
          b, loc, grads[k], group.asArrayRef(),
          int64_t(std::distance(sharedNames.begin(),
                                sharedNames.find(paramName(i)))));
    // Master-weight updates work in f32 from here on, clipping included.
    if (hasMaster(i))
      grads[k] = CastOp::create(b, loc, f32Like(argType(i)), grads[k]);
    where.place(mark, where.rankOf[k]);
  }
  Value norm;
  if (opts.clipNorm > 0 || opts.gradNorm) {
    int64_t normRank;
    norm = globalNorm(b, loc, grads, where, normRank);
    if (opts.clipNorm > 0)
      clipToNorm(b, loc, grads, norm, normRank, opts.clipNorm, where);
  }

  SmallVector<Value> newParams, newSlots;
  SmallVector<std::string> newSlotNames;
  unsigned s = 0;
  for (auto [k, i] : llvm::enumerate(paramIdx)) {
    Operation *mark = where.mark();
    Value p = paramArg(k), g = grads[k];
    bool master = hasMaster(i);
    Value target = p;
    if (master)
      target = slotArg(s++);
    Value updated;
    if (sgd) {
      Value buf = slotArg(s++);
      auto op = SgdUpdateOp::create(
          b, loc, target, g, buf, lr, b.getF64FloatAttr(opts.momentum),
          b.getF64FloatAttr(opts.weightDecay), UnitAttr());
      updated = op.getNewParam();
      if (master)
        newSlots.push_back(updated);
      newSlots.push_back(op.getNewMomentumBuffer());
    } else {
      Value m = slotArg(s++), v = slotArg(s++);
      auto op = AdamWUpdateOp::create(
          b, loc, target, g, m, v, lr, step, b.getF64FloatAttr(opts.beta1),
          b.getF64FloatAttr(opts.beta2), b.getF64FloatAttr(opts.epsilon),
          b.getF64FloatAttr(opts.weightDecay));
      updated = op.getNewParam();
      if (master)
        newSlots.push_back(updated);
      newSlots.push_back(op.getNewMoment1());
      newSlots.push_back(op.getNewMoment2());
    }
    newParams.push_back(master ? CastOp::create(b, loc, argType(i), updated)
                                     .getResult()
                               : updated);
    where.place(mark, where.rankOf[k]);
  }
  SmallVector<Value> results{loss};
  llvm::append_range(results, newParams);
  llvm::append_range(results, newSlots);
  llvm::append_range(results, stateUpdates);
  llvm::append_range(results, metrics);
  if (opts.gradNorm)
    results.push_back(norm);
  func::ReturnOp::create(b, loc, results);
  SmallVector<Type> resultTypes;
  for (Value v : results)
    resultTypes.push_back(v.getType());
  train.setType(b.getFunctionType(inputs, resultTypes));
  {
    FunctionAttrEditor attrs(train, FunctionAttrEditor::Results);
    FunctionAttrEditor forwardAttrs(forward, FunctionAttrEditor::Results);
    attrs.set(0, ErnieDialect::kLossAttrName, b.getUnitAttr());
    for (auto [k, i] : llvm::enumerate(paramIdx)) {
      attrs.set(1 + k, ErnieDialect::kUpdatesAttrName,
                b.getStringAttr(paramName(i)));
      if (ShardingAttr layout = layoutOf(i))
        attrs.set(1 + k, kShardingAttrName, layout);
    }
    for (auto [k, slot] : llvm::enumerate(slots)) {
      attrs.set(1 + nParams + k, ErnieDialect::kUpdatesAttrName,
                b.getStringAttr(paramName(slot.param) + ":" + slot.name));
      if (ShardingAttr layout = layoutOf(slot.param))
        attrs.set(1 + nParams + k, kShardingAttrName, layout);
    }
    for (unsigned r = 0; r < nUpdates; ++r) {
      attrs.set(1 + nParams + nSlots + r, ErnieDialect::kUpdatesAttrName,
                forwardAttrs.get(1 + r, ErnieDialect::kUpdatesAttrName));
      // Only the step updates state: called alone, the forward computes
      // the new values and leaves the state as it is.
      forwardAttrs.remove(1 + r, ErnieDialect::kUpdatesAttrName);
    }
    unsigned firstMetric = 1 + nParams + nSlots + nUpdates;
    for (unsigned m = 0; m < nMetrics; ++m)
      attrs.set(firstMetric + m, ErnieDialect::kMetricAttrName,
                forwardAttrs.get(1 + nUpdates + m, ErnieDialect::kMetricAttrName));
    if (opts.gradNorm)
      attrs.set(results.size() - 1, ErnieDialect::kMetricAttrName,
                b.getStringAttr("grad_norm"));
  }

  // Evaluation: the forward alone.
  SmallVector<Type> evalInputs;
  SmallVector<DictionaryAttr> evalAttrs;
  for (unsigned i : paramIdx) {
    evalInputs.push_back(argType(i));
    evalAttrs.push_back(attrsOf(i));
  }
  for (unsigned i : llvm::concat<unsigned>(stateIdx, batchIdx)) {
    evalInputs.push_back(anyType(i));
    evalAttrs.push_back(attrsOf(i));
  }
  b.setInsertionPointAfter(train);
  // The loss alone: evaluating updates no state.
  auto eval = func::FuncOp::create(
      b, loc, "eval_step",
      b.getFunctionType(evalInputs, {}));
  eval.setAllArgAttrs(evalAttrs);
  Block *evalEntry = eval.addEntryBlock();
  b.setInsertionPointToEnd(evalEntry);
  SmallVector<Value> evalArgs(forward.getNumArguments());
  for (auto [k, i] : llvm::enumerate(paramIdx))
    evalArgs[i] = evalEntry->getArgument(k);
  for (auto [k, i] : llvm::enumerate(llvm::concat<unsigned>(stateIdx, batchIdx)))
    evalArgs[i] = evalEntry->getArgument(nParams + k);
  auto evalCall = func::CallOp::create(b, loc, forward, evalArgs);
  // The loss and the metrics.
  SmallVector<Value> evalResults{evalCall.getResult(0)};
  llvm::append_range(evalResults, evalCall.getResults().take_back(nMetrics));
  func::ReturnOp::create(b, loc, evalResults);
  eval.setType(b.getFunctionType(evalInputs, ValueRange(evalResults).getTypes()));
  eval.setResultAttr(0, ErnieDialect::kLossAttrName, b.getUnitAttr());
  for (unsigned m = 0; m < nMetrics; ++m)
    eval.setResultAttr(1 + m, ErnieDialect::kMetricAttrName,
                       forward.getResultAttr(1 + nUpdates + m,
                                             ErnieDialect::kMetricAttrName));
  return success();
}

struct AutodiffPass : ernie::impl::AutodiffPassBase<AutodiffPass> {
  using AutodiffPassBase::AutodiffPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto forward = module.lookupSymbol<func::FuncOp>(function);
    if (!forward) {
      module.emitError() << "no function @" << function
                         << " to differentiate";
      return signalPassFailure();
    }
    // The inliner drops private functions nobody calls: keep the loss
    // function alive through it, whatever its visibility.
    SymbolTable::Visibility visibility = forward.getVisibility();
    forward.setVisibility(SymbolTable::Visibility::Public);
    // AD sees the whole computation: inline every call first. Mean losses
    // become sum / count first too, so that their gradients (like the loss
    // itself) shard over the batch instead of needing the whole of it.
    OpPassManager prepare(ModuleOp::getOperationName());
    prepare.addPass(createInlinerPass());
    prepare.addPass(createExpandMeanLossPass());
    if (failed(runPipeline(prepare, module)))
      return signalPassFailure();
    forward.setVisibility(visibility);
    if (optimizer != "none" && optimizer != "sgd" && optimizer != "adamw") {
      module.emitError() << "unknown optimizer '" << optimizer
                         << "' (expected none, sgd or adamw)";
      return signalPassFailure();
    }
    if (!(lossScale > 0) || !std::isfinite(lossScale)) {
      module.emitError() << "loss-scale must be positive, got " << lossScale;
      return signalPassFailure();
    }
    // Hyper-parameters the update ops would reject later, or compute NaN
    // from: named by their option here. clip-norm 0 means no clipping.
    struct Range {
      StringRef option;
      double value;
      bool below1; // [0, 1) rather than [0, inf)
    };
    for (Range r : {Range{"momentum", momentum, true},
                    Range{"weight-decay", weightDecay, false},
                    Range{"beta1", beta1, true}, Range{"beta2", beta2, true},
                    Range{"epsilon", epsilon, false},
                    Range{"clip-norm", clipNorm, false}})
      if (!(r.value >= 0) || !std::isfinite(r.value) ||
          (r.below1 && r.value >= 1)) {
        module.emitError() << r.option << " must be "
                           << (r.below1 ? "in [0, 1)" : "finite and >= 0")
                           << ", got " << r.value;
        return signalPassFailure();
      }
    FailureOr<func::FuncOp> gradFn = buildGradientFunction(forward, lossScale);
    if (failed(gradFn))
      return signalPassFailure();
    if (optimizer == "none") {
      if (gradNorm) {
        module.emitError("grad-norm is a training step's result: it needs "
                         "optimizer=sgd or adamw");
        return signalPassFailure();
      }
      return;
    }
    for (StringRef taken : {"train_step", "eval_step"})
      if (module.lookupSymbol(taken)) {
        module.emitError() << "the module already has a @" << taken;
        return signalPassFailure();
      }
    StepOptions opts{optimizer, momentum, weightDecay,    beta1,   beta2,
                     epsilon,   clipNorm, multiPrecision, gradNorm};
    if (failed(buildSteps(forward, *gradFn, opts)))
      return signalPassFailure();
  }
};

} // namespace

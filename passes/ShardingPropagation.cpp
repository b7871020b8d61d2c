//===- ShardingPropagation.cpp - shardings for every value ------------------===//
//
// Seeds user placements, spreads them through op rules and call edges in
// priority order to a fixed point, replicates what is left, then writes the
// result into the IR with explicit reshards where a use needs another
// sharding than its value has.
//
//===----------------------------------------------------------------------===//

#include "ernie/Cost/CostModel.h"
#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Dialect/Ernie/IR/Sharding.h"
#include "ernie/Passes/Passes.h"
#include "ernie/Sharding/FactorPropagation.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/StringSet.h"

#include <deque>
#include <optional>

#define DEBUG_TYPE "ernie-sharding-propagation"

namespace mlir::ernie {
#define GEN_PASS_DEF_SHARDINGPROPAGATIONPASS
#include "ernie/Passes/Passes.h.inc"
} // namespace mlir::ernie

using namespace mlir;
using namespace mlir::ernie;

namespace {

RankedTensorType tensorType(Value v) {
  return dyn_cast<RankedTensorType>(v.getType());
}

/// `s` without its pending reductions (null stays null).
ShardingAttr dropPartial(ShardingAttr s) {
  return s ? s.withoutPartials() : s;
}

/// An op's operand and result shardings (null: unknown) and types.
struct OpState {
  SmallVector<ShardingAttr> operands, results;
  SmallVector<RankedTensorType> operandTypes, resultTypes;
};

OpState stateOf(Operation *op, function_ref<ShardingAttr(Value)> shardingOf) {
  OpState state;
  for (Value v : op->getOperands()) {
    state.operands.push_back(shardingOf(v));
    state.operandTypes.push_back(tensorType(v));
  }
  for (Value v : op->getResults()) {
    state.results.push_back(shardingOf(v));
    state.resultTypes.push_back(tensorType(v));
  }
  return state;
}

/// What an op needs of each operand and what it produces; where it cannot
/// produce what its users were promised, a reshard follows it.
struct OpPlan {
  SmallVector<ShardingAttr> operands;
  SmallVector<ShardingAttr> produced;
};

class Propagator {
public:
  Propagator(ModuleOp module, const MeshShape &mesh)
      : module(module), mesh(mesh) {
    if (auto pipeline = module->getAttrOfType<DictionaryAttr>(
            ErnieDialect::kPipelineAttrName))
      if (auto axis = pipeline.getAs<StringAttr>("axis"))
        pipelineAxis = axis.getValue();
  }

  /// Two rounds over the priority levels. The first assigns a value only
  /// the sharding its op fully determines — every factor of the value
  /// appears in a tensor that already has a sharding — so a weight's
  /// sharding does not declare the batch and sequence of the activations it
  /// meets unsplit before a constraint on those activations has been heard
  /// (a norm's weight, broadcast over [batch, seq, hidden] in its gradient,
  /// replicated the whole residual stream of a sequence-parallel step). The
  /// second lets the projection fill the factors nothing determined
  /// (unsplit), as a pure tensor-parallel plan needs.
  void run() {
    for (bool guess : {false, true}) {
      guessing = guess;
      for (int64_t level : levels)
        propagateAt(level);
    }
    // What a function's result is wanted as binds the returned value only
    // once the function's own ops have had their say, and then only where
    // they left it open: else a gradient ZeRO wants split over dp pulls
    // its weight-gradient matmul's operands to that split (its batch-split
    // activations gathered whole, the loss's gradient computed on the
    // global batch) instead of being reduce-scattered at the return.
    if (!returnSpecs.empty()) {
      for (auto [value, spec] : returnSpecs)
        if (!settlePendingReturn(value, spec))
          offer(value, spec, 0);
      for (int64_t level : levels)
        propagateAt(level);
    }
    replicateTheRest();
    decideSettledSums();
  }

  LogicalResult materialize();

  /// Collects the user's placements; fails on one naming another mesh.
  LogicalResult seed();

private:
  /// Gives `v` `sharding` unless it already has one.
  bool offer(Value v, ShardingAttr sharding, int64_t level) {
    if (!sharding || !tensorType(v) || known.count(v))
      return false;
    known[v] = {sharding, level};
    enqueueNeighbours(v);
    return true;
  }

  /// A pending sum read only by the return or a constraint (a gradient,
  /// which autodiff constrains to its parameter's layout) takes what that
  /// reader wants, so propagation around it sees that layout; once every
  /// value is known, decideSettledSums weighs making it directly against
  /// reducing the pending sum where it is read. An embedding's table
  /// gradient, a [vocabulary, hidden] sum over the split tokens, is then
  /// made hidden-split from the tokens' gradient exchanged all-to-all
  /// instead of summed whole and reduce-scattered.
  bool settlePendingReturn(Value v, ShardingAttr wanted) {
    auto it = known.find(v);
    if (!wanted || wanted.isPartial() || it == known.end() ||
        !it->second.first.isPartial() || !v.hasOneUse() ||
        !isa<func::ReturnOp, ShardingConstraintOp>(*v.getUsers().begin()) ||
        !v.getDefiningOp<ShardingRuleOpInterface>())
      return false;
    settled[v] = it->second.first;
    it->second.first = wanted;
    enqueueNeighbours(v);
    return true;
  }

  /// A sharding inferred (not given by the user) for `v`. A function
  /// argument never becomes Partial this way: nothing upstream of it could
  /// hold the pending summands, so the reshard belongs at the use.
  bool offerDerived(Value v, ShardingAttr sharding, int64_t level) {
    if (isa<BlockArgument>(v))
      sharding = dropPartial(sharding);
    return offer(v, sharding, level);
  }

  /// Queues every op that may learn something from `v` now having a
  /// sharding: its producer, its users, and the calls it flows through.
  void enqueueNeighbours(Value v) {
    if (Operation *def = v.getDefiningOp())
      enqueue(def);
    else if (auto func = dyn_cast<func::FuncOp>(
                 v.getParentBlock()->getParentOp()))
      for (Operation *call : callers.lookup(func))
        enqueue(call);
    for (Operation *user : v.getUsers()) {
      enqueue(user);
      if (isa<func::ReturnOp>(user))
        for (Operation *call :
             callers.lookup(user->getParentOfType<func::FuncOp>()))
          enqueue(call);
    }
  }
  void enqueue(Operation *op) {
    if (queued.insert(op).second)
      worklist.push_back(op);
  }
  ShardingAttr lookup(Value v, int64_t level) const {
    auto it = known.find(v);
    if (it == known.end() || it->second.second > level)
      return {};
    return it->second.first;
  }
  ShardingAttr get(Value v) const { return lookup(v, INT64_MAX); }

  bool visit(Operation *op, int64_t level);
  /// Visits every op once, then whatever a new sharding may affect, until
  /// nothing changes: linear in the program for chains in either direction.
  void propagateAt(int64_t level) {
    // Program order first, so shardings flow forward before they are guessed
    // backwards from a use.
    worklist.clear();
    queued.clear();
    module.walk([&](Operation *op) { enqueue(op); });
    while (!worklist.empty()) {
      Operation *op = worklist.front();
      worklist.pop_front();
      queued.erase(op);
      visit(op, level);
    }
  }
  void replicateTheRest();
  void decideSettledSums();
  /// What `op` needs of its operands and yields, given every value's
  /// sharding.
  OpPlan planOp(Operation *op);
  /// Divides `plan` over the mesh axes on which it repeats the same work on
  /// every rank, where a cluster says that pays.
  void divideRepeatedWork(Operation *op, OpPlan &plan);

  ModuleOp module;
  MeshShape mesh;
  SymbolTableCollection symbols;
  llvm::DenseMap<Value, std::pair<ShardingAttr, int64_t>> known;
  /// The calls of each function, for carrying shardings across call edges.
  llvm::DenseMap<Operation *, SmallVector<Operation *>> callers;
  std::deque<Operation *> worklist;
  llvm::DenseSet<Operation *> queued;
  /// The user's sharding for each function's results.
  llvm::DenseMap<std::pair<Operation *, unsigned>, ShardingAttr> resultSpecs;
  std::set<int64_t> levels{0};
  /// The user's sharding of each returned value, offered after both
  /// rounds (run()).
  SmallVector<std::pair<Value, ShardingAttr>> returnSpecs;
  /// Whether open values may take factors no known tensor determines.
  bool guessing = false;
  /// The axis pipeline stages are laid out on: ranks along it run
  /// different ops, so no op's work is divided over it.
  StringRef pipelineAxis;
  /// Pending sums given what their one reader wants (settlePendingReturn),
  /// with the sharding they had as pending sums.
  llvm::MapVector<Value, ShardingAttr> settled;
};

/// A pending sum an op passes on unreduced: its operands' shardings and
/// its result's.
struct PassedSum {
  SmallVector<ShardingAttr> operands;
  ShardingAttr result;
};

/// Whether `s` is a pending sum (every partial axis a sum).
bool isPendingSum(ShardingAttr s) {
  return s && s.isPartial() &&
         llvm::all_of(s.getPartials(),
                      [](auto p) { return p.second == ReduceKind::sum; });
}

/// What an op does with pending sums it is given, when it passes them on:
/// an `add` whose operands are all the same pending sum keeps it pending
/// (reducing once after the adds moves the bytes once instead of once per
/// summand: the gradient of a value read by q, k and v projections is
/// three partial products), and a `transpose` moves a pending sum's
/// dimensions and keeps it pending (the sum of transposes is the transpose
/// of the sum: a tied head's weight gradient, a transposed partial product,
/// adds to the embedding's pending gradient and both reduce once).
std::optional<PassedSum>
passedSum(Operation *op, function_ref<ShardingAttr(Value)> shardingOf) {
  if (isa<AddOp>(op)) {
    ShardingAttr first = shardingOf(op->getOperand(0));
    if (!isPendingSum(first))
      return std::nullopt;
    for (Value v : op->getOperands().drop_front())
      if (shardingOf(v) != first)
        return std::nullopt;
    return PassedSum{SmallVector<ShardingAttr>(op->getNumOperands(), first),
                     first};
  }
  if (auto transpose = dyn_cast<TransposeOp>(op)) {
    ShardingAttr in = shardingOf(transpose.getInput());
    if (!isPendingSum(in))
      return std::nullopt;
    SmallVector<SmallVector<StringRef>> dims;
    for (int64_t from : transpose.getPerm())
      dims.emplace_back(in.getDimAxes(from));
    return PassedSum{{in},
                     ShardingAttr::get(op->getContext(), in.getMesh(), dims,
                                       in.getPartials())};
  }
  return std::nullopt;
}

/// Whether every factor of operand (or result) `index` of `rule` occurs in
/// some tensor `state` knows, or cannot be split anyway.
bool isDetermined(const OpShardingRule &rule, const OpState &state,
                  bool isResult, unsigned index) {
  llvm::SmallDenseSet<int64_t> known;
  auto collect = [&](ArrayRef<TensorFactors> tensors,
                     ArrayRef<ShardingAttr> shardings) {
    for (auto [factors, sharding] : llvm::zip(tensors, shardings))
      if (sharding)
        for (const DimFactors &dim : factors)
          known.insert(dim.begin(), dim.end());
  };
  collect(rule.operands, state.operands);
  collect(rule.results, state.results);
  const TensorFactors &mine =
      isResult ? rule.results[index] : rule.operands[index];
  // A scalar has no factors, but whether it is whole or a pending
  // reduction (an amax over a split tensor) is its producer's to say: a
  // user fixing it whole would force that producer's input to be gathered.
  if (!isResult && mine.empty())
    return false;
  for (const DimFactors &dim : mine)
    for (int64_t f : dim)
      if (!known.count(f) && rule.factors[f].size > 1 &&
          rule.factors[f].kind != FactorKind::NeedReplication)
        return false;
  return true;
}

LogicalResult Propagator::seed() {
  module.walk([&](func::CallOp call) {
    if (auto callee = symbols.lookupNearestSymbolFrom<func::FuncOp>(
            call, call.getCalleeAttr()))
      callers[callee].push_back(call);
  });
  auto check = [&](Operation *op, ShardingAttr s) -> LogicalResult {
    if (s.getMesh() != mesh.name)
      return op->emitError() << "sharding names mesh " << s.getMesh()
                             << " but this module is partitioned over "
                             << mesh.name
                             << "; one mesh per module is supported";
    return success();
  };
  WalkResult walk = module.walk([&](Operation *op) -> WalkResult {
    if (auto func = dyn_cast<func::FuncOp>(op)) {
      for (unsigned i = 0; i < func.getNumArguments(); ++i)
        if (auto s = func.getArgAttrOfType<ShardingAttr>(i, kShardingAttrName)) {
          if (failed(check(op, s)))
            return WalkResult::interrupt();
          if (!func.isDeclaration())
            offer(func.getArgument(i), s, 0);
        }
      for (unsigned i = 0; i < func.getNumResults(); ++i)
        if (auto s =
                func.getResultAttrOfType<ShardingAttr>(i, kShardingAttrName)) {
          if (failed(check(op, s)))
            return WalkResult::interrupt();
          resultSpecs[{func, i}] = s;
          if (!func.isDeclaration())
            func.walk([&](func::ReturnOp ret) {
              returnSpecs.emplace_back(ret.getOperand(i), s);
            });
        }
      return WalkResult::advance();
    }
    if (auto constraint = dyn_cast<ShardingConstraintOp>(op)) {
      if (failed(check(op, constraint.getSharding())))
        return WalkResult::interrupt();
      int64_t level = constraint.getPriority();
      levels.insert(level);
      // Only the result: the operand takes it during propagation unless its
      // producer decides otherwise, and then the reshard sits at the
      // constraint instead of upstream on a possibly larger tensor.
      offer(constraint.getResult(), constraint.getSharding(), level);
      return WalkResult::advance();
    }
    if (auto reshard = dyn_cast<ReshardOp>(op)) {
      if (failed(check(op, reshard.getSharding())))
        return WalkResult::interrupt();
      offer(reshard.getResult(), reshard.getSharding(), 0);
      return WalkResult::advance();
    }
    if (auto given = op->getAttrOfType<ArrayAttr>(kResultShardingsAttrName)) {
      for (auto [result, s] : llvm::zip(op->getResults(), given)) {
        if (failed(check(op, cast<ShardingAttr>(s))))
          return WalkResult::interrupt();
        offer(result, cast<ShardingAttr>(s), 0);
      }
    }
    return WalkResult::advance();
  });
  return failure(walk.wasInterrupted());
}

bool Propagator::visit(Operation *op, int64_t level) {
  bool changed = false;
  // Call edges carry shardings both ways, like an identity op.
  if (auto call = dyn_cast<func::CallOp>(op)) {
    auto callee = symbols.lookupNearestSymbolFrom<func::FuncOp>(
        call, call.getCalleeAttr());
    if (!callee)
      return false;
    if (callee.isDeclaration()) {
      // An external function's signature says what crosses the call.
      for (auto [i, operand] : llvm::enumerate(call.getOperands()))
        changed |= offerDerived(operand,
                         callee.getArgAttrOfType<ShardingAttr>(
                             i, kShardingAttrName),
                         level);
      for (auto [i, result] : llvm::enumerate(call.getResults()))
        changed |= offerDerived(result,
                         callee.getResultAttrOfType<ShardingAttr>(
                             i, kShardingAttrName),
                         level);
      return changed;
    }
    for (auto [operand, arg] :
         llvm::zip(call.getOperands(), callee.getArguments())) {
      changed |= offerDerived(arg, lookup(operand, level), level);
      changed |= offerDerived(operand, lookup(arg, level), level);
    }
    callee.walk([&](func::ReturnOp ret) {
      for (auto [i, result, value] :
           llvm::enumerate(call.getResults(), ret.getOperands())) {
        // The callee's result as its signature promises it (a ZeRO-2
        // gradient split over dp), else as it computes it.
        auto spec = resultSpecs.find({callee, static_cast<unsigned>(i)});
        changed |= offerDerived(result,
                                spec != resultSpecs.end()
                                    ? spec->second
                                    : dropPartial(lookup(value, level)),
                                level);
        // What the caller wants of a result reaches the value the callee
        // returns only once the callee's own ops have had their say: a
        // gradient its producer leaves pending a sum is then all-reduced
        // (or reduce-scattered) at the return, rather than its operands
        // gathered to make it whole.
        if (ShardingAttr s = lookup(result, level); s && guessing)
          changed |= settlePendingReturn(value, dropPartial(s)) ||
                     offerDerived(value, s, level);
      }
    });
    return changed;
  }
  if (auto constraint = dyn_cast<ShardingConstraintOp>(op)) {
    changed |= settlePendingReturn(constraint.getInput(),
                                   lookup(constraint.getResult(), level));
    changed |= offerDerived(constraint.getResult(), lookup(constraint.getInput(), level), level);
    changed |= offerDerived(constraint.getInput(), lookup(constraint.getResult(), level), level);
    return changed;
  }
  if (std::optional<PassedSum> passed =
          passedSum(op, [&](Value v) { return lookup(v, level); }))
    return offerDerived(op->getResult(0), passed->result, level);
  auto ruleOp = dyn_cast<ShardingRuleOpInterface>(op);
  if (!ruleOp)
    return false;
  OpState state = stateOf(op, [&](Value v) { return lookup(v, level); });
  auto known = [](ShardingAttr s) { return bool(s); };
  auto unknown = [](ShardingAttr s) { return !s; };
  bool any = llvm::any_of(state.operands, known) ||
             llvm::any_of(state.results, known);
  bool open = llvm::any_of(state.operands, unknown) ||
              llvm::any_of(state.results, unknown);
  if (!any || !open)
    return false;
  OpShardingRule rule = ruleOp.getShardingRule();
  OpShardings resolved =
      resolveShardings(op->getContext(), rule, state.operands, state.results,
                       state.operandTypes, state.resultTypes, mesh);
  for (auto [i, v, s] : llvm::enumerate(op->getOperands(), resolved.operands))
    if (guessing || isDetermined(rule, state, /*isResult=*/false, i))
      changed |= offerDerived(v, s, level);
  for (auto [i, v, s] : llvm::enumerate(op->getResults(), resolved.results))
    if (guessing || isDetermined(rule, state, /*isResult=*/true, i))
      changed |= offerDerived(v, s, level);
  return changed;
}

void Propagator::replicateTheRest() {
  auto replicate = [&](Value v) {
    if (auto type = tensorType(v))
      offer(v,
            ShardingAttr::getReplicated(v.getContext(), mesh.name,
                                        type.getRank()),
            INT64_MAX);
  };
  module.walk([&](Operation *op) {
    for (Region &region : op->getRegions())
      for (Block &block : region)
        for (BlockArgument arg : block.getArguments())
          replicate(arg);
    for (Value result : op->getResults())
      replicate(result);
  });
}

/// How much cheaper (reshardCost: bytes, or a cluster's seconds) another way
/// of running an op must be before it replaces the established one (a
/// pending sum reduced where it is read; operands brought to what the
/// results' factors say). The collectives' cost is the whole of what
/// propagation sees: a reduction at the return overlaps the backward, a
/// gathered weight is prefetched, a toy's shapes say little about a
/// model's; only a clear win moves the plan.
constexpr double kClearlyCheaper = 4;

/// A settled pending sum (settlePendingReturn) stays one — reduced where
/// it is read, by a collective buckets overlap with the backward — unless
/// its producer can make the wanted layout directly (its operands
/// resharded, on the critical path) clearly more cheaply and computing no
/// more per rank: a weight gradient wanted whole is not made
/// from gathered activations. Some pending axes may stay pending: a
/// data-parallel sum is not the producer's to avoid (its batch is split),
/// so the embedding's gradient is made hidden-split over mp and still
/// all-reduced over dp. The costs compared are those up to that layout;
/// what remains pending costs both ways the same.
void Propagator::decideSettledSums() {
  for (auto [v, pending] : settled) {
    auto result = cast<OpResult>(v);
    Operation *op = result.getOwner();
    unsigned index = result.getResultNumber();
    OpState state = stateOf(op, [&](Value x) { return get(x); });
    OpShardingRule rule = cast<ShardingRuleOpInterface>(op).getShardingRule();
    ShardingAttr wanted = state.results[index];
    SmallVector<SmallVector<StringRef>> dims;
    for (int64_t d = 0; d < wanted.getRank(); ++d)
      dims.push_back(wanted.getDimAxes(d));
    SmallVector<StringRef> splitting = wanted.getUsedAxes();
    auto partials = pending.getPartials();
    // What an op with result `index` laid out as `layout` moves: each known
    // operand resharded to `choice`, and the result from `choice` to
    // `layout`.
    auto withResult = [&](ShardingAttr layout) {
      SmallVector<ShardingAttr> results = state.results;
      results[index] = layout;
      return results;
    };
    auto costTo = [&](const OpShardings &choice, ShardingAttr layout) {
      return movedCost(choice, state.operands, withResult(layout),
                       state.operandTypes, state.resultTypes, mesh);
    };
    // The way it is now: the pending sum.
    OpShardings reduce = resolveShardings(
        op->getContext(), rule, state.operands, withResult(pending),
        state.operandTypes, state.resultTypes, mesh);
    ShardingAttr best;
    // Every subset of the pending axes kept pending but the whole (the
    // pending sum itself), as a bit mask.
    for (unsigned keep = 0; keep + 1 < (1u << partials.size()); ++keep) {
      SmallVector<std::pair<StringRef, ReduceKind>> kept;
      for (auto [i, p] : llvm::enumerate(partials))
        if (keep & (1u << i))
          kept.push_back(p);
      if (llvm::any_of(kept, [&](auto p) {
            return llvm::is_contained(splitting, p.first);
          }))
        continue;
      ShardingAttr target =
          ShardingAttr::get(op->getContext(), mesh.name, dims, kept);
      OpShardings direct = resolveShardings(
          op->getContext(), rule, state.operands, withResult(target),
          state.operandTypes, state.resultTypes, mesh);
      if (direct.results[index] == target &&
          localIterations(rule, direct.factorAxes, mesh) <=
              localIterations(rule, reduce.factorAxes, mesh) &&
          kClearlyCheaper * costTo(direct, target) <= costTo(reduce, target)) {
        best = target;
        break;
      }
    }
    known[v].first = best ? best : pending;
  }
}

OpPlan Propagator::planOp(Operation *op) {
  OpPlan plan;
  plan.operands.resize(op->getNumOperands());
  for (Value v : op->getResults())
    plan.produced.push_back(get(v));
  if (auto ret = dyn_cast<func::ReturnOp>(op)) {
    auto func = ret->getParentOfType<func::FuncOp>();
    for (unsigned i = 0; i < ret.getNumOperands(); ++i) {
      auto spec = resultSpecs.find({func, i});
      ShardingAttr s = get(ret.getOperand(i));
      plan.operands[i] =
          spec != resultSpecs.end() ? spec->second : dropPartial(s);
    }
    return plan;
  }
  if (auto call = dyn_cast<func::CallOp>(op)) {
    // A call takes what its callee's arguments have and yields what its
    // callee returns, whatever the caller's values want.
    auto callee = symbols.lookupNearestSymbolFrom<func::FuncOp>(
        call, call.getCalleeAttr());
    if (!callee)
      return plan;
    for (unsigned i = 0; i < call.getNumOperands(); ++i)
      plan.operands[i] =
          callee.isDeclaration()
              ? callee.getArgAttrOfType<ShardingAttr>(i, kShardingAttrName)
              : get(callee.getArgument(i));
    for (unsigned i = 0; i < call.getNumResults(); ++i) {
      ShardingAttr returned;
      if (auto spec = resultSpecs.find({callee, i}); spec != resultSpecs.end())
        returned = spec->second;
      else if (callee.isDeclaration())
        returned = callee.getResultAttrOfType<ShardingAttr>(i,
                                                            kShardingAttrName);
      else
        returned = dropPartial(get(
            callee.getBody().back().getTerminator()->getOperand(i)));
      if (!returned)
        if (auto type = tensorType(call.getResult(i)))
          returned = ShardingAttr::getReplicated(op->getContext(), mesh.name,
                                                 type.getRank());
      plan.produced[i] = returned;
    }
    return plan;
  }
  if (auto constraint = dyn_cast<ShardingConstraintOp>(op)) {
    plan.operands[0] = constraint.getSharding();
    return plan;
  }
  if (std::optional<PassedSum> passed =
          passedSum(op, [&](Value v) { return get(v); });
      passed && get(op->getResult(0)) == passed->result) {
    plan.operands = passed->operands;
    return plan;
  }
  auto ruleOp = dyn_cast<ShardingRuleOpInterface>(op);
  if (!ruleOp)
    return plan;
  OpState state = stateOf(op, [&](Value v) { return get(v); });
  OpShardingRule rule = ruleOp.getShardingRule();
  // Everything known, reconciled: fine when the op can produce what its
  // results were given.
  OpShardings joint = resolveShardings(op->getContext(), rule, state.operands,
                                       state.results, state.operandTypes,
                                       state.resultTypes, mesh);
  auto moved = [&](const OpShardings &choice) {
    return movedCost(choice, state.operands, state.results, state.operandTypes,
                     state.resultTypes, mesh);
  };
  if (joint.results == state.results) {
    plan.operands = joint.operands;
    return plan;
  }
  // Else bring the operands to what the results' factors say, if that yields
  // the results' shardings and costs no more than resharding the joint
  // choice's results after the op (an embedding whose output is wanted
  // split by sequence: its ids split and the whole table gathered, against
  // the hidden-split lookup's output exchanged all-to-all).
  SmallVector<ShardingAttr> noOperands(op->getNumOperands());
  OpShardings fromResults =
      resolveShardings(op->getContext(), rule, noOperands, state.results,
                       state.operandTypes, state.resultTypes, mesh);
  // Resharding the operands stays the default unless resharding the
  // results after is clearly cheaper (kClearlyCheaper).
  if (fromResults.results == state.results &&
      kClearlyCheaper * moved(joint) > moved(fromResults)) {
    plan.operands = fromResults.operands;
    return plan;
  }
  // The results were given a sharding this op cannot produce (a sliced or
  // normalised dimension split, a Partial on an op that reduces nothing):
  // produce what the rule allows and reshard after.
  plan.operands = joint.operands;
  plan.produced = joint.results;
  return plan;
}

/// An op none of whose tensors is split (or pending) over a mesh axis
/// computes the same on every rank of that axis: a replicated LM head on a
/// tensor-parallel mesh ran the whole vocabulary's GEMMs on each mp rank.
/// Compiled for a cluster (MeshShape::opTime), such an op is divided over
/// the axis by one of its factors where the compute that saves is clearly
/// more (kClearlyCheaper) than all the collectives the divided op needs:
/// replicated operands are sliced locally (free), and the result, made
/// split — or a pending sum, for a contraction factor — is brought back to
/// what its users were promised (an all-gather, an all-reduce) by the
/// reshard materialize puts after any op that produces another layout.
/// The layouts propagation chose for the values stay as they are; each op
/// is weighed alone, greedily, one axis at a time, like the choices above.
/// Without a cluster bytes and FLOPs have no common measure, and nothing
/// is divided.
void Propagator::divideRepeatedWork(Operation *op, OpPlan &plan) {
  auto ruleOp = dyn_cast<ShardingRuleOpInterface>(op);
  if (!mesh.opTime || !ruleOp || op->getNumResults() == 0 ||
      isa<func::CallOp, ShardingConstraintOp, ReshardOp>(op))
    return;
  auto missing = [](ShardingAttr s) { return !s; };
  if (llvm::any_of(plan.operands, missing) ||
      llvm::any_of(plan.produced, missing) ||
      llvm::any_of(plan.operands, [](ShardingAttr s) { return s.isPartial(); }))
    return;
  MLIRContext *context = op->getContext();
  OpShardingRule rule = ruleOp.getShardingRule();
  OpState state = stateOf(op, [&](Value v) { return get(v); });
  OpShardings current =
      resolveShardings(context, rule, plan.operands, plan.produced,
                       state.operandTypes, state.resultTypes, mesh);
  // Only a plan its rule reproduces is understood well enough to divide.
  if (current.operands != plan.operands || current.results != plan.produced)
    return;
  double whole = mesh.opTime(op);
  if (!(whole > 0))
    return;
  double iterations =
      localIterations(rule, FactorAxes(rule.factors.size()), mesh);
  auto moved = [&](const OpShardings &choice) {
    return movedCost(choice, state.operands, state.results, state.operandTypes,
                     state.resultTypes, mesh);
  };
  while (true) {
    llvm::StringSet<> used;
    for (const auto &axes : current.factorAxes)
      for (StringRef axis : axes)
        used.insert(axis);
    double base = moved(current);
    double mine = localIterations(rule, current.factorAxes, mesh);
    std::optional<OpShardings> best;
    double bestGain = 0;
    for (auto [axis, size] : llvm::zip(mesh.axes, mesh.sizes)) {
      if (size <= 1 || used.contains(axis) || axis == pipelineAxis)
        continue;
      for (auto [id, factor] : llvm::enumerate(rule.factors)) {
        if (factor.kind == FactorKind::NeedReplication ||
            factor.size % size != 0)
          continue;
        FactorAxes axes = current.factorAxes;
        axes[id].push_back(axis);
        OpShardings choice = projectFactors(context, rule, axes, mesh);
        if (!llvm::is_contained(choice.factorAxes[id], axis))
          continue; // Its pieces would be strided.
        double saved = whole *
                       (mine - localIterations(rule, choice.factorAxes, mesh)) /
                       iterations;
        // Everything the divided op moves, not only what it adds: an
        // all-reduce the op needed anyway becomes a reduce-scatter and an
        // all-gather, which the model prices the same but the runtime
        // runs as two, for a saving a residual add's size.
        double moves = moved(choice);
        double added = moves - base;
        if (saved > kClearlyCheaper * moves &&
            isCheaper(bestGain, saved - added)) {
          bestGain = saved - added;
          best = std::move(choice);
        }
      }
    }
    if (!best)
      break;
    current = std::move(*best);
  }
  // Unchanged where nothing paid: `current` reproduces the plan.
  plan.operands = current.operands;
  plan.produced = current.results;
}

LogicalResult Propagator::materialize() {
  MLIRContext *context = module.getContext();
  // Plans first, while `known` still describes every value.
  SmallVector<Operation *> ops;
  module.walk([&](Operation *op) { ops.push_back(op); });
  llvm::DenseMap<Operation *, OpPlan> plans;
  for (Operation *op : ops) {
    OpPlan &plan = plans[op] = planOp(op);
    divideRepeatedWork(op, plan);
  }

  // Function signatures: arguments as known; results the user's, else the
  // returned values' without pending reductions (a returned value is
  // complete).
  module.walk([&](func::FuncOp func) {
    if (func.isDeclaration())
      return;
    FunctionAttrEditor args(func, FunctionAttrEditor::Arguments);
    for (unsigned i = 0; i < func.getNumArguments(); ++i)
      if (ShardingAttr s = get(func.getArgument(i)))
        args.set(i, kShardingAttrName, s);
    FunctionAttrEditor results(func, FunctionAttrEditor::Results);
    auto ret = cast<func::ReturnOp>(func.getBody().back().getTerminator());
    for (unsigned i = 0; i < func.getNumResults(); ++i) {
      if (resultSpecs.count({func, i}))
        continue;
      if (ShardingAttr s = get(ret.getOperand(i)))
        results.set(i, kShardingAttrName, dropPartial(s));
    }
  });

  OpBuilder builder(context);
  // The reshards put after an op producing another layout than promised,
  // with what the op produced: a user wanting that layout reads the op's
  // own result instead of resharding the reshard back (a divided LM head's
  // logits, gathered for the loss, are read by rows by a GEMM divided the
  // same way).
  llvm::DenseMap<Value, std::pair<Value, ShardingAttr>> producedBefore;
  for (Operation *op : ops) {
    if (isa<func::FuncOp, ModuleOp>(op))
      continue;
    const OpPlan &plan = plans[op];
    // What the op produces, and a reshard after it where its users were
    // promised something else.
    if (op->getNumResults() != 0 &&
        !isa<ShardingConstraintOp, ReshardOp>(op) &&
        llvm::all_of(plan.produced, [](ShardingAttr s) { return bool(s); })) {
      op->setAttr(kResultShardingsAttrName,
                  ArrayAttr::get(context, SmallVector<Attribute>(
                                              plan.produced.begin(),
                                              plan.produced.end())));
      builder.setInsertionPointAfter(op);
      for (auto [result, produced] : llvm::zip(op->getResults(), plan.produced)) {
        ShardingAttr promised = get(result);
        if (!promised || promised == produced)
          continue;
        auto after = ReshardOp::create(builder, op->getLoc(), result, promised);
        result.replaceAllUsesExcept(after.getResult(), after);
        known[after.getResult()] = {promised, 0};
        producedBefore[after.getResult()] = {result, produced};
      }
    }
    // Explicit reshards wherever this op needs another sharding.
    for (auto [i, want] : llvm::enumerate(plan.operands)) {
      Value value = op->getOperand(i);
      ShardingAttr have = get(value);
      if (!want || !have || want == have)
        continue;
      if (auto it = producedBefore.find(value);
          it != producedBefore.end() && it->second.second == want) {
        op->setOperand(i, it->second.first);
        continue;
      }
      builder.setInsertionPoint(op);
      auto reshard = ReshardOp::create(builder, op->getLoc(), value, want);
      op->setOperand(i, reshard.getResult());
    }
  }
  // Constraints have done their work: their operand now has their sharding.
  module.walk([&](ShardingConstraintOp constraint) {
    constraint.getResult().replaceAllUsesWith(constraint.getInput());
    constraint.erase();
  });
  return success();
}

struct ShardingPropagationPass
    : ernie::impl::ShardingPropagationPassBase<ShardingPropagationPass> {
  using ShardingPropagationPassBase::ShardingPropagationPassBase;
  explicit ShardingPropagationPass(std::shared_ptr<const cost::ClusterSpec> parsed)
      : parsedCluster(std::move(parsed)) {}

  /// A cluster handed over already parsed; it wins over the `cluster` file.
  std::shared_ptr<const cost::ClusterSpec> parsedCluster;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    // The mesh: the one the annotations name, else the module's only one.
    MeshOp mesh;
    module.walk<WalkOrder::PreOrder>([&](Operation *op) {
      if (mesh)
        return WalkResult::interrupt();
      auto pick = [&](ShardingAttr s) {
        if (s && !mesh)
          mesh = lookupMesh(op, s);
      };
      if (auto c = dyn_cast<ShardingConstraintOp>(op))
        pick(c.getSharding());
      if (auto func = dyn_cast<func::FuncOp>(op)) {
        for (unsigned i = 0; i < func.getNumArguments(); ++i)
          pick(func.getArgAttrOfType<ShardingAttr>(i, kShardingAttrName));
        for (unsigned i = 0; i < func.getNumResults(); ++i)
          pick(func.getResultAttrOfType<ShardingAttr>(i, kShardingAttrName));
      }
      return WalkResult::advance();
    });
    if (!mesh) {
      auto meshes = module.getOps<MeshOp>();
      if (meshes.empty())
        return; // Nothing is distributed.
      mesh = *meshes.begin();
    }
    FailureOr<MeshShape> shape = cost::meshShapeOnCluster(mesh, cluster, parsedCluster.get());
    if (failed(shape))
      return signalPassFailure();
    Propagator propagator(module, *shape);
    if (failed(propagator.seed()))
      return signalPassFailure();
    propagator.run();
    if (failed(propagator.materialize()))
      return signalPassFailure();
  }
};

} // namespace

std::unique_ptr<Pass> mlir::ernie::createShardingPropagationPass(
    std::shared_ptr<const cost::ClusterSpec> cluster) {
  return std::make_unique<ShardingPropagationPass>(std::move(cluster));
}

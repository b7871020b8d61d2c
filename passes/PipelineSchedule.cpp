//===- PipelineSchedule.cpp - stage functions and the step order ----------===//
//
// After partition, @train_step (its gradient inlined) is one straight-line
// function whose ops know their chunk: --ernie-pipeline-split staged the
// forward, autodiff gave each gradient op its forward op's stage and each
// update op its parameter's rank. Ops partition added are placed like their
// operands; constant expressions, and ops reading only arguments (ZeRO-3's
// gathers), are rebuilt wherever they are read.
//
// Cutting the function is then bookkeeping over where each value is defined
// and read: the same chunk (nothing), an earlier forward chunk (send and
// receive), the chunk's own forward read by its backward (a residual the
// runtime keeps per micro-batch), a later backward chunk (send and receive),
// a backward read by the update (a gradient the runtime sums over
// micro-batches), a whole tensor's maximum read by the update (an fp8 amax
// the runtime combines over micro-batches by max), a forward's sum over
// the batch read by the update (MoE routing's usage, combined by sum).
// Data only flows as a pipeline allows — forward values up the chunks,
// gradients down — which the pass checks, so the schedule's dependencies
// are exactly those the schedule library simulates.
//
//===----------------------------------------------------------------------===//

#include "ernie/runtime/PipelineSchedule.h"
#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Dialect/Ernie/IR/PipelineInfo.h"
#include "ernie/Dialect/Ernie/IR/Sharding.h"
#include "ernie/Dialect/Ernie/IR/ShardingRule.h"
#include "ernie/Passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/SmallBitVector.h"
#include "llvm/ADT/StringExtras.h"

#include <map>
#include <set>

namespace mlir::ernie {
#define GEN_PASS_DEF_PIPELINESCHEDULEPASS
#include "ernie/Passes/Passes.h.inc"
} // namespace mlir::ernie

using namespace mlir;
using namespace mlir::ernie;
namespace rt = ::ernie::runtime;

namespace {

/// Where an op runs. Phases are ordered as a step runs them.
enum class Phase { Leaf, Forward, Backward, Update };

struct Place {
  Phase phase = Phase::Leaf;
  int64_t index = 0; // the chunk (forward, backward) or the rank (update)
  bool operator==(const Place &o) const {
    return phase == o.phase && index == o.index;
  }
};

/// How the step combines a value each micro-batch makes, for the update
/// to read: not at all (it stays in its micro-batch), by max or by sum.
enum class Combined { None, Max, Sum };

/// Appends an argument of `type` with `attrs` to `fn` and returns it.
BlockArgument appendArgument(func::FuncOp fn, Type type, DictionaryAttr attrs,
                             Location loc) {
  unsigned at = fn.getNumArguments();
  (void)fn.insertArgument(at, type, attrs, loc);
  return fn.getArgument(at);
}

/// One function being built: its body, arguments, results.
struct StageFunction {
  std::string name;
  int64_t rank;
  func::FuncOp fn;
  Block *body;
  IRMapping map;
  SmallVector<Value> results;
  SmallVector<DictionaryAttr> resultAttrs;
  /// Arguments of the source step, by position, once imported.
  llvm::DenseMap<unsigned, Value> args;
};

class Cutter {
public:
  Cutter(ModuleOp module, int64_t stages, int64_t chunks, int64_t &channel,
         bool reduceInF32 = true)
      : module_(module), b_(module.getContext()), stages_(stages),
        chunks_(chunks), channel_(channel), reduceInF32_(reduceInF32) {}

  /// Cuts `step` into stage functions named `<prefix>_forward.<c>` (and, for
  /// training, `_backward.<c>`, `_update.<r>`), in front of `step`.
  LogicalResult cut(func::FuncOp step, StringRef prefix,
                    const llvm::DenseSet<Operation *> &update,
                    int64_t microBatches);

private:
  LogicalResult classify(func::FuncOp step,
                         const llvm::DenseSet<Operation *> &update);
  Place placeOf(Value v) const;
  int64_t rankOf(const Place &p) const {
    return p.phase == Phase::Update ? p.index : p.index % stages_;
  }
  void sinkGathersToReaders(ArrayRef<Operation *> ops);
  void findBatchDims(func::FuncOp step);
  Combined combinedOver(Value v) const;
  LogicalResult updateStateOncePerStep(func::FuncOp step);
  StageFunction &functionFor(const Place &p);
  FailureOr<Value> valueIn(StageFunction &fn, const Place &where, Value v);
  Value cloneLeaf(StageFunction &fn, Value v);
  Value argumentIn(StageFunction &fn, BlockArgument arg);
  Value transfer(StageFunction &from, const Place &fromPlace,
                 StageFunction &to, const Place &toPlace, Value local,
                 Value original);
  void addResult(StageFunction &fn, Value v, NamedAttrList attrs);
  Value reduceWide(StageFunction &fn, AllReduceOp reduce);
  void finish(StageFunction &fn);

  ModuleOp module_;
  OpBuilder b_;
  int64_t stages_, chunks_;
  int64_t &channel_;
  bool reduceInF32_;
  func::FuncOp step_;
  std::string prefix_;
  llvm::DenseMap<Operation *, Place> places_;
  std::map<std::pair<int, int64_t>, StageFunction> functions_;
  std::vector<StageFunction *> order_; // creation order, for output order
  SmallVector<int64_t> batchIndex_;    // per step argument, -1: not batch
  /// Per value, which of its dimensions run over the batch's data.
  llvm::DenseMap<Value, llvm::SmallBitVector> batchDims_;
  int64_t residuals_ = 0, gradients_ = 0, maxima_ = 0, sums_ = 0;
  int64_t microBatches_ = 1;
};

Place Cutter::placeOf(Value v) const {
  if (auto res = dyn_cast<OpResult>(v))
    return places_.lookup(res.getOwner());
  return Place{}; // Arguments: imported wherever read.
}

/// Marks the dimensions of every value that run over the batch's data: every
/// dimension of a batch input (its samples and their tokens), and whatever
/// the ops' factor maps carry them into — the one table propagation and
/// partition read. A factor of a marked dimension that reaches no result
/// and is not a reduction (a misaligned reshape, an op whose rule leaves a
/// dimension unrelated), or an op with no rule, marks every dimension of its
/// results: too many marks only refuse a combination, never allow a wrong
/// one. Collectives keep their operand's marks (an all-to-all moves them to
/// its concatenated dimension too).
void Cutter::findBatchDims(func::FuncOp step) {
  auto marks = [&](Value v) {
    auto it = batchDims_.find(v);
    if (it != batchDims_.end())
      return it->second;
    auto type = dyn_cast<RankedTensorType>(v.getType());
    return llvm::SmallBitVector(type ? type.getRank() : 0);
  };
  for (BlockArgument arg : step.getArguments())
    if (auto type = dyn_cast<RankedTensorType>(arg.getType());
        type && batchIndex_[arg.getArgNumber()] >= 0)
      batchDims_[arg] = llvm::SmallBitVector(type.getRank(), true);
  step.walk([&](Operation *op) {
    if (op->getNumResults() == 0 ||
        llvm::none_of(op->getOperands(),
                      [&](Value v) { return marks(v).any(); }))
      return;
    auto markAll = [&] {
      for (Value r : op->getResults())
        if (auto type = dyn_cast<RankedTensorType>(r.getType()))
          batchDims_[r] = llvm::SmallBitVector(type.getRank(), true);
    };
    if (isa<AllReduceOp, AllGatherOp, ReduceScatterOp, AllToAllOp,
            ShardSliceOp>(op)) {
      llvm::SmallBitVector m = marks(op->getOperand(0));
      auto out = dyn_cast<RankedTensorType>(op->getResult(0).getType());
      if (!out || out.getRank() != int64_t(m.size()))
        return markAll();
      if (auto a2a = dyn_cast<AllToAllOp>(op); a2a && m.any())
        m.set(a2a.getConcatDim()).set(a2a.getSplitDim());
      batchDims_[op->getResult(0)] = m;
      return;
    }
    auto ruleOp = dyn_cast<ShardingRuleOpInterface>(op);
    if (!ruleOp)
      return markAll();
    OpShardingRule rule = ruleOp.getShardingRule();
    if (rule.operands.size() != op->getNumOperands() ||
        rule.results.size() != op->getNumResults())
      return markAll();
    llvm::SmallBitVector batchFactor(rule.factors.size()),
        inResults(rule.factors.size());
    for (const TensorFactors &result : rule.results)
      for (const DimFactors &dim : result)
        for (int64_t f : dim)
          inResults.set(f);
    for (auto [operand, factors] :
         llvm::zip(op->getOperands(), rule.operands)) {
      llvm::SmallBitVector m = marks(operand);
      for (int d : m.set_bits()) {
        if (size_t(d) >= factors.size())
          return markAll();
        for (int64_t f : factors[d]) {
          if (!inResults.test(f) &&
              rule.factors[f].kind != FactorKind::Reduction)
            return markAll(); // Carried somewhere the map does not say.
          batchFactor.set(f);
        }
      }
    }
    for (auto [result, factors] : llvm::zip(op->getResults(), rule.results)) {
      llvm::SmallBitVector m = marks(result);
      for (auto [d, dim] : llvm::enumerate(factors))
        for (int64_t f : dim)
          if (d < m.size() && batchFactor.test(f))
            m.set(d);
      batchDims_[result] = m;
    }
  });
}

/// Whether `v` is a value the step can combine over its micro-batches: a
/// maximum or a forward's sum whose result runs over no dimension of the
/// batch's data (a `reduce_max` or `reduce_sum` that reduces all those its
/// input has, or a max or sum all-reduce of one): an fp8 amax, MoE
/// routing's count of choices per expert. Over a step these are the
/// maximum, and the sum, of the micro-batches' values in any order. (A
/// reduction that keeps a row per sample is not: the micro-batches' rows
/// are other rows. A sum in a backward is a gradient's, averaged over the
/// micro-batches as every gradient is.)
Combined Cutter::combinedOver(Value v) const {
  Operation *def = v.getDefiningOp();
  if (auto ar = dyn_cast_or_null<AllReduceOp>(def)) {
    Combined in = combinedOver(ar.getInput());
    bool same = (in == Combined::Max && ar.getKind() == ReduceKind::max) ||
                (in == Combined::Sum && ar.getKind() == ReduceKind::sum);
    return same ? in : Combined::None;
  }
  if (!isa_and_nonnull<ReduceMaxOp, ReduceSumOp>(def) ||
      batchDims_.lookup(v).any())
    return Combined::None;
  if (isa<ReduceMaxOp>(def))
    return Combined::Max;
  bool fromBatch = batchDims_.lookup(def->getOperand(0)).any();
  return fromBatch && placeOf(v).phase == Phase::Forward ? Combined::Sum
                                                         : Combined::None;
}

LogicalResult Cutter::classify(func::FuncOp step,
                               const llvm::DenseSet<Operation *> &update) {
  // Rebuilt wherever read: an op of no stage that reads only arguments and
  // constants — a ZeRO-3 parameter gather, which partition may put in the
  // step itself (ahead of the gradient's call) rather than in the chunks.
  auto rebuilt = [&](Operation &op) {
    return !op.hasAttr(ErnieDialect::kStageAttrName) &&
           (isMemoryEffectFree(&op) || isa<AllGatherOp>(op)) &&
           llvm::all_of(op.getOperands(), [&](Value v) {
             return placeOf(v).phase == Phase::Leaf;
           });
  };
  for (Operation &op : step.getBody().front().without_terminator()) {
    Place place;
    auto stage = op.getAttrOfType<IntegerAttr>(ErnieDialect::kStageAttrName);
    if (op.getNumOperands() == 0 && isMemoryEffectFree(&op)) {
      // Constants (which folding merges across stages) and axis indices:
      // rebuilt wherever read.
    } else if (update.contains(&op) && rebuilt(op)) {
      // Likewise.
    } else if (update.contains(&op)) {
      place.phase = Phase::Update;
      place.index = -1;
      if (stage)
        place.index = stage.getInt() % stages_;
      else
        for (Value v : op.getOperands()) {
          Place p = placeOf(v);
          if (p.phase != Phase::Leaf)
            place.index = std::max(place.index, rankOf(p));
          else if (auto arg = dyn_cast<BlockArgument>(v))
            if (auto r = step.getArgAttrOfType<IntegerAttr>(
                    arg.getArgNumber(), ErnieDialect::kPipelineRankAttrName))
              place.index = std::max(place.index, r.getInt());
        }
      if (place.index < 0)
        place = Place{}; // Constants and learning-rate arithmetic.
    } else if (stage) {
      place.phase = op.hasAttr(ErnieDialect::kBackwardAttrName)
                        ? Phase::Backward
                        : Phase::Forward;
      place.index = stage.getInt();
    } else {
      // Added by propagation or partition: with its operands' latest phase
      // and, within it, chunk.
      for (Value v : op.getOperands()) {
        Place p = placeOf(v);
        if (p.phase > place.phase)
          place = p;
        else if (p.phase == place.phase && p.index > place.index)
          place.index = p.index;
      }
    }
    // A gather is kept out of CSE by its effects (§9 m), not by any: a
    // parameter's gather is rebuilt where read, as ZeRO-3 re-gathers.
    if (place.phase == Phase::Leaf && !isMemoryEffectFree(&op) &&
        !isa<AllGatherOp>(op))
      return op.emitError("pipeline split: this op has effects but reads "
                          "nothing placed on a stage");
    places_[&op] = place;
  }
  return success();
}

StageFunction &Cutter::functionFor(const Place &p) {
  int key = static_cast<int>(p.phase);
  auto [it, inserted] = functions_.try_emplace({key, p.index});
  StageFunction &fn = it->second;
  if (!inserted)
    return fn;
  const char *kind = p.phase == Phase::Forward    ? "_forward."
                     : p.phase == Phase::Backward ? "_backward."
                                                  : "_update.";
  fn.name = prefix_ + kind + std::to_string(p.index);
  fn.rank = rankOf(p);
  b_.setInsertionPoint(step_);
  fn.fn = func::FuncOp::create(b_, step_.getLoc(), fn.name,
                               b_.getFunctionType({}, {}));
  fn.fn->setAttr(ErnieDialect::kPipelineStageAttrName,
                 b_.getI64IntegerAttr(fn.rank));
  fn.body = fn.fn.addEntryBlock();
  order_.push_back(&fn);
  return fn;
}

Value Cutter::argumentIn(StageFunction &fn, BlockArgument arg) {
  unsigned i = arg.getArgNumber();
  if (Value v = fn.args.lookup(i))
    return v;
  NamedAttrList attrs(step_.getArgAttrDict(i));
  if (batchIndex_[i] >= 0)
    attrs.set(ErnieDialect::kInputAttrName,
              b_.getI64IntegerAttr(batchIndex_[i]));
  Value v = appendArgument(fn.fn, arg.getType(),
                           attrs.getDictionary(b_.getContext()), arg.getLoc());
  fn.args[i] = v;
  fn.map.map(arg, v);
  return v;
}

/// Rebuilds a constant expression (or an op of arguments alone) in `fn`.
Value Cutter::cloneLeaf(StageFunction &fn, Value v) {
  if (Value mapped = fn.map.lookupOrNull(v))
    return mapped;
  if (auto arg = dyn_cast<BlockArgument>(v))
    return argumentIn(fn, arg);
  Operation *op = cast<OpResult>(v).getOwner();
  for (Value operand : op->getOperands())
    cloneLeaf(fn, operand);
  OpBuilder::InsertionGuard guard(b_);
  b_.setInsertionPointToEnd(fn.body);
  Operation *copy = b_.clone(*op, fn.map);
  copy->removeAttr(ErnieDialect::kStageAttrName);
  copy->removeAttr(ErnieDialect::kBackwardAttrName);
  return fn.map.lookup(v);
}

void Cutter::addResult(StageFunction &fn, Value v, NamedAttrList attrs) {
  fn.results.push_back(v);
  fn.resultAttrs.push_back(attrs.getDictionary(b_.getContext()));
}

/// Moves `local` (the value of `original` in `from`) into `to`.
Value Cutter::transfer(StageFunction &from, const Place &fromPlace,
                       StageFunction &to, const Place &toPlace, Value local,
                       Value original) {
  OpBuilder::InsertionGuard guard(b_);
  Location loc = original.getLoc();
  auto type = local.getType();
  // A result of `from` and an argument of `to`, matched by name: the
  // runtime carries it between the two calls.
  auto handOff = [&](StringRef attr, std::string name) {
    NamedAttribute named = b_.getNamedAttr(attr, b_.getStringAttr(name));
    addResult(from, local, {named});
    return appendArgument(to.fn, type, b_.getDictionaryAttr(named), loc);
  };
  // The chunk's own forward value read by its backward: a residual.
  if (fromPlace.phase == Phase::Forward && toPlace.phase == Phase::Backward)
    return handOff(ErnieDialect::kResidualAttrName,
                   "residual." + std::to_string(residuals_++));
  // A sum over the micro-batches the update reads, handed over in f32 where
  // the type is narrower (Megatron's main grads: m bf16 partial sums would
  // each round away the small micro-batches' contributions) and rounded
  // once after `perStep` turned the step's sum into what the update reads.
  auto summed = [&](StringRef attr, std::string name, auto perStep) {
    auto tensor = cast<RankedTensorType>(type);
    auto element = dyn_cast<FloatType>(tensor.getElementType());
    bool widen = element && element.getWidth() < 32;
    if (widen) {
      b_.setInsertionPointToEnd(from.body);
      type = tensor.clone(b_.getF32Type());
      local = CastOp::create(b_, loc, type, local);
    }
    Value sum = handOff(attr, std::move(name));
    b_.setInsertionPointToEnd(to.body);
    Value step = perStep(sum);
    return widen ? CastOp::create(b_, loc, tensor, step) : step;
  };
  Combined combined =
      fromPlace.phase != Phase::Update && toPlace.phase == Phase::Update
          ? combinedOver(original)
          : Combined::None;
  // A maximum the update reads (an fp8 amax): the runtime keeps the largest
  // of the step's micro-batches.
  if (combined == Combined::Max)
    return handOff(ErnieDialect::kMicroBatchMaxAttrName,
                   "max." + std::to_string(maxima_++));
  // A forward's sum over the batch (MoE routing's usage): the step's is
  // the micro-batches' sum.
  if (combined == Combined::Sum)
    return summed(ErnieDialect::kMicroBatchSumAttrName,
                  "sum." + std::to_string(sums_++),
                  [](Value sum) { return sum; });
  // A backward value the update reads (a gradient): summed over
  // micro-batches by the runtime, averaged here.
  if (fromPlace.phase == Phase::Backward && toPlace.phase == Phase::Update)
    return summed(
        ErnieDialect::kGradientAttrName, "grad." + std::to_string(gradients_++),
        [&](Value sum) {
          return DivOp::create(
                     b_, loc, sum,
                     FullOp::create(b_, loc, cast<RankedTensorType>(type),
                                    static_cast<double>(microBatches_)))
              .getResult();
        });
  // Anything else crosses ranks: a send at the producer, a receive here.
  int64_t channel = channel_++;
  int64_t toChunk = toPlace.phase == Phase::Update ? to.rank : toPlace.index;
  int64_t fromChunk =
      fromPlace.phase == Phase::Update ? from.rank : fromPlace.index;
  b_.setInsertionPointToEnd(from.body);
  SendOp::create(b_, loc, local, toChunk, channel);
  b_.setInsertionPointToEnd(to.body);
  return RecvOp::create(b_, loc, type, fromChunk, channel);
}

FailureOr<Value> Cutter::valueIn(StageFunction &fn, const Place &where,
                                 Value v) {
  if (Value mapped = fn.map.lookupOrNull(v))
    return mapped;
  Place from = placeOf(v);
  if (from.phase == Phase::Leaf)
    return cloneLeaf(fn, v);
  Operation *def = cast<OpResult>(v).getOwner();
  // Which way may a value flow? Forward values up the chunks and into any
  // backward; gradients down the chunks and into their rank's update.
  bool allowed = false;
  switch (from.phase) {
  case Phase::Forward:
    allowed = (where.phase == Phase::Forward && from.index <= where.index) ||
              where.phase == Phase::Backward ||
              (where.phase == Phase::Update && rankOf(from) == where.index &&
               combinedOver(v) != Combined::None);
    break;
  case Phase::Backward:
    allowed = (where.phase == Phase::Backward && from.index >= where.index) ||
              (where.phase == Phase::Update && rankOf(from) == where.index);
    break;
  case Phase::Update:
    allowed = where.phase == Phase::Update;
    break;
  case Phase::Leaf:
    break;
  }
  if (!allowed)
    return def->emitError()
           << "pipeline split: a value of "
           << (from.phase == Phase::Backward ? "backward" : "forward/update")
           << " chunk/rank " << from.index
           << " is read where the schedule cannot deliver it (phase "
           << static_cast<int>(where.phase) << ", " << where.index << ")";
  // Where the value must first reach another function of the reader's
  // rank, it comes through that one.
  auto through = [&](const Place &via) -> FailureOr<Value> {
    FailureOr<Value> there = valueIn(functionFor(via), via, v);
    if (failed(there))
      return failure();
    Value local = transfer(functionFor(via), via, fn, where, *there, v);
    fn.map.map(v, local);
    return local;
  };
  // A forward value of another chunk read by a backward comes through the
  // backward's own forward, as a residual.
  if (from.phase == Phase::Forward && where.phase == Phase::Backward &&
      from.index != where.index) {
    if (from.index > where.index)
      return def->emitError("pipeline split: a backward reads the forward "
                            "of a later chunk");
    return through(Place{Phase::Forward, where.index});
  }
  // A value for a later chunk of its own stage (interleaved: chunk c and
  // c + stages; an MoE layer's auxiliary loss, added to the loss chunks
  // later, and its gradient coming back) is relayed by the chunk next to
  // the reader's on its way: transfers go between stages, and adjacent
  // chunks are on adjacent stages.
  if (from.phase == where.phase &&
      (where.phase == Phase::Forward || where.phase == Phase::Backward) &&
      from.index != where.index && rankOf(from) == rankOf(where) && stages_ > 1)
    return through(Place{where.phase, where.phase == Phase::Forward
                                          ? where.index - 1
                                          : where.index + 1});
  StageFunction &source = functionFor(from);
  Value local = transfer(source, from, fn, where, source.map.lookup(v), v);
  fn.map.map(v, local);
  return local;
}

void Cutter::finish(StageFunction &fn) {
  OpBuilder::InsertionGuard guard(b_);
  b_.setInsertionPointToEnd(fn.body);
  func::ReturnOp::create(b_, fn.fn.getLoc(), fn.results);
  SmallVector<Type> types;
  for (Value v : fn.results)
    types.push_back(v.getType());
  fn.fn.setType(b_.getFunctionType(fn.body->getArgumentTypes(), types));
  fn.fn.setAllResultAttrs(fn.resultAttrs);
}

/// A gather partition added whose every reader is in one later chunk (of
/// the same phase) runs there instead: the stages exchange the shard, not
/// the gathered whole — Megatron's scatter/gather of pipeline transfers,
/// which here also spares sending both when the chunk reads the shard
/// too. Data flows as before (a shard moves the way its gather's result
/// did), so the schedule's dependencies do not change. The reshapes of a
/// gathered value partition added (one gather read in two shapes) go
/// first, the same way, so that they do not hold the gather back.
void Cutter::sinkGathersToReaders(ArrayRef<Operation *> ops) {
  for (Operation *op : llvm::reverse(ops)) {
    Place &at = places_[op];
    if (!isa<AllGatherOp, ReshapeOp>(op) ||
        op->hasAttr(ErnieDialect::kStageAttrName) ||
        (at.phase != Phase::Forward && at.phase != Phase::Backward) ||
        op->use_empty())
      continue;
    std::optional<Place> readers;
    for (Operation *user : op->getUsers()) {
      auto it = places_.find(user);
      if (it == places_.end() || (readers && !(*readers == it->second))) {
        readers.reset();
        break;
      }
      readers = it->second;
    }
    // Later in the flow: up the chunks forward, down them backward.
    if (readers && readers->phase == at.phase &&
        (at.phase == Phase::Forward ? readers->index > at.index
                                    : readers->index < at.index))
      at = *readers;
  }
}

/// State the step updates outside the optimizer — a delayed-fp8 amax
/// history, rolled where a forward or backward quantises — would otherwise
/// be returned by a function the runtime calls once per micro-batch. Its
/// update moves into the update of its rank, once per step, from the state
/// itself and the maxima the micro-batches hand over: exactly the history
/// of the step run whole, whose amax is the maximum over the batch.
LogicalResult Cutter::updateStateOncePerStep(func::FuncOp step) {
  auto ret = cast<func::ReturnOp>(step.getBody().front().getTerminator());
  for (auto [i, state] : llvm::enumerate(ret.getOperands())) {
    auto name =
        step.getResultAttrOfType<StringAttr>(i, ErnieDialect::kUpdatesAttrName);
    Place at = placeOf(state);
    if (!name || (at.phase != Phase::Forward && at.phase != Phase::Backward))
      continue;
    Place update{Phase::Update, rankOf(at)};
    llvm::SetVector<Operation *> moved;
    SmallVector<Value> work{state};
    while (!work.empty()) {
      Value v = work.pop_back_val();
      if (auto arg = dyn_cast<BlockArgument>(v)) {
        if (batchIndex_[arg.getArgNumber()] >= 0)
          return ret.emitError()
                 << "pipeline split: state '" << name.getValue()
                 << "' is updated from the batch by more than a maximum or "
                    "a sum over it; a pipeline sees the batch one micro-batch "
                    "at a time and combines only gradients (averaged), "
                    "maxima and sums over the batch's data";
        continue;
      }
      Place p = placeOf(v);
      if (p.phase == Phase::Leaf || p.phase == Phase::Update ||
          combinedOver(v) != Combined::None)
        continue; // Rebuilt, already there, or handed over.
      Operation *def = v.getDefiningOp();
      if (!moved.insert(def))
        continue;
      if (!isMemoryEffectFree(def))
        return def->emitError()
               << "pipeline split: state '" << name.getValue()
               << "' is updated through an op with effects";
      llvm::append_range(work, def->getOperands());
    }
    for (Operation *op : moved)
      for (Operation *user : op->getUsers())
        if (user != ret && !moved.contains(user) &&
            places_.lookup(user).phase != Phase::Update)
          return op->emitError()
                 << "pipeline split: state '" << name.getValue()
                 << "' is updated through a value its micro-batch also "
                    "reads; a pipeline updates state once per step";
    for (Operation *op : moved)
      places_[op] = update;
  }
  return success();
}

LogicalResult Cutter::cut(func::FuncOp step, StringRef prefix,
                          const llvm::DenseSet<Operation *> &update,
                          int64_t microBatches) {
  step_ = step;
  prefix_ = prefix.str();
  microBatches_ = microBatches;
  Block &body = step.getBody().front();
  int64_t k = 0;
  for (unsigned i = 0; i < step.getNumArguments(); ++i) {
    bool batch = !step.getArgAttr(i, ErnieDialect::kParamAttrName) &&
                 !step.getArgAttr(i, ErnieDialect::kOptStateAttrName) &&
                 !step.getArgAttr(i, ErnieDialect::kLearningRateAttrName) &&
                 !step.getArgAttr(i, ErnieDialect::kStepAttrName);
    batchIndex_.push_back(batch ? k++ : -1);
  }
  if (failed(classify(step, update)))
    return failure();
  findBatchDims(step);

  // Sums over data parallelism at the end of a gradient commute with the
  // runtime's sum over micro-batches: they run once, in the update, instead
  // of once per micro-batch. Not a reduce-scatter (ZeRO-2/3's gradient):
  // hoisted, the micro-batches' sum would be held whole, which is the
  // memory ZeRO-2 exists to save; each micro-batch scatters its gradient
  // and the shards are summed, as DeepSpeed's ZeRO-2 does under gradient
  // accumulation.
  SmallVector<Operation *> ops;
  for (Operation &op : body.without_terminator())
    ops.push_back(&op);
  auto gatheredWhole = [](Operation *user) {
    if (isa<AllGatherOp>(user))
      return true;
    auto ar = dyn_cast<AllReduceOp>(user);
    return ar && ar.getKind() == ReduceKind::sum && !ar->use_empty() &&
           llvm::all_of(ar->getUsers(),
                        [](Operation *u) { return isa<AllGatherOp>(u); });
  };
  for (Operation *op : llvm::reverse(ops)) {
    Place &p = places_[op];
    if (p.phase != Phase::Backward)
      continue;
    // Ops of one operand that commute with a sum: the all-reduces, and the
    // data movement between them (a tied weight's transposed gradient).
    bool linear = isa<AllGatherOp, TransposeOp, ReshapeOp>(op);
    if (auto ar = dyn_cast<AllReduceOp>(op))
      linear = ar.getKind() == ReduceKind::sum;
    // A sum reduce-scatter that is only gathered whole again, directly or
    // after an all-reduce over other axes: an all-reduce in pieces (the
    // planner's for a sum pending over two axes, a sequence-parallel
    // norm's weight gradient over mp and dp). Moved, it holds no more
    // than the gather it feeds did, and runs once per step instead of
    // once per micro-batch.
    if (auto rs = dyn_cast<ReduceScatterOp>(op))
      linear = rs.getKind() == ReduceKind::sum &&
               llvm::all_of(rs->getUsers(), gatheredWhole);
    // A float cast (a norm's f32 weight gradient rounded to its bf16
    // parameter): moved, the micro-batches are summed before the rounding,
    // as the runtime sums them in f32 anyway, instead of each rounded.
    if (auto cast = dyn_cast<CastOp>(op))
      linear = isa<FloatType>(getElementTypeOrSelf(cast.getOperand().getType())) &&
               isa<FloatType>(getElementTypeOrSelf(cast.getType()));
    if (!linear || op->use_empty() ||
        !llvm::all_of(op->getUsers(), [&](Operation *user) {
          return places_.lookup(user).phase == Phase::Update;
        }))
      continue;
    p = Place{Phase::Update, rankOf(p)};
  }
  sinkGathersToReaders(ops);
  if (failed(updateStateOncePerStep(step)))
    return failure();

  for (Operation *op : ops) {
    Place where = places_.lookup(op);
    if (where.phase == Phase::Leaf)
      continue; // Rebuilt where read.
    StageFunction &fn = functionFor(where);
    for (Value operand : op->getOperands())
      if (failed(valueIn(fn, where, operand)))
        return failure();
    OpBuilder::InsertionGuard guard(b_);
    b_.setInsertionPointToEnd(fn.body);
    if (auto reduce = dyn_cast<AllReduceOp>(op);
        reduce && where.phase == Phase::Update && reduceInF32_)
      if (Value narrowed = reduceWide(fn, reduce)) {
        fn.map.map(reduce.getResult(), narrowed);
        continue;
      }
    Operation *copy = b_.clone(*op, fn.map);
    copy->removeAttr(ErnieDialect::kStageAttrName);
    copy->removeAttr(ErnieDialect::kBackwardAttrName);
  }

  // The step's results: the loss from the last chunk, new state from the
  // updates.
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  // An update takes every state it replaces, read or not (a count of this
  // step's dropped tokens is not): that is where the runtime holds it, and
  // where init creates it.
  auto holdState = [&](StageFunction &fn, Attribute name) {
    for (BlockArgument arg : step.getArguments())
      if (step.getArgAttr(arg.getArgNumber(),
                          ErnieDialect::kOptStateAttrName) == name)
        argumentIn(fn, arg);
  };
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    Place p = placeOf(v);
    NamedAttrList attrs(step.getResultAttrDict(i));
    Attribute updates = attrs.get(ErnieDialect::kUpdatesAttrName);
    if (p.phase == Phase::Leaf)
      return ret.emitError() << "pipeline split: result #" << i
                             << " is computed on no stage";
    if (attrs.get(ErnieDialect::kLossAttrName) &&
        (p.phase != Phase::Forward || p.index != chunks_ - 1))
      return ret.emitError("pipeline split: the loss is not computed on the "
                           "last chunk's forward");
    if (auto metric = dyn_cast_or_null<StringAttr>(
            attrs.get(ErnieDialect::kMetricAttrName));
        metric && p.phase != Phase::Update)
      return ret.emitError() << "pipeline split: metric '" << metric.getValue()
                             << "' is computed per micro-batch; a pipelined "
                                "step reports only what its update computes";
    if (updates && (p.phase == Phase::Forward || p.phase == Phase::Backward)) {
      // New state that is itself a micro-batch's maximum or sum: the update
      // takes the step's (updateStateOncePerStep moved everything else).
      if (combinedOver(v) == Combined::None)
        return ret.emitError() << "pipeline split: state '" << updates
                               << "' would be updated once per micro-batch";
      Place update{Phase::Update, rankOf(p)};
      StageFunction &fn = functionFor(update);
      holdState(fn, updates);
      FailureOr<Value> there = valueIn(fn, update, v);
      if (failed(there))
        return failure();
      addResult(fn, *there, attrs);
      continue;
    }
    StageFunction &fn = functionFor(p);
    if (updates)
      holdState(fn, updates);
    addResult(fn, fn.map.lookup(v), attrs);
  }
  for (StageFunction *fn : order_)
    finish(*fn);
  // A gradient sum only whose shard the update reads (ZeRO-1) becomes a
  // reduce-scatter: slice(cast(all_reduce)) -> cast(reduce_scatter).
  RewritePatternSet patterns(module_.getContext());
  ShardSliceOp::getCanonicalizationPatterns(patterns, module_.getContext());
  SmallVector<Operation *> slices;
  for (auto &[key, fn] : functions_)
    if (key.first == int(Phase::Update))
      fn.fn.walk([&](ShardSliceOp slice) { slices.push_back(slice); });
  // Only the slices and what they create; nothing else is folded here.
  GreedyRewriteConfig config;
  config.setStrictness(GreedyRewriteStrictness::ExistingAndNewOps)
      .enableFolding(false)
      .enableConstantCSE(false);
  (void)applyOpPatternsGreedily(slices, std::move(patterns), config);
  return success();
}

/// A data-parallel sum of a gradient the runtime accumulated in f32 and
/// the update narrowed: the sum of the f32 means instead, narrowed once
/// (Megatron's f32 main grads, reduced in f32). Null where the input is
/// not such a narrowing.
Value Cutter::reduceWide(StageFunction &fn, AllReduceOp reduce) {
  CastOp narrow = getNarrowingCast(fn.map.lookupOrNull(reduce.getInput()));
  if (!narrow || (reduce.getKind() != ReduceKind::sum &&
                  reduce.getKind() != ReduceKind::avg))
    return {};
  Value wide = narrow.getOperand();
  if (!getElementTypeOrSelf(wide.getType()).isF32() ||
      wide.getParentBlock() != fn.body)
    return {};
  Location loc = reduce.getLoc();
  Value summed =
      AllReduceOp::create(b_, loc, wide.getType(), wide, reduce.getMeshAttr(),
                          reduce.getAxesAttr(), reduce.getKindAttr());
  return CastOp::create(b_, loc, reduce.getType(), summed);
}

/// The matmul whose product `g` is, seen through a widening float cast
/// (bf16 -> f32: the runtime's f32 sum of a narrow gradient), when nothing
/// reads the product or its widening any more (`g` was detached from its
/// one reader): a GEMM that may add into the running sum itself. Null
/// otherwise.
MatmulOp unreadProduct(Value g) {
  if (!g.use_empty())
    return {};
  Value product = g;
  if (auto cast = g.getDefiningOp<CastOp>()) {
    auto from = dyn_cast<FloatType>(getElementTypeOrSelf(cast.getOperand()));
    auto to = dyn_cast<FloatType>(getElementTypeOrSelf(cast.getType()));
    if (!from || !to || !to.isF32() || from.getWidth() >= 32 ||
        !cast.getOperand().hasOneUse())
      return {};
    product = cast.getOperand();
  }
  auto matmul = product.getDefiningOp<MatmulOp>();
  if (!matmul || !isa<Float64Type, Float32Type, Float16Type, BFloat16Type>(
                     getElementTypeOrSelf(product)))
    return {};
  return matmul;
}

/// Sets `b` after `op` or after `sum`'s definition, whichever is later in
/// the block (`op` is in it; `sum` is an argument or defined in it).
void setAfterBoth(OpBuilder &b, Operation *op, Value sum) {
  Operation *def = sum.getDefiningOp();
  b.setInsertionPointAfter(def && op->isBeforeInBlock(def) ? def : op);
}

/// `sum + g`, where `g` was just detached from its one reader and `before`
/// will read the result. `intoGemms`: a GEMM's product (widened or not)
/// that nothing else reads adds into the sum itself (`matmul_accumulate`),
/// the terms of an add that nothing else reads each in turn (a shared
/// weight's two GEMMs: (sum + a) + b, reassociated). Anything else, and
/// everything without `intoGemms`, through an add.
Value accumulateInto(Value sum, Value g, Operation *before, bool intoGemms) {
  OpBuilder b(before);
  if (MatmulOp matmul = intoGemms ? unreadProduct(g) : MatmulOp()) {
    setAfterBoth(b, matmul, sum);
    Value added = MatmulAccumulateOp::create(
        b, matmul.getLoc(), matmul.getLhs(), matmul.getRhs(), sum,
        matmul.getTransposeAAttr(), matmul.getTransposeBAttr());
    if (Operation *cast = g.getDefiningOp(); cast != matmul)
      cast->erase();
    matmul.erase();
    return added;
  }
  // The terms of an add, each in turn; a narrow add under the widening
  // cast (a bf16 shared weight's two GEMMs) is taken apart too, each term
  // widened on its own, so its GEMMs add into the f32 sum unrounded.
  auto widened = g.getDefiningOp<CastOp>();
  Value terms = widened && widened.getType() == sum.getType() &&
                        isa<FloatType>(getElementTypeOrSelf(g))
                    ? widened.getOperand()
                    : g;
  auto add = terms.getDefiningOp<AddOp>();
  if (intoGemms && add && g.use_empty() && (terms == g || terms.hasOneUse()) &&
      add.getLhs() != add.getRhs() &&
      getElementTypeOrSelf(add.getType()).getIntOrFloatBitWidth() <=
          getElementTypeOrSelf(sum.getType()).getIntOrFloatBitWidth()) {
    SmallVector<Value, 2> parts{add.getLhs(), add.getRhs()};
    if (terms != g)
      g.getDefiningOp()->erase();
    add.erase();
    for (Value &part : parts)
      if (part.getType() != sum.getType()) {
        OpBuilder at(before);
        if (Operation *def = part.getDefiningOp())
          at.setInsertionPointAfter(def);
        else
          at.setInsertionPointToStart(before->getBlock());
        part = CastOp::create(at, part.getLoc(), sum.getType(), part);
      }
    for (Value part : parts)
      sum = accumulateInto(sum, part, before, true);
    return sum;
  }
  // At the end, where the return read g: a gradient's trailing collective
  // (one the update did not take) stays last before its reader, so that
  // --ernie-bucket-gradients may still start it early and wait here.
  return AddOp::create(b, g.getLoc(), sum, g);
}

/// Each gradient `backward` returns becomes the running sum over the step's
/// micro-batches: the function takes the sum so far (an argument named as
/// the result, `ernie.gradient`) and returns it with this micro-batch's
/// gradient added (accumulateInto). With `intoGemms` a weight gradient's
/// GEMM adds into it directly (in f32 for bf16 operands: Megatron's
/// gradient accumulation fusion); without, an add does (Megatron without
/// it: main_grad.add_(grad)). The memory plan writes either over the sum
/// in place. The runtime passes zeros on the first micro-batch and the
/// result back as the sum.
void accumulateGradients(func::FuncOp backward, bool intoGemms) {
  Block &body = backward.getBody().front();
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  Builder b(backward.getContext());
  for (unsigned i = 0; i < backward.getNumResults(); ++i) {
    auto name = backward.getResultAttrOfType<StringAttr>(
        i, ErnieDialect::kGradientAttrName);
    if (!name)
      continue;
    Value g = ret.getOperand(i);
    BlockArgument sum = appendArgument(
        backward, g.getType(),
        b.getDictionaryAttr(
            b.getNamedAttr(ErnieDialect::kGradientAttrName, name)),
        g.getLoc());
    // Detached from the return: accumulateInto sees who else reads it.
    ret.setOperand(i, sum);
    ret.setOperand(i, accumulateInto(sum, g, ret, intoGemms));
  }
}

StringRef paramName(func::FuncOp fn, unsigned i) {
  return fn.getArgAttrOfType<StringAttr>(i, ErnieDialect::kParamAttrName)
      .getValue();
}

struct PipelineSchedulePass
    : mlir::ernie::impl::PipelineSchedulePassBase<PipelineSchedulePass> {
  using PipelineSchedulePassBase::PipelineSchedulePassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    FailureOr<std::optional<PipelineInfo>> read = readPipelineInfo(module);
    if (failed(read))
      return signalPassFailure();
    if (!*read) {
      module.emitError("no pipeline to schedule: run --ernie-pipeline-split "
                       "before autodiff");
      return signalPassFailure();
    }
    if (microBatches < 1 || microBatches > MeshOp::kMaxRanks) {
      module.emitError() << "a pipeline needs micro-batches >= 1 and <= "
                         << MeshOp::kMaxRanks << ", not "
                         << int64_t(microBatches);
      return signalPassFailure();
    }
    if (accumulate != "gemm" && accumulate != "add" &&
        accumulate != "runtime") {
      module.emitError() << "accumulate is gemm, add or runtime, not '"
                         << accumulate << "'";
      return signalPassFailure();
    }
    if (gradReduce != "f32" && gradReduce != "native") {
      module.emitError() << "grad-reduce is f32 or native, not '" << gradReduce
                         << "'";
      return signalPassFailure();
    }
    // What this pass will record, checked (the schedule's size included)
    // by the same reader before anything is built from it.
    Builder b(module.getContext());
    NamedAttrList info(
        module->getAttrOfType<DictionaryAttr>(ErnieDialect::kPipelineAttrName));
    info.set("micro_batches", b.getI64IntegerAttr(microBatches));
    info.set("schedule", b.getStringAttr(schedule));
    DictionaryAttr scheduled = info.getDictionary(b.getContext());
    if (failed(
            parsePipelineInfo(scheduled, [&] { return module.emitError(); })))
      return signalPassFailure();
    rt::PipelineShape shape;
    shape.stages = (*read)->stages;
    shape.virtualStages = (*read)->virtualStages;
    shape.microBatches = microBatches;
    rt::PipelineSchedule steps;
    if (failed(buildOrReadSchedule(module, shape, steps)))
      return signalPassFailure();

    int64_t channel = 0;
    auto train = module.lookupSymbol<func::FuncOp>("train_step");
    auto eval = module.lookupSymbol<func::FuncOp>("eval_step");
    if (!train) {
      module.emitError("a pipelined program needs @train_step (autodiff with "
                       "an optimizer)");
      return signalPassFailure();
    }
    // The step's own ops are the update; then the gradient (and the
    // evaluation's forward) are inlined, without canonicalizing.
    llvm::DenseSet<Operation *> update;
    for (Operation &op : train.getBody().front().without_terminator())
      if (!isa<func::CallOp>(op))
        update.insert(&op);
    OpPassManager inline_(ModuleOp::getOperationName());
    inline_.addPass(createInlinerPass({}, [](OpPassManager &) {}));
    if (failed(runPipeline(inline_, module)))
      return signalPassFailure();
    if (failed(Cutter(module, shape.stages, shape.chunks(), channel,
                      gradReduce == "f32")
                   .cut(train, "train", update, microBatches)))
      return signalPassFailure();
    if (eval && failed(Cutter(module, shape.stages, shape.chunks(), channel)
                           .cut(eval, "eval", {}, 1)))
      return signalPassFailure();
    if (failed(buildInit(module, train)))
      return signalPassFailure();
    // Everything else was inlined into the stage functions.
    for (auto fn : llvm::to_vector(module.getOps<func::FuncOp>()))
      if (!fn->hasAttr(ErnieDialect::kPipelineStageAttrName))
        fn.erase();
    if (accumulate != "runtime")
      for (int64_t c = 0; c < shape.chunks(); ++c)
        if (auto backward = module.lookupSymbol<func::FuncOp>(
                "train_backward." + std::to_string(c)))
          accumulateGradients(backward, accumulate == "gemm");
    numberStageCollectives(module, channel);

    module->setAttr(ErnieDialect::kPipelineAttrName, scheduled);
    SmallVector<Attribute> perRank;
    for (const auto &rankSteps : steps)
      perRank.push_back(b.getStringAttr(rt::formatSteps(rankSteps)));
    module->setAttr(ErnieDialect::kPipelineScheduleAttrName,
                    b.getArrayAttr(perRank));
  }

  LogicalResult buildOrReadSchedule(ModuleOp module,
                                    const rt::PipelineShape &shape,
                                    rt::PipelineSchedule &steps) {
    std::string error;
    if (schedule == "custom") {
      auto given = module->getAttrOfType<ArrayAttr>(
          ErnieDialect::kPipelineScheduleAttrName);
      if (!given)
        return module.emitError("schedule=custom needs the module's '")
               << ErnieDialect::kPipelineScheduleAttrName
               << "': one string of steps per pipeline rank";
      for (Attribute a : given) {
        auto text = dyn_cast<StringAttr>(a);
        if (!text)
          return module.emitError("schedule entries are strings");
        steps.emplace_back();
        error = rt::parseSteps(text.getValue().str(), steps.back());
        if (!error.empty())
          return module.emitError() << error;
      }
    } else {
      rt::ScheduleKind kind;
      if (!rt::parseScheduleKind(schedule, kind))
        return module.emitError() << "unknown pipeline schedule '" << schedule
                                  << "' (expected FThenB, 1F1B, interleaved "
                                     "or custom)";
      error = rt::buildSchedule(kind, shape, steps);
    }
    if (error.empty())
      error = rt::checkSchedule(steps, shape);
    if (!error.empty())
      return module.emitError() << error;
    return success();
  }

  /// @init.<r>: a shared parameter's replicas start as the group's first.
  LogicalResult buildInit(ModuleOp module, func::FuncOp train) {
    OpBuilder b(module.getContext());
    std::map<int64_t, SmallVector<unsigned>> byRank;
    std::set<StringRef> names; // channels: as autodiff numbered the sums
    for (unsigned i = 0; i < train.getNumArguments(); ++i) {
      if (!train.getArgAttr(i, ErnieDialect::kSharedStagesAttrName))
        continue;
      // The verifier holds shared replicas to be parameters; the rank is
      // --ernie-shared-weight-dedup's.
      auto rank = train.getArgAttrOfType<IntegerAttr>(
          i, ErnieDialect::kPipelineRankAttrName);
      if (!rank || !train.getArgAttr(i, ErnieDialect::kParamAttrName))
        return train.emitError()
               << "argument #" << i << " is a shared-weight replica ('"
               << ErnieDialect::kSharedStagesAttrName << "') without '"
               << ErnieDialect::kParamAttrName << "' and '"
               << ErnieDialect::kPipelineRankAttrName
               << "': run --ernie-shared-weight-dedup before autodiff";
      names.insert(paramName(train, i));
      byRank[rank.getInt()].push_back(i);
    }
    for (auto &[rank, args] : byRank) {
      b.setInsertionPoint(train);
      auto fn = func::FuncOp::create(b, train.getLoc(),
                                     "init." + std::to_string(rank),
                                     b.getFunctionType({}, {}));
      fn->setAttr(ErnieDialect::kPipelineStageAttrName,
                  b.getI64IntegerAttr(rank));
      Block *body = fn.addEntryBlock();
      b.setInsertionPointToEnd(body);
      SmallVector<Value> results;
      SmallVector<DictionaryAttr> resultAttrs;
      for (unsigned i : args) {
        BlockArgument arg = appendArgument(fn, train.getArgumentTypes()[i],
                                           train.getArgAttrDict(i),
                                           train.getLoc());
        auto group = train.getArgAttrOfType<DenseI64ArrayAttr>(
            i, ErnieDialect::kSharedStagesAttrName);
        results.push_back(StageBroadcastOp::create(
            b, train.getLoc(), arg, group.asArrayRef(),
            int64_t(std::distance(names.begin(),
                                  names.find(paramName(train, i))))));
        NamedAttrList attrs;
        attrs.set(ErnieDialect::kUpdatesAttrName,
                  train.getArgAttr(i, ErnieDialect::kParamAttrName));
        if (Attribute layout = train.getArgAttr(i, kShardOfAttrName))
          attrs.set(kShardOfAttrName, layout);
        resultAttrs.push_back(attrs.getDictionary(b.getContext()));
      }
      func::ReturnOp::create(b, train.getLoc(), results);
      fn.setType(b.getFunctionType(body->getArgumentTypes(),
                                   ValueRange(results).getTypes()));
      fn.setAllResultAttrs(resultAttrs);
    }
    return success();
  }

  /// Stage collectives carry their parameter's index among the shared
  /// names (the same on every member); move them past the transfers'
  /// channels, sums and broadcasts apart.
  void numberStageCollectives(ModuleOp module, int64_t channel) {
    int64_t shared = 0;
    module.walk([&](StageBroadcastOp op) {
      shared = std::max<int64_t>(shared, op.getChannel() + 1);
    });
    module.walk([&](StageAllReduceOp op) {
      shared = std::max<int64_t>(shared, op.getChannel() + 1);
    });
    module.walk([&](StageAllReduceOp op) {
      op.setChannel(channel + op.getChannel());
    });
    module.walk([&](StageBroadcastOp op) {
      op.setChannel(channel + shared + op.getChannel());
    });
  }
};

} // namespace

//===- Fuse.cpp - elementwise chains into ernie.fused regions -------------===//
//
// One forward walk per function body. Each op either joins (merging) the
// open groups its operands come from, starts a group, or — not fusible —
// closes the groups it reads. A group is open while no op outside it has
// read its values, so all of it can move down to where its last member is;
// that is where its ernie.fused op goes. Communication closes every group,
// so a region never straddles a collective or a pipeline transfer.
//
// Before the walk, a loss and its gradient over the same logits become one
// ernie.cross_entropy_and_grad (one pass over the logits, each exponential
// computed once) — in a function, or across a pipeline's last chunk, whose
// forward then keeps the gradient for its backward; elementwise math on
// broadcasts moves before the broadcast (computed once per source element, not
// per copy); and a constant or a broadcast read by several ops gets a copy per
// reader, so each region fills or loads its own instead of reading another's,
// written in full.
//
//===----------------------------------------------------------------------===//

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/RegionUtils.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SetVector.h"

#include <memory>

namespace mlir::ernie {
#define GEN_PASS_DEF_FUSEPASS
#include "ernie/Passes/Passes.h.inc"
} // namespace mlir::ernie

using namespace mlir;
using namespace mlir::ernie;

namespace {

struct Group {
  SmallVector<Operation *> ops; // program order
  SmallVector<int64_t> shape;   // the iteration shape
  FusedCompute compute = FusedCompute::Any;
  bool open = true;
  Group *mergedInto = nullptr;
};

/// Ops that talk to other ranks: no region spans one.
bool communicates(Operation *op) {
  return isStartedCollective(op) ||
         isa<AllReduceOp, AllGatherOp, ReduceScatterOp, AllToAllOp, WaitOp,
             SendOp, RecvOp, StageAllReduceOp, StageBroadcastOp>(op);
}

/// The shape an op iterates over inside a region: a reduction's input's,
/// any other member's result's.
ArrayRef<int64_t> iterationShapeOf(Operation *op, FusedRole role) {
  Value v = role == FusedRole::Reduction ? op->getOperand(0) : op->getResult(0);
  return cast<RankedTensorType>(v.getType()).getShape();
}

/// Whether `loss` computes the loss `grad` is the gradient of, given the
/// logits and labels `grad` reads as they are seen where `loss` is.
bool isLossOf(CrossEntropyOp loss, CrossEntropyGradOp grad, Value logits,
              Value labels) {
  return loss.getLogits() == logits && loss.getLabels() == labels &&
         loss.getIgnoreIndex() == grad.getIgnoreIndex() &&
         loss.getReduction() == grad.getReduction();
}

/// Replaces `loss` with one cross_entropy_and_grad that also computes what
/// `grad` does, from the loss's logits and labels and `seed` (defined before
/// the loss); returns the gradient.
Value pairAtLoss(RewriterBase &rewriter, CrossEntropyOp loss,
                 CrossEntropyGradOp grad, Value seed) {
  rewriter.setInsertionPoint(loss);
  auto both = CrossEntropyAndGradOp::create(
      rewriter, rewriter.getFusedLoc({loss.getLoc(), grad.getLoc()}),
      loss.getLogits(), loss.getLabels(), seed, grad.getIgnoreIndexAttr(),
      grad.getReductionAttr());
  rewriter.replaceOp(loss, both.getLoss());
  return both.getDlogits();
}

/// Each cross_entropy_grad whose loss the block also computes (same logits,
/// labels and attributes) becomes, with it, one cross_entropy_and_grad where
/// the loss was. A seed (dloss) the step computes after the loss moves up
/// with what it is computed from — unless that reads the loss itself, or
/// talks to another pipeline stage. A collective within a group (pure) may
/// move: every member runs this same function and moves it alike. A send,
/// receive or cross-stage collective has effects, which moveValueDefinitions
/// does not move past: the other stage's function would not move its side.
void pairLossesWithGradients(Block &block) {
  IRRewriter rewriter(block.getParentOp()->getContext());
  for (auto grad :
       llvm::make_early_inc_range(block.getOps<CrossEntropyGradOp>())) {
    CrossEntropyOp loss;
    for (Operation *user : grad.getLogits().getUsers())
      if (auto ce = dyn_cast<CrossEntropyOp>(user);
          ce && ce->getBlock() == &block && ce->isBeforeInBlock(grad) &&
          isLossOf(ce, grad, grad.getLogits(), grad.getLabels()))
        loss = ce;
    if (!loss)
      continue;
    // Fails, moving nothing, when the seed's definition reads the loss or
    // has effects.
    if (failed(moveValueDefinitions(rewriter, grad.getDloss(), loss)))
      continue;
    rewriter.replaceOp(grad, pairAtLoss(rewriter, loss, grad, grad.getDloss()));
  }
}

/// In a pipeline the last chunk's forward computes the loss and its
/// backward the gradient, from the logits the forward keeps as a residual
/// and a seed computed from residuals (1 / the step's token count). The
/// forward computes both instead (cross_entropy_and_grad: the logits read
/// once, each exponential computed once) and keeps the gradient under the
/// logits' residual name, so no signature changes: the runtime hands the
/// backward the gradient where it handed it the logits. Only where the
/// gradient is the backward's one reader of that residual, the labels are
/// the same batch input, and the seed is arithmetic without effects on
/// residuals, inputs and constants that can move above the loss.
void pairLossesAcrossChunks(ModuleOp module) {
  SymbolTable symbols(module);
  IRRewriter rewriter(module.getContext());
  for (auto bwd : module.getOps<func::FuncOp>()) {
    StringRef chunk = bwd.getName();
    if (bwd.isExternal() || !chunk.consume_front("train_backward."))
      continue;
    auto fwd = symbols.lookup<func::FuncOp>(("train_forward." + chunk).str());
    if (!fwd || fwd.isExternal())
      continue;
    Block &fwdBody = fwd.getBody().front(), &bwdBody = bwd.getBody().front();
    auto fwdRet = cast<func::ReturnOp>(fwdBody.getTerminator());
    // The forward's result kept as the residual `name`.
    auto residualResult = [&](Attribute name) -> OpOperand * {
      for (OpOperand &result : fwdRet->getOpOperands())
        if (fwd.getResultAttr(result.getOperandNumber(),
                              ErnieDialect::kResidualAttrName) == name)
          return &result;
      return nullptr;
    };
    // A backward argument's value in the forward: the residual of its name
    // or the batch input of its index; null for anything else.
    auto inForward = [&](BlockArgument arg) -> Value {
      unsigned i = arg.getArgNumber();
      if (Attribute r = bwd.getArgAttr(i, ErnieDialect::kResidualAttrName)) {
        OpOperand *result = residualResult(r);
        return result ? result->get() : Value();
      }
      if (Attribute k = bwd.getArgAttr(i, ErnieDialect::kInputAttrName))
        for (BlockArgument a : fwdBody.getArguments())
          if (fwd.getArgAttr(a.getArgNumber(), ErnieDialect::kInputAttrName) ==
              k)
            return a;
      return {};
    };
    bool paired = false;
    for (auto grad :
         llvm::make_early_inc_range(bwdBody.getOps<CrossEntropyGradOp>())) {
      auto logitsArg = dyn_cast<BlockArgument>(grad.getLogits());
      auto labelsArg = dyn_cast<BlockArgument>(grad.getLabels());
      if (!logitsArg || !labelsArg || !logitsArg.hasOneUse())
        continue;
      Attribute residual = bwd.getArgAttr(logitsArg.getArgNumber(),
                                          ErnieDialect::kResidualAttrName);
      Value logits = inForward(logitsArg), labels = inForward(labelsArg);
      if (!residual || !logits || !labels)
        continue;
      CrossEntropyOp loss;
      for (Operation *user : logits.getUsers())
        if (auto ce = dyn_cast<CrossEntropyOp>(user);
            ce && ce->getBlock() == &fwdBody &&
            isLossOf(ce, grad, logits, labels))
          loss = ce;
      if (!loss)
        continue;
      // The seed's definition, in program order, and its leaves' values in
      // the forward.
      IRMapping map;
      llvm::SetVector<Operation *> slice;
      SmallVector<Value> work{grad.getDloss()};
      bool movable = true;
      while (movable && !work.empty()) {
        Value v = work.pop_back_val();
        if (auto arg = dyn_cast<BlockArgument>(v)) {
          Value there = inForward(arg);
          movable = bool(there);
          if (there)
            map.map(v, there);
          continue;
        }
        Operation *def = v.getDefiningOp();
        movable = def->getBlock() == &bwdBody && def->getNumRegions() == 0 &&
                  isMemoryEffectFree(def);
        if (movable && slice.insert(def))
          llvm::append_range(work, def->getOperands());
      }
      if (!movable)
        continue;
      SmallVector<Operation *> ordered(slice.begin(), slice.end());
      llvm::sort(ordered, [](Operation *a, Operation *b) {
        return a->isBeforeInBlock(b);
      });
      rewriter.setInsertionPoint(fwdRet);
      SmallVector<Operation *> clones;
      for (Operation *op : ordered)
        clones.push_back(rewriter.clone(*op, map));
      Value seed = map.lookupOrDefault(grad.getDloss());
      // Fails, moving nothing, when the seed reads the loss or what comes
      // from another stage.
      if (failed(moveValueDefinitions(rewriter, seed, loss))) {
        for (Operation *clone : llvm::reverse(clones))
          rewriter.eraseOp(clone);
        continue;
      }
      residualResult(residual)->set(pairAtLoss(rewriter, loss, grad, seed));
      rewriter.replaceOp(grad, logitsArg);
      for (Operation *op : llvm::reverse(ordered))
        if (op->use_empty())
          rewriter.eraseOp(op);
      paired = true;
    }
    if (!paired)
      continue;
    // What the backward no longer reads (the seed's residual, the labels)
    // it no longer takes, and the forward no longer keeps.
    llvm::BitVector unread(bwd.getNumArguments()), unkept(fwd.getNumResults());
    for (BlockArgument arg : bwdBody.getArguments()) {
      unsigned i = arg.getArgNumber();
      if (!arg.use_empty())
        continue;
      if (Attribute r = bwd.getArgAttr(i, ErnieDialect::kResidualAttrName)) {
        unread.set(i);
        if (OpOperand *result = residualResult(r))
          unkept.set(result->getOperandNumber());
      } else if (bwd.getArgAttr(i, ErnieDialect::kInputAttrName)) {
        unread.set(i);
      }
    }
    (void)bwd.eraseArguments(unread);
    for (int j = unkept.find_last(); j >= 0; j = unkept.find_prev(j))
      fwdRet->eraseOperand(j);
    (void)fwd.eraseResults(unkept);
  }
}

/// An elementwise op whose operands are all copies of smaller tensors —
/// broadcasts of one source shape along the same dims, or constants —
/// computes each value as often as it is copied: it computes on the sources
/// instead, and its result is broadcast. The same math on the same values,
/// so the same bits. A forward walk, so a chain (a norm's statistic scaled,
/// shifted, rsqrt'ed) sinks below its broadcast op by op. Not for narrow
/// floats: the sunk chain may end up in a region of its own, whose result
/// is rounded to bf16 where the region it left kept it in f32.
void sinkBroadcasts(Block &block) {
  IRRewriter rewriter(block.getParentOp()->getContext());
  auto narrow = [](Type t) {
    Type e = getElementTypeOrSelf(t);
    return isa<FloatType>(e) && e.getIntOrFloatBitWidth() < 32;
  };
  for (Operation &op : llvm::make_early_inc_range(block.without_terminator())) {
    if (getFusedRole(&op) != FusedRole::Elementwise ||
        op.getNumResults() != 1 || llvm::any_of(op.getOperandTypes(), narrow) ||
        narrow(op.getResult(0).getType()))
      continue;
    BroadcastOp like;
    bool copies = llvm::all_of(op.getOperands(), [&](Value v) {
      if (auto b = v.getDefiningOp<BroadcastOp>()) {
        if (!like)
          like = b;
        return b.getInput().getType().getShape() ==
                   like.getInput().getType().getShape() &&
               b.getDims() == like.getDims();
      }
      return isa_and_nonnull<FullOp>(v.getDefiningOp());
    });
    if (!copies || !like)
      continue;
    ArrayRef<int64_t> source =
        cast<RankedTensorType>(like.getInput().getType()).getShape();
    auto smaller = [&](Type t) {
      return RankedTensorType::get(source, getElementTypeOrSelf(t));
    };
    rewriter.setInsertionPoint(&op);
    SmallVector<Value> operands;
    for (Value v : op.getOperands()) {
      if (auto b = v.getDefiningOp<BroadcastOp>()) {
        operands.push_back(b.getInput());
        continue;
      }
      auto full = v.getDefiningOp<FullOp>();
      operands.push_back(FullOp::create(rewriter, full.getLoc(),
                                        smaller(v.getType()), full.getValue()));
    }
    Operation *small = rewriter.clone(op);
    small->setOperands(operands);
    small->getResult(0).setType(smaller(op.getResult(0).getType()));
    rewriter.replaceOpWithNewOp<BroadcastOp>(
        &op, op.getResult(0).getType(), small->getResult(0), like.getDims());
  }
}

/// Erases the constants and broadcasts nothing reads: those the sunk ops
/// read, and originals whose readers all took copies into their regions.
void eraseUnreadCopies(Block &block) {
  for (Operation &op : llvm::make_early_inc_range(llvm::reverse(block)))
    if (isa<BroadcastOp, FullOp>(op) && op.use_empty())
      op.erase();
}

bool computesCompatibly(FusedCompute a, FusedCompute b) {
  return a == FusedCompute::Any || b == FusedCompute::Any || a == b;
}

class Fuser {
public:
  void run(Block &block) {
    pairLossesWithGradients(block);
    sinkBroadcasts(block);
    // Before the walk: an unread broadcast of a group's value would close it.
    eraseUnreadCopies(block);
    copyCheapProducersPerReader(block);
    for (Operation &op : llvm::make_early_inc_range(block.without_terminator()))
      visit(&op);
    for (const std::unique_ptr<Group> &g : groups_)
      if (!g->mergedInto && g->ops.size() > 1)
        materialize(*g);
    for (auto [copy, original] : copies_) {
      copy->replaceAllUsesWith(original);
      copy->erase();
    }
    eraseUnreadCopies(block);
  }

private:
  /// A constant or a broadcast read by several ops (CSE merges equal ones)
  /// would become one region's result, written in full and read back by
  /// every other region. Each fusible reader gets its own copy instead,
  /// which its region computes in place (a fill, or a strided load of the
  /// broadcast's source). Copies that end up in no region go back to the
  /// original.
  void copyCheapProducersPerReader(Block &block) {
    for (Operation &producer :
         llvm::make_early_inc_range(block.without_terminator())) {
      if (!isa<FullOp, BroadcastOp>(producer))
        continue;
      llvm::SetVector<Operation *> readers(producer.user_begin(),
                                           producer.user_end());
      if (readers.size() < 2)
        continue;
      for (Operation *reader : readers) {
        FusedRole role = getFusedRole(reader);
        if (reader->getBlock() != &block || role == FusedRole::None ||
            role == FusedRole::Broadcast)
          continue;
        OpBuilder b(reader);
        Operation *copy = b.clone(producer);
        reader->replaceUsesOfWith(producer.getResult(0), copy->getResult(0));
        copies_[copy] = &producer;
      }
    }
  }

  Group *find(Group *g) {
    while (g && g->mergedInto)
      g = g->mergedInto;
    return g;
  }

  Group *groupOfValue(Value v) {
    Operation *def = v.getDefiningOp();
    return def ? find(groupOf_.lookup(def)) : nullptr;
  }

  void visit(Operation *op) {
    if (communicates(op)) {
      for (const std::unique_ptr<Group> &g : groups_)
        g->open = false;
      return;
    }
    FusedRole role = getFusedRole(op);
    FusedCompute compute =
        role == FusedRole::None ? FusedCompute::None : getFusedCompute(op);
    SmallVector<Group *> joined;
    auto consider = [&](Group *g) {
      if (!g || !g->open || llvm::is_contained(joined, g) ||
          ArrayRef<int64_t>(g->shape) != iterationShapeOf(op, role) ||
          !computesCompatibly(g->compute, compute))
        return;
      // Every joined group must agree with the others too.
      if (llvm::any_of(joined, [&](Group *j) {
            return !computesCompatibly(j->compute, g->compute);
          }))
        return;
      joined.push_back(g);
    };
    // A broadcast reads its operand from memory: never from a group.
    if (compute != FusedCompute::None && role != FusedRole::Broadcast) {
      for (Value operand : op->getOperands())
        if (Operation *def = operand.getDefiningOp();
            def && getFusedRole(def) != FusedRole::Reduction)
          consider(groupOfValue(operand));
      // Siblings: an open group that already reads one of the op's operands
      // whole. One loop then reads it once for both (the gradients of a
      // product, e.g. SwiGLU's, read the same upstream gradient).
      for (Value operand : op->getOperands())
        if (auto type = dyn_cast<RankedTensorType>(operand.getType());
            type && type.getShape() == iterationShapeOf(op, role))
          for (Group *g : readers_.lookup(operand))
            consider(find(g));
    }
    // Whatever the op reads from a group it does not join, it reads from
    // memory: that group cannot move past it any more.
    for (Value operand : op->getOperands())
      if (Group *g = groupOfValue(operand); g && !llvm::is_contained(joined, g))
        g->open = false;
    if (compute == FusedCompute::None)
      return;
    Group *target;
    if (joined.empty()) {
      groups_.push_back(std::make_unique<Group>());
      target = groups_.back().get();
      target->shape.assign(iterationShapeOf(op, role).begin(),
                           iterationShapeOf(op, role).end());
    } else {
      target = joined.front();
      for (Group *other : llvm::drop_begin(joined)) {
        target->ops.append(other->ops);
        if (other->compute != FusedCompute::Any)
          target->compute = other->compute;
        other->mergedInto = target;
      }
      // Members in program order: a merged group's ops interleave.
      llvm::sort(target->ops, [](Operation *a, Operation *b) {
        return a->isBeforeInBlock(b);
      });
    }
    if (compute != FusedCompute::Any)
      target->compute = compute;
    target->ops.push_back(op);
    groupOf_[op] = target;
    for (Value operand : op->getOperands())
      readers_[operand].push_back(target);
  }

  void materialize(Group &g) {
    llvm::SmallPtrSet<Operation *, 16> members(g.ops.begin(), g.ops.end());
    llvm::SetVector<Value> inputs;
    SmallVector<Value> outputs;
    for (Operation *op : g.ops) {
      for (Value operand : op->getOperands())
        if (!members.contains(operand.getDefiningOp()))
          inputs.insert(operand);
      for (Value result : op->getResults())
        if (llvm::any_of(result.getUsers(), [&](Operation *user) {
              return !members.contains(user);
            }))
          outputs.push_back(result);
    }
    if (outputs.empty())
      return; // dead: leave it to DCE
    Operation *last = g.ops.back();
    OpBuilder b(last);
    SmallVector<Location> locs;
    for (Operation *op : g.ops)
      locs.push_back(op->getLoc());
    Location loc = b.getFusedLoc(locs);
    SmallVector<Type> resultTypes;
    for (Value v : outputs)
      resultTypes.push_back(v.getType());
    auto fused =
        FusedOp::create(b, loc, resultTypes, inputs.getArrayRef());
    Block *body = b.createBlock(&fused.getBody());
    IRMapping map;
    for (Value in : inputs)
      map.map(in, body->addArgument(in.getType(), in.getLoc()));
    for (Operation *op : g.ops)
      b.clone(*op, map);
    SmallVector<Value> yielded;
    for (Value v : outputs)
      yielded.push_back(map.lookup(v));
    YieldOp::create(b, loc, yielded);
    if (llvm::all_of(g.ops, [](Operation *op) {
          return op->hasAttr(ErnieDialect::kRecomputedAttrName);
        }))
      fused->setAttr(ErnieDialect::kRecomputedAttrName, b.getUnitAttr());
    for (auto [old, now] : llvm::zip(outputs, fused.getResults()))
      old.replaceUsesWithIf(now, [&](OpOperand &use) {
        return !members.contains(use.getOwner());
      });
    for (Operation *op : llvm::reverse(g.ops)) {
      copies_.erase(op);
      op->erase();
    }
  }

  SmallVector<std::unique_ptr<Group>> groups_;
  DenseMap<Operation *, Group *> groupOf_;
  DenseMap<Value, SmallVector<Group *>> readers_; // value -> groups reading it
  llvm::MapVector<Operation *, Operation *> copies_; // copy -> original
};

struct FusePass : ernie::impl::FusePassBase<FusePass> {
  void runOnOperation() override {
    pairLossesAcrossChunks(getOperation());
    for (auto fn : getOperation().getOps<func::FuncOp>())
      if (!fn.isExternal())
        Fuser().run(fn.getBody().front());
  }
};

} // namespace

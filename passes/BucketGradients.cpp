//===- BucketGradients.cpp - gradients and ZeRO gathers in buckets ---------===//
//
// Partition leaves each data-parallel gradient's all-reduce (ZeRO-2/3: its
// reduce-scatter) at the return, after the whole backward, and ZeRO-1/2's
// gathers of the updated parameters at the end of the step: one collective
// per tensor, none overlapped. This pass groups them, in the order their
// inputs are ready, into buckets of about `bucket-bytes` (DDP's and
// Megatron's scheme), starts each bucket's one collective (`ernie.*_start`)
// right after the last of its inputs is computed, and waits for each result
// just before the return, its one reader. The communication thread moves a
// bucket while the rest of the step runs; the executor completes every
// started transfer before a blocking collective, so nothing else talks on
// the wire then.
//
//===----------------------------------------------------------------------===//

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/MapVector.h"

namespace mlir::ernie {
#define GEN_PASS_DEF_BUCKETGRADIENTSPASS
#include "ernie/Passes/Passes.h.inc"
} // namespace mlir::ernie

using namespace mlir;
using namespace mlir::ernie;

namespace {

int64_t bytesOf(Value v) {
  auto t = cast<RankedTensorType>(v.getType());
  return t.getNumElements() * getElementByteSize(t.getElementType());
}

/// Whether only the function's return reads `r`, and (with `gradient`) only
/// as results marked a gradient (`ernie.grad_of` by autodiff,
/// `ernie.gradient` by the pipeline schedule).
bool onlyReturned(Value r, func::FuncOp fn, bool gradient) {
  return !r.use_empty() && llvm::all_of(r.getUses(), [&](OpOperand &use) {
    // A pipelined backward's gradient is returned added to its running
    // sum (an `ernie.gradient` argument): the add is the return's reader.
    if (auto add = dyn_cast<AddOp>(use.getOwner()); add && gradient) {
      auto sum = dyn_cast<BlockArgument>(add->getOperand(1 - use.getOperandNumber()));
      return sum && fn.getArgAttr(sum.getArgNumber(),
                                  ErnieDialect::kGradientAttrName) &&
             onlyReturned(add.getResult(), fn, gradient);
    }
    if (!isa<func::ReturnOp>(use.getOwner()))
      return false;
    unsigned i = use.getOperandNumber();
    return !gradient || fn.getResultAttr(i, "ernie.grad_of") ||
           fn.getResultAttr(i, ErnieDialect::kGradientAttrName);
  });
}

/// The first op of `block` that reads `v` (itself or through an op nested
/// in it): where a wait for `v` must be at the latest.
Operation *firstReader(Value v, Block &block) {
  Operation *first = block.getTerminator();
  for (Operation *user : v.getUsers())
    if (Operation *top = block.findAncestorOpInBlock(*user);
        top && top->isBeforeInBlock(first))
      first = top;
  return first;
}

bool sumsOrAverages(ReduceKind kind) {
  return kind == ReduceKind::sum || kind == ReduceKind::avg;
}

/// A collective a bucket may take: a gradient's sum or mean (all-reduce or
/// reduce-scatter), or a gather that only the return reads.
bool isBucketable(Operation *op, func::FuncOp fn) {
  if (auto reduce = dyn_cast<AllReduceOp>(op))
    return sumsOrAverages(reduce.getKind()) &&
           onlyReturned(reduce.getResult(), fn, /*gradient=*/true);
  if (auto scatter = dyn_cast<ReduceScatterOp>(op))
    return sumsOrAverages(scatter.getKind()) &&
           onlyReturned(scatter.getResult(), fn, /*gradient=*/true);
  if (auto gather = dyn_cast<AllGatherOp>(op))
    return onlyReturned(gather.getResult(), fn, /*gradient=*/false);
  return false;
}

/// The bytes of the whole tensor a collective reduces or gathers.
int64_t wholeBytes(Operation *op) {
  return std::max(bytesOf(op->getOperand(0)), bytesOf(op->getResult(0)));
}

struct BucketGradientsPass
    : ernie::impl::BucketGradientsPassBase<BucketGradientsPass> {
  using BucketGradientsPassBase::BucketGradientsPassBase;

  void runOnOperation() override {
    if (accumulate != "f32" && accumulate != "native") {
      getOperation().emitError("--ernie-bucket-gradients: accumulate must be "
                               "'f32' or 'native', not '")
          << accumulate << "'";
      return signalPassFailure();
    }
    if (bucketBytes <= 0) {
      getOperation().emitError("--ernie-bucket-gradients: bucket-bytes must be "
                               "positive, not ")
          << bucketBytes;
      return signalPassFailure();
    }
    for (auto fn : getOperation().getOps<func::FuncOp>())
      if (!fn.isExternal())
        bucket(fn);
  }

  void bucket(func::FuncOp fn) {
    Block &block = fn.getBody().front();
    // Candidates by what one collective may carry together: the op, mesh,
    // axes, reduce kind and dimension (where it has them) and element type.
    using Key = std::tuple<OperationName, Attribute, Attribute, Attribute,
                           Attribute, Type>;
    llvm::MapVector<Key, SmallVector<Operation *>> groups, prefetched;
    auto keyOf = [](Operation &op) {
      return Key{op.getName(), op.getAttr("mesh"), op.getAttr("axes"),
                 op.getAttr("kind"), op.getAttr("dim"),
                 getElementTypeOrSelf(op.getResult(0).getType())};
    };
    for (Operation &op : block) {
      if (isBucketable(&op, fn))
        groups[keyOf(op)].push_back(&op);
      else if (auto gather = dyn_cast<AllGatherOp>(op);
               gather && isa<BlockArgument>(gather.getInput()))
        prefetched[keyOf(op)].push_back(&op);
    }
    for (auto &[key, ops] : groups) {
      // In the order the step computes their inputs (arguments, defined by
      // no op, first).
      llvm::stable_sort(ops, [](Operation *a, Operation *b) {
        Operation *x = a->getOperand(0).getDefiningOp(),
                  *y = b->getOperand(0).getDefiningOp();
        return x != y && (!x || (y && x->isBeforeInBlock(y)));
      });
      for (ArrayRef<Operation *> bucket : cut(ops)) {
        // Started right after its last input is computed; only the return
        // (or the running sum's add just before it) reads a result, so each
        // is waited for just before that.
        Operation *last = bucket.back()->getOperand(0).getDefiningOp();
        OpBuilder b(&block,
                    last ? std::next(Block::iterator(last)) : block.begin());
        Operation *start = startBucket(b, bucket);
        waitAt(start, bucket, [&](Operation *op) {
          return firstReader(op->getResult(0), block);
        });
      }
    }
    // ZeRO-3's gathers of parameter shards (arguments, so ready from the
    // start) where each parameter is used, in the forward and again in the
    // backward: DeepSpeed's prefetch. In program order, bucket i is started
    // where bucket i - 1's first gathered tensor is needed, so it moves
    // while that bucket's layer computes; each gather becomes a wait in its
    // place. The price is up to one bucket of gathered parameters held
    // early.
    for (auto &[key, ops] : prefetched) {
      Operation *startBefore = ops.front();
      for (ArrayRef<Operation *> bucket : cut(ops)) {
        OpBuilder b(startBefore);
        Operation *start = startBucket(b, bucket);
        startBefore = waitAt(start, bucket, [](Operation *op) { return op; });
      }
    }
  }

  /// `ops` in buckets of at least `bucket-bytes` of whole tensors, in order
  /// (the last one smaller).
  SmallVector<SmallVector<Operation *>> cut(ArrayRef<Operation *> ops) {
    SmallVector<SmallVector<Operation *>> buckets;
    int64_t bytes = 0;
    for (Operation *op : ops) {
      if (buckets.empty() || bytes >= bucketBytes) {
        buckets.emplace_back();
        bytes = 0;
      }
      buckets.back().push_back(op);
      bytes += wholeBytes(op);
    }
    return buckets;
  }

  /// f32 for a reduction of narrow floats under `accumulate=f32`.
  Type accumulateType(Builder &b, Type element) {
    return accumulate == "f32" && isa<FloatType>(element) &&
                   !element.isF32() && !element.isF64()
               ? b.getF32Type()
               : Type();
  }

  /// The one `*_start` of `bucket`'s collectives at `b`.
  Operation *startBucket(OpBuilder &b, ArrayRef<Operation *> bucket) {
    SmallVector<Value> inputs;
    SmallVector<Type> futures;
    SmallVector<Location> locs;
    for (Operation *op : bucket) {
      inputs.push_back(op->getOperand(0));
      futures.push_back(FutureType::get(
          b.getContext(), cast<RankedTensorType>(op->getResult(0).getType())));
      locs.push_back(op->getLoc());
    }
    Location loc = b.getFusedLoc(locs);
    Type wide =
        accumulateType(b, getElementTypeOrSelf(inputs.front().getType()));
    if (auto reduce = dyn_cast<AllReduceOp>(bucket.front()))
      return AllReduceStartOp::create(b, loc, inputs, reduce.getMesh(),
                                      reduce.getAxesAttr(), reduce.getKind(),
                                      wide);
    if (auto scatter = dyn_cast<ReduceScatterOp>(bucket.front()))
      return ReduceScatterStartOp::create(
          b, loc, futures, inputs, scatter.getMeshAttr(),
          scatter.getAxesAttr(), scatter.getDimAttr(), scatter.getKindAttr(),
          wide ? TypeAttr::get(wide) : TypeAttr());
    auto gather = cast<AllGatherOp>(bucket.front());
    return AllGatherStartOp::create(b, loc, futures, inputs,
                                    gather.getMeshAttr(), gather.getAxesAttr(),
                                    gather.getDimAttr());
  }

  /// Replaces each collective of `bucket` by a wait on its future of
  /// `start`, placed before `where(collective)`; returns the first wait.
  template <typename Where>
  Operation *waitAt(Operation *start, ArrayRef<Operation *> bucket,
                    Where where) {
    Operation *first = nullptr;
    for (auto [op, future] : llvm::zip(bucket, start->getResults())) {
      OpBuilder b(where(op));
      auto wait =
          WaitOp::create(b, op->getLoc(), op->getResult(0).getType(), future);
      first = first ? first : wait.getOperation();
      op->getResult(0).replaceAllUsesWith(wait.getResult());
      op->erase();
    }
    return first;
  }
};

} // namespace

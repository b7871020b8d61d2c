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
    if (!isa<func::ReturnOp>(use.getOwner()))
      return false;
    unsigned i = use.getOperandNumber();
    return !gradient || fn.getResultAttr(i, "ernie.grad_of") ||
           fn.getResultAttr(i, ErnieDialect::kGradientAttrName);
  });
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
    llvm::MapVector<Key, SmallVector<Operation *>> groups;
    for (Operation &op : block)
      if (isBucketable(&op, fn))
        groups[{op.getName(), op.getAttr("mesh"), op.getAttr("axes"),
                op.getAttr("kind"), op.getAttr("dim"),
                getElementTypeOrSelf(op.getResult(0).getType())}]
            .push_back(&op);
    for (auto &[key, ops] : groups) {
      // In the order the step computes their inputs (arguments, defined by
      // no op, first).
      llvm::stable_sort(ops, [](Operation *a, Operation *b) {
        Operation *x = a->getOperand(0).getDefiningOp(),
                  *y = b->getOperand(0).getDefiningOp();
        return x != y && (!x || (y && x->isBeforeInBlock(y)));
      });
      SmallVector<Operation *> current;
      int64_t bytes = 0;
      for (Operation *op : ops) {
        current.push_back(op);
        bytes += wholeBytes(op);
        if (bytes >= bucketBytes) {
          emit(block, current);
          current.clear();
          bytes = 0;
        }
      }
      if (!current.empty())
        emit(block, current);
    }
  }

  /// f32 for a reduction of narrow floats under `accumulate=f32`.
  Type accumulateType(Builder &b, Type element) {
    return accumulate == "f32" && isa<FloatType>(element) &&
                   !element.isF32() && !element.isF64()
               ? b.getF32Type()
               : Type();
  }

  void emit(Block &block, ArrayRef<Operation *> bucket) {
    // Right after the last input is computed (ops are sorted by that).
    Operation *last = bucket.back()->getOperand(0).getDefiningOp();
    OpBuilder b(&block, last ? std::next(Block::iterator(last)) : block.begin());
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
    Operation *start;
    if (auto reduce = dyn_cast<AllReduceOp>(bucket.front()))
      start = AllReduceStartOp::create(b, loc, inputs, reduce.getMesh(),
                                       reduce.getAxesAttr(), reduce.getKind(),
                                       wide);
    else if (auto scatter = dyn_cast<ReduceScatterOp>(bucket.front()))
      start = ReduceScatterStartOp::create(
          b, loc, futures, inputs, scatter.getMeshAttr(),
          scatter.getAxesAttr(), scatter.getDimAttr(), scatter.getKindAttr(),
          wide ? TypeAttr::get(wide) : TypeAttr());
    else {
      auto gather = cast<AllGatherOp>(bucket.front());
      start = AllGatherStartOp::create(b, loc, futures, inputs,
                                       gather.getMeshAttr(),
                                       gather.getAxesAttr(), gather.getDimAttr());
    }
    // Only the return reads a result: wait just before it.
    OpBuilder at(block.getTerminator());
    for (auto [op, future] : llvm::zip(bucket, start->getResults())) {
      Value done = WaitOp::create(at, op->getLoc(), op->getResult(0).getType(),
                                  future)
                       .getResult();
      op->getResult(0).replaceAllUsesWith(done);
      op->erase();
    }
  }
};

} // namespace

//===- BucketGradients.cpp - data-parallel gradients in buckets -------------===//
//
// Partition leaves each data-parallel gradient's all-reduce at the return,
// after the whole backward: one collective per gradient, none overlapped.
// This pass groups them, in the order their gradients are ready, into
// buckets of about `bucket-bytes` (DDP's and Megatron's scheme), starts each
// bucket's one all-reduce (ernie.all_reduce_start) right after the last of
// its gradients is computed, and waits for each result just before the
// return, its one reader. The communication thread reduces a bucket while the rest
// of the backward runs; the executor completes every started transfer
// before a blocking collective, so nothing else talks on the wire then.
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

/// An all-reduce of a gradient: a sum or mean whose result only the
/// function's return reads, as a result marked a gradient (`ernie.grad_of`
/// by autodiff, `ernie.gradient` by the pipeline schedule). Partition puts
/// these at the return.
bool reducesAGradient(AllReduceOp op, func::FuncOp fn) {
  if (op.getKind() != ReduceKind::sum && op.getKind() != ReduceKind::avg)
    return false;
  Value r = op.getResult();
  return !r.use_empty() && llvm::all_of(r.getUses(), [&](OpOperand &use) {
    if (!isa<func::ReturnOp>(use.getOwner()))
      return false;
    unsigned i = use.getOperandNumber();
    return fn.getResultAttr(i, "ernie.grad_of") ||
           fn.getResultAttr(i, ErnieDialect::kGradientAttrName);
  });
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
    // Candidates by what one collective may carry together: mesh, axes,
    // kind and element type.
    using Key = std::tuple<Attribute, Attribute, ReduceKind, Type>;
    llvm::MapVector<Key, SmallVector<AllReduceOp>> groups;
    for (auto op : block.getOps<AllReduceOp>())
      if (reducesAGradient(op, fn))
        groups[{op.getMeshAttr(), op.getAxesAttr(), op.getKind(),
                getElementTypeOrSelf(op.getType())}]
            .push_back(op);
    for (auto &[key, ops] : groups) {
      // In the order the backward computes them (arguments, defined by no
      // op, first).
      llvm::stable_sort(ops, [](AllReduceOp a, AllReduceOp b) {
        Operation *x = a.getInput().getDefiningOp(),
                  *y = b.getInput().getDefiningOp();
        return x != y && (!x || (y && x->isBeforeInBlock(y)));
      });
      SmallVector<AllReduceOp> current;
      int64_t bytes = 0;
      for (AllReduceOp op : ops) {
        current.push_back(op);
        bytes += bytesOf(op.getInput());
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

  void emit(Block &block, MutableArrayRef<AllReduceOp> bucket) {
    // Right after the last input is computed (ops are sorted by that).
    Operation *last = bucket.back().getInput().getDefiningOp();
    OpBuilder b(&block, last ? std::next(Block::iterator(last)) : block.begin());
    SmallVector<Value> inputs;
    SmallVector<Location> locs;
    for (AllReduceOp op : bucket) {
      inputs.push_back(op.getInput());
      locs.push_back(op.getLoc());
    }
    Type element = getElementTypeOrSelf(inputs.front().getType());
    Type wide = accumulate == "f32" && isa<FloatType>(element) &&
                        !element.isF32() && !element.isF64()
                    ? b.getF32Type()
                    : Type();
    AllReduceStartOp start = AllReduceStartOp::create(
        b, b.getFusedLoc(locs), inputs, bucket.front().getMesh(),
        bucket.front().getAxesAttr(), bucket.front().getKind(), wide);
    // Only the return reads a gradient: wait just before it.
    OpBuilder at(block.getTerminator());
    for (auto [op, future] : llvm::zip(bucket, start.getResults())) {
      Value reduced =
          WaitOp::create(at, op.getLoc(), op.getType(), future).getResult();
      op.getResult().replaceAllUsesWith(reduced);
      op.erase();
    }
  }
};

} // namespace

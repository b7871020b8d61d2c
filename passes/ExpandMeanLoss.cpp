//===- ExpandMeanLoss.cpp - mean cross-entropy as sum / count ----------------===//

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Passes/Passes.h"

#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

#define DEBUG_TYPE "ernie-expand-mean-loss"

namespace mlir::ernie {
#define GEN_PASS_DEF_EXPANDMEANLOSSPASS
#include "ernie/Passes/Passes.h.inc"
} // namespace mlir::ernie

using namespace mlir;
using namespace mlir::ernie;

namespace {

struct MeanToSumOverCount : OpRewritePattern<CrossEntropyOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(CrossEntropyOp op,
                                PatternRewriter &rewriter) const override {
    if (op.getReduction() != LossReduction::mean)
      return failure();
    Location loc = op.getLoc();
    auto lossType = cast<RankedTensorType>(op.getType());
    auto labels = cast<RankedTensorType>(op.getLabels().getType());
    Type labelElement = labels.getElementType();
    Value sum = CrossEntropyOp::create(
        rewriter, loc, lossType, op.getLogits(), op.getLabels(),
        op.getIgnoreIndexAttr(),
        LossReductionAttr::get(getContext(), LossReduction::sum));
    Value ignore = FullOp::create(
        rewriter, loc, labels,
        IntegerAttr::get(labelElement,
                         static_cast<int64_t>(op.getIgnoreIndex())));
    Value kept = CompareOp::create(rewriter, loc, CompareDirection::ne,
                                   op.getLabels(), ignore);
    auto countType =
        RankedTensorType::get(labels.getShape(), lossType.getElementType());
    Value ones = CastOp::create(rewriter, loc, countType, kept);
    SmallVector<int64_t> all =
        llvm::to_vector(llvm::seq<int64_t>(0, labels.getRank()));
    Value count = ReduceSumOp::create(rewriter, loc, ones,
                                      rewriter.getDenseI64ArrayAttr(all),
                                      /*keepdim=*/false);
    Value loss = DivOp::create(rewriter, loc, sum, count);
    // The expansion runs where the loss ran (its pipeline stage, if any).
    if (Attribute stage = op->getAttr(ErnieDialect::kStageAttrName))
      for (Value v : {sum, ignore, kept, ones, count, loss})
        v.getDefiningOp()->setAttr(ErnieDialect::kStageAttrName, stage);
    rewriter.replaceOp(op, loss);
    return success();
  }
};

struct ExpandMeanLossPass
    : ernie::impl::ExpandMeanLossPassBase<ExpandMeanLossPass> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    patterns.add<MeanToSumOverCount>(&getContext());
    if (failed(applyPatternsGreedily(getOperation(), std::move(patterns))))
      signalPassFailure();
  }
};

} // namespace

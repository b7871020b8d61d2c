//===- Pipelines.cpp - ernie pass pipelines ----------------------------------===//

#include "ernie/Passes/Pipelines.h"

#include "ernie/Cost/CostModel.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;
using namespace mlir::ernie;

void mlir::ernie::buildSimplifyPipeline(
    OpPassManager &pm, const SimplifyPipelineOptions &options) {
  pm.addPass(createCheckStaticProgramPass());
  pm.addPass(createCanonicalizerPass());
  if (options.runCse)
    pm.addPass(createCSEPass());
}

void mlir::ernie::buildAutoParallelPipeline(
    OpPassManager &pm, const AutoParallelPipelineOptions &options) {
  pm.addPass(createCheckStaticProgramPass());
  pm.addPass(createExpandMeanLossPass());
  if (options.clusterSpec)
    pm.addPass(createShardingPropagationPass(options.clusterSpec));
  else
    pm.addPass(createShardingPropagationPass({options.cluster}));
  if (options.partition) {
    if (options.clusterSpec)
      pm.addPass(createSpmdPartitionPass(options.clusterSpec));
    else
      pm.addPass(createSpmdPartitionPass({options.cluster}));
  }
  pm.addPass(createCanonicalizerPass());
  if (options.runCse)
    pm.addPass(createCSEPass());
}

namespace {

Fp8LoweringPassOptions fp8Options(const TrainingPipelineOptions &o) {
  Fp8LoweringPassOptions fp8;
  fp8.recipe = o.fp8Recipe;
  fp8.fwdFormat = o.fp8FwdFormat;
  fp8.gradFormat = o.fp8GradFormat;
  fp8.exclude = o.fp8Exclude;
  fp8.include = o.fp8Include;
  fp8.historyLength = o.fp8HistoryLength;
  fp8.margin = o.fp8Margin;
  fp8.amaxCompute = o.fp8AmaxCompute;
  fp8.blockSize = o.fp8BlockSize;
  fp8.pow2Scale = o.fp8Pow2Scale;
  return fp8;
}

} // namespace

void mlir::ernie::buildTrainingPipeline(OpPassManager &pm,
                                        const TrainingPipelineOptions &o) {
  bool pipelined = o.pipelineStages > 1;
  if (pipelined) {
    PipelineSplitPassOptions split;
    split.stages = o.pipelineStages;
    split.virtualStages = o.virtualStages;
    pm.addPass(createPipelineSplitPass(split));
    pm.addPass(createSharedWeightDedupPass());
  }
  if (o.differentiate) {
    AutodiffPassOptions ad;
    ad.optimizer = o.optimizer;
    ad.momentum = o.momentum;
    ad.weightDecay = o.weightDecay;
    ad.beta1 = o.beta1;
    ad.beta2 = o.beta2;
    ad.epsilon = o.epsilon;
    ad.clipNorm = o.clipNorm;
    ad.multiPrecision = o.multiPrecision;
    ad.gradNorm = o.gradNorm;
    pm.addPass(createAutodiffPass(ad));
  }
  if (o.zeroLevel) {
    ZeroShardingPassOptions zero;
    zero.level = o.zeroLevel;
    zero.axis = o.zeroAxis;
    pm.addPass(createZeroShardingPass(zero));
  }
  if (o.fp8)
    pm.addPass(createFp8LoweringPass(fp8Options(o)));
  if (o.differentiate && o.recompute != "none") {
    RecomputePassOptions recompute;
    recompute.mode = o.recompute;
    pm.addPass(createRecomputePass(recompute));
  }
  bool anything = pipelined || o.differentiate || o.zeroLevel || o.fp8 ||
                  o.partition;
  if (!anything)
    return;
  if (!o.partition) {
    // Canonicalize and CSE, as the partitioning pipeline ends.
    buildSimplifyPipeline(pm, SimplifyPipelineOptions());
  } else {
    AutoParallelPipelineOptions parallel;
    parallel.cluster = o.cluster;
    parallel.clusterSpec = o.clusterSpec;
    buildAutoParallelPipeline(pm, parallel);
    if (o.sequenceParallelOverlap)
      pm.addPass(createSequenceParallelOverlapPass());
    if (pipelined) {
      PipelineSchedulePassOptions schedule;
      schedule.microBatches = o.microBatches;
      schedule.schedule = o.schedule;
      schedule.gradReduce = o.gradReduce;
      schedule.accumulate = o.accumulate;
      pm.addPass(createPipelineSchedulePass(schedule));
    }
    if (o.bucketBytes > 0) {
      BucketGradientsPassOptions buckets;
      buckets.bucketBytes = o.bucketBytes;
      buckets.accumulate = o.gradReduce;
      pm.addPass(createBucketGradientsPass(buckets));
    }
  }
  if (o.fuse)
    pm.addPass(createFusePass());
}

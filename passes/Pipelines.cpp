//===- Pipelines.cpp - ernie pass pipelines ----------------------------------===//

#include "ernie/Passes/Passes.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;

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
  pm.addPass(createShardingPropagationPass({options.cluster}));
  if (options.partition)
    pm.addPass(createSpmdPartitionPass({options.cluster}));
  pm.addPass(createCanonicalizerPass());
  if (options.runCse)
    pm.addPass(createCSEPass());
}

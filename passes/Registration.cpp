//===- Registration.cpp - registers every ernie pass and pipeline -----------===//

#include "ernie/Passes/Pipelines.h"

#include "mlir/Pass/PassRegistry.h"

using namespace mlir;

void mlir::ernie::registerErniePassesAndPipelines() {
  registerErniePasses();
  PassPipelineRegistration<SimplifyPipelineOptions>(
      "ernie-simplify-pipeline",
      "Check the program contract, canonicalize and CSE an ernie module",
      buildSimplifyPipeline);
  PassPipelineRegistration<AutoParallelPipelineOptions>(
      "ernie-auto-parallel-pipeline",
      "Propagate shardings and partition into the per-rank SPMD program",
      buildAutoParallelPipeline);
  PassPipelineRegistration<TrainingPipelineOptions>(
      "ernie-training-pipeline",
      "The whole training compiler in ernie.compile's order: pipeline "
      "split, autodiff, ZeRO, FP8, recompute, propagation and partition, "
      "overlap, pipeline schedule, gradient buckets, fusion",
      buildTrainingPipeline);
}

//===- Registration.cpp - registers every ernie pass and pipeline -----------===//

#include "ernie/Passes/Passes.h"

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
}

//===- Passes.h - ernie passes and pipelines ---------------------*- C++ -*-===//
//
// The generated pass declarations, the pipeline builders and one registration
// call for all of them.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_PASSES_PASSES_H
#define ERNIE_PASSES_PASSES_H

#include "ernie/Dialect/Ernie/IR/ErnieDialect.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassOptions.h"

namespace mlir::ernie {

#define GEN_PASS_DECL
#include "ernie/Passes/Passes.h.inc"

/// Options of `--ernie-simplify-pipeline`.
struct SimplifyPipelineOptions
    : public PassPipelineOptions<SimplifyPipelineOptions> {
  Option<bool> runCse{*this, "cse",
                      llvm::cl::desc("Run common-subexpression elimination"),
                      llvm::cl::init(true)};
  Option<std::string> cluster{
      *this, "cluster",
      llvm::cl::desc("Choose layouts and collectives by their time on this "
                     "cluster (JSON file) instead of by bytes")};
};

/// Checks the program contract, then canonicalizes (folding ernie's
/// algebraic identities and shape-op chains) and, optionally, runs CSE.
void buildSimplifyPipeline(OpPassManager &pm,
                           const SimplifyPipelineOptions &options);

/// Options of `--ernie-auto-parallel-pipeline`.
struct AutoParallelPipelineOptions
    : public PassPipelineOptions<AutoParallelPipelineOptions> {
  Option<bool> partition{
      *this, "partition",
      llvm::cl::desc("Partition into the per-rank program (off: stop after "
                     "propagation, every value annotated, for inspection)"),
      llvm::cl::init(true)};
  Option<bool> runCse{*this, "cse",
                      llvm::cl::desc("Run common-subexpression elimination"),
                      llvm::cl::init(true)};
  Option<std::string> cluster{
      *this, "cluster",
      llvm::cl::desc("Choose layouts and collectives by their time on this "
                     "cluster (JSON file) instead of by bytes")};
};

/// The whole compiler, from a single-device module with a few placements to
/// the SPMD program every rank runs: the program-contract check, mean losses
/// written as sum / count, sharding propagation, SPMD partition, then
/// canonicalization and CSE. Later passes
/// (autodiff, ZeRO, pipeline split, memory planning) slot in here as they
/// land.
void buildAutoParallelPipeline(OpPassManager &pm,
                               const AutoParallelPipelineOptions &options);

/// Registers every ernie pass and pipeline with the global registry.
void registerErniePassesAndPipelines();

#define GEN_PASS_REGISTRATION
#include "ernie/Passes/Passes.h.inc"

} // namespace mlir::ernie

#endif // ERNIE_PASSES_PASSES_H

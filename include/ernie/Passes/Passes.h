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
};

/// Checks the program contract, then canonicalizes (folding ernie's
/// algebraic identities and shape-op chains) and, optionally, runs CSE.
void buildSimplifyPipeline(OpPassManager &pm,
                           const SimplifyPipelineOptions &options);

/// Registers every ernie pass and pipeline with the global registry.
void registerErniePassesAndPipelines();

#define GEN_PASS_REGISTRATION
#include "ernie/Passes/Passes.h.inc"

} // namespace mlir::ernie

#endif // ERNIE_PASSES_PASSES_H

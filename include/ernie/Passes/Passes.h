//===- Passes.h - ernie passes and pipelines ---------------------*- C++ -*-===//
//
// The generated pass declarations and one registration call for every pass
// and pipeline (the pipelines themselves: Pipelines.h).
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_PASSES_PASSES_H
#define ERNIE_PASSES_PASSES_H

#include "ernie/Dialect/Ernie/IR/ErnieDialect.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassOptions.h"

#include <memory>

namespace mlir::ernie {

namespace cost {
struct ClusterSpec;
} // namespace cost

#define GEN_PASS_DECL
#include "ernie/Passes/Passes.h.inc"

/// Propagation and partition for a cluster already parsed (what a pipeline
/// built from C++ passes them instead of a file to read).
std::unique_ptr<Pass>
createShardingPropagationPass(std::shared_ptr<const cost::ClusterSpec> cluster);
std::unique_ptr<Pass>
createSpmdPartitionPass(std::shared_ptr<const cost::ClusterSpec> cluster);

/// Registers every ernie pass and pipeline with the global registry.
void registerErniePassesAndPipelines();

#define GEN_PASS_REGISTRATION
#include "ernie/Passes/Passes.h.inc"

} // namespace mlir::ernie

#endif // ERNIE_PASSES_PASSES_H

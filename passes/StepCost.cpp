//===- StepCost.cpp - the cost model's estimate as JSON -------------------===//

#include "ernie/Cost/CostModel.h"
#include "ernie/Passes/Passes.h"

#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/ToolOutputFile.h"

namespace mlir::ernie {
#define GEN_PASS_DEF_STEPCOSTPASS
#include "ernie/Passes/Passes.h.inc"
} // namespace mlir::ernie

using namespace mlir;
using namespace mlir::ernie;

namespace {

struct StepCostPass : ernie::impl::StepCostPassBase<StepCostPass> {
  using StepCostPassBase::StepCostPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (cluster.empty()) {
      module.emitError() << "--ernie-step-cost needs cluster=<file>";
      return signalPassFailure();
    }
    llvm::Expected<cost::ClusterSpec> spec = cost::loadCluster(cluster);
    if (!spec) {
      module.emitError() << llvm::toString(spec.takeError());
      return signalPassFailure();
    }
    FailureOr<cost::StepCost> estimate = cost::estimateStep(module, *spec);
    if (failed(estimate))
      return signalPassFailure();
    std::string error;
    std::unique_ptr<llvm::ToolOutputFile> out = openOutputFile(file, &error);
    if (!out) {
      module.emitError() << "cannot write the step cost: " << error;
      return signalPassFailure();
    }
    out->os() << llvm::formatv("{0:2}", cost::toJSON(*estimate)) << "\n";
    out->keep();
    markAllAnalysesPreserved();
  }
};

} // namespace

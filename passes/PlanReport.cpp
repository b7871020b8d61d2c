//===- PlanReport.cpp - per-rank memory and communication as JSON ------------===//

#include "ernie/Export/PlanReport.h"
#include "ernie/Passes/Passes.h"

#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/ToolOutputFile.h"

namespace mlir::ernie {
#define GEN_PASS_DEF_PLANREPORTPASS
#include "ernie/Passes/Passes.h.inc"
} // namespace mlir::ernie

using namespace mlir;
using namespace mlir::ernie;

namespace {

struct PlanReportPass : ernie::impl::PlanReportPassBase<PlanReportPass> {
  using PlanReportPassBase::PlanReportPassBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    FailureOr<llvm::json::Value> report = buildPlanReport(module);
    if (failed(report))
      return signalPassFailure();
    std::string error;
    std::unique_ptr<llvm::ToolOutputFile> out = openOutputFile(file, &error);
    if (!out) {
      module.emitError() << "cannot write the plan report: " << error;
      return signalPassFailure();
    }
    out->os() << llvm::formatv("{0:2}", *report) << "\n";
    out->keep();
    markAllAnalysesPreserved();
  }
};

} // namespace

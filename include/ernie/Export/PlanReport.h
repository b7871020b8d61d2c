//===- PlanReport.h - per-rank memory and communication of a program -*- C++ -*-===//
//
// The plan report: for every function of a partitioned module, per rank, the
// bytes of its parameters, optimizer state, inputs and gradients, its memory
// plan's figures, the padding uneven splits add, the collectives one call
// runs (its callees included) and those in its own body, the pipeline
// transfers of its body, and the ops --ernie-recompute copied. `--ernie-plan-report` prints
// it; the Python package reads it (Program.report(), collectives_of, the
// plan search) instead of reading MLIR text.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_EXPORT_PLANREPORT_H
#define ERNIE_EXPORT_PLANREPORT_H

#include "ernie/Export/MemoryPlan.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/JSON.h"

namespace mlir::ernie {

/// The plan report of `module` (JSON: {"ranks", "functions": {name: ...}}).
/// Each function's memory figures are `planned`'s (the program file
/// writer's plan) where it has them; otherwise the function is planned
/// here, on a copy (planning gives fills their readers' copies). Fails
/// with a diagnostic when a function cannot be planned.
FailureOr<llvm::json::Value>
buildPlanReport(ModuleOp module,
                const llvm::StringMap<PlanFigures> *planned = nullptr);

} // namespace mlir::ernie

#endif // ERNIE_EXPORT_PLANREPORT_H

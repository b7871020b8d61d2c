//===- ProgramFile.h - the partitioned module as a program file --*- C++ -*-===//
//
// Writes a partitioned module in the runtime's program file format
// (runtime/schema/program.fbs): the mesh, and for every public function its
// arguments and results (role, global and local shape, sharding), its
// planned buffers (MemoryPlan.h) and its instructions. Calls are inlined
// first, so each function is one straight-line instruction list.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_EXPORT_PROGRAMFILE_H
#define ERNIE_EXPORT_PROGRAMFILE_H

#include "ernie/Export/MemoryPlan.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir::ernie {

/// Writes `module` as a program file to `os`; diagnostics on failure. With
/// `planned`, also gives each written function's memory plan figures (the
/// plan the file holds, so nobody needs to plan the module again).
LogicalResult writeProgramFile(ModuleOp module, llvm::raw_ostream &os,
                               llvm::StringMap<PlanFigures> *planned = nullptr);

/// Registers the `--ernie-to-program` translation.
void registerProgramFileTranslation();

} // namespace mlir::ernie

#endif // ERNIE_EXPORT_PROGRAMFILE_H

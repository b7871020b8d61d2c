//===- ernie-opt.cpp - the ernie optimizer driver ----------------------------===//
//
// MlirOptMain with the ernie dialect, the dialects an ernie program uses, and
// every ernie pass and pipeline.
//
//===----------------------------------------------------------------------===//

#include "ernie/InitAll.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  mlir::ernie::registerAllPasses();
  mlir::DialectRegistry registry;
  mlir::ernie::registerAllDialects(registry);
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "ernie optimizer driver\n", registry));
}

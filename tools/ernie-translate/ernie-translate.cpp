//===- ernie-translate.cpp - the ernie translation driver --------------------===//
//
// mlir-translate with ernie's exports: `--ernie-to-program` writes the
// runtime's program file.
//
//===----------------------------------------------------------------------===//

#include "ernie/Export/ProgramFile.h"

#include "mlir/Tools/mlir-translate/MlirTranslateMain.h"

int main(int argc, char **argv) {
  mlir::ernie::registerProgramFileTranslation();
  return mlir::failed(
      mlir::mlirTranslateMain(argc, argv, "ernie translation driver\n"));
}

//===- InitAll.cpp - everything an ernie tool registers ---------------------===//

#include "ernie/InitAll.h"

#include "ernie/Dialect/Ernie/IR/ErnieDialect.h"
#include "ernie/Passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/Extensions/InlinerExtension.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Transforms/Passes.h"

void mlir::ernie::registerAllDialects(DialectRegistry &registry) {
  registry.insert<ErnieDialect, func::FuncDialect, arith::ArithDialect>();
  func::registerInlinerExtension(registry);
}

void mlir::ernie::registerAllPasses() {
  registerErniePassesAndPipelines();
  // The generic passes ernie pipelines are made of, for use on their own.
  registerCanonicalizerPass();
  registerCSEPass();
  registerInlinerPass();
  registerSymbolDCEPass();
}

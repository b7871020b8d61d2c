//===- InitAll.h - everything an ernie tool registers ------------*- C++ -*-===//
//
// One place that lists the dialects and passes of an ernie program, shared by
// ernie-opt, the Python extension and tests.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_INITALL_H
#define ERNIE_INITALL_H

namespace mlir {
class DialectRegistry;
} // namespace mlir

namespace mlir::ernie {
/// The ernie dialect and the upstream dialects an ernie program uses.
void registerAllDialects(DialectRegistry &registry);
/// Every ernie pass and pipeline, plus the upstream passes they are built of.
void registerAllPasses();
} // namespace mlir::ernie

#endif // ERNIE_INITALL_H

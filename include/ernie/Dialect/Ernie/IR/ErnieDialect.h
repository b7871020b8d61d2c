//===- ErnieDialect.h - the ernie dialect ------------------------*- C++ -*-===//

#ifndef ERNIE_DIALECT_ERNIE_IR_ERNIEDIALECT_H
#define ERNIE_DIALECT_ERNIE_IR_ERNIEDIALECT_H

#include "mlir/IR/Dialect.h"

#include "ernie/Dialect/Ernie/IR/ErnieOpsDialect.h.inc"

#endif // ERNIE_DIALECT_ERNIE_IR_ERNIEDIALECT_H

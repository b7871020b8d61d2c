//===- ErnieTypes.h - ernie types --------------------------------*- C++ -*-===//

#ifndef ERNIE_DIALECT_ERNIE_IR_ERNIETYPES_H
#define ERNIE_DIALECT_ERNIE_IR_ERNIETYPES_H

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Types.h"

#define GET_TYPEDEF_CLASSES
#include "ernie/Dialect/Ernie/IR/ErnieTypes.h.inc"

#endif // ERNIE_DIALECT_ERNIE_IR_ERNIETYPES_H

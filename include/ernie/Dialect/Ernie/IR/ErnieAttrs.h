//===- ErnieAttrs.h - ernie attributes and enums -----------------*- C++ -*-===//

#ifndef ERNIE_DIALECT_ERNIE_IR_ERNIEATTRS_H
#define ERNIE_DIALECT_ERNIE_IR_ERNIEATTRS_H

#include "mlir/IR/Attributes.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/DialectImplementation.h"

#include "ernie/Dialect/Ernie/IR/ErnieEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "ernie/Dialect/Ernie/IR/ErnieAttrs.h.inc"

#endif // ERNIE_DIALECT_ERNIE_IR_ERNIEATTRS_H

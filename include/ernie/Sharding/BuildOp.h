//===- BuildOp.h - one op from name, operands and attributes ----*- C++ -*-===//
//
// What the Python tracer and inferSpmd both do: create a registered op from
// a name, operand values and an attribute dictionary (the op's inherent
// attributes become its properties), inferring the result types when none
// are given, and verify it. Bad input is a diagnostic, never a crash: the
// operand count and the inherent attributes are checked before the op's
// type inference reads them.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_SHARDING_BUILDOP_H
#define ERNIE_SHARDING_BUILDOP_H

#include "mlir/IR/Builders.h"
#include "mlir/IR/OperationSupport.h"

namespace mlir::ernie {

/// Creates op `name` at `builder`'s insertion point and verifies it. `attrs`
/// holds inherent and discardable attributes alike. With `resultTypes`
/// empty the op must infer them (InferTypeOpInterface). On failure nothing
/// is left in the IR and the reasons were emitted as diagnostics at `loc`.
FailureOr<Operation *> buildOp(OpBuilder &builder, Location loc, StringRef name,
                               ValueRange operands, DictionaryAttr attrs,
                               TypeRange resultTypes = {});

/// The operand counts op `name` accepts, [min, max] (max = -1: any number),
/// read from its NOperands/Variadic traits.
std::pair<int64_t, int64_t> operandCountRange(RegisteredOperationName name);

} // namespace mlir::ernie

#endif // ERNIE_SHARDING_BUILDOP_H

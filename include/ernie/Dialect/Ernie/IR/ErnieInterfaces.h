//===- ErnieInterfaces.h - interfaces of ernie ops ---------------*- C++ -*-===//
//
// ShardingRuleOpInterface, GradientOpInterface and CostOpInterface.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_DIALECT_ERNIE_IR_ERNIEINTERFACES_H
#define ERNIE_DIALECT_ERNIE_IR_ERNIEINTERFACES_H

#include "ernie/Dialect/Ernie/IR/ShardingRule.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/OpDefinition.h"

namespace mlir::ernie::detail {
/// Elements across all results of `op`: the default flop count.
int64_t countResultElements(Operation *op);
/// Bytes of every ranked-tensor operand and result of `op`.
int64_t countOperandAndResultBytes(Operation *op);
/// One parallel factor per dimension, shared by every operand and result.
OpShardingRule getElementwiseShardingRule(Operation *op);
} // namespace mlir::ernie::detail

#include "ernie/Dialect/Ernie/IR/ErnieInterfaces.h.inc"

#endif // ERNIE_DIALECT_ERNIE_IR_ERNIEINTERFACES_H

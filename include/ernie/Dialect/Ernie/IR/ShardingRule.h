//===- ShardingRule.h - the factor map of an op's SPMD rule ------*- C++ -*-===//
//
// The data an op hands to sharding propagation and partition through
// ShardingRuleOpInterface: which factors make up each tensor dimension and
// how each factor may be sharded.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_DIALECT_ERNIE_IR_SHARDINGRULE_H
#define ERNIE_DIALECT_ERNIE_IR_SHARDINGRULE_H

#include "ernie/Dialect/Ernie/IR/ErnieAttrs.h"
#include "llvm/ADT/SmallVector.h"
#include <cstdint>

namespace mlir::ernie {

/// How sharding one factor affects the op.
enum class FactorKind {
  /// In operands and results alike: sharding it splits the work.
  Parallel,
  /// Only in operands (a contraction or reduction): the results become
  /// Partial with the factor's reduce kind.
  Reduction,
  /// Must stay unsharded (softmax's axis, a norm's normalised dimension).
  NeedReplication,
};

struct ShardingFactor {
  int64_t size = 1;
  FactorKind kind = FactorKind::Parallel;
  /// The pending reduction a sharded Reduction factor leaves on the results.
  ReduceKind reduceKind = ReduceKind::sum;
};

/// A tensor dimension as the factors that make it up, major to minor.
using DimFactors = llvm::SmallVector<int64_t, 1>;
/// One tensor as its dimensions' factors.
using TensorFactors = llvm::SmallVector<DimFactors, 4>;

/// An op's SPMD rule: Shardy's factor map. A size-1 dimension or a dimension
/// a rule does not relate to anything has no factors.
struct OpShardingRule {
  llvm::SmallVector<ShardingFactor> factors;
  llvm::SmallVector<TensorFactors> operands;
  llvm::SmallVector<TensorFactors> results;
};

} // namespace mlir::ernie

#endif // ERNIE_DIALECT_ERNIE_IR_SHARDINGRULE_H

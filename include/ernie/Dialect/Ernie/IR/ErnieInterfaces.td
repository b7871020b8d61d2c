//===- ErnieInterfaces.td - interfaces of ernie ops -------*- tablegen -*-===//
//
// The three interfaces the auto-parallel passes talk to ops through
// (DESIGN.md §3): the sharding rule, the gradient and the cost.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_DIALECT_ERNIE_IR_ERNIEINTERFACES_TD
#define ERNIE_DIALECT_ERNIE_IR_ERNIEINTERFACES_TD

include "mlir/IR/OpBase.td"

def Ernie_ShardingRuleOpInterface : OpInterface<"ShardingRuleOpInterface"> {
  let cppNamespace = "::mlir::ernie";
  let description = [{
    The op's SPMD rule as a factor map, in the manner of Shardy's
    `OpShardingRuleAttr`: every tensor dimension of every operand and result
    is made of one or more named factors (a reshape that merges two dims has
    two factors in one dim). A factor that appears in both operands and
    results is parallel: sharding it splits the work. A factor found only in
    operands is a reduction: sharding it leaves the results Partial with the
    factor's reduce kind. A factor marked need-replication must stay unsharded
    (softmax's axis, a norm's normalised dimension).

    Propagation, partition and the `inferSpmd` API all read this one table;
    no pass special-cases an op.
  }];
  let methods = [
    InterfaceMethod<[{
        Returns the op's factor map for its current operand and result types.
        The default treats the op as elementwise: every dimension is one
        parallel factor shared by all operands and results.
      }],
      "::mlir::ernie::OpShardingRule", "getShardingRule", (ins), [{}], [{
        return ::mlir::ernie::detail::getElementwiseShardingRule($_op);
      }]>,
  ];
}

def Ernie_GradientOpInterface : OpInterface<"GradientOpInterface"> {
  let cppNamespace = "::mlir::ernie";
  let description = [{
    The op's vector-Jacobian product, written once next to the op. Reverse-mode
    autodiff walks a function backwards and asks each op for the gradients of
    its operands given the gradients of its results.
  }];
  let methods = [
    InterfaceMethod<[{
        Builds, at the builder's insertion point, the gradient of every operand
        from `resultGradients` (one per result; a null value means the result
        does not reach the loss). Appends one value per operand to
        `operandGradients`: null for operands that take no gradient (integer
        indices, say). Fails with a diagnostic on the op when it cannot.
      }],
      "::llvm::LogicalResult", "buildGradient",
      (ins "::mlir::OpBuilder &":$builder,
           "::mlir::ValueRange":$resultGradients,
           "::llvm::SmallVectorImpl<::mlir::Value> &":$operandGradients)>,
  ];
}

def Ernie_CostOpInterface : OpInterface<"CostOpInterface"> {
  let cppNamespace = "::mlir::ernie";
  let description = [{
    The op's arithmetic and memory traffic, for the plan report and the cost
    model that chooses among shardings. Counts are for the op's own (global or
    local) types, so the same method serves before and after partition.
  }];
  let methods = [
    InterfaceMethod<[{
        Floating-point (or integer) operations the op performs. The default
        counts one per result element.
      }],
      "int64_t", "getFlops", (ins), [{}], [{
        return ::mlir::ernie::detail::countResultElements($_op);
      }]>,
    InterfaceMethod<[{
        Bytes the op reads and writes: every operand and result once.
      }],
      "int64_t", "getBytesAccessed", (ins), [{}], [{
        return ::mlir::ernie::detail::countOperandAndResultBytes($_op);
      }]>,
  ];
}

#endif // ERNIE_DIALECT_ERNIE_IR_ERNIEINTERFACES_TD

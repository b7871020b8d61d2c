//===- Passes.td - ernie passes -------------------------------*- tablegen -*-===//
//
// Every ernie pass, with its flag, summary, description and options. Passes
// run alone under ernie-opt; the pipelines in Passes.h compose them.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_PASSES_PASSES_TD
#define ERNIE_PASSES_PASSES_TD

include "mlir/Pass/PassBase.td"

def CheckStaticProgramPass : Pass<"ernie-check-static-program", "ModuleOp"> {
  let summary = "Check that a module is an ernie program the later passes accept";
  let description = [{
    The auto-parallel passes plan every buffer ahead of time and talk to ops
    through the ernie interfaces, so they accept only functions whose values
    are statically shaped ranked tensors (or scalars) and whose ops are
    `ernie`, `func` or `arith` constant ops, and parameters are named once per
    function. This pass reports every value, op and parameter that breaks this
    contract, at its location, before any expensive pass runs. It changes
    nothing.

    ```mlir
    // error: 'tensor.empty' op is not part of an ernie program
    ```
  }];
  let dependentDialects = ["::mlir::ernie::ErnieDialect"];
}

def PrintShardingRulesPass : Pass<"ernie-print-sharding-rules"> {
  let summary = "Report every op's sharding rule as a remark";
  let description = [{
    For inspection and tests: each op with a ShardingRuleOpInterface gets a
    remark with its factor map in einsum-like form, factors named i, j, k...:

    ```
    remark: sharding rule ([i, k], [k, j]) -> ([i, j]) k:reduction(sum)
    ```
    A dimension made of several factors lists them major to minor (`ij`);
    a size-1 dimension has none (`_`). Factors not marked are parallel.
  }];
}

#endif // ERNIE_PASSES_PASSES_TD

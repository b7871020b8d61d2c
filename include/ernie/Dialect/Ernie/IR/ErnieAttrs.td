//===- ErnieAttrs.td - ernie attributes and enums ---------*- tablegen -*-===//
//
// Enumerations used by op attributes. Sharding attributes join them with the
// sharding issue.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_DIALECT_ERNIE_IR_ERNIEATTRS_TD
#define ERNIE_DIALECT_ERNIE_IR_ERNIEATTRS_TD

include "ernie/Dialect/Ernie/IR/ErnieBase.td"
include "mlir/IR/EnumAttr.td"

def Ernie_CompareDirection : I32EnumAttr<"CompareDirection",
    "comparison predicate of ernie.compare", [
      I32EnumAttrCase<"eq", 0>, I32EnumAttrCase<"ne", 1>,
      I32EnumAttrCase<"lt", 2>, I32EnumAttrCase<"le", 3>,
      I32EnumAttrCase<"gt", 4>, I32EnumAttrCase<"ge", 5>]> {
  let cppNamespace = "::mlir::ernie";
}

def Ernie_LossReduction : I32EnumAttr<"LossReduction",
    "how ernie.cross_entropy reduces its per-token losses", [
      I32EnumAttrCase<"none", 0>, I32EnumAttrCase<"mean", 1>,
      I32EnumAttrCase<"sum", 2>]> {
  let cppNamespace = "::mlir::ernie";
  let genSpecializedAttr = 0;
}
def Ernie_LossReductionAttr
    : EnumAttr<Ernie_Dialect, Ernie_LossReduction, "loss_reduction">;

#endif // ERNIE_DIALECT_ERNIE_IR_ERNIEATTRS_TD

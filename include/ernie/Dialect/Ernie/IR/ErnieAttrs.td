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

def Ernie_ReduceKind : I32EnumAttr<"ReduceKind",
    "the pending reduction of a Partial value", [
      I32EnumAttrCase<"sum", 0>, I32EnumAttrCase<"avg", 1>,
      I32EnumAttrCase<"max", 2>, I32EnumAttrCase<"min", 3>]> {
  let cppNamespace = "::mlir::ernie";
  let genSpecializedAttr = 0;
}
def Ernie_ReduceKindAttr
    : EnumAttr<Ernie_Dialect, Ernie_ReduceKind, "reduce_kind">;

def Ernie_ShardingAttr : AttrDef<Ernie_Dialect, "Sharding"> {
  let mnemonic = "sharding";
  let summary = "how a tensor is laid out over a device mesh";
  let description = [{
    Names a mesh and lists, for every tensor dimension, the mesh axes that
    split it, major to minor (`{}`: not split). Axes listed under `partial`
    hold a pending reduction of the given kind: every rank of such an axis
    holds a summand (or candidate max/min, or a term of an average) of the
    true value. An axis appears at most once in a sharding; axes not named
    replicate the tensor.

    ```mlir
    #ernie.sharding<@mesh, [{dp}, {}, {mp} ]>      // [b/dp, s, h/mp]
    #ernie.sharding<@mesh, [{dp, mp}, {} ]>        // dim 0 over dp*mp ranks
    #ernie.sharding<@mesh, [{}, {} ], partial = {mp = sum} >
    ```
    (TableGen quoting puts a space before the closing brackets here; the
    printer writes none.)
  }];
  let parameters = (ins
    "::mlir::FlatSymbolRefAttr":$mesh,
    // Per dimension, an ArrayAttr of StringAttr axis names.
    "::mlir::ArrayAttr":$dims,
    // Partial axis names, and their reduce kinds, index for index.
    "::mlir::ArrayAttr":$partialAxes,
    "::mlir::ArrayAttr":$partialKinds
  );
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// A sharding from per-dimension axis names and (axis, kind) partials.
    static ShardingAttr get(::mlir::MLIRContext *context,
                            ::mlir::FlatSymbolRefAttr mesh,
                            ::llvm::ArrayRef<::llvm::SmallVector<::llvm::StringRef>> dims,
                            ::llvm::ArrayRef<std::pair<::llvm::StringRef, ReduceKind>> partial = {});
    /// The same from names a user gave (empty or repeated axes): null and
    /// a diagnostic through `emitError` where `get` would assert.
    static ShardingAttr getCheckedFromNames(
        ::llvm::function_ref<::mlir::InFlightDiagnostic()> emitError,
        ::mlir::MLIRContext *context, ::mlir::FlatSymbolRefAttr mesh,
        ::llvm::ArrayRef<::llvm::SmallVector<::llvm::StringRef>> dims,
        ::llvm::ArrayRef<std::pair<::llvm::StringRef, ReduceKind>> partial = {});
    /// The fully replicated sharding of a rank-`rank` tensor.
    static ShardingAttr getReplicated(::mlir::MLIRContext *context,
                                      ::mlir::FlatSymbolRefAttr mesh,
                                      int64_t rank);
    int64_t getRank() const { return getDims().size(); }
    /// Axis names splitting dimension `dim`, major to minor.
    ::llvm::SmallVector<::llvm::StringRef> getDimAxes(int64_t dim) const;
    /// Partial axes with their reduce kinds.
    ::llvm::SmallVector<std::pair<::llvm::StringRef, ReduceKind>> getPartials() const;
    bool isPartial() const { return !getPartialAxes().empty(); }
    /// The same split with nothing pending (itself when nothing is).
    ShardingAttr withoutPartials() const;
    /// No dimension split and nothing pending.
    bool isReplicated() const;
    /// Every axis the sharding uses, dims first then partials.
    ::llvm::SmallVector<::llvm::StringRef> getUsedAxes() const;
  }];
}

#endif // ERNIE_DIALECT_ERNIE_IR_ERNIEATTRS_TD

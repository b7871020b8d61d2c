//===- ErnieTypes.td - ernie types -------------------------*- tablegen -*-===//
//
// The dialect computes on builtin tensors; its one type of its own is the
// pending result of an asynchronous collective.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_DIALECT_ERNIE_IR_ERNIETYPES_TD
#define ERNIE_DIALECT_ERNIE_IR_ERNIETYPES_TD

include "ernie/Dialect/Ernie/IR/ErnieBase.td"
include "mlir/IR/AttrTypeBase.td"

def Ernie_FutureType : TypeDef<Ernie_Dialect, "Future"> {
  let mnemonic = "future";
  let summary = "a tensor an asynchronous collective is still producing";
  let description = [{
    What a `*_start` collective returns: the tensor it will produce, not
    readable until `ernie.wait` turns it into that tensor. Between the two
    the communication runs while the ops in between compute.

    ```mlir
    %f = ernie.collective_permute_start %x over @mesh[mp] shift = 1 : tensor<4x8xf32>
    %y = ernie.wait %f : tensor<4x8xf32>
    ```
  }];
  let parameters = (ins "::mlir::RankedTensorType":$valueType);
  let assemblyFormat = "`<` $valueType `>`";
}

#endif // ERNIE_DIALECT_ERNIE_IR_ERNIETYPES_TD

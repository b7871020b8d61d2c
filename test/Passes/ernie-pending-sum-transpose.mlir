// A pending sum passes through a transpose: the sum of transposes is the
// transpose of the sum. A tied head's weight gradient (the transposed
// product of the activations and the logits' gradient, both split over
// the batch) and the embedding's gradient (an index_add of split tokens)
// are both pending over ep: they add unreduced and reduce once, one
// all-reduce of the weight instead of one per summand.
// RUN: ernie-opt %s --split-input-file --ernie-auto-parallel-pipeline | FileCheck %s

ernie.mesh @mesh(ep = 4)
// CHECK-LABEL: func.func @tied_head
// CHECK-NOT: all_gather
// CHECK: %[[M:.+]] = ernie.matmul %{{.*}}, %{{.*}} {transpose_a} : tensor<32x32xf32>, tensor<32x128xf32> -> tensor<32x128xf32>
// CHECK-NEXT: %[[T:.+]] = ernie.transpose %[[M]], perm = [1, 0] : tensor<32x128xf32> -> tensor<128x32xf32>
// CHECK-NEXT: %[[E:.+]] = ernie.index_add
// CHECK-NEXT: %[[S:.+]] = ernie.add %[[T]], %[[E]] : tensor<128x32xf32>
// CHECK-NEXT: ernie.all_reduce %[[S]] over @mesh[ep] sum : tensor<128x32xf32>
// CHECK-NOT: ernie.all_reduce
// CHECK: return
func.func @tied_head(%ids: tensor<8x16xi64> {ernie.sharding = #ernie.sharding<@mesh, [{ep}, {}]>},
                     %h: tensor<8x16x32xf32> {ernie.sharding = #ernie.sharding<@mesh, [{ep}, {}, {}]>},
                     %dl: tensor<8x16x128xf32> {ernie.sharding = #ernie.sharding<@mesh, [{ep}, {}, {}]>},
                     %dx: tensor<8x16x32xf32> {ernie.sharding = #ernie.sharding<@mesh, [{ep}, {}, {}]>})
    -> (tensor<128x32xf32> {ernie.grad_of = "embed_tokens.weight"}) {
  %hr = ernie.reshape %h : tensor<8x16x32xf32> -> tensor<128x32xf32>
  %dr = ernie.reshape %dl : tensor<8x16x128xf32> -> tensor<128x128xf32>
  %m = ernie.matmul %hr, %dr {transpose_a} : tensor<128x32xf32>, tensor<128x128xf32> -> tensor<32x128xf32>
  %t = ernie.transpose %m, perm = [1, 0] : tensor<32x128xf32> -> tensor<128x32xf32>
  %z = ernie.full 0.0 : tensor<128x32xf32>
  %e = ernie.index_add %z, %ids, %dx axis = 0 : tensor<128x32xf32>, tensor<8x16xi64>, tensor<8x16x32xf32> -> tensor<128x32xf32>
  %s = ernie.add %t, %e : tensor<128x32xf32>
  %c = ernie.sharding_constraint %s <@mesh, [{}, {}]> {priority = 1} : tensor<128x32xf32>
  return %c : tensor<128x32xf32>
}

// -----

// Two partial products, one transposed: one all-reduce after the add.
ernie.mesh @mesh(ep = 4)
// CHECK-LABEL: func.func @two_products
// CHECK: ernie.transpose
// CHECK-NEXT: ernie.add
// CHECK-NEXT: ernie.all_reduce
// CHECK-NOT: ernie.all_reduce
func.func @two_products(%h: tensor<128x32xf32> {ernie.sharding = #ernie.sharding<@mesh, [{ep}, {}]>},
                        %d: tensor<128x32xf32> {ernie.sharding = #ernie.sharding<@mesh, [{ep}, {}]>},
                        %g: tensor<128x32xf32> {ernie.sharding = #ernie.sharding<@mesh, [{ep}, {}]>})
    -> tensor<32x32xf32> {
  %a = ernie.matmul %h, %d {transpose_a} : tensor<128x32xf32>, tensor<128x32xf32> -> tensor<32x32xf32>
  %b = ernie.matmul %h, %g {transpose_a} : tensor<128x32xf32>, tensor<128x32xf32> -> tensor<32x32xf32>
  %t = ernie.transpose %b, perm = [1, 0] : tensor<32x32xf32> -> tensor<32x32xf32>
  %s = ernie.add %a, %t : tensor<32x32xf32>
  return %s : tensor<32x32xf32>
}

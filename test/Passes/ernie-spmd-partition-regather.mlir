// A value all-gathered before the loss and read again after it is gathered
// again for the backward (the forward keeps its 1/n piece) only where the
// step makes at least the value's bytes between the two readers: otherwise
// keeping it costs no more memory and the second gather is pure traffic.
// RUN: ernie-opt %s --split-input-file --ernie-autodiff "--ernie-auto-parallel-pipeline=cluster=%S/Inputs/cost-four-ranks.json" | FileCheck %s

// A replicated LM head divided by rows (a cluster on which its GEMMs pay
// for the gather): the loss and, right after it, the loss's gradient read
// the one gathered [1024, 4096].
ernie.mesh @mesh(mp = 2)
// CHECK-LABEL: func.func @forward_grad
// CHECK: %[[ROWS:.*]] = ernie.matmul {{.*}} -> tensor<512x4096xf32>
// CHECK-NEXT: %[[LOGITS:.*]] = ernie.all_gather %[[ROWS]] over @mesh[mp] dim = 0
// CHECK-NEXT: ernie.cross_entropy %[[LOGITS]]
// CHECK-NEXT: ernie.cross_entropy_grad %[[LOGITS]]
// CHECK-NOT: ernie.all_gather %[[ROWS]]
// CHECK: return
func.func @forward(%x: tensor<1024x256xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {}]>},
                   %labels: tensor<1024xi64> {ernie.sharding = #ernie.sharding<@mesh, [{}]>},
                   %w: tensor<256x4096xf32> {ernie.param = "head", ernie.sharding = #ernie.sharding<@mesh, [{}, {}]>}) -> tensor<f32> {
  %y = ernie.matmul %x, %w : tensor<1024x256xf32>, tensor<256x4096xf32> -> tensor<1024x4096xf32>
  %l = ernie.cross_entropy %y, %labels {reduction = #ernie<loss_reduction sum>} : tensor<1024x4096xf32>, tensor<1024xi64> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Sequence parallelism's gathered input, read by the column-parallel
// matmul and by its weight gradient, with a [8, 64] activation (and its
// gradient) made in between: gathered again for the backward.
ernie.mesh @mesh(mp = 2)
// CHECK-LABEL: func.func @forward_grad
// CHECK: %[[X:.*]] = ernie.all_gather %arg0 over @mesh[mp] dim = 0
// CHECK-NEXT: ernie.matmul %[[X]], %arg1
// CHECK: ernie.tanh
// CHECK: %[[AGAIN:.*]] = ernie.all_gather %arg0 over @mesh[mp] dim = 0
// CHECK-NEXT: ernie.matmul %[[AGAIN]], {{.*}} {transpose_a}
func.func @forward(%x: tensor<8x16xf32> {ernie.sharding = #ernie.sharding<@mesh, [{mp}, {}]>},
                   %w: tensor<16x16xf32> {ernie.param = "w", ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>},
                   %v: tensor<16x64xf32> {ernie.param = "v"}) -> tensor<f32> {
  %h = ernie.matmul %x, %w : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
  %g = ernie.matmul %h, %v : tensor<8x16xf32>, tensor<16x64xf32> -> tensor<8x64xf32>
  %t = ernie.tanh %g : tensor<8x64xf32>
  %l = ernie.reduce_sum %t axes = [0, 1] : tensor<8x64xf32> -> tensor<f32>
  return %l : tensor<f32>
}

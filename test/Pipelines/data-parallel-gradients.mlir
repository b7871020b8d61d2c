// Data-parallel gradient synchronisation is not a pass: autodiff runs before
// sharding, the weights' gradients contract over the batch that dp splits,
// propagation leaves them pending sums, and partition completes each with
// one all-reduce over dp. Nothing else moves.
// RUN: ernie-opt %s --ernie-autodiff --ernie-auto-parallel-pipeline | FileCheck %s

// CHECK-LABEL: func.func @forward_grad
// CHECK-SAME: %{{[a-z0-9]+}}: tensor<4x16xf32>
// CHECK: %[[DW2:.+]] = ernie.matmul %{{.*}}, %{{.*}} {transpose_a} : tensor<4x32xf32>, tensor<4x10xf32> -> tensor<32x10xf32>
// CHECK: %[[DW1:.+]] = ernie.matmul %{{.*}}, %{{.*}} {transpose_a} : tensor<4x16xf32>, tensor<4x32xf32> -> tensor<16x32xf32>
// CHECK-DAG: %[[LOSS:.+]] = ernie.all_reduce %{{.*}} over @mesh[dp] sum : tensor<f32>
// CHECK-DAG: %[[G1:.+]] = ernie.all_reduce %[[DW1]] over @mesh[dp] sum : tensor<16x32xf32>
// CHECK-DAG: %[[G2:.+]] = ernie.all_reduce %[[DW2]] over @mesh[dp] sum : tensor<32x10xf32>
// CHECK-NOT: ernie.all_
// CHECK: return %[[LOSS]], %[[G1]], %[[G2]]
ernie.mesh @mesh(dp = 2)
func.func @forward(%x: tensor<8x16xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>},
                   %y: tensor<8xi64> {ernie.sharding = #ernie.sharding<@mesh, [{dp}]>},
                   %w1: tensor<16x32xf32> {ernie.param = "w1"}, %w2: tensor<32x10xf32> {ernie.param = "w2"}) -> tensor<f32> {
  %h = ernie.matmul %x, %w1 : tensor<8x16xf32>, tensor<16x32xf32> -> tensor<8x32xf32>
  %a = ernie.relu %h : tensor<8x32xf32>
  %o = ernie.matmul %a, %w2 : tensor<8x32xf32>, tensor<32x10xf32> -> tensor<8x10xf32>
  %l = ernie.cross_entropy %o, %y {reduction = #ernie<loss_reduction sum>} : tensor<8x10xf32>, tensor<8xi64> -> tensor<f32>
  return %l : tensor<f32>
}

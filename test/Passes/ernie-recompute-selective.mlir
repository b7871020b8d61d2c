// RUN: ernie-opt %s --split-input-file --ernie-autodiff --ernie-recompute=mode=selective | FileCheck %s

// Written-out attention, nothing marked. Selective recomputes the core:
// the scores' matmul, the mask's broadcast, the add and the softmax, right
// before the first backward op that reads the probabilities; q, k, v and
// the [4, 4] mask stay; the probabilities x v matmul is not repeated (its
// result leaves the core).
// CHECK-LABEL: func.func @forward_grad
// CHECK: %[[K:.+]] = ernie.matmul %arg1, %arg4
// CHECK: %[[V:.+]] = ernie.matmul %arg1, %arg3
// CHECK: ernie.softmax
// CHECK: %[[O:.+]] = ernie.matmul %{{.+}}, %[[V]] :
// CHECK: ernie.reduce_sum
// CHECK: %[[S:.+]] = ernie.matmul %arg0, %[[K]] {ernie.recomputed, transpose_b}
// CHECK-NEXT: %[[M:.+]] = ernie.broadcast %arg2, dims = [2, 3] {ernie.recomputed}
// CHECK-NEXT: %[[SM:.+]] = ernie.add %[[S]], %[[M]] {ernie.recomputed}
// CHECK-NEXT: %[[P:.+]] = ernie.softmax %[[SM]], axis = 3 {ernie.recomputed}
// CHECK-NEXT: ernie.matmul %[[P]], %{{.+}} {transpose_a}
// CHECK-NOT: ernie.recomputed
// CHECK: return
func.func @forward(%q: tensor<1x2x4x8xf32>, %kin: tensor<1x2x4x8xf32>, %mask: tensor<4x4xf32>, %wv: tensor<8x8xf32> {ernie.param = "wv"}, %wk: tensor<8x8xf32> {ernie.param = "wk"}) -> tensor<f32> {
  %k = ernie.matmul %kin, %wk : tensor<1x2x4x8xf32>, tensor<8x8xf32> -> tensor<1x2x4x8xf32>
  %v = ernie.matmul %kin, %wv : tensor<1x2x4x8xf32>, tensor<8x8xf32> -> tensor<1x2x4x8xf32>
  %s = ernie.matmul %q, %k {transpose_b} : tensor<1x2x4x8xf32>, tensor<1x2x4x8xf32> -> tensor<1x2x4x4xf32>
  %m = ernie.broadcast %mask, dims = [2, 3] : tensor<4x4xf32> -> tensor<1x2x4x4xf32>
  %sm = ernie.add %s, %m : tensor<1x2x4x4xf32>
  %p = ernie.softmax %sm, axis = 3 : tensor<1x2x4x4xf32>
  %o = ernie.matmul %p, %v : tensor<1x2x4x4xf32>, tensor<1x2x4x8xf32> -> tensor<1x2x4x8xf32>
  %t = ernie.tanh %o : tensor<1x2x4x8xf32>
  %l = ernie.reduce_sum %t axes = [0, 1, 2, 3] : tensor<1x2x4x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// A router's softmax (no matmul reads the probabilities) is not attention.
// CHECK-LABEL: func.func @forward_grad
// CHECK-NOT: ernie.recomputed
// CHECK: return
func.func @forward(%x: tensor<4x8xf32>, %w: tensor<8x4xf32> {ernie.param = "w"}) -> tensor<f32> {
  %h = ernie.matmul %x, %w : tensor<4x8xf32>, tensor<8x4xf32> -> tensor<4x4xf32>
  %p = ernie.softmax %h, axis = 1 : tensor<4x4xf32>
  %t = ernie.mul %p, %p : tensor<4x4xf32>
  %l = ernie.reduce_sum %t axes = [0, 1] : tensor<4x4xf32> -> tensor<f32>
  return %l : tensor<f32>
}

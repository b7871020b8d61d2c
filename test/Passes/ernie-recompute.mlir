// RUN: ernie-opt %s --split-input-file --ernie-autodiff --ernie-recompute=mode=full | FileCheck %s --check-prefix=FULL
// RUN: ernie-opt %s --split-input-file --ernie-autodiff --ernie-recompute=mode=selective | FileCheck %s --check-prefix=SELECTIVE
// RUN: ernie-opt %s --split-input-file --ernie-autodiff --ernie-recompute=mode=none | FileCheck %s --check-prefix=NONE

// Two layers. Full: layer 1's forward is made again before its backward,
// from what it reads (layer 0's output %[[A1]], w2); layer 0 keeps nothing
// but its output, which layer 1 reads in the forward, so it has nothing to
// recompute. The copies are marked, so CSE cannot merge them back.
// FULL-LABEL: func.func @forward_grad
// FULL: %[[A1:.+]] = ernie.tanh %{{.+}} : tensor<4x8xf32>
// FULL: %[[L:.+]] = ernie.reduce_sum
// FULL: ernie.full 1.0
// FULL: %[[H2:.+]] = ernie.matmul %[[A1]], %arg2 {ernie.recomputed}
// FULL-NEXT: %[[A2:.+]] = ernie.tanh %[[H2]] {ernie.recomputed}
// FULL-NEXT: ernie.mul %{{.+}}, %[[A2]]
// FULL-NOT: ernie.recomputed
// FULL-NOT: ernie.layer
// FULL: return %[[L]]
// Selective: nothing here is attention: no copies. None strips the marks.
// SELECTIVE-LABEL: func.func @forward_grad
// SELECTIVE-NOT: ernie.recomputed
// NONE-NOT: ernie.layer
// NONE-NOT: ernie.recomputed
func.func @forward(%x: tensor<4x8xf32>, %w1: tensor<8x8xf32> {ernie.param = "w1"}, %w2: tensor<8x8xf32> {ernie.param = "w2"}) -> tensor<f32> {
  %h1 = ernie.matmul %x, %w1 {ernie.layer = "layers.0"} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %a1 = ernie.tanh %h1 {ernie.layer = "layers.0"} : tensor<4x8xf32>
  %h2 = ernie.matmul %a1, %w2 {ernie.layer = "layers.1"} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %a2 = ernie.tanh %h2 {ernie.layer = "layers.1"} : tensor<4x8xf32>
  %s = ernie.mul %a2, %a2 {ernie.layer = "layers.1"} : tensor<4x8xf32>
  %l = ernie.reduce_sum %s axes = [0, 1] : tensor<4x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Pipelined (the stages --ernie-pipeline-split gives): a copy runs in its
// stage's backward chunk.
// SELECTIVE-LABEL: func.func @forward_grad
// SELECTIVE-NOT: ernie.recomputed
// FULL-LABEL: func.func @forward_grad
// FULL: ernie.tanh %{{.+}} {ernie.backward, ernie.recomputed, ernie.stage = 1 : i64}
func.func @forward(%x: tensor<4x8xf32>, %w1: tensor<8x8xf32> {ernie.param = "w1"}, %w2: tensor<8x8xf32> {ernie.param = "w2"}) -> tensor<f32> {
  %h1 = ernie.matmul %x, %w1 {ernie.layer = "layers.0", ernie.stage = 0 : i64} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %a1 = ernie.tanh %h1 {ernie.layer = "layers.0", ernie.stage = 0 : i64} : tensor<4x8xf32>
  %h2 = ernie.matmul %a1, %w2 {ernie.layer = "layers.1", ernie.stage = 1 : i64} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %a2 = ernie.tanh %h2 {ernie.layer = "layers.1", ernie.stage = 1 : i64} : tensor<4x8xf32>
  %s = ernie.mul %a2, %a2 {ernie.layer = "layers.1", ernie.stage = 1 : i64} : tensor<4x8xf32>
  %l = ernie.reduce_sum %s axes = [0, 1] {ernie.stage = 1 : i64} : tensor<4x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// An interleaved pipeline (2 stages x 2 chunks: chunks 0 and 2 on stage 0,
// 1 and 3 on stage 1) with a connection from chunk 1 to chunk 3, as an MoE
// layer's router losses are added to the loss chunks later: chunks 1 and 3
// share a stage, so the value is relayed through chunk 2, and its
// gradient comes back the same way. The run equals four stages of one
// chunk each, where the value goes from chunk 1 to chunk 3 directly, bit
// for bit.
//
// RUN: ernie-opt %s "--ernie-pipeline-split=stages=2 virtual-stages=2" --ernie-autodiff=optimizer=sgd --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=4 schedule=interleaved" | FileCheck %s
// RUN: ernie-opt %s "--ernie-pipeline-split=stages=2 virtual-stages=2" --ernie-autodiff=optimizer=sgd --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=4 schedule=interleaved" | ernie-translate --ernie-to-program -o %t.vpp.ernie
// RUN: sed 's/pp = 2/pp = 4/' %s > %t.pp4.mlir
// RUN: ernie-opt %t.pp4.mlir --ernie-pipeline-split=stages=4 --ernie-autodiff=optimizer=sgd --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=4 schedule=1F1B" | ernie-translate --ernie-to-program -o %t.pp4.ernie
// RUN: rm -rf %t.out && mkdir -p %t.out
// RUN: ernie-run %t.vpp.ernie --steps 3 --quiet --outputs %t.out/vpp
// RUN: ernie-run %t.pp4.ernie --steps 3 --quiet --outputs %t.out/pp4
// RUN: cmp %t.out/vpp/losses.npy %t.out/pp4/losses.npy
// RUN: cmp %t.out/vpp/w0.npy %t.out/pp4/w0.npy
// RUN: cmp %t.out/vpp/w1.npy %t.out/pp4/w1.npy

// Forward: chunk 1 sends its activation to chunk 2, which passes it on.
// CHECK-LABEL: func.func @train_forward.1
// CHECK: ernie.send %[[A1:.+]] to stage 2 channel [[$A:[0-9]+]] : tensor<4x8xf32>
// CHECK-LABEL: func.func @train_forward.2
// CHECK: %[[A:.+]] = ernie.recv from stage 1 channel [[$A]] : tensor<4x8xf32>
// CHECK: ernie.send %[[A]] to stage 3 channel {{[0-9]+}} : tensor<4x8xf32>
// Backward: chunk 3 sends both gradients (its input's and the skip's) to
// chunk 2, which adds the skip's into what it sends chunk 1.
// CHECK-LABEL: func.func @train_backward.3
// CHECK-COUNT-2: ernie.send %{{.+}} to stage 2 channel
// CHECK-LABEL: func.func @train_backward.2
// CHECK-COUNT-2: ernie.recv from stage 3 channel
// CHECK: ernie.send %{{.+}} to stage 1 channel
// CHECK-LABEL: func.func @train_backward.1
// CHECK-NOT: from stage 3
// CHECK: ernie.recv from stage 2 channel
ernie.mesh @mesh(pp = 2)
func.func @forward(%x: tensor<4x8xf32>, %y: tensor<4xi64>,
                   %w0: tensor<8x8xf32> {ernie.param = "w0"},
                   %w1: tensor<8x8xf32> {ernie.param = "w1"},
                   %w2: tensor<8x8xf32> {ernie.param = "w2"},
                   %w3: tensor<8x8xf32> {ernie.param = "w3"}) -> tensor<f32> {
  %h0 = ernie.matmul %x, %w0 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %a0 = ernie.tanh %h0 : tensor<4x8xf32>
  %s0 = ernie.split_point %a0 : tensor<4x8xf32>
  %h1 = ernie.matmul %s0, %w1 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %a1 = ernie.tanh %h1 : tensor<4x8xf32>
  %s1 = ernie.split_point %a1 : tensor<4x8xf32>
  %h2 = ernie.matmul %s1, %w2 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %a2 = ernie.tanh %h2 : tensor<4x8xf32>
  %s2 = ernie.split_point %a2 : tensor<4x8xf32>
  %h3 = ernie.matmul %s2, %w3 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %skip = ernie.add %h3, %a1 : tensor<4x8xf32>
  %loss = ernie.cross_entropy %skip, %y : tensor<4x8xf32>, tensor<4xi64> -> tensor<f32>
  return %loss : tensor<f32>
}

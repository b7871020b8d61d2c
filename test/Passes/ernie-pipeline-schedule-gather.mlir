// A gather partition adds where an mp-split activation leaves a chunk runs
// in the chunk that reads it: the stages exchange the shard (4x4), not the
// gathered whole (4x8) — Megatron's scatter/gather of pipeline transfers.
// RUN: ernie-opt %s --ernie-pipeline-split=stages=2 "--ernie-autodiff=optimizer=sgd" --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=2" | FileCheck %s

// CHECK-LABEL: func.func @train_forward.0
// CHECK-NOT: all_gather
// CHECK: ernie.send %{{.*}} to stage 1 channel [[$ACT:[0-9]+]] : tensor<4x4xf32>
// CHECK-NOT: ernie.send
// CHECK: return
// CHECK-LABEL: func.func @train_forward.1
// CHECK: %[[SHARD:.+]] = ernie.recv from stage 0 channel [[$ACT]] : tensor<4x4xf32>
// CHECK-NEXT: ernie.all_gather %[[SHARD]] over @mesh[mp] dim = 1 : tensor<4x4xf32> -> tensor<4x8xf32>
// CHECK-LABEL: func.func @train_backward.1
// CHECK: ernie.send %{{.*}} to stage 0 channel {{[0-9]+}} : tensor<4x4xf32>

ernie.mesh @mesh(pp = 2, mp = 2)
func.func @forward(%x: tensor<4x8xf32>, %y: tensor<4xi64>,
                   %w0: tensor<8x8xf32> {ernie.param = "w0", ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>},
                   %n: tensor<8xf32> {ernie.param = "norm"},
                   %w1: tensor<8x8xf32> {ernie.param = "w1"}) -> tensor<f32> {
  %h = ernie.matmul %x, %w0 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %s = ernie.split_point %h : tensor<4x8xf32>
  %r = ernie.rms_norm %s, %n, epsilon = 1.0e-6 : tensor<4x8xf32>, tensor<8xf32>
  %g = ernie.matmul %r, %w1 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %loss = ernie.cross_entropy %g, %y : tensor<4x8xf32>, tensor<4xi64> -> tensor<f32>
  return %loss : tensor<f32>
}

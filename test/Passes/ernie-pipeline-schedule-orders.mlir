// The three schedules' step orders for p = 4 stages and m = 8 micro-batches
// (interleaved: v = 2 chunks per stage, in ernie-pipeline-schedule-interleaved.mlir).
// RUN: ernie-opt %s --ernie-pipeline-split=stages=4 --ernie-shared-weight-dedup --ernie-autodiff=optimizer=sgd --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=8 schedule=FThenB" | FileCheck %s --check-prefix=GPIPE
// RUN: ernie-opt %s --ernie-pipeline-split=stages=4 --ernie-shared-weight-dedup --ernie-autodiff=optimizer=sgd --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=8 schedule=1F1B" | FileCheck %s --check-prefix=1F1B
// FThenB (GPipe) runs every forward, then every backward.
// GPIPE: ernie.pipeline_schedule = [
// GPIPE-SAME: "F0:0 F0:1 F0:2 F0:3 F0:4 F0:5 F0:6 F0:7 B0:0 B0:1 B0:2 B0:3 B0:4 B0:5 B0:6 B0:7"
// GPIPE-SAME: "F1:0 F1:1 F1:2 F1:3 F1:4 F1:5 F1:6 F1:7 B1:0 B1:1 B1:2 B1:3 B1:4 B1:5 B1:6 B1:7"
// GPIPE-SAME: "F2:0 F2:1 F2:2 F2:3 F2:4 F2:5 F2:6 F2:7 B2:0 B2:1 B2:2 B2:3 B2:4 B2:5 B2:6 B2:7"
// GPIPE-SAME: "F3:0 F3:1 F3:2 F3:3 F3:4 F3:5 F3:6 F3:7 B3:0 B3:1 B3:2 B3:3 B3:4 B3:5 B3:6 B3:7"
// 1F1B runs p - r - 1 warm-up forwards on rank r, then one forward and one
// backward at a time.
// 1F1B: ernie.pipeline_schedule = [
// 1F1B-SAME: "F0:0 F0:1 F0:2 F0:3 B0:0 F0:4 B0:1 F0:5 B0:2 F0:6 B0:3 F0:7 B0:4 B0:5 B0:6 B0:7"
// 1F1B-SAME: "F1:0 F1:1 F1:2 B1:0 F1:3 B1:1 F1:4 B1:2 F1:5 B1:3 F1:6 B1:4 F1:7 B1:5 B1:6 B1:7"
// 1F1B-SAME: "F2:0 F2:1 B2:0 F2:2 B2:1 F2:3 B2:2 F2:4 B2:3 F2:5 B2:4 F2:6 B2:5 F2:7 B2:6 B2:7"
// 1F1B-SAME: "F3:0 B3:0 F3:1 B3:1 F3:2 B3:2 F3:3 B3:3 F3:4 B3:4 F3:5 B3:5 F3:6 B3:6 F3:7 B3:7"

ernie.mesh @mesh(dp = 2, pp = 4)
func.func @forward(%x: tensor<4x8xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>}, %y: tensor<4xi64> {ernie.sharding = #ernie.sharding<@mesh, [{dp}]>}, %w0: tensor<8x8xf32> {ernie.param = "layers.0.weight"}, %w1: tensor<8x8xf32> {ernie.param = "layers.1.weight"}, %w2: tensor<8x8xf32> {ernie.param = "layers.2.weight"}, %w3: tensor<8x8xf32> {ernie.param = "layers.3.weight"}) -> tensor<f32> {
  %h0 = ernie.matmul %x, %w0 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %a0 = ernie.relu %h0 : tensor<4x8xf32>
  %s0 = ernie.split_point %a0 : tensor<4x8xf32>
  %h1 = ernie.matmul %s0, %w1 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %a1 = ernie.relu %h1 : tensor<4x8xf32>
  %s1 = ernie.split_point %a1 : tensor<4x8xf32>
  %h2 = ernie.matmul %s1, %w2 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %a2 = ernie.relu %h2 : tensor<4x8xf32>
  %s2 = ernie.split_point %a2 : tensor<4x8xf32>
  %h3 = ernie.matmul %s2, %w3 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %a3 = ernie.relu %h3 : tensor<4x8xf32>
  %loss = ernie.cross_entropy %a3, %y : tensor<4x8xf32>, tensor<4xi64> -> tensor<f32>
  return %loss : tensor<f32>
}

// Megatron's interleaved 1F1B for p = 4 stages, v = 2 chunks each (chunk c
// on stage c mod 4), m = 8 micro-batches.
// RUN: ernie-opt %s "--ernie-pipeline-split=stages=4 virtual-stages=2" --ernie-shared-weight-dedup --ernie-autodiff=optimizer=sgd --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=8 schedule=interleaved" | FileCheck %s
// CHECK: ernie.pipeline_schedule = [
// CHECK-SAME: "F0:0 F0:1 F0:2 F0:3 F4:0 F4:1 F4:2 F4:3 F0:4 F0:5 F0:6 B4:0 F0:7 B4:1 F4:4 B4:2 F4:5 B4:3 F4:6 B0:0 F4:7 B0:1 B0:2 B0:3 B4:4 B4:5 B4:6 B4:7 B0:4 B0:5 B0:6 B0:7"
// CHECK-SAME: "F1:0 F1:1 F1:2 F1:3 F5:0 F5:1 F5:2 F5:3 F1:4 B5:0 F1:5 B5:1 F1:6 B5:2 F1:7 B5:3 F5:4 B1:0 F5:5 B1:1 F5:6 B1:2 F5:7 B1:3 B5:4 B5:5 B5:6 B5:7 B1:4 B1:5 B1:6 B1:7"
// CHECK-SAME: "F2:0 F2:1 F2:2 F2:3 F6:0 F6:1 F6:2 B6:0 F6:3 B6:1 F2:4 B6:2 F2:5 B6:3 F2:6 B2:0 F2:7 B2:1 F6:4 B2:2 F6:5 B2:3 F6:6 B6:4 F6:7 B6:5 B6:6 B6:7 B2:4 B2:5 B2:6 B2:7"
// CHECK-SAME: "F3:0 F3:1 F3:2 F3:3 F7:0 B7:0 F7:1 B7:1 F7:2 B7:2 F7:3 B7:3 F3:4 B3:0 F3:5 B3:1 F3:6 B3:2 F3:7 B3:3 F7:4 B7:4 F7:5 B7:5 F7:6 B7:6 F7:7 B7:7 B3:4 B3:5 B3:6 B3:7"
// Each stage holds its two chunks' functions.
// CHECK-DAG: func.func @train_forward.0({{.*}} attributes {ernie.pipeline_stage = 0 : i64}
// CHECK-DAG: func.func @train_forward.4({{.*}} attributes {ernie.pipeline_stage = 0 : i64}
// CHECK-DAG: func.func @train_backward.7({{.*}} attributes {ernie.pipeline_stage = 3 : i64}
// CHECK-DAG: func.func @train_update.3({{.*}} attributes {ernie.pipeline_stage = 3 : i64}
// Chunk 3 (stage 3) hands its output to chunk 4, back on stage 0.
// CHECK-DAG: ernie.send %{{.*}} to stage 4 channel [[C:[0-9]+]]
// CHECK-DAG: ernie.recv from stage 3 channel [[C]]

ernie.mesh @mesh(dp = 2, pp = 4)
func.func @forward(%x: tensor<4x8xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>}, %y: tensor<4xi64> {ernie.sharding = #ernie.sharding<@mesh, [{dp}]>}, %w0: tensor<8x8xf32> {ernie.param = "layers.0.weight"}, %w1: tensor<8x8xf32> {ernie.param = "layers.1.weight"}, %w2: tensor<8x8xf32> {ernie.param = "layers.2.weight"}, %w3: tensor<8x8xf32> {ernie.param = "layers.3.weight"}, %w4: tensor<8x8xf32> {ernie.param = "layers.4.weight"}, %w5: tensor<8x8xf32> {ernie.param = "layers.5.weight"}, %w6: tensor<8x8xf32> {ernie.param = "layers.6.weight"}, %w7: tensor<8x8xf32> {ernie.param = "layers.7.weight"}) -> tensor<f32> {
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
  %s3 = ernie.split_point %a3 : tensor<4x8xf32>
  %h4 = ernie.matmul %s3, %w4 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %a4 = ernie.relu %h4 : tensor<4x8xf32>
  %s4 = ernie.split_point %a4 : tensor<4x8xf32>
  %h5 = ernie.matmul %s4, %w5 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %a5 = ernie.relu %h5 : tensor<4x8xf32>
  %s5 = ernie.split_point %a5 : tensor<4x8xf32>
  %h6 = ernie.matmul %s5, %w6 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %a6 = ernie.relu %h6 : tensor<4x8xf32>
  %s6 = ernie.split_point %a6 : tensor<4x8xf32>
  %h7 = ernie.matmul %s6, %w7 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %a7 = ernie.relu %h7 : tensor<4x8xf32>
  %loss = ernie.cross_entropy %a7, %y : tensor<4x8xf32>, tensor<4xi64> -> tensor<f32>
  return %loss : tensor<f32>
}

// The training step cut into stage functions: sends and receives where a
// value crosses stages, residuals from a chunk's forward to its backward,
// gradients summed over micro-batches (their data-parallel all-reduce moved
// to the update, once per step), a shared weight (and a shared bias the last
// stage holds but does not read: a zero gradient, so it joins the sum)
// summed over its stages, global-norm clipping across stages, replicas
// started equal by a broadcast, and an evaluation with no such sum.
// RUN: ernie-opt %s --ernie-pipeline-split=stages=2 --ernie-shared-weight-dedup "--ernie-autodiff=optimizer=adamw clip-norm=1.0" --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=4" | FileCheck %s

// CHECK: ernie.pipeline = {axis = "pp", micro_batches = 4 : i64, schedule = "1F1B", stages = 2 : i64, virtual_stages = 1 : i64}
// CHECK-SAME: ernie.pipeline_schedule = ["F0:0 F0:1 B0:0 F0:2 B0:1 F0:3 B0:2 B0:3", "F1:0 B1:0 F1:1 B1:1 F1:2 B1:2 F1:3 B1:3"]

// CHECK-LABEL: func.func @train_forward.0
// CHECK-SAME: {ernie.input = 0 : i64
// CHECK-SAME: attributes {ernie.pipeline_stage = 0 : i64}
// CHECK: %[[H:.+]] = ernie.add
// CHECK: ernie.send %[[H]] to stage 1 channel [[$ACT:[0-9]+]] : tensor<2x8xf32>

// CHECK-LABEL: func.func @train_forward.1
// CHECK-SAME: {ernie.input = 1 : i64
// CHECK-SAME: -> ({{.*}}ernie.residual = "residual.{{[0-9]+}}"{{.*}}{ernie.loss
// CHECK: ernie.recv from stage 0 channel [[$ACT]] : tensor<2x8xf32>
// CHECK: ernie.all_reduce %{{.*}} over @mesh[dp] sum : tensor<f32>

// CHECK-LABEL: func.func @train_backward.1
// CHECK-NOT: all_reduce
// CHECK: ernie.send %{{.*}} to stage 0 channel [[$GRAD:[0-9]+]] : tensor<2x8xf32>
// CHECK-NOT: all_reduce
// CHECK: return

// CHECK-LABEL: func.func @train_backward.0
// CHECK-SAME: -> (tensor<1x8xf32> {ernie.gradient = "grad.{{[0-9]+}}"}, tensor<8x8xf32> {ernie.gradient = "grad.{{[0-9]+}}"})
// CHECK-NOT: all_reduce
// CHECK: ernie.recv from stage 1 channel [[$GRAD]] : tensor<2x8xf32>
// CHECK-NOT: all_reduce
// CHECK: return

// CHECK-LABEL: func.func @train_update.0
// CHECK: ernie.full 4.000000e+00
// CHECK: ernie.div
// CHECK: ernie.all_reduce %{{.*}} over @mesh[dp] sum : tensor<1x8xf32>
// CHECK: %[[W0:.+]] = ernie.stage_all_reduce %{{.*}} over stages [0, 1] channel [[$WCH:[0-9]+]] : tensor<8x8xf32>
// CHECK: %[[B0:.+]] = ernie.stage_all_reduce %{{.*}} over stages [0, 1] channel [[$BCH:[0-9]+]] : tensor<8xf32>
// CHECK: ernie.send %{{.*}} to stage 1 channel [[$NORM:[0-9]+]] : tensor<f32>
// CHECK: %[[SCALE:.+]] = ernie.recv from stage 1 channel [[$CLIP:[0-9]+]] : tensor<f32>
// CHECK: ernie.adamw_update
// CHECK: ernie.adamw_update
// CHECK-NOT: ernie.adamw_update
// CHECK: return

// CHECK-LABEL: func.func @train_update.1
// CHECK: ernie.stage_all_reduce %{{.*}} over stages [0, 1] channel [[$WCH]] : tensor<8x8xf32>
// CHECK: %[[ZERO:.+]] = ernie.full 0.000000e+00 : tensor<8xf32>
// CHECK: ernie.stage_all_reduce %[[ZERO]] over stages [0, 1] channel [[$BCH]] : tensor<8xf32>
// CHECK: ernie.recv from stage 0 channel [[$NORM]] : tensor<f32>
// CHECK: ernie.send %{{.*}} to stage 0 channel [[$CLIP]] : tensor<f32>
// CHECK-COUNT-3: ernie.adamw_update

// CHECK-LABEL: func.func @init.0
// CHECK: ernie.stage_broadcast %{{.*}} over stages [0, 1]
// CHECK-LABEL: func.func @init.1
// CHECK: ernie.stage_broadcast %{{.*}} over stages [0, 1]

// CHECK-LABEL: func.func @eval_forward.0
// CHECK-NOT: stage_all_reduce
// CHECK: ernie.send
// CHECK-LABEL: func.func @eval_forward.1
// CHECK-NOT: stage_all_reduce
// CHECK: ernie.recv
// CHECK-NOT: stage_all_reduce
// CHECK: return

ernie.mesh @mesh(dp = 2, pp = 2)
func.func @forward(%x: tensor<4x8xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>},
                   %y: tensor<4xi64> {ernie.sharding = #ernie.sharding<@mesh, [{dp}]>},
                   %w: tensor<8x8xf32> {ernie.param = "shared.weight"},
                   %b: tensor<8xf32> {ernie.param = "shared.bias", ernie.pipeline_stages = array<i64: 0, 1>},
                   %v: tensor<8x8xf32> {ernie.param = "mid.weight"}) -> tensor<f32> {
  %h = ernie.matmul %x, %w : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %bb = ernie.broadcast %b, dims = [1] : tensor<8xf32> -> tensor<4x8xf32>
  %hb = ernie.add %h, %bb : tensor<4x8xf32>
  %s = ernie.split_point %hb : tensor<4x8xf32>
  %m = ernie.matmul %s, %v : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %a = ernie.relu %m : tensor<4x8xf32>
  %g = ernie.matmul %a, %w : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %loss = ernie.cross_entropy %g, %y : tensor<4x8xf32>, tensor<4xi64> -> tensor<f32>
  return %loss : tensor<f32>
}

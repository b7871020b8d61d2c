// Delayed-scaling fp8 under a pipeline: each chunk's forward and backward
// read the amax histories (scales from the step's start) and hand their
// amaxes to the update as maxima over the micro-batches; the update of the
// parameter's rank rolls each history once per step. No forward or
// backward returns state.
// RUN: ernie-opt %s --ernie-pipeline-split=stages=2 "--ernie-autodiff=optimizer=sgd" "--ernie-fp8-lowering=recipe=delayed history-length=4" --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=2" | FileCheck %s

// CHECK-LABEL: func.func @train_forward.0
// CHECK-SAME: ernie.opt_state = "first.weight:fp8_amax.input"
// CHECK-SAME: -> (tensor<f32> {ernie.micro_batch_max = "[[$IN:max\.[0-9]+]]"}, tensor<f32> {ernie.micro_batch_max = "[[$W:max\.[0-9]+]]"},
// CHECK-NOT: ernie.updates
// CHECK: %[[A:.+]] = ernie.reduce_max %{{.*}} axes = [0, 1] : tensor<8x16xf32> -> tensor<f32>
// CHECK-NOT: ernie.concat
// CHECK: return %[[A]],

// CHECK-LABEL: func.func @train_update.0
// CHECK-SAME: %[[NOW:[^:]+]]: tensor<f32> {ernie.micro_batch_max = "[[$IN]]"}, %[[HIST:[^:]+]]: tensor<4xf32> {ernie.opt_state = "first.weight:fp8_amax.input"
// CHECK-SAME: {ernie.micro_batch_max = "[[$W]]"}
// CHECK-SAME: {ernie.micro_batch_max = "[[$GRAD:max\.[0-9]+]]"}
// CHECK-SAME: {{.*}}ernie.updates = "first.weight:fp8_amax.input"
// CHECK-SAME: ernie.updates = "first.weight:fp8_amax.weight"
// CHECK-SAME: ernie.updates = "first.weight:fp8_amax.output_grad"
// CHECK: %[[ONE:.+]] = ernie.reshape %[[NOW]] : tensor<f32> -> tensor<1xf32>
// CHECK: %[[OLD:.+]] = ernie.slice %[[HIST]] [0:3]
// CHECK: %[[ROLLED:.+]] = ernie.concat %[[ONE]], %[[OLD]] axis = 0
// CHECK: return {{.*}}%[[ROLLED]]

// CHECK-LABEL: func.func @train_forward.1
// CHECK-NOT: ernie.updates
// CHECK-LABEL: func.func @train_update.1
// CHECK-COUNT-3: ernie.concat

// CHECK-LABEL: func.func @train_backward.1
// CHECK-SAME: -> (tensor<f32> {ernie.micro_batch_max = "max.{{[0-9]+}}"}, tensor<16x16xf32> {ernie.gradient = "grad.{{[0-9]+}}"})
// CHECK-LABEL: func.func @train_backward.0
// CHECK-SAME: ernie.opt_state = "first.weight:fp8_amax.output_grad"
// CHECK-SAME: -> (tensor<f32> {ernie.micro_batch_max = "[[$GRAD]]"}, tensor<16x16xf32> {ernie.gradient = "grad.{{[0-9]+}}"})

ernie.mesh @mesh(pp = 2)
func.func @forward(%x: tensor<8x16xf32>, %y: tensor<8xi64>,
                   %w: tensor<16x16xf32> {ernie.param = "first.weight"},
                   %v: tensor<16x16xf32> {ernie.param = "second.weight"}) -> tensor<f32> {
  %h = ernie.matmul %x, %w : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
  %s = ernie.split_point %h : tensor<8x16xf32>
  %m = ernie.matmul %s, %v : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
  %loss = ernie.cross_entropy %m, %y : tensor<8x16xf32>, tensor<8xi64> -> tensor<f32>
  return %loss : tensor<f32>
}

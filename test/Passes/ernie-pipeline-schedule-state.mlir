// State that is itself a micro-batch's maximum (a whole tensor's amax) is
// taken by the update as the step's maximum, not returned by the forward
// once per micro-batch. The update holds the state it replaces, though it
// does not read it.
// RUN: ernie-opt %s "--ernie-pipeline-schedule=micro-batches=2" | FileCheck %s

// CHECK-LABEL: func.func @train_forward.0
// CHECK-SAME: -> (tensor<f32> {ernie.micro_batch_max = "[[$MAX:max\.[0-9]+]]"})
// CHECK: %[[M:.+]] = ernie.reduce_max %{{.*}} axes = [0, 1] : tensor<4x8xf32> -> tensor<f32>
// CHECK: return %[[M]]
// CHECK-LABEL: func.func @train_update.0
// CHECK-SAME: (%{{[^:]+}}: tensor<f32> {ernie.opt_state = "w0:amax"}, %[[STEP:[^:]+]]: tensor<f32> {ernie.micro_batch_max = "[[$MAX]]"}) -> (tensor<f32> {ernie.updates = "w0:amax"})
// CHECK: return %[[STEP]]

module attributes {ernie.pipeline = {axis = "pp", stages = 2 : i64, virtual_stages = 1 : i64}} {
ernie.mesh @mesh(pp = 2)
func.func private @chunks(%x: tensor<4x8xf32>, %y: tensor<4xi64>, %w0: tensor<8x8xf32>,
                          %w1: tensor<8x8xf32>) -> (tensor<f32>, tensor<f32>) {
  %h = ernie.matmul %x, %w0 {ernie.stage = 0 : i64} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %g = ernie.matmul %h, %w1 {ernie.stage = 1 : i64} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %loss = ernie.cross_entropy %g, %y {ernie.stage = 1 : i64} : tensor<4x8xf32>, tensor<4xi64> -> tensor<f32>
  %a = ernie.abs %h {ernie.stage = 0 : i64} : tensor<4x8xf32>
  %m = ernie.reduce_max %a axes = [0, 1] {ernie.stage = 0 : i64} : tensor<4x8xf32> -> tensor<f32>
  return %loss, %m : tensor<f32>, tensor<f32>
}
func.func @train_step(%x: tensor<4x8xf32>, %y: tensor<4xi64>,
                      %w0: tensor<8x8xf32> {ernie.param = "w0", ernie.pipeline_stages = array<i64: 0>},
                      %w1: tensor<8x8xf32> {ernie.param = "w1", ernie.pipeline_stages = array<i64: 1>},
                      %st: tensor<f32> {ernie.opt_state = "w0:amax"})
    -> (tensor<f32> {ernie.loss}, tensor<f32> {ernie.updates = "w0:amax"}) {
  %loss, %n = func.call @chunks(%x, %y, %w0, %w1) : (tensor<4x8xf32>, tensor<4xi64>, tensor<8x8xf32>, tensor<8x8xf32>) -> (tensor<f32>, tensor<f32>)
  return %loss, %n : tensor<f32>, tensor<f32>
}
}

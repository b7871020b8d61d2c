// State updated from a sum over the batch's data (MoE routing's count of
// choices per expert) is updated once per step, by the update, from the
// step's sum: each forward hands its micro-batch's sum over, the runtime
// adds them up (`ernie.micro_batch_sum`), and the rule that reads it moves
// into the update. A maximum over the batch's data is handed over alike
// (`ernie.micro_batch_max`).
// RUN: ernie-opt %s --split-input-file "--ernie-pipeline-schedule=micro-batches=2" | FileCheck %s

// CHECK-LABEL: func.func @train_forward.0
// CHECK-SAME: -> (tensor<8xf32> {ernie.micro_batch_sum = "[[$SUM:sum\.[0-9]+]]"})
// CHECK: %[[U:.+]] = ernie.reduce_sum %{{.*}} axes = [0] : tensor<4x8xf32> -> tensor<8xf32>
// CHECK-NOT: ernie.add
// CHECK: return %[[U]]
// CHECK-LABEL: func.func @train_update.0
// CHECK-SAME: %[[ST:[^:]+]]: tensor<8xf32> {ernie.opt_state = "w0:usage"}
// CHECK-SAME: %[[STEP:[^:]+]]: tensor<8xf32> {ernie.micro_batch_sum = "[[$SUM]]"}
// CHECK-SAME: -> (tensor<8xf32> {ernie.updates = "w0:usage"})
// CHECK: %[[N:.+]] = ernie.add %[[ST]], %[[STEP]]
// CHECK: return %[[N]]

module attributes {ernie.pipeline = {axis = "pp", stages = 2 : i64, virtual_stages = 1 : i64}} {
ernie.mesh @mesh(pp = 2)
func.func private @chunks(%x: tensor<4x8xf32>, %y: tensor<4xi64>, %w0: tensor<8x8xf32>,
                          %w1: tensor<8x8xf32>, %st: tensor<8xf32>) -> (tensor<f32>, tensor<8xf32>) {
  %h = ernie.matmul %x, %w0 {ernie.stage = 0 : i64} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %g = ernie.matmul %h, %w1 {ernie.stage = 1 : i64} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %loss = ernie.cross_entropy %g, %y {ernie.stage = 1 : i64} : tensor<4x8xf32>, tensor<4xi64> -> tensor<f32>
  %u = ernie.reduce_sum %h axes = [0] {ernie.stage = 0 : i64} : tensor<4x8xf32> -> tensor<8xf32>
  %n = ernie.add %st, %u {ernie.stage = 0 : i64} : tensor<8xf32>
  return %loss, %n : tensor<f32>, tensor<8xf32>
}
func.func @train_step(%x: tensor<4x8xf32>, %y: tensor<4xi64>,
                      %w0: tensor<8x8xf32> {ernie.param = "w0", ernie.pipeline_stages = array<i64: 0>},
                      %w1: tensor<8x8xf32> {ernie.param = "w1", ernie.pipeline_stages = array<i64: 1>},
                      %st: tensor<8xf32> {ernie.opt_state = "w0:usage"})
    -> (tensor<f32> {ernie.loss}, tensor<8xf32> {ernie.updates = "w0:usage"}) {
  %loss, %n = func.call @chunks(%x, %y, %w0, %w1, %st) : (tensor<4x8xf32>, tensor<4xi64>, tensor<8x8xf32>, tensor<8x8xf32>, tensor<8xf32>) -> (tensor<f32>, tensor<8xf32>)
  return %loss, %n : tensor<f32>, tensor<8xf32>
}
}

// -----

// A sum over every dimension of the batch's data after a per-row maximum
// and a reshape that merges the rows: each sample adds its own term, so
// the step's value is the micro-batches' sum. bf16 is summed over the
// micro-batches in f32 and rounded once in the update.

// CHECK-LABEL: func.func @train_forward.0
// CHECK-SAME: -> (tensor<f32> {ernie.micro_batch_sum = "[[$SUM:sum\.[0-9]+]]"})
// CHECK: %[[R:.+]] = ernie.reduce_sum %{{.*}} axes = [0] : tensor<2xbf16> -> tensor<bf16>
// CHECK: %[[W:.+]] = ernie.cast %[[R]] : tensor<bf16> -> tensor<f32>
// CHECK: return %[[W]]
// CHECK-LABEL: func.func @train_update.0
// CHECK-SAME: %[[STEP:[^:]+]]: tensor<f32> {ernie.micro_batch_sum = "[[$SUM]]"}
// CHECK: %[[B:.+]] = ernie.cast %[[STEP]] : tensor<f32> -> tensor<bf16>
// CHECK: ernie.add %{{.*}}, %[[B]]

module attributes {ernie.pipeline = {axis = "pp", stages = 2 : i64, virtual_stages = 1 : i64}} {
ernie.mesh @mesh(pp = 2)
func.func private @chunks(%x: tensor<4x8xbf16>, %y: tensor<4xi64>, %w0: tensor<8x8xbf16>,
                          %w1: tensor<8x8xbf16>, %st: tensor<bf16>) -> (tensor<bf16>, tensor<bf16>) {
  %h = ernie.matmul %x, %w0 {ernie.stage = 0 : i64} : tensor<4x8xbf16>, tensor<8x8xbf16> -> tensor<4x8xbf16>
  %g = ernie.matmul %h, %w1 {ernie.stage = 1 : i64} : tensor<4x8xbf16>, tensor<8x8xbf16> -> tensor<4x8xbf16>
  %loss = ernie.cross_entropy %g, %y {ernie.stage = 1 : i64} : tensor<4x8xbf16>, tensor<4xi64> -> tensor<bf16>
  %r = ernie.reshape %h {ernie.stage = 0 : i64} : tensor<4x8xbf16> -> tensor<2x16xbf16>
  %m = ernie.reduce_max %r axes = [1] {ernie.stage = 0 : i64} : tensor<2x16xbf16> -> tensor<2xbf16>
  %s = ernie.reduce_sum %m axes = [0] {ernie.stage = 0 : i64} : tensor<2xbf16> -> tensor<bf16>
  %n = ernie.add %st, %s {ernie.stage = 0 : i64} : tensor<bf16>
  return %loss, %n : tensor<bf16>, tensor<bf16>
}
func.func @train_step(%x: tensor<4x8xbf16>, %y: tensor<4xi64>,
                      %w0: tensor<8x8xbf16> {ernie.param = "w0", ernie.pipeline_stages = array<i64: 0>},
                      %w1: tensor<8x8xbf16> {ernie.param = "w1", ernie.pipeline_stages = array<i64: 1>},
                      %st: tensor<bf16> {ernie.opt_state = "w0:peaks"})
    -> (tensor<bf16> {ernie.loss}, tensor<bf16> {ernie.updates = "w0:peaks"}) {
  %loss, %n = func.call @chunks(%x, %y, %w0, %w1, %st) : (tensor<4x8xbf16>, tensor<4xi64>, tensor<8x8xbf16>, tensor<8x8xbf16>, tensor<bf16>) -> (tensor<bf16>, tensor<bf16>)
  return %loss, %n : tensor<bf16>, tensor<bf16>
}
}

// -----

// A maximum over the samples per column (an amax per channel), summed over
// the columns: the micro-batches hand their maxima over (combined by max),
// and the sum over the columns moves into the update with the rule.

// CHECK-LABEL: func.func @train_forward.0
// CHECK-SAME: -> (tensor<8xf32> {ernie.micro_batch_max = "[[$MAX:max\.[0-9]+]]"})
// CHECK: %[[M:.+]] = ernie.reduce_max %{{.*}} axes = [1] : tensor<8x4xf32> -> tensor<8xf32>
// CHECK: return %[[M]]
// CHECK-LABEL: func.func @train_update.0
// CHECK-SAME: %[[STEP:[^:]+]]: tensor<8xf32> {ernie.micro_batch_max = "[[$MAX]]"}
// CHECK: ernie.reduce_sum %[[STEP]] axes = [0]

module attributes {ernie.pipeline = {axis = "pp", stages = 2 : i64, virtual_stages = 1 : i64}} {
ernie.mesh @mesh(pp = 2)
func.func private @chunks(%x: tensor<4x8xf32>, %y: tensor<4xi64>, %w0: tensor<8x8xf32>,
                          %w1: tensor<8x8xf32>, %st: tensor<f32>) -> (tensor<f32>, tensor<f32>) {
  %h = ernie.matmul %x, %w0 {ernie.stage = 0 : i64} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %g = ernie.matmul %h, %w1 {ernie.stage = 1 : i64} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %loss = ernie.cross_entropy %g, %y {ernie.stage = 1 : i64} : tensor<4x8xf32>, tensor<4xi64> -> tensor<f32>
  %t = ernie.transpose %h, perm = [1, 0] {ernie.stage = 0 : i64} : tensor<4x8xf32> -> tensor<8x4xf32>
  %m = ernie.reduce_max %t axes = [1] {ernie.stage = 0 : i64} : tensor<8x4xf32> -> tensor<8xf32>
  %r = ernie.reduce_sum %m axes = [0] {ernie.stage = 0 : i64} : tensor<8xf32> -> tensor<f32>
  %n = ernie.add %st, %r {ernie.stage = 0 : i64} : tensor<f32>
  return %loss, %n : tensor<f32>, tensor<f32>
}
func.func @train_step(%x: tensor<4x8xf32>, %y: tensor<4xi64>,
                      %w0: tensor<8x8xf32> {ernie.param = "w0", ernie.pipeline_stages = array<i64: 0>},
                      %w1: tensor<8x8xf32> {ernie.param = "w1", ernie.pipeline_stages = array<i64: 1>},
                      %st: tensor<f32> {ernie.opt_state = "w0:peak_sum"})
    -> (tensor<f32> {ernie.loss}, tensor<f32> {ernie.updates = "w0:peak_sum"}) {
  %loss, %n = func.call @chunks(%x, %y, %w0, %w1, %st) : (tensor<4x8xf32>, tensor<4xi64>, tensor<8x8xf32>, tensor<8x8xf32>, tensor<f32>) -> (tensor<f32>, tensor<f32>)
  return %loss, %n : tensor<f32>, tensor<f32>
}
}

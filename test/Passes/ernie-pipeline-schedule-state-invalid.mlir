// State a step updates outside the optimizer is updated once per step, in
// the update, from maxima and sums over the batch's data the micro-batches
// hand over; anything else computed from the batch cannot be (a sum or a
// max that keeps a row per sample, a mean), and is rejected.
// RUN: ernie-opt %s --split-input-file --verify-diagnostics "--ernie-pipeline-schedule=micro-batches=2"

// A mean over the batch: the micro-batches' means do not add up to it.
module attributes {ernie.pipeline = {axis = "pp", stages = 2 : i64, virtual_stages = 1 : i64}} {
ernie.mesh @mesh(pp = 2)
func.func private @chunks(%x: tensor<4x8xf32>, %y: tensor<4xi64>, %w0: tensor<8x8xf32>,
                          %w1: tensor<8x8xf32>, %st: tensor<f32>) -> (tensor<f32>, tensor<f32>) {
  %h = ernie.matmul %x, %w0 {ernie.stage = 0 : i64} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %g = ernie.matmul %h, %w1 {ernie.stage = 1 : i64} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %loss = ernie.cross_entropy %g, %y {ernie.stage = 1 : i64} : tensor<4x8xf32>, tensor<4xi64> -> tensor<f32>
  %s = ernie.reduce_mean %h axes = [0, 1] {ernie.stage = 0 : i64} : tensor<4x8xf32> -> tensor<f32>
  %n = ernie.add %st, %s {ernie.stage = 0 : i64} : tensor<f32>
  return %loss, %n : tensor<f32>, tensor<f32>
}
func.func @train_step(%x: tensor<4x8xf32>, %y: tensor<4xi64>,
                      %w0: tensor<8x8xf32> {ernie.param = "w0", ernie.pipeline_stages = array<i64: 0>},
                      %w1: tensor<8x8xf32> {ernie.param = "w1", ernie.pipeline_stages = array<i64: 1>},
                      %st: tensor<f32> {ernie.opt_state = "w0:activation_sum"})
    -> (tensor<f32> {ernie.loss}, tensor<f32> {ernie.updates = "w0:activation_sum"}) {
  %loss, %n = func.call @chunks(%x, %y, %w0, %w1, %st) : (tensor<4x8xf32>, tensor<4xi64>, tensor<8x8xf32>, tensor<8x8xf32>, tensor<f32>) -> (tensor<f32>, tensor<f32>)
  // expected-error @+1 {{pipeline split: state 'w0:activation_sum' is updated from the batch by more than a maximum or a sum over it; a pipeline sees the batch one micro-batch at a time and combines only gradients (averaged), maxima and sums over the batch's data}}
  return %loss, %n : tensor<f32>, tensor<f32>
}
}

// -----

// A maximum per sample (over its columns), added to the state: a row
// per sample, which the micro-batches neither add up to nor have as their
// maximum.
module attributes {ernie.pipeline = {axis = "pp", stages = 2 : i64, virtual_stages = 1 : i64}} {
ernie.mesh @mesh(pp = 2)
func.func private @chunks(%x: tensor<4x8xf32>, %y: tensor<4xi64>, %w0: tensor<8x8xf32>,
                          %w1: tensor<8x8xf32>, %st: tensor<4xf32>) -> (tensor<f32>, tensor<4xf32>) {
  %h = ernie.matmul %x, %w0 {ernie.stage = 0 : i64} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %g = ernie.matmul %h, %w1 {ernie.stage = 1 : i64} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %loss = ernie.cross_entropy %g, %y {ernie.stage = 1 : i64} : tensor<4x8xf32>, tensor<4xi64> -> tensor<f32>
  %s = ernie.reduce_max %h axes = [1] {ernie.stage = 0 : i64} : tensor<4x8xf32> -> tensor<4xf32>
  %n = ernie.add %st, %s {ernie.stage = 0 : i64} : tensor<4xf32>
  return %loss, %n : tensor<f32>, tensor<4xf32>
}
func.func @train_step(%x: tensor<4x8xf32>, %y: tensor<4xi64>,
                      %w0: tensor<8x8xf32> {ernie.param = "w0", ernie.pipeline_stages = array<i64: 0>},
                      %w1: tensor<8x8xf32> {ernie.param = "w1", ernie.pipeline_stages = array<i64: 1>},
                      %st: tensor<4xf32> {ernie.opt_state = "w0:activation_sum"})
    -> (tensor<f32> {ernie.loss}, tensor<4xf32> {ernie.updates = "w0:activation_sum"}) {
  %loss, %n = func.call @chunks(%x, %y, %w0, %w1, %st) : (tensor<4x8xf32>, tensor<4xi64>, tensor<8x8xf32>, tensor<8x8xf32>, tensor<4xf32>) -> (tensor<f32>, tensor<4xf32>)
  // expected-error @+1 {{pipeline split: state 'w0:activation_sum' is updated from the batch by more than a maximum or a sum over it; a pipeline sees the batch one micro-batch at a time and combines only gradients (averaged), maxima and sums over the batch's data}}
  return %loss, %n : tensor<f32>, tensor<4xf32>
}
}

// -----

// A sum that keeps the batch's rows (through a transpose): a value per
// sample, which the micro-batches do not add up to.
module attributes {ernie.pipeline = {axis = "pp", stages = 2 : i64, virtual_stages = 1 : i64}} {
ernie.mesh @mesh(pp = 2)
func.func private @chunks(%x: tensor<4x8xf32>, %y: tensor<4xi64>, %w0: tensor<8x8xf32>,
                          %w1: tensor<8x8xf32>, %st: tensor<4xf32>) -> (tensor<f32>, tensor<4xf32>) {
  %h = ernie.matmul %x, %w0 {ernie.stage = 0 : i64} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %g = ernie.matmul %h, %w1 {ernie.stage = 1 : i64} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %loss = ernie.cross_entropy %g, %y {ernie.stage = 1 : i64} : tensor<4x8xf32>, tensor<4xi64> -> tensor<f32>
  %t = ernie.transpose %h, perm = [1, 0] {ernie.stage = 0 : i64} : tensor<4x8xf32> -> tensor<8x4xf32>
  %s = ernie.reduce_sum %t axes = [0] {ernie.stage = 0 : i64} : tensor<8x4xf32> -> tensor<4xf32>
  %n = ernie.add %st, %s {ernie.stage = 0 : i64} : tensor<4xf32>
  return %loss, %n : tensor<f32>, tensor<4xf32>
}
func.func @train_step(%x: tensor<4x8xf32>, %y: tensor<4xi64>,
                      %w0: tensor<8x8xf32> {ernie.param = "w0", ernie.pipeline_stages = array<i64: 0>},
                      %w1: tensor<8x8xf32> {ernie.param = "w1", ernie.pipeline_stages = array<i64: 1>},
                      %st: tensor<4xf32> {ernie.opt_state = "w0:row_sums"})
    -> (tensor<f32> {ernie.loss}, tensor<4xf32> {ernie.updates = "w0:row_sums"}) {
  %loss, %n = func.call @chunks(%x, %y, %w0, %w1, %st) : (tensor<4x8xf32>, tensor<4xi64>, tensor<8x8xf32>, tensor<8x8xf32>, tensor<4xf32>) -> (tensor<f32>, tensor<4xf32>)
  // expected-error @+1 {{pipeline split: state 'w0:row_sums' is updated from the batch by more than a maximum or a sum over it}}
  return %loss, %n : tensor<f32>, tensor<4xf32>
}
}

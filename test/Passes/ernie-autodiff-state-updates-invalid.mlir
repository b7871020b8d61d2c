// RUN: ernie-opt %s --split-input-file --ernie-autodiff=optimizer=sgd --verify-diagnostics

// expected-error @+1 {{result #1 of the loss function is not the loss: extra results must update a state argument (ernie.updates)}}
func.func @forward(%w: tensor<4xf32> {ernie.param = "w"}) -> (tensor<f32>, tensor<4xf32>) {
  %loss = ernie.reduce_sum %w axes = [0] : tensor<4xf32> -> tensor<f32>
  return %loss, %w : tensor<f32>, tensor<4xf32>
}

// -----

// expected-error @+1 {{result #1 updates 'w:bias', which no argument holds (ernie.opt_state)}}
func.func @forward(%w: tensor<4xf32> {ernie.param = "w"}) -> (tensor<f32>, tensor<4xf32> {ernie.updates = "w:bias"}) {
  %loss = ernie.reduce_sum %w axes = [0] : tensor<4xf32> -> tensor<f32>
  return %loss, %w : tensor<f32>, tensor<4xf32>
}

// -----

// expected-error @+1 {{result #1 updates 'w:bias' of type 'tensor<2xf32>' with 'tensor<4xf32>'}}
func.func @forward(%w: tensor<4xf32> {ernie.param = "w"}, %b: tensor<2xf32> {ernie.opt_state = "w:bias"}) -> (tensor<f32>, tensor<4xf32> {ernie.updates = "w:bias"}) {
  %loss = ernie.reduce_sum %w axes = [0] : tensor<4xf32> -> tensor<f32>
  return %loss, %w : tensor<f32>, tensor<4xf32>
}

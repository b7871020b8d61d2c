// RUN: ernie-opt %s --split-input-file --ernie-autodiff --verify-diagnostics

// expected-error @+1 {{the loss function must return one scalar float tensor (tensor<f32>), got '(tensor<4xf32>) -> tensor<4xf32>'}}
func.func @forward(%p: tensor<4xf32> {ernie.param = "p"}) -> tensor<4xf32> {
  return %p : tensor<4xf32>
}

// -----

// expected-error @+1 {{parameter 'steps' is not a floating-point tensor: 'tensor<4xi64>'}}
func.func @forward(%p: tensor<4xi64> {ernie.param = "steps"}) -> tensor<f32> {
  %0 = ernie.full 0.0 : tensor<f32>
  return %0 : tensor<f32>
}

// -----

func.func @forward(%l: tensor<2x8xf32> {ernie.param = "logits"}, %y: tensor<2xi64>) -> tensor<f32> {
  %one = ernie.full 1.0 : tensor<f32>
  // expected-error @+1 {{'ernie.cross_entropy_grad' has no gradient rule, but lies between a parameter and the loss}}
  %g = ernie.cross_entropy_grad %l, %y, %one : tensor<2x8xf32>, tensor<2xi64>, tensor<f32> -> tensor<2x8xf32>
  %s = ernie.reduce_sum %g axes = [0, 1] : tensor<2x8xf32> -> tensor<f32>
  return %s : tensor<f32>
}

// -----

// expected-error @+1 {{no function @forward to differentiate}}
module {
  func.func @loss(%p: tensor<4xf32>) -> tensor<4xf32> {
    return %p : tensor<4xf32>
  }
}


// -----

// expected-error @+1 {{the module already has a @forward_grad}}
func.func @forward(%p: tensor<4xf32> {ernie.param = "p"}) -> tensor<f32> {
  %0 = ernie.reduce_sum %p axes = [0] : tensor<4xf32> -> tensor<f32>
  return %0 : tensor<f32>
}
func.func @forward_grad() {
  return
}

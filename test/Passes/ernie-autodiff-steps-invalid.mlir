// RUN: ernie-opt %s --ernie-autodiff=optimizer=sgd --verify-diagnostics

// expected-error @+1 {{the module already has a @train_step}}
module {
  func.func @forward(%p: tensor<4xf32> {ernie.param = "p"}) -> tensor<f32> {
    %0 = ernie.reduce_sum %p axes = [0] : tensor<4xf32> -> tensor<f32>
    return %0 : tensor<f32>
  }
  func.func @train_step() {
    return
  }
}

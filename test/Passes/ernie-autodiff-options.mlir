// RUN: not ernie-opt %s --ernie-autodiff=optimizer=lamb 2>&1 | FileCheck %s
// CHECK: unknown optimizer 'lamb' (expected none, sgd or adamw)
func.func @forward(%p: tensor<4xf32> {ernie.param = "p"}) -> tensor<f32> {
  %0 = ernie.reduce_sum %p axes = [0] : tensor<4xf32> -> tensor<f32>
  return %0 : tensor<f32>
}

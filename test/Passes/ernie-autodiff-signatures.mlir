// A private loss function survives the inlining autodiff does first, and
// batch arguments need not be tensors.
// RUN: ernie-opt %s --ernie-autodiff=optimizer=sgd | FileCheck %s

// CHECK-LABEL: func.func private @forward
// CHECK-LABEL: func.func private @forward_grad
// CHECK-LABEL: func.func @train_step
// CHECK-SAME: %{{[a-z0-9]+}}: i64, %{{[a-z0-9]+}}: tensor<f32> {ernie.learning_rate}, %{{[a-z0-9]+}}: tensor<i64> {ernie.step})
// CHECK-SAME: -> (tensor<f32> {ernie.loss},
// CHECK-LABEL: func.func @eval_step
// CHECK-SAME: %{{[a-z0-9]+}}: i64) -> (tensor<f32> {ernie.loss})
func.func private @forward(%p: tensor<4xf32> {ernie.param = "p"}, %n: i64) -> tensor<f32> {
  %0 = ernie.reduce_sum %p axes = [0] : tensor<4xf32> -> tensor<f32>
  return %0 : tensor<f32>
}

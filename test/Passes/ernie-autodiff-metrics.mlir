// A metric the model reports (`ernie.metric` on a result of the loss
// function, after its state updates): not differentiated, returned by the
// training step before the gradient norm and by the evaluation step after
// the loss, named as the forward names it.
// RUN: ernie-opt %s -split-input-file "--ernie-autodiff=optimizer=sgd grad-norm=true" -verify-diagnostics | FileCheck %s

// CHECK-LABEL: func.func @forward_grad
// CHECK-SAME: -> (tensor<f32> {ernie.loss}, tensor<4xf32> {ernie.grad_of = "p"}, tensor<f32>)
// CHECK-LABEL: func.func @train_step
// CHECK-SAME: tensor<4xf32> {ernie.updates = "p:momentum"}, tensor<f32> {ernie.metric = "aux_loss"}, tensor<f32> {ernie.metric = "grad_norm"})
// CHECK: %[[G:.+]]:3 = call @forward_grad
// CHECK: return %[[G]]#0, {{.*}}, %[[G]]#2, %{{.*}} : tensor<f32>
// CHECK-LABEL: func.func @eval_step
// CHECK-SAME: -> (tensor<f32> {ernie.loss}, tensor<f32> {ernie.metric = "aux_loss"})
// CHECK: %[[E:.+]]:2 = call @forward
// CHECK: return %[[E]]#0, %[[E]]#1
func.func @forward(%p: tensor<4xf32> {ernie.param = "p"}) -> (tensor<f32>, tensor<f32> {ernie.metric = "aux_loss"}) {
  %0 = ernie.reduce_sum %p axes = [0] : tensor<4xf32> -> tensor<f32>
  %1 = ernie.mul %0, %0 : tensor<f32>
  %2 = ernie.add %0, %1 : tensor<f32>
  return %2, %1 : tensor<f32>, tensor<f32>
}

// -----

// The dialect refuses a metric that is not a float scalar.
// expected-error @+1 {{metric 'aux_loss' (result #1) must be a scalar float tensor}}
func.func @forward(%p: tensor<4xf32> {ernie.param = "p"}) -> (tensor<f32>, tensor<4xf32> {ernie.metric = "aux_loss"}) {
  %0 = ernie.reduce_sum %p axes = [0] : tensor<4xf32> -> tensor<f32>
  return %0, %p : tensor<f32>, tensor<4xf32>
}

// -----

// expected-error @+1 {{result #1 (metric 'aux_loss') must be a float scalar after the state updates}}
func.func @forward(%p: tensor<4xf32> {ernie.param = "p"}, %s: tensor<4xf32> {ernie.opt_state = "p:bias"}) -> (tensor<f32>, tensor<f32> {ernie.metric = "aux_loss"}, tensor<4xf32> {ernie.updates = "p:bias"}) {
  %0 = ernie.reduce_sum %p axes = [0] : tensor<4xf32> -> tensor<f32>
  return %0, %0, %s : tensor<f32>, tensor<f32>, tensor<4xf32>
}

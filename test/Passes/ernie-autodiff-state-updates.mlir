// RUN: ernie-opt %s --split-input-file "--ernie-autodiff=optimizer=sgd" | FileCheck %s
// Under ZeRO-1 the state is split over dp like a slot, in and out.
// RUN: sed 's/^func.func @forward/ernie.mesh @mesh(dp = 2)\nfunc.func @forward/' %s | ernie-opt "--ernie-autodiff=optimizer=sgd" --ernie-zero-sharding=level=1 | FileCheck %s --check-prefix=ZERO
// ZERO-LABEL: func.func @train_step
// ZERO-SAME: {ernie.opt_state = "w:bias", ernie.sharding = #ernie.sharding<@mesh, [{dp}]>}
// ZERO-SAME: tensor<4xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}]>, ernie.updates = "w:bias"}

// A forward may return, after its loss, the new value of a state argument
// that a rule of the model updates (MoE's aux-free balancing bias): not
// differentiated, carried by the training step, left alone by evaluation
// and by the forward called alone.

// CHECK-LABEL: func.func @forward
// CHECK-SAME: -> (tensor<f32>, tensor<4xf32>)
// CHECK-LABEL: func.func @forward_grad
// CHECK-SAME: -> (tensor<f32> {ernie.loss}, tensor<4xf32> {ernie.grad_of = "w"}, tensor<4xf32>)
// CHECK-LABEL: func.func @train_step
// CHECK-SAME: (%[[W:[a-z0-9]+]]: tensor<4xf32> {ernie.param = "w"}, %[[MOM:[a-z0-9]+]]: tensor<4xf32> {ernie.opt_state = "w:momentum"}, %[[B:[a-z0-9]+]]: tensor<4xf32> {ernie.opt_state = "w:bias"}, %[[X:[a-z0-9]+]]: tensor<4xf32>, %{{.+}}: tensor<f32> {ernie.learning_rate}, %{{.+}}: tensor<i64> {ernie.step})
// CHECK-SAME: -> (tensor<f32> {ernie.loss}, tensor<4xf32> {ernie.updates = "w"}, tensor<4xf32> {ernie.updates = "w:momentum"}, tensor<4xf32> {ernie.updates = "w:bias"})
// CHECK: %[[G:.+]]:3 = call @forward_grad(%[[X]], %[[W]], %[[B]])
// CHECK: return %[[G]]#0, %{{.+}}, %{{.+}}, %[[G]]#2
// CHECK-LABEL: func.func @eval_step
// CHECK-SAME: (%{{.+}}: tensor<4xf32> {ernie.param = "w"}, %[[EB:[a-z0-9]+]]: tensor<4xf32> {ernie.opt_state = "w:bias"}, %[[EX:[a-z0-9]+]]: tensor<4xf32>) -> (tensor<f32> {ernie.loss})
// CHECK: %[[E:.+]]:2 = call @forward(%[[EX]], %{{.+}}, %[[EB]])
// CHECK-NEXT: return %[[E]]#0
func.func @forward(%x: tensor<4xf32>, %w: tensor<4xf32> {ernie.param = "w"},
                   %b: tensor<4xf32> {ernie.opt_state = "w:bias"})
    -> (tensor<f32>, tensor<4xf32> {ernie.updates = "w:bias"}) {
  %y = ernie.mul %x, %w : tensor<4xf32>
  %z = ernie.add %y, %b : tensor<4xf32>
  %loss = ernie.reduce_sum %z axes = [0] : tensor<4xf32> -> tensor<f32>
  %step = ernie.full 0.5 : tensor<4xf32>
  %nb = ernie.add %b, %step : tensor<4xf32>
  return %loss, %nb : tensor<f32>, tensor<4xf32>
}

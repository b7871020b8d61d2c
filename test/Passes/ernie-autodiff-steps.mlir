// RUN: ernie-opt %s --split-input-file "--ernie-autodiff=optimizer=adamw weight-decay=0.05" | FileCheck %s --check-prefix=ADAMW
// RUN: ernie-opt %s --split-input-file "--ernie-autodiff=optimizer=sgd momentum=0.9 clip-norm=1.0 multi-precision=true" | FileCheck %s --check-prefix=SGD

// ADAMW-LABEL: func.func @train_step
// ADAMW-SAME: (%[[W:[a-z0-9]+]]: tensor<8x2xbf16> {ernie.param = "w"}, %[[M:[a-z0-9]+]]: tensor<8x2xbf16> {ernie.opt_state = "w:moment1"}, %[[V:[a-z0-9]+]]: tensor<8x2xbf16> {ernie.opt_state = "w:moment2"}, %[[X:[a-z0-9]+]]: tensor<4x8xbf16>, %[[LR:[a-z0-9]+]]: tensor<f32> {ernie.learning_rate}, %[[STEP:[a-z0-9]+]]: tensor<i64> {ernie.step})
// ADAMW-SAME: -> (tensor<f32> {ernie.loss}, tensor<8x2xbf16> {ernie.updates = "w"}, tensor<8x2xbf16> {ernie.updates = "w:moment1"}, tensor<8x2xbf16> {ernie.updates = "w:moment2"})
// ADAMW: %[[G:.+]]:2 = call @forward_grad(%[[X]], %[[W]])
// ADAMW: %[[P:.+]], %[[M2:.+]], %[[V2:.+]] = ernie.adamw_update %[[W]], %[[G]]#1, %[[M]], %[[V]], %[[LR]], %[[STEP]] {weight_decay = 5.000000e-02 : f64}
// ADAMW: return %[[G]]#0, %[[P]], %[[M2]], %[[V2]]
// The evaluation step runs the forward only: no gradient, no update.
// ADAMW-LABEL: func.func @eval_step
// ADAMW-SAME: (%[[EW:[a-z0-9]+]]: tensor<8x2xbf16> {ernie.param = "w"}, %[[EX:[a-z0-9]+]]: tensor<4x8xbf16>) -> (tensor<f32> {ernie.loss})
// ADAMW-NEXT: %[[L:.+]] = call @forward(%[[EX]], %[[EW]])
// ADAMW-NEXT: return %[[L]]
// ADAMW-NOT: _grad
// ADAMW-NOT: update

// Multi-precision momentum SGD keeps an f32 master copy; gradients in f32, clipped to a
// global norm, and the bf16 parameter is the rounded master.
// SGD-LABEL: func.func @train_step
// SGD-SAME: (%[[W:[a-z0-9]+]]: tensor<8x2xbf16> {ernie.param = "w"}, %[[MASTER:[a-z0-9]+]]: tensor<8x2xf32> {ernie.opt_state = "w:master"}, %[[BUF:[a-z0-9]+]]: tensor<8x2xf32> {ernie.opt_state = "w:momentum"}
// SGD: %[[G:.+]]:2 = call @forward_grad
// SGD: %[[G32:.+]] = ernie.cast %[[G]]#1 : tensor<8x2xbf16> -> tensor<8x2xf32>
// SGD: ernie.sqrt
// SGD: ernie.minimum
// SGD: %[[CLIPPED:.+]] = ernie.mul %[[G32]], %{{.*}} : tensor<8x2xf32>
// SGD: %[[NEW:.+]], %[[NEWBUF:.+]] = ernie.sgd_update %[[MASTER]], %[[CLIPPED]], %[[BUF]], %{{.*}} {momentum = 9.000000e-01 : f64}
// SGD: %[[ROUNDED:.+]] = ernie.cast %[[NEW]] : tensor<8x2xf32> -> tensor<8x2xbf16>
// SGD: return %[[G]]#0, %[[ROUNDED]], %[[NEW]], %[[NEWBUF]]
func.func @forward(%x: tensor<4x8xbf16>, %w: tensor<8x2xbf16> {ernie.param = "w"}) -> tensor<f32> {
  %h = ernie.matmul %x, %w : tensor<4x8xbf16>, tensor<8x2xbf16> -> tensor<4x2xbf16>
  %f = ernie.cast %h : tensor<4x2xbf16> -> tensor<4x2xf32>
  %l = ernie.reduce_mean %f axes = [0, 1] : tensor<4x2xf32> -> tensor<f32>
  return %l : tensor<f32>
}

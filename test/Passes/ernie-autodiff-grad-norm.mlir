// The step's gradient norm: returned last as the metric "grad_norm", the
// one norm clipping scales by when both are on.
// RUN: ernie-opt %s "--ernie-autodiff=optimizer=sgd grad-norm=true" | FileCheck %s --check-prefix=NORM
// RUN: ernie-opt %s "--ernie-autodiff=optimizer=sgd grad-norm=true clip-norm=1.0" | FileCheck %s --check-prefix=CLIP
// RUN: ernie-opt %s "--ernie-autodiff=optimizer=sgd" | FileCheck %s --check-prefix=NONE
// RUN: not ernie-opt %s "--ernie-autodiff=grad-norm=true" 2>&1 | FileCheck %s --check-prefix=NOSTEP
// RUN: ernie-opt %s "--ernie-training-pipeline=optimizer=adamw grad-norm=true" | FileCheck %s --check-prefix=PIPE

// NORM-LABEL: func.func @train_step
// NORM-SAME: -> (tensor<f32> {ernie.loss}, tensor<4xf32> {ernie.updates = "p"}, tensor<3xf32> {ernie.updates = "q"}, tensor<4xf32> {ernie.updates = "p:momentum"}, tensor<3xf32> {ernie.updates = "q:momentum"}, tensor<f32> {ernie.metric = "grad_norm"})
// NORM: %[[GRADS:.+]]:3 = call @forward_grad
// NORM: %[[SQP:.+]] = ernie.mul %[[GRADS]]#1, %[[GRADS]]#1 : tensor<4xf32>
// NORM: %[[SP:.+]] = ernie.reduce_sum %[[SQP]] axes = [0]
// NORM: %[[SQQ:.+]] = ernie.mul %[[GRADS]]#2, %[[GRADS]]#2 : tensor<3xf32>
// NORM: %[[ROOT:.+]] = ernie.sqrt
// Unclipped: the update takes the gradient itself.
// NORM: ernie.sgd_update %{{.*}}, %[[GRADS]]#1
// NORM: return %[[GRADS]]#0, {{.*}}, %[[ROOT]] : tensor<f32>

// CLIP-LABEL: func.func @train_step
// CLIP: %[[N:.+]] = ernie.sqrt
// CLIP-NOT: ernie.sqrt
// CLIP: ernie.add %[[N]]
// CLIP-NOT: ernie.sqrt
// CLIP: return {{.*}}, %[[N]] : tensor<f32>

// NONE-NOT: ernie.metric
// NONE-NOT: ernie.sqrt

// NOSTEP: grad-norm is a training step's result: it needs optimizer=sgd or adamw

// PIPE: ernie.metric = "grad_norm"

func.func @forward(%p: tensor<4xf32> {ernie.param = "p"},
                   %q: tensor<3xf32> {ernie.param = "q"}) -> tensor<f32> {
  %0 = ernie.reduce_sum %p axes = [0] : tensor<4xf32> -> tensor<f32>
  %1 = ernie.reduce_sum %q axes = [0] : tensor<3xf32> -> tensor<f32>
  %2 = ernie.mul %0, %1 : tensor<f32>
  return %2 : tensor<f32>
}

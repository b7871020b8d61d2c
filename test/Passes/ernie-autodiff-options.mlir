// RUN: not ernie-opt %s --ernie-autodiff=optimizer=lamb 2>&1 | FileCheck %s --check-prefix=OPT
// RUN: not ernie-opt %s --ernie-autodiff=loss-scale=0 2>&1 | FileCheck %s --check-prefix=SCALE
// RUN: not ernie-opt %s --ernie-autodiff=function=nothing 2>&1 | FileCheck %s --check-prefix=FN
// RUN: ernie-opt %s --ernie-autodiff=loss-scale=128 | FileCheck %s
// OPT: unknown optimizer 'lamb' (expected none, sgd or adamw)
// SCALE: loss-scale must be positive, got 0
// FN: no function @nothing to differentiate
// Hyper-parameters the update would compute NaN from, named by option.
// RUN: not ernie-opt %s "--ernie-autodiff=optimizer=adamw clip-norm=-1" 2>&1 | FileCheck %s --check-prefix=CLIP
// RUN: not ernie-opt %s "--ernie-autodiff=optimizer=adamw beta1=nan" 2>&1 | FileCheck %s --check-prefix=BETA
// RUN: not ernie-opt %s "--ernie-autodiff=optimizer=sgd momentum=1" 2>&1 | FileCheck %s --check-prefix=MOM
// RUN: not ernie-opt %s "--ernie-autodiff=optimizer=adamw weight-decay=inf" 2>&1 | FileCheck %s --check-prefix=WD
// RUN: not ernie-opt %s "--ernie-autodiff=optimizer=adamw epsilon=-1e-8" 2>&1 | FileCheck %s --check-prefix=EPS
// CLIP: error: clip-norm must be finite and >= 0, got -1
// BETA: error: beta1 must be in [0, 1), got nan
// MOM: error: momentum must be in [0, 1), got 1
// WD: error: weight-decay must be finite and >= 0, got {{inf|INF}}
// EPS: error: epsilon must be finite and >= 0, got -1.000000e-08
// The backward starts from the scale and the gradient is divided by it.
// CHECK-LABEL: func.func @forward_grad
// CHECK-DAG: ernie.full 1.280000e+02 : tensor<f32>
// CHECK-DAG: %[[S:.+]] = ernie.full 1.280000e+02 : tensor<4xf32>
// CHECK: %[[G:.+]] = ernie.div %{{.*}}, %[[S]] : tensor<4xf32>
// CHECK: return %{{.*}}, %[[G]]
func.func @forward(%p: tensor<4xf32> {ernie.param = "p"}) -> tensor<f32> {
  %0 = ernie.reduce_sum %p axes = [0] : tensor<4xf32> -> tensor<f32>
  return %0 : tensor<f32>
}

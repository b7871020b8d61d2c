// A bf16 model's gradients are handed from the backward to the update in
// f32 and summed over the micro-batches there (Megatron's main grads). By
// default (accumulate=gemm) each backward takes the running f32 sums and
// its weight gradients' GEMMs add into them (matmul_accumulate: bf16
// operands, the product never rounded to bf16); with accumulate=add it
// widens each GEMM's bf16 gradient and adds it (Megatron without gradient
// accumulation fusion); with accumulate=runtime it widens each gradient and
// the runtime adds them. Either way the update averages in f32 and narrows
// it back for the optimizer (which, with multi-precision, widens it again
// for its f32 master weights). Values that stay inside a phase keep bf16.
// RUN: ernie-opt %s --ernie-pipeline-split=stages=2 "--ernie-autodiff=optimizer=sgd" --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=4" | FileCheck %s --check-prefixes=CHECK,GEMM
// RUN: ernie-opt %s --ernie-pipeline-split=stages=2 "--ernie-autodiff=optimizer=sgd" --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=4 accumulate=add" | FileCheck %s --check-prefixes=CHECK,ADD
// RUN: ernie-opt %s --ernie-pipeline-split=stages=2 "--ernie-autodiff=optimizer=sgd" --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=4 accumulate=runtime" | FileCheck %s --check-prefixes=CHECK,RUNTIME

// CHECK-LABEL: func.func @train_forward.0
// CHECK: ernie.send %{{.*}} to stage 1 channel [[$ACT:[0-9]+]] : tensor<8x8xbf16>

// CHECK-LABEL: func.func @train_backward.1
// GEMM-SAME: %[[SUM1:[^:]+]]: tensor<8x8xf32> {ernie.gradient = "[[N1:grad\.[0-9]+]]"}) -> (tensor<8x8xf32> {ernie.gradient = "[[N1]]"})
// ADD-SAME: %[[SUM1:[^:]+]]: tensor<8x8xf32> {ernie.gradient = "[[N1:grad\.[0-9]+]]"}) -> (tensor<8x8xf32> {ernie.gradient = "[[N1]]"})
// RUNTIME-SAME: -> (tensor<8x8xf32> {ernie.gradient = "grad.{{[0-9]+}}"})
// GEMM-NOT: ernie.cast %{{.*}} -> tensor<8x8xf32>
// GEMM: %[[G1:.+]] = ernie.matmul_accumulate %{{.*}}, %{{.*}}, %[[SUM1]] {transpose_a} : tensor<8x8xbf16>, tensor<8x8xbf16>, tensor<8x8xf32> -> tensor<8x8xf32>
// CHECK: ernie.send %{{.*}} to stage 0 channel [[$GRAD:[0-9]+]] : tensor<8x8xbf16>
// ADD: %[[W1:.+]] = ernie.cast %{{.*}} : tensor<8x8xbf16> -> tensor<8x8xf32>
// ADD: %[[G1:.+]] = ernie.add %[[SUM1]], %[[W1]] : tensor<8x8xf32>
// RUNTIME: %[[G1:.+]] = ernie.cast %{{.*}} : tensor<8x8xbf16> -> tensor<8x8xf32>
// CHECK: return %[[G1]]

// CHECK-LABEL: func.func @train_backward.0
// GEMM-SAME: %[[SUM0:[^:]+]]: tensor<8x8xf32> {ernie.gradient = "[[N0:grad\.[0-9]+]]"}) -> (tensor<8x8xf32> {ernie.gradient = "[[N0]]"})
// ADD-SAME: %[[SUM0:[^:]+]]: tensor<8x8xf32> {ernie.gradient = "[[N0:grad\.[0-9]+]]"}) -> (tensor<8x8xf32> {ernie.gradient = "[[N0]]"})
// RUNTIME-SAME: -> (tensor<8x8xf32> {ernie.gradient = "grad.{{[0-9]+}}"})
// CHECK: ernie.recv from stage 1 channel [[$GRAD]] : tensor<8x8xbf16>
// GEMM: ernie.matmul_accumulate %{{.*}}, %{{.*}}, %[[SUM0]] {transpose_a} : tensor<8x8xbf16>, tensor<8x8xbf16>, tensor<8x8xf32> -> tensor<8x8xf32>
// ADD: %[[W0:.+]] = ernie.cast %{{.*}} : tensor<8x8xbf16> -> tensor<8x8xf32>
// ADD: ernie.add %[[SUM0]], %[[W0]] : tensor<8x8xf32>
// RUNTIME: ernie.cast %{{.*}} : tensor<8x8xbf16> -> tensor<8x8xf32>

// CHECK-LABEL: func.func @train_update.0
// CHECK-SAME: %[[SUM:[^:]+]]: tensor<8x8xf32> {ernie.gradient =
// CHECK: %[[M:.+]] = ernie.full 4.000000e+00 : tensor<8x8xf32>
// CHECK: %[[MEAN:.+]] = ernie.div %[[SUM]], %[[M]] : tensor<8x8xf32>
// CHECK: %[[G:.+]] = ernie.cast %[[MEAN]] : tensor<8x8xf32> -> tensor<8x8xbf16>
// CHECK: ernie.sgd_update %{{.*}}, %[[G]]

// CHECK-LABEL: func.func @train_update.1
// CHECK-SAME: tensor<8x8xf32> {ernie.gradient =
// CHECK: ernie.div %{{.*}} : tensor<8x8xf32>
// CHECK: ernie.cast %{{.*}} : tensor<8x8xf32> -> tensor<8x8xbf16>

ernie.mesh @mesh(pp = 2)
func.func @forward(%x: tensor<8x8xbf16>, %y: tensor<8xi64>,
                   %w: tensor<8x8xbf16> {ernie.param = "first.weight"},
                   %v: tensor<8x8xbf16> {ernie.param = "second.weight"}) -> tensor<f32> {
  %h = ernie.matmul %x, %w : tensor<8x8xbf16>, tensor<8x8xbf16> -> tensor<8x8xbf16>
  %s = ernie.split_point %h : tensor<8x8xbf16>
  %m = ernie.matmul %s, %v : tensor<8x8xbf16>, tensor<8x8xbf16> -> tensor<8x8xbf16>
  %m32 = ernie.cast %m : tensor<8x8xbf16> -> tensor<8x8xf32>
  %loss = ernie.cross_entropy %m32, %y : tensor<8x8xf32>, tensor<8xi64> -> tensor<f32>
  return %loss : tensor<f32>
}

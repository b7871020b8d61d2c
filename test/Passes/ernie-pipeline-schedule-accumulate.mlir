// Gradient accumulation inside the backward (accumulate=gemm, the
// default): each @train_backward.c takes the running sum of every gradient
// it returns (an ernie.gradient argument named as the result) and returns
// it with its micro-batch added.
//  * a weight gradient's GEMM adds into the sum itself (matmul_accumulate);
//  * a weight read twice on one chunk (w below: its gradient is the sum of
//    two GEMMs) adds both GEMMs in turn, (sum + a) + b, also in bf16 (the
//    second case), where the two are summed in bf16 and widened;
//  * a gradient that is no GEMM's (the bias's column sum) is an add, just
//    before the return (where a trailing collective is waited for).
// The runtime zeroes the sums before the first micro-batch; the memory plan
// writes each result over its sum (checked in Export/run-pipeline-accumulate).
// RUN: ernie-opt %s --split-input-file --ernie-pipeline-split=stages=2 --ernie-autodiff=optimizer=sgd --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=2" | FileCheck %s

// CHECK-LABEL: func.func @train_backward.1
// CHECK-SAME: %[[V:[^:]+]]: tensor<8x8xf32> {ernie.gradient = "[[NV:grad\.[0-9]+]]"}
// CHECK-SAME: -> (tensor<8x8xf32> {ernie.gradient = "[[NV]]"})
// CHECK-NOT: ernie.add
// CHECK: %[[GV:.+]] = ernie.matmul_accumulate %{{.*}}, %{{.*}}, %[[V]] {transpose_a} : tensor<4x8xf32>, tensor<4x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
// CHECK: return %[[GV]]

// CHECK-LABEL: func.func @train_backward.0
// CHECK-SAME: %[[B:[^:]+]]: tensor<1x8xf32> {ernie.gradient = "[[NB:grad\.[0-9]+]]"}
// CHECK-SAME: %[[W:[^:]+]]: tensor<8x8xf32> {ernie.gradient = "[[NW:grad\.[0-9]+]]"}
// CHECK-SAME: -> (tensor<1x8xf32> {ernie.gradient = "[[NB]]"}, tensor<8x8xf32> {ernie.gradient = "[[NW]]"})
// CHECK: %[[DB:.+]] = ernie.reduce_sum %{{.*}} axes = [0] keepdim : tensor<4x8xf32> -> tensor<1x8xf32>
// CHECK: %[[ONE:.+]] = ernie.matmul_accumulate %{{.*}}, %{{.*}}, %[[W]] {transpose_a} : tensor<4x8xf32>, tensor<4x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
// CHECK: %[[TWO:.+]] = ernie.matmul_accumulate %{{.*}}, %{{.*}}, %[[ONE]] {transpose_a} : tensor<4x8xf32>, tensor<4x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
// CHECK-NEXT: %[[GB:.+]] = ernie.add %[[B]], %[[DB]] : tensor<1x8xf32>
// CHECK-NEXT: return %[[GB]], %[[TWO]]

ernie.mesh @mesh(pp = 2)
func.func @forward(%x: tensor<4x8xf32>, %y: tensor<4xi64>,
                   %w: tensor<8x8xf32> {ernie.param = "w"},
                   %b: tensor<8xf32> {ernie.param = "b"},
                   %v: tensor<8x8xf32> {ernie.param = "v"}) -> tensor<f32> {
  %h = ernie.matmul %x, %w : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %hh = ernie.matmul %h, %w : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %bb = ernie.broadcast %b, dims = [1] : tensor<8xf32> -> tensor<4x8xf32>
  %a = ernie.add %hh, %bb : tensor<4x8xf32>
  %s = ernie.split_point %a : tensor<4x8xf32>
  %m = ernie.matmul %s, %v : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %loss = ernie.cross_entropy %m, %y : tensor<4x8xf32>, tensor<4xi64> -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// The same shared weight in bf16: its gradient is the bf16 sum of the two
// GEMMs, widened once for the f32 sum. Taken apart, each GEMM adds its
// product into the f32 sum unrounded, as a single weight's does.
// CHECK-LABEL: func.func @train_backward.0
// CHECK-SAME: %[[W16:[^:]+]]: tensor<8x8xf32> {ernie.gradient = "[[NW16:grad\.[0-9]+]]"}
// CHECK-SAME: -> (tensor<8x8xf32> {ernie.gradient = "[[NW16]]"})
// CHECK-NOT: ernie.cast
// CHECK: %[[ONE16:.+]] = ernie.matmul_accumulate %{{.*}}, %{{.*}}, %[[W16]] {transpose_a} : tensor<4x8xbf16>, tensor<4x8xbf16>, tensor<8x8xf32> -> tensor<8x8xf32>
// CHECK-NEXT: %[[TWO16:.+]] = ernie.matmul_accumulate %{{.*}}, %{{.*}}, %[[ONE16]] {transpose_a} : tensor<4x8xbf16>, tensor<4x8xbf16>, tensor<8x8xf32> -> tensor<8x8xf32>
// CHECK-NEXT: return %[[TWO16]]

ernie.mesh @mesh(pp = 2)
func.func @forward(%x: tensor<4x8xbf16>, %y: tensor<4xi64>,
                   %w: tensor<8x8xbf16> {ernie.param = "w"},
                   %v: tensor<8x8xbf16> {ernie.param = "v"}) -> tensor<f32> {
  %h = ernie.matmul %x, %w : tensor<4x8xbf16>, tensor<8x8xbf16> -> tensor<4x8xbf16>
  %hh = ernie.matmul %h, %w : tensor<4x8xbf16>, tensor<8x8xbf16> -> tensor<4x8xbf16>
  %s = ernie.split_point %hh : tensor<4x8xbf16>
  %m = ernie.matmul %s, %v : tensor<4x8xbf16>, tensor<8x8xbf16> -> tensor<4x8xbf16>
  %m32 = ernie.cast %m : tensor<4x8xbf16> -> tensor<4x8xf32>
  %loss = ernie.cross_entropy %m32, %y : tensor<4x8xf32>, tensor<4xi64> -> tensor<f32>
  return %loss : tensor<f32>
}

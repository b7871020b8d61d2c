// Every ernie op in its custom form: it prints, re-parses, and the generic
// form (--mlir-print-op-generic) re-parses to the very same IR.
// RUN: ernie-opt %s | ernie-opt | FileCheck %s
// RUN: ernie-opt %s > %t.custom
// RUN: ernie-opt %s --mlir-print-op-generic | ernie-opt > %t.from_generic
// RUN: diff %t.custom %t.from_generic

// CHECK-LABEL: func.func @unary
func.func @unary(%x: tensor<4x8xf32>, %i: tensor<4xi32>) {
  // CHECK: ernie.neg %{{.*}} : tensor<4x8xf32>
  %0 = ernie.neg %x : tensor<4x8xf32>
  // CHECK: ernie.neg %{{.*}} : tensor<4xi32>
  %1 = ernie.neg %i : tensor<4xi32>
  // CHECK: ernie.exp
  %2 = ernie.exp %x : tensor<4x8xf32>
  // CHECK: ernie.log
  %3 = ernie.log %x : tensor<4x8xf32>
  // CHECK: ernie.sqrt
  %4 = ernie.sqrt %x : tensor<4x8xf32>
  // CHECK: ernie.rsqrt
  %5 = ernie.rsqrt %x : tensor<4x8xf32>
  // CHECK: ernie.tanh
  %6 = ernie.tanh %x : tensor<4x8xf32>
  // CHECK: ernie.sigmoid
  %7 = ernie.sigmoid %x : tensor<4x8xf32>
  // CHECK: ernie.silu
  %8 = ernie.silu %x : tensor<4x8xf32>
  // CHECK: ernie.gelu %{{.*}} : tensor<4x8xf32>
  %9 = ernie.gelu %x : tensor<4x8xf32>
  // CHECK: ernie.gelu %{{.*}} {approximate} : tensor<4x8xf32>
  %10 = ernie.gelu %x {approximate} : tensor<4x8xf32>
  // CHECK: ernie.relu %{{.*}} : tensor<4xi32>
  %11 = ernie.relu %i : tensor<4xi32>
  // CHECK: ernie.abs
  %12 = ernie.abs %x : tensor<4x8xf32>
  // CHECK: ernie.reciprocal
  %13 = ernie.reciprocal %x : tensor<4x8xf32>
  return
}

// CHECK-LABEL: func.func @casts
func.func @casts(%x: tensor<4xf32>) {
  // CHECK: ernie.cast %{{.*}} : tensor<4xf32> -> tensor<4xf64>
  %0 = ernie.cast %x : tensor<4xf32> -> tensor<4xf64>
  // CHECK: ernie.cast %{{.*}} : tensor<4xf32> -> tensor<4xf16>
  %1 = ernie.cast %x : tensor<4xf32> -> tensor<4xf16>
  // CHECK: ernie.cast %{{.*}} : tensor<4xf32> -> tensor<4xbf16>
  %2 = ernie.cast %x : tensor<4xf32> -> tensor<4xbf16>
  // CHECK: ernie.cast %{{.*}} : tensor<4xf32> -> tensor<4xf8E4M3FN>
  %3 = ernie.cast %x : tensor<4xf32> -> tensor<4xf8E4M3FN>
  // CHECK: ernie.cast %{{.*}} : tensor<4xf32> -> tensor<4xf8E5M2>
  %4 = ernie.cast %x : tensor<4xf32> -> tensor<4xf8E5M2>
  // CHECK: ernie.cast %{{.*}} : tensor<4xf32> -> tensor<4xi64>
  %5 = ernie.cast %x : tensor<4xf32> -> tensor<4xi64>
  // CHECK: ernie.cast %{{.*}} : tensor<4xf32> -> tensor<4xi32>
  %6 = ernie.cast %x : tensor<4xf32> -> tensor<4xi32>
  // CHECK: ernie.cast %{{.*}} : tensor<4xf32> -> tensor<4xi1>
  %7 = ernie.cast %x : tensor<4xf32> -> tensor<4xi1>
  return
}

// CHECK-LABEL: func.func @binary
func.func @binary(%x: tensor<4x8xf32>, %y: tensor<4x8xf32>, %i: tensor<3xi64>) {
  // CHECK: ernie.add %{{.*}}, %{{.*}} : tensor<4x8xf32>
  %0 = ernie.add %x, %y : tensor<4x8xf32>
  // CHECK: ernie.sub
  %1 = ernie.sub %x, %y : tensor<4x8xf32>
  // CHECK: ernie.mul
  %2 = ernie.mul %x, %y : tensor<4x8xf32>
  // CHECK: ernie.div %{{.*}}, %{{.*}} : tensor<3xi64>
  %3 = ernie.div %i, %i : tensor<3xi64>
  // CHECK: ernie.maximum
  %4 = ernie.maximum %x, %y : tensor<4x8xf32>
  // CHECK: ernie.minimum
  %5 = ernie.minimum %x, %y : tensor<4x8xf32>
  // CHECK: ernie.pow
  %6 = ernie.pow %x, %y : tensor<4x8xf32>
  // CHECK: %[[M:.+]] = ernie.compare le, %{{.*}}, %{{.*}} : tensor<4x8xf32>
  %7 = ernie.compare le, %x, %y : tensor<4x8xf32>
  // CHECK: ernie.compare ne, %{{.*}}, %{{.*}} : tensor<3xi64>
  %8 = ernie.compare ne, %i, %i : tensor<3xi64>
  // CHECK: ernie.select %[[M]], %{{.*}}, %{{.*}} : tensor<4x8xi1>, tensor<4x8xf32>
  %9 = ernie.select %7, %x, %y : tensor<4x8xi1>, tensor<4x8xf32>
  return
}

// CHECK-LABEL: func.func @creation
func.func @creation() {
  // CHECK: ernie.constant dense<[1.000000e+00, 2.000000e+00]> : tensor<2xf32>
  %0 = ernie.constant dense<[1.0, 2.0]> : tensor<2xf32>
  // CHECK: ernie.constant dense<[1, 2, 3]> : tensor<3xi64>
  %1 = ernie.constant dense<[1, 2, 3]> : tensor<3xi64>
  // CHECK: ernie.full 0.000000e+00 : tensor<4x8xbf16>
  %2 = ernie.full 0.0 : tensor<4x8xbf16>
  // CHECK: ernie.full -100 : tensor<8xi64>
  %3 = ernie.full -100 : tensor<8xi64>
  // CHECK: ernie.full 2.000000e+00 : tensor<2xf32>
  %4 = ernie.full 2 : tensor<2xf32>
  // CHECK: ernie.full true : tensor<2xi1>
  %5 = ernie.full true : tensor<2xi1>
  // CHECK: ernie.full (0x7FC00000 : f32) : tensor<2xf32>
  %6 = ernie.full (0x7FC00000 : f32) : tensor<2xf32>
  // CHECK: ernie.full (0xFF800000 : f32) : tensor<2xf32>
  %7 = ernie.full (0xFF800000 : f32) : tensor<2xf32>
  // CHECK: ernie.full 4.480000e+02 : tensor<2xf8E4M3FN>
  %8 = ernie.full 448.0 : tensor<2xf8E4M3FN>
  // CHECK: ernie.full 5.734400e+04 : tensor<2xf8E5M2>
  %9 = ernie.full 57344.0 : tensor<2xf8E5M2>
  // CHECK: ernie.full 1.000000e-01 : tensor<f64>
  %10 = ernie.full 0.1 : tensor<f64>
  // Negative literals, and floats MLIR would print as bit patterns.
  // CHECK: ernie.full -1.500000e+00 : tensor<2xf32>
  %13 = ernie.full -1.5 : tensor<2xf32>
  // CHECK: ernie.full 1.6777216E+7 : tensor<2xf32>
  %14 = ernie.full 16777216.0 : tensor<2xf32>
  // CHECK: ernie.full 1.23456789012E+11 : tensor<2xf64>
  %15 = ernie.full 123456789012.0 : tensor<2xf64>
  // CHECK: ernie.full -2147483648 : tensor<2xi32>
  %16 = ernie.full -2147483648 : tensor<2xi32>
  // CHECK: ernie.full -0.000000e+00 : tensor<2xf32>
  %17 = ernie.full -0.0 : tensor<2xf32>
  // CHECK: ernie.iota dim = 1 : tensor<2x16xi64>
  %11 = ernie.iota dim = 1 : tensor<2x16xi64>
  // CHECK: ernie.iota dim = 0 : tensor<8xf32>
  %12 = ernie.iota dim = 0 : tensor<8xf32>
  return
}

// CHECK-LABEL: func.func @linalg
func.func @linalg(%x: tensor<2x16x64xf32>, %w: tensor<128x64xf32>, %a: tensor<3x4x5xf32>, %b: tensor<3x6x4xf32>) {
  // CHECK: ernie.matmul %{{.*}}, %{{.*}} {transpose_b} : tensor<2x16x64xf32>, tensor<128x64xf32> -> tensor<2x16x128xf32>
  %0 = ernie.matmul %x, %w {transpose_b} : tensor<2x16x64xf32>, tensor<128x64xf32> -> tensor<2x16x128xf32>
  // CHECK: ernie.matmul %{{.*}}, %{{.*}} {transpose_a, transpose_b} : tensor<3x4x5xf32>, tensor<3x6x4xf32> -> tensor<3x5x6xf32>
  %1 = ernie.matmul %a, %b {transpose_a, transpose_b} : tensor<3x4x5xf32>, tensor<3x6x4xf32> -> tensor<3x5x6xf32>
  // CHECK: ernie.matmul_accumulate %{{.*}}, %{{.*}}, %{{.*}} {transpose_a, transpose_b} : tensor<3x4x5xf32>, tensor<3x6x4xf32>, tensor<3x5x6xf32> -> tensor<3x5x6xf32>
  %acc = ernie.matmul_accumulate %a, %b, %1 {transpose_a, transpose_b} : tensor<3x4x5xf32>, tensor<3x6x4xf32>, tensor<3x5x6xf32> -> tensor<3x5x6xf32>
  // CHECK: ernie.reduce_sum %{{.*}} axes = [1] keepdim : tensor<2x16x64xf32> -> tensor<2x1x64xf32>
  %2 = ernie.reduce_sum %x axes = [1] keepdim : tensor<2x16x64xf32> -> tensor<2x1x64xf32>
  // CHECK: ernie.reduce_mean %{{.*}} axes = [0, 2] : tensor<2x16x64xf32> -> tensor<16xf32>
  %3 = ernie.reduce_mean %x axes = [0, 2] : tensor<2x16x64xf32> -> tensor<16xf32>
  // CHECK: ernie.reduce_max %{{.*}} axes = [0, 1, 2] : tensor<2x16x64xf32> -> tensor<f32>
  %4 = ernie.reduce_max %x axes = [0, 1, 2] : tensor<2x16x64xf32> -> tensor<f32>
  // CHECK: ernie.softmax %{{.*}}, axis = 2 : tensor<2x16x64xf32>
  %5 = ernie.softmax %x, axis = 2 : tensor<2x16x64xf32>
  // CHECK: ernie.log_softmax %{{.*}}, axis = 0 : tensor<2x16x64xf32>
  %6 = ernie.log_softmax %x, axis = 0 : tensor<2x16x64xf32>
  return
}

// CHECK-LABEL: func.func @norms
func.func @norms(%x: tensor<2x16x64xbf16>, %w: tensor<64xf32>, %b: tensor<64xf32>) {
  // CHECK: ernie.rms_norm %{{.*}}, %{{.*}}, epsilon = 9.9999999999999995E-7 : tensor<2x16x64xbf16>, tensor<64xf32>
  %0 = ernie.rms_norm %x, %w, epsilon = 1.0e-6 : tensor<2x16x64xbf16>, tensor<64xf32>
  // CHECK: ernie.layer_norm %{{.*}}, %{{.*}}, %{{.*}}, epsilon = 1.000000e-05 : tensor<2x16x64xbf16>, tensor<64xf32>
  %1 = ernie.layer_norm %x, %w, %b, epsilon = 1.0e-5 : tensor<2x16x64xbf16>, tensor<64xf32>
  return
}

// CHECK-LABEL: func.func @shapes
func.func @shapes(%x: tensor<2x16x64xf32>, %v: tensor<64xf32>, %ids: tensor<3xi64>, %t: tensor<4x6xf32>) {
  // CHECK: ernie.reshape %{{.*}} : tensor<2x16x64xf32> -> tensor<2x16x4x16xf32>
  %0 = ernie.reshape %x : tensor<2x16x64xf32> -> tensor<2x16x4x16xf32>
  // CHECK: ernie.transpose %{{.*}}, perm = [0, 2, 1, 3] : tensor<2x16x4x16xf32> -> tensor<2x4x16x16xf32>
  %1 = ernie.transpose %0, perm = [0, 2, 1, 3] : tensor<2x16x4x16xf32> -> tensor<2x4x16x16xf32>
  // CHECK: ernie.broadcast %{{.*}}, dims = [2] : tensor<64xf32> -> tensor<2x16x64xf32>
  %2 = ernie.broadcast %v, dims = [2] : tensor<64xf32> -> tensor<2x16x64xf32>
  // CHECK: ernie.slice %{{.*}} [0:2, 4:16:2, 0:64] : tensor<2x16x64xf32> -> tensor<2x6x64xf32>
  %3 = ernie.slice %x [0:2, 4:16:2, 0:64] : tensor<2x16x64xf32> -> tensor<2x6x64xf32>
  // CHECK: ernie.concat %{{.*}}, %{{.*}} axis = 1 : tensor<2x16x64xf32>, tensor<2x6x64xf32> -> tensor<2x22x64xf32>
  %4 = ernie.concat %x, %3 axis = 1 : tensor<2x16x64xf32>, tensor<2x6x64xf32> -> tensor<2x22x64xf32>
  // CHECK: ernie.split %{{.*}} axis = 2, sizes = [32, 16, 16] : tensor<2x16x64xf32> -> tensor<2x16x32xf32>, tensor<2x16x16xf32>, tensor<2x16x16xf32>
  %5:3 = ernie.split %x axis = 2, sizes = [32, 16, 16] : tensor<2x16x64xf32> -> tensor<2x16x32xf32>, tensor<2x16x16xf32>, tensor<2x16x16xf32>
  // CHECK: ernie.gather %{{.*}}[%{{.*}}] axis = 1 : tensor<4x6xf32>, tensor<3xi64> -> tensor<4x3xf32>
  %6 = ernie.gather %t[%ids] axis = 1 : tensor<4x6xf32>, tensor<3xi64> -> tensor<4x3xf32>
  // CHECK: ernie.embedding %{{.*}}, %{{.*}} {padding_idx = 0 : i64} : tensor<3xi64>, tensor<4x6xf32> -> tensor<3x6xf32>
  %7 = ernie.embedding %ids, %t {padding_idx = 0 : i64} : tensor<3xi64>, tensor<4x6xf32> -> tensor<3x6xf32>
  // CHECK: ernie.topk %{{.*}}, k = 2, axis = 1 : tensor<4x6xf32> -> tensor<4x2xf32>, tensor<4x2xi64>
  %8:2 = ernie.topk %t, k = 2, axis = 1 : tensor<4x6xf32> -> tensor<4x2xf32>, tensor<4x2xi64>
  // CHECK: ernie.topk %{{.*}}, k = 1, axis = 0 {largest = false} : tensor<4x6xf32> -> tensor<1x6xf32>, tensor<1x6xi64>
  %9:2 = ernie.topk %t, k = 1, axis = 0 {largest = false} : tensor<4x6xf32> -> tensor<1x6xf32>, tensor<1x6xi64>
  return
}

// CHECK-LABEL: func.func @transformer
func.func @transformer(%q: tensor<2x16x8x32xf32>, %k: tensor<2x16x2x32xf32>, %v: tensor<2x16x2x32xf32>,
                       %pos: tensor<16xi64>, %bpos: tensor<2x16xi32>,
                       %logits: tensor<2x16x100xf32>, %labels: tensor<2x16xi64>) {
  // CHECK: ernie.rope %{{.*}}, %{{.*}}, theta = 1.000000e+04 : tensor<2x16x8x32xf32>, tensor<16xi64>
  %0 = ernie.rope %q, %pos, theta = 10000.0 : tensor<2x16x8x32xf32>, tensor<16xi64>
  // CHECK: ernie.rope %{{.*}}, %{{.*}}, theta = 5.000000e+05 {interleaved} : tensor<2x16x2x32xf32>, tensor<2x16xi32>
  %1 = ernie.rope %k, %bpos, theta = 500000.0 {interleaved} : tensor<2x16x2x32xf32>, tensor<2x16xi32>
  // CHECK: ernie.attention %{{.*}}, %{{.*}}, %{{.*}} {causal} : tensor<2x16x8x32xf32>, tensor<2x16x2x32xf32>, tensor<2x16x2x32xf32> -> tensor<2x16x8x32xf32>
  %2 = ernie.attention %0, %1, %v {causal} : tensor<2x16x8x32xf32>, tensor<2x16x2x32xf32>, tensor<2x16x2x32xf32> -> tensor<2x16x8x32xf32>
  // CHECK: ernie.attention %{{.*}}, %{{.*}}, %{{.*}} {scale = 1.250000e-01 : f64} : tensor<2x16x8x32xf32>
  %3 = ernie.attention %q, %k, %v {scale = 0.125 : f64} : tensor<2x16x8x32xf32>, tensor<2x16x2x32xf32>, tensor<2x16x2x32xf32> -> tensor<2x16x8x32xf32>
  // CHECK: ernie.cross_entropy %{{.*}}, %{{.*}} : tensor<2x16x100xf32>, tensor<2x16xi64> -> tensor<f32>
  %4 = ernie.cross_entropy %logits, %labels : tensor<2x16x100xf32>, tensor<2x16xi64> -> tensor<f32>
  // CHECK: ernie.cross_entropy %{{.*}}, %{{.*}} {ignore_index = 0 : i64, reduction = #ernie<loss_reduction none>} : tensor<2x16x100xf32>, tensor<2x16xi64> -> tensor<2x16xf32>
  %5 = ernie.cross_entropy %logits, %labels {ignore_index = 0 : i64, reduction = #ernie<loss_reduction none>} : tensor<2x16x100xf32>, tensor<2x16xi64> -> tensor<2x16xf32>
  return
}

// CHECK-LABEL: func.func @gradient_ops
func.func @gradient_ops(%x: tensor<2x3xf32>, %t: tensor<10x4xf32>, %ids: tensor<2x3xi64>, %rows: tensor<2x3x4xf32>,
                        %q: tensor<2x16x8x32xf32>, %k: tensor<2x16x2x32xf32>, %logits: tensor<2x16x100xf32>,
                        %labels: tensor<2x16xi64>, %dl: tensor<f32>) {
  // CHECK: ernie.erf %{{.*}} : tensor<2x3xf32>
  %0 = ernie.erf %x : tensor<2x3xf32>
  // CHECK: ernie.stop_gradient %{{.*}} : tensor<2x3xf32>
  %1 = ernie.stop_gradient %x : tensor<2x3xf32>
  // CHECK: ernie.pad %{{.*}} low = [0, 1], high = [0, 2], interior = [0, 1] : tensor<2x3xf32> -> tensor<2x8xf32>
  %2 = ernie.pad %x low = [0, 1], high = [0, 2], interior = [0, 1] : tensor<2x3xf32> -> tensor<2x8xf32>
  // CHECK: ernie.index_add %{{.*}}, %{{.*}}, %{{.*}} axis = 0 : tensor<10x4xf32>, tensor<2x3xi64>, tensor<2x3x4xf32> -> tensor<10x4xf32>
  %3 = ernie.index_add %t, %ids, %rows axis = 0 : tensor<10x4xf32>, tensor<2x3xi64>, tensor<2x3x4xf32> -> tensor<10x4xf32>
  // CHECK: ernie.attention_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {causal} : tensor<2x16x8x32xf32>, tensor<2x16x2x32xf32>, tensor<2x16x2x32xf32>, tensor<2x16x8x32xf32> -> tensor<2x16x8x32xf32>, tensor<2x16x2x32xf32>, tensor<2x16x2x32xf32>
  %4:3 = ernie.attention_grad %q, %k, %k, %q {causal} : tensor<2x16x8x32xf32>, tensor<2x16x2x32xf32>, tensor<2x16x2x32xf32>, tensor<2x16x8x32xf32> -> tensor<2x16x8x32xf32>, tensor<2x16x2x32xf32>, tensor<2x16x2x32xf32>
  // CHECK: ernie.cross_entropy_grad %{{.*}}, %{{.*}}, %{{.*}} : tensor<2x16x100xf32>, tensor<2x16xi64>, tensor<f32> -> tensor<2x16x100xf32>
  %5 = ernie.cross_entropy_grad %logits, %labels, %dl : tensor<2x16x100xf32>, tensor<2x16xi64>, tensor<f32> -> tensor<2x16x100xf32>
  return
}

// CHECK-LABEL: func.func @optimizers
func.func @optimizers(%p: tensor<4x8xf32>, %g: tensor<4x8xf32>, %m: tensor<4x8xf32>, %v: tensor<4x8xf32>, %lr: tensor<f32>, %step: tensor<i64>) {
  // CHECK: ernie.sgd_update %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {momentum = 9.000000e-01 : f64, nesterov} : tensor<4x8xf32>, tensor<4x8xf32>, tensor<f32>
  %0:2 = ernie.sgd_update %p, %g, %m, %lr {momentum = 0.9 : f64, nesterov} : tensor<4x8xf32>, tensor<4x8xf32>, tensor<f32>
  // CHECK: ernie.adamw_update %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {beta2 = 0.94999999999999996 : f64} : tensor<4x8xf32>, tensor<4x8xf32>, tensor<f32>, tensor<i64>
  %1:3 = ernie.adamw_update %p, %g, %m, %v, %lr, %step {beta2 = 0.95 : f64} : tensor<4x8xf32>, tensor<4x8xf32>, tensor<f32>, tensor<i64>
  return
}

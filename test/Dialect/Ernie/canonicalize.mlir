// Folders and canonicalization patterns of the ernie dialect.
// RUN: ernie-opt %s --split-input-file --canonicalize | FileCheck %s

// x + (-0.0) is x for every float x; x + 0 is x for integers.
// CHECK-LABEL: func.func @add_zero
// CHECK-SAME: (%[[X:.+]]: tensor<4xf32>, %[[I:.+]]: tensor<4xi32>)
// CHECK-NEXT: return %[[X]], %[[X]], %[[I]]
func.func @add_zero(%x: tensor<4xf32>, %i: tensor<4xi32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xi32>) {
  %z = ernie.full -0.0 : tensor<4xf32>
  %0 = ernie.add %x, %z : tensor<4xf32>
  %1 = ernie.add %z, %x : tensor<4xf32>
  %zi = ernie.full 0 : tensor<4xi32>
  %2 = ernie.add %i, %zi : tensor<4xi32>
  return %0, %1, %2 : tensor<4xf32>, tensor<4xf32>, tensor<4xi32>
}

// -----

// x + (+0.0) is not x when x = -0.0 (the sum is +0.0), and x - (-0.0) is
// x + 0.0: neither folds.
// CHECK-LABEL: func.func @signed_zeros
// CHECK: ernie.add
// CHECK: ernie.sub
func.func @signed_zeros(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %z = ernie.full 0.0 : tensor<4xf32>
  %n = ernie.full -0.0 : tensor<4xf32>
  %0 = ernie.add %x, %z : tensor<4xf32>
  %1 = ernie.sub %x, %n : tensor<4xf32>
  return %0, %1 : tensor<4xf32>, tensor<4xf32>
}

// -----

// CHECK-LABEL: func.func @identities
// CHECK-SAME: (%[[X:.+]]: tensor<4xf32>)
// CHECK-NEXT: return %[[X]], %[[X]], %[[X]], %[[X]], %[[X]], %[[X]]
func.func @identities(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) {
  %z = ernie.full 0.0 : tensor<4xf32>
  %o = ernie.full 1.0 : tensor<4xf32>
  %0 = ernie.sub %x, %z : tensor<4xf32>
  %1 = ernie.mul %o, %x : tensor<4xf32>
  %2 = ernie.div %x, %o : tensor<4xf32>
  %3 = ernie.pow %x, %o : tensor<4xf32>
  %n = ernie.neg %x : tensor<4xf32>
  %4 = ernie.neg %n : tensor<4xf32>
  %5 = ernie.maximum %x, %x : tensor<4xf32>
  return %0, %1, %2, %3, %4, %5 : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
}

// -----

// x * 0 is not folded: NaN * 0 is NaN. 0 - x is not x.
// CHECK-LABEL: func.func @not_identities
// CHECK: ernie.mul
// CHECK: ernie.sub
func.func @not_identities(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %z = ernie.full 0.0 : tensor<4xf32>
  %0 = ernie.mul %x, %z : tensor<4xf32>
  %1 = ernie.sub %z, %x : tensor<4xf32>
  return %0, %1 : tensor<4xf32>, tensor<4xf32>
}

// -----

// CHECK-LABEL: func.func @constant_folding
// CHECK-DAG: %[[A:.+]] = ernie.constant dense<[3.000000e+00, 5.000000e+00]> : tensor<2xf32>
// CHECK-DAG: %[[B:.+]] = ernie.full 6 : tensor<3xi64>
// CHECK-DAG: %[[C:.+]] = ernie.constant dense<[-1.000000e+00, -2.000000e+00]> : tensor<2xf32>
// CHECK: return %[[A]], %[[B]], %[[C]]
func.func @constant_folding() -> (tensor<2xf32>, tensor<3xi64>, tensor<2xf32>) {
  %a = ernie.constant dense<[1.0, 2.0]> : tensor<2xf32>
  %b = ernie.constant dense<[3.0, 4.0]> : tensor<2xf32>
  %0 = ernie.add %a, %b : tensor<2xf32>
  %1 = ernie.mul %0, %a : tensor<2xf32>
  %2 = ernie.sub %1, %a : tensor<2xf32>
  %3 = ernie.div %2, %a : tensor<2xf32>
  %i = ernie.full 2 : tensor<3xi64>
  %j = ernie.full 3 : tensor<3xi64>
  %4 = ernie.mul %i, %j : tensor<3xi64>
  %5 = ernie.neg %a : tensor<2xf32>
  return %3, %4, %5 : tensor<2xf32>, tensor<3xi64>, tensor<2xf32>
}

// -----

// bf16 arithmetic is the runtime's (computed in f32, rounded once): no folding.
// CHECK-LABEL: func.func @no_narrow_float_folding
// CHECK: ernie.add
func.func @no_narrow_float_folding() -> tensor<2xbf16> {
  %a = ernie.full 1.0 : tensor<2xbf16>
  %b = ernie.full 3.0e-3 : tensor<2xbf16>
  %0 = ernie.add %a, %b : tensor<2xbf16>
  return %0 : tensor<2xbf16>
}

// -----

// Integer division by zero is left for the runtime to report.
// CHECK-LABEL: func.func @no_division_by_zero
// CHECK: ernie.div
func.func @no_division_by_zero() -> tensor<2xi32> {
  %a = ernie.full 7 : tensor<2xi32>
  %b = ernie.full 0 : tensor<2xi32>
  %0 = ernie.div %a, %b : tensor<2xi32>
  return %0 : tensor<2xi32>
}

// -----

// CHECK-LABEL: func.func @min_max_folding
// CHECK-DAG: ernie.constant dense<[3, 2]> : tensor<2xi32>
// CHECK-DAG: ernie.constant dense<[1, -5]> : tensor<2xi32>
func.func @min_max_folding() -> (tensor<2xi32>, tensor<2xi32>) {
  %a = ernie.constant dense<[1, 2]> : tensor<2xi32>
  %b = ernie.constant dense<[3, -5]> : tensor<2xi32>
  %0 = ernie.maximum %a, %b : tensor<2xi32>
  %1 = ernie.minimum %a, %b : tensor<2xi32>
  return %0, %1 : tensor<2xi32>, tensor<2xi32>
}

// -----

// CHECK-LABEL: func.func @transpose_chain
// CHECK-SAME: (%[[X:.+]]: tensor<2x3x4xf32>)
// CHECK-NEXT: %[[T:.+]] = ernie.transpose %[[X]], perm = [1, 2, 0] : tensor<2x3x4xf32> -> tensor<3x4x2xf32>
// CHECK-NEXT: return %[[X]], %[[T]], %[[X]]
func.func @transpose_chain(%x: tensor<2x3x4xf32>) -> (tensor<2x3x4xf32>, tensor<3x4x2xf32>, tensor<2x3x4xf32>) {
  %0 = ernie.transpose %x, perm = [1, 0, 2] : tensor<2x3x4xf32> -> tensor<3x2x4xf32>
  %1 = ernie.transpose %0, perm = [1, 0, 2] : tensor<3x2x4xf32> -> tensor<2x3x4xf32>
  %2 = ernie.transpose %0, perm = [0, 2, 1] : tensor<3x2x4xf32> -> tensor<3x4x2xf32>
  %3 = ernie.transpose %x, perm = [0, 1, 2] : tensor<2x3x4xf32> -> tensor<2x3x4xf32>
  return %1, %2, %3 : tensor<2x3x4xf32>, tensor<3x4x2xf32>, tensor<2x3x4xf32>
}

// -----

// CHECK-LABEL: func.func @reshape_chain
// CHECK-SAME: (%[[X:.+]]: tensor<2x12xf32>)
// CHECK-NEXT: %[[R:.+]] = ernie.reshape %[[X]] : tensor<2x12xf32> -> tensor<4x6xf32>
// CHECK-NEXT: return %[[X]], %[[R]]
func.func @reshape_chain(%x: tensor<2x12xf32>) -> (tensor<2x12xf32>, tensor<4x6xf32>) {
  %0 = ernie.reshape %x : tensor<2x12xf32> -> tensor<24xf32>
  %1 = ernie.reshape %0 : tensor<24xf32> -> tensor<2x12xf32>
  %2 = ernie.reshape %0 : tensor<24xf32> -> tensor<4x6xf32>
  return %1, %2 : tensor<2x12xf32>, tensor<4x6xf32>
}

// -----

// CHECK-LABEL: func.func @reshape_constant
// CHECK-NEXT: %[[C:.+]] = ernie.constant dense<{{\[}}[1, 2], [3, 4]]> : tensor<2x2xi64>
// CHECK-NEXT: return %[[C]]
func.func @reshape_constant() -> tensor<2x2xi64> {
  %c = ernie.constant dense<[1, 2, 3, 4]> : tensor<4xi64>
  %0 = ernie.reshape %c : tensor<4xi64> -> tensor<2x2xi64>
  return %0 : tensor<2x2xi64>
}

// -----

// CHECK-LABEL: func.func @broadcasts
// CHECK-SAME: (%[[X:.+]]: tensor<4xf32>, %[[Y:.+]]: tensor<4xf32>)
// CHECK-DAG: %[[S:.+]] = ernie.full 2.000000e+00 : tensor<3x4xbf16>
// CHECK-DAG: %[[B:.+]] = ernie.broadcast %[[Y]], dims = [2] : tensor<4xf32> -> tensor<2x3x4xf32>
// CHECK: return %[[X]], %[[S]], %[[B]]
func.func @broadcasts(%x: tensor<4xf32>, %y: tensor<4xf32>) -> (tensor<4xf32>, tensor<3x4xbf16>, tensor<2x3x4xf32>) {
  %0 = ernie.broadcast %x, dims = [0] : tensor<4xf32> -> tensor<4xf32>
  %s = ernie.full 2.0 : tensor<4xbf16>
  %1 = ernie.broadcast %s, dims = [1] : tensor<4xbf16> -> tensor<3x4xbf16>
  %2 = ernie.broadcast %y, dims = [1] : tensor<4xf32> -> tensor<3x4xf32>
  %3 = ernie.broadcast %2, dims = [1, 2] : tensor<3x4xf32> -> tensor<2x3x4xf32>
  return %0, %1, %3 : tensor<4xf32>, tensor<3x4xbf16>, tensor<2x3x4xf32>
}

// -----

// CHECK-LABEL: func.func @identity_shapes
// CHECK-SAME: (%[[X:.+]]: tensor<4x1xf32>)
// CHECK-NEXT: return %[[X]], %[[X]], %[[X]], %[[X]], %[[X]]
func.func @identity_shapes(%x: tensor<4x1xf32>) -> (tensor<4x1xf32>, tensor<4x1xf32>, tensor<4x1xf32>, tensor<4x1xf32>, tensor<4x1xf32>) {
  %0 = ernie.slice %x [0:4, 0:1] : tensor<4x1xf32> -> tensor<4x1xf32>
  %1 = ernie.concat %x axis = 0 : tensor<4x1xf32> -> tensor<4x1xf32>
  %2 = ernie.reduce_sum %x axes = [1] keepdim : tensor<4x1xf32> -> tensor<4x1xf32>
  %3 = ernie.cast %x : tensor<4x1xf32> -> tensor<4x1xf32>
  %4 = ernie.reduce_max %x axes = [] : tensor<4x1xf32> -> tensor<4x1xf32>
  return %0, %1, %2, %3, %4 : tensor<4x1xf32>, tensor<4x1xf32>, tensor<4x1xf32>, tensor<4x1xf32>, tensor<4x1xf32>
}

// -----

// A slice that skips elements is no identity even when its type is kept.
// CHECK-LABEL: func.func @offset_slice
// CHECK: ernie.slice
func.func @offset_slice(%x: tensor<4xf32>) -> tensor<2xf32> {
  %0 = ernie.slice %x [2:4] : tensor<4xf32> -> tensor<2xf32>
  return %0 : tensor<2xf32>
}

// -----

// CHECK-LABEL: func.func @select_folding
// CHECK-SAME: (%[[X:.+]]: tensor<4xf32>, %[[Y:.+]]: tensor<4xf32>, %[[C:.+]]: tensor<4xi1>)
// CHECK-NEXT: return %[[X]], %[[Y]], %[[X]]
func.func @select_folding(%x: tensor<4xf32>, %y: tensor<4xf32>, %c: tensor<4xi1>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) {
  %t = ernie.full true : tensor<4xi1>
  %f = ernie.full false : tensor<4xi1>
  %0 = ernie.select %t, %x, %y : tensor<4xi1>, tensor<4xf32>
  %1 = ernie.select %f, %x, %y : tensor<4xi1>, tensor<4xf32>
  %2 = ernie.select %c, %x, %x : tensor<4xi1>, tensor<4xf32>
  return %0, %1, %2 : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
}

// -----

// Splat constants through shape ops stay splats.
// CHECK-LABEL: func.func @splat_shapes
// CHECK-DAG: %[[A:.+]] = ernie.full 3 : tensor<3x2xi32>
// CHECK-DAG: %[[B:.+]] = ernie.full 3 : tensor<1x2xi32>
// CHECK: return %[[A]], %[[B]]
func.func @splat_shapes() -> (tensor<3x2xi32>, tensor<1x2xi32>) {
  %s = ernie.full 3 : tensor<2x3xi32>
  %0 = ernie.transpose %s, perm = [1, 0] : tensor<2x3xi32> -> tensor<3x2xi32>
  %1 = ernie.slice %s [0:1, 0:3:2] : tensor<2x3xi32> -> tensor<1x2xi32>
  return %0, %1 : tensor<3x2xi32>, tensor<1x2xi32>
}

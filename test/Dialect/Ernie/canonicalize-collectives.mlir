// Canonicalization of per-rank collectives: a rank's piece is cut before
// the elementwise work that only that piece needs, and an all-reduce whose
// every use is this rank's piece becomes a reduce-scatter.
// RUN: ernie-opt %s --split-input-file --canonicalize | FileCheck %s

ernie.mesh @mesh(mp = 4)

// The backward of a norm over a hidden-split residual stream: the gradient
// is all-reduced, widened and scaled by the norm weight whole, then cut to
// the rank's hidden piece. It becomes a reduce-scatter of the gradient and
// the same arithmetic on the piece (the weight sliced, not the product).
// CHECK-LABEL: func.func @norm_gradient
// CHECK-SAME: (%[[G:.+]]: tensor<2x8x16xbf16>, %[[W:.+]]: tensor<16xf32>)
// CHECK-NEXT: %[[RS:.+]] = ernie.reduce_scatter %[[G]] over @mesh[mp] dim = 2 sum : tensor<2x8x16xbf16> -> tensor<2x8x4xbf16>
// CHECK-NEXT: %[[C:.+]] = ernie.cast %[[RS]] : tensor<2x8x4xbf16> -> tensor<2x8x4xf32>
// CHECK-NEXT: %[[WP:.+]] = ernie.shard_slice %[[W]] over @mesh[mp] dim = 0 : tensor<16xf32> -> tensor<4xf32>
// CHECK-NEXT: %[[B:.+]] = ernie.broadcast %[[WP]], dims = [2] : tensor<4xf32> -> tensor<2x8x4xf32>
// CHECK-NEXT: %[[M:.+]] = ernie.mul %[[C]], %[[B]] : tensor<2x8x4xf32>
// CHECK-NEXT: %[[A:.+]] = ernie.add %[[M]], %[[M]]
// CHECK-NEXT: %[[D:.+]] = ernie.sub %[[A]], %[[M]]
// CHECK-NEXT: return %[[D]], %[[C]]
func.func @norm_gradient(%g: tensor<2x8x16xbf16>, %w: tensor<16xf32>) -> (tensor<2x8x4xf32>, tensor<2x8x4xf32>) {
  %r = ernie.all_reduce %g over @mesh[mp] sum : tensor<2x8x16xbf16>
  %c = ernie.cast %r : tensor<2x8x16xbf16> -> tensor<2x8x16xf32>
  %b = ernie.broadcast %w, dims = [2] : tensor<16xf32> -> tensor<2x8x16xf32>
  %m = ernie.mul %c, %b : tensor<2x8x16xf32>
  %0 = ernie.shard_slice %m over @mesh[mp] dim = 2 : tensor<2x8x16xf32> -> tensor<2x8x4xf32>
  %1 = ernie.shard_slice %m over @mesh[mp] dim = 2 : tensor<2x8x16xf32> -> tensor<2x8x4xf32>
  %2 = ernie.shard_slice %c over @mesh[mp] dim = 2 : tensor<2x8x16xf32> -> tensor<2x8x4xf32>
  %3 = ernie.add %0, %1 : tensor<2x8x4xf32>
  %4 = ernie.sub %3, %1 : tensor<2x8x4xf32>
  return %4, %2 : tensor<2x8x4xf32>, tensor<2x8x4xf32>
}

// -----

ernie.mesh @mesh(mp = 4)

// A broadcast's new dimension and a dimension expanded from 1 need no slice
// of the input: the piece is broadcast directly.
// CHECK-LABEL: func.func @broadcast_pieces
// CHECK-SAME: (%[[S:.+]]: tensor<2x8x1xf32>, %[[V:.+]]: tensor<8xf32>)
// CHECK-NEXT: %[[A:.+]] = ernie.broadcast %[[S]], dims = [0, 1, 2] : tensor<2x8x1xf32> -> tensor<2x8x4xf32>
// CHECK-NEXT: %[[VP:.+]] = ernie.shard_slice %[[V]] over @mesh[mp] dim = 0 shift = 1 : tensor<8xf32> -> tensor<2xf32>
// CHECK-NEXT: %[[B:.+]] = ernie.broadcast %[[VP]], dims = [1] : tensor<2xf32> -> tensor<3x2xf32>
// CHECK-NEXT: %[[C:.+]] = ernie.broadcast %[[V]], dims = [1] : tensor<8xf32> -> tensor<1x8xf32>
// CHECK-NEXT: return %[[A]], %[[B]], %[[C]]
func.func @broadcast_pieces(%s: tensor<2x8x1xf32>, %v: tensor<8xf32>) -> (tensor<2x8x4xf32>, tensor<3x2xf32>, tensor<1x8xf32>) {
  %a = ernie.broadcast %s, dims = [0, 1, 2] : tensor<2x8x1xf32> -> tensor<2x8x16xf32>
  %0 = ernie.shard_slice %a over @mesh[mp] dim = 2 : tensor<2x8x16xf32> -> tensor<2x8x4xf32>
  %b = ernie.broadcast %v, dims = [1] : tensor<8xf32> -> tensor<3x8xf32>
  %1 = ernie.shard_slice %b over @mesh[mp] dim = 1 shift = 1 : tensor<3x8xf32> -> tensor<3x2xf32>
  %c = ernie.broadcast %v, dims = [1] : tensor<8xf32> -> tensor<4x8xf32>
  %2 = ernie.shard_slice %c over @mesh[mp] dim = 0 : tensor<4x8xf32> -> tensor<1x8xf32>
  return %0, %1, %2 : tensor<2x8x4xf32>, tensor<3x2xf32>, tensor<1x8xf32>
}

// -----

ernie.mesh @mesh(dp = 2, mp = 4)

// What must stay: an all-reduce also read whole; a slice over other axes
// than the reduction's; a shifted slice (another rank's piece); two
// different pieces of one product; an all-gather (not pure: never moved).
// CHECK-LABEL: func.func @kept
// CHECK: ernie.all_reduce %{{.+}} over @mesh[mp] sum
// CHECK: ernie.all_reduce %{{.+}} over @mesh[dp] sum
// CHECK: ernie.all_reduce %{{.+}} over @mesh[mp] sum
// CHECK: %[[E:.+]] = ernie.exp
// CHECK-DAG: ernie.shard_slice %[[E]] over @mesh[mp] dim = 0
// CHECK-DAG: ernie.shard_slice %[[E]] over @mesh[mp] dim = 1
// CHECK-NOT: reduce_scatter
func.func @kept(%x: tensor<8x8xf32>) -> (tensor<8x8xf32>, tensor<2x8xf32>, tensor<8x2xf32>, tensor<2x8xf32>, tensor<2x8xf32>, tensor<8x2xf32>) {
  %r = ernie.all_reduce %x over @mesh[mp] sum : tensor<8x8xf32>
  %0 = ernie.shard_slice %r over @mesh[mp] dim = 0 : tensor<8x8xf32> -> tensor<2x8xf32>
  %d = ernie.all_reduce %x over @mesh[dp] sum : tensor<8x8xf32>
  %1 = ernie.shard_slice %d over @mesh[mp] dim = 1 : tensor<8x8xf32> -> tensor<8x2xf32>
  %s = ernie.all_reduce %x over @mesh[mp] sum : tensor<8x8xf32>
  %2 = ernie.shard_slice %s over @mesh[mp] dim = 0 shift = 1 : tensor<8x8xf32> -> tensor<2x8xf32>
  %e = ernie.exp %x : tensor<8x8xf32>
  %3 = ernie.shard_slice %e over @mesh[mp] dim = 0 : tensor<8x8xf32> -> tensor<2x8xf32>
  %4 = ernie.shard_slice %e over @mesh[mp] dim = 1 : tensor<8x8xf32> -> tensor<8x2xf32>
  return %r, %0, %1, %2, %3, %4 : tensor<8x8xf32>, tensor<2x8xf32>, tensor<8x2xf32>, tensor<2x8xf32>, tensor<2x8xf32>, tensor<8x2xf32>
}

// -----

ernie.mesh @mesh(mp = 4)

// A bf16 loss's partial sum, computed in f32 and rounded to bf16, is summed
// over the ranks in f32 and rounded once. A narrowed value that no
// reduction computed (a gradient), a max, and a widening cast are left
// alone.
// CHECK-LABEL: func.func @partial_loss
// CHECK-SAME: (%[[X:.+]]: tensor<4x16xf32>, %[[G:.+]]: tensor<4x16xf32>, %[[H:.+]]: tensor<4xbf16>)
// CHECK-NEXT: %[[S:.+]] = ernie.reduce_sum %[[X]] axes = [0, 1] : tensor<4x16xf32> -> tensor<f32>
// CHECK-NEXT: %[[R:.+]] = ernie.all_reduce %[[S]] over @mesh[mp] sum : tensor<f32>
// CHECK-NEXT: %[[L:.+]] = ernie.cast %[[R]] : tensor<f32> -> tensor<bf16>
// CHECK-NEXT: %[[M:.+]] = ernie.reduce_mean %[[X]] axes = [1] : tensor<4x16xf32> -> tensor<4xf32>
// CHECK-NEXT: %[[MB:.+]] = ernie.cast %[[M]] : tensor<4xf32> -> tensor<4xbf16>
// CHECK-NEXT: ernie.all_reduce %[[MB]] over @mesh[mp] max : tensor<4xbf16>
// CHECK-NEXT: %[[GB:.+]] = ernie.cast %[[G]] : tensor<4x16xf32> -> tensor<4x16xbf16>
// CHECK-NEXT: ernie.all_reduce %[[GB]] over @mesh[mp] sum : tensor<4x16xbf16>
// CHECK-NEXT: %[[HS:.+]] = ernie.reduce_sum %[[H]] axes = [0] : tensor<4xbf16> -> tensor<bf16>
// CHECK-NEXT: %[[HW:.+]] = ernie.cast %[[HS]] : tensor<bf16> -> tensor<f32>
// CHECK-NEXT: ernie.all_reduce %[[HW]] over @mesh[mp] sum : tensor<f32>
func.func @partial_loss(%x: tensor<4x16xf32>, %g: tensor<4x16xf32>, %h: tensor<4xbf16>)
    -> (tensor<bf16>, tensor<4xbf16>, tensor<4x16xbf16>, tensor<f32>) {
  %s = ernie.reduce_sum %x axes = [0, 1] : tensor<4x16xf32> -> tensor<f32>
  %sb = ernie.cast %s : tensor<f32> -> tensor<bf16>
  %l = ernie.all_reduce %sb over @mesh[mp] sum : tensor<bf16>
  %m = ernie.reduce_mean %x axes = [1] : tensor<4x16xf32> -> tensor<4xf32>
  %mb = ernie.cast %m : tensor<4xf32> -> tensor<4xbf16>
  %mx = ernie.all_reduce %mb over @mesh[mp] max : tensor<4xbf16>
  %gb = ernie.cast %g : tensor<4x16xf32> -> tensor<4x16xbf16>
  %gr = ernie.all_reduce %gb over @mesh[mp] sum : tensor<4x16xbf16>
  %hs = ernie.reduce_sum %h axes = [0] : tensor<4xbf16> -> tensor<bf16>
  %hw = ernie.cast %hs : tensor<bf16> -> tensor<f32>
  %hr = ernie.all_reduce %hw over @mesh[mp] sum : tensor<f32>
  return %l, %mx, %gr, %hr : tensor<bf16>, tensor<4xbf16>, tensor<4x16xbf16>, tensor<f32>
}

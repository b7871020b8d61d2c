// RUN: ernie-opt %s --split-input-file --ernie-sequence-parallel-overlap | FileCheck %s

// A sequence-parallel MLP on mp = 4: the all-gather before the
// column-parallel matmul becomes a ring of three shifts by one, each piece's
// GEMM between a start and its wait; the reduce-scatter after the
// row-parallel matmul becomes three pairwise sends (shift k at step k),
// summed in rank order.
ernie.mesh @mesh(dp = 2, mp = 4)
// CHECK-LABEL: func.func @sp_mlp
// CHECK-SAME: (%[[X:[a-z0-9]+]]: tensor<2x4x16xf32>, %[[W1:[a-z0-9]+]]: tensor<16x32xf32>, %[[W2:[a-z0-9]+]]: tensor<32x16xf32>)
// CHECK-NOT: ernie.all_gather
// CHECK: %[[H0:.+]] = ernie.full 0.000000e+00 : tensor<2x16x32xf32>
// CHECK: %[[F0:.+]] = ernie.collective_permute_start %[[X]] over @mesh[mp] shift = 1 : tensor<2x4x16xf32>
// CHECK: %[[P0:.+]] = ernie.matmul %[[X]], %[[W1]] : tensor<2x4x16xf32>, tensor<16x32xf32> -> tensor<2x4x32xf32>
// CHECK: %[[H1:.+]] = ernie.shard_insert %[[P0]] into %[[H0]] over @mesh[mp] dim = 1 : tensor<2x4x32xf32> -> tensor<2x16x32xf32>
// CHECK: %[[X1:.+]] = ernie.wait %[[F0]] : tensor<2x4x16xf32>
// CHECK: %[[F1:.+]] = ernie.collective_permute_start %[[X1]] over @mesh[mp] shift = 1
// CHECK: %[[P1:.+]] = ernie.matmul %[[X1]], %[[W1]]
// CHECK: %[[H2:.+]] = ernie.shard_insert %[[P1]] into %[[H1]] over @mesh[mp] dim = 1 shift = -1
// CHECK: %[[X2:.+]] = ernie.wait %[[F1]]
// CHECK: %[[F2:.+]] = ernie.collective_permute_start %[[X2]] over @mesh[mp] shift = 1
// CHECK: %[[P2:.+]] = ernie.matmul %[[X2]], %[[W1]]
// CHECK: %[[H3:.+]] = ernie.shard_insert %[[P2]] into %[[H2]] over @mesh[mp] dim = 1 shift = -2
// CHECK: %[[X3:.+]] = ernie.wait %[[F2]]
// CHECK-NOT: ernie.collective_permute_start %[[X3]]
// CHECK: %[[P3:.+]] = ernie.matmul %[[X3]], %[[W1]]
// CHECK: %[[H:.+]] = ernie.shard_insert %[[P3]] into %[[H3]] over @mesh[mp] dim = 1 shift = -3
// CHECK: %[[A:.+]] = ernie.gelu %[[H]] : tensor<2x16x32xf32>
// CHECK-NOT: ernie.reduce_scatter
// CHECK: %[[S0:.+]] = ernie.full 0.000000e+00 : tensor<2x16x16xf32>
// CHECK: %[[A1:.+]] = ernie.shard_slice %[[A]] over @mesh[mp] dim = 1 shift = 1 : tensor<2x16x32xf32> -> tensor<2x4x32xf32>
// CHECK: %[[Q1:.+]] = ernie.matmul %[[A1]], %[[W2]] : tensor<2x4x32xf32>, tensor<32x16xf32> -> tensor<2x4x16xf32>
// CHECK: %[[G1:.+]] = ernie.collective_permute_start %[[Q1]] over @mesh[mp] shift = 1
// CHECK: %[[A2:.+]] = ernie.shard_slice %[[A]] over @mesh[mp] dim = 1 shift = 2
// CHECK: %[[Q2:.+]] = ernie.matmul %[[A2]], %[[W2]]
// CHECK: %[[G2:.+]] = ernie.collective_permute_start %[[Q2]] over @mesh[mp] shift = 2
// CHECK: %[[R1:.+]] = ernie.wait %[[G1]]
// CHECK: %[[S1:.+]] = ernie.shard_insert %[[R1]] into %[[S0]] over @mesh[mp] dim = 1 shift = -1
// CHECK: %[[A3:.+]] = ernie.shard_slice %[[A]] over @mesh[mp] dim = 1 shift = 3
// CHECK: %[[Q3:.+]] = ernie.matmul %[[A3]], %[[W2]]
// CHECK: %[[G3:.+]] = ernie.collective_permute_start %[[Q3]] over @mesh[mp] shift = 3
// CHECK: %[[R2:.+]] = ernie.wait %[[G2]]
// CHECK: %[[S2:.+]] = ernie.shard_insert %[[R2]] into %[[S1]] over @mesh[mp] dim = 1 shift = -2
// CHECK: %[[A0:.+]] = ernie.shard_slice %[[A]] over @mesh[mp] dim = 1 : tensor<2x16x32xf32> -> tensor<2x4x32xf32>
// CHECK: %[[Q0:.+]] = ernie.matmul %[[A0]], %[[W2]]
// CHECK: %[[S3:.+]] = ernie.shard_insert %[[Q0]] into %[[S2]] over @mesh[mp] dim = 1 :
// CHECK: %[[R3:.+]] = ernie.wait %[[G3]]
// CHECK: %[[S:.+]] = ernie.shard_insert %[[R3]] into %[[S3]] over @mesh[mp] dim = 1 shift = -3
// CHECK: %[[B0:.+]] = ernie.slice %[[S]] [0:2, 0:4, 0:16]
// CHECK: %[[B1:.+]] = ernie.slice %[[S]] [0:2, 4:8, 0:16]
// CHECK: %[[C1:.+]] = ernie.add %[[B0]], %[[B1]]
// CHECK: %[[B2:.+]] = ernie.slice %[[S]] [0:2, 8:12, 0:16]
// CHECK: %[[C2:.+]] = ernie.add %[[C1]], %[[B2]]
// CHECK: %[[B3:.+]] = ernie.slice %[[S]] [0:2, 12:16, 0:16]
// CHECK: %[[C3:.+]] = ernie.add %[[C2]], %[[B3]]
// CHECK: return %[[C3]] : tensor<2x4x16xf32>
func.func @sp_mlp(%x: tensor<2x4x16xf32>, %w1: tensor<16x32xf32>, %w2: tensor<32x16xf32>) -> tensor<2x4x16xf32> {
  %g = ernie.all_gather %x over @mesh[mp] dim = 1 : tensor<2x4x16xf32> -> tensor<2x16x16xf32>
  %h = ernie.matmul %g, %w1 : tensor<2x16x16xf32>, tensor<16x32xf32> -> tensor<2x16x32xf32>
  %a = ernie.gelu %h : tensor<2x16x32xf32>
  %y = ernie.matmul %a, %w2 : tensor<2x16x32xf32>, tensor<32x16xf32> -> tensor<2x16x16xf32>
  %r = ernie.reduce_scatter %y over @mesh[mp] dim = 1 sum : tensor<2x16x16xf32> -> tensor<2x4x16xf32>
  return %r : tensor<2x4x16xf32>
}

// -----

// One ring serves every matmul of the gathered value (q, k, v; transposed
// weights too), and a weight gradient that contracts over the gathered
// sequence gets the gathered value assembled from the same pieces.
ernie.mesh @mesh(mp = 2)
// CHECK-LABEL: func.func @shared_ring
// CHECK-SAME: (%[[X:[a-z0-9]+]]: tensor<4x8xf32>, %[[WQ:[a-z0-9]+]]: tensor<8x8xf32>, %[[WK:[a-z0-9]+]]: tensor<4x8xf32>, %[[DY:[a-z0-9]+]]: tensor<8x8xf32>)
// CHECK: %[[Q0:.+]] = ernie.full 0.000000e+00 : tensor<8x8xf32>
// CHECK: %[[K0:.+]] = ernie.full 0.000000e+00 : tensor<8x4xf32>
// CHECK: %[[G0:.+]] = ernie.full 0.000000e+00 : tensor<8x8xf32>
// CHECK: %[[F:.+]] = ernie.collective_permute_start %[[X]] over @mesh[mp] shift = 1 : tensor<4x8xf32>
// CHECK: ernie.matmul %[[X]], %[[WQ]] : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
// CHECK: ernie.matmul %[[X]], %[[WK]] {transpose_b} : tensor<4x8xf32>, tensor<4x8xf32> -> tensor<4x4xf32>
// CHECK: %[[G1:.+]] = ernie.shard_insert %[[X]] into %[[G0]] over @mesh[mp] dim = 0 :
// CHECK: %[[X1:.+]] = ernie.wait %[[F]]
// CHECK: %[[G:.+]] = ernie.shard_insert %[[X1]] into %[[G1]] over @mesh[mp] dim = 0 shift = -1
// CHECK: ernie.matmul %[[G]], %[[DY]] {transpose_a} : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
// CHECK-NOT: ernie.all_gather
func.func @shared_ring(%x: tensor<4x8xf32>, %wq: tensor<8x8xf32>, %wk: tensor<4x8xf32>, %dy: tensor<8x8xf32>) -> (tensor<8x8xf32>, tensor<8x4xf32>, tensor<8x8xf32>) {
  %g = ernie.all_gather %x over @mesh[mp] dim = 0 : tensor<4x8xf32> -> tensor<8x8xf32>
  %q = ernie.matmul %g, %wq : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  %k = ernie.matmul %g, %wk {transpose_b} : tensor<8x8xf32>, tensor<4x8xf32> -> tensor<8x4xf32>
  %dw = ernie.matmul %g, %dy {transpose_a} : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  return %q, %k, %dw : tensor<8x8xf32>, tensor<8x4xf32>, tensor<8x8xf32>
}

// -----

// Left alone: a gather along the contraction, a gather feeding only the
// right operand, a weight computed after the gather's first use, a
// reduce-scatter of a matmul that has another user, one along the product's
// columns, and a max.
ernie.mesh @mesh(mp = 2)
// CHECK-LABEL: func.func @left_alone
// CHECK-COUNT-3: ernie.all_gather
// CHECK-COUNT-3: ernie.reduce_scatter
// CHECK-NOT: ernie.collective_permute_start
func.func @left_alone(%x: tensor<8x4xf32>, %w: tensor<8x8xf32>, %v: tensor<8x8xf32>) -> (tensor<8x8xf32>, tensor<8x8xf32>, tensor<8x8xf32>, tensor<4x8xf32>, tensor<8x8xf32>, tensor<8x4xf32>, tensor<4x8xf32>) {
  %g = ernie.all_gather %x over @mesh[mp] dim = 1 : tensor<8x4xf32> -> tensor<8x8xf32>
  %a = ernie.matmul %g, %w : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  %h = ernie.all_gather %x over @mesh[mp] dim = 1 : tensor<8x4xf32> -> tensor<8x8xf32>
  %b = ernie.matmul %w, %h : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  %i = ernie.all_gather %x over @mesh[mp] dim = 0 : tensor<8x4xf32> -> tensor<16x4xf32>
  %t = ernie.exp %i : tensor<16x4xf32>
  %late = ernie.slice %v [0:4, 0:8] : tensor<8x8xf32> -> tensor<4x8xf32>
  %c = ernie.matmul %i, %late : tensor<16x4xf32>, tensor<4x8xf32> -> tensor<16x8xf32>
  %d = ernie.matmul %w, %v : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  %r = ernie.reduce_scatter %d over @mesh[mp] dim = 0 sum : tensor<8x8xf32> -> tensor<4x8xf32>
  %e = ernie.matmul %w, %v : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  %s = ernie.reduce_scatter %e over @mesh[mp] dim = 1 sum : tensor<8x8xf32> -> tensor<8x4xf32>
  %f = ernie.matmul %v, %w : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  %m = ernie.reduce_scatter %f over @mesh[mp] dim = 0 max : tensor<8x8xf32> -> tensor<4x8xf32>
  return %a, %b, %d, %r, %e, %s, %m : tensor<8x8xf32>, tensor<8x8xf32>, tensor<8x8xf32>, tensor<4x8xf32>, tensor<8x8xf32>, tensor<8x4xf32>, tensor<4x8xf32>
}

// -----

// A reduce-scatter of a sum of products (the data gradient of a value read
// by two column-parallel matmuls): each step adds the pieces' products in
// the original association before sending.
ernie.mesh @mesh(mp = 2)
// CHECK-LABEL: func.func @sum_of_products
// CHECK-SAME: (%[[A:[a-z0-9]+]]: tensor<8x4xf32>, %[[B:[a-z0-9]+]]: tensor<8x4xf32>, %[[W:[a-z0-9]+]]: tensor<4x8xf32>, %[[V:[a-z0-9]+]]: tensor<4x8xf32>)
// CHECK: %[[A1:.+]] = ernie.shard_slice %[[A]] over @mesh[mp] dim = 0 shift = 1
// CHECK: %[[P1:.+]] = ernie.matmul %[[A1]], %[[W]]
// CHECK: %[[B1:.+]] = ernie.shard_slice %[[B]] over @mesh[mp] dim = 0 shift = 1
// CHECK: %[[Q1:.+]] = ernie.matmul %[[B1]], %[[V]]
// CHECK: %[[S1:.+]] = ernie.add %[[P1]], %[[Q1]] : tensor<4x8xf32>
// CHECK: ernie.collective_permute_start %[[S1]] over @mesh[mp] shift = 1
// CHECK-NOT: ernie.reduce_scatter
func.func @sum_of_products(%a: tensor<8x4xf32>, %b: tensor<8x4xf32>, %w: tensor<4x8xf32>, %v: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %p = ernie.matmul %a, %w : tensor<8x4xf32>, tensor<4x8xf32> -> tensor<8x8xf32>
  %q = ernie.matmul %b, %v : tensor<8x4xf32>, tensor<4x8xf32> -> tensor<8x8xf32>
  %s = ernie.add %p, %q : tensor<8x8xf32>
  %r = ernie.reduce_scatter %s over @mesh[mp] dim = 0 sum : tensor<8x8xf32> -> tensor<4x8xf32>
  return %r : tensor<4x8xf32>
}

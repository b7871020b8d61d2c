// RUN: ernie-opt %s | ernie-opt | FileCheck %s
// RUN: ernie-opt %s --ernie-print-sharding-rules --verify-diagnostics -o /dev/null

// The MoE ops round-trip, and their rules split groups (and hidden) only.

// CHECK-LABEL: func.func @layer
// CHECK: ernie.moe_route %{{.*}} {capacity = 4 : i64, num_experts = 8 : i64} : tensor<2x16x2xi64> -> tensor<2x16x2xi64>
// CHECK: ernie.moe_dispatch {{.*}} -> tensor<8x2x4x32xf32>
// CHECK: ernie.moe_combine {{.*}} -> tensor<2x16x32xf32>
// CHECK: ernie.moe_weights_grad {{.*}} -> tensor<2x16x2xf32>
func.func @layer(%x: tensor<2x16x32xf32>, %experts: tensor<2x16x2xi64>,
                 %w: tensor<2x16x2xf32>) -> (tensor<2x16x32xf32>, tensor<2x16x2xf32>) {
  // expected-remark @+1 {{sharding rule ([i, j, k]) -> ([i, j, k]) j:replicated k:replicated}}
  %slots = ernie.moe_route %experts {num_experts = 8, capacity = 4} : tensor<2x16x2xi64> -> tensor<2x16x2xi64>
  // expected-remark @+1 {{sharding rule ([i, j, l], [i, j, k], [i, j, k], [i, j, k]) -> ([m, i, n, l]) j:replicated k:replicated m:replicated n:replicated}}
  %buf = ernie.moe_dispatch %x, %experts, %slots, %w {num_experts = 8, capacity = 4} : tensor<2x16x32xf32>, tensor<2x16x2xi64>, tensor<2x16x2xi64>, tensor<2x16x2xf32> -> tensor<8x2x4x32xf32>
  // expected-remark @+1 {{sharding rule ([m, i, n, l], [i, j, k], [i, j, k], [i, j, k]) -> ([i, j, l]) j:replicated k:replicated m:replicated n:replicated}}
  %y = ernie.moe_combine %buf, %experts, %slots, %w : tensor<8x2x4x32xf32>, tensor<2x16x2xi64>, tensor<2x16x2xi64>, tensor<2x16x2xf32> -> tensor<2x16x32xf32>
  // expected-remark @+1 {{sharding rule ([i, j, l], [m, i, n, l], [i, j, k], [i, j, k]) -> ([i, j, k]) j:replicated k:replicated l:reduction(sum) m:replicated n:replicated}}
  %dw = ernie.moe_weights_grad %y, %buf, %experts, %slots : tensor<2x16x32xf32>, tensor<8x2x4x32xf32>, tensor<2x16x2xi64>, tensor<2x16x2xi64> -> tensor<2x16x2xf32>
  return %y, %dw : tensor<2x16x32xf32>, tensor<2x16x2xf32>
}

// The expert GEMMs: experts split with the weights and rows, groups with
// the rows, the capacity never (the filled rows are a prefix); a split
// `in` leaves partial sums, and the weight gradient sums over the groups.

// CHECK-LABEL: func.func @experts
// CHECK: ernie.expert_matmul %{{.*}} {fill = 2.500000e-01 : f64} : tensor<8x2x16x32xf32>, tensor<8x32x64xf32>, tensor<8x2xi64> -> tensor<8x2x16x64xf32>
// CHECK: ernie.expert_matmul %{{.*}} {fill = 2.500000e-01 : f64, transpose_weight} : tensor<8x2x16x64xf32>, tensor<8x32x64xf32>, tensor<8x2xi64> -> tensor<8x2x16x32xf32>
// CHECK: ernie.expert_weight_grad %{{.*}} {fill = 2.500000e-01 : f64} : tensor<8x2x16x32xf32>, tensor<8x2x16x64xf32>, tensor<8x2xi64> -> tensor<8x32x64xf32>
func.func @experts(%x: tensor<8x2x16x32xf32>, %w: tensor<8x32x64xf32>,
                   %rows: tensor<8x2xi64>) -> (tensor<8x2x16x32xf32>, tensor<8x32x64xf32>) {
  // expected-remark @+1 {{sharding rule ([i, j, k, l], [i, l, m], [i, j]) -> ([i, j, k, m]) k:replicated l:reduction(sum)}}
  %y = ernie.expert_matmul %x, %w, %rows {fill = 0.25} : tensor<8x2x16x32xf32>, tensor<8x32x64xf32>, tensor<8x2xi64> -> tensor<8x2x16x64xf32>
  // expected-remark @+1 {{sharding rule ([i, j, k, l], [i, m, l], [i, j]) -> ([i, j, k, m]) k:replicated l:reduction(sum)}}
  %dx = ernie.expert_matmul %y, %w, %rows {fill = 0.25, transpose_weight} : tensor<8x2x16x64xf32>, tensor<8x32x64xf32>, tensor<8x2xi64> -> tensor<8x2x16x32xf32>
  // expected-remark @+1 {{sharding rule ([i, j, k, l], [i, j, k, m], [i, j]) -> ([i, l, m]) j:reduction(sum) k:replicated}}
  %dw = ernie.expert_weight_grad %x, %y, %rows {fill = 0.25} : tensor<8x2x16x32xf32>, tensor<8x2x16x64xf32>, tensor<8x2xi64> -> tensor<8x32x64xf32>
  return %dx, %dw : tensor<8x2x16x32xf32>, tensor<8x32x64xf32>
}

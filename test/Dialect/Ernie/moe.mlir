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

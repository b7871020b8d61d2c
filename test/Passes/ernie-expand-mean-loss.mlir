// RUN: ernie-opt %s --split-input-file --ernie-expand-mean-loss | FileCheck %s
// RUN: ernie-opt %s --split-input-file --ernie-auto-parallel-pipeline | FileCheck %s --check-prefix=DP

// CHECK-LABEL: func.func @mean
// CHECK-SAME: (%[[L:.+]]: tensor<4x8x16xf32> {{.*}}, %[[Y:.+]]: tensor<4x8xi64>)
// CHECK-DAG: %[[SUM:.+]] = ernie.cross_entropy %[[L]], %[[Y]] {ignore_index = 3 : i64, reduction = #ernie<loss_reduction sum>}
// CHECK-DAG: %[[IGN:.+]] = ernie.full 3 : tensor<4x8xi64>
// CHECK: %[[KEPT:.+]] = ernie.compare ne, %[[Y]], %[[IGN]] : tensor<4x8xi64>
// CHECK: %[[ONES:.+]] = ernie.cast %[[KEPT]] : tensor<4x8xi1> -> tensor<4x8xf32>
// CHECK: %[[N:.+]] = ernie.reduce_sum %[[ONES]] axes = [0, 1] : tensor<4x8xf32> -> tensor<f32>
// CHECK: ernie.div %[[SUM]], %[[N]] : tensor<f32>
// CHECK-NOT: loss_reduction mean
// A batch split over dp leaves two scalar sums to complete, and no gather.
// DP-LABEL: func.func @mean
// DP-NOT: ernie.all_gather
// DP: ernie.all_reduce %{{.*}} over @mesh[dp] sum : tensor<f32>
// DP: ernie.all_reduce %{{.*}} over @mesh[dp] sum : tensor<f32>
// DP: ernie.div
ernie.mesh @mesh(dp = 2)
func.func @mean(%logits: tensor<4x8x16xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}, {}]>}, %labels: tensor<4x8xi64>) -> tensor<f32> {
  %0 = ernie.cross_entropy %logits, %labels {ignore_index = 3 : i64} : tensor<4x8x16xf32>, tensor<4x8xi64> -> tensor<f32>
  return %0 : tensor<f32>
}

// -----

// Sum and per-token losses stay as they are.
// CHECK-LABEL: func.func @others
// CHECK: loss_reduction sum
// CHECK: loss_reduction none
// CHECK-NOT: ernie.div
func.func @others(%logits: tensor<4x16xf32>, %labels: tensor<4xi32>) -> (tensor<f32>, tensor<4xf32>) {
  %0 = ernie.cross_entropy %logits, %labels {reduction = #ernie<loss_reduction sum>} : tensor<4x16xf32>, tensor<4xi32> -> tensor<f32>
  %1 = ernie.cross_entropy %logits, %labels {reduction = #ernie<loss_reduction none>} : tensor<4x16xf32>, tensor<4xi32> -> tensor<4xf32>
  return %0, %1 : tensor<f32>, tensor<4xf32>
}

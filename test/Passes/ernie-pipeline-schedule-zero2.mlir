// ZeRO-2 under a pipeline: each micro-batch's backward reduce-scatters its
// gradients over dp and the runtime sums the shards, so a stage holds 1/dp
// of its gradients (DeepSpeed's ZeRO-2 under gradient accumulation). An
// all-reduced gradient (ZeRO-1) moves to the update instead, once per step
// (ernie-pipeline-schedule.mlir); a reduce-scatter moved there would hold
// the micro-batches' sum whole.
// The backward adds each shard into its running sum (accumulate=gemm's
// add, after the collective): the reduce-scatter is still only the sum's,
// so --ernie-bucket-gradients starts it as soon as its input is ready and
// waits just before the add (BUCKETS).
// RUN: ernie-opt %s --ernie-pipeline-split=stages=2 --ernie-autodiff=optimizer=adamw --ernie-zero-sharding=level=2 --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=4" | FileCheck %s
// RUN: ernie-opt %s --ernie-pipeline-split=stages=2 --ernie-autodiff=optimizer=adamw --ernie-zero-sharding=level=2 --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=4" --ernie-bucket-gradients | FileCheck %s --check-prefix=BUCKETS

// BUCKETS-LABEL: func.func @train_backward.1
// BUCKETS-SAME: %[[SUM:[^:]+]]: tensor<4x8xf32> {ernie.gradient =
// BUCKETS: %[[G:.+]] = ernie.matmul %{{.*}} {transpose_a}
// BUCKETS-NEXT: %[[F:.+]] = ernie.reduce_scatter_start %[[G]] over @mesh[dp] dim = 0 sum
// BUCKETS-NEXT: ernie.send
// BUCKETS-NEXT: %[[W:.+]] = ernie.wait %[[F]]
// BUCKETS-NEXT: %[[NEW:.+]] = ernie.add %[[SUM]], %[[W]] : tensor<4x8xf32>
// BUCKETS-NEXT: return %[[NEW]]

// CHECK-LABEL: func.func @train_backward.1
// CHECK-SAME: -> (tensor<4x8xf32> {ernie.gradient = "grad.{{[0-9]+}}"}
// CHECK: ernie.reduce_scatter %{{.*}} over @mesh[dp] dim = 0 sum : tensor<8x8xf32> -> tensor<4x8xf32>
// CHECK-LABEL: func.func @train_backward.0
// CHECK-SAME: -> (tensor<4x8xf32> {ernie.gradient = "grad.{{[0-9]+}}"})
// CHECK: ernie.reduce_scatter %{{.*}} over @mesh[dp] dim = 0 sum : tensor<8x8xf32> -> tensor<4x8xf32>
// CHECK-LABEL: func.func @train_update.0
// CHECK-NOT: reduce_scatter
// CHECK: ernie.adamw_update {{.*}} : tensor<4x8xf32>
// CHECK-LABEL: func.func @train_update.1
// CHECK-NOT: reduce_scatter
// CHECK: ernie.adamw_update {{.*}} : tensor<4x8xf32>
ernie.mesh @mesh(dp = 2, pp = 2)
func.func @forward(%x: tensor<4x8xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>},
                   %y: tensor<4xi64> {ernie.sharding = #ernie.sharding<@mesh, [{dp}]>},
                   %w: tensor<8x8xf32> {ernie.param = "first.weight"},
                   %v: tensor<8x8xf32> {ernie.param = "second.weight"}) -> tensor<f32> {
  %h = ernie.matmul %x, %w : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %s = ernie.split_point %h : tensor<4x8xf32>
  %m = ernie.matmul %s, %v : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %loss = ernie.cross_entropy %m, %y : tensor<4x8xf32>, tensor<4xi64> -> tensor<f32>
  return %loss : tensor<f32>
}

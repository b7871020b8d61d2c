// A sequence-parallel norm's weight gradient under data parallelism: a sum
// pending over dp (the batch) and mp (the sequence), which the planner makes
// whole as a reduce-scatter over dp, an all-reduce of the piece over mp and
// an all-gather over dp, then rounds to the bf16 parameter. That chain
// commutes with the runtime's f32 sum over micro-batches (the rounding only
// improves, summed first), so all of it runs once per step in the update
// instead of once per micro-batch in the backward: on Llama 3 405B's plan,
// 2 norms x 8 layers x 16 micro-batches of latency-bound collectives over 128
// data-parallel ranks, half the step's data-parallel time.
// RUN: ernie-opt %s --ernie-pipeline-split=stages=2 --ernie-autodiff=optimizer=sgd --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=2" | FileCheck %s

// CHECK-LABEL: func.func @train_backward.0
// CHECK-SAME: -> (tensor<1x16xf32> {ernie.gradient = "grad.0"})
// CHECK-NOT: ernie.reduce_scatter
// CHECK-NOT: ernie.all_gather
// CHECK-NOT: ernie.cast %{{.*}} -> tensor<{{.*}}xbf16>
// CHECK: return
// CHECK-LABEL: func.func @train_update.0
// CHECK: %[[MEAN:.+]] = ernie.div %arg0
// CHECK-NEXT: %[[PIECE:.+]] = ernie.reduce_scatter %[[MEAN]] over @mesh[dp] dim = 1 sum : tensor<1x16xf32> -> tensor<1x8xf32>
// CHECK-NEXT: %[[SUM:.+]] = ernie.all_reduce %[[PIECE]] over @mesh[mp] sum : tensor<1x8xf32>
// CHECK-NEXT: %[[WHOLE:.+]] = ernie.all_gather %[[SUM]] over @mesh[dp] dim = 1 : tensor<1x8xf32> -> tensor<1x16xf32>
// CHECK: %[[G:.+]] = ernie.cast %{{.*}} : tensor<16xf32> -> tensor<16xbf16>
// CHECK: ernie.sgd_update %{{.*}}, %[[G]]
ernie.mesh @mesh(dp = 2, mp = 2, pp = 2)
func.func @forward(%x: tensor<8x16xbf16> {ernie.sharding = #ernie.sharding<@mesh, [{dp, mp}, {}]>},
                   %y: tensor<8xi64> {ernie.sharding = #ernie.sharding<@mesh, [{dp, mp}]>},
                   %g: tensor<16xbf16> {ernie.param = "norm.weight"},
                   %w: tensor<16x16xbf16> {ernie.param = "head.weight"}) -> tensor<f32> {
  %x32 = ernie.cast %x : tensor<8x16xbf16> -> tensor<8x16xf32>
  %g32 = ernie.cast %g : tensor<16xbf16> -> tensor<16xf32>
  %gb = ernie.broadcast %g32, dims = [1] : tensor<16xf32> -> tensor<8x16xf32>
  %n = ernie.mul %x32, %gb : tensor<8x16xf32>
  %h = ernie.cast %n : tensor<8x16xf32> -> tensor<8x16xbf16>
  %s = ernie.split_point %h : tensor<8x16xbf16>
  %m = ernie.matmul %s, %w : tensor<8x16xbf16>, tensor<16x16xbf16> -> tensor<8x16xbf16>
  %m32 = ernie.cast %m : tensor<8x16xbf16> -> tensor<8x16xf32>
  %loss = ernie.cross_entropy %m32, %y : tensor<8x16xf32>, tensor<8xi64> -> tensor<f32>
  return %loss : tensor<f32>
}

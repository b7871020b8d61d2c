// A bf16 model's data-parallel gradient sums under a pipeline: the runtime
// accumulates each gradient's micro-batches in f32 and the update averages
// them; the sum over dp then adds those f32 means and narrows once
// (Megatron's f32 main grads), and under ZeRO-1, whose update reads only
// its shard, it is a reduce-scatter (half an all-reduce's traffic).
// grad-reduce=native sums the narrowed means instead.
// RUN: ernie-opt %s --ernie-pipeline-split=stages=2 --ernie-autodiff=optimizer=adamw --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=4" | FileCheck %s --check-prefix=F32
// RUN: ernie-opt %s --ernie-pipeline-split=stages=2 --ernie-autodiff=optimizer=adamw --ernie-zero-sharding=level=1 --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=4" | FileCheck %s --check-prefix=ZERO1
// RUN: ernie-opt %s --ernie-pipeline-split=stages=2 --ernie-autodiff=optimizer=adamw --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=4 grad-reduce=native" | FileCheck %s --check-prefix=NATIVE

// F32-LABEL: func.func @train_update.0
// F32-SAME: %[[SUM:[^:]+]]: tensor<8x8xf32> {ernie.gradient =
// F32: %[[MEAN:.+]] = ernie.div %[[SUM]], %{{.*}} : tensor<8x8xf32>
// F32: %[[ALL:.+]] = ernie.all_reduce %[[MEAN]] over @mesh[dp] sum : tensor<8x8xf32>
// F32: %[[G:.+]] = ernie.cast %[[ALL]] : tensor<8x8xf32> -> tensor<8x8xbf16>
// F32: ernie.adamw_update %{{.*}}, %[[G]],
// F32-LABEL: func.func @train_update.1
// F32: ernie.all_reduce %{{.*}} over @mesh[dp] sum : tensor<8x8xf32>

// ZERO1-LABEL: func.func @train_update.0
// ZERO1: %[[MEAN:.+]] = ernie.div %{{.*}} : tensor<8x8xf32>
// ZERO1-NOT: ernie.all_reduce
// ZERO1: %[[PIECE:.+]] = ernie.reduce_scatter %[[MEAN]] over @mesh[dp] dim = 0 sum : tensor<8x8xf32> -> tensor<4x8xf32>
// ZERO1: %[[G:.+]] = ernie.cast %[[PIECE]] : tensor<4x8xf32> -> tensor<4x8xbf16>
// ZERO1: ernie.adamw_update %{{.*}}, %[[G]],
// ZERO1: ernie.all_gather %{{.*}} over @mesh[dp] dim = 0 : tensor<4x8xbf16> -> tensor<8x8xbf16>

// NATIVE-LABEL: func.func @train_update.0
// NATIVE: %[[MEAN:.+]] = ernie.div %{{.*}} : tensor<8x8xf32>
// NATIVE: %[[G:.+]] = ernie.cast %[[MEAN]] : tensor<8x8xf32> -> tensor<8x8xbf16>
// NATIVE: ernie.all_reduce %[[G]] over @mesh[dp] sum : tensor<8x8xbf16>

ernie.mesh @mesh(dp = 2, pp = 2)
func.func @forward(%x: tensor<4x8xbf16> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>},
                   %y: tensor<4xi64> {ernie.sharding = #ernie.sharding<@mesh, [{dp}]>},
                   %w: tensor<8x8xbf16> {ernie.param = "first.weight"},
                   %v: tensor<8x8xbf16> {ernie.param = "second.weight"}) -> tensor<f32> {
  %h = ernie.matmul %x, %w : tensor<4x8xbf16>, tensor<8x8xbf16> -> tensor<4x8xbf16>
  %s = ernie.split_point %h : tensor<4x8xbf16>
  %m = ernie.matmul %s, %v : tensor<4x8xbf16>, tensor<8x8xbf16> -> tensor<4x8xbf16>
  %m32 = ernie.cast %m : tensor<4x8xbf16> -> tensor<4x8xf32>
  %loss = ernie.cross_entropy %m32, %y : tensor<4x8xf32>, tensor<4xi64> -> tensor<f32>
  return %loss : tensor<f32>
}

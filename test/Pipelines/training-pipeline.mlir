// --ernie-training-pipeline runs ernie.compile's whole pass order from C++
// (python/tests/test_training_pipeline.py checks it writes the same program
// file as compile). The order shows in what comes out: autodiff runs before
// partition (the weights' gradients are pending sums that partition
// completes over dp), ZeRO before partition (the sums become
// reduce-scatters, the update works on shards and gathers the parameters),
// the gradient buckets after partition (one started collective for every
// gradient, waited for at the end) and fusion last (its loops hold the
// per-rank shapes).
// RUN: ernie-opt %s --ernie-training-pipeline="optimizer=adamw" | FileCheck %s
// RUN: ernie-opt %s --ernie-training-pipeline="optimizer=adamw zero-level=2" | FileCheck %s --check-prefix=ZERO
// RUN: ernie-opt %s --ernie-training-pipeline="optimizer=sgd fuse=false bucket-bytes=0" | FileCheck %s --check-prefix=PLAIN
// RUN: ernie-opt %s --ernie-training-pipeline="optimizer=sgd partition=false" | FileCheck %s --check-prefix=LOCAL
// RUN: ernie-opt %s --ernie-training-pipeline="differentiate=false" | FileCheck %s --check-prefix=FORWARD
// RUN: ernie-opt %S/../../examples/llama_block.mlir --ernie-training-pipeline="optimizer=adamw fp8=true fp8-exclude=lm_head" | FileCheck %s --check-prefix=LLAMA

// CHECK-LABEL: func.func @forward_grad
// CHECK-SAME: tensor<4x16xf32>
// CHECK: ernie.fused({{.*}}) : ({{.*}}tensor<4x32xf32>{{.*}}) -> tensor<4x32xf32>
// CHECK: %[[B:.+]]:2 = ernie.all_reduce_start %{{.*}}, %{{.*}} over @mesh[dp] sum : tensor<32x10xf32>, tensor<16x32xf32>
// CHECK: ernie.wait %[[B]]#0
// CHECK: ernie.wait %[[B]]#1
// CHECK-LABEL: func.func @train_step
// CHECK-COUNT-2: ernie.adamw_update
// CHECK-LABEL: func.func @eval_step

// ZERO-LABEL: func.func @forward_grad
// ZERO: ernie.reduce_scatter_start %{{.*}}, %{{.*}} over @mesh[dp] dim = 0 sum : tensor<32x10xf32>, tensor<16x32xf32> -> tensor<16x10xf32>, tensor<8x32xf32>
// ZERO-LABEL: func.func @train_step
// ZERO: ernie.shard_slice %{{.*}} over @mesh[dp] dim = 0 : tensor<16x32xf32> -> tensor<8x32xf32>
// ZERO: ernie.adamw_update {{.*}} : tensor<8x32xf32>
// ZERO: ernie.all_gather_start %{{.*}}, %{{.*}} over @mesh[dp] dim = 0

// PLAIN-LABEL: func.func @forward_grad
// PLAIN-NOT: ernie.fused
// PLAIN-NOT: _start
// PLAIN-DAG: ernie.all_reduce %{{.*}} over @mesh[dp] sum : tensor<16x32xf32>
// PLAIN-DAG: ernie.all_reduce %{{.*}} over @mesh[dp] sum : tensor<32x10xf32>
// PLAIN-LABEL: func.func @train_step
// PLAIN-COUNT-2: ernie.sgd_update

// LOCAL-LABEL: func.func @forward_grad
// LOCAL-SAME: tensor<8x16xf32>
// LOCAL-NOT: ernie.all_reduce
// LOCAL-LABEL: func.func @train_step
// LOCAL-COUNT-2: ernie.sgd_update

// FORWARD-NOT: @forward_grad
// FORWARD-NOT: @train_step
// FORWARD-LABEL: func.func @forward
// FORWARD-SAME: tensor<4x16xf32>

// FP8 lowering runs on the gradient function autodiff made: the backward's
// GEMMs are lowered too (e5m2 gradients), the excluded head is not.
// LLAMA-LABEL: func.func @forward_grad
// LLAMA-COUNT-4: ernie.scaled_matmul {{.*}} : tensor<{{.*}}xf8E4M3FN>, tensor<{{.*}}xf8E4M3FN>
// LLAMA: ernie.matmul {{.*}} : tensor<2x16x64xf32>, tensor<64x256xf32> -> tensor<2x16x256xf32>
// LLAMA: ernie.scaled_matmul {{.*}} {transpose_b} : tensor<2x16x64xf8E5M2>
// LLAMA-LABEL: func.func @train_step

ernie.mesh @mesh(dp = 2)
func.func @forward(%x: tensor<8x16xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>},
                   %y: tensor<8xi64> {ernie.sharding = #ernie.sharding<@mesh, [{dp}]>},
                   %w1: tensor<16x32xf32> {ernie.param = "w1"}, %w2: tensor<32x10xf32> {ernie.param = "w2"}) -> tensor<f32> {
  %h = ernie.matmul %x, %w1 : tensor<8x16xf32>, tensor<16x32xf32> -> tensor<8x32xf32>
  %a = ernie.relu %h : tensor<8x32xf32>
  %o = ernie.matmul %a, %w2 : tensor<8x32xf32>, tensor<32x10xf32> -> tensor<8x10xf32>
  %l = ernie.cross_entropy %o, %y {reduction = #ernie<loss_reduction mean>} : tensor<8x10xf32>, tensor<8xi64> -> tensor<f32>
  return %l : tensor<f32>
}

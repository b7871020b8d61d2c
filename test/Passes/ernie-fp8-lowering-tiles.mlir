// Blockwise FP8 tiles stay within a rank's shard: with a row-parallel
// weight (and its input) split 4 ways along the 512-wide contraction, 1x128
// tiles lie in each rank's 128 columns and partition keeps them local; 1x256
// tiles would be cut by the shard boundary, which partition reports instead
// of gathering the operand.
// RUN: ernie-opt %s --ernie-autodiff "--ernie-fp8-lowering=recipe=blockwise block-size=128" --ernie-auto-parallel-pipeline | FileCheck %s
// RUN: not ernie-opt %s --ernie-autodiff "--ernie-fp8-lowering=recipe=blockwise block-size=256" --ernie-auto-parallel-pipeline 2>&1 | FileCheck %s --check-prefix=STRADDLE

// CHECK-LABEL: func.func @forward_grad
// CHECK-NOT: all_gather
// CHECK: ernie.reshape %arg0 {ernie.fp8_tile = array<i64: 1, 128>} : tensor<256x128xf32> -> tensor<256x1x1x128xf32>
// CHECK: ernie.reshape %arg1 {ernie.fp8_tile = array<i64: 128, 128>} : tensor<128x256xf32> -> tensor<1x128x2x128xf32>
// The weight gradient reads x transposed, in 128x1 tiles along the tokens:
// from the forward's fp8 codes and scales (codes / s), not from x.
// CHECK: ernie.reduce_sum {{.*}} -> tensor<f32>
// CHECK: %[[X:.+]] = ernie.div %{{.*}}, %{{.*}} : tensor<256x1x1x128xf32>
// CHECK: ernie.reshape %[[X]] {ernie.fp8_tile = array<i64: 128, 1>}
// CHECK-NOT: all_gather
// CHECK: return

ernie.mesh @mesh(mp = 4)
func.func @forward(%x: tensor<256x512xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>},
                   %w: tensor<512x256xf32> {ernie.param = "proj.weight", ernie.sharding = #ernie.sharding<@mesh, [{mp}, {}]>}) -> tensor<f32> {
  // STRADDLE: :[[@LINE+1]]:8: error: fp8 blockwise: tiles of 1x256 straddle the shards of dimension 1: its 512 split 4 ways over [mp] leave 128 per rank; use a block size dividing 128 or a plan that does not split this dimension
  %h = ernie.matmul %x, %w : tensor<256x512xf32>, tensor<512x256xf32> -> tensor<256x256xf32>
  %s = ernie.reduce_sum %h axes = [0, 1] : tensor<256x256xf32> -> tensor<f32>
  return %s : tensor<f32>
}

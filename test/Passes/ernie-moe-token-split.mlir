// Under mp, MoE dispatch's buffers [E, groups, capacity, hidden] leave
// dispatch split by groups over ep and, within each ep shard, over mp
// (ernie.moe's view [E, ep shards, groups per shard, capacity, hidden]):
// the all-to-all over ep moves only this mp rank's share (half the bytes
// on mp = 2), and experts that mp splits gather the shares after it
// (Megatron's expert tensor parallelism). Without the view, the groups'
// [ep, mp] split cannot give ep to the experts' dimension while mp stays:
// mp is gathered first and the all-to-all moves every token of the shard.
// RUN: ernie-opt %s --split-input-file --ernie-auto-parallel-pipeline | FileCheck %s

ernie.mesh @mesh(ep = 2, mp = 2)
// CHECK-LABEL: func.func @view
// CHECK: ernie.reshape %arg0 : tensor<8x1x8x32xf32> -> tensor<8x1x1x8x32xf32>
// CHECK-NEXT: ernie.all_to_all %{{.*}} over @mesh[ep] split_dim = 0, concat_dim = 1 : tensor<8x1x1x8x32xf32> -> tensor<4x2x1x8x32xf32>
// CHECK-NEXT: ernie.all_gather %{{.*}} over @mesh[mp] dim = 2 : tensor<4x2x1x8x32xf32> -> tensor<4x2x2x8x32xf32>
// CHECK-NOT: all_to_all
// CHECK: return
func.func @view(%buf: tensor<8x4x8x32xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {ep, mp}, {}, {}]>}) -> (tensor<8x4x8x32xf32> {ernie.sharding = #ernie.sharding<@mesh, [{ep}, {}, {}, {}]>}) {
  %v = ernie.reshape %buf : tensor<8x4x8x32xf32> -> tensor<8x2x2x8x32xf32>
  %t = ernie.sharding_constraint %v <@mesh, [{}, {ep}, {mp}, {}, {}]> {priority = 3} : tensor<8x2x2x8x32xf32>
  %e = ernie.sharding_constraint %t <@mesh, [{ep}, {}, {}, {}, {}]> {priority = 3} : tensor<8x2x2x8x32xf32>
  %r = ernie.reshape %e : tensor<8x2x2x8x32xf32> -> tensor<8x4x8x32xf32>
  return %r : tensor<8x4x8x32xf32>
}

// -----

ernie.mesh @mesh(ep = 2, mp = 2)
// CHECK-LABEL: func.func @no_view
// CHECK: ernie.all_gather %arg0 over @mesh[mp] dim = 1 : tensor<8x1x8x32xf32> -> tensor<8x2x8x32xf32>
// CHECK-NEXT: ernie.all_to_all %{{.*}} over @mesh[ep] split_dim = 0, concat_dim = 1 : tensor<8x2x8x32xf32> -> tensor<4x4x8x32xf32>
func.func @no_view(%buf: tensor<8x4x8x32xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {ep, mp}, {}, {}]>}) -> (tensor<8x4x8x32xf32> {ernie.sharding = #ernie.sharding<@mesh, [{ep}, {}, {}, {}]>}) {
  return %buf : tensor<8x4x8x32xf32>
}

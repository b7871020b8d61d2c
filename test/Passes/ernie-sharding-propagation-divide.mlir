// Work every rank of an axis would repeat is divided over it when a cluster
// says the compute saved clearly outweighs (4x) the collectives the divided
// op needs: replicated operands are sliced locally, the result is made split
// (or a pending sum, for a contraction) and brought back to what its users
// were promised. Without a cluster FLOPs and bytes have no common measure:
// nothing is divided. With 1 ms per hop nothing pays.
// RUN: ernie-opt %s --split-input-file "--ernie-sharding-propagation=cluster=%S/Inputs/cost-four-ranks.json" | FileCheck %s
// RUN: ernie-opt %s --split-input-file "--ernie-sharding-propagation=cluster=%S/Inputs/cost-four-ranks.json" --ernie-spmd-partition | FileCheck %s --check-prefix=LOCAL
// RUN: ernie-opt %s --split-input-file --ernie-sharding-propagation | FileCheck %s --check-prefix=BYTES
// RUN: ernie-opt %s --split-input-file "--ernie-sharding-propagation=cluster=%S/Inputs/cost-slow-start.json" | FileCheck %s --check-prefix=BYTES

// An LM head replicated on a tensor-parallel axis: 2.1 GFLOP at 1 TFLOP/s
// (~2 ms) against gathering 4 MiB per rank at 100 GB/s (~0.05 ms). Rows,
// the first factor of the cheapest choices (columns gather as much).
ernie.mesh @mesh(mp = 2)
// CHECK-LABEL: func.func @head
// CHECK-NEXT: %[[X:.*]] = ernie.reshard %arg0 <@mesh, [{mp}, {}]>
// CHECK-NEXT: %[[Y:.*]] = ernie.matmul %[[X]], %arg1 {ernie.shardings = [#ernie.sharding<@mesh, [{mp}, {}]>]}
// CHECK-NEXT: %[[W:.*]] = ernie.reshard %[[Y]] <@mesh, [{}, {}]>
// CHECK-NEXT: return %[[W]]
// LOCAL-LABEL: func.func @head
// LOCAL-NEXT: ernie.shard_slice %arg0 over @mesh[mp] dim = 0 : tensor<1024x256xf32> -> tensor<512x256xf32>
// LOCAL-NEXT: ernie.matmul {{.*}} : tensor<512x256xf32>, tensor<256x4096xf32> -> tensor<512x4096xf32>
// LOCAL-NEXT: ernie.all_gather {{.*}} over @mesh[mp] dim = 0 : tensor<512x4096xf32> -> tensor<1024x4096xf32>
// BYTES-LABEL: func.func @head
// BYTES-NEXT: ernie.matmul %arg0, %arg1 {ernie.shardings = [#ernie.sharding<@mesh, [{}, {}]>]}
// BYTES-NEXT: return
func.func @head(%x: tensor<1024x256xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {}]>},
                %w: tensor<256x4096xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {}]>}) -> tensor<1024x4096xf32> {
  %y = ernie.matmul %x, %w : tensor<1024x256xf32>, tensor<256x4096xf32> -> tensor<1024x4096xf32>
  return %y : tensor<1024x4096xf32>
}

// -----

// Only the contraction divides evenly (255 rows and columns): a pending sum,
// all-reduced.
ernie.mesh @mesh(mp = 2)
// CHECK-LABEL: func.func @contraction
// CHECK: ernie.matmul {{.*}} {ernie.shardings = [#ernie.sharding<@mesh, [{}, {}], partial = {mp = sum}>], transpose_a}
// LOCAL-LABEL: func.func @contraction
// LOCAL: ernie.matmul {{.*}} : tensor<4096x255xf32>, tensor<4096x255xf32> -> tensor<255x255xf32>
// LOCAL-NEXT: ernie.all_reduce {{.*}} over @mesh[mp] sum
// BYTES-LABEL: func.func @contraction
// BYTES-NEXT: ernie.matmul %arg0, %arg1 {ernie.shardings = [#ernie.sharding<@mesh, [{}, {}]>], transpose_a}
func.func @contraction(%x: tensor<8192x255xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {}]>},
                       %dy: tensor<8192x255xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {}]>}) -> tensor<255x255xf32> {
  %g = ernie.matmul %x, %dy {transpose_a} : tensor<8192x255xf32>, tensor<8192x255xf32> -> tensor<255x255xf32>
  return %g : tensor<255x255xf32>
}

// -----

// The logits are returned whole and read by a second GEMM, itself divided
// by rows: it reads the divided head's own rows, not the gathered logits
// sliced back.
ernie.mesh @mesh(mp = 2)
// CHECK-LABEL: func.func @chain
// CHECK: %[[Y:.*]] = ernie.matmul {{.*}} {ernie.shardings = [#ernie.sharding<@mesh, [{mp}, {}]>]}
// CHECK-NEXT: %[[WHOLE:.*]] = ernie.reshard %[[Y]] <@mesh, [{}, {}]>
// CHECK-NEXT: %[[Z:.*]] = ernie.matmul %[[Y]], %arg2 {ernie.shardings = [#ernie.sharding<@mesh, [{mp}, {}]>]}
// CHECK-NEXT: %[[ZW:.*]] = ernie.reshard %[[Z]] <@mesh, [{}, {}]>
// CHECK-NEXT: return %[[WHOLE]], %[[ZW]]
// LOCAL-LABEL: func.func @chain
// LOCAL-COUNT-2: ernie.all_gather
// LOCAL-NOT: ernie.shard_slice
// LOCAL: return
func.func @chain(%x: tensor<1024x256xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {}]>},
                 %w: tensor<256x4096xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {}]>},
                 %v: tensor<4096x256xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {}]>}) -> (tensor<1024x4096xf32>, tensor<1024x256xf32>) {
  %y = ernie.matmul %x, %w : tensor<1024x256xf32>, tensor<256x4096xf32> -> tensor<1024x4096xf32>
  %z = ernie.matmul %y, %v : tensor<1024x4096xf32>, tensor<4096x256xf32> -> tensor<1024x256xf32>
  return %y, %z : tensor<1024x4096xf32>, tensor<1024x256xf32>
}

// -----

// Small work is not worth a collective, and work its bytes bound (an add,
// a norm's statistics, a loss over logits) is not divided at all: fusion
// removes those bytes later, and a slice and a gather move as many.
ernie.mesh @mesh(mp = 2)
// CHECK-LABEL: func.func @small
// CHECK-NEXT: ernie.add %arg0, %arg0 {ernie.shardings = [#ernie.sharding<@mesh, [{}, {}]>]}
func.func @small(%x: tensor<64x64xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {}]>}) -> tensor<64x64xf32> {
  %y = ernie.add %x, %x : tensor<64x64xf32>
  return %y : tensor<64x64xf32>
}

// -----

// Work already split over the axis is not divided again; a pipeline's axis
// holds different stages, never one op's pieces.
module attributes {ernie.pipeline = {stages = 2 : i64, virtual_stages = 1 : i64, axis = "pp"}} {
ernie.mesh @mesh(pp = 2, mp = 2)
// CHECK-LABEL: func.func @split
// CHECK-NEXT: ernie.matmul %arg0, %arg1 {ernie.shardings = [#ernie.sharding<@mesh, [{}, {mp}]>]}
// CHECK-NEXT: return
func.func @split(%x: tensor<1024x256xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {}]>},
                 %w: tensor<256x4096xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>}) -> tensor<1024x4096xf32> {
  %y = ernie.matmul %x, %w : tensor<1024x256xf32>, tensor<256x4096xf32> -> tensor<1024x4096xf32>
  return %y : tensor<1024x4096xf32>
}
}

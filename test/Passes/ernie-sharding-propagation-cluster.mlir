// Propagation and partition choose by the collectives' time on a cluster
// (`cluster=`) instead of by bytes: the cost model's alpha-beta per
// collective, a latency per hop of the ring plus the bytes over the
// bandwidth of the links the group spans.
// RUN: ernie-opt %s --split-input-file --ernie-auto-parallel-pipeline | FileCheck %s --check-prefix=BYTES
// RUN: ernie-opt %s --split-input-file "--ernie-auto-parallel-pipeline=cluster=%S/Inputs/cost-two-nodes-of-four.json" | FileCheck %s --check-prefix=NODES
// RUN: ernie-opt %s --split-input-file "--ernie-sharding-propagation=cluster=%S/Inputs/cost-slow-start.json" "--ernie-spmd-partition=cluster=%S/Inputs/cost-slow-start.json" | FileCheck %s --check-prefix=LATENCY

// The topology. On two nodes of four, ranks row-major, `a` crosses the
// network (1 GB/s, 10 us) and `b` stays on a node's links (10 GB/s, 1 us).
// The add's operands disagree; one of them must move. Moving %x from a to b
// sends the fewest bytes, 6 KiB across the network (an all-to-all and an
// all-gather over a, a hop each): 20 + 6.1 = 26.1 us. Moving %y from b to
// a sends 12 KiB over the node (three hops): 3 + 1.2 = 4.2 us.
ernie.mesh @mesh(a = 2, b = 4)
// BYTES-LABEL: func.func @topology
// BYTES-SAME: -> (tensor<16x64xf32> {ernie.shard_of = #ernie.sharding<@mesh, [{b}, {}]>})
// BYTES-NEXT: ernie.all_to_all %arg0 over @mesh[a]
// BYTES-NEXT: ernie.shard_slice {{.*}} over @mesh[b]
// BYTES-NEXT: ernie.all_gather {{.*}} over @mesh[a]
// NODES-LABEL: func.func @topology
// NODES-SAME: -> (tensor<32x64xf32> {ernie.shard_of = #ernie.sharding<@mesh, [{a}, {}]>})
// NODES-NEXT: ernie.all_gather %arg1 over @mesh[b] dim = 0 : tensor<16x64xf32> -> tensor<64x64xf32>
// NODES-NEXT: ernie.shard_slice {{.*}} over @mesh[a]
func.func @topology(%x: tensor<64x64xf32> {ernie.sharding = #ernie.sharding<@mesh, [{a}, {}]>},
                    %y: tensor<64x64xf32> {ernie.sharding = #ernie.sharding<@mesh, [{b}, {}]>}) -> tensor<64x64xf32> {
  %z = ernie.add %x, %y : tensor<64x64xf32>
  return %z : tensor<64x64xf32>
}

// -----

// The latency. [{a, b}] to [{b, a}] over dimension 0 of a 16 KiB tensor:
// the fewest bytes (6.5 KiB) take an all-to-all over b, an all-gather over
// a and another all-to-all over b. An all-to-all sends to every peer at
// once, one round of latency each: 1 + 1 + 1 = 3 ms at 1 ms a hop, against
// 3 + 1 = 4 ring hops for gathering over b and a and slicing (14 KiB). So
// the timed choice is the fewest bytes' too (as rings, the all-to-alls'
// 3 hops each made gathering 3 ms faster).
ernie.mesh @mesh(a = 2, b = 4)
// BYTES-LABEL: func.func @latency
// BYTES-NEXT: ernie.all_to_all %arg0 over @mesh[b]
// BYTES-NEXT: ernie.all_gather {{.*}} over @mesh[a]
// BYTES-NEXT: ernie.all_to_all {{.*}} over @mesh[b]
// BYTES-NEXT: ernie.shard_slice {{.*}} over @mesh[a]
// LATENCY-LABEL: func.func @latency
// LATENCY-NEXT: ernie.all_to_all %arg0 over @mesh[b]
// LATENCY-NEXT: ernie.all_gather {{.*}} over @mesh[a]
// LATENCY-NEXT: ernie.all_to_all {{.*}} over @mesh[b]
// LATENCY-NEXT: ernie.shard_slice {{.*}} over @mesh[a]
// LATENCY-NEXT: return
func.func @latency(%x: tensor<64x64xf32> {ernie.sharding = #ernie.sharding<@mesh, [{a, b}, {}]>})
    -> (tensor<64x64xf32> {ernie.sharding = #ernie.sharding<@mesh, [{b, a}, {}]>}) {
  return %x : tensor<64x64xf32>
}

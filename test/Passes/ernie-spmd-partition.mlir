// RUN: ernie-opt %s --split-input-file --ernie-spmd-partition | FileCheck %s

// Megatron's MLP after propagation: local shapes, one all-reduce.
ernie.mesh @mesh(dp = 2, mp = 4)
// CHECK-LABEL: func.func @megatron_mlp
// CHECK-SAME: (%[[X:.+]]: tensor<4x16xf32> {ernie.shard_of = #ernie.sharding<@mesh, [{dp}, {}]>}, %[[W1:.+]]: tensor<16x16xf32> {ernie.shard_of = #ernie.sharding<@mesh, [{}, {mp}]>}, %[[W2:.+]]: tensor<16x16xf32> {ernie.shard_of = #ernie.sharding<@mesh, [{mp}, {}]>})
// CHECK-SAME: -> (tensor<4x16xf32> {ernie.shard_of = #ernie.sharding<@mesh, [{dp}, {}]>})
// CHECK: %[[H:.+]] = ernie.matmul %[[X]], %[[W1]] : tensor<4x16xf32>, tensor<16x16xf32> -> tensor<4x16xf32>
// CHECK: %[[G:.+]] = ernie.gelu %[[H]] : tensor<4x16xf32>
// CHECK: %[[Y:.+]] = ernie.matmul %[[G]], %[[W2]] : tensor<4x16xf32>, tensor<16x16xf32> -> tensor<4x16xf32>
// CHECK: %[[R:.+]] = ernie.all_reduce %[[Y]] over @mesh[mp] sum : tensor<4x16xf32>
// CHECK: %[[Z:.+]] = ernie.add %[[R]], %[[X]] : tensor<4x16xf32>
// CHECK: return %[[Z]]
// CHECK-NOT: ernie.shardings
func.func @megatron_mlp(%x: tensor<8x16xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>}, %w1: tensor<16x64xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>}, %w2: tensor<64x16xf32> {ernie.sharding = #ernie.sharding<@mesh, [{mp}, {}]>}) -> (tensor<8x16xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>}) {
  %0 = ernie.matmul %x, %w1 {ernie.shardings = [#ernie.sharding<@mesh, [{dp}, {mp}]>]} : tensor<8x16xf32>, tensor<16x64xf32> -> tensor<8x64xf32>
  %1 = ernie.gelu %0 {ernie.shardings = [#ernie.sharding<@mesh, [{dp}, {mp}]>]} : tensor<8x64xf32>
  %2 = ernie.matmul %1, %w2 {ernie.shardings = [#ernie.sharding<@mesh, [{dp}, {}], partial = {mp = sum}>]} : tensor<8x64xf32>, tensor<64x16xf32> -> tensor<8x16xf32>
  %3 = ernie.reshard %2 <@mesh, [{dp}, {}]> : tensor<8x16xf32>
  %4 = ernie.add %3, %x {ernie.shardings = [#ernie.sharding<@mesh, [{dp}, {}]>]} : tensor<8x16xf32>
  return %4 : tensor<8x16xf32>
}

// -----

// Each elementary reshard becomes its collective.
ernie.mesh @mesh(x = 2, y = 4)
// CHECK-LABEL: func.func @elementary
// CHECK-SAME: %[[P:[a-z0-9]+]]: tensor<8x16xf32>
// CHECK-SAME: %[[S:[a-z0-9]+]]: tensor<4x16xf32>
// CHECK-SAME: %[[R:[a-z0-9]+]]: tensor<8x16xf32>
// CHECK: ernie.all_reduce %[[P]] over @mesh[x] sum : tensor<8x16xf32>
// CHECK: ernie.reduce_scatter %[[P]] over @mesh[x] dim = 1 sum : tensor<8x16xf32> -> tensor<8x8xf32>
// CHECK: ernie.all_gather %[[S]] over @mesh[x] dim = 0 : tensor<4x16xf32> -> tensor<8x16xf32>
// CHECK: ernie.all_to_all %[[S]] over @mesh[x] split_dim = 1, concat_dim = 0 : tensor<4x16xf32> -> tensor<8x8xf32>
// CHECK: ernie.shard_slice %[[R]] over @mesh[y] dim = 1 : tensor<8x16xf32> -> tensor<8x4xf32>
// CHECK: ernie.partial_init %[[R]] over @mesh[y] max : tensor<8x16xf32>
func.func @elementary(%p: tensor<8x16xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {}], partial = {x = sum}>},
                      %s: tensor<8x16xf32> {ernie.sharding = #ernie.sharding<@mesh, [{x}, {}]>},
                      %r: tensor<8x16xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {}]>}) {
  %0 = ernie.reshard %p <@mesh, [{}, {}]> : tensor<8x16xf32>
  %1 = ernie.reshard %p <@mesh, [{}, {x}]> : tensor<8x16xf32>
  %2 = ernie.reshard %s <@mesh, [{}, {}]> : tensor<8x16xf32>
  %3 = ernie.reshard %s <@mesh, [{}, {x}]> : tensor<8x16xf32>
  %4 = ernie.reshard %r <@mesh, [{}, {y}]> : tensor<8x16xf32>
  %5 = ernie.reshard %r <@mesh, [{}, {}], partial = {y = max}> : tensor<8x16xf32>
  return
}

// -----

// A multi-step reshard on a 2-D mesh: both axes change dimension.
ernie.mesh @mesh(x = 2, y = 2)
// CHECK-LABEL: func.func @swap_axes
// CHECK: ernie.all_gather {{.*}} over @mesh[x] dim = 0 : tensor<4x4xf32> -> tensor<8x4xf32>
// CHECK: ernie.all_to_all {{.*}} over @mesh[y] split_dim = 0, concat_dim = 1 : tensor<8x4xf32> -> tensor<4x8xf32>
// CHECK: ernie.shard_slice {{.*}} over @mesh[x] dim = 1 : tensor<4x8xf32> -> tensor<4x4xf32>
func.func @swap_axes(%a: tensor<8x8xf32> {ernie.sharding = #ernie.sharding<@mesh, [{x}, {y}]>}) -> (tensor<8x8xf32> {ernie.sharding = #ernie.sharding<@mesh, [{y}, {x}]>}) {
  %0 = ernie.reshard %a <@mesh, [{y}, {x}]> : tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

// A whole-dimension slice keeps its local extent; a sharded constant is
// built whole and sliced.
ernie.mesh @mesh(dp = 2)
// CHECK-LABEL: func.func @local_forms
// CHECK: ernie.slice %{{.*}} [0:2, 1:3] : tensor<2x4xf32> -> tensor<2x2xf32>
// CHECK: %[[C:.+]] = ernie.constant dense<{{.*}}> : tensor<4xf32>
// CHECK: ernie.shard_slice %[[C]] over @mesh[dp] dim = 0 : tensor<4xf32> -> tensor<2xf32>
func.func @local_forms(%a: tensor<4x4xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>}) {
  %0 = ernie.slice %a [0:4, 1:3] {ernie.shardings = [#ernie.sharding<@mesh, [{dp}, {}]>]} : tensor<4x4xf32> -> tensor<4x2xf32>
  %1 = ernie.constant {ernie.shardings = [#ernie.sharding<@mesh, [{dp}]>]} dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>
  return
}

// -----

// A vocabulary-split embedding looks up the rows this rank owns.
ernie.mesh @mesh(mp = 4)
// CHECK-LABEL: func.func @vocab_parallel_embedding
// CHECK-SAME: (%[[IDS:.+]]: tensor<2x3xi64> {{.*}}, %[[TABLE:.+]]: tensor<4x8xf32>
// CHECK: %[[I:.+]] = ernie.axis_index over @mesh[mp] : tensor<i64>
// CHECK: %[[FIRST:.+]] = ernie.mul %[[I]], %{{.*}} : tensor<i64>
// CHECK: %[[OFF:.+]] = ernie.broadcast %[[FIRST]], dims = [] : tensor<i64> -> tensor<2x3xi64>
// CHECK: %[[LOCAL:.+]] = ernie.sub %[[IDS]], %[[OFF]] : tensor<2x3xi64>
// CHECK: ernie.compare ge, %[[LOCAL]]
// CHECK: ernie.compare lt, %[[LOCAL]]
// CHECK: %[[SAFE:.+]] = ernie.select %{{.*}}, %[[LOCAL]], %{{.*}} : tensor<2x3xi1>, tensor<2x3xi64>
// CHECK: %[[ROWS:.+]] = ernie.embedding %[[SAFE]], %[[TABLE]] : tensor<2x3xi64>, tensor<4x8xf32> -> tensor<2x3x8xf32>
// CHECK: ernie.select %{{.*}}, %[[ROWS]], %{{.*}} : tensor<2x3x8xi1>, tensor<2x3x8xf32>
// CHECK: ernie.all_reduce %{{.*}} over @mesh[mp] sum : tensor<2x3x8xf32>
func.func @vocab_parallel_embedding(%ids: tensor<2x3xi64> {ernie.sharding = #ernie.sharding<@mesh, [{}, {}]>}, %table: tensor<16x8xf32> {ernie.sharding = #ernie.sharding<@mesh, [{mp}, {}]>}) -> (tensor<2x3x8xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {}, {}]>}) {
  %0 = ernie.embedding %ids, %table {ernie.shardings = [#ernie.sharding<@mesh, [{}, {}, {}], partial = {mp = sum}>]} : tensor<2x3xi64>, tensor<16x8xf32> -> tensor<2x3x8xf32>
  %1 = ernie.reshard %0 <@mesh, [{}, {}, {}]> : tensor<2x3x8xf32>
  return %1 : tensor<2x3x8xf32>
}

// -----

// External functions take their local signature from their shardings; a
// splat constant's piece is a local splat.
ernie.mesh @mesh(dp = 2)
// CHECK-LABEL: func.func private @ext
// CHECK-SAME: (tensor<4x4xf32> {ernie.shard_of = #ernie.sharding<@mesh, [{dp}, {}]>}) -> (tensor<4x4xf32> {ernie.shard_of = #ernie.sharding<@mesh, [{dp}, {}]>})
// CHECK-LABEL: func.func @calls_external
// CHECK: %[[X:.+]] = ernie.shard_slice %{{.*}} over @mesh[dp] dim = 0 : tensor<8x4xf32> -> tensor<4x4xf32>
// CHECK: %[[Y:.+]] = call @ext(%[[X]]) : (tensor<4x4xf32>) -> tensor<4x4xf32>
// CHECK: ernie.add %[[Y]], %{{.*}} : tensor<4x4xf32>
func.func private @ext(tensor<8x4xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>}) -> (tensor<8x4xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>})
func.func @calls_external(%x: tensor<8x4xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {}]>}) -> (tensor<8x4xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>}) {
  %0 = ernie.reshard %x <@mesh, [{dp}, {}]> : tensor<8x4xf32>
  %1 = func.call @ext(%0) {ernie.shardings = [#ernie.sharding<@mesh, [{dp}, {}]>]} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %2 = ernie.constant {ernie.shardings = [#ernie.sharding<@mesh, [{}, {}]>]} dense<1.0> : tensor<8x4xf32>
  %3 = ernie.reshard %2 <@mesh, [{dp}, {}]> : tensor<8x4xf32>
  %4 = ernie.add %1, %3 {ernie.shardings = [#ernie.sharding<@mesh, [{dp}, {}]>]} : tensor<8x4xf32>
  return %4 : tensor<8x4xf32>
}

// -----

// A row-parallel layer's backward reads its output gradient as [b, s, h]
// (data gradient) and as [b * s, h] (weight gradient): the hidden-split
// gradient is gathered once and the second read is a reshape of that
// gather. A reshape that merges the gathered dimension with another keeps
// its own gather.
ernie.mesh @mesh(mp = 4)
// CHECK-LABEL: func.func @one_gather_through_reshapes
// CHECK-SAME: (%[[G:.+]]: tensor<2x4x2xf32> {{.+}}, %[[W:.+]]: tensor<8x8xf32> {{.+}}, %[[H:.+]]: tensor<2x1x8xf32>
// CHECK: %[[A:.+]] = ernie.all_gather %[[G]] over @mesh[mp] dim = 2 : tensor<2x4x2xf32> -> tensor<2x4x8xf32>
// CHECK: %[[R:.+]] = ernie.reshape %[[A]] : tensor<2x4x8xf32> -> tensor<8x8xf32>
// CHECK: ernie.matmul %[[R]]
// CHECK: ernie.all_gather %[[H]] over @mesh[mp] dim = 1 : tensor<2x1x8xf32> -> tensor<2x4x8xf32>
// CHECK: %[[F:.+]] = ernie.reshape %[[H]] : tensor<2x1x8xf32> -> tensor<2x8xf32>
// CHECK: ernie.all_gather %[[F]] over @mesh[mp] dim = 1 : tensor<2x8xf32> -> tensor<2x32xf32>
// CHECK-NOT: all_gather
func.func @one_gather_through_reshapes(%g: tensor<2x4x8xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {}, {mp}]>}, %w: tensor<8x8xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {}]>}, %h: tensor<2x4x8xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}, {}]>}) -> (tensor<2x4x8xf32>, tensor<8x8xf32>, tensor<2x4x8xf32>, tensor<2x32xf32>) {
  %0 = ernie.reshard %g <@mesh, [{}, {}, {}]> : tensor<2x4x8xf32>
  %1 = ernie.matmul %0, %w {ernie.shardings = [#ernie.sharding<@mesh, [{}, {}, {}]>]} : tensor<2x4x8xf32>, tensor<8x8xf32> -> tensor<2x4x8xf32>
  %2 = ernie.reshape %g {ernie.shardings = [#ernie.sharding<@mesh, [{}, {mp}]>]} : tensor<2x4x8xf32> -> tensor<8x8xf32>
  %3 = ernie.reshard %2 <@mesh, [{}, {}]> : tensor<8x8xf32>
  %4 = ernie.matmul %3, %w {ernie.shardings = [#ernie.sharding<@mesh, [{}, {}]>]} : tensor<8x8xf32>, tensor<8x8xf32> -> tensor<8x8xf32>
  %5 = ernie.reshard %h <@mesh, [{}, {}, {}]> : tensor<2x4x8xf32>
  %6 = ernie.reshape %h {ernie.shardings = [#ernie.sharding<@mesh, [{}, {mp}]>]} : tensor<2x4x8xf32> -> tensor<2x32xf32>
  %7 = ernie.reshard %6 <@mesh, [{}, {}]> : tensor<2x32xf32>
  return %1, %4, %5, %7 : tensor<2x4x8xf32>, tensor<8x8xf32>, tensor<2x4x8xf32>, tensor<2x32xf32>
}

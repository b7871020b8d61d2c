// Uneven splits: a dimension its axes do not divide has pieces of
// ceil(size / parts), the last padded. Gathers slice the padding off,
// scatters pad first, reductions see the padding as their identity.
//
// RUN: ernie-opt %s --split-input-file --ernie-auto-parallel-pipeline | FileCheck %s

ernie.mesh @mesh(mp = 3)
// 7 rows over 3: pieces of 3 (3 + 3 + 1 real). The gather yields 9 rows.
// CHECK-LABEL: func.func @gather
// CHECK-SAME:    %[[X:.+]]: tensor<3x4xf32> {ernie.global_shape = array<i64: 7, 4>
// CHECK:         %[[G:.+]] = ernie.all_gather %[[X]] over @mesh[mp] dim = 0 : tensor<3x4xf32> -> tensor<9x4xf32>
// CHECK:         %[[S:.+]] = ernie.slice %[[G]] [0:7, 0:4] : tensor<9x4xf32> -> tensor<7x4xf32>
// CHECK:         return %[[S]]
func.func @gather(%x: tensor<7x4xf32> {ernie.sharding = #ernie.sharding<@mesh, [{mp}, {}]>}) -> (tensor<7x4xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {}]>}) {
  return %x : tensor<7x4xf32>
}

// -----

ernie.mesh @mesh(mp = 3)
// CHECK-LABEL: func.func @scatter
// CHECK:         %[[P:.+]] = ernie.pad %{{.+}} low = [0, 0], high = [2, 0], interior = [0, 0] : tensor<7x4xf32> -> tensor<9x4xf32>
// CHECK:         ernie.shard_slice %[[P]] over @mesh[mp] dim = 0 : tensor<9x4xf32> -> tensor<3x4xf32>
func.func @scatter(%x: tensor<7x4xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {}]>}) -> tensor<7x4xf32> {
  %y = ernie.reshard %x <@mesh, [{mp}, {}]> : tensor<7x4xf32>
  %z = ernie.exp %y : tensor<7x4xf32>
  return %z : tensor<7x4xf32>
}

// -----

ernie.mesh @mesh(mp = 3)
// Moving the split from rows (7) to columns (5): pad the columns to 6,
// exchange, drop the padded rows.
// CHECK-LABEL: func.func @all_to_all
// CHECK:         %[[P:.+]] = ernie.pad %{{.+}} low = [0, 0], high = [0, 1], interior = [0, 0] : tensor<3x5xf32> -> tensor<3x6xf32>
// CHECK:         %[[A:.+]] = ernie.all_to_all %[[P]] over @mesh[mp] split_dim = 1, concat_dim = 0 : tensor<3x6xf32> -> tensor<9x2xf32>
// CHECK:         ernie.slice %[[A]] [0:7, 0:2] : tensor<9x2xf32> -> tensor<7x2xf32>
func.func @all_to_all(%x: tensor<7x5xf32> {ernie.sharding = #ernie.sharding<@mesh, [{mp}, {}]>}) -> (tensor<7x5xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>}) {
  return %x : tensor<7x5xf32>
}

// -----

ernie.mesh @mesh(mp = 3)
// A max over padded rows: the padding becomes -inf first. The rank's real
// rows are 7 - 3 * index.
// CHECK-LABEL: func.func @max
// CHECK-DAG:     %[[THREE:.+]] = ernie.full 3 : tensor<i64>
// CHECK-DAG:     %[[SEVEN:.+]] = ernie.full 7 : tensor<i64>
// CHECK-DAG:     %[[NEG:.+]] = ernie.full (0xFF800000 : f32) : tensor<3x4xf32>
// CHECK:         %[[IDX:.+]] = ernie.axis_index over @mesh[mp] : tensor<i64>
// CHECK:         %[[FIRST:.+]] = ernie.mul %[[IDX]], %[[THREE]]
// CHECK:         %[[REAL:.+]] = ernie.sub %[[SEVEN]], %[[FIRST]]
// CHECK:         %[[B:.+]] = ernie.broadcast %[[REAL]]
// CHECK:         %[[ROW:.+]] = ernie.iota dim = 0 : tensor<3x4xi64>
// CHECK:         %[[IN:.+]] = ernie.compare lt, %[[ROW]], %[[B]]
// CHECK:         %[[M:.+]] = ernie.select %[[IN]], %{{.+}}, %[[NEG]]
// CHECK:         %[[R:.+]] = ernie.reduce_max %[[M]] axes = [0]
// CHECK:         ernie.all_reduce %[[R]] over @mesh[mp] max
func.func @max(%x: tensor<7x4xf32> {ernie.sharding = #ernie.sharding<@mesh, [{mp}, {}]>}) -> tensor<4xf32> {
  %r = ernie.reduce_max %x axes = [0] : tensor<7x4xf32> -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

ernie.mesh @mesh(mp = 3)
// A mean: zeros for the padding, and the local means (over 3 rows each)
// rescaled by 3 x 3 / 7 so that their average is the mean over 7.
// CHECK-LABEL: func.func @mean
// CHECK-DAG:     %[[K:.+]] = ernie.full 1.28571427 : tensor<4xf32>
// CHECK-DAG:     %[[ZERO:.+]] = ernie.full 0.000000e+00 : tensor<3x4xf32>
// CHECK:         %[[M:.+]] = ernie.select %{{.+}}, %{{.+}}, %[[ZERO]]
// CHECK:         %[[R:.+]] = ernie.reduce_mean %[[M]] axes = [0]
// CHECK:         %[[S:.+]] = ernie.mul %[[R]], %[[K]]
// CHECK:         ernie.all_reduce %[[S]] over @mesh[mp] avg
func.func @mean(%x: tensor<7x4xf32> {ernie.sharding = #ernie.sharding<@mesh, [{mp}, {}]>}) -> tensor<4xf32> {
  %r = ernie.reduce_mean %x axes = [0] : tensor<7x4xf32> -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

ernie.mesh @mesh(mp = 3)
// A contraction over a padded k: both operands' padding is zeroed.
// CHECK-LABEL: func.func @contract
// CHECK:         %[[L:.+]] = ernie.select %{{.+}}, %arg0, %{{.+}} : tensor<4x22xi1>, tensor<4x22xf32>
// CHECK:         %[[R:.+]] = ernie.select %{{.+}}, %arg1, %{{.+}} : tensor<22x10xi1>, tensor<22x10xf32>
// CHECK:         %[[P:.+]] = ernie.matmul %[[L]], %[[R]]
// CHECK:         ernie.all_reduce %[[P]] over @mesh[mp] sum
func.func @contract(%x: tensor<4x64xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>}, %w: tensor<64x10xf32> {ernie.sharding = #ernie.sharding<@mesh, [{mp}, {}]>}) -> tensor<4x10xf32> {
  %y = ernie.matmul %x, %w : tensor<4x64xf32>, tensor<64x10xf32> -> tensor<4x10xf32>
  return %y : tensor<4x10xf32>
}

// -----

ernie.mesh @mesh(mp = 3)
// Elementwise work on padding only makes more padding: no mask.
// CHECK-LABEL: func.func @elementwise
// CHECK-NOT:     ernie.select
// CHECK:         ernie.exp %arg0 : tensor<3x4xf32>
func.func @elementwise(%x: tensor<7x4xf32> {ernie.sharding = #ernie.sharding<@mesh, [{mp}, {}]>}) -> (tensor<7x4xf32> {ernie.sharding = #ernie.sharding<@mesh, [{mp}, {}]>}) {
  %y = ernie.exp %x : tensor<7x4xf32>
  return %y : tensor<7x4xf32>
}

// -----

ernie.mesh @mesh(dp = 2)
// Lookup ids in padded rows are zeroed before the lookup (padding computed
// from padding could index out of range).
// CHECK-LABEL: func.func @lookup
// CHECK-DAG:     %[[ZERO:.+]] = ernie.full 0 : tensor<2x4xi64>
// CHECK:         %[[IDS:.+]] = ernie.select %{{.+}}, %{{.+}}, %[[ZERO]] : tensor<2x4xi1>, tensor<2x4xi64>
// CHECK:         ernie.embedding %[[IDS]], %arg1
func.func @lookup(%ids: tensor<3x4xi64> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>}, %table: tensor<10x8xf32>) -> (tensor<3x4x8xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}, {}]>}) {
  %twice = ernie.add %ids, %ids : tensor<3x4xi64>
  %h = ernie.embedding %twice, %table : tensor<3x4xi64>, tensor<10x8xf32> -> tensor<3x4x8xf32>
  return %h : tensor<3x4x8xf32>
}

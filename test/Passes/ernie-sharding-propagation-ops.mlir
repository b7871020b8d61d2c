// Every op's rule through propagation, on a 1-D mesh and a 2-D mesh: the
// first operand's placement and where it lands on the results.
// RUN: ernie-opt %s --split-input-file --ernie-sharding-propagation | FileCheck %s

ernie.mesh @m(a = 4)
// CHECK-LABEL: func.func @mesh_1d
func.func @mesh_1d(%x: tensor<8x16xf32> {ernie.sharding = #ernie.sharding<@m, [{a}, {}]>},
                   %y: tensor<8x16xf32>, %c: tensor<8x16xi1>, %w: tensor<16x32xf32>,
                   %v: tensor<16xf32>, %ids: tensor<8x4xi64>, %t: tensor<64x16xf32>,
                   %lab: tensor<8xi64>) {
  // CHECK: ernie.exp {{.*}}[#ernie.sharding<@m, [{a}, {}]>]
  %0 = ernie.exp %x : tensor<8x16xf32>
  // CHECK: ernie.cast {{.*}}[#ernie.sharding<@m, [{a}, {}]>]
  %1 = ernie.cast %x : tensor<8x16xf32> -> tensor<8x16xbf16>
  // CHECK: ernie.sub {{.*}}[#ernie.sharding<@m, [{a}, {}]>]
  %2 = ernie.sub %x, %y : tensor<8x16xf32>
  // CHECK: ernie.compare {{.*}}[#ernie.sharding<@m, [{a}, {}]>]
  %3 = ernie.compare gt, %x, %y : tensor<8x16xf32>
  // CHECK: ernie.select {{.*}}[#ernie.sharding<@m, [{a}, {}]>]
  %4 = ernie.select %c, %x, %y : tensor<8x16xi1>, tensor<8x16xf32>
  // CHECK: ernie.matmul {{.*}}[#ernie.sharding<@m, [{a}, {}]>]
  %5 = ernie.matmul %x, %w : tensor<8x16xf32>, tensor<16x32xf32> -> tensor<8x32xf32>
  // CHECK: ernie.reduce_sum {{.*}}[#ernie.sharding<@m, [{a}]>]
  %6 = ernie.reduce_sum %x axes = [1] : tensor<8x16xf32> -> tensor<8xf32>
  // Reducing the split dim leaves a pending sum / average / maximum.
  // CHECK: ernie.reduce_sum {{.*}}[#ernie.sharding<@m, [{}], partial = {a = sum}>]
  %7 = ernie.reduce_sum %x axes = [0] : tensor<8x16xf32> -> tensor<16xf32>
  // CHECK: ernie.reduce_mean {{.*}}[#ernie.sharding<@m, [{}], partial = {a = avg}>]
  %8 = ernie.reduce_mean %x axes = [0] : tensor<8x16xf32> -> tensor<16xf32>
  // CHECK: ernie.reduce_max {{.*}}[#ernie.sharding<@m, [{}], partial = {a = max}>]
  %9 = ernie.reduce_max %x axes = [0] : tensor<8x16xf32> -> tensor<16xf32>
  // CHECK: ernie.softmax {{.*}}[#ernie.sharding<@m, [{a}, {}]>]
  %10 = ernie.softmax %x, axis = 1 : tensor<8x16xf32>
  // CHECK: ernie.rms_norm {{.*}}[#ernie.sharding<@m, [{a}, {}]>]
  %11 = ernie.rms_norm %x, %v, epsilon = 1.0e-6 : tensor<8x16xf32>, tensor<16xf32>
  // CHECK: ernie.layer_norm {{.*}}[#ernie.sharding<@m, [{a}, {}]>]
  %12 = ernie.layer_norm %x, %v, %v, epsilon = 1.0e-5 : tensor<8x16xf32>, tensor<16xf32>
  // CHECK: ernie.reshape {{.*}}[#ernie.sharding<@m, [{a}, {}, {}]>]
  %13 = ernie.reshape %x : tensor<8x16xf32> -> tensor<8x4x4xf32>
  // CHECK: ernie.reshape {{.*}}[#ernie.sharding<@m, [{a}]>]
  %14 = ernie.reshape %x : tensor<8x16xf32> -> tensor<128xf32>
  // CHECK: ernie.transpose {{.*}}[#ernie.sharding<@m, [{}, {a}]>]
  %15 = ernie.transpose %x, perm = [1, 0] : tensor<8x16xf32> -> tensor<16x8xf32>
  // CHECK: ernie.broadcast {{.*}}[#ernie.sharding<@m, [{}, {a}, {}]>]
  %16 = ernie.broadcast %x, dims = [1, 2] : tensor<8x16xf32> -> tensor<2x8x16xf32>
  // CHECK: ernie.slice {{.*}}[#ernie.sharding<@m, [{a}, {}]>]
  %17 = ernie.slice %x [0:8, 0:16:2] : tensor<8x16xf32> -> tensor<8x8xf32>
  // CHECK: ernie.concat {{.*}}[#ernie.sharding<@m, [{a}, {}]>]
  %18 = ernie.concat %x, %y axis = 1 : tensor<8x16xf32>, tensor<8x16xf32> -> tensor<8x32xf32>
  // CHECK: ernie.split {{.*}}[#ernie.sharding<@m, [{a}, {}]>, #ernie.sharding<@m, [{a}, {}]>]
  %19:2 = ernie.split %x axis = 1, sizes = [4, 12] : tensor<8x16xf32> -> tensor<8x4xf32>, tensor<8x12xf32>
  // CHECK: ernie.topk {{.*}}[#ernie.sharding<@m, [{a}, {}]>, #ernie.sharding<@m, [{a}, {}]>]
  %20:2 = ernie.topk %x, k = 2, axis = 1 : tensor<8x16xf32> -> tensor<8x2xf32>, tensor<8x2xi64>
  // CHECK: ernie.gather {{.*}}[#ernie.sharding<@m, [{a}, {}, {}]>]
  %21 = ernie.gather %x[%ids] axis = 1 : tensor<8x16xf32>, tensor<8x4xi64> -> tensor<8x8x4xf32>
  // CHECK: ernie.cross_entropy {{.*}}[#ernie.sharding<@m, [{a}]>]
  %22 = ernie.cross_entropy %x, %lab {reduction = #ernie<loss_reduction none>} : tensor<8x16xf32>, tensor<8xi64> -> tensor<8xf32>
  // CHECK: ernie.cross_entropy {{.*}}[#ernie.sharding<@m, [], partial = {a = sum}>]
  %23 = ernie.cross_entropy %x, %lab {reduction = #ernie<loss_reduction sum>} : tensor<8x16xf32>, tensor<8xi64> -> tensor<f32>
  return
}

// -----

ernie.mesh @m(x = 2, y = 2)
// CHECK-LABEL: func.func @mesh_2d
func.func @mesh_2d(%q: tensor<4x8x4x16xf32> {ernie.sharding = #ernie.sharding<@m, [{x}, {}, {y}, {}]>},
                   %k: tensor<4x8x2x16xf32>, %pos: tensor<8xi64>,
                   %a: tensor<4x16x32xf32> {ernie.sharding = #ernie.sharding<@m, [{x}, {}, {y}]>},
                   %b: tensor<4x32x8xf32>,
                   %ids: tensor<4x8xi64> {ernie.sharding = #ernie.sharding<@m, [{x}, {}]>},
                   %table: tensor<64x16xf32> {ernie.sharding = #ernie.sharding<@m, [{y}, {}]>},
                   %s: tensor<8x8xf32> {ernie.sharding = #ernie.sharding<@m, [{x, y}, {}]>}) {
  // Heads split over y, batch over x: rope and attention keep both.
  // CHECK: ernie.rope {{.*}}[#ernie.sharding<@m, [{x}, {}, {y}, {}]>]
  %0 = ernie.rope %q, %pos, theta = 10000.0 : tensor<4x8x4x16xf32>, tensor<8xi64>
  // CHECK: ernie.attention {{.*}}[#ernie.sharding<@m, [{x}, {}, {y}, {}]>]
  %1 = ernie.attention %0, %k, %k {causal} : tensor<4x8x4x16xf32>, tensor<4x8x2x16xf32>, tensor<4x8x2x16xf32> -> tensor<4x8x4x16xf32>
  // Batched matmul with a split contraction: pending sum over y.
  // CHECK: ernie.matmul {{.*}}[#ernie.sharding<@m, [{x}, {}, {}], partial = {y = sum}>]
  %2 = ernie.matmul %a, %b : tensor<4x16x32xf32>, tensor<4x32x8xf32> -> tensor<4x16x8xf32>
  // Vocab split over y, ids over x: a pending sum over y.
  // CHECK: ernie.embedding {{.*}}[#ernie.sharding<@m, [{x}, {}, {}], partial = {y = sum}>]
  %3 = ernie.embedding %ids, %table : tensor<4x8xi64>, tensor<64x16xf32> -> tensor<4x8x16xf32>
  // Two axes on one dim move together through a transpose and a reshape.
  // CHECK: ernie.transpose {{.*}}[#ernie.sharding<@m, [{}, {x, y}]>]
  %4 = ernie.transpose %s, perm = [1, 0] : tensor<8x8xf32> -> tensor<8x8xf32>
  // CHECK: ernie.reshape {{.*}}[#ernie.sharding<@m, [{x, y}, {}, {}]>]
  %5 = ernie.reshape %s : tensor<8x8xf32> -> tensor<8x2x4xf32>
  // Merging dims keeps the split of the major one (and the last dim's own).
  // CHECK: ernie.reshape {{.*}}[#ernie.sharding<@m, [{x}, {y}]>]
  %6 = ernie.reshape %a : tensor<4x16x32xf32> -> tensor<64x32xf32>
  return
}

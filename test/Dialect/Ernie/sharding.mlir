// Meshes, shardings and the annotation ops round-trip, in custom and generic form.
// RUN: ernie-opt %s | ernie-opt | FileCheck %s
// RUN: ernie-opt %s > %t.custom
// RUN: ernie-opt %s --mlir-print-op-generic | ernie-opt > %t.from_generic
// RUN: diff %t.custom %t.from_generic

// CHECK: ernie.mesh @mesh(dp = 2, mp = 4)
ernie.mesh @mesh(dp = 2, mp = 4)
// CHECK: ernie.mesh @cube(x = 2, y = 2, z = 2)
ernie.mesh @cube(x = 2, y = 2, z = 2)

// CHECK-LABEL: func.func @annotated
// CHECK-SAME: %{{.*}}: tensor<8x16xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>}
// CHECK-SAME: %{{.*}}: tensor<16x32xf32> {ernie.param = "w", ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>}
// CHECK-SAME: -> (tensor<8x32xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}], partial = {mp = sum}>})
func.func @annotated(%x: tensor<8x16xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>},
                     %w: tensor<16x32xf32> {ernie.param = "w", ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>})
    -> (tensor<8x32xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}], partial = {mp = sum}>}) {
  // CHECK: ernie.sharding_constraint %{{.*}} <@mesh, [{dp, mp}, {}]> : tensor<8x16xf32>
  %0 = ernie.sharding_constraint %x <@mesh, [{dp, mp}, {}]> : tensor<8x16xf32>
  // CHECK: ernie.sharding_constraint %{{.*}} <@mesh, [{}, {}]> {priority = 2 : i64} : tensor<8x16xf32>
  %1 = ernie.sharding_constraint %0 <@mesh, [{}, {}]> {priority = 2} : tensor<8x16xf32>
  // CHECK: ernie.reshard %{{.*}} <@mesh, [{mp}, {dp}]> : tensor<8x16xf32>
  %2 = ernie.reshard %1 <@mesh, [{mp}, {dp}]> : tensor<8x16xf32>
  // CHECK: ernie.matmul {{.*}} {ernie.shardings = [#ernie.sharding<@mesh, [{}, {mp}], partial = {dp = max}>]}
  %3 = ernie.matmul %2, %w {ernie.shardings = [#ernie.sharding<@mesh, [{}, {mp}], partial = {dp = max}>]} : tensor<8x16xf32>, tensor<16x32xf32> -> tensor<8x32xf32>
  // CHECK: ernie.reshard %{{.*}} <@cube, [{z, x, y}, {}]> : tensor<8x32xf32>
  %4 = ernie.reshard %3 <@cube, [{z, x, y}, {}]> : tensor<8x32xf32>
  return %3 : tensor<8x32xf32>
}

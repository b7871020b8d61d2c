// Collectives round-trip in custom and generic form.
// RUN: ernie-opt %s | ernie-opt | FileCheck %s
// RUN: ernie-opt %s > %t.custom
// RUN: ernie-opt %s --mlir-print-op-generic | ernie-opt > %t.from_generic
// RUN: diff %t.custom %t.from_generic

ernie.mesh @mesh(dp = 2, mp = 4)

// CHECK-LABEL: func.func @collectives
func.func @collectives(%x: tensor<8x16xf32>) {
  // CHECK: ernie.all_reduce %{{.*}} over @mesh[mp] sum : tensor<8x16xf32>
  %0 = ernie.all_reduce %x over @mesh[mp] sum : tensor<8x16xf32>
  // CHECK: ernie.all_reduce %{{.*}} over @mesh[dp, mp] max : tensor<8x16xf32>
  %1 = ernie.all_reduce %x over @mesh[dp, mp] max : tensor<8x16xf32>
  // CHECK: ernie.all_gather %{{.*}} over @mesh[mp] dim = 1 : tensor<8x16xf32> -> tensor<8x64xf32>
  %2 = ernie.all_gather %x over @mesh[mp] dim = 1 : tensor<8x16xf32> -> tensor<8x64xf32>
  // CHECK: ernie.reduce_scatter %{{.*}} over @mesh[mp] dim = 0 avg : tensor<8x16xf32> -> tensor<2x16xf32>
  %3 = ernie.reduce_scatter %x over @mesh[mp] dim = 0 avg : tensor<8x16xf32> -> tensor<2x16xf32>
  // CHECK: ernie.all_to_all %{{.*}} over @mesh[mp] split_dim = 1, concat_dim = 0 : tensor<8x16xf32> -> tensor<32x4xf32>
  %4 = ernie.all_to_all %x over @mesh[mp] split_dim = 1, concat_dim = 0 : tensor<8x16xf32> -> tensor<32x4xf32>
  // CHECK: ernie.shard_slice %{{.*}} over @mesh[dp, mp] dim = 0 : tensor<8x16xf32> -> tensor<1x16xf32>
  %5 = ernie.shard_slice %x over @mesh[dp, mp] dim = 0 : tensor<8x16xf32> -> tensor<1x16xf32>
  // CHECK: ernie.partial_init %{{.*}} over @mesh[dp] min : tensor<8x16xf32>
  %6 = ernie.partial_init %x over @mesh[dp] min : tensor<8x16xf32>
  // CHECK: ernie.axis_index over @mesh[dp, mp] : tensor<i64>
  %7 = ernie.axis_index over @mesh[dp, mp] : tensor<i64>
  // CHECK: ernie.shard_slice %{{.*}} over @mesh[mp] dim = 1 shift = -3 : tensor<8x16xf32> -> tensor<8x4xf32>
  %8 = ernie.shard_slice %x over @mesh[mp] dim = 1 shift = -3 : tensor<8x16xf32> -> tensor<8x4xf32>
  // CHECK: ernie.shard_insert %{{.*}} into %{{.*}} over @mesh[mp] dim = 1 shift = 2 : tensor<8x4xf32> -> tensor<8x16xf32>
  %9 = ernie.shard_insert %8 into %x over @mesh[mp] dim = 1 shift = 2 : tensor<8x4xf32> -> tensor<8x16xf32>
  // The default shift is not printed.
  // CHECK: ernie.shard_insert %{{.*}} into %{{.*}} over @mesh[mp] dim = 1 : tensor<8x4xf32> -> tensor<8x16xf32>
  %10 = ernie.shard_insert %8 into %x over @mesh[mp] dim = 1 shift = 0 : tensor<8x4xf32> -> tensor<8x16xf32>
  // CHECK: %[[F:.+]] = ernie.collective_permute_start %{{.*}} over @mesh[mp] shift = 1 : tensor<8x16xf32>
  %f = ernie.collective_permute_start %x over @mesh[mp] shift = 1 : tensor<8x16xf32>
  // CHECK: ernie.wait %[[F]] : tensor<8x16xf32>
  %11 = ernie.wait %f : tensor<8x16xf32>
  return
}

// A ZeRO-3 MLP (dp = 2, AdamW) trained three steps with its collectives one
// by one, and in 1 KiB buckets: parameter gathers prefetched a bucket ahead
// (the forward's and the backward's), gradient reduce-scatters started as
// their gradients are ready, several in flight at once beside each other.
// Threads and Gloo (whose collectives pair by order) train the very bits of
// the one-by-one program: losses, weights and moments.
//
// RUN: ernie-opt %s --ernie-autodiff=optimizer=adamw --ernie-zero-sharding=level=3 --ernie-auto-parallel-pipeline -o %t.plain.mlir
// RUN: ernie-opt %t.plain.mlir "--ernie-bucket-gradients=bucket-bytes=1024" -o %t.bucketed.mlir
// RUN: FileCheck %s --input-file=%t.bucketed.mlir
// RUN: ernie-translate --ernie-to-program %t.plain.mlir -o %t.plain.ernie
// RUN: ernie-translate --ernie-to-program %t.bucketed.mlir -o %t.bucketed.ernie
// RUN: rm -rf %t.out && mkdir -p %t.out
// RUN: ernie-run %t.plain.ernie --steps 3 --quiet --outputs %t.out/plain
// RUN: ernie-run %t.bucketed.ernie --steps 3 --quiet --outputs %t.out/threads
// RUN: ernie-run %t.bucketed.ernie --steps 3 --quiet --backend gloo --outputs %t.out/gloo
// RUN: diff -r %t.out/plain %t.out/threads
// RUN: diff -r %t.out/plain %t.out/gloo

// The forward gathers w1 first, then prefetches w2 before w1 is used; the
// gradients' reduce-scatters start as each is ready, two of them in one
// bucket. (A batch of 16: on fewer rows than the weights have, making
// w2's gradient from its resharded activations moves clearly fewer bytes
// than reduce-scattering it, and the propagation does that instead.)
// CHECK-LABEL: func.func @forward_grad
// CHECK: %[[W1:.+]] = ernie.all_gather_start %arg1 over @mesh[dp] dim = 0 : tensor<4x32xf32> -> tensor<8x32xf32>
// CHECK-NEXT: %[[W2:.+]] = ernie.all_gather_start %arg2 over @mesh[dp] dim = 0 : tensor<16x16xf32> -> tensor<32x16xf32>
// CHECK-NEXT: ernie.wait %[[W1]]
// CHECK: ernie.reduce_scatter_start {{.+}} : tensor<16x8xf32>, tensor<32x16xf32> -> tensor<8x8xf32>, tensor<16x16xf32>
// CHECK: ernie.reduce_scatter_start {{.+}} : tensor<8x32xf32> -> tensor<4x32xf32>
// CHECK-NOT: ernie.reduce_scatter %
// CHECK: return
ernie.mesh @mesh(dp = 2)
func.func @forward(%x: tensor<16x8xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>},
                   %w1: tensor<8x32xf32> {ernie.param = "w1"},
                   %w2: tensor<32x16xf32> {ernie.param = "w2"},
                   %w3: tensor<16x8xf32> {ernie.param = "w3"}) -> tensor<f32> {
  %h = ernie.matmul %x, %w1 : tensor<16x8xf32>, tensor<8x32xf32> -> tensor<16x32xf32>
  %a = ernie.silu %h : tensor<16x32xf32>
  %g = ernie.matmul %a, %w2 : tensor<16x32xf32>, tensor<32x16xf32> -> tensor<16x16xf32>
  %y = ernie.matmul %g, %w3 : tensor<16x16xf32>, tensor<16x8xf32> -> tensor<16x8xf32>
  %sq = ernie.mul %y, %y : tensor<16x8xf32>
  %l = ernie.reduce_mean %sq axes = [0, 1] : tensor<16x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}

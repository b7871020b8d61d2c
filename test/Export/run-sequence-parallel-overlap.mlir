// A sequence-parallel MLP trained three steps on mp = 4, with and without
// the overlap pass, on threads and on Gloo processes. The overlap program
// runs bit for bit the same on both engines (they reduce in group order).
// Against the plain program its first loss is bitwise equal and the rest
// agree to f32 rounding: the decomposed matmuls run the GEMM on row pieces,
// and whether a row of a GEMM comes out in the same bits at another M
// depends on OpenBLAS's kernels (equal with its AVX-512 ones, not with its
// AVX2 ones).
//
// RUN: ernie-opt %s --ernie-autodiff=optimizer=sgd --ernie-auto-parallel-pipeline -o %t.plain.mlir
// RUN: ernie-opt %t.plain.mlir --ernie-sequence-parallel-overlap -o %t.overlap.mlir
// RUN: FileCheck %s --input-file=%t.overlap.mlir
// RUN: ernie-translate --ernie-to-program %t.plain.mlir -o %t.plain.ernie
// RUN: ernie-translate --ernie-to-program %t.overlap.mlir -o %t.overlap.ernie
// RUN: rm -rf %t.out && mkdir -p %t.out
// RUN: ernie-run %t.plain.ernie --steps 3 --quiet --outputs %t.out/plain
// RUN: ernie-run %t.overlap.ernie --steps 3 --quiet --outputs %t.out/threads
// RUN: ernie-run %t.overlap.ernie --steps 3 --quiet --backend gloo --outputs %t.out/gloo
// RUN: ernie-run %t.plain.ernie --steps 1 --quiet --outputs %t.out/plain1
// RUN: ernie-run %t.overlap.ernie --steps 1 --quiet --outputs %t.out/overlap1
// RUN: cmp %t.out/plain1/losses.npy %t.out/overlap1/losses.npy
// RUN: cmp %t.out/threads/losses.npy %t.out/gloo/losses.npy
// RUN: cmp %t.out/threads/w1.npy %t.out/gloo/w1.npy
// RUN: cmp %t.out/threads/w2.npy %t.out/gloo/w2.npy
// RUN: %allclose %t.out/plain/losses.npy %t.out/threads/losses.npy --rtol 1e-6
// RUN: %allclose %t.out/plain/w1.npy %t.out/threads/w1.npy --rtol 1e-6
// RUN: %allclose %t.out/plain/w2.npy %t.out/threads/w2.npy --rtol 1e-6

// The forward's gather and scatter are gone; transfers took their place.
// CHECK-LABEL: func.func @forward_grad
// CHECK: ernie.collective_permute_start
// CHECK: ernie.wait
ernie.mesh @mesh(mp = 4)
func.func @forward(%x: tensor<2x16x8xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}, {}]>},
                   %w1: tensor<8x32xf32> {ernie.param = "w1", ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>},
                   %w2: tensor<32x8xf32> {ernie.param = "w2", ernie.sharding = #ernie.sharding<@mesh, [{mp}, {}]>}) -> tensor<f32> {
  %g = ernie.sharding_constraint %x <@mesh, [{}, {}, {}]> {priority = 1} : tensor<2x16x8xf32>
  %h = ernie.matmul %g, %w1 : tensor<2x16x8xf32>, tensor<8x32xf32> -> tensor<2x16x32xf32>
  %a = ernie.gelu %h : tensor<2x16x32xf32>
  %y = ernie.matmul %a, %w2 : tensor<2x16x32xf32>, tensor<32x8xf32> -> tensor<2x16x8xf32>
  %s = ernie.sharding_constraint %y <@mesh, [{}, {mp}, {}]> {priority = 1} : tensor<2x16x8xf32>
  %r = ernie.add %s, %x : tensor<2x16x8xf32>
  %sq = ernie.mul %r, %r : tensor<2x16x8xf32>
  %l = ernie.reduce_mean %sq axes = [0, 1, 2] : tensor<2x16x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// A data-parallel MLP (dp = 2, bf16 weights and an f32 one) trained three
// steps with its gradients all-reduced one by one, and in buckets of 2 KiB
// (each started after its last gradient, on the communication thread), on
// threads and on Gloo processes, then fused: the f32 weight's training is
// bit for bit the same in every run (buckets sum each element over the ranks
// in the same order), and the bf16 weights' too where the bucket reduces
// them in their own type.
//
// RUN: ernie-opt %s --ernie-autodiff=optimizer=sgd --ernie-auto-parallel-pipeline -o %t.plain.mlir
// RUN: ernie-opt %t.plain.mlir "--ernie-bucket-gradients=bucket-bytes=2048 accumulate=native" --ernie-fuse -o %t.bucketed.mlir
// RUN: ernie-opt %t.plain.mlir "--ernie-bucket-gradients=bucket-bytes=2048" -o %t.f32.mlir
// RUN: FileCheck %s --input-file=%t.bucketed.mlir
// RUN: FileCheck %s --input-file=%t.f32.mlir --check-prefix=F32
// RUN: ernie-translate --ernie-to-program %t.plain.mlir -o %t.plain.ernie
// RUN: ernie-translate --ernie-to-program %t.bucketed.mlir -o %t.bucketed.ernie
// RUN: ernie-translate --ernie-to-program %t.f32.mlir -o %t.f32.ernie
// RUN: rm -rf %t.out && mkdir -p %t.out
// RUN: ernie-run %t.plain.ernie --steps 3 --quiet --outputs %t.out/plain
// RUN: ernie-run %t.bucketed.ernie --steps 3 --quiet --outputs %t.out/threads
// RUN: ernie-run %t.bucketed.ernie --steps 3 --quiet --backend gloo --outputs %t.out/gloo
// RUN: ernie-run %t.f32.ernie --steps 3 --quiet --backend gloo --outputs %t.out/f32
// RUN: cmp %t.out/plain/losses.npy %t.out/threads/losses.npy
// RUN: cmp %t.out/plain/losses.npy %t.out/gloo/losses.npy
// RUN: cmp %t.out/plain/w1.npy %t.out/gloo/w1.npy
// RUN: cmp %t.out/plain/w2.npy %t.out/threads/w2.npy
// RUN: cmp %t.out/plain/w3.npy %t.out/gloo/w3.npy

// w3's gradient (f32) is ready first, then w2's and w1's (bf16): two
// buckets by element type, each started before the return's waits.
// CHECK-LABEL: func.func @forward_grad
// CHECK: ernie.all_reduce_start {{.+}} : tensor<16x8xf32>
// CHECK: ernie.all_reduce_start {{.+}} : tensor<32x16xbf16>, tensor<8x32xbf16>
// CHECK: ernie.wait
// CHECK: return
// F32: ernie.all_reduce_start {{.+}} {accumulate = f32} : tensor<32x16xbf16>, tensor<8x32xbf16>
ernie.mesh @mesh(dp = 2)
func.func @forward(%x: tensor<4x8xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>},
                   %w1: tensor<8x32xbf16> {ernie.param = "w1"},
                   %w2: tensor<32x16xbf16> {ernie.param = "w2"},
                   %w3: tensor<16x8xf32> {ernie.param = "w3"}) -> tensor<f32> {
  %xb = ernie.cast %x : tensor<4x8xf32> -> tensor<4x8xbf16>
  %h = ernie.matmul %xb, %w1 : tensor<4x8xbf16>, tensor<8x32xbf16> -> tensor<4x32xbf16>
  %a = ernie.silu %h : tensor<4x32xbf16>
  %g = ernie.matmul %a, %w2 : tensor<4x32xbf16>, tensor<32x16xbf16> -> tensor<4x16xbf16>
  %gf = ernie.cast %g : tensor<4x16xbf16> -> tensor<4x16xf32>
  %y = ernie.matmul %gf, %w3 : tensor<4x16xf32>, tensor<16x8xf32> -> tensor<4x8xf32>
  %sq = ernie.mul %y, %y : tensor<4x8xf32>
  %l = ernie.reduce_mean %sq axes = [0, 1] : tensor<4x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}

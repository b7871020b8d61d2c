// Reduce-scatters and all-gathers in buckets (--ernie-bucket-gradients):
// gradient reduce-scatters along dimension 1 (packed by destination) and 0,
// bf16 ones reduced in f32, gathers along dimensions 0 and 1, next to a
// reduce-scatter the pass leaves alone (a max) and one whose result another
// collective reads. Every result is bit for bit the one-by-one program's, on
// threads and on Gloo: each element is summed over the ranks in the same
// order, and two bf16 terms summed in f32 round once as a bf16 sum does.
//
// RUN: ernie-opt %s --ernie-bucket-gradients -o %t.bucketed.mlir
// RUN: ernie-opt %s "--ernie-bucket-gradients=bucket-bytes=16" -o %t.small.mlir
// RUN: FileCheck %s --input-file=%t.bucketed.mlir
// RUN: FileCheck %s --input-file=%t.small.mlir --check-prefix=SMALL
// RUN: ernie-translate --ernie-to-program %s -o %t.plain.ernie
// RUN: ernie-translate --ernie-to-program %t.bucketed.mlir -o %t.bucketed.ernie
// RUN: ernie-translate --ernie-to-program %t.small.mlir -o %t.small.ernie
// RUN: rm -rf %t.out && mkdir -p %t.out
// RUN: ernie-run %t.plain.ernie --quiet --outputs %t.out/plain
// RUN: ernie-run %t.bucketed.ernie --quiet --outputs %t.out/threads
// RUN: ernie-run %t.bucketed.ernie --quiet --backend gloo --outputs %t.out/gloo
// RUN: ernie-run %t.small.ernie --quiet --outputs %t.out/small
// RUN: diff -r %t.out/plain %t.out/threads
// RUN: diff -r %t.out/plain %t.out/gloo
// RUN: diff -r %t.out/plain %t.out/small

// CHECK-LABEL: func.func @step
// CHECK: ernie.all_gather_start %{{.+}} over @mesh[dp] dim = 0 : tensor<4x6xf32> -> tensor<8x6xf32>
// CHECK: ernie.all_gather_start %{{.+}}, %{{.+}} over @mesh[dp] dim = 1 : tensor<4x6xf32>, tensor<3x4xf32> -> tensor<4x12xf32>, tensor<3x8xf32>
// CHECK: ernie.reduce_scatter_start %{{.+}}, %{{.+}} over @mesh[dp] dim = 1 sum : tensor<4x6xf32>, tensor<3x4xf32> -> tensor<4x3xf32>, tensor<3x2xf32>
// CHECK: ernie.reduce_scatter %{{.+}} dim = 0 sum : tensor<4x6xbf16> -> tensor<2x6xbf16>
// CHECK: ernie.reduce_scatter_start %arg1, %{{.+}} over @mesh[dp] dim = 0 sum {accumulate = f32} : tensor<4x6xbf16>, tensor<2x6xbf16> -> tensor<2x6xbf16>, tensor<1x6xbf16>
// CHECK: ernie.reduce_scatter %{{.+}} dim = 1 max
// CHECK-COUNT-7: ernie.wait
// CHECK: return
// With 16-byte buckets each tensor starts alone, right after it is computed.
// SMALL: ernie.reduce_scatter_start %arg1 over @mesh[dp] dim = 0 sum {accumulate = f32} : tensor<4x6xbf16> -> tensor<2x6xbf16>
// SMALL: %[[A:.+]] = ernie.add
// SMALL-NEXT: ernie.all_gather_start %[[A]] over @mesh[dp] dim = 0 : tensor<4x6xf32>
// SMALL-NEXT: ernie.reduce_scatter_start %[[A]] over @mesh[dp] dim = 1 sum : tensor<4x6xf32>
// SMALL: %[[B:.+]] = ernie.mul
// SMALL-NEXT: ernie.all_gather_start %[[B]] over @mesh[dp] dim = 1 : tensor<4x6xf32>
// SMALL: %[[C:.+]] = ernie.sub
// SMALL-NEXT: ernie.all_gather_start %[[C]] over @mesh[dp] dim = 1 : tensor<3x4xf32>
// SMALL-NEXT: ernie.reduce_scatter_start %[[C]] over @mesh[dp] dim = 1 sum : tensor<3x4xf32>
// SMALL: ernie.reduce_scatter_start %{{.+}} over @mesh[dp] dim = 0 sum {accumulate = f32} : tensor<2x6xbf16> -> tensor<1x6xbf16>
ernie.mesh @mesh(dp = 2)
func.func @step(%x: tensor<4x6xf32>, %y: tensor<4x6xbf16>, %z: tensor<3x4xf32>)
    -> (tensor<4x3xf32> {ernie.grad_of = "a"}, tensor<3x2xf32> {ernie.grad_of = "z"},
        tensor<2x6xbf16> {ernie.grad_of = "y"}, tensor<1x6xbf16> {ernie.grad_of = "y2"},
        tensor<4x12xf32>, tensor<3x8xf32>, tensor<8x6xf32>, tensor<4x3xf32>) {
  %i = ernie.axis_index over @mesh[dp] : tensor<i64>
  %f = ernie.cast %i : tensor<i64> -> tensor<f32>
  %fx = ernie.broadcast %f, dims = [] : tensor<f32> -> tensor<4x6xf32>
  %fz = ernie.broadcast %f, dims = [] : tensor<f32> -> tensor<3x4xf32>
  %fy = ernie.cast %fx : tensor<4x6xf32> -> tensor<4x6xbf16>
  %a = ernie.add %x, %fx : tensor<4x6xf32>
  %b = ernie.mul %x, %fx : tensor<4x6xf32>
  %c = ernie.sub %z, %fz : tensor<3x4xf32>
  %d = ernie.mul %y, %fy : tensor<4x6xbf16>
  %ra = ernie.reduce_scatter %a over @mesh[dp] dim = 1 sum : tensor<4x6xf32> -> tensor<4x3xf32>
  %rc = ernie.reduce_scatter %c over @mesh[dp] dim = 1 sum : tensor<3x4xf32> -> tensor<3x2xf32>
  %ry = ernie.reduce_scatter %y over @mesh[dp] dim = 0 sum : tensor<4x6xbf16> -> tensor<2x6xbf16>
  %rd = ernie.reduce_scatter %d over @mesh[dp] dim = 0 sum : tensor<4x6xbf16> -> tensor<2x6xbf16>
  %rd2 = ernie.reduce_scatter %rd over @mesh[dp] dim = 0 sum : tensor<2x6xbf16> -> tensor<1x6xbf16>
  %gb = ernie.all_gather %b over @mesh[dp] dim = 1 : tensor<4x6xf32> -> tensor<4x12xf32>
  %gc = ernie.all_gather %c over @mesh[dp] dim = 1 : tensor<3x4xf32> -> tensor<3x8xf32>
  %ga = ernie.all_gather %a over @mesh[dp] dim = 0 : tensor<4x6xf32> -> tensor<8x6xf32>
  %m = ernie.reduce_scatter %a over @mesh[dp] dim = 1 max : tensor<4x6xf32> -> tensor<4x3xf32>
  return %ra, %rc, %ry, %rd2, %gb, %gc, %ga, %m : tensor<4x3xf32>, tensor<3x2xf32>, tensor<2x6xbf16>, tensor<1x6xbf16>, tensor<4x12xf32>, tensor<3x8xf32>, tensor<8x6xf32>, tensor<4x3xf32>
}

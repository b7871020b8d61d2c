// RUN: ernie-opt %s --split-input-file --ernie-fuse | FileCheck %s

// An RMSNorm-like chain: the square and its row sum, and (from the
// statistics) the scaling, each become one loop. The reduction ends the
// first region: its reader (rsqrt of the sum) stands alone, and the next
// region reads the statistic through a broadcast (inputs in order of first
// use).
// CHECK-LABEL: func.func @norm
// CHECK-SAME: (%[[X:.+]]: tensor<4x8xf32>, %[[W:.+]]: tensor<8xf32>)
// CHECK: %[[S:.+]] = ernie.fused(%[[X]]) : (tensor<4x8xf32>) -> tensor<4x1xf32> {
// CHECK-NEXT: ^bb0(%[[A:.+]]: tensor<4x8xf32>):
// CHECK-NEXT: %[[SQ:.+]] = ernie.mul %[[A]], %[[A]]
// CHECK-NEXT: %[[SUM:.+]] = ernie.reduce_sum %[[SQ]] axes = [1] keepdim
// CHECK-NEXT: ernie.yield %[[SUM]] : tensor<4x1xf32>
// CHECK: %[[R:.+]] = ernie.rsqrt
// CHECK: %[[Y:.+]] = ernie.fused(%[[R]], %[[W]], %[[X]])
// CHECK: ernie.broadcast {{.+}} -> tensor<4x8xf32>
// CHECK: ernie.broadcast {{.+}} -> tensor<4x8xf32>
// CHECK: ernie.mul
// CHECK: ernie.mul
// CHECK: ernie.yield
// CHECK: return %[[Y]]
func.func @norm(%x: tensor<4x8xf32>, %w: tensor<8xf32>) -> tensor<4x8xf32> {
  %sq = ernie.mul %x, %x : tensor<4x8xf32>
  %sum = ernie.reduce_sum %sq axes = [1] keepdim : tensor<4x8xf32> -> tensor<4x1xf32>
  %r = ernie.rsqrt %sum : tensor<4x1xf32>
  %rb = ernie.broadcast %r, dims = [0, 1] : tensor<4x1xf32> -> tensor<4x8xf32>
  %wb = ernie.broadcast %w, dims = [1] : tensor<8xf32> -> tensor<4x8xf32>
  %n = ernie.mul %x, %rb : tensor<4x8xf32>
  %y = ernie.mul %n, %wb : tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}

// -----

// A value read after the region (by a matmul) is also a result; the region
// goes where its last member was, after the matmul it does not feed.
// CHECK-LABEL: func.func @two_results
// CHECK: %[[M:.+]] = ernie.matmul
// CHECK: %[[F:.+]]:2 = ernie.fused
// CHECK: ernie.silu
// CHECK: ernie.mul
// CHECK: ernie.yield %{{.+}}, %{{.+}} : tensor<4x8xf32>, tensor<4x8xf32>
// CHECK: return %[[F]]#1, %[[F]]#0, %[[M]]
func.func @two_results(%x: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) {
  %s = ernie.silu %x : tensor<4x8xf32>
  %m = ernie.matmul %x, %w : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %p = ernie.mul %s, %x : tensor<4x8xf32>
  return %p, %s, %m : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>
}

// -----

// A region closes when an op outside reads it: the matmul reads %e, so the
// add after it cannot join %e's region (it would move past its reader).
// CHECK-LABEL: func.func @reader_closes
// CHECK: ernie.fused
// CHECK: ernie.exp
// CHECK: ernie.neg
// CHECK: ernie.matmul
// CHECK-NOT: ernie.fused
// CHECK: ernie.add
func.func @reader_closes(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %e = ernie.exp %x : tensor<4x4xf32>
  %n = ernie.neg %e : tensor<4x4xf32>
  %m = ernie.matmul %n, %x : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
  %a = ernie.add %n, %m : tensor<4x4xf32>
  return %a : tensor<4x4xf32>
}

// -----

// No region spans a collective, even between independent ops; none mixes
// f64 with f32; integer math is not fused; a lone op stays as it was.
ernie.mesh @mesh(dp = 2)
// CHECK-LABEL: func.func @boundaries
// CHECK: ernie.fused
// CHECK: ernie.exp
// CHECK: ernie.neg
// CHECK: ernie.yield
// CHECK: ernie.all_reduce
// CHECK-NOT: ernie.fused
// CHECK: ernie.tanh
// CHECK: ernie.cast
// CHECK: ernie.add %{{.+}} : tensor<4xi64>
// CHECK: ernie.mul %{{.+}} : tensor<4xi64>
func.func @boundaries(%x: tensor<4xf32>, %g: tensor<4xf32>, %i: tensor<4xi64>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf64>, tensor<4xi64>) {
  %e = ernie.exp %x : tensor<4xf32>
  %n = ernie.neg %e : tensor<4xf32>
  %r = ernie.all_reduce %g over @mesh[dp] sum : tensor<4xf32>
  %t = ernie.tanh %n : tensor<4xf32>
  %d = ernie.cast %t : tensor<4xf32> -> tensor<4xf64>
  %a = ernie.add %i, %i : tensor<4xi64>
  %b = ernie.mul %a, %i : tensor<4xi64>
  return %r, %t, %d, %b : tensor<4xf32>, tensor<4xf32>, tensor<4xf64>, tensor<4xi64>
}

// -----

// Two chains that meet merge into one region; a mask from a compare feeds a
// select inside it; a bf16 input and result are fine (f32 inside).
// CHECK-LABEL: func.func @merge
// CHECK: %[[F:.+]] = ernie.fused
// CHECK-NOT: ernie.fused
// CHECK: ernie.compare
// CHECK: ernie.select
// CHECK: ernie.cast {{.+}} -> tensor<8xbf16>
// CHECK: ernie.yield %{{.+}} : tensor<8xbf16>
// CHECK: return %[[F]]
func.func @merge(%x: tensor<8xbf16>, %y: tensor<8xf32>) -> tensor<8xbf16> {
  %a = ernie.cast %x : tensor<8xbf16> -> tensor<8xf32>
  %b = ernie.exp %y : tensor<8xf32>
  %m = ernie.compare gt, %a, %b : tensor<8xf32>
  %s = ernie.select %m, %a, %b : tensor<8xi1>, tensor<8xf32>
  %c = ernie.cast %s : tensor<8xf32> -> tensor<8xbf16>
  return %c : tensor<8xbf16>
}

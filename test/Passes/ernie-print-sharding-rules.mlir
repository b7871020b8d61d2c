// The factor map of every op's sharding rule.
// RUN: ernie-opt %s --ernie-print-sharding-rules --verify-diagnostics -o /dev/null

func.func @elementwise(%x: tensor<4x8xf32>, %y: tensor<4x8xf32>, %c: tensor<4x8xi1>) {
  // expected-remark @+1 {{sharding rule ([i, j]) -> ([i, j])}}
  %0 = ernie.exp %x : tensor<4x8xf32>
  // expected-remark @+1 {{sharding rule ([i, j], [i, j]) -> ([i, j])}}
  %1 = ernie.add %x, %y : tensor<4x8xf32>
  // expected-remark @+1 {{sharding rule ([i, j], [i, j]) -> ([i, j])}}
  %2 = ernie.compare lt, %x, %y : tensor<4x8xf32>
  // expected-remark @+1 {{sharding rule ([i, j], [i, j], [i, j]) -> ([i, j])}}
  %3 = ernie.select %c, %x, %y : tensor<4x8xi1>, tensor<4x8xf32>
  // expected-remark @+1 {{sharding rule ([i, j]) -> ([i, j])}}
  %4 = ernie.cast %x : tensor<4x8xf32> -> tensor<4x8xbf16>
  // expected-remark @+1 {{sharding rule ([i, j]) -> ([i, j])}}
  %5 = ernie.gelu %x {approximate} : tensor<4x8xf32>
  return
}

func.func @creation() {
  // expected-remark @+1 {{sharding rule () -> ([i, j]) i:replicated j:replicated}}
  %0 = ernie.constant dense<1.0> : tensor<2x3xf32>
  // expected-remark @+1 {{sharding rule () -> ([i, j])}}
  %1 = ernie.full 0.0 : tensor<2x3xf32>
  // expected-remark @+1 {{sharding rule () -> ([i, j]) j:replicated}}
  %2 = ernie.iota dim = 1 : tensor<2x3xi64>
  return
}

func.func @matmuls(%x: tensor<2x16x64xf32>, %w: tensor<64x128xf32>, %a: tensor<3x4x5xf32>, %b: tensor<3x6x4xf32>) {
  // Rank-2 weight: batch and sequence come from the lhs alone; k is summed.
  // expected-remark @+1 {{sharding rule ([i, j, l], [l, k]) -> ([i, j, k]) l:reduction(sum)}}
  %0 = ernie.matmul %x, %w : tensor<2x16x64xf32>, tensor<64x128xf32> -> tensor<2x16x128xf32>
  // Batched, both transposed: a is [b, k, m], b is [b, n, k].
  // expected-remark @+1 {{sharding rule ([i, l, j], [i, k, l]) -> ([i, j, k]) l:reduction(sum)}}
  %1 = ernie.matmul %a, %b {transpose_a, transpose_b} : tensor<3x4x5xf32>, tensor<3x6x4xf32> -> tensor<3x5x6xf32>
  return
}

func.func @reductions(%x: tensor<2x16x64xf32>) {
  // expected-remark @+1 {{sharding rule ([i, j, k]) -> ([i, _, k]) j:reduction(sum)}}
  %0 = ernie.reduce_sum %x axes = [1] keepdim : tensor<2x16x64xf32> -> tensor<2x1x64xf32>
  // expected-remark @+1 {{sharding rule ([i, j, k]) -> ([j]) i:reduction(avg) k:reduction(avg)}}
  %1 = ernie.reduce_mean %x axes = [0, 2] : tensor<2x16x64xf32> -> tensor<16xf32>
  // expected-remark @+1 {{sharding rule ([i, j, k]) -> ([]) i:reduction(max) j:reduction(max) k:reduction(max)}}
  %2 = ernie.reduce_max %x axes = [0, 1, 2] : tensor<2x16x64xf32> -> tensor<f32>
  // expected-remark @+1 {{sharding rule ([i, j, k]) -> ([i, j, k]) k:replicated}}
  %3 = ernie.softmax %x, axis = 2 : tensor<2x16x64xf32>
  // expected-remark @+1 {{sharding rule ([i, j, k]) -> ([i, j, k]) i:replicated}}
  %4 = ernie.log_softmax %x, axis = 0 : tensor<2x16x64xf32>
  return
}

func.func @norms(%x: tensor<2x16x64xf32>, %w: tensor<64xf32>) {
  // expected-remark @+1 {{sharding rule ([i, j, k], [k]) -> ([i, j, k]) k:replicated}}
  %0 = ernie.rms_norm %x, %w, epsilon = 1.0e-6 : tensor<2x16x64xf32>, tensor<64xf32>
  // expected-remark @+1 {{sharding rule ([i, j, k], [k], [k]) -> ([i, j, k]) k:replicated}}
  %1 = ernie.layer_norm %x, %w, %w, epsilon = 1.0e-5 : tensor<2x16x64xf32>, tensor<64xf32>
  return
}

func.func @reshapes(%x: tensor<2x16x64xf32>, %y: tensor<6x4xf32>, %z: tensor<2x1x8xf32>) {
  // A split dimension carries both factors, major first.
  // expected-remark @+1 {{sharding rule ([i, j, kl]) -> ([i, j, k, l])}}
  %0 = ernie.reshape %x : tensor<2x16x64xf32> -> tensor<2x16x4x16xf32>
  // Merged dimensions.
  // expected-remark @+1 {{sharding rule ([i, j, k]) -> ([ij, k])}}
  %1 = ernie.reshape %x : tensor<2x16x64xf32> -> tensor<32x64xf32>
  // 6x4 -> 4x6: the common factor 2 is shared; the misaligned rest stays whole.
  // expected-remark @+1 {{sharding rule ([ij, m]) -> ([ik, l]) j:replicated k:replicated l:replicated m:replicated}}
  %2 = ernie.reshape %y : tensor<6x4xf32> -> tensor<4x6xf32>
  // Size-1 dimensions take no factor.
  // expected-remark @+1 {{sharding rule ([i, _, j]) -> ([i, j, _])}}
  %3 = ernie.reshape %z : tensor<2x1x8xf32> -> tensor<2x8x1xf32>
  return
}

func.func @shapes(%x: tensor<2x3x4xf32>, %v: tensor<4xf32>, %s: tensor<1x4xf32>) {
  // expected-remark @+1 {{sharding rule ([k, i, j]) -> ([i, j, k])}}
  %0 = ernie.transpose %x, perm = [1, 2, 0] : tensor<2x3x4xf32> -> tensor<3x4x2xf32>
  // expected-remark @+1 {{sharding rule ([k]) -> ([i, j, k])}}
  %1 = ernie.broadcast %v, dims = [2] : tensor<4xf32> -> tensor<2x3x4xf32>
  // An expanded size-1 dimension is new in the result.
  // expected-remark @+1 {{sharding rule ([_, j]) -> ([i, j])}}
  %2 = ernie.broadcast %s, dims = [0, 1] : tensor<1x4xf32> -> tensor<3x4xf32>
  // expected-remark @+1 {{sharding rule ([i, j, l]) -> ([i, k, m]) j:replicated k:replicated l:replicated m:replicated}}
  %3 = ernie.slice %x [0:2, 1:3, 0:4:2] : tensor<2x3x4xf32> -> tensor<2x2x2xf32>
  // expected-remark @+1 {{sharding rule ([i, j, m], [i, k, m]) -> ([i, l, m]) j:replicated k:replicated l:replicated}}
  %4 = ernie.concat %x, %x axis = 1 : tensor<2x3x4xf32>, tensor<2x3x4xf32> -> tensor<2x6x4xf32>
  // expected-remark @+1 {{sharding rule ([i, j, k]) -> ([i, j, l], [i, j, m]) k:replicated l:replicated m:replicated}}
  %5:2 = ernie.split %x axis = 2, sizes = [2, 2] : tensor<2x3x4xf32> -> tensor<2x3x2xf32>, tensor<2x3x2xf32>
  // expected-remark @+1 {{sharding rule ([i, j, k]) -> ([i, j, _], [i, j, _]) k:replicated}}
  %6:2 = ernie.topk %x, k = 1, axis = 2 : tensor<2x3x4xf32> -> tensor<2x3x1xf32>, tensor<2x3x1xi64>
  return
}

func.func @lookups(%t: tensor<10x4xf32>, %ids: tensor<2x3xi64>) {
  // expected-remark @+1 {{sharding rule ([k, l], [i, j]) -> ([i, j, l]) k:replicated}}
  %0 = ernie.gather %t[%ids] axis = 0 : tensor<10x4xf32>, tensor<2x3xi64> -> tensor<2x3x4xf32>
  // A vocabulary-split table gives partial sums.
  // expected-remark @+1 {{sharding rule ([i, j], [k, l]) -> ([i, j, l]) k:reduction(sum)}}
  %1 = ernie.embedding %ids, %t : tensor<2x3xi64>, tensor<10x4xf32> -> tensor<2x3x4xf32>
  return
}

func.func @transformer(%q: tensor<2x16x8x32xf32>, %k: tensor<2x16x2x32xf32>, %pos: tensor<16xi64>,
                       %logits: tensor<2x16x100xf32>, %labels: tensor<2x16xi64>) {
  // expected-remark @+1 {{sharding rule ([i, j, k, l], [j]) -> ([i, j, k, l]) l:replicated}}
  %0 = ernie.rope %q, %pos, theta = 10000.0 : tensor<2x16x8x32xf32>, tensor<16xi64>
  // Query heads are (kv heads l, group m): splitting m splits key/value too.
  // expected-remark @+1 {{sharding rule ([i, j, lm, n], [i, k, l, n], [i, k, l, o]) -> ([i, j, lm, o]) j:replicated k:replicated n:replicated}}
  %1 = ernie.attention %q, %k, %k {causal} : tensor<2x16x8x32xf32>, tensor<2x16x2x32xf32>, tensor<2x16x2x32xf32> -> tensor<2x16x8x32xf32>
  // The vocabulary is a sum reduction: the vocab-parallel loss.
  // expected-remark @+1 {{sharding rule ([i, j, k], [i, j]) -> ([]) i:replicated j:replicated k:reduction(sum)}}
  %2 = ernie.cross_entropy %logits, %labels : tensor<2x16x100xf32>, tensor<2x16xi64> -> tensor<f32>
  // expected-remark @+1 {{sharding rule ([i, j, k], [i, j]) -> ([]) i:reduction(sum) j:reduction(sum) k:reduction(sum)}}
  %3 = ernie.cross_entropy %logits, %labels {reduction = #ernie<loss_reduction sum>} : tensor<2x16x100xf32>, tensor<2x16xi64> -> tensor<f32>
  // expected-remark @+1 {{sharding rule ([i, j, k], [i, j]) -> ([i, j]) k:reduction(sum)}}
  %4 = ernie.cross_entropy %logits, %labels {reduction = #ernie<loss_reduction none>} : tensor<2x16x100xf32>, tensor<2x16xi64> -> tensor<2x16xf32>
  return
}

func.func @gradient_and_optimizer_ops(%x: tensor<2x3xf32>, %t: tensor<10x4xf32>, %ids: tensor<2x3xi64>, %rows: tensor<2x3x4xf32>,
                                      %p: tensor<4x8xf32>, %lr: tensor<f32>, %step: tensor<i64>) {
  // expected-remark @+1 {{sharding rule ([i, j]) -> ([i, k]) j:replicated k:replicated}}
  %0 = ernie.pad %x low = [0, 1], high = [0, 2], interior = [0, 1] : tensor<2x3xf32> -> tensor<2x8xf32>
  // Indices' dims are summed into the table: split, they leave partial sums.
  // expected-remark @+1 {{sharding rule ([i, l], [j, k], [j, k, l]) -> ([i, l]) i:replicated j:reduction(sum) k:reduction(sum)}}
  %1 = ernie.index_add %t, %ids, %rows axis = 0 : tensor<10x4xf32>, tensor<2x3xi64>, tensor<2x3x4xf32> -> tensor<10x4xf32>
  // expected-remark @+1 {{sharding rule ([i, j], [i, j], [i, j], []) -> ([i, j], [i, j])}}
  %2:2 = ernie.sgd_update %p, %p, %p, %lr : tensor<4x8xf32>, tensor<4x8xf32>, tensor<f32>
  // expected-remark @+1 {{sharding rule ([i, j], [i, j], [i, j], [i, j], [], []) -> ([i, j], [i, j], [i, j])}}
  %3:3 = ernie.adamw_update %p, %p, %p, %p, %lr, %step : tensor<4x8xf32>, tensor<4x8xf32>, tensor<f32>, tensor<i64>
  // expected-remark @+1 {{sharding rule ([i, j]) -> ([i, j])}}
  %4 = ernie.stop_gradient %x : tensor<2x3xf32>
  return
}

// RUN: ernie-opt %s --split-input-file --ernie-autodiff --canonicalize | FileCheck %s

// A one-layer MLP: the weight's gradient is x^T . dz, the bias's the sum of
// dz over the batch, and the unused parameter's an explicit zero.
// CHECK-LABEL: func.func @forward_grad
// CHECK-SAME: (%[[X:[a-z0-9]+]]: tensor<4x8xf32>, %[[W:[a-z0-9]+]]: tensor<8x3xf32> {ernie.param = "w"}
// CHECK-SAME: -> (tensor<f32> {ernie.loss}, tensor<8x3xf32> {ernie.grad_of = "w"}, tensor<3xf32> {ernie.grad_of = "b"}, tensor<3xf32> {ernie.grad_of = "unused"})
// CHECK-DAG: %[[ZERO:.+]] = ernie.full 0.000000e+00 : tensor<3xf32>
// CHECK-DAG: %[[ONE:.+]] = ernie.full 1.000000e+00 : tensor<f32>
// CHECK: %[[A:.+]] = ernie.tanh
// CHECK: %[[LOSS:.+]] = ernie.cross_entropy %[[A]]
// CHECK: %[[DA:.+]] = ernie.cross_entropy_grad %[[A]], %{{.*}}, %[[ONE]] {reduction = #ernie<loss_reduction sum>}
// CHECK: %[[DZ:.+]] = ernie.mul %[[DA]], %{{.*}} : tensor<4x3xf32>
// CHECK: %[[DB1:.+]] = ernie.reduce_sum %[[DZ]] axes = [0] keepdim
// CHECK: %[[DB:.+]] = ernie.reshape %[[DB1]] : tensor<1x3xf32> -> tensor<3xf32>
// CHECK: %[[DW:.+]] = ernie.matmul %[[X]], %[[DZ]] {transpose_a} : tensor<4x8xf32>, tensor<4x3xf32> -> tensor<8x3xf32>
// CHECK: return %[[LOSS]], %[[DW]], %[[DB]], %[[ZERO]]
func.func @forward(%x: tensor<4x8xf32>, %w: tensor<8x3xf32> {ernie.param = "w"}, %b: tensor<3xf32> {ernie.param = "b"},
                   %u: tensor<3xf32> {ernie.param = "unused"}, %y: tensor<4xi64>) -> tensor<f32> {
  %h = ernie.matmul %x, %w : tensor<4x8xf32>, tensor<8x3xf32> -> tensor<4x3xf32>
  %bb = ernie.broadcast %b, dims = [1] : tensor<3xf32> -> tensor<4x3xf32>
  %z = ernie.add %h, %bb : tensor<4x3xf32>
  %a = ernie.tanh %z : tensor<4x3xf32>
  %l = ernie.cross_entropy %a, %y {reduction = #ernie<loss_reduction sum>} : tensor<4x3xf32>, tensor<4xi64> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// A mean loss is differentiated as sum / count, so its gradient shards over
// the batch like the loss: the sum's gradient is 1 / count.
// CHECK-LABEL: func.func @forward_grad
// CHECK: %[[N:.+]] = ernie.reduce_sum %{{.*}} axes = [0] : tensor<4xf32> -> tensor<f32>
// CHECK: %[[LOSS:.+]] = ernie.div %{{.*}}, %[[N]] : tensor<f32>
// CHECK: %[[DS:.+]] = ernie.div %{{.*}}, %[[N]] : tensor<f32>
// CHECK: ernie.cross_entropy_grad %{{.*}}, %{{.*}}, %[[DS]] {reduction = #ernie<loss_reduction sum>}
// CHECK-NOT: loss_reduction mean
func.func @forward(%a: tensor<4x3xf32> {ernie.param = "logits"}, %y: tensor<4xi64>) -> tensor<f32> {
  %l = ernie.cross_entropy %a, %y : tensor<4x3xf32>, tensor<4xi64> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Fan-out adds up; stop_gradient blocks; a parameter behind it gets zeros.
// CHECK-LABEL: func.func @forward_grad
// CHECK-SAME: (%[[P:[a-z0-9]+]]: tensor<4xf32>
// CHECK-DAG: %[[ZERO:.+]] = ernie.full 0.000000e+00 : tensor<4xf32>
// CHECK: %[[G:.+]] = ernie.add %[[P]], %[[P]] : tensor<4xf32>
// CHECK: return %{{.*}}, %[[G]], %[[ZERO]]
func.func @forward(%p: tensor<4xf32> {ernie.param = "p"}, %q: tensor<4xf32> {ernie.param = "q"}) -> tensor<f32> {
  %sq = ernie.mul %p, %p : tensor<4xf32>
  %frozen = ernie.stop_gradient %q : tensor<4xf32>
  %t = ernie.add %sq, %frozen : tensor<4xf32>
  %l = ernie.reduce_sum %t axes = [0] : tensor<4xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Calls are inlined, so AD sees through them.
// CHECK-LABEL: func.func @forward_grad
// CHECK: ernie.exp
// CHECK: return
func.func @helper(%v: tensor<4xf32>) -> tensor<4xf32> {
  %e = ernie.exp %v : tensor<4xf32>
  return %e : tensor<4xf32>
}
func.func @forward(%p: tensor<4xf32> {ernie.param = "p"}) -> tensor<f32> {
  %e = func.call @helper(%p) : (tensor<4xf32>) -> tensor<4xf32>
  %l = ernie.reduce_sum %e axes = [0] : tensor<4xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Every elementwise rule, one parameter each.
// CHECK-LABEL: func.func @forward_grad
// CHECK-DAG: ernie.erf
// CHECK-DAG: ernie.sigmoid
// CHECK-DAG: ernie.compare gt
// CHECK-DAG: ernie.compare lt
// CHECK-DAG: ernie.compare ge
// CHECK-DAG: ernie.compare le
// CHECK-DAG: ernie.pow
// CHECK-DAG: ernie.log
// CHECK-DAG: ernie.cast %{{.*}} : tensor<4xbf16> -> tensor<4xf32>
// CHECK-DAG: ernie.select %{{.*}} : tensor<4xi1>, tensor<4xf32>
// CHECK: return
func.func @forward(%a: tensor<4xf32> {ernie.param = "a"}, %b: tensor<4xf32> {ernie.param = "b"}, %c: tensor<4xi1>) -> tensor<f32> {
  %0 = ernie.exp %a : tensor<4xf32>
  %1 = ernie.log %0 : tensor<4xf32>
  %2 = ernie.sqrt %0 : tensor<4xf32>
  %3 = ernie.rsqrt %2 : tensor<4xf32>
  %4 = ernie.sigmoid %3 : tensor<4xf32>
  %5 = ernie.silu %4 : tensor<4xf32>
  %6 = ernie.gelu %5 : tensor<4xf32>
  %7 = ernie.gelu %6 {approximate} : tensor<4xf32>
  %8 = ernie.relu %7 : tensor<4xf32>
  %9 = ernie.abs %8 : tensor<4xf32>
  %10 = ernie.reciprocal %9 : tensor<4xf32>
  %11 = ernie.neg %10 : tensor<4xf32>
  %12 = ernie.erf %11 : tensor<4xf32>
  %13 = ernie.tanh %12 : tensor<4xf32>
  %14 = ernie.cast %13 : tensor<4xf32> -> tensor<4xbf16>
  %15 = ernie.cast %14 : tensor<4xbf16> -> tensor<4xf32>
  %16 = ernie.sub %15, %b : tensor<4xf32>
  %17 = ernie.mul %16, %b : tensor<4xf32>
  %18 = ernie.div %17, %b : tensor<4xf32>
  %19 = ernie.maximum %18, %b : tensor<4xf32>
  %20 = ernie.minimum %19, %b : tensor<4xf32>
  %21 = ernie.pow %20, %b : tensor<4xf32>
  %22 = ernie.select %c, %21, %a : tensor<4xi1>, tensor<4xf32>
  %23 = ernie.add %22, %1 : tensor<4xf32>
  %l = ernie.reduce_sum %23 axes = [0] : tensor<4xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Reductions, softmax and the norms (whose weight gradients sum over
// every leading dimension).
// CHECK-LABEL: func.func @forward_grad
// CHECK-DAG: ernie.compare eq
// CHECK-DAG: ernie.rsqrt
// CHECK-DAG: ernie.reduce_sum %{{.*}} axes = [0, 1] : tensor<2x4x8xf32> -> tensor<8xf32>
// CHECK: return
func.func @forward(%x: tensor<2x4x8xf32> {ernie.param = "x"}, %w: tensor<8xf32> {ernie.param = "w"}, %b: tensor<8xf32> {ernie.param = "b"}) -> tensor<f32> {
  %0 = ernie.rms_norm %x, %w, epsilon = 1.0e-6 : tensor<2x4x8xf32>, tensor<8xf32>
  %1 = ernie.layer_norm %0, %w, %b, epsilon = 1.0e-5 : tensor<2x4x8xf32>, tensor<8xf32>
  %2 = ernie.softmax %1, axis = 2 : tensor<2x4x8xf32>
  %3 = ernie.log_softmax %2, axis = 1 : tensor<2x4x8xf32>
  %4 = ernie.reduce_max %3 axes = [2] : tensor<2x4x8xf32> -> tensor<2x4xf32>
  %5 = ernie.reduce_mean %4 axes = [0, 1] : tensor<2x4xf32> -> tensor<f32>
  return %5 : tensor<f32>
}

// -----

// Shape ops: each gradient moves data back.
// CHECK-LABEL: func.func @forward_grad
// CHECK-DAG: ernie.pad %{{.*}} low = [0, 1], high = [0, 0], interior = [0, 1] : tensor<4x2xf32> -> tensor<4x4xf32>
// CHECK-DAG: ernie.index_add
// CHECK-DAG: ernie.transpose %{{.*}}, perm = [1, 0]
// CHECK-DAG: ernie.iota dim = 2 : tensor<4x1x4xi64>
// CHECK: return
func.func @forward(%t: tensor<4x4xf32> {ernie.param = "t"}, %ids: tensor<3xi64>) -> tensor<f32> {
  %0 = ernie.transpose %t, perm = [1, 0] : tensor<4x4xf32> -> tensor<4x4xf32>
  %1 = ernie.reshape %0 : tensor<4x4xf32> -> tensor<2x8xf32>
  %2 = ernie.reshape %1 : tensor<2x8xf32> -> tensor<4x4xf32>
  %3 = ernie.slice %2 [0:4, 1:4:2] : tensor<4x4xf32> -> tensor<4x2xf32>
  %4 = ernie.concat %3, %3 axis = 1 : tensor<4x2xf32>, tensor<4x2xf32> -> tensor<4x4xf32>
  %5:2 = ernie.split %4 axis = 1, sizes = [1, 3] : tensor<4x4xf32> -> tensor<4x1xf32>, tensor<4x3xf32>
  %6 = ernie.gather %t[%ids] axis = 0 : tensor<4x4xf32>, tensor<3xi64> -> tensor<3x4xf32>
  %7 = ernie.embedding %ids, %t : tensor<3xi64>, tensor<4x4xf32> -> tensor<3x4xf32>
  %8:2 = ernie.topk %4, k = 1, axis = 1 : tensor<4x4xf32> -> tensor<4x1xf32>, tensor<4x1xi64>
  %s0 = ernie.reduce_sum %5#1 axes = [0, 1] : tensor<4x3xf32> -> tensor<f32>
  %s1 = ernie.reduce_sum %6 axes = [0, 1] : tensor<3x4xf32> -> tensor<f32>
  %s2 = ernie.reduce_sum %7 axes = [0, 1] : tensor<3x4xf32> -> tensor<f32>
  %s3 = ernie.reduce_sum %8#0 axes = [0, 1] : tensor<4x1xf32> -> tensor<f32>
  %a = ernie.add %s0, %s1 : tensor<f32>
  %b = ernie.add %s2, %s3 : tensor<f32>
  %l = ernie.add %a, %b : tensor<f32>
  return %l : tensor<f32>
}

// -----

// RoPE's gradient rotates back; attention's is one op, with the forward's
// mask (a sliding window here).
// CHECK-LABEL: func.func @forward_grad
// CHECK-DAG: %[[NEG:.+]] = ernie.neg %{{.*}} : tensor<8xi64>
// CHECK-DAG: ernie.rope %{{.*}}, %[[NEG]], theta = 1.000000e+04
// CHECK-DAG: ernie.attention_grad %{{.*}} {causal, window = 4 : i64}
// CHECK: return
func.func @forward(%q: tensor<1x8x4x16xf32> {ernie.param = "q"}, %k: tensor<1x8x2x16xf32> {ernie.param = "k"},
                   %v: tensor<1x8x2x16xf32> {ernie.param = "v"}, %pos: tensor<8xi64>) -> tensor<f32> {
  %qr = ernie.rope %q, %pos, theta = 10000.0 : tensor<1x8x4x16xf32>, tensor<8xi64>
  %o = ernie.attention %qr, %k, %v {causal, window = 4 : i64} : tensor<1x8x4x16xf32>, tensor<1x8x2x16xf32>, tensor<1x8x2x16xf32> -> tensor<1x8x4x16xf32>
  %l = ernie.reduce_sum %o axes = [0, 1, 2, 3] : tensor<1x8x4x16xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Placement ops pass the gradient through. A constraint's gradient keeps its
// split dimensions and priority but not its pending sum (the adjoint of a
// cross-rank sum is the whole gradient on every rank); a reshard's gradient is
// left to propagation.
// CHECK-LABEL: func.func @forward_grad
// CHECK: %[[H:.+]] = ernie.sharding_constraint %{{.*}} <@mesh, [{dp}, {mp}], partial = {tp = sum}> {priority = 2 : i64}
// CHECK: ernie.reshard %[[H]] <@mesh, [{}, {}]>
// CHECK: %[[DH:.+]] = ernie.sharding_constraint %{{.*}} <@mesh, [{dp}, {mp}]> {priority = 2 : i64} : tensor<4x8xf32>
// CHECK: ernie.matmul %{{.*}}, %[[DH]] {transpose_a}
module {
  ernie.mesh @mesh(dp = 2, mp = 2, tp = 2)
  func.func @forward(%x: tensor<4x8xf32>, %w: tensor<8x8xf32> {ernie.param = "w"}) -> tensor<f32> {
    %h = ernie.matmul %x, %w : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
    %c = ernie.sharding_constraint %h <@mesh, [{dp}, {mp}], partial = {tp = sum}> {priority = 2} : tensor<4x8xf32>
    %r = ernie.reshard %c <@mesh, [{}, {}]> : tensor<4x8xf32>
    %t = ernie.tanh %r : tensor<4x8xf32>
    %l = ernie.reduce_sum %t axes = [0, 1] : tensor<4x8xf32> -> tensor<f32>
    return %l : tensor<f32>
  }
}

// -----

// An expert GEMM over the filled rows: the input's gradient is the same
// grouped GEMM against the transposed weight, the weight's the grouped
// input^T . dy over the same rows (fill carried for the cost model).
// CHECK-LABEL: func.func @forward_grad
// CHECK-SAME: (%[[X:[a-z0-9]+]]: tensor<4x2x8x16xf32> {ernie.param = "x"}, %[[W:[a-z0-9]+]]: tensor<4x16x32xf32> {ernie.param = "w"}, %[[R:[a-z0-9]+]]: tensor<4x2xi64>)
// CHECK: %[[DY:.+]] = ernie.full 1.000000e+00 : tensor<4x2x8x32xf32>
// CHECK: ernie.expert_matmul %[[X]], %[[W]], %[[R]] {fill = 5.000000e-01 : f64}
// CHECK-DAG: ernie.expert_matmul %[[DY]], %[[W]], %[[R]] {fill = 5.000000e-01 : f64, transpose_weight} : tensor<4x2x8x32xf32>, tensor<4x16x32xf32>, tensor<4x2xi64> -> tensor<4x2x8x16xf32>
// CHECK-DAG: ernie.expert_weight_grad %[[X]], %[[DY]], %[[R]] {fill = 5.000000e-01 : f64} : tensor<4x2x8x16xf32>, tensor<4x2x8x32xf32>, tensor<4x2xi64> -> tensor<4x16x32xf32>
func.func @forward(%x: tensor<4x2x8x16xf32> {ernie.param = "x"}, %w: tensor<4x16x32xf32> {ernie.param = "w"},
                   %rows: tensor<4x2xi64>) -> tensor<f32> {
  %y = ernie.expert_matmul %x, %w, %rows {fill = 0.5} : tensor<4x2x8x16xf32>, tensor<4x16x32xf32>, tensor<4x2xi64> -> tensor<4x2x8x32xf32>
  %l = ernie.reduce_sum %y axes = [0, 1, 2, 3] : tensor<4x2x8x32xf32> -> tensor<f32>
  return %l : tensor<f32>
}

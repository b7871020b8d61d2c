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

// -----

// Siblings: the gradients of a product read the same upstream gradient %g.
// The lone product %a joins the region of the other chain that reads %g, so
// %g is read once and no op is left unfused.
// CHECK-LABEL: func.func @siblings
// CHECK-SAME: (%[[G:.+]]: tensor<4x8xf32>, %[[X:.+]]: tensor<4x8xf32>, %[[Y:.+]]: tensor<4x8xf32>)
// CHECK: %[[F:.+]]:2 = ernie.fused(%[[G]], %[[X]], %[[Y]])
// CHECK: ernie.mul
// CHECK: ernie.mul
// CHECK: ernie.sigmoid
// CHECK: ernie.yield
// CHECK-NOT: ernie.mul
// CHECK: return %[[F]]#0, %[[F]]#1
func.func @siblings(%g: tensor<4x8xf32>, %x: tensor<4x8xf32>, %y: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %a = ernie.mul %g, %x : tensor<4x8xf32>
  %b = ernie.mul %g, %y : tensor<4x8xf32>
  %s = ernie.sigmoid %b : tensor<4x8xf32>
  return %a, %s : tensor<4x8xf32>, tensor<4x8xf32>
}

// -----

// A sibling region that was closed (a matmul read it) is not joined: the
// second product would move past the matmul's read.
// CHECK-LABEL: func.func @closed_sibling
// CHECK: ernie.fused
// CHECK: ernie.matmul
// CHECK: ernie.fused
func.func @closed_sibling(%g: tensor<4x4xf32>, %x: tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>) {
  %a = ernie.mul %g, %x : tensor<4x4xf32>
  %e = ernie.exp %a : tensor<4x4xf32>
  %m = ernie.matmul %e, %x : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
  %b = ernie.mul %g, %m : tensor<4x4xf32>
  %t = ernie.tanh %b : tensor<4x4xf32>
  return %e, %t : tensor<4x4xf32>, tensor<4x4xf32>
}

// -----

// One constant (CSE merges equal ones) read by two regions and a matmul:
// each region fills its own copy in its loop, so no region writes the
// constant out for the other; the matmul keeps reading the original.
// CHECK-LABEL: func.func @shared_constant
// CHECK: %[[ONE:.+]] = ernie.full 1.000000e+00 : tensor<4x4xf32>
// CHECK: %[[F1:.+]] = ernie.fused(%{{.+}}) : (tensor<4x4xf32>) -> tensor<4x4xf32>
// CHECK: ernie.full 1.000000e+00
// CHECK: ernie.sub
// CHECK: ernie.yield %{{.+}} : tensor<4x4xf32>
// CHECK: ernie.matmul %[[F1]], %[[ONE]]
// CHECK: ernie.fused(%{{.+}}) : (tensor<4x4xf32>) -> tensor<4x4xf32>
// CHECK: ernie.full 1.000000e+00
// CHECK: ernie.add
func.func @shared_constant(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %one = ernie.full 1.0 : tensor<4x4xf32>
  %e = ernie.exp %x : tensor<4x4xf32>
  %a = ernie.sub %one, %e : tensor<4x4xf32>
  %m = ernie.matmul %a, %one : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
  %t = ernie.tanh %m : tensor<4x4xf32>
  %b = ernie.add %t, %one : tensor<4x4xf32>
  return %b : tensor<4x4xf32>
}

// -----

// A constant's copy that no region takes goes back to the original: the
// matmul and the widening cast (f32 to f64: no region mixes them) share
// one constant.
// CHECK-LABEL: func.func @constant_unfused
// CHECK: %[[C:.+]] = ernie.full 2.000000e+00
// CHECK-NOT: ernie.full
// CHECK-NOT: ernie.fused
// CHECK: ernie.matmul %{{.+}}, %[[C]]
// CHECK: ernie.cast %[[C]]
func.func @constant_unfused(%x: tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<4x4xf64>) {
  %c = ernie.full 2.0 : tensor<4x4xf32>
  %a = ernie.matmul %x, %c : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
  %d = ernie.cast %c : tensor<4x4xf32> -> tensor<4x4xf64>
  return %a, %d : tensor<4x4xf32>, tensor<4x4xf64>
}

// -----

// A loss and its gradient over the same logits become one op where the loss
// was; the gradient's seed, computed after the loss, moves up with what it
// is computed from (the mean's count), and the loss's reader stays after.
// CHECK-LABEL: func.func @loss_and_gradient
// CHECK-SAME: (%[[LOGITS:.+]]: tensor<4x16xf32>, %[[LABELS:.+]]: tensor<4xi64>, %[[N:.+]]: tensor<f32>)
// CHECK: %[[SEED:.+]] = ernie.fused(%[[N]])
// CHECK: %[[LOSS:.+]], %[[GRAD:.+]] = ernie.cross_entropy_and_grad %[[LOGITS]], %[[LABELS]], %[[SEED]] {reduction = #ernie<loss_reduction sum>} : tensor<4x16xf32>, tensor<4xi64>, tensor<f32> -> tensor<f32>, tensor<4x16xf32>
// CHECK-NOT: ernie.cross_entropy
// CHECK: %[[MEAN:.+]] = ernie.div %[[LOSS]], %[[N]]
// CHECK: return %[[MEAN]], %[[GRAD]]
func.func @loss_and_gradient(%logits: tensor<4x16xf32>, %labels: tensor<4xi64>, %n: tensor<f32>) -> (tensor<f32>, tensor<4x16xf32>) {
  %loss = ernie.cross_entropy %logits, %labels {reduction = #ernie<loss_reduction sum>} : tensor<4x16xf32>, tensor<4xi64> -> tensor<f32>
  %mean = ernie.div %loss, %n : tensor<f32>
  %one = ernie.full 1.0 : tensor<f32>
  %seed = ernie.div %one, %n : tensor<f32>
  %g = ernie.cross_entropy_grad %logits, %labels, %seed {reduction = #ernie<loss_reduction sum>} : tensor<4x16xf32>, tensor<4xi64>, tensor<f32> -> tensor<4x16xf32>
  return %mean, %g : tensor<f32>, tensor<4x16xf32>
}

// -----

// Not paired: a seed computed from the loss itself (it cannot move above
// it), other labels, another reduction.
// CHECK-LABEL: func.func @loss_and_gradient_apart
// CHECK-NOT: cross_entropy_and_grad
// CHECK: ernie.cross_entropy %
// CHECK: ernie.cross_entropy_grad
// CHECK: ernie.cross_entropy_grad
// CHECK: ernie.cross_entropy_grad
func.func @loss_and_gradient_apart(%logits: tensor<4x16xf32>, %labels: tensor<4xi64>, %other: tensor<4xi64>) -> (tensor<4x16xf32>, tensor<4x16xf32>, tensor<4x16xf32>) {
  %loss = ernie.cross_entropy %logits, %labels {reduction = #ernie<loss_reduction sum>} : tensor<4x16xf32>, tensor<4xi64> -> tensor<f32>
  %seed = ernie.exp %loss : tensor<f32>
  %g = ernie.cross_entropy_grad %logits, %labels, %seed {reduction = #ernie<loss_reduction sum>} : tensor<4x16xf32>, tensor<4xi64>, tensor<f32> -> tensor<4x16xf32>
  %one = ernie.full 1.0 : tensor<f32>
  %h = ernie.cross_entropy_grad %logits, %other, %one {reduction = #ernie<loss_reduction sum>} : tensor<4x16xf32>, tensor<4xi64>, tensor<f32> -> tensor<4x16xf32>
  %k = ernie.cross_entropy_grad %logits, %labels, %one : tensor<4x16xf32>, tensor<4xi64>, tensor<f32> -> tensor<4x16xf32>
  return %g, %h, %k : tensor<4x16xf32>, tensor<4x16xf32>, tensor<4x16xf32>
}

// -----

// Math on broadcasts moves before the broadcast: a norm's statistic is
// scaled and rsqrt'ed once per row, not once per element, in a region of
// the row shape; the full-size region reads the row values through a
// broadcast of its own.
// CHECK-LABEL: func.func @sink_broadcasts
// CHECK-SAME: (%[[S:.+]]: tensor<4x1xf32>, %[[X:.+]]: tensor<4x8xf32>)
// CHECK: %[[R:.+]] = ernie.fused(%[[S]]) : (tensor<4x1xf32>) -> tensor<4x1xf32> {
// CHECK: ernie.full 2.000000e+00 : tensor<4x1xf32>
// CHECK: ernie.mul
// CHECK: ernie.rsqrt %{{.+}} : tensor<4x1xf32>
// CHECK: %[[Y:.+]] = ernie.fused(%[[R]], %[[X]]) : (tensor<4x1xf32>, tensor<4x8xf32>) -> tensor<4x8xf32> {
// CHECK: ernie.broadcast %{{.+}}, dims = [0, 1] : tensor<4x1xf32> -> tensor<4x8xf32>
// CHECK: ernie.mul
// CHECK: return %[[Y]]
func.func @sink_broadcasts(%s: tensor<4x1xf32>, %x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %b = ernie.broadcast %s, dims = [0, 1] : tensor<4x1xf32> -> tensor<4x8xf32>
  %c = ernie.full 2.0 : tensor<4x8xf32>
  %m = ernie.mul %b, %c : tensor<4x8xf32>
  %r = ernie.rsqrt %m : tensor<4x8xf32>
  %y = ernie.mul %x, %r : tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}

// -----

// Broadcasts along different dims, or of different shapes, stay where
// they are: the op needs every element.
// CHECK-LABEL: func.func @sink_broadcasts_apart
// CHECK: ernie.fused(%{{.+}}, %{{.+}}) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4x4xf32>
// CHECK: ernie.broadcast %{{.+}}, dims = [0]
// CHECK: ernie.broadcast %{{.+}}, dims = [1]
// CHECK: ernie.add %{{.+}} : tensor<4x4xf32>
func.func @sink_broadcasts_apart(%u: tensor<4xf32>, %v: tensor<4xf32>) -> tensor<4x4xf32> {
  %a = ernie.broadcast %u, dims = [0] : tensor<4xf32> -> tensor<4x4xf32>
  %b = ernie.broadcast %v, dims = [1] : tensor<4xf32> -> tensor<4x4xf32>
  %s = ernie.add %a, %b : tensor<4x4xf32>
  %e = ernie.exp %s : tensor<4x4xf32>
  return %e : tensor<4x4xf32>
}

// -----

// A broadcast read by two regions (a matmul between them) is loaded by
// each from its source: neither writes the full-size copy out.
// CHECK-LABEL: func.func @shared_broadcast
// CHECK-SAME: (%[[S:.+]]: tensor<4x1xf32>, %[[X:.+]]: tensor<4x4xf32>)
// CHECK-NOT: ernie.broadcast
// CHECK: %[[A:.+]] = ernie.fused(%[[X]], %[[S]]) : (tensor<4x4xf32>, tensor<4x1xf32>) -> tensor<4x4xf32>
// CHECK: ernie.broadcast %{{.+}}, dims = [0, 1]
// CHECK: %[[M:.+]] = ernie.matmul %[[A]], %[[X]]
// CHECK: ernie.fused(%[[M]], %[[S]]) : (tensor<4x4xf32>, tensor<4x1xf32>) -> tensor<4x4xf32>
// CHECK: ernie.broadcast %{{.+}}, dims = [0, 1]
func.func @shared_broadcast(%s: tensor<4x1xf32>, %x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %b = ernie.broadcast %s, dims = [0, 1] : tensor<4x1xf32> -> tensor<4x4xf32>
  %e = ernie.exp %x : tensor<4x4xf32>
  %a = ernie.mul %e, %b : tensor<4x4xf32>
  %m = ernie.matmul %a, %x : tensor<4x4xf32>, tensor<4x4xf32> -> tensor<4x4xf32>
  %t = ernie.tanh %m : tensor<4x4xf32>
  %c = ernie.add %t, %b : tensor<4x4xf32>
  return %c : tensor<4x4xf32>
}

// -----

// A seed received from another pipeline stage after the loss stays where
// it is (that stage's function does not move its send), so the two ops
// stay apart; a seed all-reduced within a group moves up with it.
ernie.mesh @mesh(pp = 2, dp = 2)
// CHECK-LABEL: func.func @seed_from_another_stage
// CHECK: ernie.cross_entropy %
// CHECK: ernie.recv from stage 0 channel 3
// CHECK: ernie.cross_entropy_grad
func.func @seed_from_another_stage(%logits: tensor<4x16xf32>, %labels: tensor<4xi64>) -> (tensor<f32>, tensor<4x16xf32>) {
  %loss = ernie.cross_entropy %logits, %labels : tensor<4x16xf32>, tensor<4xi64> -> tensor<f32>
  %seed = ernie.recv from stage 0 channel 3 : tensor<f32>
  %g = ernie.cross_entropy_grad %logits, %labels, %seed : tensor<4x16xf32>, tensor<4xi64>, tensor<f32> -> tensor<4x16xf32>
  return %loss, %g : tensor<f32>, tensor<4x16xf32>
}
// CHECK-LABEL: func.func @seed_all_reduced
// CHECK: %[[N:.+]] = ernie.all_reduce
// CHECK: ernie.cross_entropy_and_grad %{{.+}}, %{{.+}}, %[[N]]
func.func @seed_all_reduced(%logits: tensor<4x16xf32>, %labels: tensor<4xi64>, %n: tensor<f32>) -> (tensor<f32>, tensor<4x16xf32>) {
  %loss = ernie.cross_entropy %logits, %labels : tensor<4x16xf32>, tensor<4xi64> -> tensor<f32>
  %seed = ernie.all_reduce %n over @mesh[dp] sum : tensor<f32>
  %g = ernie.cross_entropy_grad %logits, %labels, %seed : tensor<4x16xf32>, tensor<4xi64>, tensor<f32> -> tensor<4x16xf32>
  return %loss, %g : tensor<f32>, tensor<4x16xf32>
}

// -----

// A pipeline's last chunk: the forward computes the loss and keeps the
// logits (residual.1) and the token count (residual.0) for the backward,
// whose gradient reads them with the labels (batch input 1). The forward
// computes both instead, the seed (1 / count) moved above the loss, and
// keeps the gradient under the logits' name; the backward reads it and no
// longer takes the count or the labels.
// CHECK-LABEL: func.func @train_forward.1
// CHECK-SAME: -> (tensor<4x16xf32> {ernie.residual = "residual.1"}, tensor<f32> {ernie.loss})
// CHECK: ernie.reduce_sum
// CHECK: %[[SEED:.+]] = ernie.fused
// CHECK: ernie.div
// CHECK: %{{.+}}, %[[G:.+]] = ernie.cross_entropy_and_grad %{{.+}}, %{{.+}}, %[[SEED]]
// CHECK: return %[[G]], %{{.+}} :
// CHECK-LABEL: func.func @train_backward.1
// CHECK-SAME: (%[[D:[^:]+]]: tensor<4x16xf32> {ernie.residual = "residual.1"}, %[[W:[^:]+]]: tensor<16x16xf32> {ernie.param = "w"})
// CHECK-NOT: cross_entropy_grad
// CHECK: ernie.matmul %[[D]], %[[W]]
func.func @train_forward.1(%h: tensor<4x16xf32> {ernie.input = 0 : i64},
                           %labels: tensor<4xi64> {ernie.input = 1 : i64},
                           %w: tensor<16x16xf32> {ernie.param = "w"})
    -> (tensor<f32> {ernie.residual = "residual.0"}, tensor<4x16xf32> {ernie.residual = "residual.1"}, tensor<f32> {ernie.loss}) {
  %logits = ernie.matmul %h, %w : tensor<4x16xf32>, tensor<16x16xf32> -> tensor<4x16xf32>
  %loss = ernie.cross_entropy %logits, %labels {reduction = #ernie<loss_reduction sum>} : tensor<4x16xf32>, tensor<4xi64> -> tensor<f32>
  %ones = ernie.full 1.0 : tensor<4xf32>
  %n = ernie.reduce_sum %ones axes = [0] : tensor<4xf32> -> tensor<f32>
  %mean = ernie.div %loss, %n : tensor<f32>
  return %n, %logits, %mean : tensor<f32>, tensor<4x16xf32>, tensor<f32>
}
func.func @train_backward.1(%n: tensor<f32> {ernie.residual = "residual.0"},
                            %logits: tensor<4x16xf32> {ernie.residual = "residual.1"},
                            %labels: tensor<4xi64> {ernie.input = 1 : i64},
                            %w: tensor<16x16xf32> {ernie.param = "w"}) -> tensor<4x16xf32> {
  %one = ernie.full 1.0 : tensor<f32>
  %seed = ernie.div %one, %n : tensor<f32>
  %g = ernie.cross_entropy_grad %logits, %labels, %seed {reduction = #ernie<loss_reduction sum>} : tensor<4x16xf32>, tensor<4xi64>, tensor<f32> -> tensor<4x16xf32>
  %dh = ernie.matmul %g, %w {transpose_b} : tensor<4x16xf32>, tensor<16x16xf32> -> tensor<4x16xf32>
  return %dh : tensor<4x16xf32>
}

// -----

// Apart: the backward reads the logits for more than the gradient, so the
// forward keeps them.
// CHECK-LABEL: func.func @train_forward.1
// CHECK: ernie.cross_entropy %
// CHECK-LABEL: func.func @train_backward.1
// CHECK: ernie.cross_entropy_grad
func.func @train_forward.1(%logits: tensor<4x16xf32> {ernie.input = 0 : i64},
                           %labels: tensor<4xi64> {ernie.input = 1 : i64})
    -> (tensor<4x16xf32> {ernie.residual = "residual.0"}, tensor<f32> {ernie.loss}) {
  %loss = ernie.cross_entropy %logits, %labels : tensor<4x16xf32>, tensor<4xi64> -> tensor<f32>
  return %logits, %loss : tensor<4x16xf32>, tensor<f32>
}
func.func @train_backward.1(%logits: tensor<4x16xf32> {ernie.residual = "residual.0"},
                            %labels: tensor<4xi64> {ernie.input = 1 : i64}) -> tensor<4x16xf32> {
  %seed = ernie.full 1.0 : tensor<f32>
  %g = ernie.cross_entropy_grad %logits, %labels, %seed : tensor<4x16xf32>, tensor<4xi64>, tensor<f32> -> tensor<4x16xf32>
  %sum = ernie.add %g, %logits : tensor<4x16xf32>
  return %sum : tensor<4x16xf32>
}

// -----

// Apart: the seed is received from another stage (it cannot be computed in
// the forward), and the labels are another batch input than the loss's.
ernie.mesh @mesh(pp = 2)
// CHECK-LABEL: func.func @train_forward.1
// CHECK: ernie.cross_entropy %
// CHECK-LABEL: func.func @train_backward.2
// CHECK: ernie.cross_entropy_grad
// CHECK-LABEL: func.func @train_backward.1
// CHECK: ernie.cross_entropy_grad
func.func @train_forward.1(%logits: tensor<4x16xf32> {ernie.input = 0 : i64},
                           %labels: tensor<4xi64> {ernie.input = 1 : i64})
    -> (tensor<4x16xf32> {ernie.residual = "residual.0"}, tensor<f32> {ernie.loss}) {
  %loss = ernie.cross_entropy %logits, %labels : tensor<4x16xf32>, tensor<4xi64> -> tensor<f32>
  return %logits, %loss : tensor<4x16xf32>, tensor<f32>
}
func.func @train_forward.2(%logits: tensor<4x16xf32> {ernie.input = 0 : i64},
                           %labels: tensor<4xi64> {ernie.input = 1 : i64})
    -> (tensor<4x16xf32> {ernie.residual = "residual.0"}, tensor<f32> {ernie.loss}) {
  %loss = ernie.cross_entropy %logits, %labels : tensor<4x16xf32>, tensor<4xi64> -> tensor<f32>
  return %logits, %loss : tensor<4x16xf32>, tensor<f32>
}
func.func @train_backward.2(%logits: tensor<4x16xf32> {ernie.residual = "residual.0"},
                            %other: tensor<4xi64> {ernie.input = 2 : i64}) -> tensor<4x16xf32> {
  %seed = ernie.full 1.0 : tensor<f32>
  %g = ernie.cross_entropy_grad %logits, %other, %seed : tensor<4x16xf32>, tensor<4xi64>, tensor<f32> -> tensor<4x16xf32>
  return %g : tensor<4x16xf32>
}
func.func @train_backward.1(%logits: tensor<4x16xf32> {ernie.residual = "residual.0"},
                            %labels: tensor<4xi64> {ernie.input = 1 : i64}) -> tensor<4x16xf32> {
  %seed = ernie.recv from stage 0 channel 3 : tensor<f32>
  %g = ernie.cross_entropy_grad %logits, %labels, %seed : tensor<4x16xf32>, tensor<4xi64>, tensor<f32> -> tensor<4x16xf32>
  return %g : tensor<4x16xf32>
}

// -----

// A broadcast that only adds a unit dimension ties with its input in
// elements: the region iterates over what the ops compute (2x8x1x4), not
// over the input's shape, so it verifies (the rope tables of a single-head
// key, DeepSeek's).
// CHECK-LABEL: func.func @unit_broadcast
// CHECK: ernie.fused
// CHECK: ernie.broadcast %{{.+}}, dims = [0, 1, 3] : tensor<2x8x4xf32> -> tensor<2x8x1x4xf32>
// CHECK: ernie.mul {{.+}} : tensor<2x8x1x4xf32>
func.func @unit_broadcast(%t: tensor<2x8x4xf32>, %x: tensor<2x8x1x4xf32>) -> tensor<2x8x1x4xf32> {
  %b = ernie.broadcast %t, dims = [0, 1, 3] : tensor<2x8x4xf32> -> tensor<2x8x1x4xf32>
  %y = ernie.mul %x, %b : tensor<2x8x1x4xf32>
  %z = ernie.add %y, %x : tensor<2x8x1x4xf32>
  return %z : tensor<2x8x1x4xf32>
}

// A two-stage pipeline with a tied weight (read by the first and the last
// stage) on dp = 2 x pp = 2, trained three steps from a program file: 1F1B
// and FThenB give the same bits (each micro-batch computes the same, and
// gradients are summed in micro-batch order by both), and so do the thread
// engine and Gloo processes. The backwards add into the running gradient
// sums (accumulate=gemm: the weight gradients' GEMMs with beta = 1, in
// place in the runtime's sum); adding after each GEMM (accumulate=add) or
// leaving the sums to the runtime (accumulate=runtime) adds the same terms
// in another order inside each GEMM: equal to f32 rounding (1e-6
// relative).
//
// RUN: ernie-opt %s --ernie-pipeline-split=stages=2 --ernie-shared-weight-dedup --ernie-autodiff=optimizer=adamw --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=4 schedule=1F1B" | ernie-translate --ernie-to-program -o %t.1f1b.ernie
// RUN: ernie-opt %s --ernie-pipeline-split=stages=2 --ernie-shared-weight-dedup --ernie-autodiff=optimizer=adamw --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=4 schedule=FThenB" | ernie-translate --ernie-to-program -o %t.gpipe.ernie
// RUN: rm -rf %t.out && mkdir -p %t.out
// RUN: ernie-run %t.1f1b.ernie --steps 3 --quiet --outputs %t.out/threads
// RUN: ernie-run %t.gpipe.ernie --steps 3 --quiet --outputs %t.out/gpipe
// RUN: ernie-run %t.1f1b.ernie --steps 3 --quiet --backend gloo --outputs %t.out/gloo
// RUN: cmp %t.out/threads/losses.npy %t.out/gpipe/losses.npy
// RUN: cmp %t.out/threads/losses.npy %t.out/gloo/losses.npy
// RUN: cmp %t.out/threads/tied.npy %t.out/gloo/tied.npy
// RUN: cmp %t.out/threads/w1.npy %t.out/gpipe/w1.npy
// RUN: ernie-opt %s --ernie-pipeline-split=stages=2 --ernie-shared-weight-dedup --ernie-autodiff=optimizer=adamw --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=4 schedule=1F1B accumulate=runtime" | ernie-translate --ernie-to-program -o %t.runtime.ernie
// RUN: ernie-run %t.runtime.ernie --steps 3 --quiet --outputs %t.out/runtime
// RUN: %allclose %t.out/threads/losses.npy %t.out/runtime/losses.npy --rtol 1e-6
// RUN: %allclose %t.out/threads/tied.npy %t.out/runtime/tied.npy --rtol 1e-6
// RUN: %allclose %t.out/threads/w1.npy %t.out/runtime/w1.npy --rtol 1e-6
// RUN: ernie-opt %s --ernie-pipeline-split=stages=2 --ernie-shared-weight-dedup --ernie-autodiff=optimizer=adamw --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=4 schedule=1F1B accumulate=add" | ernie-translate --ernie-to-program -o %t.add.ernie
// RUN: ernie-run %t.add.ernie --steps 3 --quiet --outputs %t.out/add
// RUN: %allclose %t.out/threads/losses.npy %t.out/add/losses.npy --rtol 1e-6
// RUN: %allclose %t.out/threads/w1.npy %t.out/add/w1.npy --rtol 1e-6
// Fused (the last chunk's forward computes the loss and its gradient, the
// backward reads the gradient as its residual): the same bits.
// RUN: ernie-opt %s --ernie-pipeline-split=stages=2 --ernie-shared-weight-dedup --ernie-autodiff=optimizer=adamw --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=4 schedule=1F1B" --ernie-fuse | ernie-translate --ernie-to-program -o %t.fused.ernie
// RUN: ernie-run %t.fused.ernie --steps 3 --quiet --outputs %t.out/fused
// RUN: cmp %t.out/threads/losses.npy %t.out/fused/losses.npy
// RUN: cmp %t.out/threads/tied.npy %t.out/fused/tied.npy
// RUN: cmp %t.out/threads/w1.npy %t.out/fused/w1.npy
// RUN: ernie-run %t.1f1b.ernie --steps 1 --quiet --function eval_step --outputs %t.out/eval
ernie.mesh @mesh(dp = 2, pp = 2)
func.func @forward(%x: tensor<8x16xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>},
                   %labels: tensor<8xi64> {ernie.sharding = #ernie.sharding<@mesh, [{dp}]>},
                   %tied: tensor<16x16xf32> {ernie.param = "tied"},
                   %w1: tensor<16x16xf32> {ernie.param = "w1"}) -> tensor<f32> {
  %h0 = ernie.matmul %x, %tied : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
  %a0 = ernie.tanh %h0 : tensor<8x16xf32>
  %s = ernie.split_point %a0 : tensor<8x16xf32>
  %h1 = ernie.matmul %s, %w1 : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
  %a1 = ernie.tanh %h1 : tensor<8x16xf32>
  %logits = ernie.matmul %a1, %tied : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
  %loss = ernie.cross_entropy %logits, %labels : tensor<8x16xf32>, tensor<8xi64> -> tensor<f32>
  return %loss : tensor<f32>
}

// State updated from a sum over the batch (a count of positive units, as
// MoE routing counts its choices per expert) in a two-stage pipeline on
// dp = 2 x pp = 2: each micro-batch's forward hands its count to the
// update, which adds the micro-batches' up. 1F1B, FThenB and Gloo
// processes keep the same state and losses bit for bit, and after one
// step the state is the count over the whole global batch (four
// micro-batches of 8 rows, from given weights) that numpy makes.
//
// RUN: ernie-opt %s --ernie-pipeline-split=stages=2 --ernie-shared-weight-dedup --ernie-autodiff=optimizer=sgd --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=4 schedule=1F1B" | ernie-translate --ernie-to-program -o %t.m4.ernie
// RUN: ernie-opt %s --ernie-pipeline-split=stages=2 --ernie-shared-weight-dedup --ernie-autodiff=optimizer=sgd --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=4 schedule=FThenB" | ernie-translate --ernie-to-program -o %t.gpipe.ernie
// RUN: ernie-opt %s --ernie-pipeline-split=stages=2 --ernie-shared-weight-dedup --ernie-autodiff=optimizer=sgd --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=4 schedule=1F1B" | FileCheck %s
// RUN: rm -rf %t.out %t.in && mkdir -p %t.out %t.in
// RUN: %python %S/Inputs/batch_sum_inputs.py %t.in
// RUN: ernie-run %t.m4.ernie --steps 3 --quiet --inputs %t.in --outputs %t.out/m4
// RUN: ernie-run %t.gpipe.ernie --steps 3 --quiet --inputs %t.in --outputs %t.out/gpipe
// RUN: ernie-run %t.m4.ernie --steps 3 --quiet --inputs %t.in --backend gloo --outputs %t.out/gloo
// RUN: cmp %t.out/m4/tied:positive.npy %t.out/gpipe/tied:positive.npy
// RUN: cmp %t.out/m4/tied:positive.npy %t.out/gloo/tied:positive.npy
// RUN: cmp %t.out/m4/losses.npy %t.out/gpipe/losses.npy
// RUN: cmp %t.out/m4/losses.npy %t.out/gloo/losses.npy
// One step: the count is the whole global batch's, as numpy counts it.
// RUN: ernie-run %t.m4.ernie --steps 1 --quiet --inputs %t.in --outputs %t.out/one
// RUN: %allclose %t.out/one/tied:positive.npy %t.in/expected.npy --rtol 0

// The count is made by the first stage's forward, summed over dp there,
// and taken by the first stage's update.
// CHECK-LABEL: func.func @train_forward.0
// CHECK-SAME: -> ({{.*}}tensor<16xf32> {ernie.micro_batch_sum = "[[$SUM:sum\.[0-9]+]]"}
// CHECK-LABEL: func.func @train_update.0
// CHECK-SAME: tensor<16xf32> {ernie.opt_state = "tied:positive"
// CHECK-SAME: tensor<16xf32> {ernie.micro_batch_sum = "[[$SUM]]"}
// CHECK-SAME: ernie.updates = "tied:positive"
ernie.mesh @mesh(dp = 2, pp = 2)
func.func @forward(%x: tensor<8x16xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>},
                   %labels: tensor<8xi64> {ernie.sharding = #ernie.sharding<@mesh, [{dp}]>},
                   %tied: tensor<16x16xf32> {ernie.param = "tied"},
                   %w1: tensor<16x16xf32> {ernie.param = "w1"},
                   %seen: tensor<16xf32> {ernie.opt_state = "tied:positive"})
    -> (tensor<f32>, tensor<16xf32> {ernie.updates = "tied:positive"}) {
  %h0 = ernie.matmul %x, %tied : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
  %zero = ernie.full 0.0 : tensor<8x16xf32>
  %one = ernie.full 1.0 : tensor<8x16xf32>
  %positive = ernie.compare gt, %h0, %zero : tensor<8x16xf32>
  %ones = ernie.select %positive, %one, %zero : tensor<8x16xi1>, tensor<8x16xf32>
  %count = ernie.reduce_sum %ones axes = [0] : tensor<8x16xf32> -> tensor<16xf32>
  %counted = ernie.add %seen, %count : tensor<16xf32>
  %a0 = ernie.tanh %h0 : tensor<8x16xf32>
  %s = ernie.split_point %a0 : tensor<8x16xf32>
  %h1 = ernie.matmul %s, %w1 : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
  %a1 = ernie.tanh %h1 : tensor<8x16xf32>
  %logits = ernie.matmul %a1, %tied : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
  %loss = ernie.cross_entropy %logits, %labels : tensor<8x16xf32>, tensor<8xi64> -> tensor<f32>
  return %loss, %counted : tensor<f32>, tensor<16xf32>
}

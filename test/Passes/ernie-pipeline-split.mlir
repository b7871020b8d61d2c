// Stages come from split points: an op runs on its operands' latest stage;
// an op of arguments alone goes to the stage reading it, copied per stage.
// RUN: ernie-opt %s --split-input-file --ernie-pipeline-split=stages=2 | FileCheck %s
// RUN: ernie-opt %s --split-input-file --ernie-pipeline-split=stages=2 --ernie-shared-weight-dedup | FileCheck %s --check-prefix=DEDUP

ernie.mesh @mesh(dp = 2, pp = 2)
// CHECK: module attributes {ernie.pipeline = {axis = "pp", stages = 2 : i64, virtual_stages = 1 : i64}}
// CHECK: func.func @forward
// CHECK-SAME: {ernie.param = "embed.weight", ernie.pipeline_stages = array<i64: 0, 1>}
// CHECK-SAME: {ernie.param = "l0.weight", ernie.pipeline_stages = array<i64: 0>}
// CHECK-SAME: {ernie.param = "l1.weight", ernie.pipeline_stages = array<i64: 1>}
// CHECK: ernie.embedding {{.*}} {ernie.stage = 0 : i64}
// CHECK: ernie.matmul {{.*}} {ernie.stage = 0 : i64}
// CHECK: %[[A0:.+]] = ernie.relu {{.*}} {ernie.stage = 0 : i64}
// CHECK-NOT: split_point
// CHECK: ernie.matmul %[[A0]], {{.*}} {ernie.stage = 1 : i64}
// The tied head's transpose reads only the table: it runs where it is read.
// CHECK: ernie.transpose {{.*}} {ernie.stage = 1 : i64}
// CHECK: ernie.cross_entropy {{.*}} {ernie.stage = 1 : i64}

// DEDUP: func.func @forward
// DEDUP-SAME: %[[E0:[^:]+]]: tensor<10x16xf32> {ernie.param = "embed.weight", ernie.pipeline_rank = 0 : i64, ernie.pipeline_stages = array<i64: 0>, ernie.shared_stages = array<i64: 0, 1>}
// DEDUP-SAME: %[[E1:[^:]+]]: tensor<10x16xf32> {ernie.param = "embed.weight", ernie.pipeline_rank = 1 : i64, ernie.pipeline_stages = array<i64: 1>, ernie.shared_stages = array<i64: 0, 1>}
// DEDUP-SAME: {ernie.param = "l0.weight", ernie.pipeline_rank = 0 : i64
// DEDUP-SAME: {ernie.param = "l1.weight", ernie.pipeline_rank = 1 : i64
// DEDUP: ernie.embedding %{{.*}}, %[[E0]]
// DEDUP: ernie.transpose %[[E1]]
func.func @forward(%ids: tensor<8xi64>, %labels: tensor<8xi64>,
                   %emb: tensor<10x16xf32> {ernie.param = "embed.weight"},
                   %w0: tensor<16x16xf32> {ernie.param = "l0.weight"},
                   %w1: tensor<16x16xf32> {ernie.param = "l1.weight"}) -> tensor<f32> {
  %e = ernie.embedding %ids, %emb : tensor<8xi64>, tensor<10x16xf32> -> tensor<8x16xf32>
  %h0 = ernie.matmul %e, %w0 : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
  %a0 = ernie.relu %h0 : tensor<8x16xf32>
  %s = ernie.split_point %a0 : tensor<8x16xf32>
  %h1 = ernie.matmul %s, %w1 : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
  %a1 = ernie.relu %h1 : tensor<8x16xf32>
  %et = ernie.transpose %emb, perm = [1, 0] : tensor<10x16xf32> -> tensor<16x10xf32>
  %logits = ernie.matmul %a1, %et : tensor<8x16xf32>, tensor<16x10xf32> -> tensor<8x10xf32>
  %loss = ernie.cross_entropy %logits, %labels : tensor<8x10xf32>, tensor<8xi64> -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// A shared layer with two attributes (weight and bias); the last stage uses
// the weight alone but, declared by the frontend, holds a bias replica too.
// An op of constants alone read on both stages is built on each.
ernie.mesh @mesh(pp = 2)
// CHECK: func.func @forward(%arg0: tensor<4x8xf32>
// CHECK-SAME: {ernie.param = "shared.weight", ernie.pipeline_stages = array<i64: 0, 1>}
// CHECK-SAME: {ernie.param = "shared.bias", ernie.pipeline_stages = array<i64: 0, 1>}
// CHECK-DAG: ernie.full 2.000000e+00 {ernie.stage = 0 : i64}
// CHECK-DAG: ernie.full 2.000000e+00 {ernie.stage = 1 : i64}

// DEDUP: func.func @forward(%arg0: tensor<4x8xf32>
// DEDUP-SAME: %[[W0:[^:]+]]: tensor<8x8xf32> {ernie.param = "shared.weight", ernie.pipeline_rank = 0 : i64
// DEDUP-SAME: %[[W1:[^:]+]]: tensor<8x8xf32> {ernie.param = "shared.weight", ernie.pipeline_rank = 1 : i64
// DEDUP-SAME: %[[B0:[^:]+]]: tensor<8xf32> {ernie.param = "shared.bias", ernie.pipeline_rank = 0 : i64, ernie.pipeline_stages = array<i64: 0>, ernie.shared_stages = array<i64: 0, 1>}
// DEDUP-SAME: %[[B1:[^:]+]]: tensor<8xf32> {ernie.param = "shared.bias", ernie.pipeline_rank = 1 : i64, ernie.pipeline_stages = array<i64: 1>, ernie.shared_stages = array<i64: 0, 1>}
// DEDUP: ernie.matmul %{{.*}}, %[[W0]]
// DEDUP: ernie.broadcast %[[B0]]
// DEDUP: ernie.matmul %{{.*}}, %[[W1]]
func.func @forward(%x: tensor<4x8xf32>, %y: tensor<4xi64>,
                   %w: tensor<8x8xf32> {ernie.param = "shared.weight"},
                   %b: tensor<8xf32> {ernie.param = "shared.bias", ernie.pipeline_stages = array<i64: 0, 1>}) -> tensor<f32> {
  %two = ernie.full 2.0 : tensor<4x8xf32>
  %h = ernie.matmul %x, %w : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %bb = ernie.broadcast %b, dims = [1] : tensor<8xf32> -> tensor<4x8xf32>
  %hb = ernie.add %h, %bb : tensor<4x8xf32>
  %m = ernie.mul %hb, %two : tensor<4x8xf32>
  %s = ernie.split_point %m : tensor<4x8xf32>
  %g = ernie.matmul %s, %w : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %g2 = ernie.mul %g, %two : tensor<4x8xf32>
  %loss = ernie.cross_entropy %g2, %y : tensor<4x8xf32>, tensor<4xi64> -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// New state computed from the first chunk's routing (a count of choices per
// expert and the bias it moves) stays on that chunk with the routing: it is
// not copied to the last chunk, which only the loss must come from.
ernie.mesh @mesh(pp = 2)
// CHECK: {ernie.opt_state = "l0.router:bias"}
// CHECK: %[[C:.+]] = ernie.matmul {{.*}} {ernie.stage = 0 : i64}
// CHECK: %[[U:.+]] = ernie.reduce_sum %[[C]] axes = [0] {ernie.stage = 0 : i64}
// CHECK: %[[N:.+]] = ernie.add %{{.*}}, %[[U]] {ernie.stage = 0 : i64}
// CHECK-NOT: ernie.reduce_sum
// CHECK: ernie.cross_entropy {{.*}} {ernie.stage = 1 : i64}
// CHECK: return %{{.*}}, %[[N]]
func.func @forward(%x: tensor<4x8xf32>, %labels: tensor<4xi64>,
                   %router: tensor<8x8xf32> {ernie.param = "l0.router"},
                   %w1: tensor<8x8xf32> {ernie.param = "l1.weight"},
                   %bias: tensor<8xf32> {ernie.opt_state = "l0.router:bias"})
    -> (tensor<f32>, tensor<8xf32> {ernie.updates = "l0.router:bias"}) {
  %c = ernie.matmul %x, %router : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %usage = ernie.reduce_sum %c axes = [0] : tensor<4x8xf32> -> tensor<8xf32>
  %moved = ernie.add %bias, %usage : tensor<8xf32>
  %s = ernie.split_point %c : tensor<4x8xf32>
  %h = ernie.matmul %s, %w1 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %loss = ernie.cross_entropy %h, %labels : tensor<4x8xf32>, tensor<4xi64> -> tensor<f32>
  return %loss, %moved : tensor<f32>, tensor<8xf32>
}

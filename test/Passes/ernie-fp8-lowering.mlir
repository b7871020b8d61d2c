// RUN: ernie-opt %s --ernie-autodiff=optimizer=sgd --ernie-fp8-lowering --cse | FileCheck %s
// RUN: ernie-opt %s --ernie-autodiff=optimizer=sgd "--ernie-fp8-lowering=grad-format=e4m3 exclude=down" --cse | FileCheck %s --check-prefix=OPTS
// RUN: ernie-opt %s --ernie-autodiff=optimizer=sgd "--ernie-fp8-lowering=recipe=delayed history-length=4 margin=1" --cse | FileCheck %s --check-prefix=DELAYED
// RUN: ernie-opt %s --ernie-autodiff=optimizer=sgd "--ernie-fp8-lowering=recipe=delayed history-length=1 amax-compute=most_recent" --cse | FileCheck %s --check-prefix=RECENT
// RUN: ernie-opt %s --ernie-autodiff=optimizer=sgd "--ernie-fp8-lowering=recipe=blockwise block-size=4" --cse | FileCheck %s --check-prefix=BLOCK
// RUN: ernie-opt %s --ernie-autodiff=optimizer=sgd "--ernie-fp8-lowering=pow2-scale=true" --cse | FileCheck %s --check-prefix=POW2

// The current recipe on a two-layer MLP with an LM head. Forward GEMMs take
// e4m3 activations and weights; the data gradient an e5m2 gradient and the
// e4m3 weight read transposed; the weight gradient the forward's e4m3 input
// (the same quantisation, CSE'd: it is saved in fp8) and an e5m2 gradient.
// The LM head is excluded by default and stays a plain matmul.
// CHECK-LABEL: func.func @forward_grad
// CHECK-SAME: %[[X:[a-z0-9]+]]: tensor<8x16xf32>, %[[W1:[a-z0-9]+]]: tensor<16x32xf32>
// CHECK: %[[AX:.+]] = ernie.abs %[[X]] : tensor<8x16xf32>
// CHECK: %[[MX:.+]] = ernie.reduce_max %[[AX]] axes = [0, 1] : tensor<8x16xf32> -> tensor<f32>
// CHECK: %[[SX0:.+]] = ernie.div %{{.+}}, %[[MX]] : tensor<f32>
// CHECK: %[[XQ:.+]] = ernie.cast %{{.+}} : tensor<8x16xf32> -> tensor<8x16xf8E4M3FN>
// CHECK: %[[XI:.+]] = ernie.div %{{.+}}, %{{.+}} : tensor<f32>
// CHECK: %[[WQ:.+]] = ernie.cast %{{.+}} : tensor<16x32xf32> -> tensor<16x32xf8E4M3FN>
// CHECK: ernie.scaled_matmul %[[XQ]], %[[WQ]], %[[XI]], %{{.+}} : tensor<8x16xf8E4M3FN>, tensor<16x32xf8E4M3FN>, tensor<f32>, tensor<f32> -> tensor<8x32xf32>
// CHECK: %[[HQ:.+]] = ernie.cast %{{.+}} : tensor<8x32xf32> -> tensor<8x32xf8E4M3FN>
// CHECK: ernie.scaled_matmul %[[HQ]], %{{.+}} : tensor<8x32xf8E4M3FN>, tensor<32x16xf8E4M3FN>, tensor<f32>, tensor<f32> -> tensor<8x16xf32>
// CHECK: ernie.matmul %{{.+}}, %{{.+}} : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
// CHECK: ernie.matmul {{.*}}{transpose_b} : tensor<8x16xf32>, tensor<16x16xf32>
// CHECK: %[[DYQ:.+]] = ernie.cast %{{.+}} : tensor<8x16xf32> -> tensor<8x16xf8E5M2>
// CHECK: ernie.scaled_matmul %[[DYQ]], %{{.+}} {transpose_b} : tensor<8x16xf8E5M2>, tensor<32x16xf8E4M3FN>, tensor<f32>, tensor<f32> -> tensor<8x32xf32>
// CHECK: ernie.scaled_matmul %[[HQ]], %[[DYQ]], %{{.+}} {transpose_a} : tensor<8x32xf8E4M3FN>, tensor<8x16xf8E5M2>, tensor<f32>, tensor<f32> -> tensor<32x16xf32>
// CHECK: ernie.scaled_matmul %[[XQ]], %{{.+}} {transpose_a} : tensor<8x16xf8E4M3FN>, tensor<8x32xf8E5M2>, tensor<f32>, tensor<f32> -> tensor<16x32xf32>
// CHECK-LABEL: func.func @train_step

// Options: e4m3 gradients, and a regex that leaves the down projection
// (and nothing else: the LM head is now included) in f32.
// OPTS-LABEL: func.func @forward_grad
// OPTS-NOT: f8E5M2
// OPTS: ernie.scaled_matmul {{.*}} -> tensor<8x32xf32>
// OPTS: ernie.matmul {{.*}} : tensor<8x32xf32>, tensor<32x16xf32> -> tensor<8x16xf32>
// OPTS: ernie.scaled_matmul {{.*}} : tensor<8x16xf8E4M3FN>, tensor<16x16xf8E4M3FN>, tensor<f32>, tensor<f32> -> tensor<8x16xf32>
func.func @forward(%x: tensor<8x16xf32>, %w1: tensor<16x32xf32> {ernie.param = "mlp.up.weight"},
                   %w2: tensor<32x16xf32> {ernie.param = "mlp.down.weight"},
                   %e: tensor<16x16xf32> {ernie.param = "lm_head.weight"}) -> tensor<f32> {
  %h = ernie.matmul %x, %w1 : tensor<8x16xf32>, tensor<16x32xf32> -> tensor<8x32xf32>
  %a = ernie.relu %h : tensor<8x32xf32>
  %y = ernie.matmul %a, %w2 : tensor<8x32xf32>, tensor<32x16xf32> -> tensor<8x16xf32>
  %z = ernie.matmul %y, %e : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
  %sq = ernie.mul %z, %z : tensor<8x16xf32>
  %l = ernie.reduce_mean %sq axes = [0, 1] : tensor<8x16xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// Delayed scaling: one amax history per quantised tensor (the layer input,
// shared by the forward and the weight gradient; the weight; the output
// gradient) enters the gradient function and leaves it updated, and the
// training step carries it as optimizer state. The scale is 448 / 2^margin
// over the history's max; this step's amax goes in front.
// DELAYED-LABEL: func.func @forward_grad
// DELAYED-SAME: %[[H:[a-z0-9]+]]: tensor<4xf32> {ernie.opt_state = "mlp.up.weight:fp8_amax.input"}
// DELAYED-SAME: tensor<4xf32> {ernie.opt_state = "mlp.up.weight:fp8_amax.weight"}
// DELAYED-SAME: tensor<4xf32> {ernie.opt_state = "mlp.down.weight:fp8_amax.input"}
// DELAYED-SAME: tensor<4xf32> {ernie.opt_state = "mlp.down.weight:fp8_amax.weight"}
// DELAYED-SAME: tensor<4xf32> {ernie.opt_state = "mlp.down.weight:fp8_amax.output_grad"}
// DELAYED-SAME: tensor<4xf32> {ernie.opt_state = "mlp.up.weight:fp8_amax.output_grad"}
// DELAYED-NOT: fp8_amax
// DELAYED-SAME: -> (tensor<f32> {ernie.loss}, {{.*}}, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>)
// DELAYED: %[[NOW:.+]] = ernie.reduce_max %{{.+}} axes = [0, 1] : tensor<8x16xf32> -> tensor<f32>
// DELAYED: %[[PAST:.+]] = ernie.reduce_max %[[H]] axes = [0] : tensor<4xf32> -> tensor<f32>
// DELAYED: %[[FRONT:.+]] = ernie.reshape %[[NOW]] : tensor<f32> -> tensor<1xf32>
// DELAYED: %[[KEEP:.+]] = ernie.slice %[[H]] [0:3] : tensor<4xf32> -> tensor<3xf32>
// DELAYED: ernie.concat %[[FRONT]], %[[KEEP]] axis = 0 : tensor<1xf32>, tensor<3xf32> -> tensor<4xf32>
// margin=1 halves 448.
// DELAYED: %[[M:.+]] = ernie.full 2.240000e+02 : tensor<f32>
// DELAYED: ernie.div %[[M]], %[[PAST]] : tensor<f32>
// DELAYED-LABEL: func.func @train_step
// DELAYED-SAME: tensor<4xf32> {ernie.opt_state = "mlp.up.weight:fp8_amax.input"}
// DELAYED-SAME: tensor<4xf32> {ernie.updates = "mlp.up.weight:fp8_amax.input"}
// DELAYED: call @forward_grad
// The forward alone (and evaluation) scales by the current amax.
// DELAYED-LABEL: func.func @eval_step
// DELAYED-NOT: fp8_amax

// A one-step history of the most recent amax: no max over it, no concat.
// RECENT-LABEL: func.func @forward_grad
// RECENT-SAME: tensor<1xf32> {ernie.opt_state = "mlp.up.weight:fp8_amax.input"}
// RECENT-NOT: ernie.concat
// RECENT: ernie.reshape %{{.+}} : tensor<1xf32> -> tensor<f32>
// RECENT-LABEL: func.func @train_step

// Blockwise, tiles of 4: the forward's input in 1x4 tiles along the
// contraction, weights in 4x4 squares (one scale each), an f32 GEMM of the
// dequantised tiles. The weight gradient reads x and dy transposed, so it
// tiles them 4x1, along the tokens.
// BLOCK-LABEL: func.func @forward_grad
// BLOCK: %[[XT:.+]] = ernie.reshape %{{.+}} : tensor<8x16xf32> -> tensor<8x1x4x4xf32>
// BLOCK: ernie.reduce_max %{{.+}} axes = [1, 3] : tensor<8x1x4x4xf32> -> tensor<8x4xf32>
// BLOCK: ernie.cast %{{.+}} : tensor<8x1x4x4xf32> -> tensor<8x1x4x4xf8E4M3FN>
// BLOCK: %[[X:.+]] = ernie.reshape %{{.+}} : tensor<8x1x4x4xf32> -> tensor<8x16xf32>
// BLOCK: ernie.reduce_max %{{.+}} axes = [1, 3] : tensor<4x4x8x4xf32> -> tensor<4x8xf32>
// BLOCK: %[[W:.+]] = ernie.reshape %{{.+}} : tensor<4x4x8x4xf32> -> tensor<16x32xf32>
// BLOCK: ernie.matmul %[[X]], %[[W]] : tensor<8x16xf32>, tensor<16x32xf32> -> tensor<8x32xf32>
// BLOCK: ernie.reduce_max %{{.+}} axes = [1, 3] : tensor<2x4x32x1xf32> -> tensor<2x32xf32>
// BLOCK: ernie.cast %{{.+}} : tensor<2x4x16x1xf32> -> tensor<2x4x16x1xf8E5M2>
// BLOCK: ernie.matmul %{{.+}}, %{{.+}} {transpose_a} : tensor<8x32xf32>, tensor<8x16xf32> -> tensor<32x16xf32>
// BLOCK-NOT: scaled_matmul

// Power-of-two scales: 2^trunc(log2 s) (at most 2^127), then a halving where
// it lies above s and a doubling where twice it still fits.
// POW2-LABEL: func.func @forward_grad
// POW2: ernie.full (0x7F800000 : f32) : tensor<f32>
// POW2: %[[S:.+]] = ernie.select %{{.+}} : tensor<i1>, tensor<f32>
// POW2: %[[LN:.+]] = ernie.log %[[S]] : tensor<f32>
// POW2: %[[L2:.+]] = ernie.div %[[LN]], %{{.+}} : tensor<f32>
// POW2: %[[CAP:.+]] = ernie.minimum %[[L2]], %{{.+}} : tensor<f32>
// POW2: %[[K:.+]] = ernie.cast %[[CAP]] : tensor<f32> -> tensor<i32>
// POW2: %[[KF:.+]] = ernie.cast %[[K]] : tensor<i32> -> tensor<f32>
// POW2: %[[P:.+]] = ernie.pow %{{.+}}, %[[KF]] : tensor<f32>
// POW2: ernie.compare gt, %[[P]], %[[S]] : tensor<f32>

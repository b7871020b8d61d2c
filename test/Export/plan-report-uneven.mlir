// The plan report of a training step whose weights split unevenly over 3
// ranks, and the step itself running.
//
// RUN: ernie-opt %s --ernie-autodiff=optimizer=adamw --ernie-auto-parallel-pipeline "--ernie-plan-report=file=%t.json" -o %t.mlir
// RUN: FileCheck %s --input-file=%t.json
// RUN: ernie-translate --ernie-to-program %t.mlir -o %t.ernie
// RUN: ernie-run %t.ernie --steps 2 --check-finite | FileCheck %s --check-prefix=STEP

ernie.mesh @mesh(mp = 3)
func.func @forward(%x: tensor<8x16xf32>,
                   %w1: tensor<16x10xf32> {ernie.param = "w1", ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>},
                   %w2: tensor<10x16xf32> {ernie.param = "w2", ernie.sharding = #ernie.sharding<@mesh, [{mp}, {}]>}) -> tensor<f32> {
  %h = ernie.matmul %x, %w1 : tensor<8x16xf32>, tensor<16x10xf32> -> tensor<8x10xf32>
  %a = ernie.relu %h : tensor<8x10xf32>
  %y = ernie.matmul %a, %w2 : tensor<8x10xf32>, tensor<10x16xf32> -> tensor<8x16xf32>
  %sq = ernie.mul %y, %y : tensor<8x16xf32>
  %l = ernie.reduce_mean %sq axes = [0, 1] : tensor<8x16xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// Per rank w1 is 16x4 and w2 4x16 (10 split 3 ways: 4 + 4 + 2), where the
// share is 10/3 x 16: (64 - 53.33) x 4 = 42.67 bytes of padding each, and
// as much in each of AdamW's two moments: 6 x 42.67 = 256 bytes.
// CHECK:      "train_step": {
// CHECK:        "padding_bytes": 256,
// CHECK:        "parameter_bytes": 512
// STEP-NOT: nan
// STEP: step 2/2  loss

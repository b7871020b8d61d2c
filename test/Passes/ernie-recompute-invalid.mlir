// RUN: ernie-opt %s --split-input-file --ernie-autodiff --ernie-recompute=mode=full --verify-diagnostics
// RUN: not ernie-opt %s --split-input-file --ernie-autodiff "--ernie-recompute=mode=most" 2>&1 | FileCheck %s --check-prefix=MODE

// MODE: error: unknown recompute mode 'most' (expected none, selective or full)

// Full recomputation needs layers to recompute.
// expected-error @below {{full recomputation recomputes layers, and no forward op carries a layer name (ernie.layer)}}
func.func @forward(%x: tensor<4x8xf32>, %w: tensor<8x8xf32> {ernie.param = "w"}) -> tensor<f32> {
  %h = ernie.matmul %x, %w : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %l = ernie.reduce_sum %h axes = [0, 1] : tensor<4x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

func.func @forward(%x: tensor<4x8xf32>, %w: tensor<8x8xf32> {ernie.param = "w"}) -> tensor<f32> {
  // expected-error @below {{'ernie.layer' is a layer name (a non-empty string)}}
  %h = ernie.matmul %x, %w {ernie.layer = 3} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %l = ernie.reduce_sum %h axes = [0, 1] : tensor<4x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

func.func @forward(%x: tensor<4x8xf32>, %w: tensor<8x8xf32> {ernie.param = "w"}) -> tensor<f32> {
  // expected-error @below {{'ernie.recomputed' is a unit attribute}}
  %h = ernie.matmul %x, %w {ernie.layer = "l", ernie.recomputed = 1} : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %l = ernie.reduce_sum %h axes = [0, 1] : tensor<4x8xf32> -> tensor<f32>
  return %l : tensor<f32>
}

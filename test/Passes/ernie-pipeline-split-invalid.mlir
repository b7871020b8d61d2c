// Pipeline plans that do not fit the model are clear errors.
// RUN: not ernie-opt %s --split-input-file --ernie-pipeline-split=stages=2 2>&1 | FileCheck %s
// Found by ernie-fuzz-mlir: 2^32 virtual stages sized a table per chunk
// (std::bad_alloc); the options are checked as the dictionary they write.
// RUN: not ernie-opt %s --split-input-file "--ernie-pipeline-split=stages=2 virtual-stages=4294967296" 2>&1 | FileCheck %s --check-prefix=HUGE
// RUN: not ernie-opt %s --split-input-file --ernie-pipeline-split=stages=8192 2>&1 | FileCheck %s --check-prefix=STAGES
// HUGE: error: --ernie-pipeline-split: 'ernie.pipeline' key 'virtual_stages' must be in [1, 1048576], got 4294967296
// STAGES: error: --ernie-pipeline-split: 'ernie.pipeline' key 'stages' must be at most 4096, got 8192

ernie.mesh @mesh(pp = 2)
func.func @forward(%x: tensor<4x8xf32>, %y: tensor<4xi64>,
                   %w: tensor<8x8xf32> {ernie.param = "w"}) -> tensor<f32> {
  %h = ernie.matmul %x, %w : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %s0 = ernie.split_point %h : tensor<4x8xf32>
  %a = ernie.relu %s0 : tensor<4x8xf32>
  // CHECK: :[[@LINE+1]]:9: error: this split point starts chunk 2, but the pipeline has 2 (2 stages x 1 virtual stages)
  %s1 = ernie.split_point %a : tensor<4x8xf32>
  %loss = ernie.cross_entropy %s1, %y : tensor<4x8xf32>, tensor<4xi64> -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

ernie.mesh @mesh(pp = 2)
// Without a split point everything lands on the last chunk.
// CHECK: error: chunk 0 of 2 has no op: the split points make fewer chunks than 2 stages x 1 virtual stages
func.func @forward(%x: tensor<4x8xf32>, %y: tensor<4xi64>,
                   %w: tensor<8x8xf32> {ernie.param = "w"}) -> tensor<f32> {
  %h = ernie.matmul %x, %w : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %loss = ernie.cross_entropy %h, %y : tensor<4x8xf32>, tensor<4xi64> -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// CHECK: :[[@LINE+1]]:1: error: pipeline axis 'pp' has size 4, but the pipeline has 2 stages
ernie.mesh @mesh(dp = 2, pp = 4)
func.func @forward(%x: tensor<4x8xf32>) -> tensor<f32> {
  %s = ernie.reduce_sum %x axes = [0, 1] : tensor<4x8xf32> -> tensor<f32>
  return %s : tensor<f32>
}

// -----

// CHECK: :[[@LINE+1]]:1: error: the mesh has no pipeline axis 'pp'
ernie.mesh @mesh(dp = 2, mp = 2)
func.func @forward(%x: tensor<4x8xf32>) -> tensor<f32> {
  %s = ernie.reduce_sum %x axes = [0, 1] : tensor<4x8xf32> -> tensor<f32>
  return %s : tensor<f32>
}

// Schedules that cannot run are rejected before anything runs, saying where.
// RUN: not ernie-opt %s --ernie-pipeline-split=stages=2 --ernie-autodiff=optimizer=sgd --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=2 schedule=custom" 2>&1 | FileCheck %s --check-prefix=DEADLOCK
// DEADLOCK: error: schedule deadlocks: pipeline rank 0 waits at its step 1 (backward of chunk 0, micro-batch 0) for the backward of chunk 1, micro-batch 0 on pipeline rank 1, which waits at its step 1; pipeline rank 1 waits at its step 1 (forward of chunk 1, micro-batch 1) for the forward of chunk 0, micro-batch 1 on pipeline rank 0
// RUN: not ernie-opt %s --ernie-pipeline-split=stages=2 --ernie-autodiff=optimizer=sgd --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=2 schedule=zigzag" 2>&1 | FileCheck %s --check-prefix=NAME
// NAME: error: unknown pipeline schedule 'zigzag' (expected FThenB, 1F1B, interleaved or custom)
// RUN: not ernie-opt %s --ernie-pipeline-split=stages=2 --ernie-autodiff=optimizer=sgd --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=2 schedule=interleaved" 2>&1 | FileCheck %s --check-prefix=VPP
// VPP: error: interleaved schedule needs virtual_stages >= 2
// RUN: not ernie-opt %s --ernie-pipeline-split=stages=2 --ernie-autodiff=optimizer=sgd --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=0" 2>&1 | FileCheck %s --check-prefix=MB
// MB: error: a pipeline needs micro-batches >= 1 and <= 1048576, not 0
// RUN: not ernie-opt %s --ernie-pipeline-split=stages=2 --ernie-autodiff=optimizer=sgd --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=2 grad-reduce=bf16" 2>&1 | FileCheck %s --check-prefix=REDUCE
// REDUCE: error: grad-reduce is f32 or native, not 'bf16'
// RUN: not ernie-opt %s --ernie-pipeline-split=stages=2 --ernie-autodiff=optimizer=sgd --ernie-auto-parallel-pipeline "--ernie-pipeline-schedule=micro-batches=2 accumulate=fused" 2>&1 | FileCheck %s --check-prefix=ACCUMULATE
// ACCUMULATE: error: accumulate is gemm, add or runtime, not 'fused'
// RUN: not ernie-opt %s --ernie-autodiff=optimizer=sgd --ernie-pipeline-schedule 2>&1 | FileCheck %s --check-prefix=UNSPLIT
// UNSPLIT: error: no pipeline to schedule: run --ernie-pipeline-split before autodiff

// A deadlock: rank 0 waits for the gradient of micro-batch 0 before sending
// micro-batch 1's activation, which rank 1 needs before that gradient.
module attributes {ernie.pipeline_schedule = ["F0:0 B0:0 F0:1 B0:1", "F1:0 F1:1 B1:0 B1:1"]} {
ernie.mesh @mesh(pp = 2)
func.func @forward(%x: tensor<4x8xf32>, %y: tensor<4xi64>,
                   %w0: tensor<8x8xf32> {ernie.param = "w0"},
                   %w1: tensor<8x8xf32> {ernie.param = "w1"}) -> tensor<f32> {
  %h = ernie.matmul %x, %w0 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %s = ernie.split_point %h : tensor<4x8xf32>
  %g = ernie.matmul %s, %w1 : tensor<4x8xf32>, tensor<8x8xf32> -> tensor<4x8xf32>
  %loss = ernie.cross_entropy %g, %y : tensor<4x8xf32>, tensor<4xi64> -> tensor<f32>
  return %loss : tensor<f32>
}
}

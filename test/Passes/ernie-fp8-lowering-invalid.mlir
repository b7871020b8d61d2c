// Bad FP8 requests are clear errors with a non-zero exit.
// RUN: not ernie-opt %s "--ernie-fp8-lowering=recipe=fancy" 2>&1 | FileCheck %s --check-prefix=RECIPE
// RECIPE: error: fp8 recipe 'fancy' is not available (known: current, delayed, blockwise)
// RUN: not ernie-opt %s "--ernie-fp8-lowering=fwd-format=e3m4" 2>&1 | FileCheck %s --check-prefix=FORMAT
// FORMAT: error: unknown fp8 format 'e3m4' (known: e4m3, e5m2)
// RUN: not ernie-opt %s "--ernie-fp8-lowering=recipe=delayed amax-compute=mean" 2>&1 | FileCheck %s --check-prefix=AMAX
// AMAX: error: fp8 amax-compute must be max or most_recent, not 'mean'
// RUN: not ernie-opt %s "--ernie-fp8-lowering=recipe=delayed history-length=0" 2>&1 | FileCheck %s --check-prefix=HISTORY
// HISTORY: error: fp8 history-length must be at least 1
// RUN: not ernie-opt %s "--ernie-fp8-lowering=exclude=(" 2>&1 | FileCheck %s --check-prefix=REGEX
// REGEX: error: fp8 exclude is not a regex
// Tiles of 1x5 along the 16-wide contraction do not divide it.
// RUN: not ernie-opt %s "--ernie-fp8-lowering=recipe=blockwise block-size=5" 2>&1 | FileCheck %s --check-prefix=TILE
// TILE: :[[@LINE+7]]:8: error: fp8 blockwise: dimension 1 of the left operand has size 16, which tiles of 1x5 do not divide
// An explicit include of a parameter some non-matmul reads (a norm's weight).
// RUN: not ernie-opt %s "--ernie-fp8-lowering=include=norm" 2>&1 | FileCheck %s --check-prefix=NOTMATMUL
// NOTMATMUL: :[[@LINE+5]]:8: error: fp8 is requested for parameter 'norm.weight', but this 'ernie.rms_norm' reads it, and only matmuls run in fp8

func.func @forward(%x: tensor<8x16xf32>, %g: tensor<16xf32> {ernie.param = "norm.weight"},
                   %w: tensor<16x16xf32> {ernie.param = "proj.weight"}) -> tensor<8x16xf32> {
  %h = ernie.matmul %x, %w : tensor<8x16xf32>, tensor<16x16xf32> -> tensor<8x16xf32>
  %n = ernie.rms_norm %h, %g, epsilon = 1.0e-6 : tensor<8x16xf32>, tensor<16xf32>
  return %n : tensor<8x16xf32>
}

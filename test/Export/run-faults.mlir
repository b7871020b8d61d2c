// Faults at run time: every one exits non-zero with a message naming the
// rank, the instruction and the cause, and no rank waits for a peer that
// failed (the collective timeout is 60 s; these finish at once).
//
// RUN: ernie-translate --ernie-to-program %s -o %t.ernie
// RUN: ernie-run %t.ernie --function ok | FileCheck %s --check-prefix=OK
// The banner names the GEMM library and the kernels it chose.
// OK: GEMM: {{.+}} kernels
// OK: step 1/1  time
//
// Rank 1 looks up row 9 of a 4-row table while rank 0 waits in an
// all-reduce: rank 1's error stops both.
// RUN: not ernie-run %t.ernie --function bad_row 2>&1 | FileCheck %s --check-prefix=ROW
// RUN: not ernie-run %t.ernie --function bad_row --backend gloo 2>&1 | FileCheck %s --check-prefix=ROW
// ROW: rank 1: @bad_row instruction #4 'ernie.embedding' at {{.*}}run-faults.mlir:{{[0-9]+}}:{{[0-9]+}}: {{.*}}9 is outside
//
// A NaN loss is an error only when asked for.
// RUN: ernie-run %t.ernie --function nan_loss | FileCheck %s --check-prefix=NAN-OK
// NAN-OK: loss {{-?}}nan
// RUN: not ernie-run %t.ernie --function nan_loss --check-finite 2>&1 | FileCheck %s --check-prefix=NAN
// NAN: rank {{[01]}}: @nan_loss result 0 (the loss) is not finite
//
// Bad command lines.
// RUN: not ernie-run %t.ernie --ranks 8 2>&1 | FileCheck %s --check-prefix=RANKS
// RANKS: error: the program's mesh [dp=2] has 2 ranks; --ranks asks for 8
// RUN: not ernie-run %t.ernie 2>&1 | FileCheck %s --check-prefix=CHOOSE
// CHOOSE: error: the program has several functions ( @ok @bad_row @nan_loss ); choose one with --function
// RUN: not ernie-run %t.ernie --function nope 2>&1 | FileCheck %s --check-prefix=NOPE
// NOPE: error: the program has no function @nope (it has @ok, @bad_row, @nan_loss)
// RUN: not ernie-run %t.ernie --steps 0 2>&1 | FileCheck %s --check-prefix=STEPS
// STEPS: error: --steps must be at least 1
// RUN: not ernie-run 2>&1 | FileCheck %s --check-prefix=NOFILE
// NOFILE: error: no program file given
// RUN: not ernie-run %t.ernie --backend mpi 2>&1 | FileCheck %s --check-prefix=BACKEND
// BACKEND: error: --backend must be threads, gloo or nccl, not 'mpi'
// RUN: not ernie-run %t.ernie --device tpu 2>&1 | FileCheck %s --check-prefix=DEVICE
// DEVICE: error: --device must be cpu, cuda or cuda:N, not 'tpu'
// RUN: not ernie-run %t.ernie --backend nccl 2>&1 | FileCheck %s --check-prefix=NCCL-CPU
// NCCL-CPU: error: --backend nccl runs on GPUs: add --device cuda
// RUN: not ernie-run %t.ernie --function ok --inputs %t.missing 2>&1 | FileCheck %s --check-prefix=INPUTS
// INPUTS: error: no input for @ok argument 0

ernie.mesh @mesh(dp = 2)

func.func @ok(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = ernie.all_reduce %x over @mesh[dp] sum : tensor<4xf32>
  return %y : tensor<4xf32>
}

func.func @bad_row(%table: tensor<4x8xf32>) -> tensor<1x8xf32> {
  %i = ernie.axis_index over @mesh[dp] : tensor<i64>
  %nine = ernie.full 9 : tensor<i64>
  %row = ernie.mul %i, %nine : tensor<i64>
  %ids = ernie.reshape %row : tensor<i64> -> tensor<1xi64>
  %e = ernie.embedding %ids, %table : tensor<1xi64>, tensor<4x8xf32> -> tensor<1x8xf32>
  %s = ernie.all_reduce %e over @mesh[dp] sum : tensor<1x8xf32>
  return %s : tensor<1x8xf32>
}

func.func @nan_loss(%w: tensor<4xf32> {ernie.param = "w"}) -> (tensor<f32> {ernie.loss}) {
  %s = ernie.reduce_sum %w axes = [0] : tensor<4xf32> -> tensor<f32>
  %m = ernie.full -1.0 : tensor<f32>
  %l = ernie.log %m : tensor<f32>
  %r = ernie.add %s, %l : tensor<f32>
  return %r : tensor<f32>
}

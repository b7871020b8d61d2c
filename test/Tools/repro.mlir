// The crash reproducers of issue 18 (hostile inputs found by mutation
// fuzzing; Inputs/repro/, copied from the report) end in an error with a
// location and exit code 1, never a signal. The program-*.ernie ones are the
// runtime's (test/Export); the .py ones run in python/tests/test_repro.py.
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-opt %S/Inputs/repro/opt_pipeline_schedule_min.mlir --ernie-pipeline-schedule=micro-batches=2 2>&1 | FileCheck %s --check-prefix=MIN
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-translate --ernie-to-program %S/Inputs/repro/opt_pipeline_schedule_min.mlir -o %t.ernie 2>&1 | FileCheck %s --check-prefix=MIN
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-opt %S/Inputs/repro/opt_pipeline_schedule_badtype.mlir --ernie-pipeline-schedule=micro-batches=2 2>&1 | FileCheck %s --check-prefix=BADTYPE
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-translate --ernie-to-program %S/Inputs/repro/opt_pipeline_schedule_badtype.mlir -o %t.ernie 2>&1 | FileCheck %s --check-prefix=BADTYPE
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-opt %S/Inputs/repro/opt_pipeline_schedule_buildInit.mlir --ernie-pipeline-split=stages=2 --ernie-shared-weight-dedup "--ernie-autodiff=optimizer=adamw clip-norm=1.0" --ernie-auto-parallel-pipeline --ernie-pipeline-schedule=micro-batches=4 2>&1 | FileCheck %s --check-prefix=INIT
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-opt %S/Inputs/repro/Z1-matmul-zero-dim.mlir --ernie-auto-parallel-pipeline 2>&1 | FileCheck %s --check-prefix=Z1
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-translate --ernie-to-program %S/Inputs/repro/Z1-matmul-zero-dim.mlir -o %t.ernie 2>&1 | FileCheck %s --check-prefix=Z1
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-opt %S/Inputs/repro/Z2-rms-norm-zero-dim.mlir --ernie-auto-parallel-pipeline 2>&1 | FileCheck %s --check-prefix=Z2
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-opt %S/Inputs/repro/Z3-training-step-zero-hidden.mlir --ernie-autodiff=optimizer=sgd --ernie-auto-parallel-pipeline 2>&1 | FileCheck %s --check-prefix=Z3
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-opt %S/Inputs/repro/H1-mesh-2p32-ranks.mlir --ernie-auto-parallel-pipeline 2>&1 | FileCheck %s --check-prefix=H1
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-translate --ernie-to-program %S/Inputs/repro/H1-mesh-2p32-ranks.mlir -o %t.ernie 2>&1 | FileCheck %s --check-prefix=H1

// MIN: opt_pipeline_schedule_min.mlir:1:1: error: 'ernie.pipeline' key 'virtual_stages' is missing
// BADTYPE: opt_pipeline_schedule_badtype.mlir:1:1: error: 'ernie.pipeline' key 'stages' must be an i64 integer
// INIT: opt_pipeline_schedule_buildInit.mlir:74:1: error: argument #3 has 'ernie.pipeline_stages' but is not a parameter (no 'ernie.param')
// Z1: Z1-matmul-zero-dim.mlir:2:8: error: 'ernie.matmul' op operand #0 has a zero-size dimension ('tensor<4x0xf32>'): ernie tensors have no zero-size dimensions
// Z2: Z2-rms-norm-zero-dim.mlir:2:8: error: 'ernie.rms_norm' op operand #0 has a zero-size dimension ('tensor<2x0xf32>'): ernie tensors have no zero-size dimensions
// Z3: Z3-training-step-zero-hidden.mlir:3:1: error: parameter argument #1 ('w1') has a zero-size dimension ('tensor<16x0xf32>'): ernie tensors have no zero-size dimensions
// H1: H1-mesh-2p32-ranks.mlir:3:1: error: 'ernie.mesh' op has more than 1048576 ranks (the product of its axis sizes)

// Hostile inputs: ernie-opt prints an error with a source location and exits
// with exactly 1 — never an assertion, a crash or a larger exit code.
// RUN: split-file %s %t
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-opt %t/truncated.mlir 2>&1 | FileCheck %s --check-prefix=TRUNC
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-opt %t/huge-dim.mlir 2>&1 | FileCheck %s --check-prefix=HUGE
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-opt %t/negative-dim.mlir 2>&1 | FileCheck %s --check-prefix=NEG
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-opt %t/overflow.mlir 2>&1 | FileCheck %s --check-prefix=OVERFLOW
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-opt %t/element-type.mlir 2>&1 | FileCheck %s --check-prefix=ELEM
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-opt %t/operand-count.mlir 2>&1 | FileCheck %s --check-prefix=COUNT
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-opt %t/custom-operand-count.mlir 2>&1 | FileCheck %s --check-prefix=CCOUNT
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-opt %t/unknown-op.mlir 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-opt %t/huge-attr.mlir 2>&1 | FileCheck %s --check-prefix=ATTR
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-opt %t/ok.mlir --ernie-no-such-pass 2>&1 | FileCheck %s --check-prefix=FLAG
// RUN: printf '\000\377\376garbage\001' > %t/garbage.mlir
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-opt %t/garbage.mlir 2>&1 | FileCheck %s --check-prefix=GARBAGE
// RUN: ernie-opt %t/ok.mlir --emit-bytecode -o %t/ok.mlirbc
// RUN: head -c 40 %t/ok.mlirbc > %t/cut.mlirbc
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-opt %t/cut.mlirbc 2>&1 | FileCheck %s --check-prefix=BYTECODE
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-opt %t/missing-file.mlir 2>&1 | FileCheck %s --check-prefix=MISSING

// TRUNC: truncated.mlir:{{[0-9]+}}:{{[0-9]+}}: error:
// HUGE: huge-dim.mlir:1:{{[0-9]+}}: error: invalid dimension
// NEG: negative-dim.mlir:1:{{[0-9]+}}: error:
// OVERFLOW: overflow.mlir:2:{{[0-9]+}}: error: 'ernie.neg' op operand #0 must be statically shaped tensor
// ELEM: element-type.mlir:2:{{[0-9]+}}: error: 'ernie.neg' op operand #0 must be statically shaped tensor
// COUNT: operand-count.mlir:2:{{[0-9]+}}: error: 'ernie.add' op expected 2 operands, but found 1
// CCOUNT: custom-operand-count.mlir:2:{{[0-9]+}}: error: expected ','
// UNKNOWN: unknown-op.mlir:2:{{[0-9]+}}: error: custom op 'ernie.frobnicate' is unknown
// ATTR: huge-attr.mlir:2:{{[0-9]+}}: error:
// FLAG: Unknown command line argument '--ernie-no-such-pass'
// GARBAGE: garbage.mlir:1:{{[0-9]+}}: error: unexpected character
// BYTECODE: cut.mlirbc:{{.*}}error:
// MISSING: missing-file.mlir': No such file or directory

//--- ok.mlir
func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = ernie.exp %x : tensor<4xf32>
  return %0 : tensor<4xf32>
}
//--- truncated.mlir
func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = ernie.exp %x : tensor<4
//--- huge-dim.mlir
func.func @f(%x: tensor<99999999999999999999999xf32>) {
  return
}
//--- negative-dim.mlir
func.func @f(%x: tensor<-4xf32>) {
  return
}
//--- overflow.mlir
func.func @f(%x: tensor<4611686018427387904x4611686018427387904xf32>) {
  %0 = ernie.neg %x : tensor<4611686018427387904x4611686018427387904xf32>
  return
}
//--- element-type.mlir
func.func @f(%x: tensor<4xf128>) {
  %0 = ernie.neg %x : tensor<4xf128>
  return
}
//--- operand-count.mlir
func.func @f(%x: tensor<4xf32>) {
  %0 = "ernie.add"(%x) : (tensor<4xf32>) -> tensor<4xf32>
  return
}
//--- custom-operand-count.mlir
func.func @f(%x: tensor<4xf32>) {
  %0 = ernie.add %x : tensor<4xf32>
  return
}
//--- unknown-op.mlir
func.func @f(%x: tensor<4xf32>) {
  %0 = ernie.frobnicate %x : tensor<4xf32>
  return
}
//--- huge-attr.mlir
func.func @f() {
  %0 = ernie.iota dim = 99999999999999999999999 : tensor<4xi64>
  return
}

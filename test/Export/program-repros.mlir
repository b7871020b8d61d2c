// Hostile program files (issue 18's reproducers, found by mutating one small
// integer of a compiled file's payload and recomputing its checksum) end in
// an error naming the file, the function, the instruction and the cause —
// never a signal or a silent wrong run. Plain `not` fails on a crash (LLVM's
// `not` only accepts one with --crash), so each line also proves no signal.
//
// RUN: not ernie-run %S/Inputs/repro/program-R1-kernel-without-result.ernie --steps 2 --timeout 5 2>&1 | FileCheck %s --check-prefix=R1
// R1: program-R1-kernel-without-result.ernie: function @f, instruction #1 (ernie.tanh): takes 1 result, not 0
//
// RUN: not ernie-run %S/Inputs/repro/program-R2-matmul-operand-retargeted.ernie --steps 2 --timeout 5 2>&1 | FileCheck %s --check-prefix=R2
// R2: function @f, instruction #0 (ernie.matmul): matmul operands need rank >= 2, got [4, 8]xf32 and [2]xf32
//
// RUN: not ernie-run %S/Inputs/repro/program-R5-all-reduce-result-retargeted.ernie --steps 2 --timeout 5 2>&1 | FileCheck %s --check-prefix=R5
// (Its all-reduce writes argument 0's buffer: refused before the read of
// the buffer it no longer writes is.)
// R5: function @f, instruction #2 (ernie.all_reduce): writes argument buffer 0 without reading it (only an in-place result, or a value the function returns there, may take an argument's buffer)
//
// RUN: not ernie-run %S/Inputs/repro/program-R6b-mesh-ranks-overflow-to-0.ernie --steps 2 --timeout 5 2>&1 | FileCheck %s --check-prefix=R6
// R6: the mesh has more than 1048576 ranks (axis 'x' of size 4294967296 takes it past the limit)
//
// RUN: not ernie-run %S/Inputs/repro/program-block-allreduce-heap.ernie --steps 2 --timeout 5 2>&1 | FileCheck %s --check-prefix=HEAP
// HEAP: function @block, instruction #21 (ernie.matmul): the result must be [2, 16, 64]xf32, not [64]xf32
//
// RUN: not ernie-run %S/Inputs/repro/program-block-binary-segv.ernie --steps 2 --timeout 5 2>&1 | FileCheck %s --check-prefix=BINARY
// BINARY: function @block, instruction #15 (ernie.add): takes 1 result, not 0
//
// RUN: not ernie-run %S/Inputs/repro/program-llama-dim-2p40-segv.ernie --steps 2 --timeout 5 2>&1 | FileCheck %s --check-prefix=DIM
// DIM: function @train_step, instruction #126 (ernie.broadcast): dims [1099511627776] must be increasing dimensions of the result [2, 16, 64]xf32
//
// RUN: not ernie-run %S/Inputs/repro/program-pipe-matmul-segv.ernie --steps 2 --timeout 5 2>&1 | FileCheck %s --check-prefix=PIPEMM
// PIPEMM: function @train_forward.0, instruction #0 (ernie.matmul): takes 1 result, not 0
//
// RUN: not ernie-run %S/Inputs/repro/program-pipe-run-segv.ernie --steps 2 --timeout 5 2>&1 | FileCheck %s --check-prefix=PIPESTEP
// PIPESTEP: function @train_backward.1, instruction #7 (ernie.sub): the result ([]xf32) must be [4, 16]xf32 like the operands
//
// Found by ernie-fuzz-program (seed 7): an arena of 2^64 - 1 bytes wrapped
// to a 64-byte allocation when rounded up to the buffer alignment.
// RUN: not ernie-run %S/Inputs/repro/fuzz-arena-bytes-wrap.ernie --steps 1 --timeout 5 2>&1 | FileCheck %s --check-prefix=ARENA
// ARENA: function @block: an arena of 18446744073709551615 bytes is past the limit of 2^48
//
// Bytes appended after the program are damage, not ignored.
// RUN: ernie-translate --ernie-to-program %s -o %t.ernie
// RUN: ernie-run %t.ernie | FileCheck %s --check-prefix=GOOD
// GOOD: step 1/1
// RUN: cp %t.ernie %t.tail && printf 'tail' >> %t.tail
// RUN: not ernie-run %t.tail 2>&1 | FileCheck %s --check-prefix=TAIL
// TAIL: has {{[0-9]+}} bytes after its program (a file ends with its program and at most 15 zero bytes of padding)
//
// A mesh the thread backend cannot start in one process is refused up front.
// RUN: sed "s/(x = 2)/(x = 2048)/" %s > %t.big.mlir
// RUN: ernie-translate --ernie-to-program %t.big.mlir -o %t.big.ernie
// RUN: not ernie-run %t.big.ernie 2>&1 | FileCheck %s --check-prefix=THREADS
// THREADS: the thread backend runs at most 1024 ranks in one process; this mesh has 2048
// RUN: not ernie-run %t.big.ernie --backend gloo 2>&1 | FileCheck %s --check-prefix=GLOO
// GLOO: --backend gloo starts at most 1024 rank processes on one host; this mesh has 2048

ernie.mesh @mesh(x = 2)

func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {
  %y = ernie.tanh %x : tensor<8xf32>
  return %y : tensor<8xf32>
}

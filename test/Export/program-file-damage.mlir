// A damaged program file is refused with a message naming the file and the
// damage, before anything runs.
//
// RUN: ernie-translate --ernie-to-program %s -o %t.ernie
// RUN: ernie-run %t.ernie | FileCheck %s --check-prefix=GOOD
// GOOD: step 1/1
//
// RUN: head -c 120 %t.ernie > %t.cut
// RUN: not ernie-run %t.cut 2>&1 | FileCheck %s --check-prefix=CUT -DFILE=%t.cut
// CUT: ernie-run: error: [[FILE]]: is truncated or corrupted (the file structure does not verify)
//
// RUN: head -c 5 %t.ernie > %t.tiny
// RUN: not ernie-run %t.tiny 2>&1 | FileCheck %s --check-prefix=TINY
// TINY: is truncated: 5 bytes
//
// Any flipped byte of the program is caught by its checksum.
// RUN: cp %t.ernie %t.flip1 && printf 'Z' | dd of=%t.flip1 bs=1 seek=100 conv=notrunc status=none
// RUN: not ernie-run %t.flip1 2>&1 | FileCheck %s --check-prefix=FLIP
// RUN: cp %t.ernie %t.flip2 && printf 'Z' | dd of=%t.flip2 bs=1 seek=500 conv=notrunc status=none
// RUN: not ernie-run %t.flip2 2>&1 | FileCheck %s --check-prefix=FLIP
// FLIP: is corrupted: the checksum does not match its contents
//
// RUN: echo "this is not a program file at all" > %t.text
// RUN: not ernie-run %t.text 2>&1 | FileCheck %s --check-prefix=TEXT
// TEXT: is not an ernie program file (no 'ERNP' identifier)
//
// RUN: not ernie-run %t.does-not-exist 2>&1 | FileCheck %s --check-prefix=MISSING
// MISSING: cannot open the program file

func.func @main(%x: tensor<64xf32>) -> tensor<64xf32> {
  %y = ernie.exp %x : tensor<64xf32>
  %z = ernie.mul %y, %x : tensor<64xf32>
  return %z : tensor<64xf32>
}

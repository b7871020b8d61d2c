// The round-3 reproducers of issue 42 (Inputs/repro/, copied from the
// report: checkpoints, safetensors and .npy inputs) end in an error naming
// the file and exit 1 under a 2 GiB address-space limit, never a signal, a
// hang or a silent acceptance. llama-dp2.ernie is the program the
// checkpoints belong to; ckpt-keep-loses-new.py runs in
// python/tests/test_repro.py.
// RUN: ulimit -v 2097152
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-run %S/Inputs/repro/llama-dp2.ernie --steps 2 --quiet --resume %S/Inputs/repro/ckpt-bitflip 2>&1 | FileCheck %s --check-prefix=FLIP
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-ckpt verify %S/Inputs/repro/ckpt-bitflip 2>&1 | FileCheck %s --check-prefix=FLIP
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-ckpt consolidate %S/Inputs/repro/ckpt-bitflip %t.safetensors 2>&1 | FileCheck %s --check-prefix=FLIP
// RUN: not test -e %t.safetensors
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-ckpt info %S/Inputs/repro/ckpt-deep-metadata 2>&1 | FileCheck %s --check-prefix=DEEP
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-ckpt info %S/Inputs/repro/ckpt-deep-metadata/step-00000001 2>&1 | FileCheck %s --check-prefix=DEEP
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-run %S/Inputs/repro/llama-dp2.ernie --steps 2 --quiet --resume %S/Inputs/repro/ckpt-deep-metadata 2>&1 | FileCheck %s --check-prefix=DEEP
// RUN: rm -rf %t.imported
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-ckpt import %S/Inputs/repro/safetensors-deep-dtype.safetensors %t.imported 2>&1 | FileCheck %s --check-prefix=DTYPE
// RUN: ls -A %t.imported | count 0
// RUN: bash %S/Inputs/expect-exit.sh 1 ernie-run %S/Inputs/repro/llama-dp2.ernie --steps 1 --quiet --inputs %S/Inputs/repro/npy-header-len-4GB 2>&1 | FileCheck %s --check-prefix=NPY

// FLIP: ckpt-bitflip/step-00000001/rank-00000.safetensors: tensor 'llama.embed_tokens.weight': bytes [0, 4096) fail their checksum (crc32 0x3766aa62 recorded, 0xde210305 read): the file is damaged
// DEEP: ckpt-deep-metadata/step-00000001/manifest.json: refused JSON: nested deeper than 64 levels
// DTYPE: error: {{.*}}safetensors-deep-dtype.safetensors: the header: refused JSON: nested deeper than 3 levels
// NPY: error: {{.*}}npy-header-len-4GB/input0.npy: .npy header length 4294967295 is over the limit of 65536

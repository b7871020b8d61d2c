#!/usr/bin/env bash
# gpu_check.sh — everything in ernie that needs a GPU, in one command.
#
#   scripts/gpu_check.sh            (on a machine with an NVIDIA GPU, CUDA 13
#                                    toolkit and NCCL under /usr/local/cuda)
#
# The CUDA backend was written and compiled on machines without a GPU: until
# this script has run on one, every CUDA kernel, the CUDA device, the
# shared-device engine and the NCCL communicator are UNVERIFIED. It:
#   1. fails at once, saying so, when no GPU is visible;
#   2. builds the runtime with ERNIE_ENABLE_CUDA=ON (sm_90 unless
#      CMAKE_CUDA_ARCHITECTURES is set) and bench/gpu;
#   3. runs every CUDA test: each kernel against the CPU kernel (Cuda/*),
#      the fp8 convention, the seed programs training on the GPU as on the
#      CPU (one rank, dp x mp, dp x pp, ep), devices, ernie-run on a GPU;
#   4. runs the GPU benchmarks (GEMM vs cuBLAS, FP8 vs bf16, attention vs
#      FlashAttention-2/3 as published);
#   5. trains the examples' Llama (bench/gpu/programs) 50 steps on one GPU
#      and on the CPU, dp x mp x pp = 2 x 2 x 2 on the shared-device engine,
#      and with NCCL at world size 1, and prints the loss tables.
# Meant to finish in under 8 minutes on one H200; each phase has a timeout.
# Exits non-zero when anything failed; the last line says what.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${ERNIE_GPU_BUILD_DIR:-$ROOT/build-gpu}"
JOBS="${ERNIE_JOBS:-$(nproc)}"
START=$(date +%s)
failures=()

log() { printf '\033[1m[gpu_check %3ds]\033[0m %s\n' "$(( $(date +%s) - START ))" "$*"; }
fail() { failures+=("$1"); log "FAILED: $1"; }

# 1. A GPU, or nothing to check.
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no GPU visible (nvidia-smi -L failed or is missing): nothing to check;" \
       "the CUDA backend stays unverified" >&2
  exit 2
fi
nvidia-smi -L
export PATH="/usr/local/cuda/bin:$PATH"

# 2. Build.
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache
                                          -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
arch=()
[ -n "${CMAKE_CUDA_ARCHITECTURES:-}" ] && arch=(-DCMAKE_CUDA_ARCHITECTURES="$CMAKE_CUDA_ARCHITECTURES")
log "building the runtime with CUDA (-j$JOBS)"
if ! { cmake -G Ninja -S "$ROOT/runtime" -B "$BUILD/runtime" -DCMAKE_BUILD_TYPE=Release \
         -DERNIE_ENABLE_CUDA=ON "${launcher[@]}" "${arch[@]}" >"$BUILD.configure.log" 2>&1 &&
       timeout 300 ninja -C "$BUILD/runtime" -j "$JOBS" >"$BUILD.build.log" 2>&1; }; then
  tail -40 "$BUILD.build.log" "$BUILD.configure.log" 2>/dev/null
  echo "gpu_check: the build failed (logs: $BUILD.configure.log, $BUILD.build.log)" >&2
  exit 1
fi
log "building bench/gpu"
if ! { cmake -G Ninja -S "$ROOT/bench/gpu" -B "$BUILD/bench" -DCMAKE_BUILD_TYPE=Release \
         "${launcher[@]}" "${arch[@]}" >>"$BUILD.configure.log" 2>&1 &&
       timeout 300 ninja -C "$BUILD/bench" -j "$JOBS" gpu_bench >>"$BUILD.build.log" 2>&1; }; then
  tail -20 "$BUILD.build.log"
  fail "building bench/gpu"
fi
RUN="$BUILD/runtime/bin/ernie-run"

# 3. Every CUDA test (and the CPU tests that touch devices).
log "CUDA tests"
TESTS='Cuda/*:CudaKernels.*:Fp8NvidiaConvention.*:OpenDevice.*:Seeds/GpuSeedPrograms.*:ErnieRunDevices.*:NcclCommunicator.*:DeviceSession.*:Seeds/SeedPrograms.*'
timeout 300 "$BUILD/runtime/ernie-runtime-tests" --gtest_filter="$TESTS" \
  --gtest_brief=1 >"$BUILD.tests.log" 2>&1
status=$?
grep -E '^\[  (PASSED|FAILED|SKIPPED) \]|tests? ran' "$BUILD.tests.log" | tail -30
[ $status -eq 0 ] || fail "CUDA tests (log: $BUILD.tests.log)"

# 4. Benchmarks.
if [ -x "$BUILD/bench/gpu_bench" ]; then
  log "benchmarks"
  timeout 240 "$BUILD/bench/gpu_bench" || fail "gpu_bench"
fi

# 5. The examples' Llama.
PROGRAMS="$ROOT/bench/gpu/programs"
WORK="$BUILD/llama"
rm -rf "$WORK" && mkdir -p "$WORK"
common=(--steps 50 --lr 1e-3 --timeout 60 --inputs "$PROGRAMS/inputs")
train() { # name, program, args...
  local name=$1 program=$2; shift 2
  timeout 180 "$RUN" "$program" "${common[@]}" --outputs "$WORK/$name" "$@" \
    >"$WORK/$name.log" 2>&1 || { tail -5 "$WORK/$name.log"; fail "training $name"; }
}
log "Llama, 50 steps: CPU, one GPU, NCCL world size 1, dp x mp x pp = 2 x 2 x 2 on one GPU"
train cpu "$PROGRAMS/llama.ernie" --device cpu
train gpu "$PROGRAMS/llama.ernie" --device cuda
train nccl1 "$PROGRAMS/llama.ernie" --device cuda --backend nccl
train gpu_2x2x2 "$PROGRAMS/llama_dp2_mp2_pp2.ernie" --device cuda --backend threads
train cpu_2x2x2 "$PROGRAMS/llama_dp2_mp2_pp2.ernie" --device cpu
echo
echo "one GPU (f32) against the CPU: within 1e-4 relative"
python3 "$ROOT/bench/gpu/compare_losses.py" 1e-4 cpu="$WORK/cpu" gpu="$WORK/gpu" \
  nccl_world1="$WORK/nccl1" || fail "Llama: one GPU vs CPU"
echo
echo "dp x mp x pp = 2 x 2 x 2 on the shared-device engine against one GPU"
python3 "$ROOT/bench/gpu/compare_losses.py" 1e-4 one_gpu="$WORK/gpu" \
  gpu_2x2x2="$WORK/gpu_2x2x2" cpu_2x2x2="$WORK/cpu_2x2x2" || fail "Llama: 2x2x2 vs one GPU"
for name in cpu gpu gpu_2x2x2; do
  grep -h "mean step time" "$WORK/$name.log" 2>/dev/null | sed "s/^/$name: /"
done

echo
log "done in $(( $(date +%s) - START )) s"
if ((${#failures[@]})); then
  echo "gpu_check: ${#failures[@]} failed: ${failures[*]}"
  exit 1
fi
echo "gpu_check: every check passed"

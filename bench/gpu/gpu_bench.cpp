//===- gpu_bench.cpp - the CUDA backend's kernels beside their peers ---------===//
//
// UNVERIFIED: written and compiled without a GPU; its numbers exist only once
// scripts/gpu_check.sh has run it on one. Tables, not tests:
//
//   GEMM       ernie.matmul (the CUDA device's kernel: cuBLASLt) beside
//              cublasGemmEx called directly on the same buffers, bf16 and
//              f32 in, f32 accumulate; TFLOP/s and the ratio (goal >= 0.95);
//   FP8        ernie.scaled_matmul (cuBLASLt FP8, e4m3, scale pointers)
//              beside the bf16 GEMM of the same size (goal >= 1.3x);
//   attention  ernie.attention and ernie.attention_grad, bf16, head dim 128,
//              batch x seq = 16k tokens, 16 heads (FlashAttention-3's
//              benchmark shapes), TFLOP/s beside FlashAttention-2 and -3 as
//              published for an H100 SXM5 (FA3 paper, arXiv:2407.08608,
//              forward, no mask; values read from its figure).
//
// Kernels run through the device interface (Device::kernelFor) on one
// stream, timed with CUDA events after warm-up.
//
//===----------------------------------------------------------------------===//

#include "ernie/runtime/Device.h"
#include "ernie/runtime/FloatConvert.h"
#include "ernie/runtime/Kernel.h"
#include "ernie/runtime/Program.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

using namespace ernie::runtime;

namespace {

Device *device = nullptr;
Stream stream;

void require(cudaError_t status, const char *what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "gpu_bench: %s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

/// A device tensor of small pseudo-random values of `type`.
DeviceTensor tensor(DType type, std::vector<int64_t> shape, uint32_t seed) {
  HostTensor wide(DType::F32, shape);
  uint32_t s = seed * 2654435761u + 1;
  for (int64_t i = 0; i < wide.numElements(); ++i) {
    s = s * 1664525u + 1013904223u;
    wide.as<float>()[i] = float(s >> 8) / float(1 << 24) - 0.5f;
  }
  return DeviceTensor::upload(*device, convert(wide, type));
}

/// Milliseconds per call of `fn` on the stream: warm-up, then at least
/// `minIterations` calls and about `budgetMs` of them, timed by events.
double timeIt(const std::function<void()> &fn, int minIterations = 5,
              double budgetMs = 300) {
  StreamGuard guard(stream);
  fn();
  device->synchronize(stream);
  Event a = device->createEvent(), b = device->createEvent();
  device->record(a, stream);
  fn();
  device->record(b, stream);
  double once = std::max(0.001, double(device->elapsedMilliseconds(a, b)));
  int iterations = std::max(minIterations, int(budgetMs / once));
  iterations = std::min(iterations, 200);
  device->record(a, stream);
  for (int i = 0; i < iterations; ++i)
    fn();
  device->record(b, stream);
  double ms = device->elapsedMilliseconds(a, b) / iterations;
  device->destroyEvent(a);
  device->destroyEvent(b);
  return ms;
}

/// The device's kernel of `op` (a fused body is not needed here).
const Kernel &kernel(const std::string &op) {
  static std::vector<std::unique_ptr<Instruction>> keep;
  keep.push_back(std::make_unique<Instruction>());
  keep.back()->op = op;
  keep.back()->kernel = findCpuKernel(op);
  std::shared_ptr<const Kernel> holder;
  const Kernel *k = device->kernelFor(*keep.back(), holder);
  if (!k) {
    std::fprintf(stderr, "gpu_bench: %s has no kernel for %s\n",
                 device->describe().c_str(), op.c_str());
    std::exit(1);
  }
  return *k;
}

double tflops(double flops, double ms) { return flops / (ms * 1e-3) / 1e12; }

void gemms(cublasHandle_t handle) {
  std::printf("\n== GEMM: ernie.matmul (cuBLASLt) vs cublasGemmEx, row-major "
              "[m,k] x [k,n] ==\n");
  std::printf("%-6s %6s %6s %6s | %10s %10s | %6s\n", "type", "m", "n", "k",
              "ernie TF/s", "cuBLAS TF/s", "ratio");
  struct Size {
    int64_t m, n, k;
  };
  for (DType type : {DType::BF16, DType::F32})
    for (Size s : {Size{4096, 4096, 4096}, Size{8192, 8192, 8192},
                   Size{16384, 4096, 14336}, Size{16384, 14336, 4096}}) {
      if (type == DType::F32 && s.m > 4096)
        continue; // f32 (no TF32) is slow; one size shows where it stands
      DeviceTensor a = tensor(type, {s.m, s.k}, 1), b = tensor(type, {s.k, s.n}, 2),
                   c(*device, type, {s.m, s.n});
      const Kernel &mm = kernel("ernie.matmul");
      Attrs attrs;
      double ernie = timeIt([&] { mm({a.view(), b.view()}, {c.view()}, attrs); });
      // Row-major C = A B as column-major C^T = B^T A^T.
      cudaDataType_t t = type == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
      float one = 1, zero = 0;
      cublasSetStream(handle, static_cast<cudaStream_t>(stream.handle));
      double cublas = timeIt([&] {
        cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, int(s.n), int(s.m),
                     int(s.k), &one, b.buffer.data(), t, int(s.n),
                     a.buffer.data(), t, int(s.k), &zero, c.buffer.data(), t,
                     int(s.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      });
      double flops = 2.0 * s.m * s.n * s.k;
      std::printf("%-6s %6lld %6lld %6lld | %10.1f %10.1f | %6.3f\n",
                  std::string(name(type)).c_str(), (long long)s.m,
                  (long long)s.n, (long long)s.k, tflops(flops, ernie),
                  tflops(flops, cublas), cublas / ernie);
    }
}

void fp8() {
  std::printf("\n== FP8: ernie.scaled_matmul (e4m3, cuBLASLt FP8, bf16 out) vs "
              "ernie.matmul bf16 ==\n");
  std::printf("%6s %6s %6s | %10s %10s | %8s\n", "m", "n", "k", "fp8 TF/s",
              "bf16 TF/s", "speed-up");
  for (int64_t n : {4096, 8192}) {
    int64_t m = n, k = n;
    DeviceTensor a = tensor(DType::F8E4M3FN, {m, k}, 3),
                 b = tensor(DType::F8E4M3FN, {n, k}, 4), // given transposed: TN
        sa = tensor(DType::F32, {}, 5), sb = tensor(DType::F32, {}, 6),
                 c(*device, DType::BF16, {m, n});
    const Kernel &smm = kernel("ernie.scaled_matmul");
    Attrs attrs{{"transpose_b", true}};
    double f8 = timeIt([&] {
      smm({a.view(), b.view(), sa.view(), sb.view()}, {c.view()}, attrs);
    });
    DeviceTensor ab = tensor(DType::BF16, {m, k}, 7), bb = tensor(DType::BF16, {n, k}, 8);
    const Kernel &mm = kernel("ernie.matmul");
    double bf = timeIt([&] { mm({ab.view(), bb.view()}, {c.view()}, attrs); });
    double flops = 2.0 * m * n * k;
    std::printf("%6lld %6lld %6lld | %10.1f %10.1f | %8.2f\n", (long long)m,
                (long long)n, (long long)k, tflops(flops, f8), tflops(flops, bf),
                bf / f8);
  }
}

void attention() {
  std::printf("\n== attention: bf16, head dim 128, 16 heads, batch x seq = 16k "
              "(TFLOP/s; FA2/FA3: published, H100 SXM5, forward, no mask) ==\n");
  std::printf("%6s %6s %-7s | %9s %9s | %7s %7s\n", "seq", "batch", "mask",
              "fwd TF/s", "bwd TF/s", "FA2 fwd", "FA3 fwd");
  struct Published {
    int64_t seq;
    int fa2, fa3;
  };
  // Read from the FA3 paper's forward-speed figure (head dim 128, no mask).
  const Published published[] = {{1024, 350, 565}, {4096, 368, 638},
                                 {16384, 370, 648}};
  const int64_t heads = 16, dim = 128;
  for (Published p : published)
    for (bool causal : {false, true}) {
      int64_t seq = p.seq, batch = 16384 / seq;
      std::vector<int64_t> shape{batch, seq, heads, dim};
      DeviceTensor q = tensor(DType::BF16, shape, 11), k = tensor(DType::BF16, shape, 12),
                   v = tensor(DType::BF16, shape, 13), o(*device, DType::BF16, shape),
                   dout = tensor(DType::BF16, shape, 14), dq(*device, DType::BF16, shape),
                   dk(*device, DType::BF16, shape), dv(*device, DType::BF16, shape);
      Attrs attrs{{"causal", causal}};
      const Kernel &fwd = kernel("ernie.attention"), &bwd = kernel("ernie.attention_grad");
      double f = timeIt([&] { fwd({q.view(), k.view(), v.view()}, {o.view()}, attrs); },
                        2, 500);
      double b = timeIt([&] {
        bwd({q.view(), k.view(), v.view(), dout.view()},
            {dq.view(), dk.view(), dv.view()}, attrs);
      }, 2, 500);
      // FlashAttention's counting: 4 b h s^2 d forward (halved under a
      // causal mask), 2.5 times that backward.
      double flops = 4.0 * batch * heads * seq * seq * dim / (causal ? 2 : 1);
      std::printf("%6lld %6lld %-7s | %9.1f %9.1f | %7s %7s\n", (long long)seq,
                  (long long)batch, causal ? "causal" : "none", tflops(flops, f),
                  tflops(2.5 * flops, b),
                  causal ? "-" : std::to_string(p.fa2).c_str(),
                  causal ? "-" : std::to_string(p.fa3).c_str());
    }
}

} // namespace

int main() {
  std::string reason;
  if (cudaDeviceCount(&reason) == 0) {
    std::fprintf(stderr, "gpu_bench: %s\n", reason.c_str());
    return 1;
  }
  std::shared_ptr<Device> cuda = openDevice("cuda");
  device = cuda.get();
  stream = device->createStream();
  std::printf("gpu_bench on %s (the CUDA backend is unverified until this "
              "runs)\n", device->describe().c_str());
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "gpu_bench: cublasCreate failed\n");
    return 1;
  }
  try {
    gemms(handle);
    fp8();
    attention();
  } catch (const std::exception &e) {
    std::fprintf(stderr, "gpu_bench: %s\n", e.what());
    return 1;
  }
  cublasDestroy(handle);
  require(cudaDeviceSynchronize(), "the end");
  device->destroyStream(stream);
  return 0;
}

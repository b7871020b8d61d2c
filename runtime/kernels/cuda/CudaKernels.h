//===- CudaKernels.h - the CUDA kernel table and device helpers --*- C++ -*-===//
//
// UNVERIFIED ON A GPU: this code compiles and links on machines without one
// (CI), but no line of it has yet run on a GPU. scripts/gpu_check.sh runs
// its tests (each CUDA kernel against the CPU kernel) where one is visible.
//
// What the CUDA device (CudaDevice.cpp) dispatches to: kernels by op name
// with the CPU kernels' signature (Kernel.h) and semantics, launched on the
// calling thread's current stream (Device.h's currentStream()), and the data
// operations the executor and the shared-device engine need. Kernels take
// every element type as stored (f16, bf16 and fp8 are loaded to f32, computed
// and rounded once on store, as the CPU's narrow-float wrapper does) and are
// deterministic: no reduction whose order depends on timing (no atomics).
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_KERNELS_CUDA_CUDAKERNELS_H
#define ERNIE_RUNTIME_KERNELS_CUDA_CUDAKERNELS_H

#include "ernie/runtime/Communicator.h"
#include "ernie/runtime/Kernel.h"

#include <cuda_runtime_api.h>

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace ernie::runtime::cuda {

/// The calling thread's current stream (Device.h), as a cudaStream_t.
cudaStream_t stream();

/// Throws KernelError ("<what>: <CUDA's message>") when `status` failed.
void check(cudaError_t status, const char *what);

/// Stream-ordered scratch on the current device (the device's pool: no
/// cudaMalloc on the hot path), freed in stream order.
class Scratch {
public:
  explicit Scratch(size_t bytes);
  ~Scratch();
  Scratch(const Scratch &) = delete;
  Scratch &operator=(const Scratch &) = delete;
  void *data() const { return data_; }
  template <typename T> T *as() const { return static_cast<T *>(data_); }

private:
  void *data_ = nullptr;
};

/// A flag a kernel raises on a data error (an index out of range, an integer
/// division by zero); raised() waits for the stream and reads it.
class ErrorFlag {
public:
  ErrorFlag();
  int *device() const { return flag_.as<int>(); }
  /// The kernel's value (0: none), after the stream's work so far.
  int raised() const;

private:
  Scratch flag_;
};

struct Registry : std::map<std::string, Kernel, std::less<>> {};

void registerElementwiseKernels(Registry &r); // Kernels.cu
void registerLinalgKernels(Registry &r);      // Kernels.cu
void registerShapeKernels(Registry &r);       // Kernels.cu
void registerTransformerKernels(Registry &r); // Kernels.cu
void registerAttentionKernels(Registry &r);   // Attention.cu
void registerGemmKernels(Registry &r);        // Gemm.cpp

/// The CUDA kernel of `op`, or null.
const Kernel *findKernel(std::string_view op);
std::vector<std::string> kernelNames();
/// The kernel of an ernie.fused body (Kernels.cu): the CPU's compile step
/// validates and lowers it, a device interpreter walks it.
Kernel makeFusedKernel(const FusedBody &body);

// Data operations of the device (Kernels.cu), on the current stream.
/// For every coordinate c of `shape`: the element at dst + dstBase +
/// sum_d c_d * dstStrides[d] becomes the one at src + srcBase + sum_d c_d *
/// srcStrides[d] (offsets and strides in elements of `elementBytes`). Block
/// copies, transposes, broadcasts, slices and pads are this.
void copyStrided(void *dst, int64_t dstBase,
                 const std::vector<int64_t> &dstStrides, const void *src,
                 int64_t srcBase, const std::vector<int64_t> &srcStrides,
                 const std::vector<int64_t> &shape, size_t elementBytes);
/// Communicator.h's reduceInOrder (at most kMaxReduceInputs inputs).
void reduceInOrder(const std::vector<const void *> &inputs,
                   const std::vector<void *> &outputs, size_t count,
                   DType type, ReduceOp op);
constexpr size_t kMaxReduceInputs = 64;
/// ernie.cast of n elements.
void convert(const void *src, DType from, void *dst, DType to, size_t n);
/// Integer matmul (i32/i64), each output a loop over k in order, as the
/// CPU's (Kernels.cu).
void integerMatmul(DType type, bool ta, bool tb, int64_t m, int64_t n,
                   int64_t k, int64_t batches, bool sharedRhs, const void *a,
                   const void *b, void *d);
/// out[i] = acc[i] * (*scaleA * *scaleB) in f32, rounded once to `type`:
/// scaled_matmul's scaling on the CPU (Kernels.cu).
void scaleInto(const float *acc, const float *scaleA, const float *scaleB,
               void *out, DType type, int64_t n);

} // namespace ernie::runtime::cuda

#endif // ERNIE_RUNTIME_KERNELS_CUDA_CUDAKERNELS_H

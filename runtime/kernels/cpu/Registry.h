//===- Registry.h - how CPU kernel files add themselves ----------*- C++ -*-===//

#ifndef ERNIE_RUNTIME_KERNELS_CPU_REGISTRY_H
#define ERNIE_RUNTIME_KERNELS_CPU_REGISTRY_H

#include "ernie/runtime/Kernel.h"

#include <map>
#include <string>

namespace ernie::runtime::cpu {

using Registry = std::map<std::string, Kernel, std::less<>>;

void registerElementwiseKernels(Registry &registry);
void registerLinalgKernels(Registry &registry);
void registerShapeKernels(Registry &registry);
void registerIndexingKernels(Registry &registry);
void registerTransformerKernels(Registry &registry);
void registerOptimizerKernels(Registry &registry);

/// Calls `fn(T{})` with T the C++ type of a float dtype (f32 or f64).
template <typename Fn> void dispatchFloat(DType type, Fn fn) {
  switch (type) {
  case DType::F32:
    return fn(float{});
  case DType::F64:
    return fn(double{});
  default:
    throw KernelError(std::string("no CPU kernel for element type ") +
                      std::string(name(type)) +
                      " (bf16/f16/fp8 compute through a cast to f32)");
  }
}

/// As dispatchFloat, plus i32/i64.
template <typename Fn> void dispatchNumeric(DType type, Fn fn) {
  switch (type) {
  case DType::I64:
    return fn(int64_t{});
  case DType::I32:
    return fn(int32_t{});
  default:
    return dispatchFloat(type, fn);
  }
}

/// Row-major strides of `shape`.
inline std::vector<int64_t> stridesOf(const std::vector<int64_t> &shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d)
    s[d] = s[d + 1] * shape[d + 1];
  return s;
}

/// Element `i` of an i32/i64 index tensor, as int64.
int64_t indexAt(const TensorView &v, int64_t i);
/// The one element of an f32/f64 scalar tensor (a learning rate, say).
double scalarAt(const TensorView &v);

inline void expectCount(const std::vector<TensorView> &views, size_t n,
                        const char *what) {
  if (views.size() != n)
    throw KernelError(std::string(what) + ": expected " + std::to_string(n) +
                      " buffers, got " + std::to_string(views.size()));
}

} // namespace ernie::runtime::cpu

#endif // ERNIE_RUNTIME_KERNELS_CPU_REGISTRY_H

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

inline void expectCount(const std::vector<TensorView> &views, size_t n,
                        const char *what) {
  if (views.size() != n)
    throw KernelError(std::string(what) + ": expected " + std::to_string(n) +
                      " buffers, got " + std::to_string(views.size()));
}

} // namespace ernie::runtime::cpu

#endif // ERNIE_RUNTIME_KERNELS_CPU_REGISTRY_H

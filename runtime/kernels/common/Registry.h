//===- Registry.h - how CPU kernel files add themselves ----------*- C++ -*-===//

#ifndef ERNIE_RUNTIME_KERNELS_CPU_REGISTRY_H
#define ERNIE_RUNTIME_KERNELS_CPU_REGISTRY_H

#include "ernie/runtime/Kernel.h"

#include <map>
#include <set>
#include <string>
#include <utility>

namespace ernie::runtime::cpu {

/// The CPU kernel table. Kernels compute in f32/f64 (and integers):
/// findCpuKernel runs them on f16, bf16 and fp8 buffers through f32 copies.
/// Those named in `everyType` take every element type as it is instead:
/// byte copies (the bits must survive), and kernels that convert element by
/// element and round once from f64 (cast, full, the optimizer updates).
struct Registry : std::map<std::string, Kernel, std::less<>> {
  std::set<std::string, std::less<>> everyType;

  /// Registers `kernel` as one that handles every element type itself.
  void addForEveryType(const std::string &op, Kernel kernel) {
    (*this)[op] = std::move(kernel);
    everyType.insert(op);
  }
};

void registerElementwiseKernels(Registry &registry);
void registerLinalgKernels(Registry &registry);
void registerShapeKernels(Registry &registry);
void registerIndexingKernels(Registry &registry);
void registerTransformerKernels(Registry &registry);
void registerOptimizerKernels(Registry &registry);
void registerMoeKernels(Registry &registry);

/// Calls `fn(T{})` with T the C++ type of a float dtype (f32 or f64).
/// Narrow floats never get here through findCpuKernel.
template <typename Fn> void dispatchFloat(DType type, Fn fn) {
  switch (type) {
  case DType::F32:
    return fn(float{});
  case DType::F64:
    return fn(double{});
  default:
    throw KernelError(std::string("no CPU kernel for element type ") +
                      std::string(name(type)) +
                      " (bf16/f16/fp8 reach kernels as f32 through "
                      "findCpuKernel)");
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

/// Where a data-movement op reads (or, for pad, writes): element offset
/// `base` plus sum_d c_d * strides[d] over the coordinates c of the shape it
/// walks. Shared by the CPU and CUDA kernels of these ops.
struct StridedView {
  int64_t base = 0;
  std::vector<int64_t> strides;
};
/// transpose: the result's coordinates read the input through `perm`.
inline StridedView transposeView(const std::vector<int64_t> &inShape,
                                 const std::vector<int64_t> &perm) {
  std::vector<int64_t> strides = stridesOf(inShape);
  StridedView v;
  for (int64_t p : perm)
    v.strides.push_back(strides[p]);
  return v;
}
/// broadcast: input dimension i runs along result dimension dims[i], or
/// stands still where it has extent 1.
inline StridedView broadcastView(const std::vector<int64_t> &inShape,
                                 size_t outRank,
                                 const std::vector<int64_t> &dims) {
  std::vector<int64_t> strides = stridesOf(inShape);
  StridedView v{0, std::vector<int64_t>(outRank, 0)};
  for (size_t i = 0; i < dims.size(); ++i)
    if (inShape[i] != 1)
      v.strides[dims[i]] = strides[i];
  return v;
}
/// The view of a row-major `shape` that starts at coordinates `offset`
/// and moves `scale[d]` elements of dimension d per step.
inline StridedView affineView(const std::vector<int64_t> &shape,
                              const std::vector<int64_t> &offset,
                              const std::vector<int64_t> &scale) {
  std::vector<int64_t> strides = stridesOf(shape);
  StridedView v;
  for (size_t d = 0; d < strides.size(); ++d) {
    v.base += offset[d] * strides[d];
    v.strides.push_back(scale[d] * strides[d]);
  }
  return v;
}
/// slice: from `start`, every `step`th element.
inline StridedView sliceView(const std::vector<int64_t> &inShape,
                             const std::vector<int64_t> &start,
                             const std::vector<int64_t> &step) {
  return affineView(inShape, start, step);
}
/// pad: where the input's coordinates land in the result,
/// out[low + c * (interior + 1)].
inline StridedView padView(const std::vector<int64_t> &outShape,
                           const std::vector<int64_t> &low,
                           const std::vector<int64_t> &interior) {
  std::vector<int64_t> every(interior);
  for (int64_t &e : every)
    e += 1;
  return affineView(outShape, low, every);
}

/// Element `i` of an i32/i64 index tensor, as int64.
int64_t indexAt(const TensorView &v, int64_t i);
/// The one element of a float scalar tensor (a learning rate, say).
double scalarAt(const TensorView &v);
/// Element `i` of `v`, any type, as a double (exact but for i64 past 2^53).
double loadAsDouble(const TensorView &v, int64_t i);
/// Stores `x` as element `i` of `v`: floats round once to nearest even
/// (fp8 saturates), integers truncate and saturate (NaN gives 0).
void storeFromDouble(const TensorView &v, int64_t i, double x);
/// Elements [start, start + n) of `v` as doubles / stored from doubles,
/// exactly as loadAsDouble / storeFromDouble do one at a time (the type is
/// switched on once per block).
void loadBlockAsDouble(const TensorView &v, int64_t start, int64_t n,
                       double *out);
void storeBlockFromDouble(const TensorView &v, int64_t start, int64_t n,
                          const double *x);
/// Elements per block of the optimizers' and casts' f64 passes.
constexpr int64_t kDoubleBlock = 512;

inline void expectCount(const std::vector<TensorView> &views, size_t n,
                        const char *what) {
  if (views.size() != n)
    throw KernelError(std::string(what) + ": expected " + std::to_string(n) +
                      " buffers, got " + std::to_string(views.size()));
}

} // namespace ernie::runtime::cpu

#endif // ERNIE_RUNTIME_KERNELS_CPU_REGISTRY_H

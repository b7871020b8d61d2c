//===- ElementwiseMath.h - the math of each elementwise op -------*- C++ -*-===//
//
// One definition per op, shared by the per-op kernels (Elementwise.cpp) and
// the fused-loop interpreter (Fused.cpp): a fused region computes bit for
// bit what the ops it replaces compute.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_KERNELS_CPU_ELEMENTWISEMATH_H
#define ERNIE_RUNTIME_KERNELS_CPU_ELEMENTWISEMATH_H

#include <cmath>

namespace ernie::runtime::cpu::math {

template <typename T> T rsqrt(T x) { return T(1) / std::sqrt(x); }
template <typename T> T reciprocal(T x) { return T(1) / x; }
template <typename T> T sigmoid(T x) { return T(1) / (T(1) + std::exp(-x)); }
template <typename T> T silu(T x) { return x / (T(1) + std::exp(-x)); }
template <typename T> T relu(T x) { return x > 0 ? x : T(0); }
template <typename T> T abs(T x) { return x < 0 ? -x : x; }
template <typename T> T gelu(T x, bool approximate) {
  if (approximate) {
    const T k = static_cast<T>(0.7978845608028654); // sqrt(2 / pi)
    return T(0.5) * x * (T(1) + std::tanh(k * (x + T(0.044715) * x * x * x)));
  }
  return T(0.5) * x * (T(1) + std::erf(x * static_cast<T>(M_SQRT1_2)));
}

/// ernie.compare's `direction`: eq, ne, lt, le, gt, ge.
template <typename T> bool compare(int64_t direction, T a, T b) {
  switch (direction) {
  case 0: return a == b;
  case 1: return a != b;
  case 2: return a < b;
  case 3: return a <= b;
  case 4: return a > b;
  default: return a >= b;
  }
}

} // namespace ernie::runtime::cpu::math

#endif // ERNIE_RUNTIME_KERNELS_CPU_ELEMENTWISEMATH_H

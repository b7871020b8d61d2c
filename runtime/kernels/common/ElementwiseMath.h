//===- ElementwiseMath.h - the math of each elementwise op -------*- C++ -*-===//
//
// One definition per op, shared by the per-op kernels (Elementwise.cpp) and
// the fused-loop interpreter (Fused.cpp): a fused region computes bit for
// bit what the ops it replaces compute. The CUDA kernels include it too
// (ERNIE_HD marks the functions __host__ __device__ under nvcc), so their
// f32 exp, sigmoid and silu are this polynomial as well.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_KERNELS_CPU_ELEMENTWISEMATH_H
#define ERNIE_RUNTIME_KERNELS_CPU_ELEMENTWISEMATH_H

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define ERNIE_HD __host__ __device__
#else
#define ERNIE_HD
#endif

namespace ernie::runtime::cpu::math {

/// The float with these bits (a device intrinsic under nvcc).
ERNIE_HD inline float floatFromBits(int32_t bits) {
#if defined(__CUDA_ARCH__)
  return __int_as_float(bits);
#else
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
#endif
}

/// e^x in f32 as straight-line arithmetic a loop vectorises (glibc's expf
/// is a call per element): Cody-Waite reduction by ln 2 and Cephes'
/// degree-5 minimax polynomial, within 2 ulp of e^x. Results below 2^-126
/// flush to 0 (x < -87.33, where e^x is subnormal); x > 88.72 gives
/// infinity, NaN stays NaN. Only + - * and conversions: with no FMA
/// contraction every vector width computes the same bits.
ERNIE_HD inline float exponential(float x) {
  const float lo = -87.33654f, hi = 88.72283f;
  float c = x < lo ? lo : x;
  c = c > hi ? hi : c;
  // n = round(c / ln 2) by adding 1.5 * 2^23 (exact for |v| < 2^22).
  const float magic = 12582912.0f;
  const float n = (c * 1.44269504088896341f + magic) - magic;
  const float r = (c - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  // 2^n as 2^k * 2^(n - k), k = floor(n / 2): n spans [-126, 128], past
  // what one float's exponent holds at both ends.
  const int32_t whole = static_cast<int32_t>(n), k = whole >> 1;
  const int32_t bits1 = (k + 127) << 23, bits2 = (whole - k + 127) << 23;
  const float s1 = floatFromBits(bits1), s2 = floatFromBits(bits2);
  float e = (y * s1) * s2;
  // Selects, one at a time, so that the loop stays branch-free.
  e = x > hi ? INFINITY : e;
  e = x < lo ? 0.0f : e;
  e = x != x ? x : e;
  return e;
}
ERNIE_HD inline double exponential(double x) { return std::exp(x); }

template <typename T> ERNIE_HD T rsqrt(T x) { return T(1) / std::sqrt(x); }
template <typename T> ERNIE_HD T reciprocal(T x) { return T(1) / x; }
template <typename T> ERNIE_HD T sigmoid(T x) {
  return T(1) / (T(1) + exponential(-x));
}
template <typename T> ERNIE_HD T silu(T x) {
  return x / (T(1) + exponential(-x));
}
template <typename T> ERNIE_HD T relu(T x) { return x > 0 ? x : T(0); }
template <typename T> ERNIE_HD T abs(T x) { return x < 0 ? -x : x; }
template <typename T> ERNIE_HD T gelu(T x, bool approximate) {
  if (approximate) {
    const T k = static_cast<T>(0.7978845608028654); // sqrt(2 / pi)
    return T(0.5) * x * (T(1) + std::tanh(k * (x + T(0.044715) * x * x * x)));
  }
  return T(0.5) * x * (T(1) + std::erf(x * static_cast<T>(M_SQRT1_2)));
}

/// ernie.compare's `direction`: eq, ne, lt, le, gt, ge.
template <typename T> ERNIE_HD bool compare(int64_t direction, T a, T b) {
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

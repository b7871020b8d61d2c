//===- DeviceMath.cuh - element access and rounding on the GPU ---*- CUDA -*-===//
//
// UNVERIFIED ON A GPU (compiled, never run on one; see CudaKernels.h).
//
// Loading and storing every element type the runtime stores, rounding as
// FloatConvert.cpp does on the CPU: f32 -> bf16 by the same bit trick (NaN
// keeps its payload), f16 by cuda_fp16.h's round-to-nearest with the CPU's
// NaN, fp8 by cuda_fp8.h's __NV_SATFINITE conversion (the convention both
// backends share: overflow and infinities saturate, NaN is 0x7F), and from
// f64 by rounding to odd into f32 first, so every narrowing rounds once.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_KERNELS_CUDA_DEVICEMATH_CUH
#define ERNIE_RUNTIME_KERNELS_CUDA_DEVICEMATH_CUH

#include "ernie/runtime/DType.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace ernie::runtime::cuda {

/// Element type codes on the device: DType's values.
enum : int {
  kF64 = int(DType::F64),
  kF32 = int(DType::F32),
  kF16 = int(DType::F16),
  kBF16 = int(DType::BF16),
  kE4M3 = int(DType::F8E4M3FN),
  kE5M2 = int(DType::F8E5M2),
  kI64 = int(DType::I64),
  kI32 = int(DType::I32),
  kI1 = int(DType::I1),
};

__device__ inline float bf16Load(uint16_t b) {
  return __uint_as_float(uint32_t(b) << 16);
}
__device__ inline uint16_t bf16Store(float x) {
  uint32_t bits = __float_as_uint(x);
  if (isnan(x))
    return uint16_t((bits >> 16) | 0x40);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return uint16_t(bits >> 16);
}
__device__ inline float f16Load(uint16_t b) {
  return __half2float(__ushort_as_half(b));
}
__device__ inline uint16_t f16Store(float x) {
  if (isnan(x)) { // the CPU's NaN: the sign, quiet, what fits of the payload
    uint32_t bits = __float_as_uint(x);
    return uint16_t(((bits >> 16) & 0x8000) | 0x7E00 | ((bits >> 13) & 0x3FF));
  }
  return __half_as_ushort(__float2half_rn(x));
}
__device__ inline float e4m3Load(uint8_t b) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(b, __NV_E4M3)));
}
__device__ inline float e5m2Load(uint8_t b) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(b, __NV_E5M2)));
}
__device__ inline uint8_t e4m3Store(float x) {
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}
__device__ inline uint8_t e5m2Store(float x) {
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
}

/// x as a float rounded to odd (FloatConvert.h's roundToOddFloat).
__device__ inline float roundToOddFloat(double x) {
  float f = __double2float_rn(x);
  if (isnan(x) || double(f) == x)
    return f;
  if (fabs(double(f)) > fabs(x))
    f = nextafterf(f, 0.0f);
  return __uint_as_float(__float_as_uint(f) | 1u);
}

/// i as a double rounded to odd (FloatConvert.h's roundToOddDouble).
__device__ inline double roundToOddDouble(int64_t i) {
  uint64_t u = i < 0 ? uint64_t(0) - uint64_t(i) : uint64_t(i);
  const uint64_t limit = uint64_t(1) << 53;
  if (u < limit)
    return double(i);
  int drop = 0;
  while ((u >> drop) >= limit)
    ++drop;
  uint64_t kept = u >> drop;
  if (u & ((uint64_t(1) << drop) - 1))
    kept |= 1;
  double d = ldexp(double(kept), drop);
  return i < 0 ? -d : d;
}

template <typename I> __device__ inline I saturatingToInt(double x) {
  if (isnan(x))
    return 0;
  const double limit = sizeof(I) == 8 ? 9223372036854775808.0 : 2147483648.0;
  if (x >= limit)
    return sizeof(I) == 8 ? I(INT64_MAX) : I(INT32_MAX);
  if (x < -limit)
    return sizeof(I) == 8 ? I(INT64_MIN) : I(INT32_MIN);
  return I(trunc(x));
}

/// Element i of a buffer of type `t`, as a double (exact but for i64 past
/// 2^53), and a double stored as type `t` (floats round once, integers
/// truncate and saturate, NaN gives 0) — loadAsDouble / storeFromDouble.
__device__ inline double loadAny(const void *p, int t, int64_t i) {
  switch (t) {
  case kF64: return static_cast<const double *>(p)[i];
  case kF32: return static_cast<const float *>(p)[i];
  case kF16: return f16Load(static_cast<const uint16_t *>(p)[i]);
  case kBF16: return bf16Load(static_cast<const uint16_t *>(p)[i]);
  case kE4M3: return e4m3Load(static_cast<const uint8_t *>(p)[i]);
  case kE5M2: return e5m2Load(static_cast<const uint8_t *>(p)[i]);
  case kI64: return double(static_cast<const int64_t *>(p)[i]);
  case kI32: return static_cast<const int32_t *>(p)[i];
  default: return static_cast<const uint8_t *>(p)[i] ? 1.0 : 0.0;
  }
}
__device__ inline void storeAny(void *p, int t, int64_t i, double x) {
  switch (t) {
  case kF64: static_cast<double *>(p)[i] = x; return;
  case kF32: static_cast<float *>(p)[i] = __double2float_rn(x); return;
  case kF16: static_cast<uint16_t *>(p)[i] = f16Store(roundToOddFloat(x)); return;
  case kBF16: static_cast<uint16_t *>(p)[i] = bf16Store(roundToOddFloat(x)); return;
  case kE4M3: static_cast<uint8_t *>(p)[i] = e4m3Store(roundToOddFloat(x)); return;
  case kE5M2: static_cast<uint8_t *>(p)[i] = e5m2Store(roundToOddFloat(x)); return;
  case kI64: static_cast<int64_t *>(p)[i] = saturatingToInt<int64_t>(x); return;
  case kI32: static_cast<int32_t *>(p)[i] = saturatingToInt<int32_t>(x); return;
  default: static_cast<uint8_t *>(p)[i] = x != 0.0; return;
  }
}
/// Integer (and i1) element i as an int64, exactly.
__device__ inline int64_t loadInt(const void *p, int t, int64_t i) {
  switch (t) {
  case kI64: return static_cast<const int64_t *>(p)[i];
  case kI32: return static_cast<const int32_t *>(p)[i];
  default: return static_cast<const uint8_t *>(p)[i] != 0;
  }
}
/// An integer stored as type `t`: floats round once, integers saturate
/// (Elementwise.cpp's storeFromInt).
__device__ inline void storeInt(void *p, int t, int64_t i, int64_t x) {
  switch (t) {
  case kF64: static_cast<double *>(p)[i] = double(x); return;
  case kI64: static_cast<int64_t *>(p)[i] = x; return;
  case kI32:
    static_cast<int32_t *>(p)[i] =
        int32_t(x < INT32_MIN ? INT32_MIN : x > INT32_MAX ? INT32_MAX : x);
    return;
  case kI1: static_cast<uint8_t *>(p)[i] = x != 0; return;
  default: storeAny(p, t, i, roundToOddDouble(x));
  }
}

/// Typed access for the kernels that are instantiated per float type: the
/// storage type, the compute type (f32, or f64 for f64) and the conversions.
template <int T> struct Io;
template <> struct Io<kF64> {
  using Raw = double;
  using C = double;
  __device__ static C load(const Raw *p, int64_t i) { return p[i]; }
  __device__ static void store(Raw *p, int64_t i, C x) { p[i] = x; }
};
template <> struct Io<kF32> {
  using Raw = float;
  using C = float;
  __device__ static C load(const Raw *p, int64_t i) { return p[i]; }
  __device__ static void store(Raw *p, int64_t i, C x) { p[i] = x; }
};
template <> struct Io<kF16> {
  using Raw = uint16_t;
  using C = float;
  __device__ static C load(const Raw *p, int64_t i) { return f16Load(p[i]); }
  __device__ static void store(Raw *p, int64_t i, C x) { p[i] = f16Store(x); }
};
template <> struct Io<kBF16> {
  using Raw = uint16_t;
  using C = float;
  __device__ static C load(const Raw *p, int64_t i) { return bf16Load(p[i]); }
  __device__ static void store(Raw *p, int64_t i, C x) { p[i] = bf16Store(x); }
};
template <> struct Io<kE4M3> {
  using Raw = uint8_t;
  using C = float;
  __device__ static C load(const Raw *p, int64_t i) { return e4m3Load(p[i]); }
  __device__ static void store(Raw *p, int64_t i, C x) { p[i] = e4m3Store(x); }
};
template <> struct Io<kE5M2> {
  using Raw = uint8_t;
  using C = float;
  __device__ static C load(const Raw *p, int64_t i) { return e5m2Load(p[i]); }
  __device__ static void store(Raw *p, int64_t i, C x) { p[i] = e5m2Store(x); }
};

/// maximumOf / minimumOf (DType.h) on the device: a NaN operand wins.
template <typename T> __device__ inline T maximumOf(T a, T b) {
  if (isnan(double(a)) || isnan(double(b)))
    return a + b;
  return a > b ? a : b;
}
template <typename T> __device__ inline T minimumOf(T a, T b) {
  if (isnan(double(a)) || isnan(double(b)))
    return a + b;
  return a < b ? a : b;
}

/// A grid-stride loop's launch: enough blocks of 256 threads for n
/// elements, at most 65535 * 4 (the loop covers the rest).
inline unsigned gridFor(int64_t n) {
  int64_t blocks = (n + 255) / 256;
  if (blocks < 1)
    blocks = 1;
  return unsigned(blocks > 262140 ? 262140 : blocks);
}

#define ERNIE_GRID_STRIDE(i, n)                                                \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);    \
       i += int64_t(gridDim.x) * blockDim.x)

} // namespace ernie::runtime::cuda

#endif // ERNIE_RUNTIME_KERNELS_CUDA_DEVICEMATH_CUH

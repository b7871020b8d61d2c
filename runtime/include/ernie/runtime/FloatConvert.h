//===- FloatConvert.h - f16, bf16 and fp8 to and from f32/f64 ----*- C++ -*-===//
//
// The one implementation of the narrow float formats the runtime stores:
// f16 (IEEE half), bf16, f8E4M3FN and f8E5M2. Every code decodes exactly to
// an f32. Encoding rounds to nearest, ties to even, with subnormals; NaN
// stays NaN (f16 and bf16 keep its sign; fp8 gives NVIDIA's canonical NaN
// 0x7F). From f64 it rounds once (see roundToOddFloat), never
// f64 -> f32 -> narrow.
//
// Overflow: f16 and bf16 are IEEE and round to infinity. The fp8 formats
// saturate to their largest finite value, infinities included — +-448 for
// f8E4M3FN (which has no infinity), +-57344 for f8E5M2 — exactly as NVIDIA's
// __NV_SATFINITE conversions (cuda_fp8.h, the GPU's cvt.satfinite) do, so the
// CPU and CUDA backends give the same codes for every input
// (Fp8NvidiaConventionTest checks every bf16 pattern and random f32s). An
// f8E5M2 infinity code (0x7C/0xFC) still decodes to +-inf.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_FLOATCONVERT_H
#define ERNIE_RUNTIME_FLOATCONVERT_H

#include "ernie/runtime/DType.h"

#include <cstdint>

namespace ernie::runtime {

float bf16ToFloat(uint16_t bits);
float f16ToFloat(uint16_t bits);
float f8E4M3FNToFloat(uint8_t bits);
float f8E5M2ToFloat(uint8_t bits);

uint16_t floatToBf16(float x);
uint16_t floatToF16(float x);
uint8_t floatToF8E4M3FN(float x);
uint8_t floatToF8E5M2(float x);

uint16_t doubleToBf16(double x);
uint16_t doubleToF16(double x);
uint8_t doubleToF8E4M3FN(double x);
uint8_t doubleToF8E5M2(double x);

/// x as a float rounded to odd: truncated toward zero, with the last bit set
/// when inexact. Rounding that to any format at least two bits narrower
/// equals rounding x directly; going through the nearest float can round
/// twice (1 + 2^-8 + 2^-30 lands on the bf16 tie 1 + 2^-8 and then on 1).
float roundToOddFloat(double x);
/// i as a double rounded to odd, for the same reason: an i64 above 2^53
/// converted to the nearest double and then to f32 can round twice.
double roundToOddDouble(int64_t i);

/// f16, bf16 and the fp8 types: stored narrow, computed in f32 on the CPU.
bool isNarrowFloat(DType type);
/// n elements of a narrow-float buffer, widened exactly.
void narrowToFloat(DType type, const void *src, float *dst, int64_t n);
/// n floats rounded (once, to nearest even) into a narrow-float buffer.
void floatToNarrow(DType type, const float *src, void *dst, int64_t n);

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_FLOATCONVERT_H

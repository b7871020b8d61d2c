//===- Fp8NvidiaConventionTest.cpp - CPU narrow floats vs cuda_fp8.h --------===//
//
// The CPU and CUDA backends must give the same codes. The CUDA kernels
// convert with cuda_fp8.h / cuda_bf16.h / cuda_fp16.h (the GPU's cvt
// instructions, __NV_SATFINITE for fp8); those headers' host functions
// implement the same conversions and compile with the host compiler, so the
// runtime's own conversions (FloatConvert.h) are checked against them here,
// without a GPU: every bf16 bit pattern, every fp8 code decoded, and many
// random f32 and f64 values (uniform bit patterns, values around each
// format's ties and overflow boundary, and the specials), both fp8 formats.
// Skipped, saying why, when the CUDA headers were not found at configure.
//
//===----------------------------------------------------------------------===//

#include "ernie/runtime/FloatConvert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#ifdef ERNIE_HAVE_CUDA_FP8_HEADER
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

using namespace ernie::runtime;

#ifdef ERNIE_HAVE_CUDA_FP8_HEADER

namespace {

uint32_t bitsOf(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}
float floatOf(uint32_t b) {
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

struct Fp8Format {
  const char *name;
  __nv_fp8_interpretation_t nv;
  uint8_t (*fromFloat)(float);
  uint8_t (*fromDouble)(double);
  float (*toFloat)(uint8_t);
  double max, midpoint; // largest finite value, overflow midpoint
};

const Fp8Format kFormats[] = {
    {"f8E4M3FN", __NV_E4M3, floatToF8E4M3FN, doubleToF8E4M3FN,
     f8E4M3FNToFloat, 448, 464},
    {"f8E5M2", __NV_E5M2, floatToF8E5M2, doubleToF8E5M2, f8E5M2ToFloat,
     57344, 61440},
};

uint8_t nvFromFloat(const Fp8Format &f, float x) {
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, f.nv);
}

/// Random f32 inputs: a third uniform bit patterns, the rest dense around
/// the format's representable values (ties and their neighbours), its
/// subnormal range and its overflow boundary.
std::vector<float> randomFloats(const Fp8Format &f, size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<float> xs;
  xs.reserve(n + 32);
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::max(),
                  -std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::denorm_min(),
                  std::numeric_limits<float>::quiet_NaN(),
                  -std::numeric_limits<float>::quiet_NaN(),
                  float(f.max), float(f.midpoint), -float(f.midpoint),
                  std::nextafter(float(f.midpoint), 0.0f),
                  std::nextafter(float(f.midpoint), inf)})
    xs.push_back(x);
  std::uniform_int_distribution<int> code(0, 255), offset(-4, 4);
  while (xs.size() < n) {
    switch (gen() % 3) {
    case 0:
      xs.push_back(floatOf(gen()));
      break;
    case 1: {
      // Midway between two neighbouring codes, nudged by a few ulps.
      uint8_t c = static_cast<uint8_t>(code(gen) & 0x7f);
      float a = f.toFloat(c), b = f.toFloat(static_cast<uint8_t>(c + 1));
      if (!std::isfinite(a) || !std::isfinite(b))
        continue;
      float mid = a + (b - a) / 2;
      uint32_t bits = bitsOf(mid) + offset(gen);
      xs.push_back((gen() & 1 ? -1.0f : 1.0f) * floatOf(bits));
      break;
    }
    default: {
      // Anywhere from below the smallest subnormal to past the maximum.
      std::uniform_real_distribution<double> e(-22, 18);
      xs.push_back(static_cast<float>((gen() & 1 ? -1 : 1) * std::exp2(e(gen))));
    }
    }
  }
  return xs;
}

} // namespace

TEST(Fp8NvidiaConvention, EveryBf16PatternConvertsAsCudaFp8Does) {
  for (const Fp8Format &f : kFormats) {
    int64_t mismatches = 0, saturated = 0, nans = 0;
    for (uint32_t b = 0; b < 65536; ++b) {
      __nv_bfloat16_raw raw;
      raw.x = static_cast<unsigned short>(b);
      uint8_t want = __nv_cvt_bfloat16raw_to_fp8(raw, __NV_SATFINITE, f.nv);
      uint8_t got = f.fromFloat(bf16ToFloat(static_cast<uint16_t>(b)));
      float x = bf16ToFloat(static_cast<uint16_t>(b));
      nans += std::isnan(x);
      saturated += !std::isnan(x) && std::fabs(x) >= f.midpoint;
      if (got != want && ++mismatches <= 10)
        ADD_FAILURE() << f.name << ": bf16 0x" << std::hex << b << " -> ernie 0x"
                      << int(got) << ", cuda_fp8.h 0x" << int(want);
    }
    EXPECT_EQ(mismatches, 0) << f.name;
    EXPECT_GT(saturated, 1000) << f.name; // the overflow rule was exercised
    EXPECT_GT(nans, 100) << f.name;
  }
}

TEST(Fp8NvidiaConvention, RandomFloatsConvertAsCudaFp8Does) {
  for (const Fp8Format &f : kFormats) {
    std::vector<float> xs = randomFloats(f, 1000000, 17);
    int64_t mismatches = 0;
    for (float x : xs) {
      uint8_t want = nvFromFloat(f, x), got = f.fromFloat(x);
      if (got != want && ++mismatches <= 10)
        ADD_FAILURE() << f.name << ": f32 0x" << std::hex << bitsOf(x) << " ("
                      << x << ") -> ernie 0x" << int(got) << ", cuda_fp8.h 0x"
                      << int(want);
    }
    EXPECT_EQ(mismatches, 0) << f.name << " over " << xs.size() << " values";
    // +-inf saturate (the convention ernie adopted from NVIDIA).
    const float inf = std::numeric_limits<float>::infinity();
    EXPECT_EQ(f.fromFloat(inf), nvFromFloat(f, inf));
    EXPECT_EQ(f.fromFloat(-inf), nvFromFloat(f, -inf));
    EXPECT_EQ(f.toFloat(f.fromFloat(inf)), f.max) << f.name;
  }
}

TEST(Fp8NvidiaConvention, DoublesRoundOnceAsCudaFp8Does) {
  std::mt19937_64 gen(23);
  for (const Fp8Format &f : kFormats) {
    int64_t mismatches = 0;
    for (int i = 0; i < 200000; ++i) {
      double x;
      if (i % 2) {
        uint64_t bits = gen();
        std::memcpy(&x, &bits, 8);
      } else {
        // Just off a tie, where rounding through f32 would round twice.
        uint8_t c = static_cast<uint8_t>(gen() & 0x7f);
        double a = f.toFloat(c), b = f.toFloat(static_cast<uint8_t>(c + 1));
        if (!std::isfinite(a) || !std::isfinite(b))
          continue;
        x = (a + (b - a) / 2) * (1 + std::ldexp(double(int(gen() % 9) - 4), -40));
      }
      uint8_t want = __nv_cvt_double_to_fp8(x, __NV_SATFINITE, f.nv);
      uint8_t got = f.fromDouble(x);
      // cuda_fp8.h's f64 path keeps a NaN's sign where its f32 path and the
      // cvt instruction give the canonical 0x7F; ernie's f64 conversions
      // round to odd into f32 first (on both backends), so NaN is 0x7F.
      if (std::isnan(x)) {
        EXPECT_EQ(got, 0x7F) << f.name;
        EXPECT_TRUE(std::isnan(f.toFloat(want))) << f.name;
        continue;
      }
      if (got != want && ++mismatches <= 10)
        ADD_FAILURE() << f.name << ": f64 " << x << " -> ernie 0x" << std::hex
                      << int(got) << ", cuda_fp8.h 0x" << int(want);
    }
    EXPECT_EQ(mismatches, 0) << f.name;
  }
}

TEST(Fp8NvidiaConvention, EveryCodeDecodesAsCudaFp8Does) {
  for (const Fp8Format &f : kFormats)
    for (uint32_t c = 0; c < 256; ++c) {
      __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<uint8_t>(c), f.nv);
      float want = __half2float(__half(h));
      float got = f.toFloat(static_cast<uint8_t>(c));
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << f.name << " code " << c;
        continue;
      }
      EXPECT_EQ(bitsOf(got), bitsOf(want)) << f.name << " code " << c;
    }
}

TEST(Fp8NvidiaConvention, Bf16AndF16RoundAsCudaHeadersDo) {
  std::mt19937 gen(31);
  int64_t mismatches = 0;
  for (int i = 0; i < 1000000; ++i) {
    float x = floatOf(gen());
    if (i % 2)
      x = static_cast<float>(std::ldexp(double(gen()) / 4294967296.0 - 0.5,
                                        int(gen() % 60) - 30));
    __nv_bfloat16 b = __float2bfloat16_rn(x);
    __half h = __float2half_rn(x);
    uint16_t wantB = __nv_bfloat16_raw(b).x, wantH = __half_raw(h).x;
    if (std::isnan(x)) {
      // Both keep a NaN; payloads are not part of the convention.
      EXPECT_TRUE(std::isnan(bf16ToFloat(floatToBf16(x))));
      EXPECT_TRUE(std::isnan(f16ToFloat(floatToF16(x))));
      continue;
    }
    if ((floatToBf16(x) != wantB || floatToF16(x) != wantH) && ++mismatches <= 10)
      ADD_FAILURE() << "f32 0x" << std::hex << bitsOf(x) << ": bf16 ernie 0x"
                    << floatToBf16(x) << " cuda 0x" << wantB << ", f16 ernie 0x"
                    << floatToF16(x) << " cuda 0x" << wantH;
  }
  EXPECT_EQ(mismatches, 0);
}

#else

TEST(Fp8NvidiaConvention, EveryBf16PatternConvertsAsCudaFp8Does) {
  GTEST_SKIP() << "cuda_fp8.h not found at configure (no CUDA toolkit): the "
                  "CPU conversions cannot be compared with NVIDIA's";
}

#endif

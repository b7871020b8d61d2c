//===- FloatConvert.cpp - f16, bf16 and fp8 to and from f32/f64 -------------===//
//
// bf16 is the top half of an f32, so it gets the usual bit tricks. f16 and
// the fp8 formats share one encoder and one decoder parameterised by the
// format's exponent and mantissa widths and its specials.
//
//===----------------------------------------------------------------------===//

#include "ernie/runtime/FloatConvert.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace ernie::runtime {

namespace {

uint32_t bitsOf(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

float floatOf(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

struct Format {
  int exponentBits, mantissaBits;
  // An all-ones exponent is infinity (mantissa 0) or NaN, as in IEEE;
  // otherwise (E4M3FN) only S.1111.111 is NaN and there is no infinity.
  bool ieeeSpecials;
  // Finite values past the largest finite one become it, not infinity.
  bool saturate;

  constexpr int bias() const { return (1 << (exponentBits - 1)) - 1; }
  constexpr uint32_t signBit() const {
    return 1u << (exponentBits + mantissaBits);
  }
  constexpr uint32_t expOnes() const {
    return ((1u << exponentBits) - 1) << mantissaBits;
  }
  constexpr uint32_t mantissaMask() const {
    return (1u << mantissaBits) - 1;
  }
  constexpr uint32_t infinity() const { return expOnes(); }
  constexpr uint32_t maxFinite() const {
    return ieeeSpecials ? expOnes() - 1 : expOnes() | (mantissaMask() - 1);
  }
  constexpr uint32_t quietNaN() const {
    return ieeeSpecials ? expOnes() | (1u << (mantissaBits - 1))
                        : expOnes() | mantissaMask();
  }
};

constexpr Format kF16{5, 10, true, false};
constexpr Format kE4M3FN{4, 3, false, true};
constexpr Format kE5M2{5, 2, true, true};

uint32_t encode(const Format &f, float x) {
  const int M = f.mantissaBits;
  uint32_t bits = bitsOf(x);
  uint32_t sign = (bits >> 31) ? f.signBit() : 0;
  uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) {
    // fp8: NVIDIA's canonical NaN, S.1111.111 with the sign cleared (0x7F
    // in both formats), as cvt.satfinite and cuda_fp8.h give it. f16 keeps
    // the sign and what fits of the payload, as the bf16 truncation does.
    if (f.saturate)
      return f.expOnes() | f.mantissaMask();
    uint32_t payload = f.ieeeSpecials ? (magnitude >> (23 - M)) & f.mantissaMask() : 0;
    return sign | f.quietNaN() | payload;
  }
  // Infinities saturate like any overflow in the saturating (fp8) formats:
  // NVIDIA's __NV_SATFINITE conversions (cuda_fp8.h) do, so the GPU's cvt
  // instructions and this agree on every input.
  if (magnitude == 0x7F800000u)
    return sign | (f.saturate ? f.maxFinite() : f.infinity());

  // magnitude = mantissa * 2^(exponent - 23), with the implicit bit for
  // normal f32 values.
  const int minExponent = 1 - f.bias();
  uint32_t mantissa = magnitude & 0x7FFFFFu;
  int exponent = -126;
  if (magnitude >> 23) {
    mantissa |= 0x800000u;
    exponent = static_cast<int>(magnitude >> 23) - 127;
  }
  // Keep M bits after the leading one, or fewer below the normal range:
  // subnormal codes count units of 2^(minExponent - M).
  int shift = 23 - M;
  uint32_t exponentField = 0;
  if (exponent >= minExponent)
    exponentField = static_cast<uint32_t>(exponent + f.bias() - 1);
  else
    shift += minExponent - exponent;
  if (shift >= 25) // below half the smallest subnormal
    return sign;
  uint32_t kept = mantissa >> shift, rest = mantissa & ((1u << shift) - 1),
           half = 1u << (shift - 1);
  if (rest > half || (rest == half && (kept & 1)))
    ++kept;
  // `kept` still holds the leading one (or is the subnormal count), so a
  // carry out of the mantissa moves into the exponent by itself.
  uint32_t code = (exponentField << M) + kept;
  if (code > f.maxFinite())
    code = f.saturate ? f.maxFinite() : f.infinity();
  return sign | code;
}

float decode(const Format &f, uint32_t code) {
  const int M = f.mantissaBits;
  uint32_t exponent = (code & f.expOnes()) >> M, mantissa = code & f.mantissaMask();
  uint32_t ones = f.expOnes() >> M;
  float magnitude;
  if (f.ieeeSpecials && exponent == ones)
    magnitude = mantissa == 0 ? std::numeric_limits<float>::infinity()
                              : floatOf(0x7FC00000u | (mantissa << (23 - M)));
  else if (!f.ieeeSpecials && exponent == ones && mantissa == f.mantissaMask())
    magnitude = std::numeric_limits<float>::quiet_NaN();
  else if (exponent == 0)
    magnitude = std::ldexp(static_cast<float>(mantissa), 1 - f.bias() - M);
  else
    magnitude = floatOf((exponent - f.bias() + 127) << 23 | mantissa << (23 - M));
  return floatOf(bitsOf(magnitude) | ((code & f.signBit()) ? 0x80000000u : 0));
}

/// Every fp8 code decoded once; conversions of whole buffers read these.
std::array<float, 256> decodeTable(const Format &f) {
  std::array<float, 256> table;
  for (uint32_t code = 0; code < 256; ++code)
    table[code] = decode(f, code);
  return table;
}
const std::array<float, 256> &e4m3fnTable() {
  static const std::array<float, 256> table = decodeTable(kE4M3FN);
  return table;
}
const std::array<float, 256> &e5m2Table() {
  static const std::array<float, 256> table = decodeTable(kE5M2);
  return table;
}

[[noreturn]] void notNarrow(DType type) {
  throw std::invalid_argument(std::string(name(type)) +
                              " is not a narrow float type");
}

} // namespace

float bf16ToFloat(uint16_t bits) {
  return floatOf(static_cast<uint32_t>(bits) << 16);
}
float f16ToFloat(uint16_t bits) { return decode(kF16, bits); }
float f8E4M3FNToFloat(uint8_t bits) { return e4m3fnTable()[bits]; }
float f8E5M2ToFloat(uint8_t bits) { return e5m2Table()[bits]; }

uint16_t floatToBf16(float x) {
  uint32_t bits = bitsOf(x);
  if (std::isnan(x)) // truncating could clear every payload bit: make it quiet
    return static_cast<uint16_t>((bits >> 16) | 0x40);
  // Adding just under half an ulp, plus the kept lowest bit, rounds to
  // nearest even; a carry runs into the exponent (up to infinity).
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}
uint16_t floatToF16(float x) {
  return static_cast<uint16_t>(encode(kF16, x));
}
uint8_t floatToF8E4M3FN(float x) {
  return static_cast<uint8_t>(encode(kE4M3FN, x));
}
uint8_t floatToF8E5M2(float x) {
  return static_cast<uint8_t>(encode(kE5M2, x));
}

uint16_t doubleToBf16(double x) { return floatToBf16(roundToOddFloat(x)); }
uint16_t doubleToF16(double x) { return floatToF16(roundToOddFloat(x)); }
uint8_t doubleToF8E4M3FN(double x) {
  return floatToF8E4M3FN(roundToOddFloat(x));
}
uint8_t doubleToF8E5M2(double x) { return floatToF8E5M2(roundToOddFloat(x)); }

float roundToOddFloat(double x) {
  float f = static_cast<float>(x);
  if (std::isnan(x) || static_cast<double>(f) == x)
    return f;
  // Truncate (this also turns an overflow to infinity back into FLT_MAX),
  // then mark the result inexact.
  if (std::fabs(static_cast<double>(f)) > std::fabs(x))
    f = std::nextafter(f, 0.0f);
  return floatOf(bitsOf(f) | 1);
}

double roundToOddDouble(int64_t i) {
  // The magnitude as unsigned: -INT64_MIN does not fit an int64.
  uint64_t u = i < 0 ? uint64_t{0} - static_cast<uint64_t>(i)
                     : static_cast<uint64_t>(i);
  const uint64_t limit = uint64_t{1} << 53;
  if (u < limit)
    return static_cast<double>(i);
  int drop = 0;
  while ((u >> drop) >= limit)
    ++drop;
  uint64_t kept = u >> drop;
  if (u & ((uint64_t{1} << drop) - 1))
    kept |= 1;
  double d = std::ldexp(static_cast<double>(kept), drop);
  return i < 0 ? -d : d;
}

bool isNarrowFloat(DType type) {
  switch (type) {
  case DType::F16:
  case DType::BF16:
  case DType::F8E4M3FN:
  case DType::F8E5M2:
    return true;
  default:
    return false;
  }
}

void narrowToFloat(DType type, const void *src, float *dst, int64_t n) {
  auto widen = [&](auto *in, auto fn) {
    for (int64_t i = 0; i < n; ++i)
      dst[i] = fn(in[i]);
  };
  switch (type) {
  case DType::F16:
    return widen(static_cast<const uint16_t *>(src), f16ToFloat);
  case DType::BF16:
    return widen(static_cast<const uint16_t *>(src), bf16ToFloat);
  case DType::F8E4M3FN:
    return widen(static_cast<const uint8_t *>(src), f8E4M3FNToFloat);
  case DType::F8E5M2:
    return widen(static_cast<const uint8_t *>(src), f8E5M2ToFloat);
  default:
    notNarrow(type);
  }
}

void floatToNarrow(DType type, const float *src, void *dst, int64_t n) {
  auto narrow = [&](auto *out, auto fn) {
    for (int64_t i = 0; i < n; ++i)
      out[i] = fn(src[i]);
  };
  switch (type) {
  case DType::F16:
    return narrow(static_cast<uint16_t *>(dst), floatToF16);
  case DType::BF16:
    return narrow(static_cast<uint16_t *>(dst), floatToBf16);
  case DType::F8E4M3FN:
    return narrow(static_cast<uint8_t *>(dst), floatToF8E4M3FN);
  case DType::F8E5M2:
    return narrow(static_cast<uint8_t *>(dst), floatToF8E5M2);
  default:
    notNarrow(type);
  }
}

} // namespace ernie::runtime

//===- FloatConvertTest.cpp - narrow floats against their definitions -------===//
//
// The references here share nothing with FloatConvert.cpp: a code's value
// comes from the sign/exponent/mantissa formula in double, and encoding
// searches a format's sorted finite values for the nearest one (ties to the
// even code), then applies the overflow rule. Kernels on narrow floats are
// checked against the f32 kernel on the widened values, rounded once by that
// reference.
//
//===----------------------------------------------------------------------===//

#include "ernie/runtime/FloatConvert.h"
#include "ernie/runtime/Kernel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

using namespace ernie::runtime;

namespace {

const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Spec {
  DType type;
  int exponentBits, mantissaBits;
  bool fn;       // E4M3FN: no infinity, only S.1111.111 is NaN
  bool saturate; // finite overflow gives the largest finite value

  int bias() const { return (1 << (exponentBits - 1)) - 1; }
  uint32_t ones() const { return (1u << exponentBits) - 1; }
  uint32_t signBit() const { return 1u << (exponentBits + mantissaBits); }
  uint32_t maxFinite() const {
    uint32_t expOnes = ones() << mantissaBits;
    return fn ? expOnes | ((1u << mantissaBits) - 2) : expOnes - 1;
  }
  uint32_t infinity() const { return ones() << mantissaBits; }
  uint32_t numCodes() const { return signBit() << 1; }
};

const Spec kF16{DType::F16, 5, 10, false, false};
const Spec kBF16{DType::BF16, 8, 7, false, false};
const Spec kE4M3{DType::F8E4M3FN, 4, 3, true, true};
const Spec kE5M2{DType::F8E5M2, 5, 2, false, true};
const Spec *const kSpecs[] = {&kF16, &kBF16, &kE4M3, &kE5M2};

const Spec &specOf(DType type) {
  for (const Spec *s : kSpecs)
    if (s->type == type)
      return *s;
  throw std::logic_error("not a narrow type");
}

/// The value of `code`, from the format's definition.
double refDecode(const Spec &s, uint32_t code) {
  const int M = s.mantissaBits;
  bool negative = code & s.signBit();
  uint32_t e = (code >> M) & s.ones(), m = code & ((1u << M) - 1);
  double v;
  if (s.fn && e == s.ones() && m == (1u << M) - 1)
    v = kNaN;
  else if (!s.fn && e == s.ones())
    v = m == 0 ? kInf : kNaN;
  else if (e == 0)
    v = std::ldexp(double(m), 1 - s.bias() - M);
  else
    v = std::ldexp(1.0 + std::ldexp(double(m), -M), int(e) - s.bias());
  return negative ? -v : v;
}

/// Values of the non-negative finite codes 0 ... maxFinite, ascending.
const std::vector<double> &positives(const Spec &s) {
  static std::vector<double> tables[4];
  size_t index = 0;
  while (kSpecs[index] != &s)
    ++index;
  std::vector<double> &table = tables[index];
  if (table.empty())
    for (uint32_t c = 0; c <= s.maxFinite(); ++c)
      table.push_back(refDecode(s, c));
  return table;
}

const uint32_t kNaNCode = UINT32_MAX; // refEncode's answer for NaN

/// The code nearest to x (ties to the even code), with the overflow rule:
/// IEEE formats round past the largest finite value as if the exponent went
/// on, so to infinity; saturating ones stop at the largest finite value,
/// infinities included (NVIDIA's __NV_SATFINITE).
uint32_t refEncode(const Spec &s, double x) {
  if (std::isnan(x))
    return kNaNCode;
  uint32_t sign = std::signbit(x) ? s.signBit() : 0;
  double a = std::fabs(x);
  const std::vector<double> &pos = positives(s);
  uint32_t top = s.maxFinite();
  if (std::isinf(a))
    return sign | (s.saturate ? top : s.infinity());
  if (a >= pos[top]) {
    if (s.saturate)
      return sign | top;
    double next = pos[top] + (pos[top] - pos[top - 1]); // 2^(emax + 1)
    // The largest finite code is odd, so the tie goes to infinity.
    return sign | (a < (pos[top] + next) / 2 ? top : s.infinity());
  }
  uint32_t hi = static_cast<uint32_t>(
      std::upper_bound(pos.begin(), pos.end(), a) - pos.begin());
  uint32_t lo = hi - 1;
  double mid = (pos[lo] + pos[hi]) / 2; // exact: both have few bits
  uint32_t code = a < mid ? lo : a > mid ? hi : (lo % 2 == 0 ? lo : hi);
  return sign | code;
}

/// The runtime's conversions for one format.
uint32_t encodeFloat(const Spec &s, float x) {
  switch (s.type) {
  case DType::F16: return floatToF16(x);
  case DType::BF16: return floatToBf16(x);
  case DType::F8E4M3FN: return floatToF8E4M3FN(x);
  default: return floatToF8E5M2(x);
  }
}
uint32_t encodeDouble(const Spec &s, double x) {
  switch (s.type) {
  case DType::F16: return doubleToF16(x);
  case DType::BF16: return doubleToBf16(x);
  case DType::F8E4M3FN: return doubleToF8E4M3FN(x);
  default: return doubleToF8E5M2(x);
  }
}
float decode(const Spec &s, uint32_t code) {
  switch (s.type) {
  case DType::F16: return f16ToFloat(static_cast<uint16_t>(code));
  case DType::BF16: return bf16ToFloat(static_cast<uint16_t>(code));
  case DType::F8E4M3FN: return f8E4M3FNToFloat(static_cast<uint8_t>(code));
  default: return f8E5M2ToFloat(static_cast<uint8_t>(code));
  }
}

/// "want" for a conversion result: the code, or any NaN for kNaNCode.
::testing::AssertionResult sameCode(const Spec &s, uint32_t got,
                                    uint32_t want, double input) {
  bool ok = want == kNaNCode ? std::isnan(refDecode(s, got)) : got == want;
  if (ok)
    return ::testing::AssertionSuccess();
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s of %.17g (%a): got 0x%x, want 0x%x",
                std::string(name(s.type)).c_str(), input, input, got, want);
  return ::testing::AssertionFailure() << buf;
}

TEST(FloatConvert, EveryCodeDecodesToItsDefinition) {
  for (const Spec *s : kSpecs) {
    int wrong = 0;
    for (uint32_t code = 0; code < s->numCodes(); ++code) {
      double want = refDecode(*s, code);
      double got = decode(*s, code);
      bool ok = std::isnan(want)
                    ? std::isnan(got)
                    : got == want && std::signbit(got) == std::signbit(want);
      if (!ok && ++wrong <= 5)
        ADD_FAILURE() << name(s->type) << " code 0x" << std::hex << code
                      << " decodes to " << got << ", want " << want;
    }
    EXPECT_EQ(wrong, 0) << name(s->type);
  }
  // The reference itself, at values the formats' specifications list.
  EXPECT_EQ(refDecode(kE4M3, 0x7E), 448.0);
  EXPECT_EQ(refDecode(kE4M3, 0x01), std::ldexp(1.0, -9));
  EXPECT_EQ(refDecode(kE4M3, 0x08), std::ldexp(1.0, -6));
  EXPECT_EQ(refDecode(kE4M3, 0x78), 256.0); // S.1111.000 is a number
  EXPECT_TRUE(std::isnan(refDecode(kE4M3, 0xFF)));
  EXPECT_EQ(refDecode(kE5M2, 0x7B), 57344.0);
  EXPECT_EQ(refDecode(kE5M2, 0x01), std::ldexp(1.0, -16));
  EXPECT_EQ(refDecode(kE5M2, 0xFC), -kInf);
  EXPECT_EQ(refDecode(kF16, 0x7BFF), 65504.0);
  EXPECT_EQ(refDecode(kF16, 0x0001), std::ldexp(1.0, -24));
  EXPECT_EQ(refDecode(kF16, 0xC000), -2.0);
  EXPECT_EQ(refDecode(kBF16, 0x3F80), 1.0);
  EXPECT_EQ(refDecode(kBF16, 0x0001), std::ldexp(1.0, -133));
  EXPECT_EQ(refDecode(kBF16, 0x7F7F), 3.3895313892515355e38);
  // Count of NaN codes: e4m3fn 2, e5m2 6, f16 2 * 1023.
  for (auto [spec, nans] : {std::pair{&kE4M3, 2}, std::pair{&kE5M2, 6},
                            std::pair{&kF16, 2046}}) {
    int count = 0;
    for (uint32_t code = 0; code < spec->numCodes(); ++code)
      count += std::isnan(decode(*spec, code));
    EXPECT_EQ(count, nans) << name(spec->type);
  }
}

TEST(FloatConvert, EveryCodeRoundTrips) {
  for (const Spec *s : kSpecs) {
    int wrong = 0;
    for (uint32_t code = 0; code < s->numCodes(); ++code) {
      float x = decode(*s, code);
      bool nan = std::isnan(x);
      for (uint32_t back : {encodeFloat(*s, x), encodeDouble(*s, x)}) {
        // fp8 NaNs come back as NVIDIA's canonical 0x7F, and the f8E5M2
        // infinities as its largest finite value (__NV_SATFINITE).
        bool fp8 = s->saturate;
        bool ok = nan ? std::isnan(decode(*s, back)) &&
                            (fp8 ? back == 0x7F
                                 : (back & s->signBit()) == (code & s->signBit()))
                  : fp8 && std::isinf(x) ? back == (code & s->signBit()) + 0x7B
                                         : back == code;
        if (!ok && ++wrong <= 5)
          ADD_FAILURE() << name(s->type) << " code 0x" << std::hex << code
                        << " comes back as 0x" << back;
      }
    }
    EXPECT_EQ(wrong, 0) << name(s->type);
  }
}

// Hand-worked codes: ties to even, subnormals, overflow, NaN.
TEST(FloatConvert, TiesSubnormalsOverflowAndNaN) {
  auto p = [](int e) { return std::ldexp(1.0, e); };
  struct Case {
    const Spec *spec;
    double x;
    uint32_t want;
  } cases[] = {
      // f8E4M3FN: 1 + 2^-4 sits between 1 (0x38) and 1.125 (0x39).
      {&kE4M3, 1 + p(-4), 0x38},
      {&kE4M3, 1 + 3 * p(-4), 0x3A},
      {&kE4M3, -(1 + p(-4)), 0xB8},
      {&kE4M3, p(-9), 0x01},           // smallest subnormal
      {&kE4M3, p(-10), 0x00},          // half of it: the tie goes to 0
      {&kE4M3, 1.5 * p(-10), 0x01},
      {&kE4M3, 3 * p(-10), 0x02},      // 1.5 units: to 2
      {&kE4M3, 7.5 * p(-9), 0x08},     // largest subnormal/smallest normal tie
      {&kE4M3, -0.0, 0x80},
      {&kE4M3, 448, 0x7E},
      {&kE4M3, 464, 0x7E},             // a tie with 480, which does not exist
      {&kE4M3, 1e30, 0x7E},            // saturates
      {&kE4M3, -1e30, 0xFE},
      {&kE4M3, kInf, 0x7E},            // no infinity: saturates too
      {&kE4M3, -kInf, 0xFE},
      {&kE4M3, kNaN, kNaNCode},
      // f8E5M2
      {&kE5M2, 1 + p(-3), 0x3C},
      {&kE5M2, 1 + 3 * p(-3), 0x3E},
      {&kE5M2, p(-16), 0x01},
      {&kE5M2, p(-17), 0x00},
      {&kE5M2, 3 * p(-17), 0x02},
      {&kE5M2, 57344, 0x7B},
      {&kE5M2, 61440, 0x7B},           // would round to 2^16: saturates
      {&kE5M2, 1e30, 0x7B},
      {&kE5M2, -1e30, 0xFB},
      {&kE5M2, kInf, 0x7B},            // infinities saturate too (SATFINITE)
      {&kE5M2, -kInf, 0xFB},
      {&kE5M2, kNaN, kNaNCode},
      // f16 (IEEE: overflow rounds to infinity)
      {&kF16, 1 + p(-11), 0x3C00},
      {&kF16, 1 + 3 * p(-11), 0x3C02},
      {&kF16, p(-24), 0x0001},
      {&kF16, p(-25), 0x0000},
      {&kF16, 3 * p(-25), 0x0002},
      {&kF16, p(-14), 0x0400},
      {&kF16, 65504, 0x7BFF},
      {&kF16, 65519, 0x7BFF},
      {&kF16, 65520, 0x7C00},          // the tie goes to the even code: inf
      {&kF16, -1e10, 0xFC00},
      {&kF16, kNaN, kNaNCode},
      // bf16
      {&kBF16, 1 + p(-8), 0x3F80},
      {&kBF16, 1 + 3 * p(-8), 0x3F82},
      {&kBF16, p(-133), 0x0001},       // f32 subnormals are bf16 subnormals
      {&kBF16, p(-134), 0x0000},
      {&kBF16, 3 * p(-134), 0x0002},
      {&kBF16, std::numeric_limits<float>::max(), 0x7F80},
      {&kBF16, -kInf, 0xFF80},
      {&kBF16, kNaN, kNaNCode},
  };
  for (const Case &c : cases) {
    EXPECT_TRUE(sameCode(*c.spec, refEncode(*c.spec, c.x), c.want, c.x))
        << "(the reference)";
    EXPECT_TRUE(sameCode(*c.spec, encodeFloat(*c.spec, static_cast<float>(c.x)),
                         c.want, c.x));
    EXPECT_TRUE(sameCode(*c.spec, encodeDouble(*c.spec, c.x), c.want, c.x));
  }
  // fp8: NVIDIA's canonical NaN, whatever the sign and payload.
  EXPECT_EQ(floatToF8E4M3FN(-std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(floatToF8E5M2(-std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(floatToF8E5M2(std::numeric_limits<float>::signaling_NaN()), 0x7F);
  // f16 keeps the sign.
  EXPECT_TRUE(floatToF16(-std::numeric_limits<float>::quiet_NaN()) & 0x8000);
}

// From f64 the conversions round once: each of these is just off a tie of
// its format that the nearest f32 lands exactly on.
TEST(FloatConvert, FromDoubleRoundsOnce) {
  auto p = [](int e) { return std::ldexp(1.0, e); };
  struct Case {
    const Spec *spec;
    double x;
    uint32_t want;
  } cases[] = {
      {&kBF16, 1 + p(-8) + p(-30), 0x3F81},
      {&kBF16, 1 + p(-8) - p(-30), 0x3F80},
      {&kBF16, 1e300, 0x7F80},
      {&kBF16, -1e-300, 0x8000},
      {&kF16, 1 + p(-11) + p(-40), 0x3C01},
      {&kF16, 65520 - p(-30), 0x7BFF},   // through f32: 65520, then inf
      {&kE4M3, 1 + p(-4) + p(-40), 0x39},
      {&kE4M3, p(-10) + p(-60), 0x01},   // through f32: 2^-10, then 0
      {&kE5M2, 1 + p(-3) + p(-40), 0x3D},
      {&kE5M2, p(-17) + p(-60), 0x01},
  };
  for (const Case &c : cases) {
    EXPECT_TRUE(sameCode(*c.spec, refEncode(*c.spec, c.x), c.want, c.x))
        << "(the reference)";
    EXPECT_TRUE(sameCode(*c.spec, encodeDouble(*c.spec, c.x), c.want, c.x));
  }
  // Random doubles a hair off the formats' ties.
  std::mt19937_64 rng(7);
  for (const Spec *s : kSpecs) {
    const std::vector<double> &pos = positives(*s);
    int wrong = 0;
    for (int i = 0; i < 100000; ++i) {
      size_t c = rng() % (pos.size() - 1);
      double mid = (pos[c] + pos[c + 1]) / 2;
      double x = mid + (rng() % 2 ? 1 : -1) * mid * std::ldexp(1.0, -30 - int(rng() % 20));
      if (rng() % 2)
        x = -x;
      if (!sameCode(*s, encodeDouble(*s, x), refEncode(*s, x), x) && ++wrong <= 5)
        ADD_FAILURE() << sameCode(*s, encodeDouble(*s, x), refEncode(*s, x), x).message();
    }
    EXPECT_EQ(wrong, 0) << name(s->type);
  }
}

/// A float to round into `s`: mostly across the format's range (every
/// mantissa, exponents from below its smallest subnormal to above its
/// largest value), some exact ties, some arbitrary bit patterns.
float randomFloatFor(const Spec &s, std::mt19937 &rng) {
  uint32_t kind = rng() % 16;
  float f;
  if (kind == 0) {
    uint32_t bits = rng();
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  if (kind == 1) {
    const std::vector<double> &pos = positives(s);
    size_t c = rng() % (pos.size() - 1);
    f = static_cast<float>((pos[c] + pos[c + 1]) / 2); // exact
  } else {
    int low = 1 - s.bias() - s.mantissaBits - 3;
    int high = int(s.ones()) - s.bias() + 2;
    int e = low + int(rng() % uint32_t(high - low + 1));
    double mantissa = 1 + std::ldexp(double(rng() & 0x7FFFFF), -23);
    f = static_cast<float>(std::ldexp(mantissa, e));
  }
  return rng() % 2 ? -f : f;
}

TEST(FloatConvert, MillionRandomFloatsMatchTheNearestCode) {
  std::mt19937 rng(2024);
  for (const Spec *s : kSpecs) {
    int wrong = 0;
    for (int i = 0; i < 1000000; ++i) {
      float x = randomFloatFor(*s, rng);
      uint32_t want = refEncode(*s, x);
      ::testing::AssertionResult ok = sameCode(*s, encodeFloat(*s, x), want, x);
      if (!ok && ++wrong <= 5)
        ADD_FAILURE() << ok.message();
    }
    EXPECT_EQ(wrong, 0) << name(s->type);
  }
}

TEST(FloatConvert, BufferConversionsAndNarrowTypes) {
  EXPECT_TRUE(isNarrowFloat(DType::BF16));
  EXPECT_TRUE(isNarrowFloat(DType::F16));
  EXPECT_TRUE(isNarrowFloat(DType::F8E4M3FN));
  EXPECT_TRUE(isNarrowFloat(DType::F8E5M2));
  EXPECT_FALSE(isNarrowFloat(DType::F32));
  EXPECT_FALSE(isNarrowFloat(DType::F64));
  EXPECT_FALSE(isNarrowFloat(DType::I32));
  std::vector<float> in{1.0f, -448.0f, 1000.0f, 0.0f}, back(4);
  std::vector<uint8_t> codes(4);
  floatToNarrow(DType::F8E4M3FN, in.data(), codes.data(), 4);
  EXPECT_EQ(codes, (std::vector<uint8_t>{0x38, 0xFE, 0x7E, 0x00}));
  narrowToFloat(DType::F8E4M3FN, codes.data(), back.data(), 4);
  EXPECT_EQ(back, (std::vector<float>{1.0f, -448.0f, 448.0f, 0.0f}));
  EXPECT_THROW(floatToNarrow(DType::F32, in.data(), codes.data(), 4),
               std::invalid_argument);
}

//===----------------------------------------------------------------------===//
// Kernels on narrow floats.
//===----------------------------------------------------------------------===//

/// An owned buffer of any type, written and read through double by the
/// reference conversions (f32/f64 by plain casts).
struct Buffer {
  DType type;
  std::vector<int64_t> shape;
  std::vector<unsigned char> bytes;

  Buffer(DType t, std::vector<int64_t> s) : type(t), shape(std::move(s)) {
    bytes.assign(size() * byteSize(type), 0);
  }
  int64_t size() const {
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    return n;
  }
  TensorView view() { return {bytes.data(), type, shape}; }
  uint32_t code(int64_t i) const {
    uint32_t c = 0;
    std::memcpy(&c, bytes.data() + i * byteSize(type), byteSize(type));
    return c; // little-endian
  }
  void setCode(int64_t i, uint32_t c) {
    std::memcpy(bytes.data() + i * byteSize(type), &c, byteSize(type));
  }
  double get(int64_t i) const {
    switch (type) {
    case DType::F64: { double v; std::memcpy(&v, bytes.data() + i * 8, 8); return v; }
    case DType::F32: { float v; std::memcpy(&v, bytes.data() + i * 4, 4); return v; }
    case DType::I64: { int64_t v; std::memcpy(&v, bytes.data() + i * 8, 8); return double(v); }
    case DType::I32: { int32_t v; std::memcpy(&v, bytes.data() + i * 4, 4); return v; }
    case DType::I1: return bytes[i];
    default: return refDecode(specOf(type), code(i));
    }
  }
  int64_t getInt(int64_t i) const {
    int64_t v = 0;
    if (type == DType::I64)
      std::memcpy(&v, bytes.data() + i * 8, 8);
    else if (type == DType::I32) {
      int32_t w;
      std::memcpy(&w, bytes.data() + i * 4, 4);
      v = w;
    } else
      v = bytes[i];
    return v;
  }
  void set(int64_t i, double x) {
    switch (type) {
    case DType::F64: std::memcpy(bytes.data() + i * 8, &x, 8); return;
    case DType::F32: { float v = static_cast<float>(x); std::memcpy(bytes.data() + i * 4, &v, 4); return; }
    case DType::I64: { int64_t v = static_cast<int64_t>(x); std::memcpy(bytes.data() + i * 8, &v, 8); return; }
    case DType::I32: { int32_t v = static_cast<int32_t>(x); std::memcpy(bytes.data() + i * 4, &v, 4); return; }
    case DType::I1: bytes[i] = x != 0; return;
    default: setCode(i, refEncode(specOf(type), x)); return;
    }
  }
};

void runOp(const char *op, std::vector<TensorView> in, std::vector<TensorView> out,
           const Attrs &attrs = {}) {
  const Kernel *k = findCpuKernel(op);
  ASSERT_NE(k, nullptr) << op;
  (*k)(in, out, attrs);
}

/// An operand: a float tensor of random values in `type`, or fixed integers.
struct Arg {
  std::vector<int64_t> shape;
  std::vector<int64_t> ints = {}; // non-empty: an i64 tensor of these
  bool integerOutput = false;     // for outputs: i64
};

/// Runs `op` on narrow buffers and on f32 copies of the same values: every
/// narrow output must be the f32 result rounded once (by the reference),
/// every integer output equal.
void expectComputesInF32(const char *op, DType type, std::vector<Arg> ins,
                         std::vector<Arg> outs, const Attrs &attrs,
                         uint32_t seed = 1) {
  SCOPED_TRACE(std::string(op) + " on " + std::string(name(type)));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-3.0, 3.0);
  std::vector<Buffer> narrowIn, wideIn;
  for (const Arg &a : ins) {
    bool integer = !a.ints.empty();
    Buffer n(integer ? DType::I64 : type, a.shape), w(integer ? DType::I64 : DType::F32, a.shape);
    for (int64_t i = 0; i < n.size(); ++i) {
      n.set(i, integer ? double(a.ints[i]) : dist(rng));
      w.set(i, n.get(i)); // exact: every narrow value is an f32
    }
    narrowIn.push_back(n);
    wideIn.push_back(w);
  }
  std::vector<Buffer> narrowOut, wideOut;
  for (const Arg &a : outs) {
    narrowOut.emplace_back(a.integerOutput ? DType::I64 : type, a.shape);
    wideOut.emplace_back(a.integerOutput ? DType::I64 : DType::F32, a.shape);
  }
  auto views = [](std::vector<Buffer> &bs) {
    std::vector<TensorView> v;
    for (Buffer &b : bs)
      v.push_back(b.view());
    return v;
  };
  runOp(op, views(narrowIn), views(narrowOut), attrs);
  runOp(op, views(wideIn), views(wideOut), attrs);
  const Spec &spec = specOf(type);
  for (size_t o = 0; o < outs.size(); ++o)
    for (int64_t i = 0; i < narrowOut[o].size(); ++i) {
      if (outs[o].integerOutput) {
        EXPECT_EQ(narrowOut[o].getInt(i), wideOut[o].getInt(i)) << "output " << o;
        continue;
      }
      double exact = wideOut[o].get(i);
      EXPECT_TRUE(sameCode(spec, narrowOut[o].code(i), refEncode(spec, exact), exact))
          << "output " << o << " element " << i;
    }
}

TEST(NarrowFloatKernels, ComputeInF32AndRoundOnce) {
  Attrs none;
  Attrs axis1{{"axis", int64_t{1}}};
  for (DType t : {DType::BF16, DType::F16, DType::F8E4M3FN, DType::F8E5M2}) {
    expectComputesInF32("ernie.add", t, {{{4, 5}}, {{4, 5}}}, {{{4, 5}}}, none, 1);
    expectComputesInF32("ernie.matmul", t, {{{2, 3, 8}}, {{8, 5}}}, {{{2, 3, 5}}},
                        none, 2);
    expectComputesInF32("ernie.softmax", t, {{{3, 7}}}, {{{3, 7}}}, axis1, 3);
  }
  const DType bf16 = DType::BF16;
  Attrs tb;
  tb.set("transpose_b", true);
  expectComputesInF32("ernie.matmul", bf16, {{{3, 16}}, {{4, 16}}}, {{{3, 4}}}, tb, 4);
  expectComputesInF32("ernie.reduce_sum", bf16, {{{2, 6, 3}}}, {{{2, 3}}},
                      {{"axes", std::vector<int64_t>{1}}}, 5);
  expectComputesInF32("ernie.rms_norm", bf16, {{{3, 8}}, {{8}}}, {{{3, 8}}},
                      {{"epsilon", 1e-6}}, 6);
  expectComputesInF32("ernie.layer_norm", bf16, {{{3, 8}}, {{8}}, {{8}}}, {{{3, 8}}},
                      {{"epsilon", 1e-5}}, 7);
  expectComputesInF32("ernie.exp", bf16, {{{9}}}, {{{9}}}, none, 8);
  expectComputesInF32("ernie.gelu", DType::F8E4M3FN, {{{9}}}, {{{9}}}, none, 9);
  // Integer operands and results pass through: topk's i64 indices, labels,
  // positions, indices.
  expectComputesInF32("ernie.topk", bf16, {{{2, 9}}},
                      {{{2, 3}}, {{2, 3}, {}, true}},
                      {{"k", int64_t{3}}, {"axis", int64_t{1}}}, 10);
  expectComputesInF32("ernie.cross_entropy", bf16,
                      {{{4, 6}}, {{4}, {0, 5, -100, 2}}}, {{{}}}, none, 11);
  expectComputesInF32("ernie.rope", DType::F16,
                      {{{1, 3, 2, 4}}, {{3}, {0, 4, 9}}}, {{{1, 3, 2, 4}}},
                      {{"theta", 100.0}}, 12);
  expectComputesInF32("ernie.index_add", bf16,
                      {{{4, 2}}, {{3}, {1, 3, 1}}, {{3, 2}}}, {{{4, 2}}},
                      {{"axis", int64_t{0}}}, 13);
  expectComputesInF32("ernie.attention", bf16,
                      {{{1, 3, 2, 4}}, {{1, 3, 1, 4}}, {{1, 3, 1, 4}}},
                      {{{1, 3, 2, 4}}}, {{"causal", true}}, 14);
}

TEST(NarrowFloatKernels, InPlaceAndOverflow) {
  // index_add into its own base: inputs are read before outputs are written.
  Buffer acc(DType::BF16, {3}), idx(DType::I64, {2}), upd(DType::BF16, {2});
  for (int i = 0; i < 3; ++i)
    acc.set(i, 1.0);
  idx.set(0, 2);
  idx.set(1, 2);
  upd.set(0, 0.5);
  upd.set(1, 0.25);
  runOp("ernie.index_add", {acc.view(), idx.view(), upd.view()}, {acc.view()},
        {{"axis", int64_t{0}}});
  EXPECT_EQ(acc.get(0), 1.0);
  EXPECT_EQ(acc.get(2), 1.75);
  // f8E4M3FN and f8E5M2 saturate, f16 overflows to inf.
  Buffer a(DType::F8E4M3FN, {1}), y(DType::F8E4M3FN, {1});
  a.set(0, 448);
  runOp("ernie.add", {a.view(), a.view()}, {y.view()});
  EXPECT_EQ(y.code(0), 0x7Eu);
  Buffer h(DType::F16, {1}), hy(DType::F16, {1});
  h.set(0, 65504);
  runOp("ernie.add", {h.view(), h.view()}, {hy.view()});
  EXPECT_EQ(hy.code(0), 0x7C00u);
}

TEST(NarrowFloatKernels, DataMovementKeepsBits) {
  // A signalling-NaN payload and -0 survive a transpose and a concat.
  Buffer x(DType::BF16, {2, 2});
  for (uint32_t i = 0; i < 4; ++i)
    x.setCode(i, std::vector<uint32_t>{0x7F81, 0x8000, 0x3F80, 0xFFC1}[i]);
  Buffer t(DType::BF16, {2, 2});
  runOp("ernie.transpose", {x.view()}, {t.view()}, {{"perm", std::vector<int64_t>{1, 0}}});
  EXPECT_EQ(t.code(0), 0x7F81u);
  EXPECT_EQ(t.code(1), 0x3F80u);
  EXPECT_EQ(t.code(2), 0x8000u);
  EXPECT_EQ(t.code(3), 0xFFC1u);
  Buffer f(DType::F8E5M2, {2}), g(DType::F8E5M2, {4});
  f.setCode(0, 0x7D);
  f.setCode(1, 0xFF);
  runOp("ernie.concat", {f.view(), f.view()}, {g.view()}, {{"axis", int64_t{0}}});
  EXPECT_EQ(g.code(2), 0x7Du);
  EXPECT_EQ(g.code(3), 0xFFu);
}

TEST(NarrowFloatKernels, CastBetweenEveryFloatTypeRoundsOnce) {
  auto p = [](int e) { return std::ldexp(1.0, e); };
  std::vector<double> values{0.0, -0.0, 1.0, -2.5, 1 + p(-8), 1 + p(-11),
                             1 + p(-4), 1 + p(-3), 1 + p(-8) + p(-30),
                             65520 - p(-30), 448, 464, 500, 57344, 61440,
                             65504, 65520, 1e6, 1e39, 1e300, kInf, -kInf, kNaN,
                             p(-9), p(-10), p(-16), p(-17), p(-24), p(-25),
                             3 * p(-26), p(-133), p(-134), p(-149), 1e-300};
  std::mt19937 rng(5);
  for (int i = 0; i < 300; ++i)
    values.push_back(std::ldexp(std::uniform_real_distribution<double>(-1, 1)(rng),
                                int(rng() % 60) - 30));
  const int64_t n = static_cast<int64_t>(values.size());
  const DType floats[] = {DType::F64, DType::F32, DType::F16, DType::BF16,
                          DType::F8E4M3FN, DType::F8E5M2};
  for (DType from : floats) {
    Buffer src(from, {n});
    for (int64_t i = 0; i < n; ++i)
      src.set(i, values[i]);
    for (DType to : floats) {
      Buffer dst(to, {n});
      runOp("ernie.cast", {src.view()}, {dst.view()});
      for (int64_t i = 0; i < n; ++i) {
        double exact = src.get(i);
        if (to == DType::F64 || to == DType::F32) {
          double want = to == DType::F64 ? exact : double(static_cast<float>(exact));
          if (std::isnan(want))
            EXPECT_TRUE(std::isnan(dst.get(i)));
          else
            EXPECT_EQ(dst.get(i), want) << name(from) << " -> " << name(to) << " of " << exact;
          continue;
        }
        const Spec &spec = specOf(to);
        EXPECT_TRUE(sameCode(spec, dst.code(i), refEncode(spec, exact), exact))
            << name(from) << " -> " << name(to);
      }
    }
    // To integers: toward zero, saturating, NaN to 0.
    Buffer ints(DType::I32, {n});
    runOp("ernie.cast", {src.view()}, {ints.view()});
    for (int64_t i = 0; i < n; ++i) {
      double x = src.get(i);
      int64_t want = std::isnan(x) ? 0
                     : x >= 2147483648.0 ? INT32_MAX
                     : x <= -2147483648.0 ? INT32_MIN
                                          : static_cast<int64_t>(std::trunc(x));
      EXPECT_EQ(ints.getInt(i), want) << name(from) << " -> i32 of " << x;
    }
  }
}

TEST(NarrowFloatKernels, CastFromIntegersRoundsOnce) {
  const int64_t big = int64_t{1} << 60;
  // 2^60 + 2^36 + 1 is just above an f32 tie; the nearest double is the tie.
  Buffer i64(DType::I64, {4});
  int64_t values[] = {big + (int64_t{1} << 36) + 1, big + (int64_t{1} << 52) + 1,
                      INT64_MIN, INT64_MAX};
  for (int i = 0; i < 4; ++i)
    std::memcpy(i64.bytes.data() + i * 8, &values[i], 8);
  Buffer f32(DType::F32, {4}), bf16(DType::BF16, {4}), e4m3(DType::F8E4M3FN, {4}),
      f64(DType::F64, {4}), i32(DType::I32, {4});
  runOp("ernie.cast", {i64.view()}, {f32.view()});
  runOp("ernie.cast", {i64.view()}, {bf16.view()});
  runOp("ernie.cast", {i64.view()}, {e4m3.view()});
  runOp("ernie.cast", {i64.view()}, {f64.view()});
  runOp("ernie.cast", {i64.view()}, {i32.view()});
  EXPECT_EQ(f32.get(0), std::ldexp(1.0, 60) + std::ldexp(1.0, 37));
  EXPECT_EQ(f32.get(2), -std::ldexp(1.0, 63));
  EXPECT_EQ(f32.get(3), std::ldexp(1.0, 63));
  EXPECT_EQ(bf16.get(1), std::ldexp(1.0, 60) + std::ldexp(1.0, 53));
  EXPECT_EQ(e4m3.code(3), 0x7Eu);
  EXPECT_EQ(e4m3.code(2), 0xFEu);
  EXPECT_EQ(f64.get(1), std::ldexp(1.0, 60) + std::ldexp(1.0, 52)); // nearest
  EXPECT_EQ(i32.getInt(0), INT32_MAX);
  EXPECT_EQ(i32.getInt(2), INT32_MIN);
  Buffer flags(DType::I1, {2}), fp8(DType::F8E5M2, {2});
  flags.bytes = {1, 0};
  runOp("ernie.cast", {flags.view()}, {fp8.view()});
  EXPECT_EQ(fp8.code(0), 0x3Cu);
  EXPECT_EQ(fp8.code(1), 0x00u);
}

TEST(NarrowFloatKernels, CreationCompareAndOptimizer) {
  Buffer full(DType::F8E4M3FN, {2});
  runOp("ernie.full", {}, {full.view()}, {{"value", 500.0}});
  EXPECT_EQ(full.code(1), 0x7Eu);
  Buffer once(DType::BF16, {1});
  runOp("ernie.full", {}, {once.view()},
        {{"value", 1 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30)}});
  EXPECT_EQ(once.code(0), 0x3F81u);
  Buffer iota(DType::F16, {3});
  runOp("ernie.iota", {}, {iota.view()}, {{"dimension", int64_t{0}}});
  EXPECT_EQ(iota.get(2), 2.0);

  Buffer a(DType::BF16, {2}), b(DType::BF16, {2}), lt(DType::I1, {2});
  a.set(0, 1.0);
  a.set(1, 2.0);
  b.set(0, 1.5);
  b.set(1, 1.5);
  runOp("ernie.compare", {a.view(), b.view()}, {lt.view()}, {{"direction", int64_t{2}}});
  EXPECT_EQ(lt.bytes, (std::vector<unsigned char>{1, 0}));

  // bf16 parameters and gradient, f32 moments, a bf16 learning rate: the
  // arithmetic is f64 and each result rounds once into its type.
  Buffer p(DType::BF16, {5}), g(DType::BF16, {5}), m(DType::F32, {5}),
      v(DType::F32, {5}), lr(DType::BF16, {}), t(DType::I64, {});
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> dist(-1, 1);
  for (int i = 0; i < 5; ++i) {
    p.set(i, dist(rng));
    g.set(i, dist(rng));
    m.set(i, dist(rng) * 0.1);
    v.set(i, std::fabs(dist(rng)) * 0.1);
  }
  lr.set(0, 0.01);
  t.set(0, 4);
  Buffer np(DType::BF16, {5}), nm(DType::F32, {5}), nv(DType::F32, {5});
  runOp("ernie.adamw_update", {p.view(), g.view(), m.view(), v.view(), lr.view(), t.view()},
        {np.view(), nm.view(), nv.view()}, {{"weight_decay", 0.1}});
  for (int i = 0; i < 5; ++i) {
    double m2 = 0.9 * m.get(i) + 0.1 * g.get(i);
    double v2 = 0.999 * v.get(i) + 0.001 * g.get(i) * g.get(i);
    double update = (m2 / (1 - std::pow(0.9, 4))) /
                        (std::sqrt(v2 / (1 - std::pow(0.999, 4))) + 1e-8) +
                    0.1 * p.get(i);
    double want = p.get(i) - lr.get(0) * update;
    EXPECT_EQ(np.code(i), refEncode(kBF16, want));
    EXPECT_EQ(nm.get(i), double(static_cast<float>(m2)));
  }
  Buffer ip(DType::I32, {5});
  EXPECT_THROW(runOp("ernie.sgd_update", {ip.view(), ip.view(), m.view(), lr.view()},
                     {ip.view(), nm.view()}),
               KernelError);
}

} // namespace

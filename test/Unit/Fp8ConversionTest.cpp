//===- Fp8ConversionTest.cpp - the runtime's narrow floats vs APFloat -----===//
//
// The runtime (which links no LLVM) converts f32 to f8E4M3FN, f8E5M2, bf16
// and f16 on its own. Here LLVM's APFloat is the oracle: every fp8 code
// decodes as APFloat decodes it, and every bf16 value and a million random
// f32 values (a fixed seed; uniform bit patterns plus values drawn densely
// around each format's ties and subnormals) round as APFloat rounds them,
// nearest-even.
//
// The one difference is by design: where a value rounds past the largest
// finite fp8 value, APFloat gives NaN (f8E4M3FN, which has no infinity) or
// infinity (f8E5M2), and the runtime saturates to the largest finite value
// with the sign, as NVIDIA's __NV_SATFINITE conversions (cuda_fp8.h, the
// GPU's cvt.satfinite) and Transformer Engine do — +-inf included, in both
// formats, so the CPU and CUDA backends agree on every input. That rule is
// asserted where it applies, with the boundary it must apply from, never
// skipped. bf16 and f16
// are IEEE: they agree with APFloat everywhere, overflow to infinity included.
// NaNs come out bit for bit as APFloat makes them in bf16 and f16; in fp8
// they are NVIDIA's canonical NaN 0x7F (cvt.satfinite, cuda_fp8.h's f32
// conversions), whatever their sign and payload. The f64 entry points are
// checked too, just off the ties, where rounding through f32 would round
// twice.
//
//===----------------------------------------------------------------------===//

#include "ernie/runtime/FloatConvert.h"

#include "llvm/ADT/APFloat.h"
#include "llvm/ADT/APInt.h"
#include "llvm/ADT/SmallString.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using llvm::APFloat;
using llvm::APInt;
using llvm::fltSemantics;
namespace rt = ernie::runtime;

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
uint64_t bitsOf(double x) {
  uint64_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

std::string hex(uint64_t value) {
  std::ostringstream os;
  os << "0x" << std::hex << value;
  return os.str();
}

/// The code APFloat rounds x to in `semantics`.
uint64_t apEncode(const APFloat &x, const fltSemantics &semantics,
                  APFloat::roundingMode mode = APFloat::rmNearestTiesToEven) {
  APFloat value = x;
  bool losesInfo;
  value.convert(semantics, mode, &losesInfo);
  return value.bitcastToAPInt().getZExtValue();
}

/// A code of `semantics` as APFloat reads it.
APFloat apDecode(const fltSemantics &semantics, uint64_t code) {
  return APFloat(semantics, APInt(APFloat::getSizeInBits(semantics), code));
}

std::string text(const APFloat &value) {
  llvm::SmallString<32> out;
  value.toString(out);
  return std::string(out);
}

/// A finite APFloat value widened exactly to a double.
double exactDouble(const APFloat &value) {
  APFloat wide = value;
  bool losesInfo;
  wide.convert(APFloat::IEEEdouble(), APFloat::rmNearestTiesToEven, &losesInfo);
  EXPECT_FALSE(losesInfo);
  return wide.convertToDouble();
}

/// One narrow format: the runtime's functions, APFloat's semantics, and
/// what is needed to tell ties and overflow apart independently of both.
struct Format {
  const char *name;
  const fltSemantics &semantics;
  uint64_t (*encode)(float);
  double (*decode)(uint64_t);
  int mantissaBits;
  uint64_t signBit;
  uint64_t maxFinite; // magnitude code
  bool saturates;     // finite overflow gives maxFinite (the fp8 formats)
  // Every non-negative finite value in increasing order, then one step past
  // the largest (the value the next code would have with an unbounded
  // exponent): the midpoint below that step is where rounding overflows.
  std::vector<double> ladder;

  Format(const char *name, const fltSemantics &semantics,
         uint64_t (*encode)(float), double (*decode)(uint64_t),
         int mantissaBits, uint64_t maxFinite, bool saturates)
      : name(name), semantics(semantics), encode(encode), decode(decode),
        mantissaBits(mantissaBits),
        signBit(uint64_t{1} << (APFloat::getSizeInBits(semantics) - 1)),
        maxFinite(maxFinite), saturates(saturates) {
    for (uint64_t code = 0; code <= maxFinite; ++code)
      ladder.push_back(exactDouble(apDecode(semantics, code)));
    double top = ladder.back(), below = ladder[ladder.size() - 2];
    ladder.push_back(top + (top - below));
  }

  /// Where round-to-nearest-even leaves the finite range: the midpoint
  /// above maxFinite, itself included when maxFinite's code is odd.
  double overflowMidpoint() const {
    return (ladder[ladder.size() - 2] + ladder.back()) / 2;
  }
  bool overflows(double magnitude) const {
    double mid = overflowMidpoint();
    return magnitude > mid || (magnitude == mid && (maxFinite & 1));
  }
  double smallestNormal() const { return ladder[uint64_t{1} << mantissaBits]; }
  bool isSubnormalCode(uint64_t code) const {
    uint64_t magnitude = code & ~signBit;
    return magnitude != 0 && (magnitude >> mantissaBits) == 0;
  }
  /// True when |x| lies exactly halfway between two adjacent values of the
  /// format (the overflow midpoint included).
  bool isTie(double magnitude) const {
    auto above = std::upper_bound(ladder.begin(), ladder.end(), magnitude);
    if (above == ladder.begin() || above == ladder.end())
      return false;
    double below = *(above - 1);
    // Adjacent values have few significant bits: their sum is exact.
    return below != magnitude && 2 * magnitude == below + *above;
  }
};

template <typename T, T (*Fn)(float)> uint64_t widenEncode(float x) {
  return Fn(x);
}
template <typename T, float (*Fn)(T)> double widenDecode(uint64_t code) {
  return Fn(static_cast<T>(code));
}

const Format &e4m3fn() {
  static const Format format("f8E4M3FN", APFloat::Float8E4M3FN(),
                             widenEncode<uint8_t, rt::floatToF8E4M3FN>,
                             widenDecode<uint8_t, rt::f8E4M3FNToFloat>, 3, 0x7e,
                             true);
  return format;
}
const Format &e5m2() {
  static const Format format(
      "f8E5M2", APFloat::Float8E5M2(), widenEncode<uint8_t, rt::floatToF8E5M2>,
      widenDecode<uint8_t, rt::f8E5M2ToFloat>, 2, 0x7b, true);
  return format;
}
const Format &bf16() {
  static const Format format(
      "bf16", APFloat::BFloat(), widenEncode<uint16_t, rt::floatToBf16>,
      widenDecode<uint16_t, rt::bf16ToFloat>, 7, 0x7f7f, false);
  return format;
}
const Format &f16() {
  static const Format format(
      "f16", APFloat::IEEEhalf(), widenEncode<uint16_t, rt::floatToF16>,
      widenDecode<uint16_t, rt::f16ToFloat>, 10, 0x7bff, false);
  return format;
}

/// What one format's conversions of a set of inputs exercised.
struct Tally {
  int64_t checked = 0, mismatches = 0;
  int64_t ties = 0, subnormalTies = 0, subnormals = 0, zeros = 0;
  int64_t saturated = 0, infinities = 0, nans = 0;
};

/// Rounds x with the runtime and with APFloat and checks they agree, up to
/// the fp8 saturation rule. Reports the first few mismatches in full.
void check(const Format &f, float x, Tally &tally) {
  ++tally.checked;
  uint64_t got = f.encode(x);
  uint64_t apCode = apEncode(APFloat(x), f.semantics);
  APFloat apValue = apDecode(f.semantics, apCode);
  uint64_t sign = std::signbit(x) ? f.signBit : 0;
  double magnitude = std::fabs(static_cast<double>(x));

  uint64_t want = apCode;
  bool ok;
  if (std::isnan(x) && f.saturates) {
    // fp8: NVIDIA's canonical NaN, S.1111.111 with the sign cleared.
    ++tally.nans;
    want = 0x7f;
    ok = got == want && apValue.isNaN() && std::isnan(f.decode(got));
  } else if (std::isnan(x)) {
    // NaN stays NaN with its sign, quieted, with what fits of the payload:
    // bit for bit what APFloat makes of it.
    ++tally.nans;
    ok = got == want && apValue.isNaN() && std::isnan(f.decode(got)) &&
         (got & f.signBit) == sign;
  } else if (f.saturates && !apValue.isFinite()) {
    // APFloat overflowed to NaN (no infinity) or infinity, or x is +-inf;
    // the runtime saturates. That must happen exactly past the overflow
    // midpoint.
    ++tally.saturated;
    want = sign | f.maxFinite;
    ok = got == want && (std::isinf(x) || f.overflows(magnitude));
  } else {
    // Finite in APFloat, or an infinity the format keeps: identical codes,
    // and APFloat's overflow starts exactly at the midpoint too.
    ok = got == want &&
         (!std::isfinite(x) || f.overflows(magnitude) == !apValue.isFinite());
    if (apValue.isInfinity())
      ++tally.infinities;
  }

  if (ok && !std::isnan(x) && f.isTie(magnitude)) {
    ++tally.ties;
    if (magnitude < f.smallestNormal())
      ++tally.subnormalTies;
    // Ties go to the even code, unless they saturate.
    uint64_t code = got & ~f.signBit;
    if ((code & 1) && code != f.maxFinite) {
      if (++tally.mismatches <= 10)
        ADD_FAILURE() << f.name << ": the tie " << hex(bitsOf(x)) << " (" << x
                      << ") went to the odd code " << hex(got);
      return;
    }
  }
  if (ok) {
    if (f.isSubnormalCode(got))
      ++tally.subnormals;
    if ((got & ~f.signBit) == 0)
      ++tally.zeros;
    return;
  }
  if (++tally.mismatches <= 10)
    ADD_FAILURE() << f.name << ": f32 " << hex(bitsOf(x)) << " (" << x
                  << ") -> runtime " << hex(got) << " (" << f.decode(got)
                  << "), APFloat " << hex(apCode) << " (" << text(apValue)
                  << "), expected " << hex(want);
}

std::string describe(const Format &f, const Tally &t) {
  std::ostringstream os;
  os << f.name << ": " << t.checked << " checked, " << t.ties << " ties ("
     << t.subnormalTies << " below the normal range), " << t.subnormals
     << " subnormal results, " << t.zeros << " zeros, " << t.saturated
     << " saturated, " << t.infinities << " infinities, " << t.nans << " NaNs";
  return os.str();
}

//===----------------------------------------------------------------------===//
// Decoding
//===----------------------------------------------------------------------===//

void checkEveryCode(const Format &f, int expectedNaNs, int expectedInfinities,
                    int expectedSubnormals) {
  int numCodes = 1 << APFloat::getSizeInBits(f.semantics);
  int nans = 0, infinities = 0, subnormals = 0;
  for (int code = 0; code < numCodes; ++code) {
    APFloat ap = apDecode(f.semantics, code);
    double got = f.decode(code);
    SCOPED_TRACE(std::string(f.name) + " code " + hex(code));
    EXPECT_EQ(static_cast<bool>(std::signbit(got)), ap.isNegative());
    if (ap.isNaN()) {
      ++nans;
      EXPECT_TRUE(std::isnan(got));
      continue;
    }
    infinities += ap.isInfinity();
    subnormals += ap.isDenormal();
    EXPECT_EQ(f.isSubnormalCode(code), ap.isDenormal());
    // Bit-exact as f32 (the runtime's result type) and as f64.
    APFloat single = ap;
    bool losesInfo;
    single.convert(APFloat::IEEEsingle(), APFloat::rmNearestTiesToEven,
                   &losesInfo);
    EXPECT_FALSE(losesInfo);
    EXPECT_EQ(bitsOf(static_cast<float>(got)),
              single.bitcastToAPInt().getZExtValue());
    EXPECT_EQ(bitsOf(got), bitsOf(exactDouble(ap)));
  }
  EXPECT_EQ(nans, expectedNaNs) << f.name;
  EXPECT_EQ(infinities, expectedInfinities) << f.name;
  EXPECT_EQ(subnormals, expectedSubnormals) << f.name;
}

TEST(Fp8VsAPFloat, EveryCodeDecodesAsAPFloatDecodesIt) {
  // f8E4M3FN: S.1111.111 is NaN (0x7f, 0xff), no infinity.
  checkEveryCode(e4m3fn(), 2, 0, 14);
  EXPECT_TRUE(std::isnan(e4m3fn().decode(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3fn().decode(0xff)));
  EXPECT_EQ(e4m3fn().decode(0x7e), 448.0);
  EXPECT_EQ(e4m3fn().decode(0xfe), -448.0);
  EXPECT_EQ(e4m3fn().decode(0x01), std::ldexp(1.0, -9));
  EXPECT_EQ(e4m3fn().decode(0x08), std::ldexp(1.0, -6));
  // f8E5M2: IEEE specials, 0x7d-0x7f and 0xfd-0xff NaN, 0x7c/0xfc infinite.
  checkEveryCode(e5m2(), 6, 2, 6);
  for (uint64_t code : {0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff})
    EXPECT_TRUE(std::isnan(e5m2().decode(code))) << hex(code);
  EXPECT_EQ(e5m2().decode(0x7c), std::numeric_limits<double>::infinity());
  EXPECT_EQ(e5m2().decode(0xfc), -std::numeric_limits<double>::infinity());
  EXPECT_EQ(e5m2().decode(0x7b), 57344.0);
  EXPECT_EQ(e5m2().decode(0x01), std::ldexp(1.0, -16));
  EXPECT_EQ(e5m2().decode(0x04), std::ldexp(1.0, -14));
}

TEST(Fp8VsAPFloat, Every16BitCodeDecodesAsAPFloatDecodesIt) {
  checkEveryCode(bf16(), 2 * 127, 2, 2 * 127);
  checkEveryCode(f16(), 2 * 1023, 2, 2 * 1023);
}

//===----------------------------------------------------------------------===//
// Encoding: the overflow boundary, named
//===----------------------------------------------------------------------===//

TEST(Fp8VsAPFloat, SaturationAtTheOverflowBoundary) {
  const float inf = std::numeric_limits<float>::infinity();
  const float fltMax = std::numeric_limits<float>::max();
  bool losesInfo;
  auto apIsNaN = [&](const Format &f, float x) {
    APFloat v(x);
    v.convert(f.semantics, APFloat::rmNearestTiesToEven, &losesInfo);
    return v.isNaN();
  };
  auto apIsInf = [&](const Format &f, float x) {
    APFloat v(x);
    v.convert(f.semantics, APFloat::rmNearestTiesToEven, &losesInfo);
    return v.isInfinity();
  };

  // f8E4M3FN: 448 = 1.110b * 2^8; the next step (480) is the NaN code, so
  // 464 is a tie that goes to the even 448; above it APFloat gives NaN and
  // the runtime 448.
  const Format &e4 = e4m3fn();
  EXPECT_EQ(e4.overflowMidpoint(), 464.0);
  for (float s : {1.0f, -1.0f}) {
    uint64_t sign = s < 0 ? 0x80 : 0;
    for (float x : {448.0f, std::nextafter(464.0f, 0.0f), 464.0f}) {
      EXPECT_EQ(e4.encode(s * x), sign | 0x7e) << s * x;
      EXPECT_EQ(apEncode(APFloat(s * x), e4.semantics), sign | 0x7e) << s * x;
    }
    for (float x : {std::nextafter(464.0f, inf), 480.0f, 1.0e4f, fltMax, inf}) {
      EXPECT_TRUE(apIsNaN(e4, s * x)) << s * x;
      EXPECT_EQ(e4.encode(s * x), sign | 0x7e) << s * x;
    }
  }

  // f8E5M2: 57344 = 1.11b * 2^15; the next step is 2^16 (infinity), so the
  // tie 61440 goes to the even infinity in IEEE rounding. APFloat gives
  // infinity from there on, the runtime 57344 — +-inf too (SATFINITE).
  const Format &e5 = e5m2();
  EXPECT_EQ(e5.overflowMidpoint(), 61440.0);
  for (float s : {1.0f, -1.0f}) {
    uint64_t sign = s < 0 ? 0x80 : 0;
    for (float x : {57344.0f, std::nextafter(61440.0f, 0.0f)}) {
      EXPECT_EQ(e5.encode(s * x), sign | 0x7b) << s * x;
      EXPECT_EQ(apEncode(APFloat(s * x), e5.semantics), sign | 0x7b) << s * x;
    }
    for (float x :
         {61440.0f, std::nextafter(61440.0f, inf), 65536.0f, 1.0e6f, fltMax}) {
      EXPECT_TRUE(apIsInf(e5, s * x)) << s * x;
      EXPECT_EQ(e5.encode(s * x), sign | 0x7b) << s * x;
    }
    EXPECT_EQ(e5.encode(s * inf), sign | 0x7b);
    EXPECT_EQ(apEncode(APFloat(s * inf), e5.semantics), sign | 0x7c);
  }

  // bf16 and f16 are IEEE: the same boundary gives infinity, as in APFloat.
  EXPECT_EQ(bf16().encode(fltMax), 0x7f80u);
  EXPECT_EQ(apEncode(APFloat(fltMax), bf16().semantics), 0x7f80u);
  EXPECT_EQ(f16().encode(65520.0f), 0x7c00u);
  EXPECT_EQ(f16().encode(std::nextafter(65520.0f, 0.0f)), 0x7bffu);
  EXPECT_EQ(apEncode(APFloat(65520.0f), f16().semantics), 0x7c00u);
}

//===----------------------------------------------------------------------===//
// Encoding: every bf16 value
//===----------------------------------------------------------------------===//

TEST(Fp8VsAPFloat, EveryBf16ValueRoundsAsAPFloatRoundsIt) {
  for (const Format *f : {&e4m3fn(), &e5m2()}) {
    Tally tally;
    for (uint32_t bits = 0; bits < 0x10000; ++bits)
      check(*f, floatOf(bits << 16), tally);
    EXPECT_EQ(tally.mismatches, 0) << f->name;
    EXPECT_EQ(tally.checked, 65536);
    EXPECT_EQ(tally.nans, 2 * 127);
    // Both zeros, and everything below half the smallest subnormal, keep
    // their sign.
    EXPECT_EQ(f->encode(0.0f), 0u);
    EXPECT_EQ(f->encode(-0.0f), f->signBit);
    // Eight ties a binade (one per fp8 step) in about 16 and 32 binades.
    EXPECT_GE(tally.ties, 200) << describe(*f, tally);
    EXPECT_GE(tally.subnormalTies, 8) << describe(*f, tally);
    EXPECT_GE(tally.subnormals, 500) << describe(*f, tally);
    EXPECT_GT(tally.saturated, 0) << describe(*f, tally);
    std::printf("every bf16 -> %s\n", describe(*f, tally).c_str());
  }
}

//===----------------------------------------------------------------------===//
// Encoding: a million random f32 values
//===----------------------------------------------------------------------===//

/// One random draw from the engine (whose output the standard fixes).
struct Random {
  std::mt19937_64 engine{0x45524e4945ull}; // "ERNIE"
  uint64_t bits() { return engine(); }
  uint64_t below(uint64_t n) { return engine() % n; }
  float sign(float x) { return (engine() & 1) ? -x : x; }
};

/// Exactly halfway between two adjacent values of f (up to the overflow
/// midpoint), exact in f32 since f keeps at most 11 significant bits.
float midpoint(const Format &f, Random &random) {
  uint64_t i = random.below(f.ladder.size() - 1);
  return static_cast<float>((f.ladder[i] + f.ladder[i + 1]) / 2);
}

/// The inputs: 40% uniform f32 bit patterns (NaNs, infinities and huge and
/// tiny values included); for each fp8 format 25%, a third of it exact
/// midpoints, a third midpoints moved by 1-4 f32 ulps, a third random
/// values over its range from below half the smallest subnormal to past
/// the overflow; 5% each exact bf16 and f16 midpoints.
std::vector<float> randomInputs() {
  Random random;
  std::vector<float> xs;
  xs.reserve(1000000);
  for (int i = 0; i < 400000; ++i)
    xs.push_back(floatOf(static_cast<uint32_t>(random.bits())));
  for (const Format *f : {&e4m3fn(), &e5m2()}) {
    int lowest = std::ilogb(f->ladder[1]) - 2,
        highest = std::ilogb(f->ladder.back());
    for (int i = 0; i < 250000; ++i) {
      float x;
      switch (i % 3) {
      case 0:
        x = midpoint(*f, random);
        break;
      case 1: {
        uint32_t step = 1 + random.below(4);
        uint32_t mid = bitsOf(midpoint(*f, random));
        x = floatOf((random.bits() & 1) ? mid + step : mid - step);
        break;
      }
      default: {
        uint32_t exponent = lowest + random.below(highest - lowest + 1) + 127;
        x = floatOf(exponent << 23 | (random.bits() & 0x7fffff));
        break;
      }
      }
      xs.push_back(random.sign(x));
    }
  }
  for (int i = 0; i < 50000; ++i)
    xs.push_back(random.sign(midpoint(bf16(), random)));
  for (int i = 0; i < 50000; ++i)
    xs.push_back(random.sign(midpoint(f16(), random)));
  return xs;
}

TEST(Fp8VsAPFloat, AMillionRandomFloatsRoundAsAPFloatRoundsThem) {
  const std::vector<float> xs = randomInputs();
  ASSERT_EQ(xs.size(), 1000000u);
  for (const Format *f : {&e4m3fn(), &e5m2(), &bf16(), &f16()}) {
    Tally tally;
    for (float x : xs)
      check(*f, x, tally);
    EXPECT_EQ(tally.mismatches, 0) << f->name;
    EXPECT_GE(tally.ties, 1000) << describe(*f, tally);
    EXPECT_GE(tally.subnormalTies, 100) << describe(*f, tally);
    EXPECT_GE(tally.subnormals, 1000) << describe(*f, tally);
    EXPECT_GE(tally.nans, 1000) << describe(*f, tally);
    if (f->saturates) {
      EXPECT_GE(tally.zeros, 1000) << describe(*f, tally);
      EXPECT_GE(tally.saturated, 1000) << describe(*f, tally);
    } else {
      // bf16 has f32's range: few random values underflow or overflow.
      EXPECT_GT(tally.zeros, 0) << describe(*f, tally);
      EXPECT_GT(tally.infinities, 0) << describe(*f, tally);
    }
    std::printf("1M random f32 -> %s\n", describe(*f, tally).c_str());
  }
}

//===----------------------------------------------------------------------===//
// Encoding from f64: rounded once
//===----------------------------------------------------------------------===//

TEST(Fp8VsAPFloat, DoublesRoundOnceAsAPFloatRoundsThem) {
  // Midpoints moved by far less than an f32 ulp: rounding to f32 first
  // would land on the tie and then go to even, which is wrong half the
  // time. APFloat rounds the double directly.
  struct DoubleFormat {
    const Format &format;
    uint64_t (*encode)(double);
  };
  const DoubleFormat formats[] = {
      {e4m3fn(), [](double x) -> uint64_t { return rt::doubleToF8E4M3FN(x); }},
      {e5m2(), [](double x) -> uint64_t { return rt::doubleToF8E5M2(x); }},
      {bf16(), [](double x) -> uint64_t { return rt::doubleToBf16(x); }},
      {f16(), [](double x) -> uint64_t { return rt::doubleToF16(x); }}};
  Random random;
  for (const DoubleFormat &d : formats) {
    const Format &f = d.format;
    int64_t mismatches = 0, nearTies = 0;
    for (int i = 0; i < 100000; ++i) {
      uint64_t index = random.below(f.ladder.size() - 1);
      double mid = (f.ladder[index] + f.ladder[index + 1]) / 2;
      // 2^-30 to 2^-50 of the value: well inside the f32 tie's rounding.
      double offset = std::ldexp(mid, -30 - static_cast<int>(random.below(21)));
      double x = random.sign(1.0f) *
                 ((random.bits() & 1) ? mid + offset : mid - offset);
      if (f.isTie(std::fabs(static_cast<double>(static_cast<float>(x)))))
        ++nearTies;
      uint64_t got = d.encode(x);
      uint64_t apCode = apEncode(APFloat(x), f.semantics);
      uint64_t want = apCode;
      if (f.saturates && !apDecode(f.semantics, apCode).isFinite())
        want = (std::signbit(x) ? f.signBit : 0) | f.maxFinite;
      if (got != want && ++mismatches <= 10)
        ADD_FAILURE() << f.name << ": f64 " << hex(bitsOf(x)) << " (" << x
                      << ") -> runtime " << hex(got) << ", APFloat "
                      << hex(apCode) << ", expected " << hex(want);
    }
    EXPECT_EQ(mismatches, 0) << f.name;
    // Each draw is such a case: f32 keeps at least 13 bits more than these
    // formats, subnormals included, and the offsets are below 2^-30.
    EXPECT_EQ(nearTies, 100000) << f.name;
    std::printf("f64 near %s ties: %lld draws, %lld rounding to an f32 tie\n",
                f.name, 100000ll, static_cast<long long>(nearTies));
  }
}

} // namespace

//===- FusedKernelTest.cpp - fused loops against the ops they replace -------===//
//
// A fused body must compute bit for bit what its ops' own kernels compute
// one after another on f32 and f64, round narrow floats only where it
// writes them, and refuse every body a fused region may not be.
//
//===----------------------------------------------------------------------===//

#include "ernie/runtime/FloatConvert.h"
#include "ernie/runtime/Kernel.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

using namespace ernie::runtime;
using ::testing::HasSubstr;

namespace {

std::vector<float> random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  std::vector<float> v(n);
  for (float &x : v)
    x = dist(rng);
  return v;
}

void runOp(const char *op, std::vector<TensorView> in, std::vector<TensorView> out,
           const Attrs &attrs = {}) {
  const Kernel *k = findCpuKernel(op);
  ASSERT_NE(k, nullptr) << op;
  (*k)(in, out, attrs);
}

/// x [R, C] and w [C]: s = sum_c (silu(x) * broadcast(w) + x)^2 per row,
/// y = silu(x) * broadcast(w) + x, and the row maxima of y.
FusedBody normLikeBody(int64_t rows, int64_t cols, DType type) {
  FusedBody b;
  b.inputs = 2;
  b.values = {{type, {rows, cols}},  // 0 x
              {type, {cols}},        // 1 w
              {type, {rows, cols}},  // 2 broadcast(w)
              {type, {rows, cols}},  // 3 silu(x)
              {type, {rows, cols}},  // 4 3 * 2
              {type, {rows, cols}},  // 5 4 + x
              {type, {rows, cols}},  // 6 5 * 5
              {type, {rows, 1}},     // 7 sum over columns, kept
              {type, {rows}}};       // 8 max over columns
  b.steps = {{"ernie.broadcast", {1}, {2}, Attrs{{"dims", std::vector<int64_t>{1}}}},
             {"ernie.silu", {0}, {3}, {}},
             {"ernie.mul", {3, 2}, {4}, {}},
             {"ernie.add", {4, 0}, {5}, {}},
             {"ernie.mul", {5, 5}, {6}, {}},
             {"ernie.reduce_sum", {6}, {7},
              Attrs{{"axes", std::vector<int64_t>{1}}, {"keepdim", true}}},
             {"ernie.reduce_max", {5}, {8}, Attrs{{"axes", std::vector<int64_t>{1}}}}};
  b.yields = {5, 7, 8};
  return b;
}

TEST(FusedKernel, EqualsTheOpsItReplacesBitForBit) {
  // Rows longer than a chunk (256) and not a multiple of it.
  const int64_t R = 5, C = 300;
  std::vector<float> x = random(R * C, 1), w = random(C, 2);
  // The ops one by one, through their own kernels.
  std::vector<float> wb(R * C), s(R * C), m(R * C), y(R * C), q(R * C),
      sum(R), max(R);
  TensorView X{x.data(), DType::F32, {R, C}}, W{w.data(), DType::F32, {C}};
  auto v = [&](std::vector<float> &d, std::vector<int64_t> shape) {
    return TensorView{d.data(), DType::F32, shape};
  };
  runOp("ernie.broadcast", {W}, {v(wb, {R, C})},
        Attrs{{"dims", std::vector<int64_t>{1}}});
  runOp("ernie.silu", {X}, {v(s, {R, C})});
  runOp("ernie.mul", {v(s, {R, C}), v(wb, {R, C})}, {v(m, {R, C})});
  runOp("ernie.add", {v(m, {R, C}), X}, {v(y, {R, C})});
  runOp("ernie.mul", {v(y, {R, C}), v(y, {R, C})}, {v(q, {R, C})});
  runOp("ernie.reduce_sum", {v(q, {R, C})}, {v(sum, {R, 1})},
        Attrs{{"axes", std::vector<int64_t>{1}}, {"keepdim", true}});
  runOp("ernie.reduce_max", {v(y, {R, C})}, {v(max, {R})},
        Attrs{{"axes", std::vector<int64_t>{1}}});

  Kernel fused = makeCpuFusedKernel(normLikeBody(R, C, DType::F32));
  std::vector<float> fy(R * C), fsum(R), fmax(R);
  fused({X, W}, {v(fy, {R, C}), v(fsum, {R, 1}), v(fmax, {R})}, {});
  EXPECT_EQ(0, std::memcmp(fy.data(), y.data(), y.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(fsum.data(), sum.data(), R * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(fmax.data(), max.data(), R * sizeof(float)));
  // A second call reuses the thread's registers and accumulators.
  fused({X, W}, {v(fy, {R, C}), v(fsum, {R, 1}), v(fmax, {R})}, {});
  EXPECT_EQ(0, std::memcmp(fsum.data(), sum.data(), R * sizeof(float)));
}

TEST(FusedKernel, NarrowFloatsRoundOnlyWhereWritten) {
  // bf16 x: y = x * x * 1.01 in f32, rounded once; the unfused ops would
  // round x * x to bf16 first.
  const int64_t n = 1000;
  std::vector<float> wide = random(n, 3);
  std::vector<uint16_t> x(n);
  floatToNarrow(DType::BF16, wide.data(), x.data(), n);
  FusedBody b;
  b.inputs = 1;
  b.values = {{DType::BF16, {n}}, {DType::BF16, {n}}, {DType::BF16, {n}},
              {DType::BF16, {n}}};
  b.steps = {{"ernie.mul", {0, 0}, {1}, {}},
             {"ernie.full", {}, {2}, Attrs{{"value", 1.01}}},
             {"ernie.mul", {1, 2}, {3}, {}}};
  b.yields = {3};
  std::vector<uint16_t> y(n);
  makeCpuFusedKernel(b)({{x.data(), DType::BF16, {n}}},
                        {{y.data(), DType::BF16, {n}}}, {});
  const float k = bf16ToFloat(floatToBf16(1.01f)); // the fill, as bf16 holds it
  int roundedDifferently = 0;
  for (int64_t i = 0; i < n; ++i) {
    float xi = bf16ToFloat(x[i]);
    EXPECT_EQ(y[i], floatToBf16(xi * xi * k)) << i;
    roundedDifferently +=
        y[i] != floatToBf16(bf16ToFloat(floatToBf16(xi * xi)) * k);
  }
  EXPECT_GT(roundedDifferently, 0); // the check above can tell them apart
}

TEST(FusedKernel, F64RegionsComputeInF64) {
  const int64_t n = 7;
  std::vector<double> x = {0.1, -2.5, 3.0, 1e-300, -0.0, 7.25, 1e10};
  FusedBody b;
  b.inputs = 1;
  b.values = {{DType::F64, {n}}, {DType::F64, {n}}, {DType::F64, {n}}};
  b.steps = {{"ernie.exp", {0}, {1}, {}}, {"ernie.div", {1, 0}, {2}, {}}};
  b.yields = {2};
  std::vector<double> y(n);
  makeCpuFusedKernel(b)({{x.data(), DType::F64, {n}}},
                        {{y.data(), DType::F64, {n}}}, {});
  for (int64_t i = 0; i < n; ++i)
    EXPECT_EQ(y[i], std::exp(x[i]) / x[i]) << i;
}

TEST(FusedKernel, RefusesBodiesARegionMayNotBe) {
  auto refuses = [](FusedBody b, const char *why) {
    EXPECT_THAT([&] { makeCpuFusedKernel(b); },
                ::testing::ThrowsMessage<KernelError>(HasSubstr(why)));
  };
  FusedBody matmul;
  matmul.inputs = 1;
  matmul.values = {{DType::F32, {4, 4}}, {DType::F32, {4, 4}}};
  matmul.steps = {{"ernie.matmul", {0, 0}, {1}, {}}};
  matmul.yields = {1};
  refuses(matmul, "cannot be part of a fused body");

  FusedBody mixed;
  mixed.inputs = 1;
  mixed.values = {{DType::F32, {4}}, {DType::F64, {4}}};
  mixed.steps = {{"ernie.cast", {0}, {1}, {}}};
  mixed.yields = {1};
  refuses(mixed, "mixes f64 with narrower floats");

  FusedBody integers = matmul;
  integers.values = {{DType::I64, {4}}, {DType::I64, {4}}};
  integers.steps = {{"ernie.neg", {0}, {1}, {}}};
  refuses(integers, "only floats and i1 masks are fused");

  FusedBody reads = normLikeBody(2, 3, DType::F32);
  reads.steps[2].operands = {3, 7}; // a reduction's result, before it exists
  refuses(reads, "before it is computed");

  FusedBody late = normLikeBody(2, 3, DType::F32);
  late.values.push_back({DType::F32, {2, 3}});
  late.steps.push_back({"ernie.exp", {7}, {9}, {}});
  refuses(late, "reductions end a region");

  FusedBody bcast = normLikeBody(2, 3, DType::F32);
  bcast.steps[0].attrs = Attrs{{"dims", std::vector<int64_t>{0}}};
  refuses(bcast, "dims do not map its input");

  FusedBody offShape = normLikeBody(2, 3, DType::F32);
  offShape.steps[1].operands = {1}; // silu of w [3], not [2, 3]
  refuses(offShape, "without a broadcast but does not have the iteration shape");

  FusedBody gap = normLikeBody(2, 3, DType::F32);
  gap.steps[1].results = {4};
  refuses(gap, "must define value 3");

  FusedBody axes = normLikeBody(2, 3, DType::F32);
  axes.steps[5].attrs = Attrs{{"axes", std::vector<int64_t>{2}}, {"keepdim", true}};
  refuses(axes, "reduction axes must be distinct dimensions");

  FusedBody yields = normLikeBody(2, 3, DType::F32);
  yields.yields = {42};
  refuses(yields, "yields a value that does not exist");
}

} // namespace

namespace {

/// Distance in units in the last place between two finite floats.
int64_t ulps(float a, float b) {
  int32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  if ((x < 0) != (y < 0))
    return a == b ? 0 : INT64_MAX;
  return std::llabs(int64_t(x) - int64_t(y));
}

TEST(ElementwiseExp, WithinTwoUlpOfExpAndExactAtTheEdges) {
  // Every 2^-12 from -87 to 88.7 (the normal range), and the special cases.
  std::vector<float> x;
  for (float v = -87.0f; v < 88.7f; v += 1.0f / 4096)
    x.push_back(v);
  const float inf = std::numeric_limits<float>::infinity();
  x.insert(x.end(), {0.0f, -0.0f, 1e-30f, -1e-30f, 88.72f, 88.8f, inf, -inf,
                     -90.0f, -1000.0f, std::nanf("")});
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> y(n);
  runOp("ernie.exp", {{x.data(), DType::F32, {n}}}, {{y.data(), DType::F32, {n}}});
  int64_t worst = 0;
  for (int64_t i = 0; i + 11 < n; ++i)
    worst = std::max(worst, ulps(y[i], std::exp(x[i])));
  EXPECT_LE(worst, 2);
  EXPECT_EQ(y[n - 11], 1.0f);
  EXPECT_EQ(y[n - 10], 1.0f);
  EXPECT_EQ(y[n - 9], 1.0f);
  EXPECT_EQ(y[n - 8], 1.0f);
  EXPECT_LE(ulps(y[n - 7], std::exp(88.72f)), 2);
  EXPECT_EQ(y[n - 6], inf); // past the largest float
  EXPECT_EQ(y[n - 5], inf);
  EXPECT_EQ(y[n - 4], 0.0f);
  EXPECT_EQ(y[n - 3], 0.0f); // subnormal results flush to 0
  EXPECT_EQ(y[n - 2], 0.0f);
  EXPECT_TRUE(std::isnan(y[n - 1]));
}

} // namespace

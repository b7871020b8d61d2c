//===- CpuKernelTest.cpp - CPU kernels against naive references -------------===//

#include "ernie/runtime/FloatConvert.h"
#include "ernie/runtime/Kernel.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>

#include <cmath>
#include <cstring>
#include <random>

using namespace ernie::runtime;
using ::testing::HasSubstr;

namespace {

/// A tensor that owns its buffer.
template <typename T> struct Owned {
  std::vector<T> data;
  std::vector<int64_t> shape;
  DType type;
  TensorView view() { return {data.data(), type, shape}; }
};

template <typename T>
Owned<T> make(std::vector<int64_t> shape, DType type, uint32_t seed = 1) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-2.0, 2.0);
  Owned<T> t{std::vector<T>(n), shape, type};
  for (auto &x : t.data)
    x = static_cast<T>(dist(rng));
  return t;
}

void run(const char *op, std::vector<TensorView> in, std::vector<TensorView> out,
         const Attrs &attrs = {}) {
  const Kernel *k = findCpuKernel(op);
  ASSERT_NE(k, nullptr) << op;
  (*k)(in, out, attrs);
}

TEST(CpuKernels, UnaryMatchTheirDefinitions) {
  auto x = make<double>({3, 5}, DType::F64);
  auto y = make<double>({3, 5}, DType::F64);
  struct Case {
    const char *op;
    double (*ref)(double);
  } cases[] = {
      {"ernie.neg", [](double v) { return -v; }},
      {"ernie.abs", [](double v) { return std::fabs(v); }},
      {"ernie.relu", [](double v) { return v > 0 ? v : 0.0; }},
      {"ernie.exp", [](double v) { return std::exp(v); }},
      {"ernie.tanh", [](double v) { return std::tanh(v); }},
      {"ernie.erf", [](double v) { return std::erf(v); }},
      {"ernie.sigmoid", [](double v) { return 1 / (1 + std::exp(-v)); }},
      {"ernie.silu", [](double v) { return v / (1 + std::exp(-v)); }},
      {"ernie.reciprocal", [](double v) { return 1 / v; }},
      {"ernie.gelu", [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }},
  };
  for (const Case &c : cases) {
    run(c.op, {x.view()}, {y.view()});
    for (size_t i = 0; i < x.data.size(); ++i)
      EXPECT_NEAR(y.data[i], c.ref(x.data[i]), 1e-14) << c.op;
  }
  auto pos = make<float>({7}, DType::F32);
  for (auto &v : pos.data)
    v = std::fabs(v) + 0.5f;
  auto out = make<float>({7}, DType::F32);
  run("ernie.rsqrt", {pos.view()}, {out.view()});
  for (size_t i = 0; i < 7; ++i)
    EXPECT_FLOAT_EQ(out.data[i], 1 / std::sqrt(pos.data[i]));
}

TEST(CpuKernels, BinaryIncludingIntegers) {
  auto a = make<double>({4, 3}, DType::F64, 2), b = make<double>({4, 3}, DType::F64, 3);
  auto y = make<double>({4, 3}, DType::F64);
  run("ernie.div", {a.view(), b.view()}, {y.view()});
  for (size_t i = 0; i < y.data.size(); ++i)
    EXPECT_DOUBLE_EQ(y.data[i], a.data[i] / b.data[i]);
  Owned<int64_t> i1{{7, -7, 9}, {3}, DType::I64}, i2{{2, 2, -4}, {3}, DType::I64},
      io{{0, 0, 0}, {3}, DType::I64};
  run("ernie.div", {i1.view(), i2.view()}, {io.view()});
  EXPECT_EQ(io.data, (std::vector<int64_t>{3, -3, -2})); // truncation
  run("ernie.maximum", {i1.view(), i2.view()}, {io.view()});
  EXPECT_EQ(io.data, (std::vector<int64_t>{7, 2, 9}));
  Owned<int64_t> zero{{1, 0, 1}, {3}, DType::I64};
  EXPECT_THROW(run("ernie.div", {i1.view(), zero.view()}, {io.view()}), KernelError);
}

TEST(CpuKernels, CompareSelectCast) {
  Owned<float> a{{1, 2, 3}, {3}, DType::F32}, b{{3, 2, 1}, {3}, DType::F32};
  Owned<uint8_t> m{{0, 0, 0}, {3}, DType::I1};
  run("ernie.compare", {a.view(), b.view()}, {m.view()}, {{"direction", int64_t{3}}});
  EXPECT_EQ(m.data, (std::vector<uint8_t>{1, 1, 0})); // le
  Owned<float> y{{0, 0, 0}, {3}, DType::F32};
  run("ernie.select", {m.view(), a.view(), b.view()}, {y.view()});
  EXPECT_EQ(y.data, (std::vector<float>{1, 2, 1}));
  // bf16 rounds to nearest even: 1 + 2^-8 is a tie between 1 and 1 + 2^-7.
  Owned<float> f{{1.0f + 1.0f / 256, 1.0f + 3.0f / 256, -2.5f}, {3}, DType::F32};
  Owned<uint16_t> h{{0, 0, 0}, {3}, DType::BF16};
  run("ernie.cast", {f.view()}, {h.view()});
  Owned<float> back{{0, 0, 0}, {3}, DType::F32};
  run("ernie.cast", {h.view()}, {back.view()});
  EXPECT_EQ(back.data, (std::vector<float>{1.0f, 1.0f + 4.0f / 256, -2.5f}));
  Owned<int32_t> i{{0, 0, 0}, {3}, DType::I32};
  run("ernie.cast", {f.view()}, {i.view()});
  EXPECT_EQ(i.data, (std::vector<int32_t>{1, 1, -2})); // toward zero
}

// Values at the edges: NaN survives max wherever it sits, topk ranks NaN
// above every number, integers compare exactly beyond 2^53, and casts of
// NaN or out-of-range floats to integers saturate instead of being UB.
TEST(CpuKernels, EdgeValues) {
  const double nan = std::nan("");
  Owned<double> x{{1, nan, 2}, {1, 3}, DType::F64}, mx{{0}, {1, 1}, DType::F64};
  run("ernie.reduce_max", {x.view()}, {mx.view()},
      {{"axes", std::vector<int64_t>{1}}, {"keepdim", true}});
  EXPECT_TRUE(std::isnan(mx.data[0]));

  Owned<double> t{{1, nan, 5, 3}, {1, 4}, DType::F64}, vals{std::vector<double>(2), {1, 2}, DType::F64};
  Owned<int64_t> idx{std::vector<int64_t>(2), {1, 2}, DType::I64};
  run("ernie.topk", {t.view()}, {vals.view(), idx.view()}, {{"k", int64_t{2}}, {"axis", int64_t{1}}});
  EXPECT_EQ(idx.data, (std::vector<int64_t>{1, 2}));
  EXPECT_THROW(run("ernie.topk", {t.view()}, {vals.view(), idx.view()},
                   {{"k", int64_t{5}}, {"axis", int64_t{1}}}),
               KernelError);

  const int64_t big = int64_t{1} << 53;
  Owned<int64_t> a{{big + 1}, {1}, DType::I64}, b{{big}, {1}, DType::I64};
  Owned<uint8_t> eq{{1}, {1}, DType::I1};
  run("ernie.compare", {a.view(), b.view()}, {eq.view()}, {{"direction", int64_t{0}}});
  EXPECT_EQ(eq.data[0], 0);

  Owned<double> f{{nan, 1e30, -1e30, -7.9}, {4}, DType::F64};
  Owned<int32_t> i{std::vector<int32_t>(4), {4}, DType::I32};
  run("ernie.cast", {f.view()}, {i.view()});
  EXPECT_EQ(i.data, (std::vector<int32_t>{0, INT32_MAX, INT32_MIN, -7}));

  // f64 -> bf16 rounds once: 1 + 2^-8 + 2^-30 is just above the tie, so up.
  Owned<double> d{{1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30), 1.0 + std::ldexp(1.0, -8)},
                  {2}, DType::F64};
  Owned<uint16_t> h{{0, 0}, {2}, DType::BF16};
  run("ernie.cast", {d.view()}, {h.view()});
  EXPECT_EQ(h.data, (std::vector<uint16_t>{0x3f81, 0x3f80})); // the exact tie goes to even
}

TEST(CpuKernels, FullAndIota) {
  Owned<int64_t> t{std::vector<int64_t>(6), {2, 3}, DType::I64};
  run("ernie.iota", {}, {t.view()}, {{"dimension", int64_t{1}}});
  EXPECT_EQ(t.data, (std::vector<int64_t>{0, 1, 2, 0, 1, 2}));
  Owned<float> f{std::vector<float>(4), {4}, DType::F32};
  run("ernie.full", {}, {f.view()}, {{"value", 2.5}});
  EXPECT_EQ(f.data, (std::vector<float>{2.5, 2.5, 2.5, 2.5}));
}

/// out[b, i, j] = sum_p a(b, i, p) b(b, p, j), read with the transposes.
template <typename T>
std::vector<T> naiveMatmul(const Owned<T> &a, const Owned<T> &b, bool ta, bool tb,
                           int64_t batches, int64_t m, int64_t n, int64_t k,
                           bool sharedRhs) {
  std::vector<T> out(batches * m * n);
  for (int64_t bb = 0; bb < batches; ++bb)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        T acc = 0;
        for (int64_t p = 0; p < k; ++p) {
          T x = a.data[bb * m * k + (ta ? p * m + i : i * k + p)];
          T y = b.data[(sharedRhs ? 0 : bb * k * n) + (tb ? j * k + p : p * n + j)];
          acc += x * y;
        }
        out[bb * m * n + i * n + j] = acc;
      }
  return out;
}

/// f64 operands of a [B] x [m, k] by [k, n] product (transposed as asked,
/// the rhs shared by the batches or one per batch) and its attributes.
struct MatmulCase {
  Owned<double> a, b;
  Attrs attrs;
};
MatmulCase matmulCase(int64_t B, int64_t m, int64_t n, int64_t k, bool ta,
                      bool tb, bool shared, uint32_t seed) {
  std::vector<int64_t> aShape = ta ? std::vector<int64_t>{B, k, m}
                                   : std::vector<int64_t>{B, m, k};
  std::vector<int64_t> bShape = tb ? std::vector<int64_t>{n, k}
                                   : std::vector<int64_t>{k, n};
  if (!shared)
    bShape.insert(bShape.begin(), B);
  MatmulCase c{make<double>(aShape, DType::F64, seed),
               make<double>(bShape, DType::F64, seed + 1), {}};
  c.attrs.set("transpose_a", ta);
  c.attrs.set("transpose_b", tb);
  return c;
}

TEST(CpuKernels, MatmulEveryTransposeBatchedAndSharedRhs) {
  const int64_t B = 3, m = 4, n = 5, k = 6;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool shared : {false, true}) {
        auto [a, b, attrs] = matmulCase(B, m, n, k, ta, tb, shared, 5);
        auto y = make<double>({B, m, n}, DType::F64);
        run("ernie.matmul", {a.view(), b.view()}, {y.view()}, attrs);
        auto want = naiveMatmul(a, b, ta, tb, B, m, n, k, shared);
        for (size_t i = 0; i < want.size(); ++i)
          EXPECT_NEAR(y.data[i], want[i], 1e-12)
              << "ta=" << ta << " tb=" << tb << " shared=" << shared;
      }
  Owned<int32_t> ia{{1, 2, 3, 4}, {2, 2}, DType::I32}, ib{{5, 6, 7, 8}, {2, 2}, DType::I32},
      iy{std::vector<int32_t>(4), {2, 2}, DType::I32};
  run("ernie.matmul", {ia.view(), ib.view()}, {iy.view()});
  EXPECT_EQ(iy.data, (std::vector<int32_t>{19, 22, 43, 50}));
}

TEST(CpuKernels, MatmulAccumulateAddsTheUnroundedProduct) {
  // f64: s + a x b for every transpose, batched and with a shared rhs.
  const int64_t B = 2, m = 3, n = 4, k = 5;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool shared : {false, true}) {
        auto [a, b, attrs] = matmulCase(B, m, n, k, ta, tb, shared, 8);
        auto s = make<double>({B, m, n}, DType::F64, 10);
        auto y = make<double>({B, m, n}, DType::F64);
        run("ernie.matmul_accumulate", {a.view(), b.view(), s.view()},
            {y.view()}, attrs);
        auto product = naiveMatmul(a, b, ta, tb, B, m, n, k, shared);
        for (size_t i = 0; i < product.size(); ++i)
          EXPECT_NEAR(y.data[i], s.data[i] + product[i], 1e-12)
              << "ta=" << ta << " tb=" << tb << " shared=" << shared;
        // In place over the sum (the memory plan's case): the same numbers.
        run("ernie.matmul_accumulate", {a.view(), b.view(), s.view()},
            {s.view()}, attrs);
        EXPECT_EQ(s.data, y.data);
      }
  // bf16 operands, an f32 sum: (1 + 2^-7)^2 = 1 + 2^-6 + 2^-14 is kept
  // whole; a bf16 product (8 significant bits) would round 2^-14 away.
  uint16_t x = floatToBf16(1.0f + 0x1p-7f);
  Owned<uint16_t> ab{{x}, {1, 1}, DType::BF16}, bb{{x}, {1, 1}, DType::BF16};
  Owned<float> sum{{0.5f}, {1, 1}, DType::F32};
  run("ernie.matmul_accumulate", {ab.view(), bb.view(), sum.view()},
      {sum.view()});
  EXPECT_EQ(sum.data[0], 0.5f + 1.0f + 0x1p-6f + 0x1p-14f);
}

TEST(CpuKernels, ReductionsSoftmaxNorms) {
  auto x = make<double>({2, 3, 4}, DType::F64, 7);
  Owned<double> s{std::vector<double>(2 * 4), {2, 4}, DType::F64};
  run("ernie.reduce_sum", {x.view()}, {s.view()}, {{"axes", std::vector<int64_t>{1}}});
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      double want = 0;
      for (int p = 0; p < 3; ++p)
        want += x.data[i * 12 + p * 4 + j];
      EXPECT_NEAR(s.data[i * 4 + j], want, 1e-14);
    }
  Owned<double> mx{std::vector<double>(3), {1, 3, 1}, DType::F64};
  Attrs keep{{"axes", std::vector<int64_t>{0, 2}}, {"keepdim", true}};
  run("ernie.reduce_max", {x.view()}, {mx.view()}, keep);
  for (int p = 0; p < 3; ++p) {
    double want = -1e300;
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 4; ++j)
        want = std::max(want, x.data[i * 12 + p * 4 + j]);
    EXPECT_EQ(mx.data[p], want);
  }
  auto y = make<double>({2, 3, 4}, DType::F64);
  run("ernie.softmax", {x.view()}, {y.view()}, {{"axis", int64_t{1}}});
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      double total = 0;
      for (int p = 0; p < 3; ++p)
        total += std::exp(x.data[i * 12 + p * 4 + j]);
      for (int p = 0; p < 3; ++p)
        EXPECT_NEAR(y.data[i * 12 + p * 4 + j],
                    std::exp(x.data[i * 12 + p * 4 + j]) / total, 1e-14);
    }
  auto w = make<double>({4}, DType::F64, 8), bias = make<double>({4}, DType::F64, 9);
  run("ernie.layer_norm", {x.view(), w.view(), bias.view()}, {y.view()},
      {{"epsilon", 1e-5}});
  for (int r = 0; r < 6; ++r) {
    double mean = 0, var = 0;
    for (int j = 0; j < 4; ++j)
      mean += x.data[r * 4 + j] / 4;
    for (int j = 0; j < 4; ++j)
      var += (x.data[r * 4 + j] - mean) * (x.data[r * 4 + j] - mean) / 4;
    for (int j = 0; j < 4; ++j)
      EXPECT_NEAR(y.data[r * 4 + j],
                  (x.data[r * 4 + j] - mean) / std::sqrt(var + 1e-5) * w.data[j] + bias.data[j],
                  1e-12);
  }
  EXPECT_THROW(run("ernie.softmax", {x.view()}, {y.view()}, {{"axis", int64_t{3}}}),
               KernelError);
}

TEST(CpuKernels, DataMovement) {
  Owned<int32_t> x{{0, 1, 2, 3, 4, 5}, {2, 3}, DType::I32};
  Owned<int32_t> t{std::vector<int32_t>(6), {3, 2}, DType::I32};
  run("ernie.transpose", {x.view()}, {t.view()}, {{"perm", std::vector<int64_t>{1, 0}}});
  EXPECT_EQ(t.data, (std::vector<int32_t>{0, 3, 1, 4, 2, 5}));
  Owned<int32_t> b{std::vector<int32_t>(12), {2, 2, 3}, DType::I32};
  run("ernie.broadcast", {x.view()}, {b.view()}, {{"dims", std::vector<int64_t>{0, 2}}});
  EXPECT_EQ(b.data, (std::vector<int32_t>{0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5}));
  Owned<int32_t> s{std::vector<int32_t>(2), {2, 1}, DType::I32};
  run("ernie.slice", {x.view()}, {s.view()},
      {{"start", std::vector<int64_t>{0, 1}}, {"limit", std::vector<int64_t>{2, 3}},
       {"step", std::vector<int64_t>{1, 2}}});
  EXPECT_EQ(s.data, (std::vector<int32_t>{1, 4}));
  Owned<int32_t> c{std::vector<int32_t>(8), {2, 4}, DType::I32};
  run("ernie.concat", {x.view(), s.view()}, {c.view()}, {{"axis", int64_t{1}}});
  EXPECT_EQ(c.data, (std::vector<int32_t>{0, 1, 2, 1, 3, 4, 5, 4}));
}

/// Row-major coordinates of flat index i in `shape`.
std::vector<int64_t> coordsOf(int64_t i, const std::vector<int64_t> &shape) {
  std::vector<int64_t> c(shape.size());
  for (int64_t d = int64_t(shape.size()) - 1; d >= 0; --d) {
    c[d] = i % shape[d];
    i /= shape[d];
  }
  return c;
}

int64_t flatOf(const std::vector<int64_t> &c, const std::vector<int64_t> &shape) {
  int64_t i = 0;
  for (size_t d = 0; d < shape.size(); ++d)
    i = i * shape[d] + c[d];
  return i;
}

// The kernels walk rows of merged dimensions; the references walk every
// element by its coordinates. Every permutation of a rank-4 tensor with
// extent-1 dimensions (which the walk drops), in 2- and 8-byte elements.
TEST(CpuKernels, TransposeBroadcastSliceAndPadMatchCoordinateWalks) {
  const std::vector<int64_t> shape = {3, 1, 4, 5};
  Owned<int64_t> x{std::vector<int64_t>(60), shape, DType::I64};
  Owned<uint16_t> x16{std::vector<uint16_t>(60), shape, DType::BF16};
  for (int64_t i = 0; i < 60; ++i) {
    x.data[i] = i * 7919;
    x16.data[i] = uint16_t(i * 31 + 1);
  }
  std::vector<int64_t> perm = {0, 1, 2, 3};
  do {
    std::vector<int64_t> outShape;
    for (int64_t p : perm)
      outShape.push_back(shape[p]);
    Owned<int64_t> t{std::vector<int64_t>(60), outShape, DType::I64};
    Owned<uint16_t> t16{std::vector<uint16_t>(60), outShape, DType::BF16};
    Attrs attrs{{"perm", perm}};
    run("ernie.transpose", {x.view()}, {t.view()}, attrs);
    run("ernie.transpose", {x16.view()}, {t16.view()}, attrs);
    for (int64_t i = 0; i < 60; ++i) {
      std::vector<int64_t> c = coordsOf(i, outShape), from(4);
      for (int d = 0; d < 4; ++d)
        from[perm[d]] = c[d];
      ASSERT_EQ(t.data[i], x.data[flatOf(from, shape)]) << i;
      ASSERT_EQ(t16.data[i], x16.data[flatOf(from, shape)]) << i;
    }
  } while (std::next_permutation(perm.begin(), perm.end()));

  // [3, 1, 5] -> [2, 3, 4, 5]: dims {1, 2, 3}, the 1 stretched over 4.
  Owned<int64_t> small{std::vector<int64_t>(15), {3, 1, 5}, DType::I64};
  for (int64_t i = 0; i < 15; ++i)
    small.data[i] = 100 + i;
  const std::vector<int64_t> big = {2, 3, 4, 5};
  Owned<int64_t> b{std::vector<int64_t>(120), big, DType::I64};
  run("ernie.broadcast", {small.view()}, {b.view()},
      {{"dims", std::vector<int64_t>{1, 2, 3}}});
  for (int64_t i = 0; i < 120; ++i) {
    std::vector<int64_t> c = coordsOf(i, big);
    ASSERT_EQ(b.data[i], small.data[c[1] * 5 + c[3]]) << i;
  }

  // A strided slice [1:3:1, 0:1, 0:4:3, 1:5:2] and a pad with interior gaps.
  Owned<int64_t> sl{std::vector<int64_t>(8), {2, 1, 2, 2}, DType::I64};
  run("ernie.slice", {x.view()}, {sl.view()},
      {{"start", std::vector<int64_t>{1, 0, 0, 1}},
       {"limit", std::vector<int64_t>{3, 1, 4, 5}},
       {"step", std::vector<int64_t>{1, 1, 3, 2}}});
  for (int64_t i = 0; i < 8; ++i) {
    std::vector<int64_t> c = coordsOf(i, sl.shape);
    std::vector<int64_t> from = {1 + c[0], c[1], 3 * c[2], 1 + 2 * c[3]};
    ASSERT_EQ(sl.data[i], x.data[flatOf(from, shape)]) << i;
  }
  const std::vector<int64_t> low = {1, 0, 2, 0}, interior = {0, 1, 1, 2};
  std::vector<int64_t> padded(4);
  for (int d = 0; d < 4; ++d)
    padded[d] = low[d] + shape[d] + (shape[d] - 1) * interior[d] + 1;
  int64_t n = 1;
  for (int64_t e : padded)
    n *= e;
  Owned<int64_t> p{std::vector<int64_t>(n, -1), padded, DType::I64};
  run("ernie.pad", {x.view()}, {p.view()},
      {{"low", low}, {"high", std::vector<int64_t>{1, 1, 1, 1}}, {"interior", interior}});
  std::vector<int64_t> want(n, 0);
  for (int64_t i = 0; i < 60; ++i) {
    std::vector<int64_t> c = coordsOf(i, shape), to(4);
    for (int d = 0; d < 4; ++d)
      to[d] = low[d] + c[d] * (interior[d] + 1);
    want[flatOf(to, padded)] = x.data[i];
  }
  EXPECT_EQ(p.data, want);
}

// Every subset of axes of a [3, 4, 1, 5, 2] f32 tensor: each output element
// is its terms summed (or maxed) in increasing input index — bit for bit.
TEST(CpuKernels, ReductionsOverEveryAxisSubsetSumInIndexOrder) {
  const std::vector<int64_t> shape = {3, 4, 1, 5, 2};
  auto x = make<float>(shape, DType::F32, 11);
  for (int mask = 1; mask < 32; ++mask) {
    std::vector<int64_t> axes, kept;
    for (int d = 0; d < 5; ++d) {
      if (mask & (1 << d))
        axes.push_back(d);
      else
        kept.push_back(shape[d]);
    }
    int64_t n = 1;
    for (int64_t e : kept)
      n *= e;
    for (const char *op : {"ernie.reduce_sum", "ernie.reduce_max", "ernie.reduce_mean"}) {
      SCOPED_TRACE(::testing::Message() << op << " mask " << mask);
      bool max = std::string(op) == "ernie.reduce_max";
      std::vector<float> want(n, max ? -INFINITY : 0.0f);
      std::vector<int64_t> counts(n, 0);
      for (int64_t i = 0; i < 120; ++i) {
        std::vector<int64_t> c = coordsOf(i, shape), k;
        for (int d = 0; d < 5; ++d)
          if (!(mask & (1 << d)))
            k.push_back(c[d]);
        int64_t o = flatOf(k, kept);
        want[o] = max ? std::max(want[o], x.data[i]) : want[o] + x.data[i];
        ++counts[o];
      }
      if (std::string(op) == "ernie.reduce_mean")
        for (int64_t o = 0; o < n; ++o)
          want[o] /= float(counts[o]);
      Owned<float> y{std::vector<float>(n), kept, DType::F32};
      run(op, {x.view()}, {y.view()}, {{"axes", axes}});
      for (int64_t o = 0; o < n; ++o)
        ASSERT_EQ(y.data[o], want[o]) << o;
    }
  }
}

TEST(CpuKernels, TableAndMissingAttributes) {
  EXPECT_EQ(findCpuKernel("ernie.no_such_op"), nullptr);
  EXPECT_GE(cpuKernelNames().size(), 30u);
  auto x = make<double>({2, 2}, DType::F64);
  EXPECT_THROW(run("ernie.transpose", {x.view()}, {x.view()}), KernelError);
}

} // namespace

namespace {

/// Central finite differences of sum(w * f(x)) for a kernel whose first
/// input is perturbed: the directional check every backward kernel gets.
double weightedSum(const std::vector<double> &y, const std::vector<double> &w) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i)
    s += y[i] * w[i];
  return s;
}

TEST(CpuKernels, AttentionGradientMatchesFiniteDifferences) {
  // window 0: none; 2: a sliding window of two keys (causal only).
  for (auto [causal, window] : {std::pair{false, 0}, std::pair{true, 0}, std::pair{true, 2}}) {
    auto q = make<double>({1, 4, 4, 3}, DType::F64, 11);
    auto k = make<double>({1, 4, 2, 3}, DType::F64, 12);
    auto v = make<double>({1, 4, 2, 3}, DType::F64, 13);
    auto w = make<double>({1, 4, 4, 3}, DType::F64, 14); // dout
    Attrs attrs;
    attrs.set("causal", causal);
    if (window)
      attrs.set("window", int64_t(window));
    auto forward = [&](Owned<double> &qq, Owned<double> &kk, Owned<double> &vv) {
      auto o = make<double>({1, 4, 4, 3}, DType::F64);
      run("ernie.attention", {qq.view(), kk.view(), vv.view()}, {o.view()}, attrs);
      return weightedSum(o.data, w.data);
    };
    auto dq = make<double>({1, 4, 4, 3}, DType::F64), dk = make<double>({1, 4, 2, 3}, DType::F64),
         dv = make<double>({1, 4, 2, 3}, DType::F64);
    run("ernie.attention_grad", {q.view(), k.view(), v.view(), w.view()},
        {dq.view(), dk.view(), dv.view()}, attrs);
    for (auto [x, g] : {std::pair{&q, &dq}, std::pair{&k, &dk}, std::pair{&v, &dv}})
      for (size_t i = 0; i < x->data.size(); ++i) {
        double saved = x->data[i], h = 1e-6;
        x->data[i] = saved + h;
        double up = forward(q, k, v);
        x->data[i] = saved - h;
        double down = forward(q, k, v);
        x->data[i] = saved;
        EXPECT_NEAR(g->data[i], (up - down) / (2 * h), 1e-7)
            << "causal=" << causal << " window=" << window;
      }
  }
}

TEST(CpuKernels, AttentionInQueryStripsMatchesTheWholeMatrix) {
  // 150 queries: strips of 64, 64 and 22, the causal ones stopping at their
  // last row's key (a window of 40 reaching back across strip boundaries).
  // The forward equals softmax over the whole score matrix (written out
  // here), and the gradients finite differences, at a sample of entries of
  // every strip.
  const int64_t s = 150, hq = 2, hkv = 1, d = 4;
  for (auto [causal, window] :
       {std::pair<bool, int64_t>{false, 0}, {true, 0}, {true, 40}}) {
    auto q = make<double>({1, s, hq, d}, DType::F64, 21);
    auto k = make<double>({1, s, hkv, d}, DType::F64, 22);
    auto v = make<double>({1, s, hkv, d}, DType::F64, 23);
    auto w = make<double>({1, s, hq, d}, DType::F64, 24);
    Attrs attrs;
    attrs.set("causal", causal);
    if (window)
      attrs.set("window", window);
    auto o = make<double>({1, s, hq, d}, DType::F64);
    run("ernie.attention", {q.view(), k.view(), v.view()}, {o.view()}, attrs);
    double scale = 1.0 / std::sqrt(double(d)), worst = 0;
    for (int64_t h = 0; h < hq; ++h)
      for (int64_t i = 0; i < s; ++i) {
        std::vector<double> score(s, -INFINITY);
        double peak = -INFINITY, total = 0;
        for (int64_t t = window ? std::max<int64_t>(0, i - window + 1) : 0;
             t < s && (!causal || t <= i); ++t) {
          double dot = 0;
          for (int64_t c = 0; c < d; ++c)
            dot += q.data[(i * hq + h) * d + c] * k.data[t * d + c];
          score[t] = dot * scale;
          peak = std::max(peak, score[t]);
        }
        for (double &x : score)
          total += x = std::exp(x - peak);
        for (int64_t c = 0; c < d; ++c) {
          double want = 0;
          for (int64_t t = 0; t < s; ++t)
            want += score[t] / total * v.data[t * d + c];
          worst = std::max(worst, std::abs(o.data[(i * hq + h) * d + c] - want));
        }
      }
    EXPECT_LT(worst, 1e-12) << "causal=" << causal << " window=" << window;

    auto forward = [&] {
      auto out = make<double>({1, s, hq, d}, DType::F64);
      run("ernie.attention", {q.view(), k.view(), v.view()}, {out.view()}, attrs);
      return weightedSum(out.data, w.data);
    };
    auto dq = make<double>({1, s, hq, d}, DType::F64),
         dk = make<double>({1, s, hkv, d}, DType::F64),
         dv = make<double>({1, s, hkv, d}, DType::F64);
    run("ernie.attention_grad", {q.view(), k.view(), v.view(), w.view()},
        {dq.view(), dk.view(), dv.view()}, attrs);
    for (auto [x, g] : {std::pair{&q, &dq}, std::pair{&k, &dk}, std::pair{&v, &dv}})
      for (size_t i = 0; i < x->data.size(); i += 37) {
        double saved = x->data[i], step = 1e-6;
        x->data[i] = saved + step;
        double up = forward();
        x->data[i] = saved - step;
        double down = forward();
        x->data[i] = saved;
        EXPECT_NEAR(g->data[i], (up - down) / (2 * step), 1e-7)
            << "causal=" << causal << " window=" << window << " entry " << i;
      }
  }
}

TEST(CpuKernels, CrossEntropyAndItsGradient) {
  for (const char *reduction : {"mean", "sum", "none"}) {
    auto logits = make<double>({2, 3, 5}, DType::F64, 21);
    Owned<int64_t> labels{{0, 4, 2, -100, 1, 3}, {2, 3}, DType::I64};
    bool none = std::string(reduction) == "none";
    Attrs attrs{{"reduction", std::string(reduction)}};
    auto loss = make<double>(none ? std::vector<int64_t>{2, 3} : std::vector<int64_t>{},
                             DType::F64);
    auto w = make<double>(loss.shape, DType::F64, 22);
    auto forward = [&] {
      run("ernie.cross_entropy", {logits.view(), labels.view()}, {loss.view()}, attrs);
      return weightedSum(loss.data, w.data);
    };
    double total = forward();
    // The definition: logsumexp - picked, the ignored token out of the mean.
    double want = 0;
    for (int t = 0; t < 6; ++t) {
      if (labels.data[t] == -100)
        continue;
      double lse = 0;
      for (int j = 0; j < 5; ++j)
        lse += std::exp(logits.data[t * 5 + j]);
      double l = std::log(lse) - logits.data[t * 5 + labels.data[t]];
      want += none ? l * w.data[t] : l;
    }
    if (!none)
      want = (std::string(reduction) == "mean" ? want / 5 : want) * w.data[0];
    EXPECT_NEAR(total, want, 1e-12) << reduction;
    auto grad = make<double>({2, 3, 5}, DType::F64);
    run("ernie.cross_entropy_grad", {logits.view(), labels.view(), w.view()},
        {grad.view()}, attrs);
    for (size_t i = 0; i < logits.data.size(); ++i) {
      double saved = logits.data[i], h = 1e-6;
      logits.data[i] = saved + h;
      double up = forward();
      logits.data[i] = saved - h;
      double down = forward();
      logits.data[i] = saved;
      EXPECT_NEAR(grad.data[i], (up - down) / (2 * h), 1e-7) << reduction;
    }
  }
  auto logits = make<double>({1, 3}, DType::F64);
  Owned<int64_t> bad{{7}, {1}, DType::I64};
  Owned<double> out{{0}, {}, DType::F64};
  EXPECT_THROW(run("ernie.cross_entropy", {logits.view(), bad.view()}, {out.view()}),
               KernelError);
}

/// The fused loss-and-gradient computes the pair's bits (one pass shares
/// each row's exponentials), with a token ignored, in every reduction, over
/// a vocabulary wider than a vector (f32) and in f64.
template <typename T> void expectLossAndGradientAsThePair(DType type) {
  for (const char *reduction : {"mean", "sum", "none"}) {
    auto logits = make<T>({3, 4, 37}, type, 41);
    Owned<int64_t> labels{
        {0, 36, 2, -100, 1, 3, 9, 35, 17, -100, 8, 20}, {3, 4}, DType::I64};
    bool none = std::string(reduction) == "none";
    Attrs attrs{{"reduction", std::string(reduction)}};
    std::vector<int64_t> lossShape =
        none ? std::vector<int64_t>{3, 4} : std::vector<int64_t>{};
    auto dloss = make<T>(lossShape, type, 42);
    auto loss = make<T>(lossShape, type), grad = make<T>({3, 4, 37}, type);
    run("ernie.cross_entropy", {logits.view(), labels.view()}, {loss.view()},
        attrs);
    run("ernie.cross_entropy_grad",
        {logits.view(), labels.view(), dloss.view()}, {grad.view()}, attrs);
    auto fusedLoss = make<T>(lossShape, type),
         fusedGrad = make<T>({3, 4, 37}, type, 7); // garbage to overwrite
    run("ernie.cross_entropy_and_grad",
        {logits.view(), labels.view(), dloss.view()},
        {fusedLoss.view(), fusedGrad.view()}, attrs);
    EXPECT_EQ(std::memcmp(loss.data.data(), fusedLoss.data.data(),
                          loss.data.size() * sizeof(T)),
              0)
        << reduction;
    EXPECT_EQ(std::memcmp(grad.data.data(), fusedGrad.data.data(),
                          grad.data.size() * sizeof(T)),
              0)
        << reduction;
  }
}

TEST(CpuKernels, CrossEntropyAndGradComputesThePairsBits) {
  expectLossAndGradientAsThePair<float>(DType::F32);
  expectLossAndGradientAsThePair<double>(DType::F64);
}

TEST(CpuKernels, RopeRotatesPairsAndInvertsWithNegatedPositions) {
  for (bool interleaved : {false, true}) {
    auto x = make<double>({2, 3, 2, 6}, DType::F64, 31);
    Owned<int64_t> pos{{0, 5, 9}, {3}, DType::I64}, neg{{0, -5, -9}, {3}, DType::I64};
    Attrs attrs{{"theta", 100.0}};
    attrs.set("interleaved", interleaved);
    auto y = make<double>(x.shape, DType::F64), back = make<double>(x.shape, DType::F64);
    run("ernie.rope", {x.view(), pos.view()}, {y.view()}, attrs);
    run("ernie.rope", {y.view(), neg.view()}, {back.view()}, attrs);
    for (size_t i = 0; i < x.data.size(); ++i)
      EXPECT_NEAR(back.data[i], x.data[i], 1e-12);
    // Position 0 is the identity; pair (0, 3) (or (0, 1)) at position 5
    // turns by 5 radians.
    for (int j = 0; j < 6; ++j)
      EXPECT_NEAR(y.data[j], x.data[j], 1e-15);
    int second = interleaved ? 1 : 3;
    size_t base = 1 * 2 * 6; // batch 0, seq 1, head 0
    double c = std::cos(5.0), s = std::sin(5.0);
    EXPECT_NEAR(y.data[base], x.data[base] * c - x.data[base + second] * s, 1e-12);
  }
}

// Rotary angles come from a per-thread table: positions past it and far
// negative ones are computed directly, cached ones equal the formula, and a
// second call (from the table) gives the same bits.
TEST(CpuKernels, RopeTableMatchesTheFormulaBeyondItsRange) {
  const double theta = 5000.0;
  Owned<int64_t> pos{{3, 70000, -70001, -2, 65535}, {5}, DType::I64};
  auto x = make<double>({1, 5, 2, 8}, DType::F64, 41);
  auto first = make<double>(x.shape, DType::F64), again = make<double>(x.shape, DType::F64);
  Attrs attrs{{"theta", theta}};
  run("ernie.rope", {x.view(), pos.view()}, {first.view()}, attrs);
  run("ernie.rope", {x.view(), pos.view()}, {again.view()}, attrs);
  EXPECT_EQ(first.data, again.data);
  for (int64_t s = 0; s < 5; ++s)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 4; ++i) {
        double angle = double(pos.data[s]) * std::pow(theta, -2.0 * i / 8);
        size_t at = (s * 2 + h) * 8;
        double a = x.data[at + i], b = x.data[at + i + 4];
        EXPECT_EQ(first.data[at + i], a * std::cos(angle) - b * std::sin(angle));
        EXPECT_EQ(first.data[at + i + 4], b * std::cos(angle) + a * std::sin(angle));
      }
}

TEST(CpuKernels, IndexingTopkPadSplit) {
  Owned<float> table{{0, 1, 10, 11, 20, 21}, {3, 2}, DType::F32};
  Owned<int32_t> ids{{2, 0, 2}, {3}, DType::I32};
  Owned<float> rows{std::vector<float>(6), {3, 2}, DType::F32};
  run("ernie.embedding", {ids.view(), table.view()}, {rows.view()});
  EXPECT_EQ(rows.data, (std::vector<float>{20, 21, 0, 1, 20, 21}));
  Owned<float> cols{std::vector<float>(9), {3, 3}, DType::F32};
  Owned<int64_t> pick{{1, 1, 0}, {3}, DType::I64};
  run("ernie.gather", {table.view(), pick.view()}, {cols.view()}, {{"axis", int64_t{1}}});
  EXPECT_EQ(cols.data, (std::vector<float>{1, 1, 0, 11, 11, 10, 21, 21, 20}));
  Owned<float> acc{std::vector<float>(6), {3, 2}, DType::F32};
  run("ernie.index_add", {acc.view(), ids.view(), rows.view()}, {acc.view()},
      {{"axis", int64_t{0}}});
  EXPECT_EQ(acc.data, (std::vector<float>{0, 1, 0, 0, 40, 42})); // repeats add up
  Owned<int64_t> badIds{{3}, {1}, DType::I64};
  Owned<float> one{std::vector<float>(2), {1, 2}, DType::F32};
  EXPECT_THROW(run("ernie.embedding", {badIds.view(), table.view()}, {one.view()}),
               KernelError);

  Owned<double> x{{3, 1, 3, 2}, {1, 4}, DType::F64};
  Owned<double> vals{std::vector<double>(2), {1, 2}, DType::F64};
  Owned<int64_t> idx{std::vector<int64_t>(2), {1, 2}, DType::I64};
  run("ernie.topk", {x.view()}, {vals.view(), idx.view()},
      {{"k", int64_t{2}}, {"axis", int64_t{1}}});
  EXPECT_EQ(vals.data, (std::vector<double>{3, 3}));
  EXPECT_EQ(idx.data, (std::vector<int64_t>{0, 2})); // ties: lower index first

  Owned<int32_t> p{{1, 2}, {2}, DType::I32}, padded{std::vector<int32_t>(6), {6}, DType::I32};
  run("ernie.pad", {p.view()}, {padded.view()},
      {{"low", std::vector<int64_t>{1}}, {"high", std::vector<int64_t>{2}},
       {"interior", std::vector<int64_t>{1}}});
  EXPECT_EQ(padded.data, (std::vector<int32_t>{0, 1, 0, 2, 0, 0}));
  Owned<int32_t> whole{{0, 1, 2, 3, 4, 5}, {2, 3}, DType::I32};
  Owned<int32_t> left{std::vector<int32_t>(2), {2, 1}, DType::I32},
      right{std::vector<int32_t>(4), {2, 2}, DType::I32};
  run("ernie.split", {whole.view()}, {left.view(), right.view()}, {{"axis", int64_t{1}}});
  EXPECT_EQ(left.data, (std::vector<int32_t>{0, 3}));
  EXPECT_EQ(right.data, (std::vector<int32_t>{1, 2, 4, 5}));
}

TEST(CpuKernels, OptimizerUpdates) {
  Owned<double> p{{1.0, -2.0}, {2}, DType::F64}, g{{0.5, 0.25}, {2}, DType::F64},
      buf{{0.1, 0.2}, {2}, DType::F64}, lr{{0.1}, {}, DType::F64};
  Owned<double> np{std::vector<double>(2), {2}, DType::F64}, nb{std::vector<double>(2), {2}, DType::F64};
  run("ernie.sgd_update", {p.view(), g.view(), buf.view(), lr.view()}, {np.view(), nb.view()},
      {{"momentum", 0.9}, {"weight_decay", 0.01}});
  for (int i = 0; i < 2; ++i) {
    double grad = g.data[i] + 0.01 * p.data[i], b = 0.9 * buf.data[i] + grad;
    EXPECT_DOUBLE_EQ(nb.data[i], b);
    EXPECT_DOUBLE_EQ(np.data[i], p.data[i] - 0.1 * b);
  }
  Owned<double> m{{0.0, 0.1}, {2}, DType::F64}, v{{0.0, 0.2}, {2}, DType::F64};
  Owned<int64_t> t{{3}, {}, DType::I64};
  Owned<double> nm{std::vector<double>(2), {2}, DType::F64}, nv{std::vector<double>(2), {2}, DType::F64};
  run("ernie.adamw_update", {p.view(), g.view(), m.view(), v.view(), lr.view(), t.view()},
      {np.view(), nm.view(), nv.view()}, {{"weight_decay", 0.1}});
  for (int i = 0; i < 2; ++i) {
    double m2 = 0.9 * m.data[i] + 0.1 * g.data[i];
    double v2 = 0.999 * v.data[i] + 0.001 * g.data[i] * g.data[i];
    double mh = m2 / (1 - std::pow(0.9, 3)), vh = v2 / (1 - std::pow(0.999, 3));
    EXPECT_NEAR(np.data[i], p.data[i] - 0.1 * (mh / (std::sqrt(vh) + 1e-8) + 0.1 * p.data[i]),
                1e-15);
  }
}

// Moments in f32 beside f64 parameters: each buffer is read in its own type
// (reading the f32 moments as f64 ran past their end).
TEST(CpuKernels, OptimizerStateInItsOwnPrecision) {
  Owned<double> p{{1.0, -2.0, 0.5}, {3}, DType::F64}, g{{0.5, 0.25, -1.0}, {3}, DType::F64};
  Owned<float> m{{0.0f, 0.1f, -0.2f}, {3}, DType::F32}, v{{0.0f, 0.2f, 0.3f}, {3}, DType::F32},
      lr{{0.1f}, {}, DType::F32};
  Owned<int64_t> t{{2}, {}, DType::I64};
  Owned<double> np{std::vector<double>(3), {3}, DType::F64};
  Owned<float> nm{std::vector<float>(3), {3}, DType::F32}, nv{std::vector<float>(3), {3}, DType::F32};
  run("ernie.adamw_update", {p.view(), g.view(), m.view(), v.view(), lr.view(), t.view()},
      {np.view(), nm.view(), nv.view()}, {{"weight_decay", 0.0}});
  for (int i = 0; i < 3; ++i) {
    double m2 = 0.9 * double(m.data[i]) + 0.1 * g.data[i];
    double v2 = 0.999 * double(v.data[i]) + 0.001 * g.data[i] * g.data[i];
    EXPECT_FLOAT_EQ(nm.data[i], static_cast<float>(m2));
    EXPECT_FLOAT_EQ(nv.data[i], static_cast<float>(v2));
    double mh = m2 / (1 - 0.81), vh = v2 / (1 - 0.999 * 0.999);
    EXPECT_NEAR(np.data[i], p.data[i] - double(0.1f) * mh / (std::sqrt(vh) + 1e-8), 1e-12);
  }
}

} // namespace

TEST(CpuKernels, ExpertGemmsComputeOnlyTheFilledRows) {
  // 3 experts x 2 groups of capacity 4, in 5, out 3; f64 against a naive
  // loop over the filled rows (row r of expert e, group g is filled when
  // r < rows[e, g]). The empty rows hold garbage that must not leak in.
  const int64_t E = 3, G = 2, C = 4, K = 5, N = 3;
  Owned<int64_t> rows{{4, 0, 1, 3, 2, 4}, {E, G}, DType::I64};
  auto x = make<double>({E, G, C, K}, DType::F64, 21);
  auto w = make<double>({E, K, N}, DType::F64, 22);
  auto wt = make<double>({E, N, K}, DType::F64);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < N; ++j)
        wt.data[(e * N + j) * K + i] = w.data[(e * K + i) * N + j];
  auto filled = [&](int64_t e, int64_t g, int64_t r) {
    return r < rows.data[e * G + g];
  };
  std::vector<double> want(E * G * C * N, 0.0);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t r = 0; r < C; ++r)
        for (int64_t j = 0; j < N && filled(e, g, r); ++j)
          for (int64_t i = 0; i < K; ++i)
            want[((e * G + g) * C + r) * N + j] +=
                x.data[((e * G + g) * C + r) * K + i] * w.data[(e * K + i) * N + j];
  for (bool transposed : {false, true}) {
    auto y = make<double>({E, G, C, N}, DType::F64, 23); // garbage to overwrite
    Attrs attrs{{"transpose_weight", transposed}};
    run("ernie.expert_matmul",
        {x.view(), transposed ? wt.view() : w.view(), rows.view()}, {y.view()},
        attrs);
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(y.data[i], want[i], 1e-12) << "transposed=" << transposed;
  }

  // The weight gradient: per expert, the filled rows' x^T dy over groups.
  auto dy = make<double>({E, G, C, N}, DType::F64, 24);
  auto dw = make<double>({E, K, N}, DType::F64, 25);
  run("ernie.expert_weight_grad", {x.view(), dy.view(), rows.view()},
      {dw.view()});
  for (int64_t e = 0; e < E; ++e)
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double sum = 0;
        for (int64_t g = 0; g < G; ++g)
          for (int64_t r = 0; r < C && filled(e, g, r); ++r)
            sum += x.data[((e * G + g) * C + r) * K + i] *
                   dy.data[((e * G + g) * C + r) * N + j];
        EXPECT_NEAR(dw.data[(e * K + i) * N + j], sum, 1e-12);
      }

  // A count beyond the capacity is an error naming it.
  Owned<int64_t> bad{{4, 0, 5, 3, 2, 4}, {E, G}, DType::I64};
  auto y = make<double>({E, G, C, N}, DType::F64);
  try {
    run("ernie.expert_matmul", {x.view(), w.view(), bad.view()}, {y.view()});
    ADD_FAILURE() << "no error";
  } catch (const KernelError &err) {
    EXPECT_THAT(err.what(), HasSubstr("rows[1, 0] = 5 is outside [0, 4]"));
  }
}

TEST(CpuKernels, MoeRouteDispatchCombine) {
  // One group of 3 tokens, top-2 over 2 experts, capacity 2. Choice rank
  // first: token 0, 1, 2's first choices (experts 0, 0, 1) take slots 0, 1
  // of expert 0 and slot 0 of expert 1; then their second choices (1, 1, 0)
  // take expert 1's slot 1, drop (expert 1 full), drop (expert 0 full).
  Owned<int64_t> experts{{0, 1, 0, 1, 1, 0}, {1, 3, 2}, DType::I64};
  Owned<int64_t> slots{std::vector<int64_t>(6), {1, 3, 2}, DType::I64};
  run("ernie.moe_route", {experts.view()}, {slots.view()},
      {{"num_experts", int64_t{2}}, {"capacity", int64_t{2}}});
  EXPECT_EQ(slots.data, (std::vector<int64_t>{0, 1, 1, -1, 0, -1}));

  Owned<double> x{{1, 2, 3, 4, 5, 6}, {1, 3, 2}, DType::F64};
  Owned<double> w{{0.5, 0.25, 1, 2, 3, 4}, {1, 3, 2}, DType::F64};
  Owned<double> buf{std::vector<double>(8), {2, 1, 2, 2}, DType::F64};
  run("ernie.moe_dispatch", {x.view(), experts.view(), slots.view(), w.view()},
      {buf.view()}, {{"num_experts", int64_t{2}}, {"capacity", int64_t{2}}});
  // expert 0: slot 0 = 0.5 * token 0, slot 1 = 1 * token 1;
  // expert 1: slot 0 = 3 * token 2, slot 1 = 0.25 * token 0.
  EXPECT_EQ(buf.data, (std::vector<double>{0.5, 1, 3, 4, 15, 18, 0.25, 0.5}));

  // Combine is dispatch's transpose: <dispatch(x), y> == <x, combine(y)>.
  Owned<double> y{{1, -2, 3, 0.5, -1, 4, 2, 7}, {2, 1, 2, 2}, DType::F64};
  Owned<double> back{std::vector<double>(6), {1, 3, 2}, DType::F64};
  run("ernie.moe_combine", {y.view(), experts.view(), slots.view(), w.view()},
      {back.view()});
  double lhs = 0, rhs = 0;
  for (size_t i = 0; i < buf.data.size(); ++i)
    lhs += buf.data[i] * y.data[i];
  for (size_t i = 0; i < x.data.size(); ++i)
    rhs += x.data[i] * back.data[i];
  EXPECT_DOUBLE_EQ(lhs, rhs);

  // The weights' gradient: each kept choice's token . its slot; 0 if dropped.
  Owned<double> dw{std::vector<double>(6), {1, 3, 2}, DType::F64};
  run("ernie.moe_weights_grad", {x.view(), y.view(), experts.view(), slots.view()},
      {dw.view()});
  EXPECT_EQ(dw.data, (std::vector<double>{1 * 1 + 2 * -2, 1 * 2 + 2 * 7,
                                          3 * 3 + 4 * 0.5, 0, 5 * -1 + 6 * 4, 0}));

  // A bad expert or slot is an error naming it, never a stray write.
  Owned<int64_t> bad{{0, 2, 0, 1, 1, 0}, {1, 3, 2}, DType::I64};
  try {
    run("ernie.moe_route", {bad.view()}, {slots.view()},
        {{"num_experts", int64_t{2}}, {"capacity", int64_t{2}}});
    ADD_FAILURE() << "no error";
  } catch (const KernelError &e) {
    EXPECT_THAT(e.what(), HasSubstr("token 0 of group 0 chose expert 2, outside [0, 2)"));
  }
  Owned<int64_t> badSlots{{0, 5, 1, -1, 0, -1}, {1, 3, 2}, DType::I64};
  EXPECT_THROW(run("ernie.moe_combine", {y.view(), experts.view(), badSlots.view(), w.view()},
                   {back.view()}),
               KernelError);
}

//===- CudaKernelTest.cpp - every CUDA kernel against the CPU kernel --------===//
//
// Each case runs one op on random inputs (fixed seeds, odd sizes among
// them) with the CPU kernel and with a device's kernel (Device::kernelFor),
// and compares: casts, data movement and integer results bit for bit, f32
// within a bound that depends on the op (below), bf16 and f16 within a few
// units of their last place more. The suite is instantiated twice:
//
//  - Cuda/...: the CUDA device. Skipped, saying so, where no GPU is visible
//    ("no CUDA device visible", or "built without CUDA"); this is what
//    scripts/gpu_check.sh runs. UNVERIFIED until it has run on a GPU.
//  - Harness/...: the CPU device through the same path (uploads,
//    kernelFor, downloads, comparison) — so that on machines without a GPU
//    the cases themselves are checked: every case's shapes and attributes
//    pass the loader's signature check and its kernel runs.
//
// Bounds for f32 (relative to the largest magnitude of the expected
// output, since GEMM-like results near zero carry the cancellation of large
// terms): elementwise ops whose math is shared with the CPU (ElementwiseMath.h
// compiled without FMA) and ordered reductions 1e-6; ops through the device
// libm (log, tanh, erf, pow, rope's cos/sin) 4e-6; accumulations in another
// order (GEMM, attention, softmax, norms, cross-entropy, MoE) 1e-5.
//
//===----------------------------------------------------------------------===//

#include "ernie/runtime/Device.h"
#include "ernie/runtime/FloatConvert.h"
#include "ernie/runtime/Kernel.h"
#include "ernie/runtime/Program.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <set>

using namespace ernie::runtime;

namespace {

using Shape = std::vector<int64_t>;

/// How an input is drawn.
enum class Gen {
  Uniform,      // [-2, 2)
  Positive,     // [0.1, 3)
  AwayFromZero, // +-[0.5, 2)
  Indices,      // integers in [0, bound)
  NonZero,      // integers in [1, bound]
  Labels,       // [0, bound) with some ignore_index (-100)
  Bool,         // 0 or 1
  Scale,        // a positive scalar (fp8 scales, learning rates)
  Step,         // the integer 3
  Slots,        // MoE slots: [-1, bound)
};

struct Operand {
  DType type;
  Shape shape;
  Gen gen = Gen::Uniform;
  int64_t bound = 0;
};

enum class Tol { Exact, Shared, Libm, Accumulated };

struct Case {
  std::string name, op;
  std::vector<Operand> in;
  std::vector<std::pair<DType, Shape>> out;
  Attrs attrs;
  Tol tol = Tol::Accumulated;
  std::shared_ptr<FusedBody> body; // ernie.fused
};

std::ostream &operator<<(std::ostream &os, const Case &c) { return os << c.name; }

HostTensor draw(const Operand &o, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(0, 1);
  HostTensor wide(DType::F64, o.shape);
  double *w = wide.as<double>();
  for (int64_t i = 0; i < wide.numElements(); ++i) {
    double x = u(gen);
    switch (o.gen) {
    case Gen::Uniform: w[i] = 4 * x - 2; break;
    case Gen::Positive: w[i] = 0.1 + 2.9 * x; break;
    case Gen::AwayFromZero: w[i] = (x < 0.5 ? -1 : 1) * (0.5 + 3 * std::fmod(x, 0.5)); break;
    case Gen::Indices: w[i] = double(gen() % uint64_t(o.bound)); break;
    case Gen::NonZero: w[i] = double(1 + gen() % uint64_t(o.bound)); break;
    case Gen::Labels: w[i] = gen() % 7 == 0 ? -100 : double(gen() % uint64_t(o.bound)); break;
    case Gen::Bool: w[i] = double(gen() & 1); break;
    case Gen::Scale: w[i] = 0.25 + x; break;
    case Gen::Step: w[i] = 3; break;
    case Gen::Slots: w[i] = double(int64_t(gen() % uint64_t(o.bound + 1)) - 1); break;
    }
  }
  return convert(wide, o.type);
}

uint64_t hashOf(const std::string &s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s)
    h = (h ^ c) * 1099511628211ull;
  return h;
}

/// Units in the last place of a narrow float type, relative.
double ulpOf(DType t) {
  switch (t) {
  case DType::BF16: return std::ldexp(1.0, -7);
  case DType::F16: return std::ldexp(1.0, -10);
  case DType::F8E4M3FN: return std::ldexp(1.0, -3);
  case DType::F8E5M2: return std::ldexp(1.0, -2);
  default: return 0;
  }
}

/// The bound on |got - want| for one element: f32's (relative to the
/// element, or for accumulations to the output's largest magnitude) plus two
/// units in the last place of a narrow result type.
double boundFor(Tol tol, DType t, double want, double scale) {
  double rel = tol == Tol::Shared ? 1e-6 : tol == Tol::Libm ? 4e-6 : 1e-5;
  if (t == DType::F64)
    rel = tol == Tol::Accumulated ? 1e-12 : 1e-14;
  double f32 = tol == Tol::Accumulated ? rel * scale : rel * std::fabs(want);
  return f32 + 2 * ulpOf(t) * std::fabs(want);
}

::testing::AssertionResult close(const HostTensor &got, const HostTensor &want,
                                 Tol tol) {
  if (got.type != want.type || got.shape != want.shape)
    return ::testing::AssertionFailure() << "a result of another type or shape";
  if (tol == Tol::Exact || !isFloat(want.type)) {
    if (got.bytes == want.bytes)
      return ::testing::AssertionSuccess();
    for (size_t i = 0; i < got.bytes.size(); ++i)
      if (got.bytes[i] != want.bytes[i])
        return ::testing::AssertionFailure()
               << "byte " << i << " (element " << i / byteSize(want.type)
               << ") differs: " << int(got.bytes[i]) << " vs "
               << int(want.bytes[i]);
  }
  HostTensor g = convert(got, DType::F64), w = convert(want, DType::F64);
  double scale = 0;
  for (int64_t i = 0; i < w.numElements(); ++i)
    if (std::isfinite(w.as<double>()[i]))
      scale = std::max(scale, std::fabs(w.as<double>()[i]));
  for (int64_t i = 0; i < w.numElements(); ++i) {
    double a = g.as<double>()[i], b = w.as<double>()[i];
    if (std::isnan(a) && std::isnan(b))
      continue;
    if (a == b)
      continue;
    double bound = boundFor(tol, want.type, b, scale);
    if (!(std::fabs(a - b) <= bound))
      return ::testing::AssertionFailure()
             << "element " << i << ": " << a << " vs " << b << " (bound "
             << bound << ", scale " << scale << ")";
  }
  return ::testing::AssertionSuccess();
}

const DType kF32 = DType::F32, kBF16 = DType::BF16, kF16 = DType::F16,
            kI64 = DType::I64, kI32 = DType::I32, kI1 = DType::I1,
            kF64 = DType::F64, kE4M3 = DType::F8E4M3FN, kE5M2 = DType::F8E5M2;

std::vector<Case> cases() {
  std::vector<Case> all;
  auto add = [&](Case c) { all.push_back(std::move(c)); };
  auto tag = [](DType t) { return std::string(name(t)); };
  const DType floats[] = {kF32, kBF16, kF16};

  // Elementwise.
  struct Unary {
    const char *op;
    Gen gen;
    Tol tol;
  };
  for (Unary u : {Unary{"ernie.neg", Gen::Uniform, Tol::Exact},
                  {"ernie.abs", Gen::Uniform, Tol::Exact},
                  {"ernie.relu", Gen::Uniform, Tol::Exact},
                  {"ernie.exp", Gen::Uniform, Tol::Shared},
                  {"ernie.log", Gen::Positive, Tol::Libm},
                  {"ernie.sqrt", Gen::Positive, Tol::Shared},
                  {"ernie.rsqrt", Gen::Positive, Tol::Shared},
                  {"ernie.tanh", Gen::Uniform, Tol::Libm},
                  {"ernie.erf", Gen::Uniform, Tol::Libm},
                  {"ernie.reciprocal", Gen::AwayFromZero, Tol::Shared},
                  {"ernie.sigmoid", Gen::Uniform, Tol::Shared},
                  {"ernie.silu", Gen::Uniform, Tol::Shared},
                  {"ernie.gelu", Gen::Uniform, Tol::Libm}})
    for (DType t : floats)
      for (Shape s : {Shape{1031}, Shape{3, 37}})
        add({std::string(u.op + 6) + "_" + tag(t) + "_" + std::to_string(s[0]),
             u.op, {{t, s, u.gen}}, {{t, s}}, {}, u.tol});
  add({"gelu_tanh_f32", "ernie.gelu", {{kF32, {777}}}, {{kF32, {777}}},
       {{"approximate", true}}, Tol::Libm});
  add({"exp_f64", "ernie.exp", {{kF64, {513}}}, {{kF64, {513}}}, {}, Tol::Libm});
  for (const char *op : {"ernie.neg", "ernie.abs", "ernie.relu"})
    add({std::string(op + 6) + "_i64", op, {{kI64, {99}, Gen::Indices, 50}},
         {{kI64, {99}}}, {}, Tol::Exact});
  for (const char *op : {"ernie.add", "ernie.sub", "ernie.mul", "ernie.div",
                         "ernie.maximum", "ernie.minimum", "ernie.pow"})
    for (DType t : floats) {
      bool pow = std::string(op) == "ernie.pow", div = std::string(op) == "ernie.div";
      add({std::string(op + 6) + "_" + tag(t), op,
           {{t, {5, 211}, pow ? Gen::Positive : Gen::Uniform},
            {t, {5, 211}, div ? Gen::AwayFromZero : Gen::Uniform}},
           {{t, {5, 211}}}, {}, pow ? Tol::Libm : Tol::Exact});
    }
  for (const char *op : {"ernie.add", "ernie.mul", "ernie.maximum", "ernie.div"})
    add({std::string(op + 6) + "_i32", op,
         {{kI32, {301}, Gen::Indices, 100}, {kI32, {301}, Gen::NonZero, 100}},
         {{kI32, {301}}}, {}, Tol::Exact});
  for (int64_t d = 0; d <= 5; ++d)
    add({"compare_" + std::to_string(d), "ernie.compare",
         {{kBF16, {257}, Gen::Indices, 4}, {kBF16, {257}, Gen::Indices, 4}},
         {{kI1, {257}}}, {{"direction", d}}, Tol::Exact});
  add({"compare_i64", "ernie.compare",
       {{kI64, {129}, Gen::Indices, 3}, {kI64, {129}, Gen::Indices, 3}},
       {{kI1, {129}}}, {{"direction", int64_t(3)}}, Tol::Exact});
  add({"select_bf16", "ernie.select",
       {{kI1, {4, 33}, Gen::Bool}, {kBF16, {4, 33}}, {kBF16, {4, 33}}},
       {{kBF16, {4, 33}}}, {}, Tol::Exact});
  // Casts between every pair, bit for bit.
  for (DType from : {kF64, kF32, kBF16, kF16, kE4M3, kE5M2, kI64, kI32, kI1})
    for (DType to : {kF64, kF32, kBF16, kF16, kE4M3, kE5M2, kI64, kI32, kI1})
      add({"cast_" + tag(from) + "_" + tag(to), "ernie.cast",
           {{from, {1000}, from == kI1 ? Gen::Bool : isFloat(from) ? Gen::Uniform
                                                                   : Gen::Indices,
             300}},
           {{to, {1000}}}, {}, Tol::Exact});
  add({"cast_f32_e5m2_large", "ernie.cast", {{kF32, {4096}, Gen::Uniform}},
       {{kE5M2, {4096}}}, {}, Tol::Exact});
  add({"stop_gradient", "ernie.stop_gradient", {{kBF16, {3, 5}}},
       {{kBF16, {3, 5}}}, {}, Tol::Exact});
  for (DType t : {kF32, kBF16, kE4M3, kI64, kI1})
    add({"full_" + tag(t), "ernie.full", {}, {{t, {7, 9}}},
         {{"value", 1.7}}, Tol::Exact});
  add({"iota_f32", "ernie.iota", {}, {{kF32, {3, 4, 5}}},
       {{"dimension", int64_t(1)}}, Tol::Exact});
  add({"iota_i64", "ernie.iota", {}, {{kI64, {6, 7}}},
       {{"dimension", int64_t(1)}}, Tol::Exact});

  // GEMMs.
  struct Mm {
    Shape a, b, c;
    bool ta, tb;
  };
  for (Mm m : {Mm{{7, 13}, {13, 9}, {7, 9}, false, false},
               {{13, 7}, {13, 9}, {7, 9}, true, false},
               {{7, 13}, {9, 13}, {7, 9}, false, true},
               {{13, 7}, {9, 13}, {7, 9}, true, true},
               {{3, 5, 17}, {3, 17, 11}, {3, 5, 11}, false, false},
               {{4, 6, 33}, {33, 7}, {4, 6, 7}, false, false},
               {{2, 33, 6}, {33, 7}, {2, 6, 7}, true, false},
               {{64, 128}, {96, 128}, {64, 96}, false, true}})
    for (DType t : {kF32, kBF16, kF16, kF64}) {
      std::string n = "matmul_" + tag(t) + "_" + std::to_string(m.a[0]) + "x" +
                      std::to_string(m.a.back()) + (m.ta ? "t" : "") +
                      (m.tb ? "_bt" : "") + "_r" + std::to_string(m.a.size());
      add({n, "ernie.matmul", {{t, m.a}, {t, m.b}}, {{t, m.c}},
           {{"transpose_a", m.ta}, {"transpose_b", m.tb}}, Tol::Accumulated});
    }
  // matmul_accumulate: bf16/f16 products into f32 sums (cuBLASLt's narrow
  // in, F32 out), and f32/f64 into their own type.
  for (Mm m : {Mm{{13, 7}, {13, 9}, {7, 9}, true, false},
               {{3, 5, 17}, {3, 17, 11}, {3, 5, 11}, false, false},
               {{64, 128}, {96, 128}, {64, 96}, false, true}})
    for (auto [t, sum] : {std::pair{kBF16, kF32}, std::pair{kF16, kF32},
                          std::pair{kF32, kF32}, std::pair{kF64, kF64}})
      add({"matmul_accumulate_" + tag(t) + "_" + std::to_string(m.a[0]) + "x" +
               std::to_string(m.a.back()) + (m.ta ? "t" : "") +
               (m.tb ? "_bt" : "") + "_r" + std::to_string(m.a.size()),
           "ernie.matmul_accumulate", {{t, m.a}, {t, m.b}, {sum, m.c}},
           {{sum, m.c}}, {{"transpose_a", m.ta}, {"transpose_b", m.tb}},
           Tol::Accumulated});
  add({"matmul_i64", "ernie.matmul",
       {{kI64, {5, 6}, Gen::Indices, 9}, {kI64, {6, 4}, Gen::Indices, 9}},
       {{kI64, {5, 4}}}, {}, Tol::Exact});
  add({"matmul_e4m3", "ernie.matmul", {{kE4M3, {9, 17}}, {kE4M3, {17, 5}}},
       {{kE4M3, {9, 5}}}, {}, Tol::Accumulated});
  // scaled_matmul: cuBLASLt's FP8 path (TN, multiples of 16) and the
  // fallback (odd sizes, e5m2).
  for (auto [ta, b, c, t, out] :
       {std::tuple{false, Shape{64, 32}, Shape{48, 64}, kE4M3, kF32},
        std::tuple{false, Shape{64, 32}, Shape{48, 64}, kE4M3, kBF16},
        std::tuple{false, Shape{13, 7}, Shape{5, 13}, kE4M3, kF32},
        std::tuple{false, Shape{13, 7}, Shape{5, 13}, kE5M2, kBF16}}) {
    (void)ta;
    add({"scaled_matmul_" + tag(t) + "_" + tag(out) + "_" + std::to_string(b[0]),
         "ernie.scaled_matmul",
         {{t, c}, {t, {b[1], b[0]}}, {kF32, {}, Gen::Scale}, {kF32, {}, Gen::Scale}},
         {{out, {c[0], b[1]}}},
         {{"transpose_b", true}}, Tol::Accumulated});
  }

  // Reductions, softmax, norms.
  for (const char *op : {"ernie.reduce_sum", "ernie.reduce_mean", "ernie.reduce_max"})
    for (DType t : {kF32, kBF16})
      for (auto axes : {std::vector<int64_t>{1}, std::vector<int64_t>{0, 2},
                        std::vector<int64_t>{0, 1, 2}}) {
        Shape out;
        Shape in{6, 35, 9};
        for (int64_t d = 0; d < 3; ++d)
          if (std::find(axes.begin(), axes.end(), d) == axes.end())
            out.push_back(in[d]);
        add({std::string(op + 6) + "_" + tag(t) + "_" + std::to_string(axes.size()) +
                 "axes",
             op, {{t, in}}, {{t, out}}, {{"axes", axes}}, Tol::Shared});
      }
  add({"reduce_sum_i64", "ernie.reduce_sum", {{kI64, {7, 5}, Gen::Indices, 9}},
       {{kI64, {5}}}, {{"axes", std::vector<int64_t>{0}}}, Tol::Exact});
  for (const char *op : {"ernie.softmax", "ernie.log_softmax"})
    for (DType t : floats)
      for (int64_t axis : {1, 2})
        add({std::string(op + 6) + "_" + tag(t) + "_axis" + std::to_string(axis),
             op, {{t, {3, 31, 17}}}, {{t, {3, 31, 17}}}, {{"axis", axis}},
             Tol::Accumulated});
  for (DType t : floats) {
    add({"rms_norm_" + tag(t), "ernie.rms_norm", {{t, {9, 300}}, {t, {300}}},
         {{t, {9, 300}}}, {{"epsilon", 1e-6}}, Tol::Accumulated});
    add({"layer_norm_" + tag(t), "ernie.layer_norm",
         {{t, {9, 300}}, {t, {300}}, {t, {300}}}, {{t, {9, 300}}},
         {{"epsilon", 1e-5}}, Tol::Accumulated});
  }

  // Data movement, bit for bit.
  add({"reshape", "ernie.reshape", {{kBF16, {6, 10}}}, {{kBF16, {3, 20}}}, {},
       Tol::Exact});
  add({"transpose_0213", "ernie.transpose", {{kF32, {2, 5, 3, 7}}},
       {{kF32, {2, 3, 5, 7}}}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}},
       Tol::Exact});
  add({"transpose_e4m3", "ernie.transpose", {{kE4M3, {17, 33}}},
       {{kE4M3, {33, 17}}}, {{"perm", std::vector<int64_t>{1, 0}}}, Tol::Exact});
  add({"broadcast", "ernie.broadcast", {{kF16, {5, 1}}}, {{kF16, {3, 5, 7}}},
       {{"dims", std::vector<int64_t>{1, 2}}}, Tol::Exact});
  add({"slice", "ernie.slice", {{kF32, {9, 20}}}, {{kF32, {3, 6}}},
       {{"start", std::vector<int64_t>{1, 2}},
        {"limit", std::vector<int64_t>{8, 19}},
        {"step", std::vector<int64_t>{3, 3}}},
       Tol::Exact});
  add({"pad", "ernie.pad", {{kBF16, {3, 4}}}, {{kBF16, {1 + 3 + 2 + 2, 2 + 4 + 0}}},
       {{"low", std::vector<int64_t>{1, 2}}, {"high", std::vector<int64_t>{2, 0}},
        {"interior", std::vector<int64_t>{1, 0}}},
       Tol::Exact});
  {
    Case split{"split", "ernie.split", {{kF32, {4, 11, 3}}},
               {{kF32, {4, 2, 3}}, {kF32, {4, 9, 3}}},
               {{"axis", int64_t(1)}}, Tol::Exact};
    add(split);
    add({"concat", "ernie.concat", {{kF32, {4, 2, 3}}, {kF32, {4, 9, 3}}},
         {{kF32, {4, 11, 3}}}, {{"axis", int64_t(1)}}, Tol::Exact});
  }
  add({"gather", "ernie.gather", {{kBF16, {3, 10, 4}}, {kI64, {7}, Gen::Indices, 10}},
       {{kBF16, {3, 7, 4}}}, {{"axis", int64_t(1)}}, Tol::Exact});
  add({"embedding", "ernie.embedding",
       {{kI32, {5, 7}, Gen::Indices, 50}, {kF32, {50, 33}}}, {{kF32, {5, 7, 33}}},
       {}, Tol::Exact});
  for (DType t : {kF32, kBF16})
    add({"index_add_" + tag(t), "ernie.index_add",
         {{t, {3, 10, 6}}, {kI64, {25}, Gen::Indices, 10}, {t, {3, 25, 6}}},
         {{t, {3, 10, 6}}}, {{"axis", int64_t(1)}}, Tol::Exact});
  for (bool largest : {true, false})
    add({std::string("topk_") + (largest ? "largest" : "smallest"), "ernie.topk",
         {{kF32, {4, 50, 3}, Gen::Indices, 12}},
         {{kF32, {4, 6, 3}}, {kI64, {4, 6, 3}}},
         {{"axis", int64_t(1)}, {"k", int64_t(6)}, {"largest", largest}},
         Tol::Exact});

  // Transformer ops.
  for (DType t : floats)
    for (bool interleaved : {false, true})
      add({"rope_" + tag(t) + (interleaved ? "_interleaved" : ""), "ernie.rope",
           {{t, {2, 9, 3, 16}}, {kI64, {9}, Gen::Indices, 4000}},
           {{t, {2, 9, 3, 16}}},
           {{"theta", 10000.0}, {"interleaved", interleaved}}, Tol::Libm});
  struct Att {
    int64_t b, s, hq, hkv, d;
    bool causal;
    int64_t window; // 0: none
  };
  // The window of 37 on 150 rows crosses the kernels' blocks of 64 and
  // tiles of 32 both ways.
  for (Att a : {Att{2, 33, 4, 2, 16, true, 0}, Att{1, 70, 2, 2, 64, false, 0},
                Att{1, 65, 4, 1, 128, true, 0}, Att{1, 150, 2, 1, 32, true, 37}})
    for (DType t : {kF32, kBF16}) {
      std::string n = "attention_" + tag(t) + "_s" + std::to_string(a.s) + "_d" +
                      std::to_string(a.d) + (a.causal ? "_causal" : "") +
                      (a.window ? "_window" + std::to_string(a.window) : "");
      Shape q{a.b, a.s, a.hq, a.d}, kv{a.b, a.s, a.hkv, a.d};
      Attrs attrs = {{"causal", a.causal}};
      if (a.window)
        attrs.set("window", a.window);
      add({n, "ernie.attention", {{t, q}, {t, kv}, {t, kv}}, {{t, q}}, attrs,
           Tol::Accumulated});
      add({n + "_grad", "ernie.attention_grad", {{t, q}, {t, kv}, {t, kv}, {t, q}},
           {{t, q}, {t, kv}, {t, kv}}, attrs, Tol::Accumulated});
    }
  for (DType t : {kF32, kBF16})
    for (const char *reduction : {"mean", "sum", "none"}) {
      Shape loss = std::string(reduction) == "none" ? Shape{37} : Shape{};
      add({"cross_entropy_" + tag(t) + "_" + reduction, "ernie.cross_entropy",
           {{t, {37, 1000}}, {kI64, {37}, Gen::Labels, 1000}}, {{t, loss}},
           {{"reduction", std::string(reduction)}}, Tol::Accumulated});
      add({"cross_entropy_grad_" + tag(t) + "_" + reduction,
           "ernie.cross_entropy_grad",
           {{t, {37, 1000}}, {kI64, {37}, Gen::Labels, 1000}, {t, loss}},
           {{t, {37, 1000}}}, {{"reduction", std::string(reduction)}},
           Tol::Accumulated});
      add({"cross_entropy_and_grad_" + tag(t) + "_" + reduction,
           "ernie.cross_entropy_and_grad",
           {{t, {37, 1000}}, {kI64, {37}, Gen::Labels, 1000}, {t, loss}},
           {{t, loss}, {t, {37, 1000}}},
           {{"reduction", std::string(reduction)}},
           Tol::Accumulated});
    }

  // Optimizers: mixed precision states, bit for bit (f64 arithmetic).
  add({"sgd_update_momentum", "ernie.sgd_update",
       {{kF32, {1001}}, {kBF16, {1001}}, {kF32, {1001}}, {kF32, {}, Gen::Scale}},
       {{kF32, {1001}}, {kF32, {1001}}},
       {{"momentum", 0.9}, {"weight_decay", 0.01}, {"nesterov", true}},
       Tol::Shared});
  add({"adamw_update_bf16_params", "ernie.adamw_update",
       {{kBF16, {1001}}, {kBF16, {1001}}, {kF32, {1001}}, {kF32, {1001}, Gen::Positive},
        {kF32, {}, Gen::Scale}, {kI64, {}, Gen::Step}},
       {{kBF16, {1001}}, {kF32, {1001}}, {kF32, {1001}}},
       {{"beta1", 0.9}, {"beta2", 0.95}, {"epsilon", 1e-8}, {"weight_decay", 0.1}},
       Tol::Shared});

  // MoE: [groups 2, tokens 9, k 2] choices, [experts 4, groups 2, capacity 5,
  // hidden 7] buffers.
  add({"moe_route", "ernie.moe_route", {{kI64, {2, 9, 2}, Gen::Indices, 4}},
       {{kI64, {2, 9, 2}}}, {{"num_experts", int64_t(4)}, {"capacity", int64_t(5)}},
       Tol::Exact});
  for (DType t : {kF32, kBF16}) {
    Operand experts{kI64, {2, 9, 2}, Gen::Indices, 4},
        slots{kI64, {2, 9, 2}, Gen::Slots, 5};
    add({"moe_dispatch_" + tag(t), "ernie.moe_dispatch",
         {{t, {2, 9, 7}}, experts, slots, {t, {2, 9, 2}}}, {{t, {4, 2, 5, 7}}}, {},
         Tol::Accumulated});
    add({"moe_combine_" + tag(t), "ernie.moe_combine",
         {{t, {4, 2, 5, 7}}, experts, slots, {t, {2, 9, 2}}}, {{t, {2, 9, 7}}}, {},
         Tol::Accumulated});
    add({"moe_weights_grad_" + tag(t), "ernie.moe_weights_grad",
         {{t, {2, 9, 7}}, {t, {4, 2, 5, 7}}, experts, slots}, {{t, {2, 9, 2}}}, {},
         Tol::Accumulated});
    // The expert GEMMs: filled rows in [0, capacity = 5].
    Operand rows{kI64, {4, 2}, Gen::Indices, 6};
    for (bool transposed : {false, true})
      add({std::string("expert_matmul_") + (transposed ? "t_" : "") + tag(t),
           "ernie.expert_matmul",
           {{t, {4, 2, 5, 7}}, {t, transposed ? Shape{4, 6, 7} : Shape{4, 7, 6}}, rows},
           {{t, {4, 2, 5, 6}}}, {{"transpose_weight", transposed}}, Tol::Accumulated});
    add({"expert_weight_grad_" + tag(t), "ernie.expert_weight_grad",
         {{t, {4, 2, 5, 7}}, {t, {4, 2, 5, 6}}, rows}, {{t, {4, 7, 6}}}, {},
         Tol::Accumulated});
  }

  // A fused region: y = silu(a) * b, s = reduce_sum(y, axis 1).
  for (DType t : {kF32, kBF16}) {
    auto body = std::make_shared<FusedBody>();
    body->inputs = 2;
    body->values = {{t, {5, 33}}, {t, {5, 33}}, {t, {5, 33}}, {t, {5, 33}},
                    {t, {5}}};
    body->steps = {{"ernie.silu", {0}, {2}, {}},
                   {"ernie.mul", {2, 1}, {3}, {}},
                   {"ernie.reduce_sum", {3}, {4}, {{"axes", std::vector<int64_t>{1}}}}};
    body->yields = {3, 4};
    Case c{"fused_silu_mul_sum_" + tag(t), "ernie.fused",
           {{t, {5, 33}}, {t, {5, 33}}}, {{t, {5, 33}}, {t, {5}}}, {},
           Tol::Shared};
    c.body = body;
    add(c);
  }
  return all;
}

/// Runs `c`'s kernel on `device` with `inputs`; returns the outputs.
std::vector<HostTensor> runOn(Device &device, const Case &c,
                              const Instruction &inst,
                              const std::vector<HostTensor> &inputs) {
  std::shared_ptr<const Kernel> holder;
  const Kernel *kernel = device.kernelFor(inst, holder);
  if (!kernel)
    throw std::runtime_error(device.describe() + " has no kernel for " + c.op);
  Stream stream = device.createStream();
  std::vector<HostTensor> results;
  {
    StreamGuard guard(stream);
    std::vector<DeviceTensor> in, out;
    std::vector<TensorView> inViews, outViews;
    for (const HostTensor &t : inputs) {
      in.push_back(DeviceTensor::upload(device, t));
      inViews.push_back(in.back().view());
    }
    for (const auto &[type, shape] : c.out) {
      // Garbage where a kernel forgets to write.
      HostTensor junk(type, shape);
      std::fill(junk.bytes.begin(), junk.bytes.end(), 0x5a);
      out.push_back(DeviceTensor::upload(device, junk));
      outViews.push_back(out.back().view());
    }
    (*kernel)(inViews, outViews, c.attrs);
    device.synchronize(stream);
    for (const DeviceTensor &t : out)
      results.push_back(t.download());
  }
  device.destroyStream(stream);
  return results;
}

enum class Target { Harness, Cuda };

class Kernels : public ::testing::TestWithParam<std::tuple<Target, Case>> {};

} // namespace

TEST_P(Kernels, MatchTheCpuKernel) {
  const auto &[target, c] = GetParam();
  std::shared_ptr<Device> device;
  if (target == Target::Cuda) {
    std::string reason;
    if (cudaDeviceCount(&reason) == 0)
      GTEST_SKIP() << reason;
    device = openDevice("cuda");
  } else {
    device = openDevice("cpu");
  }
  // The instruction as a loaded program holds it: its buffers, the CPU
  // kernel, and the loader's signature check.
  Function fn;
  Instruction inst;
  inst.op = c.op;
  inst.attrs = c.attrs;
  for (const Operand &o : c.in) {
    inst.operands.push_back(uint32_t(fn.buffers.size()));
    fn.buffers.push_back({o.type, o.shape, 0, 0});
  }
  for (const auto &[type, shape] : c.out) {
    inst.results.push_back(uint32_t(fn.buffers.size()));
    fn.buffers.push_back({type, shape, 0, 0});
  }
  Kernel fusedCpu;
  if (c.body) {
    fusedCpu = makeCpuFusedKernel(*c.body);
    inst.kernel = &fusedCpu;
    inst.body = c.body;
  } else {
    ASSERT_EQ(kernelSignatureProblem(inst, fn), "") << c.name;
    inst.kernel = findCpuKernel(c.op);
    ASSERT_NE(inst.kernel, nullptr);
  }
  std::vector<HostTensor> inputs;
  for (size_t i = 0; i < c.in.size(); ++i)
    inputs.push_back(draw(c.in[i], hashOf(c.name) + i));
  // The reference: the CPU kernel on host buffers.
  std::vector<HostTensor> want;
  std::vector<TensorView> inViews, outViews;
  std::vector<HostTensor> hostIn = inputs;
  for (HostTensor &t : hostIn)
    inViews.push_back(t.view());
  for (const auto &[type, shape] : c.out)
    want.emplace_back(type, shape);
  for (HostTensor &t : want)
    outViews.push_back(t.view());
  (*inst.kernel)(inViews, outViews, c.attrs);

  std::vector<HostTensor> got = runOn(*device, c, inst, inputs);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(close(got[i], want[i], c.tol)) << c.name << " result " << i;
}

INSTANTIATE_TEST_SUITE_P(
    Cuda, Kernels,
    ::testing::Combine(::testing::Values(Target::Cuda), ::testing::ValuesIn(cases())),
    [](const auto &info) { return std::get<1>(info.param).name; });
INSTANTIATE_TEST_SUITE_P(
    Harness, Kernels,
    ::testing::Combine(::testing::Values(Target::Harness),
                       ::testing::ValuesIn(cases())),
    [](const auto &info) { return std::get<1>(info.param).name; });

TEST(CudaKernels, EveryCpuOpHasOne) {
  if (!cudaBackendBuilt())
    GTEST_SKIP() << "built without CUDA";
  std::vector<std::string> cuda = cudaKernelNames(), missing;
  std::set<std::string> have(cuda.begin(), cuda.end());
  for (const std::string &op : cpuKernelNames())
    if (!have.count(op))
      missing.push_back(op);
  EXPECT_TRUE(missing.empty()) << "CPU ops without a CUDA kernel: "
                               << ::testing::PrintToString(missing);
  EXPECT_TRUE(have.count("ernie.fused"));
}

TEST(CudaKernels, EveryCpuOpHasACase) {
  std::set<std::string> tested;
  for (const Case &c : cases())
    tested.insert(c.op);
  for (const std::string &op : cpuKernelNames())
    EXPECT_TRUE(tested.count(op)) << op << " has no case in CudaKernelTest";
}

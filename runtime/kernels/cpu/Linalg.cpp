//===- Linalg.cpp - CPU kernels of matmul, reductions and normalisation -----===//
//
// GEMM goes to OpenBLAS (one call per batch, row-major, transposes by
// flag); integer matmul is a plain loop. Reductions and norms accumulate in
// the element type, in index order, so results are reproducible bit for bit.
//
//===----------------------------------------------------------------------===//

#include "kernels/common/Registry.h"
#include "kernels/common/Strided.h"

#include <cblas.h>
#include <unistd.h>
#include <cstdlib>
#include <cstring>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

namespace ernie::runtime::cpu {

namespace {

/// c = a x b + beta * c (beta 0: c is only written).
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *a,
          const float *b, float *c, float beta = 0) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
              tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, ta ? m : k, b,
              tb ? k : n, beta, c, n);
}
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double *a,
          const double *b, double *c, double beta = 0) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
              tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0, a, ta ? m : k, b,
              tb ? k : n, beta, c, n);
}
template <typename T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T *a,
          const T *b, T *c, T beta = 0) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      T acc = 0;
      for (int64_t p = 0; p < k; ++p)
        acc += a[ta ? p * m + i : i * k + p] * b[tb ? j * k + p : p * n + j];
      c[i * n + j] = beta ? T(acc + beta * c[i * n + j]) : acc;
    }
}

/// The product `in[0] x in[1]` into `out`, plus what `out` holds when
/// `accumulate` (GEMM's beta = 1).
void multiply(const std::vector<TensorView> &in, const TensorView &out,
              const Attrs &attrs, bool accumulate) {
  const TensorView &a = in[0], &b = in[1];
  bool ta = attrs.getBool("transpose_a"), tb = attrs.getBool("transpose_b");
  int64_t ra = a.rank(), rb = b.rank();
  int64_t m = ta ? a.shape[ra - 1] : a.shape[ra - 2];
  int64_t k = ta ? a.shape[ra - 2] : a.shape[ra - 1];
  int64_t n = tb ? b.shape[rb - 2] : b.shape[rb - 1];
  int64_t batches = a.numElements() / (m * k);
  bool sharedRhs = rb == 2;
  // A shared weight applied to untransposed batches is one GEMM over every
  // batch's rows ([batches * m, k] x [k, n]): the batches are contiguous,
  // and one large call runs far faster than many short ones.
  if (sharedRhs && !ta && batches > 1) {
    m *= batches;
    batches = 1;
  }
  dispatchNumeric(a.type, [&](auto zero) {
    using T = decltype(zero);
    for (int64_t i = 0; i < batches; ++i)
      gemm(ta, tb, m, n, k, a.as<T>() + i * m * k,
           b.as<T>() + (sharedRhs ? 0 : i * k * n), out.as<T>() + i * m * n,
           T(accumulate ? 1 : 0));
  });
}

void matmul(const std::vector<TensorView> &in,
            const std::vector<TensorView> &out, const Attrs &attrs) {
  expectCount(in, 2, "ernie.matmul");
  multiply(in, out[0], attrs, /*accumulate=*/false);
}

/// acc + lhs x rhs. Narrow operands reach here widened to f32 (exactly) by
/// the narrow-float wrapper, and an f32 accumulator as it is: the product
/// is accumulated in f32 and never rounded to the operands' type. The
/// result is usually the accumulator's own buffer (the memory plan writes
/// it over a dying accumulator); otherwise it starts as its copy.
void matmulAccumulate(const std::vector<TensorView> &in,
                      const std::vector<TensorView> &out, const Attrs &attrs) {
  expectCount(in, 3, "ernie.matmul_accumulate");
  const TensorView &acc = in[2], &sum = out[0];
  if (acc.type != sum.type || acc.numElements() != sum.numElements() ||
      in[0].type != in[1].type || in[0].type != sum.type)
    throw KernelError("ernie.matmul_accumulate: the accumulator, the "
                      "result and the (widened) operands must share a type");
  if (sum.data != acc.data)
    std::memcpy(sum.data, acc.data, sum.numElements() * byteSize(sum.type));
  multiply({in[0], in[1]}, sum, attrs, /*accumulate=*/true);
}

/// fp8 codes reach here decoded to f32 (exactly) by the narrow-float
/// wrapper: the GEMM accumulates their products in f32, and the product of
/// the two dequantisation multipliers scales the result once, as cuBLASLt's
/// FP8 GEMM applies its scale pointers.
void scaledMatmul(const std::vector<TensorView> &in,
                  const std::vector<TensorView> &out, const Attrs &attrs) {
  expectCount(in, 4, "ernie.scaled_matmul");
  if (in[2].type != DType::F32 || in[3].type != DType::F32 ||
      in[2].numElements() != 1 || in[3].numElements() != 1)
    throw KernelError("ernie.scaled_matmul takes two f32 scalar scales");
  matmul({in[0], in[1]}, out, attrs);
  float scale = in[2].as<float>()[0] * in[3].as<float>()[0];
  float *y = out[0].as<float>();
  for (int64_t i = 0, e = out[0].numElements(); i < e; ++i)
    y[i] *= scale;
}

/// The filled rows of expert `e`'s buffer of group `g`: `rows[e, g]`, in
/// [0, capacity] (anything else is a KernelError naming it).
int64_t filledRows(const char *op, const TensorView &rows, int64_t e,
                   int64_t g, int64_t groups, int64_t capacity) {
  int64_t r = indexAt(rows, e * groups + g);
  if (r < 0 || r > capacity)
    throw KernelError(std::string(op) + ": rows[" + std::to_string(e) + ", " +
                      std::to_string(g) + "] = " + std::to_string(r) +
                      " is outside [0, " + std::to_string(capacity) +
                      "] (the capacity)");
  return r;
}

/// Per expert and group, the filled rows times the expert's weight; the
/// other rows are zeros. One GEMM per (expert, group): the groups' filled
/// rows are not contiguous.
void expertMatmul(const std::vector<TensorView> &in,
                  const std::vector<TensorView> &out, const Attrs &attrs) {
  expectCount(in, 3, "ernie.expert_matmul");
  const TensorView &x = in[0], &w = in[1], &rows = in[2], &y = out[0];
  bool t = attrs.getBool("transpose_weight");
  int64_t experts = x.shape[0], groups = x.shape[1], capacity = x.shape[2],
          k = x.shape[3], n = y.shape[3];
  dispatchFloat(x.type, [&](auto zero) {
    using T = decltype(zero);
    for (int64_t e = 0; e < experts; ++e)
      for (int64_t g = 0; g < groups; ++g) {
        int64_t block = e * groups + g;
        int64_t r = filledRows("ernie.expert_matmul", rows, e, g, groups,
                               capacity);
        T *dst = y.as<T>() + block * capacity * n;
        if (r > 0)
          gemm(false, t, r, n, k, x.as<T>() + block * capacity * k,
               w.as<T>() + e * k * n, dst);
        std::fill(dst + r * n, dst + capacity * n, T(0));
      }
  });
}

/// dW[e] = sum over groups of the filled rows' input^T x gradient.
void expertWeightGrad(const std::vector<TensorView> &in,
                      const std::vector<TensorView> &out, const Attrs &) {
  expectCount(in, 3, "ernie.expert_weight_grad");
  const TensorView &x = in[0], &dy = in[1], &rows = in[2], &dw = out[0];
  int64_t experts = x.shape[0], groups = x.shape[1], capacity = x.shape[2],
          k = x.shape[3], n = dy.shape[3];
  dispatchFloat(x.type, [&](auto zero) {
    using T = decltype(zero);
    std::fill(dw.as<T>(), dw.as<T>() + dw.numElements(), T(0));
    for (int64_t e = 0; e < experts; ++e)
      for (int64_t g = 0; g < groups; ++g) {
        int64_t block = e * groups + g;
        int64_t r = filledRows("ernie.expert_weight_grad", rows, e, g, groups,
                               capacity);
        if (r > 0)
          gemm(true, false, k, n, r, x.as<T>() + block * capacity * k,
               dy.as<T>() + block * capacity * n, dw.as<T>() + e * k * n,
               T(1));
      }
  });
}

enum class Reduction { Sum, Mean, Max };

void reduce(const std::vector<TensorView> &in,
            const std::vector<TensorView> &out, const Attrs &attrs,
            Reduction kind) {
  expectCount(in, 1, "reduction");
  const TensorView &x = in[0];
  std::vector<int64_t> axes = attrs.getInts("axes");
  std::vector<bool> reduced(x.rank(), false);
  int64_t count = 1;
  for (int64_t a : axes) {
    if (a < 0 || a >= x.rank())
      throw KernelError("reduction axis out of range");
    reduced[a] = true;
    count *= x.shape[a];
  }
  // The input walked in index order, the output standing still along the
  // reduced dimensions: every output element accumulates its terms in
  // increasing input index, as a flat loop over the input would.
  std::vector<int64_t> keptShape;
  for (int64_t d = 0; d < x.rank(); ++d)
    keptShape.push_back(reduced[d] ? 1 : x.shape[d]);
  std::vector<int64_t> toOut = stridesOf(keptShape);
  for (int64_t d = 0; d < x.rank(); ++d)
    if (reduced[d])
      toOut[d] = 0;
  StridedSpace<2> space{x.shape, {std::move(toOut), stridesOf(x.shape)}};
  space.simplify();
  dispatchNumeric(x.type, [&](auto zero) {
    using T = decltype(zero);
    const T *src = x.as<T>();
    T *dst = out[0].as<T>();
    int64_t n = out[0].numElements();
    T init = kind == Reduction::Max ? std::numeric_limits<T>::lowest() : T(0);
    if constexpr (std::is_floating_point_v<T>)
      if (kind == Reduction::Max)
        init = -std::numeric_limits<T>::infinity();
    std::fill(dst, dst + n, init);
    const bool max = kind == Reduction::Max;
    space.forEachRow([&](const std::array<int64_t, 2> &at, int64_t len,
                         const std::array<int64_t, 2> &step) {
      T *o = dst + at[0];
      const T *in = src + at[1]; // step[1] == 1: the input is contiguous
      if (step[0] == 0) {
        T acc = *o;
        for (int64_t j = 0; j < len; ++j)
          acc = max ? maximumOf(acc, in[j]) : acc + in[j];
        *o = acc;
      } else if (step[0] == 1 && max) {
        for (int64_t j = 0; j < len; ++j)
          o[j] = maximumOf(o[j], in[j]);
      } else if (step[0] == 1) {
        for (int64_t j = 0; j < len; ++j)
          o[j] += in[j];
      } else {
        for (int64_t j = 0; j < len; ++j) {
          T &y = o[j * step[0]];
          y = max ? maximumOf(y, in[j]) : y + in[j];
        }
      }
    });
    if (kind == Reduction::Mean)
      for (int64_t i = 0; i < n; ++i)
        dst[i] /= static_cast<T>(count);
  });
}

/// Calls fn(base, stride, length) for every line along `axis`.
template <typename Fn>
void forEachLine(const std::vector<int64_t> &shape, int64_t axis, Fn fn) {
  int64_t inner = 1, outer = 1;
  for (int64_t d = axis + 1; d < static_cast<int64_t>(shape.size()); ++d)
    inner *= shape[d];
  for (int64_t d = 0; d < axis; ++d)
    outer *= shape[d];
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i)
      fn(o * shape[axis] * inner + i, inner, shape[axis]);
}

void softmax(const std::vector<TensorView> &in,
             const std::vector<TensorView> &out, const Attrs &attrs,
             bool logarithm) {
  expectCount(in, 1, "softmax");
  int64_t axis = attrs.getInt("axis");
  if (axis < 0 || axis >= in[0].rank())
    throw KernelError("softmax axis out of range");
  dispatchFloat(in[0].type, [&](auto zero) {
    using T = decltype(zero);
    const T *x = in[0].as<T>();
    T *y = out[0].as<T>();
    forEachLine(in[0].shape, axis, [&](int64_t base, int64_t stride,
                                       int64_t len) {
      T peak = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < len; ++j)
        peak = std::max(peak, x[base + j * stride]);
      T total = 0;
      for (int64_t j = 0; j < len; ++j)
        total += std::exp(x[base + j * stride] - peak);
      for (int64_t j = 0; j < len; ++j) {
        T shifted = x[base + j * stride] - peak;
        y[base + j * stride] =
            logarithm ? shifted - std::log(total) : std::exp(shifted) / total;
      }
    });
  });
}

void norm(const std::vector<TensorView> &in,
          const std::vector<TensorView> &out, const Attrs &attrs,
          bool layer) {
  expectCount(in, layer ? 3 : 2, layer ? "ernie.layer_norm" : "ernie.rms_norm");
  const TensorView &x = in[0];
  if (in[1].type != x.type || (layer && in[2].type != x.type))
    throw KernelError("norm weights must have the input's type on the CPU "
                      "(cast them first)");
  double eps = attrs.getFloat("epsilon", layer ? 1e-5 : 1e-6);
  int64_t d = x.shape.back(), rows = x.numElements() / d;
  dispatchFloat(x.type, [&](auto zero) {
    using T = decltype(zero);
    const T *src = x.as<T>(), *w = in[1].as<T>();
    const T *b = layer ? in[2].as<T>() : nullptr;
    T *dst = out[0].as<T>();
    for (int64_t r = 0; r < rows; ++r) {
      const T *row = src + r * d;
      T mean = 0;
      if (layer) {
        for (int64_t j = 0; j < d; ++j)
          mean += row[j];
        mean /= static_cast<T>(d);
      }
      T sq = 0;
      for (int64_t j = 0; j < d; ++j)
        sq += (row[j] - mean) * (row[j] - mean);
      T scale = T(1) / std::sqrt(sq / static_cast<T>(d) + static_cast<T>(eps));
      for (int64_t j = 0; j < d; ++j)
        dst[r * d + j] = (row[j] - mean) * scale * w[j] + (b ? b[j] : T(0));
    }
  });
}

} // namespace

void registerLinalgKernels(Registry &r) {
  r["ernie.matmul"] = matmul;
  r["ernie.scaled_matmul"] = scaledMatmul;
  r["ernie.matmul_accumulate"] = matmulAccumulate;
  r["ernie.expert_matmul"] = expertMatmul;
  r["ernie.expert_weight_grad"] = expertWeightGrad;
  r["ernie.reduce_sum"] = [](auto &in, auto &out, auto &a) {
    reduce(in, out, a, Reduction::Sum);
  };
  r["ernie.reduce_mean"] = [](auto &in, auto &out, auto &a) {
    reduce(in, out, a, Reduction::Mean);
  };
  r["ernie.reduce_max"] = [](auto &in, auto &out, auto &a) {
    reduce(in, out, a, Reduction::Max);
  };
  r["ernie.softmax"] = [](auto &in, auto &out, auto &a) {
    softmax(in, out, a, false);
  };
  r["ernie.log_softmax"] = [](auto &in, auto &out, auto &a) {
    softmax(in, out, a, true);
  };
  r["ernie.rms_norm"] = [](auto &in, auto &out, auto &a) {
    norm(in, out, a, false);
  };
  r["ernie.layer_norm"] = [](auto &in, auto &out, auto &a) {
    norm(in, out, a, true);
  };
}

} // namespace ernie::runtime::cpu

namespace ernie::runtime {
void setCpuBlasThreads(int threads) { openblas_set_num_threads(threads); }

std::string GemmLibrary::describe() const {
  return library + ", " + kernels + " kernels";
}

namespace {
std::string lowercase(std::string s) {
  for (char &c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

/// OpenBLAS's x86 kernel families, weakest first; -1 for a family this
/// ranking does not know (ARM, Zen's own, ...), which ernie leaves alone.
int familyRank(const std::string &core) {
  static const char *generic[] = {"prescott", "core2",  "katmai",
                                  "northwood", "banias", "atom",
                                  "nehalem",  "penryn", "dunnington",
                                  "sandybridge"};
  std::string c = lowercase(core);
  for (const char *g : generic)
    if (c == g)
      return 0;
  if (c == "haswell")
    return 1;
  if (c == "skylakex")
    return 2;
  if (c == "cooperlake" || c == "sapphirerapids")
    return 3;
  return -1;
}
} // namespace

std::string preferredGemmKernels() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  bool avx512 = __builtin_cpu_supports("avx512f") &&
                __builtin_cpu_supports("avx512vl") &&
                __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512dq");
  if (avx512 && __builtin_cpu_supports("avx512bf16"))
    return "Cooperlake";
  if (avx512)
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return "Haswell";
#endif
  return "";
}

GemmLibrary cpuGemmLibrary() {
  GemmLibrary g;
  const char *config = openblas_get_config(), *core = openblas_get_corename();
  g.library = config ? config : "OpenBLAS";
  while (!g.library.empty() && g.library.back() == ' ')
    g.library.pop_back();
  g.kernels = core ? core : "unknown";
  // A family the user asked for (OPENBLAS_CORETYPE) is not a fallback.
  std::string best = preferredGemmKernels();
  int have = familyRank(g.kernels), could = familyRank(best);
  if (!std::getenv("OPENBLAS_CORETYPE") && have >= 0 && have < could)
    g.warning = "OpenBLAS runs its " + g.kernels + " kernels on a CPU that "
                "runs its " + best + " ones: GEMMs are up to several times "
                "slower than they could be (OpenBLAS did not recognise this "
                "CPU; OPENBLAS_CORETYPE=" + best + " selects them, which "
                "ernie-run and `import ernie` do unless the variable is set)";
  return g;
}

void chooseCpuGemmKernels(char **argv) {
  if (std::getenv("OPENBLAS_CORETYPE"))
    return; // the user's choice, or ours on the second start
  std::string best = preferredGemmKernels();
  const char *core = openblas_get_corename();
  if (best.empty() || !core || lowercase(core) == lowercase(best))
    return;
  // OpenBLAS reads the variable only when it loads: start again with it.
  ::setenv("OPENBLAS_CORETYPE", best.c_str(), 1);
  ::execv("/proc/self/exe", argv);
  // exec failed (no /proc): run on with what OpenBLAS chose.
}
} // namespace ernie::runtime

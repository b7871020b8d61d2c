//===- Transformer.cpp - CPU kernels of rope, attention and the loss --------===//
//
// Straight from the op definitions (ErnieOps.td), in the element type with
// index-order accumulation. Attention runs as OpenBLAS GEMMs per (batch,
// query head) on strided head views and recomputes its probabilities in the
// backward, as flash attention does.
//
//===----------------------------------------------------------------------===//

#include "kernels/common/ElementwiseMath.h"
#include "kernels/common/Registry.h"

#include <map>

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace ernie::runtime::cpu {

namespace {

/// [batch, seq, heads, dim] offset.
struct Layout4 {
  int64_t b, s, h, d;
  explicit Layout4(const TensorView &v)
      : b(v.shape[0]), s(v.shape[1]), h(v.shape[2]), d(v.shape[3]) {}
  int64_t at(int64_t bi, int64_t si, int64_t hi, int64_t di) const {
    return ((bi * s + si) * h + hi) * d + di;
  }
};

/// cos and sin of a position's rotary angles p * theta^(-2i/d), i < d/2,
/// computed once per (theta, d, position) and kept for later calls (per
/// thread: a rank's executor): a program's positions are the same every
/// step, and every head of a token shares them.
class RopeTable {
public:
  RopeTable(double theta, int64_t dim) : half_(dim / 2) {
    for (int64_t i = 0; i < half_; ++i)
      inverse_.push_back(std::pow(theta, -2.0 * i / dim));
  }

  /// [cos x half, sin x half] of position p (negative ones too: the
  /// gradient rotates back by -p; each sign has its own rows, filled from
  /// the angle itself, so nothing relies on cos and sin's symmetry).
  const double *row(int64_t p) {
    const bool negative = p < 0;
    const int64_t at = negative ? -(p + 1) : p; // -(p + 1): no overflow
    if (at >= kMaxCachedPositions) {
      scratch_.resize(2 * half_);
      fill(p, scratch_.data());
      return scratch_.data();
    }
    std::vector<double> &rows = rows_[negative];
    int64_t &cached = cached_[negative];
    if (at >= cached) {
      int64_t upto = std::max(at + 1, std::min(2 * cached, kMaxCachedPositions));
      rows.resize(upto * 2 * half_);
      for (int64_t q = cached; q < upto; ++q)
        fill(negative ? -(q + 1) : q, rows.data() + q * 2 * half_);
      cached = upto;
    }
    return rows.data() + at * 2 * half_;
  }

  static RopeTable &of(double theta, int64_t dim) {
    thread_local std::map<std::pair<double, int64_t>, RopeTable> tables;
    return tables.try_emplace({theta, dim}, theta, dim).first->second;
  }

private:
  static constexpr int64_t kMaxCachedPositions = 1 << 16;

  void fill(int64_t p, double *out) const {
    for (int64_t i = 0; i < half_; ++i) {
      double angle = static_cast<double>(p) * inverse_[i];
      out[i] = std::cos(angle);
      out[half_ + i] = std::sin(angle);
    }
  }

  int64_t half_, cached_[2] = {0, 0};
  std::vector<double> inverse_, rows_[2], scratch_;
};

void rope(const std::vector<TensorView> &in, const std::vector<TensorView> &out,
          const Attrs &attrs) {
  expectCount(in, 2, "ernie.rope");
  const TensorView &x = in[0], &pos = in[1];
  double theta = attrs.getFloat("theta", 10000.0);
  bool interleaved = attrs.getBool("interleaved");
  Layout4 L(x);
  int64_t half = L.d / 2;
  bool batched = pos.rank() == 2;
  RopeTable &table = RopeTable::of(theta, L.d);
  dispatchFloat(x.type, [&](auto zero) {
    using T = decltype(zero);
    const T *src = x.as<T>();
    T *dst = out[0].as<T>();
    std::vector<T> c(half), sn(half);
    for (int64_t b = 0; b < L.b; ++b)
      for (int64_t s = 0; s < L.s; ++s) {
        const double *row = table.row(indexAt(pos, batched ? b * L.s + s : s));
        for (int64_t i = 0; i < half; ++i) {
          c[i] = static_cast<T>(row[i]);
          sn[i] = static_cast<T>(row[half + i]);
        }
        for (int64_t h = 0; h < L.h; ++h) {
          const T *a = src + L.at(b, s, h, 0);
          T *y = dst + L.at(b, s, h, 0);
          for (int64_t i = 0; i < half; ++i) {
            int64_t i0 = interleaved ? 2 * i : i;
            int64_t i1 = interleaved ? 2 * i + 1 : i + half;
            T x0 = a[i0], x1 = a[i1];
            y[i0] = x0 * c[i] - x1 * sn[i];
            y[i1] = x1 * c[i] + x0 * sn[i];
          }
        }
      }
  });
}

/// Row-major GEMM C = alpha * op(A) op(B) + beta * C on strided views
/// (leading dimensions are row strides, so head slices of [b, s, h, d]
/// tensors need no copies).
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
          const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
          float *c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
              tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb,
              beta, c, ldc);
}
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
          const double *a, int64_t lda, const double *b, int64_t ldb,
          double beta, double *c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
              tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb,
              beta, c, ldc);
}

/// As gemm, but safe for empty extents: nothing to write when m or n is 0,
/// and an empty sum (k == 0) gives beta * C without calling BLAS.
template <typename T>
void stridedGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha,
                 const T *a, int64_t lda, const T *b, int64_t ldb, T beta,
                 T *c, int64_t ldc) {
  if (m == 0 || n == 0)
    return;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
    return;
  }
  gemm(ta, tb, m, n, k, alpha, a, std::max<int64_t>(lda, 1), b,
       std::max<int64_t>(ldb, 1), beta, c, std::max<int64_t>(ldc, 1));
}

/// Queries are taken in strips of this many rows: a strip's scores are
/// [rows, keys it sees], so no [sq, sk] matrix is ever held, and under a
/// causal mask a strip's GEMMs stop at its last row's key — the masked
/// tiles above the diagonal are never computed (about half the work).
constexpr int64_t kQueryStrip = 64;

/// e[j] = exp(row[j] - peak) for a row of f32 logits or scores (e may be
/// row), and their sum (eight
/// partial sums, added pairwise: both loops vectorise). Built for AVX-512,
/// AVX2 and the baseline; the loader picks the CPU's. No FMA contraction,
/// so every clone computes the same bits.
__attribute__((target_clones("avx512f", "avx2", "default"),
               optimize("fp-contract=off"))) float
expRow(const float *row, float peak, float *e, int64_t n) {
  for (int64_t j = 0; j < n; ++j)
    e[j] = math::exponential(row[j] - peak);
  float partial[8] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k)
      partial[k] += e[j + k];
  for (; j < n; ++j)
    partial[0] += e[j];
  return ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
         ((partial[4] + partial[5]) + (partial[6] + partial[7]));
}

/// The largest of a row's logits (eight running maxima: the loop
/// vectorises; the maximum does not depend on the order).
template <typename T> T rowMax(const T *row, int64_t n) {
  T partial[8];
  std::fill(partial, partial + 8, -std::numeric_limits<T>::infinity());
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k)
      partial[k] = row[j + k] > partial[k] ? row[j + k] : partial[k];
  for (; j < n; ++j)
    partial[0] = row[j] > partial[0] ? row[j] : partial[0];
  return *std::max_element(partial, partial + 8);
}

/// As expRow for f64 logits, in f64 and in order.
double expRow(const double *row, double peak, double *e, int64_t n) {
  double total = 0;
  for (int64_t j = 0; j < n; ++j)
    total += e[j] = std::exp(row[j] - peak);
  return total;
}

/// Softmax probabilities P [rows, end] (row stride `end`) of query rows
/// [s0, s0 + rows) of one head against keys [0, end): S = scale * Q K^T by
/// GEMM, then per row the max-subtracted softmax over the visible keys
/// (t <= row when causal, and t > row - window with a sliding window);
/// masked entries are 0.
template <typename T>
void probabilities(const T *qh, int64_t ldq, const T *kh, int64_t ldk,
                   int64_t s0, int64_t rows, int64_t end, int64_t d,
                   bool causal, int64_t window, T scale, T *p) {
  stridedGemm(false, true, rows, end, d, scale, qh + s0 * ldq, ldq, kh, ldk,
              T(0), p, end);
  for (int64_t r = 0; r < rows; ++r) {
    T *row = p + r * end;
    int64_t last = causal ? s0 + r : end - 1;
    int64_t first = window ? std::max<int64_t>(0, s0 + r - window + 1) : 0;
    T peak = rowMax(row + first, last + 1 - first);
    T total = expRow(row + first, peak, row + first, last + 1 - first);
    for (int64_t t = first; t <= last; ++t)
      row[t] /= total;
    std::fill(row, row + first, T(0));
    for (int64_t t = last + 1; t < end; ++t)
      row[t] = T(0);
  }
}

/// Per (batch, query head, strip of kQueryStrip queries) GEMMs on strided
/// head views. Query head h reads key/value head h / (hq / hkv); shared
/// key/value heads accumulate their gradients over query heads and strips
/// in increasing order, so results are reproducible bit for bit.
void attention(const std::vector<TensorView> &in,
               const std::vector<TensorView> &out, const Attrs &attrs,
               bool backward) {
  expectCount(in, backward ? 4 : 3,
              backward ? "ernie.attention_grad" : "ernie.attention");
  Layout4 Q(in[0]), K(in[1]), V(in[2]);
  bool causal = attrs.getBool("causal");
  int64_t window = attrs.getInt("window", 0); // 0: every key up to the row
  // The verifier guarantees these; a kernel called past it must not read
  // out of bounds.
  if (K.h == 0 || Q.h % K.h != 0 || Q.b != K.b || Q.d != K.d ||
      K.s != V.s || (causal && Q.s != K.s) || window < 0 || (window && !causal))
    throw KernelError("ernie.attention: query, key and value shapes do not "
                      "match (causal attention needs equal sequence lengths)");
  int64_t group = Q.h / K.h;
  double scaleAttr = attrs.getFloat("scale", 1.0 / std::sqrt(double(Q.d)));
  dispatchFloat(in[0].type, [&](auto zero) {
    using T = decltype(zero);
    const T *q = in[0].as<T>(), *k = in[1].as<T>(), *v = in[2].as<T>();
    T scale = static_cast<T>(scaleAttr);
    // Row strides of one head's [seq, dim] slice.
    int64_t ldq = Q.h * Q.d, ldk = K.h * K.d, ldv = V.h * V.d, ldo = Q.h * V.d;
    int64_t sq = Q.s, sk = K.s, strip = std::min(sq, kQueryStrip);
    std::vector<T> scratch((backward ? 2 : 1) * strip * sk);
    T *p = scratch.data(), *dp = p + strip * sk;
    auto qHead = [&](auto *base, int64_t b, int64_t h, int64_t dim) {
      return base + (b * sq * Q.h + h) * dim;
    };
    auto kvHead = [&](auto *base, int64_t b, int64_t h, int64_t dim) {
      return base + (b * sk * K.h + h) * dim;
    };
    // Strip [s0, s0 + rows) sees keys [0, end).
    auto forEachStrip = [&](auto fn) {
      for (int64_t s0 = 0; s0 < sq; s0 += strip) {
        int64_t rows = std::min(strip, sq - s0);
        fn(s0, rows, causal ? s0 + rows : sk);
      }
    };
    if (!backward) {
      T *o = out[0].as<T>();
      for (int64_t b = 0; b < Q.b; ++b)
        for (int64_t h = 0; h < Q.h; ++h) {
          int64_t kv = h / group;
          const T *kh = kvHead(k, b, kv, K.d), *vh = kvHead(v, b, kv, V.d);
          forEachStrip([&](int64_t s0, int64_t rows, int64_t end) {
            probabilities(qHead(q, b, h, Q.d), ldq, kh, ldk, s0, rows, end,
                          Q.d, causal, window, scale, p);
            stridedGemm(false, false, rows, V.d, end, T(1), p, end, vh, ldv,
                        T(0), qHead(o, b, h, V.d) + s0 * ldo, ldo);
          });
        }
      return;
    }
    const T *dout = in[3].as<T>();
    T *dq = out[0].as<T>(), *dk = out[1].as<T>(), *dv = out[2].as<T>();
    std::fill(dq, dq + in[0].numElements(), T(0));
    std::fill(dk, dk + in[1].numElements(), T(0));
    std::fill(dv, dv + in[2].numElements(), T(0));
    for (int64_t b = 0; b < Q.b; ++b)
      for (int64_t h = 0; h < Q.h; ++h) {
        int64_t kv = h / group;
        const T *qh = qHead(q, b, h, Q.d), *doh = qHead(dout, b, h, V.d);
        const T *kh = kvHead(k, b, kv, K.d), *vh = kvHead(v, b, kv, V.d);
        forEachStrip([&](int64_t s0, int64_t rows, int64_t end) {
          probabilities(qh, ldq, kh, ldk, s0, rows, end, Q.d, causal, window,
                        scale, p);
          const T *dos = doh + s0 * ldo, *qs = qh + s0 * ldq;
          // dV += P^T dO; dP = dO V^T.
          stridedGemm(true, false, end, V.d, rows, T(1), p, end, dos, ldo,
                      T(1), kvHead(dv, b, kv, V.d), ldv);
          stridedGemm(false, true, rows, end, V.d, T(1), dos, ldo, vh, ldv,
                      T(0), dp, end);
          // dS = P * (dP - rowsum(dP * P)), in place of dP.
          for (int64_t r = 0; r < rows; ++r) {
            const T *prow = p + r * end;
            T *row = dp + r * end;
            T dot = 0;
            for (int64_t t = 0; t < end; ++t)
              dot += row[t] * prow[t];
            for (int64_t t = 0; t < end; ++t)
              row[t] = prow[t] * (row[t] - dot);
          }
          // dQ = scale * dS K; dK += scale * dS^T Q.
          stridedGemm(false, false, rows, Q.d, end, scale, dp, end, kh, ldk,
                      T(0), qHead(dq, b, h, Q.d) + s0 * ldq, ldq);
          stridedGemm(true, false, end, K.d, rows, scale, dp, end, qs, ldq,
                      T(1), kvHead(dk, b, kv, K.d), ldk);
        });
      }
  });
}

/// The loss (into `loss`) and/or the gradient rows (softmax - onehot) *
/// scale (into `grad`), one row at a time: a row's exponentials are
/// computed once and serve both, so the pair of ops and the fused op
/// compute the same bits.
void crossEntropy(const std::vector<TensorView> &in, const TensorView *loss,
                  const TensorView *grad, const Attrs &attrs, const char *op) {
  expectCount(in, grad ? 3 : 2, op);
  const TensorView &logits = in[0], &labels = in[1];
  int64_t vocab = logits.shape.back(), tokens = labels.numElements();
  int64_t ignore = attrs.getInt("ignore_index", -100);
  std::string reduction = attrs.getString("reduction", "mean");
  dispatchFloat(logits.type, [&](auto zero) {
    using T = decltype(zero);
    const T *x = logits.as<T>();
    int64_t kept = 0;
    for (int64_t t = 0; t < tokens; ++t)
      kept += indexAt(labels, t) != ignore;
    std::vector<T> losses(loss ? tokens : 0, T(0));
    // The exponentials of a row (the gradient keeps them in its own rows).
    std::vector<T> scratch(grad ? 0 : vocab);
    T scale = 0;
    if (grad) {
      const T *dl = in[2].as<T>();
      scale = reduction == "mean" ? dl[0] / static_cast<T>(kept) : dl[0];
    }
    for (int64_t t = 0; t < tokens; ++t) {
      int64_t label = indexAt(labels, t);
      const T *row = x + t * vocab;
      T *g = grad ? grad->as<T>() + t * vocab : nullptr;
      if (label == ignore) {
        if (g)
          std::fill(g, g + vocab, T(0));
        continue;
      }
      T peak = rowMax(row, vocab);
      T total = expRow(row, peak, g ? g : scratch.data(), vocab);
      if (label < 0 || label >= vocab)
        throw KernelError("label " + std::to_string(label) +
                          " is outside the vocabulary of " + std::to_string(vocab));
      if (loss)
        losses[t] = std::log(total) + peak - row[label];
      if (!g)
        continue;
      const T rowScale = reduction == "none" ? in[2].as<T>()[t] : scale;
      const T inverse = T(1) / total;
      for (int64_t j = 0; j < vocab; ++j)
        g[j] = g[j] * inverse * rowScale;
      g[label] -= rowScale;
    }
    if (!loss)
      return;
    T *y = loss->as<T>();
    if (reduction == "none") {
      std::copy(losses.begin(), losses.end(), y);
      return;
    }
    T sum = 0;
    for (T l : losses)
      sum += l;
    y[0] = reduction == "mean" ? sum / static_cast<T>(kept) : sum;
  });
}

} // namespace

void registerTransformerKernels(Registry &r) {
  r["ernie.rope"] = rope;
  r["ernie.attention"] = [](auto &in, auto &out, auto &a) {
    attention(in, out, a, false);
  };
  r["ernie.attention_grad"] = [](auto &in, auto &out, auto &a) {
    attention(in, out, a, true);
  };
  r["ernie.cross_entropy"] = [](auto &in, auto &out, auto &a) {
    crossEntropy(in, &out.at(0), nullptr, a, "ernie.cross_entropy");
  };
  r["ernie.cross_entropy_grad"] = [](auto &in, auto &out, auto &a) {
    crossEntropy(in, nullptr, &out.at(0), a, "ernie.cross_entropy_grad");
  };
  r["ernie.cross_entropy_and_grad"] = [](auto &in, auto &out, auto &a) {
    crossEntropy(in, &out.at(0), &out.at(1), a, "ernie.cross_entropy_and_grad");
  };
}

// Parameters, gradients and optimizer state (momentum, moments) may each be
// kept in another precision, so each element is read in its own type and the
// arithmetic is f64; results round once, straight from f64, into their types
// (narrow ones included, which is why these take every type themselves).
namespace {
/// fn(start, n) over [0, count) in blocks of kDoubleBlock: each element is
/// loaded in its own type, updated in f64 and stored once. Outputs may
/// alias inputs (updates in place): a block is read before it is written.
template <typename Fn> void forEachDoubleBlock(int64_t count, Fn fn) {
  for (int64_t start = 0; start < count; start += kDoubleBlock)
    fn(start, std::min(kDoubleBlock, count - start));
}

void expectFloats(const std::vector<TensorView> &views, size_t count,
                  const char *op) {
  for (size_t i = 0; i < count; ++i)
    if (!isFloat(views[i].type))
      throw KernelError(std::string(op) + ": buffer " + std::to_string(i) +
                        " is " + std::string(name(views[i].type)) +
                        ", not a float");
}
} // namespace

void registerOptimizerKernels(Registry &r) {
  r.addForEveryType("ernie.sgd_update", [](const std::vector<TensorView> &in,
                                           const std::vector<TensorView> &out,
                                           const Attrs &attrs) {
    expectCount(in, 4, "ernie.sgd_update");
    expectCount(out, 2, "ernie.sgd_update");
    expectFloats(in, 3, "ernie.sgd_update");
    expectFloats(out, 2, "ernie.sgd_update");
    double momentum = attrs.getFloat("momentum", 0.0),
           decay = attrs.getFloat("weight_decay", 0.0),
           lr = scalarAt(in[3]);
    bool nesterov = attrs.getBool("nesterov");
    forEachDoubleBlock(in[0].numElements(), [&](int64_t start, int64_t n) {
      double p[kDoubleBlock], g[kDoubleBlock], b[kDoubleBlock];
      loadBlockAsDouble(in[0], start, n, p);
      loadBlockAsDouble(in[1], start, n, g);
      // Without momentum the buffer's old value is multiplied by 0: not
      // read (its bytes are a fifth of the update's traffic).
      if (momentum != 0)
        loadBlockAsDouble(in[2], start, n, b);
      else
        std::fill(b, b + n, 0.0);
      for (int64_t i = 0; i < n; ++i) {
        double grad = g[i] + decay * p[i];
        b[i] = momentum * b[i] + grad;
        double step = nesterov ? grad + momentum * b[i] : b[i];
        p[i] = p[i] - lr * step;
      }
      storeBlockFromDouble(out[1], start, n, b);
      storeBlockFromDouble(out[0], start, n, p);
    });
  });
  r.addForEveryType("ernie.adamw_update", [](const std::vector<TensorView> &in,
                                             const std::vector<TensorView> &out,
                                             const Attrs &attrs) {
    expectCount(in, 6, "ernie.adamw_update");
    expectCount(out, 3, "ernie.adamw_update");
    expectFloats(in, 4, "ernie.adamw_update");
    expectFloats(out, 3, "ernie.adamw_update");
    double b1 = attrs.getFloat("beta1", 0.9), b2 = attrs.getFloat("beta2", 0.999),
           eps = attrs.getFloat("epsilon", 1e-8),
           decay = attrs.getFloat("weight_decay", 0.01), lr = scalarAt(in[4]);
    double t = static_cast<double>(indexAt(in[5], 0));
    double c1 = 1 - std::pow(b1, t), c2 = 1 - std::pow(b2, t);
    forEachDoubleBlock(in[0].numElements(), [&](int64_t start, int64_t n) {
      double p[kDoubleBlock], g[kDoubleBlock], m[kDoubleBlock], v[kDoubleBlock];
      loadBlockAsDouble(in[0], start, n, p);
      loadBlockAsDouble(in[1], start, n, g);
      loadBlockAsDouble(in[2], start, n, m);
      loadBlockAsDouble(in[3], start, n, v);
      for (int64_t i = 0; i < n; ++i) {
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
        double update = (m[i] / c1) / (std::sqrt(v[i] / c2) + eps) + decay * p[i];
        p[i] = p[i] - lr * update;
      }
      storeBlockFromDouble(out[1], start, n, m);
      storeBlockFromDouble(out[2], start, n, v);
      storeBlockFromDouble(out[0], start, n, p);
    });
  });
}

} // namespace ernie::runtime::cpu

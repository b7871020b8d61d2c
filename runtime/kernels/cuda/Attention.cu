//===- Attention.cu - fused attention forward and backward on CUDA ----------===//
//
// UNVERIFIED ON A GPU: compiled and linked without one; not yet run on a GPU
// (scripts/gpu_check.sh compares it with the CPU kernels and times it).
//
// A flash-style kernel of our own, not cuDNN's fused attention: the cuDNN
// frontend (the header-only C++ API over cuDNN's graph API that builds SDPA
// graphs) is not installed on the build machines, and writing SDPA against
// cuDNN's raw backend descriptors, with no GPU to check it on, would be
// thousands of lines no test could run; ernie's attention also has to match
// the CPU op exactly in what it accepts (grouped key/value heads, any scale,
// f32/f64 as well as bf16/f16, a value head size of its own). Swapping in
// cuDNN's SDPA where the frontend is available is a follow-up.
//
// Flash-attention's structure, none of its tensor-core speed: each thread
// owns one query row (forward, dQ) or one key row (dK, dV), tiles of keys
// (or queries) are staged in shared memory, the softmax is online (running
// maximum and sum), so no [sq, sk] buffer exists; under a causal mask a
// query block stops at its last row's key and a key block starts at its
// first row's query, so masked tiles are never read. The backward
// recomputes the probabilities from the row statistics (log-sum-exp and
// D = rowsum(dO * O)), as FlashAttention-2 does, and accumulates dK and dV
// per key row over the group's query heads and rows in order: deterministic,
// no atomics. Computes in f32 (f64 for f64), reading and writing every
// stored float type.
//
//===----------------------------------------------------------------------===//

#include "CudaKernels.h"
#include "DeviceMath.cuh"

#include "kernels/common/ElementwiseMath.h"

#include <algorithm>
#include <cmath>

namespace ernie::runtime::cuda {

namespace {

constexpr int kRows = 64; // query (or key) rows per block, one per thread
constexpr int kTileRows = 32; // keys (or queries) staged per shared-memory tile

struct Shape {
  int64_t B, Sq, Sk, Hq, Hkv, D, Dv;
  bool causal;
  double scale;
  int64_t window; // sliding window (causal only); 0: every key up to the row
  // Element offsets of [b, s, h, 0] in q/out (Hq heads) and k/v (Hkv).
  __device__ int64_t q(int64_t b, int64_t s, int64_t h) const {
    return ((b * Sq + s) * Hq + h) * D;
  }
  __device__ int64_t o(int64_t b, int64_t s, int64_t h) const {
    return ((b * Sq + s) * Hq + h) * Dv;
  }
  __device__ int64_t k(int64_t b, int64_t t, int64_t h) const {
    return ((b * Sk + t) * Hkv + h) * D;
  }
  __device__ int64_t v(int64_t b, int64_t t, int64_t h) const {
    return ((b * Sk + t) * Hkv + h) * Dv;
  }
};

template <typename C> __device__ C expOf(C x) { return cpu::math::exponential(x); }

/// Stages `n` rows of `width` elements into shared memory `dst`, row r
/// read from `src` at rowAt(r), the whole block cooperating.
template <int T, typename C, typename RowAt>
__device__ void stageRows(C *dst, const typename Io<T>::Raw *src, int n,
                          int64_t width, RowAt rowAt) {
  for (int idx = threadIdx.x; idx < n * width; idx += blockDim.x) {
    int r = int(idx / width), c = int(idx % width);
    dst[idx] = Io<T>::load(src, rowAt(r) + c);
  }
}

/// Stages keys [t0, t0 + n) of (b, kv) into shared memory: K then V.
template <int T, typename C>
__device__ void stageKeys(const Shape &s, const typename Io<T>::Raw *k,
                          const typename Io<T>::Raw *v, int64_t b, int64_t kv,
                          int64_t t0, int n, C *kSh, C *vSh) {
  stageRows<T>(kSh, k, n, s.D, [&](int r) { return s.k(b, t0 + r, kv); });
  stageRows<T>(vSh, v, n, s.Dv, [&](int r) { return s.v(b, t0 + r, kv); });
}

/// The query rows a block owns (forward, dQ): its batch, head and that
/// head's key/value head, its first row, and this thread's row.
struct QueryBlock {
  int64_t b, h, kv, s0, row;
  bool active;
  __device__ explicit QueryBlock(const Shape &s) {
    const int64_t blocksPerHead = (s.Sq + kRows - 1) / kRows;
    const int64_t bh = blockIdx.x / blocksPerHead;
    b = bh / s.Hq;
    h = bh % s.Hq;
    kv = h / (s.Hq / s.Hkv);
    s0 = (blockIdx.x % blocksPerHead) * kRows;
    row = s0 + threadIdx.x;
    active = row < s.Sq;
  }
};

/// Calls visit(keyRow, valueRow) for every key this thread's query row
/// sees, in order, the keys staged tile by tile in shared memory by the
/// whole block; a causal block stops at its last row's key, and under a
/// sliding window starts at its first row's first key.
template <int T, typename C, typename Visit>
__device__ void forEachVisibleKey(const Shape &s, const QueryBlock &qb,
                                  const typename Io<T>::Raw *k,
                                  const typename Io<T>::Raw *v, C *kSh, C *vSh,
                                  Visit visit) {
  const int64_t end =
      s.causal ? std::min<int64_t>(s.Sk, std::min<int64_t>(s.Sq, qb.s0 + kRows))
               : s.Sk;
  const int64_t begin = s.window ? std::max<int64_t>(0, qb.s0 - s.window + 1) : 0;
  for (int64_t t0 = begin; t0 < end; t0 += kTileRows) {
    const int n = int(std::min<int64_t>(kTileRows, end - t0));
    __syncthreads();
    stageKeys<T>(s, k, v, qb.b, qb.kv, t0, n, kSh, vSh);
    __syncthreads();
    if (!qb.active)
      continue;
    for (int j = 0; j < n; ++j) {
      if (s.causal && t0 + j > qb.row)
        break;
      if (s.window && t0 + j <= qb.row - s.window)
        continue;
      visit(kSh + j * s.D, vSh + j * s.Dv);
    }
  }
}

/// Forward (`out`), or the backward's row statistics (`lse` = m + log l
/// and `drow` = rowsum(dout * out)): per query row the online softmax over
/// the keys it sees, key tiles staged in shared memory.
template <int T, int MaxD>
__global__ void forwardKernel(Shape s, const typename Io<T>::Raw *q,
                              const typename Io<T>::Raw *k,
                              const typename Io<T>::Raw *v,
                              typename Io<T>::Raw *out,
                              const typename Io<T>::Raw *dout,
                              typename Io<T>::C *lse, typename Io<T>::C *drow) {
  using C = typename Io<T>::C;
  extern __shared__ unsigned char smem[];
  C *kSh = reinterpret_cast<C *>(smem), *vSh = kSh + kTileRows * s.D;
  const QueryBlock qb(s);
  const int64_t b = qb.b, h = qb.h, row = qb.row;
  const bool active = qb.active;
  C qr[MaxD], acc[MaxD];
  C m = C(-INFINITY), l = 0;
  if (active) {
    for (int c = 0; c < s.D; ++c)
      qr[c] = Io<T>::load(q, s.q(b, row, h) + c);
    for (int c = 0; c < s.Dv; ++c)
      acc[c] = 0;
  }
  const C scale = C(s.scale);
  forEachVisibleKey<T>(s, qb, k, v, kSh, vSh, [&](const C *key, const C *value) {
    C dot = 0;
    for (int c = 0; c < s.D; ++c)
      dot += qr[c] * key[c];
    const C score = scale * dot;
    const C mNew = score > m ? score : m;
    const C correction = expOf(m - mNew), p = expOf(score - mNew);
    l = l * correction + p;
    for (int c = 0; c < s.Dv; ++c)
      acc[c] = acc[c] * correction + p * value[c];
    m = mNew;
  });
  if (!active)
    return;
  const C inverse = C(1) / l;
  if (out)
    for (int c = 0; c < s.Dv; ++c)
      Io<T>::store(out, s.o(b, row, h) + c, acc[c] * inverse);
  if (lse) {
    // The rounding the forward's output got, so D matches what the
    // forward returned.
    C d = 0;
    for (int c = 0; c < s.Dv; ++c) {
      typename Io<T>::Raw r;
      Io<T>::store(&r, 0, acc[c] * inverse);
      d += Io<T>::load(dout, s.o(b, row, h) + c) * Io<T>::load(&r, 0);
    }
    const int64_t at = (b * s.Hq + h) * s.Sq + row;
    lse[at] = m + std::log(l);
    drow[at] = d;
  }
}

/// dQ: per query row, over the keys it sees, dS = P (dP - D), dQ = scale *
/// sum dS k.
template <int T, int MaxD>
__global__ void dqKernel(Shape s, const typename Io<T>::Raw *q,
                         const typename Io<T>::Raw *k,
                         const typename Io<T>::Raw *v,
                         const typename Io<T>::Raw *dout,
                         const typename Io<T>::C *lse,
                         const typename Io<T>::C *drow,
                         typename Io<T>::Raw *dq) {
  using C = typename Io<T>::C;
  extern __shared__ unsigned char smem[];
  C *kSh = reinterpret_cast<C *>(smem), *vSh = kSh + kTileRows * s.D;
  const QueryBlock qb(s);
  const int64_t b = qb.b, h = qb.h, row = qb.row;
  const bool active = qb.active;
  C qr[MaxD], dor[MaxD], g[MaxD];
  C L = 0, Dr = 0;
  if (active) {
    for (int c = 0; c < s.D; ++c) {
      qr[c] = Io<T>::load(q, s.q(b, row, h) + c);
      g[c] = 0;
    }
    for (int c = 0; c < s.Dv; ++c)
      dor[c] = Io<T>::load(dout, s.o(b, row, h) + c);
    const int64_t at = (b * s.Hq + h) * s.Sq + row;
    L = lse[at];
    Dr = drow[at];
  }
  const C scale = C(s.scale);
  forEachVisibleKey<T>(s, qb, k, v, kSh, vSh, [&](const C *key, const C *value) {
    C dot = 0, dp = 0;
    for (int c = 0; c < s.D; ++c)
      dot += qr[c] * key[c];
    for (int c = 0; c < s.Dv; ++c)
      dp += dor[c] * value[c];
    const C p = expOf(scale * dot - L), ds = p * (dp - Dr);
    for (int c = 0; c < s.D; ++c)
      g[c] += ds * key[c];
  });
  if (active)
    for (int c = 0; c < s.D; ++c)
      Io<T>::store(dq, s.q(b, row, h) + c, scale * g[c]);
}

/// dK and dV: per key row of a key/value head, over every query head of its
/// group and every query row that sees it, in order.
template <int T, int MaxD>
__global__ void dkvKernel(Shape s, const typename Io<T>::Raw *q,
                          const typename Io<T>::Raw *k,
                          const typename Io<T>::Raw *v,
                          const typename Io<T>::Raw *dout,
                          const typename Io<T>::C *lse,
                          const typename Io<T>::C *drow,
                          typename Io<T>::Raw *dk, typename Io<T>::Raw *dv) {
  using C = typename Io<T>::C;
  extern __shared__ unsigned char smem[];
  // Query tiles: Q, dO and the rows' statistics.
  C *qSh = reinterpret_cast<C *>(smem), *doSh = qSh + kTileRows * s.D;
  C *lSh = doSh + kTileRows * s.Dv, *dSh = lSh + kTileRows;
  const int64_t blocksPerHead = (s.Sk + kRows - 1) / kRows;
  const int64_t bh = blockIdx.x / blocksPerHead;
  const int64_t b = bh / s.Hkv, kv = bh % s.Hkv, group = s.Hq / s.Hkv;
  const int64_t t0 = (blockIdx.x % blocksPerHead) * kRows;
  const int64_t t = t0 + threadIdx.x;
  const bool active = t < s.Sk;
  C kr[MaxD], vr[MaxD], gk[MaxD], gv[MaxD];
  if (active) {
    for (int c = 0; c < s.D; ++c) {
      kr[c] = Io<T>::load(k, s.k(b, t, kv) + c);
      gk[c] = 0;
    }
    for (int c = 0; c < s.Dv; ++c) {
      vr[c] = Io<T>::load(v, s.v(b, t, kv) + c);
      gv[c] = 0;
    }
  }
  const C scale = C(s.scale);
  // A causal key block is seen by queries from its first row on, and
  // under a sliding window up to its last row's window.
  const int64_t first = s.causal ? t0 : 0;
  const int64_t last =
      s.window ? std::min<int64_t>(s.Sq, t0 + kRows - 1 + s.window) : s.Sq;
  for (int64_t hi = 0; hi < group; ++hi) {
    const int64_t h = kv * group + hi;
    for (int64_t r0 = first; r0 < last; r0 += kTileRows) {
      const int n = int(std::min<int64_t>(kTileRows, last - r0));
      __syncthreads();
      stageRows<T>(qSh, q, n, s.D, [&](int r) { return s.q(b, r0 + r, h); });
      stageRows<T>(doSh, dout, n, s.Dv,
                   [&](int r) { return s.o(b, r0 + r, h); });
      for (int r = threadIdx.x; r < n; r += blockDim.x) {
        lSh[r] = lse[(b * s.Hq + h) * s.Sq + r0 + r];
        dSh[r] = drow[(b * s.Hq + h) * s.Sq + r0 + r];
      }
      __syncthreads();
      if (!active)
        continue;
      for (int j = 0; j < n; ++j) {
        if ((s.causal && r0 + j < t) || (s.window && r0 + j >= t + s.window))
          continue;
        C dot = 0, dp = 0;
        for (int c = 0; c < s.D; ++c)
          dot += qSh[j * s.D + c] * kr[c];
        for (int c = 0; c < s.Dv; ++c)
          dp += doSh[j * s.Dv + c] * vr[c];
        const C p = expOf(scale * dot - lSh[j]), ds = p * (dp - dSh[j]);
        for (int c = 0; c < s.Dv; ++c)
          gv[c] += p * doSh[j * s.Dv + c];
        for (int c = 0; c < s.D; ++c)
          gk[c] += ds * qSh[j * s.D + c];
      }
    }
  }
  if (!active)
    return;
  for (int c = 0; c < s.D; ++c)
    Io<T>::store(dk, s.k(b, t, kv) + c, scale * gk[c]);
  for (int c = 0; c < s.Dv; ++c)
    Io<T>::store(dv, s.v(b, t, kv) + c, gv[c]);
}

template <typename Kernel>
void launch(Kernel kernel, int64_t blocks, size_t shared, const char *op) {
  if (blocks == 0)
    return;
  if (shared > 48 * 1024)
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(shared)),
          op);
  (void)kernel;
}

/// Runs `fn(integral_constant<MaxD>)` with the smallest bound >= the head
/// sizes: 64, 128 or 256.
template <typename Fn> void headBound(int64_t d, const char *op, Fn fn) {
  if (d <= 64)
    return fn(std::integral_constant<int, 64>{});
  if (d <= 128)
    return fn(std::integral_constant<int, 128>{});
  if (d <= 256)
    return fn(std::integral_constant<int, 256>{});
  throw KernelError(std::string(op) + ": head size " + std::to_string(d) +
                    " is past the CUDA kernel's 256");
}

void attention(const std::vector<TensorView> &in,
               const std::vector<TensorView> &out, const Attrs &attrs,
               bool backward) {
  const char *op = backward ? "ernie.attention_grad" : "ernie.attention";
  const TensorView &q = in[0], &k = in[1], &v = in[2];
  Shape s{q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2],
          q.shape[3], v.shape[3], attrs.getBool("causal"), 0,
          attrs.getInt("window", 0)};
  if (s.Hkv == 0 || s.Hq % s.Hkv != 0 || q.shape[0] != k.shape[0] ||
      q.shape[3] != k.shape[3] || k.shape[1] != v.shape[1] ||
      (s.causal && s.Sq != s.Sk) || s.window < 0 || (s.window && !s.causal))
    throw KernelError(std::string(op) +
                      ": query, key and value shapes do not match (causal "
                      "attention needs equal sequence lengths)");
  s.scale = attrs.getFloat("scale", 1.0 / std::sqrt(double(s.D)));
  if (s.B * s.Hq * s.Sq == 0)
    return;
  auto dispatch = [&](auto tag) {
    constexpr int T = decltype(tag)::value;
    using Raw = typename Io<T>::Raw;
    using C = typename Io<T>::C;
    headBound(std::max(s.D, s.Dv), op, [&](auto bound) {
      constexpr int MaxD = decltype(bound)::value;
      const int64_t qBlocks = s.B * s.Hq * ((s.Sq + kRows - 1) / kRows);
      const size_t keyShared = size_t(kTileRows) * (s.D + s.Dv) * sizeof(C);
      if (!backward) {
        launch(forwardKernel<T, MaxD>, qBlocks, keyShared, op);
        forwardKernel<T, MaxD><<<unsigned(qBlocks), kRows, keyShared, stream()>>>(
            s, q.as<Raw>(), k.as<Raw>(), v.as<Raw>(), out[0].as<Raw>(), nullptr,
            nullptr, nullptr);
        check(cudaGetLastError(), op);
        return;
      }
      const TensorView &dout = in[3];
      Scratch lse(s.B * s.Hq * s.Sq * sizeof(C)),
          drow(s.B * s.Hq * s.Sq * sizeof(C));
      launch(forwardKernel<T, MaxD>, qBlocks, keyShared, op);
      forwardKernel<T, MaxD><<<unsigned(qBlocks), kRows, keyShared, stream()>>>(
          s, q.as<Raw>(), k.as<Raw>(), v.as<Raw>(), nullptr, dout.as<Raw>(),
          lse.as<C>(), drow.as<C>());
      launch(dqKernel<T, MaxD>, qBlocks, keyShared, op);
      dqKernel<T, MaxD><<<unsigned(qBlocks), kRows, keyShared, stream()>>>(
          s, q.as<Raw>(), k.as<Raw>(), v.as<Raw>(), dout.as<Raw>(), lse.as<C>(),
          drow.as<C>(), out[0].as<Raw>());
      const int64_t kBlocks = s.B * s.Hkv * ((s.Sk + kRows - 1) / kRows);
      const size_t queryShared =
          (size_t(kTileRows) * (s.D + s.Dv) + 2 * kTileRows) * sizeof(C);
      if (kBlocks) {
        launch(dkvKernel<T, MaxD>, kBlocks, queryShared, op);
        dkvKernel<T, MaxD><<<unsigned(kBlocks), kRows, queryShared, stream()>>>(
            s, q.as<Raw>(), k.as<Raw>(), v.as<Raw>(), dout.as<Raw>(),
            lse.as<C>(), drow.as<C>(), out[1].as<Raw>(), out[2].as<Raw>());
      }
      check(cudaGetLastError(), op);
    });
  };
  switch (q.type) {
  case DType::F64: return dispatch(std::integral_constant<int, kF64>{});
  case DType::F32: return dispatch(std::integral_constant<int, kF32>{});
  case DType::BF16: return dispatch(std::integral_constant<int, kBF16>{});
  case DType::F16: return dispatch(std::integral_constant<int, kF16>{});
  default:
    throw KernelError(std::string(op) + ": no CUDA kernel for element type " +
                      std::string(name(q.type)));
  }
}

} // namespace

void registerAttentionKernels(Registry &r) {
  r["ernie.attention"] = [](auto &in, auto &out, auto &a) {
    attention(in, out, a, false);
  };
  r["ernie.attention_grad"] = [](auto &in, auto &out, auto &a) {
    attention(in, out, a, true);
  };
}

} // namespace ernie::runtime::cuda

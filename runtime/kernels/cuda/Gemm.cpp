//===- Gemm.cpp - matmul and the expert GEMMs via cuBLASLt ------------------===//
//
// UNVERIFIED ON A GPU: compiled and linked without one; not yet run on a GPU
// (scripts/gpu_check.sh compares it with the CPU kernels and times it beside
// cuBLAS called directly).
//
// ernie's tensors are row-major; cuBLASLt is column-major, so D = op(A)
// op(B) is computed as D^T = op(B)^T op(A)^T: the operands swap and every
// stored matrix is read as its transpose's column-major layout. One
// cuBLASLt handle and 32 MiB workspace per thread and device; a GEMM's
// descriptors and the heuristic's algorithm are made once per shape and
// kept (no heuristic query on the hot path).
//
// f32 computes in full f32 (CUBLAS_COMPUTE_32F, no TF32) and f64 in f64;
// bf16 and f16 multiply on tensor cores accumulating in f32 and round once
// into the result, as the CPU's narrow path does. Plain matmul on fp8
// widens to f32 first. scaled_matmul is cuBLASLt's FP8 GEMM with the two
// f32 scales as device pointers (CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER),
// f32 accumulation, f32/bf16/f16 out, wherever cuBLASLt's FP8 rules allow it
// ("TN": the right operand given transposed, the left one not; dimensions
// multiples of 16; 16-byte aligned; not e5m2 x e5m2); elsewhere it decodes
// to f32, multiplies in f32 and scales once — the CPU's computation. The
// blockwise recipe reaches here as f32/bf16 GEMMs of dequantised tiles.
//
//===----------------------------------------------------------------------===//

#include "CudaKernels.h"

#include <cublasLt.h>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace ernie::runtime::cuda {

namespace {

void checkLt(cublasStatus_t status, const char *what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw KernelError(std::string(what) + ": cuBLASLt error " +
                      std::to_string(int(status)));
}

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

/// One GEMM's cuBLASLt objects, made once per shape.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (a)
      cublasLtMatrixLayoutDestroy(a);
    if (b)
      cublasLtMatrixLayoutDestroy(b);
    if (d)
      cublasLtMatrixLayoutDestroy(d);
    if (desc)
      cublasLtMatmulDescDestroy(desc);
  }
};

/// What decides a plan.
using PlanKey = std::tuple<int, int, int, int, bool, bool, int64_t, int64_t,
                           int64_t, int64_t, int64_t, int64_t, int64_t, bool>;

/// A thread's handle, workspace and plans on the current device.
struct Context {
  cublasLtHandle_t handle = nullptr;
  void *workspace = nullptr;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
  Context() {
    checkLt(cublasLtCreate(&handle), "cublasLtCreate");
    check(cudaMalloc(&workspace, kWorkspaceBytes), "cuBLASLt workspace");
  }
  ~Context() {
    plans.clear();
    if (workspace)
      cudaFree(workspace);
    if (handle)
      cublasLtDestroy(handle);
  }
};

Context &context() {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  thread_local std::map<int, std::unique_ptr<Context>> contexts;
  std::unique_ptr<Context> &c = contexts[device];
  if (!c)
    c = std::make_unique<Context>();
  return *c;
}

struct Types {
  cudaDataType_t ab, d;
  cublasComputeType_t compute;
  cudaDataType_t scale;
};

/// Row-major D[batch] (m x n) = alpha * op(A[batch]) op(B[batch]),
/// through the column-major D^T = op(B)^T op(A)^T. Strides in elements;
/// `scaleA` / `scaleB` (device f32 pointers) only for FP8.
void gemm(const Types &t, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
          const void *a, int64_t strideA, const void *b, int64_t strideB,
          void *d, int64_t strideD, int64_t batches, const void *alpha,
          const void *beta, const float *scaleA = nullptr,
          const float *scaleB = nullptr) {
  if (m == 0 || n == 0 || batches == 0)
    return;
  Context &ctx = context();
  const bool scaled = scaleA != nullptr;
  PlanKey key{int(t.ab), int(t.d), int(t.compute), int(t.scale), ta, tb, m,
              n,         k,        batches,        strideA,      strideB,
              strideD,   scaled};
  std::unique_ptr<Plan> &plan = ctx.plans[key];
  if (!plan) {
    auto p = std::make_unique<Plan>();
    checkLt(cublasLtMatmulDescCreate(&p->desc, t.compute, t.scale),
            "cublasLtMatmulDescCreate");
    // cuBLASLt's A is our B, its B our A.
    cublasOperation_t opA = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opB = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    checkLt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                           &opA, sizeof opA),
            "TRANSA");
    checkLt(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                           &opB, sizeof opB),
            "TRANSB");
    // Stored shapes: B is [k, n] (or [n, k] transposed), A [m, k] (or [k, m]).
    uint64_t aRows = tb ? k : n, aCols = tb ? n : k;
    uint64_t bRows = ta ? m : k, bCols = ta ? k : m;
    checkLt(cublasLtMatrixLayoutCreate(&p->a, t.ab, aRows, aCols, aRows),
            "layout");
    checkLt(cublasLtMatrixLayoutCreate(&p->b, t.ab, bRows, bCols, bRows),
            "layout");
    checkLt(cublasLtMatrixLayoutCreate(&p->d, t.d, n, m, n), "layout");
    if (batches > 1) {
      int32_t count = int32_t(batches);
      for (auto [layout, stride] : {std::pair{p->a, strideB},
                                    std::pair{p->b, strideA},
                                    std::pair{p->d, strideD}}) {
        checkLt(cublasLtMatrixLayoutSetAttribute(
                    layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                    sizeof count),
                "batch count");
        checkLt(cublasLtMatrixLayoutSetAttribute(
                    layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                    &stride, sizeof stride),
                "batch stride");
      }
    }
    if (scaled) {
      checkLt(cublasLtMatmulDescSetAttribute(
                  p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scaleB,
                  sizeof scaleB),
              "A scale");
      checkLt(cublasLtMatmulDescSetAttribute(
                  p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scaleA,
                  sizeof scaleA),
              "B scale");
    }
    cublasLtMatmulPreference_t pref;
    checkLt(cublasLtMatmulPreferenceCreate(&pref), "preference");
    size_t workspace = kWorkspaceBytes;
    cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
        sizeof workspace);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        ctx.handle, p->desc, p->a, p->b, p->d, p->d, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (status != CUBLAS_STATUS_SUCCESS || found == 0)
      throw KernelError("cuBLASLt has no algorithm for a " + std::to_string(m) +
                        "x" + std::to_string(k) + " by " + std::to_string(k) +
                        "x" + std::to_string(n) + " GEMM of these types");
    p->algo = result.algo;
    plan = std::move(p);
  }
  if (scaled) {
    // The scale pointers may move between calls (arena offsets do not,
    // but a plan is per shape): set them each time.
    checkLt(cublasLtMatmulDescSetAttribute(plan->desc,
                                           CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                           &scaleB, sizeof scaleB),
            "A scale");
    checkLt(cublasLtMatmulDescSetAttribute(plan->desc,
                                           CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                           &scaleA, sizeof scaleA),
            "B scale");
  }
  checkLt(cublasLtMatmul(ctx.handle, plan->desc, alpha, b, plan->a, a, plan->b,
                         beta, d, plan->d, d, plan->d, &plan->algo,
                         ctx.workspace, kWorkspaceBytes, stream()),
          "cublasLtMatmul");
}

/// matmul's shape, as the CPU kernel reads it.
struct MatmulShape {
  bool ta, tb;
  int64_t m, n, k, batches;
  bool sharedRhs;
};

MatmulShape shapeOf(const TensorView &a, const TensorView &b,
                    const Attrs &attrs) {
  MatmulShape s;
  s.ta = attrs.getBool("transpose_a");
  s.tb = attrs.getBool("transpose_b");
  int64_t ra = a.rank(), rb = b.rank();
  s.m = s.ta ? a.shape[ra - 1] : a.shape[ra - 2];
  s.k = s.ta ? a.shape[ra - 2] : a.shape[ra - 1];
  s.n = s.tb ? b.shape[rb - 2] : b.shape[rb - 1];
  s.batches = s.m != 0 && s.k != 0 ? a.numElements() / (s.m * s.k) : 0;
  s.sharedRhs = rb == 2;
  // A shared weight on untransposed batches is one GEMM over all rows.
  if (s.sharedRhs && !s.ta && s.batches > 1) {
    s.m *= s.batches;
    s.batches = 1;
  }
  return s;
}

/// The cuBLASLt type of an f64, f32, bf16 or f16 buffer.
cudaDataType_t floatType(DType type) {
  switch (type) {
  case DType::F64: return CUDA_R_64F;
  case DType::F32: return CUDA_R_32F;
  case DType::BF16: return CUDA_R_16BF;
  case DType::F16: return CUDA_R_16F;
  default:
    throw KernelError("cuBLASLt GEMMs here take f64, f32, bf16 or f16, not " +
                      std::string(name(type)));
  }
}

/// d = a x b (+ d with `accumulate`) of f32, f64, bf16 or f16 operands,
/// into a result of their type or (bf16, f16) f32; f64 computes in f64,
/// the rest in f32.
void floatGemm(DType type, const MatmulShape &s, const void *a, const void *b,
               void *d, DType out, bool accumulate = false) {
  const int64_t sa = s.m * s.k, sb = s.sharedRhs ? 0 : s.k * s.n, sd = s.m * s.n;
  if (type == DType::F64) {
    const double one = 1, beta = accumulate ? 1 : 0;
    return gemm({CUDA_R_64F, CUDA_R_64F, CUBLAS_COMPUTE_64F, CUDA_R_64F}, s.ta,
                s.tb, s.m, s.n, s.k, a, sa, b, sb, d, sd, s.batches, &one,
                &beta);
  }
  const float one = 1, beta = accumulate ? 1 : 0;
  gemm({floatType(type), floatType(out), CUBLAS_COMPUTE_32F, CUDA_R_32F}, s.ta,
       s.tb, s.m, s.n, s.k, a, sa, b, sb, d, sd, s.batches, &one, &beta);
}

void matmul(const std::vector<TensorView> &in,
            const std::vector<TensorView> &out, const Attrs &attrs) {
  const TensorView &a = in[0], &b = in[1];
  MatmulShape s = shapeOf(a, b, attrs);
  switch (a.type) {
  case DType::F64:
  case DType::F32:
  case DType::BF16:
  case DType::F16:
    return floatGemm(a.type, s, a.data, b.data, out[0].data, a.type);
  case DType::I64:
  case DType::I32:
    return integerMatmul(a.type, s.ta, s.tb, s.m, s.n, s.k, s.batches,
                         s.sharedRhs, a.data, b.data, out[0].data);
  default: {
    // fp8 operands: decoded exactly to f32, one f32 GEMM, rounded once.
    Scratch wa(a.numElements() * 4), wb(b.numElements() * 4),
        wd(out[0].numElements() * 4);
    convert(a.data, a.type, wa.data(), DType::F32, a.numElements());
    convert(b.data, b.type, wb.data(), DType::F32, b.numElements());
    floatGemm(DType::F32, s, wa.data(), wb.data(), wd.data(), DType::F32);
    convert(wd.data(), DType::F32, out[0].data, out[0].type,
            out[0].numElements());
  }
  }
}

/// acc + lhs x rhs: one GEMM with beta = 1 whose C and D are the result,
/// started as the accumulator's copy unless it is the accumulator's own
/// buffer (the memory plan's usual in-place case). bf16 and f16 operands
/// accumulate into an f32 result on tensor cores (cuBLASLt's BF16/F16 in,
/// F32 out), never rounded to the narrow type: Megatron's gradient
/// accumulation fusion.
void matmulAccumulate(const std::vector<TensorView> &in,
                      const std::vector<TensorView> &out, const Attrs &attrs) {
  const TensorView &a = in[0], &b = in[1], &acc = in[2], &d = out[0];
  if (acc.type != d.type || acc.numElements() != d.numElements() ||
      a.type != b.type)
    throw KernelError("ernie.matmul_accumulate: the accumulator and the "
                      "result must share a type, and the operands theirs");
  if (d.data != acc.data)
    check(cudaMemcpyAsync(d.data, acc.data, d.numElements() * byteSize(d.type),
                          cudaMemcpyDeviceToDevice, stream()),
          "cudaMemcpyAsync");
  floatGemm(a.type, shapeOf(a, b, attrs), a.data, b.data, d.data, d.type,
            /*accumulate=*/true);
}

bool aligned16(const void *p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

void scaledMatmul(const std::vector<TensorView> &in,
                  const std::vector<TensorView> &out, const Attrs &attrs) {
  if (in[2].type != DType::F32 || in[3].type != DType::F32 ||
      in[2].numElements() != 1 || in[3].numElements() != 1)
    throw KernelError("ernie.scaled_matmul takes two f32 scalar scales");
  const TensorView &a = in[0], &b = in[1], &d = out[0];
  MatmulShape s = shapeOf(a, b, attrs);
  const float *scaleA = in[2].as<float>(), *scaleB = in[3].as<float>();
  auto fp8 = [](DType t) {
    return t == DType::F8E4M3FN ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
  };
  const bool bothFp8 = (a.type == DType::F8E4M3FN || a.type == DType::F8E5M2) &&
                       (b.type == DType::F8E4M3FN || b.type == DType::F8E5M2);
  const bool cublasFp8 =
      bothFp8 && a.type == b.type && // mixed e4m3/e5m2 kept to the fallback
      !s.ta && s.tb && s.m % 16 == 0 && s.n % 16 == 0 && s.k % 16 == 0 &&
      aligned16(a.data) && aligned16(b.data) && aligned16(d.data) &&
      a.type == DType::F8E4M3FN && // e5m2 x e5m2 is not supported
      (d.type == DType::F32 || d.type == DType::BF16 || d.type == DType::F16);
  if (cublasFp8) {
    const float one = 1, zero = 0;
    cudaDataType_t out = d.type == DType::F32    ? CUDA_R_32F
                         : d.type == DType::BF16 ? CUDA_R_16BF
                                                 : CUDA_R_16F;
    gemm({fp8(a.type), out, CUBLAS_COMPUTE_32F, CUDA_R_32F}, s.ta, s.tb, s.m,
         s.n, s.k, a.data, s.m * s.k, b.data, s.sharedRhs ? 0 : s.k * s.n,
         d.data, s.m * s.n, s.batches, &one, &zero, scaleA, scaleB);
    return;
  }
  // The CPU's computation: decode, f32 GEMM, scale once by the product.
  Scratch wa(a.numElements() * 4), wb(b.numElements() * 4),
      wd(d.numElements() * 4);
  convert(a.data, a.type, wa.data(), DType::F32, a.numElements());
  convert(b.data, b.type, wb.data(), DType::F32, b.numElements());
  floatGemm(DType::F32, s, wa.data(), wb.data(), wd.data(), DType::F32);
  scaleInto(wd.as<float>(), scaleA, scaleB, d.data, d.type, d.numElements());
}

/// The filled rows `[experts, groups]` on the host, each checked against
/// the capacity. One small copy and a wait per expert GEMM: the per-block
/// GEMMs below are sized by them (a device-side grouped GEMM would avoid
/// the wait).
std::vector<int64_t> filledRows(const char *op, const TensorView &rows,
                                int64_t capacity) {
  size_t n = static_cast<size_t>(rows.numElements());
  std::vector<int64_t> host(n);
  if (rows.type == DType::I64) {
    check(cudaMemcpyAsync(host.data(), rows.data, n * 8,
                          cudaMemcpyDeviceToHost, stream()),
          op);
  } else {
    std::vector<int32_t> narrow(n);
    check(cudaMemcpyAsync(narrow.data(), rows.data, n * 4,
                          cudaMemcpyDeviceToHost, stream()),
          op);
    check(cudaStreamSynchronize(stream()), op);
    std::copy(narrow.begin(), narrow.end(), host.begin());
  }
  check(cudaStreamSynchronize(stream()), op);
  for (size_t i = 0; i < n; ++i)
    if (host[i] < 0 || host[i] > capacity)
      throw KernelError(std::string(op) + ": rows[" + std::to_string(i) +
                        "] (flat) = " + std::to_string(host[i]) +
                        " is outside [0, " + std::to_string(capacity) +
                        "] (the capacity)");
  return host;
}

/// What both expert GEMMs read: the buffers' shape, the filled rows (on
/// the host), the result zeroed, and a block's address.
struct ExpertGemm {
  int64_t experts, groups, capacity;
  size_t element;
  std::vector<int64_t> rows;

  ExpertGemm(const char *op, const std::vector<TensorView> &in,
             const TensorView &result)
      : experts(in[0].shape[0]), groups(in[0].shape[1]),
        capacity(in[0].shape[2]), element(byteSize(in[0].type)),
        rows(filledRows(op, in[2], capacity)) {
    check(cudaMemsetAsync(result.data, 0, result.numElements() * element,
                          stream()),
          op);
  }
  /// `elements` into `base`.
  char *at(const void *base, int64_t elements) const {
    return const_cast<char *>(static_cast<const char *>(base)) +
           elements * element;
  }
};

/// As the CPU kernel: per (expert, group) a GEMM of the filled rows, zeros
/// for the rest.
void expertMatmul(const std::vector<TensorView> &in,
                  const std::vector<TensorView> &out, const Attrs &attrs) {
  const TensorView &x = in[0], &w = in[1], &y = out[0];
  const bool t = attrs.getBool("transpose_weight");
  const ExpertGemm g("ernie.expert_matmul", in, y);
  const int64_t k = x.shape[3], n = y.shape[3];
  for (int64_t e = 0; e < g.experts; ++e)
    for (int64_t b = e * g.groups; b < (e + 1) * g.groups; ++b)
      if (int64_t r = g.rows[b])
        floatGemm(x.type, MatmulShape{false, t, r, n, k, 1, false},
                  g.at(x.data, b * g.capacity * k), g.at(w.data, e * k * n),
                  g.at(y.data, b * g.capacity * n), x.type);
}

/// dW[e] accumulates each group's filled rows' input^T x gradient.
void expertWeightGrad(const std::vector<TensorView> &in,
                      const std::vector<TensorView> &out, const Attrs &) {
  const TensorView &x = in[0], &dy = in[1], &dw = out[0];
  const ExpertGemm g("ernie.expert_weight_grad", in, dw);
  const int64_t k = x.shape[3], n = dy.shape[3];
  for (int64_t e = 0; e < g.experts; ++e)
    for (int64_t b = e * g.groups; b < (e + 1) * g.groups; ++b)
      if (int64_t r = g.rows[b])
        floatGemm(x.type, MatmulShape{true, false, k, n, r, 1, false},
                  g.at(x.data, b * g.capacity * k),
                  g.at(dy.data, b * g.capacity * n), g.at(dw.data, e * k * n),
                  x.type, /*accumulate=*/true);
}

} // namespace

void registerGemmKernels(Registry &r) {
  r["ernie.matmul"] = matmul;
  r["ernie.scaled_matmul"] = scaledMatmul;
  r["ernie.matmul_accumulate"] = matmulAccumulate;
  r["ernie.expert_matmul"] = expertMatmul;
  r["ernie.expert_weight_grad"] = expertWeightGrad;
}

} // namespace ernie::runtime::cuda

//===- Kernels.cu - CUDA kernels of every op but GEMM and attention ---------===//
//
// UNVERIFIED ON A GPU: compiled and linked on machines without one; none of
// this has run on a GPU yet (scripts/gpu_check.sh runs the tests comparing
// each kernel with the CPU kernel where one is visible).
//
// The semantics are the CPU kernels' (kernels/cpu/*): the same element
// math (ElementwiseMath.h, compiled for the device; this file is compiled
// without FMA contraction so exp, sigmoid and silu give the CPU's bits),
// narrow floats computed in f32 and rounded once where stored, reductions
// accumulating in increasing index order — one thread per output element
// walks its terms in that order, so sums equal the CPU's bit for bit and no
// result depends on timing (no atomics anywhere). Data errors the CPU
// throws on (an index out of range, an integer division by zero) raise a
// flag the kernel's launcher reads after the kernel (a stream sync).
//
// Parallel reductions whose order differs from the CPU's (softmax, norms,
// cross-entropy rows: a fixed tree in a block) are deterministic but equal
// the CPU's only up to rounding.
//
//===----------------------------------------------------------------------===//

#include "CudaKernels.h"
#include "DeviceMath.cuh"

#include "kernels/common/ElementwiseMath.h"
#include "kernels/common/FusedProgram.h"
#include "kernels/common/Registry.h"

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

namespace ernie::runtime::cuda {

namespace {

namespace m = cpu::math;

constexpr int kThreads = 256;
constexpr int kMaxDims = 8;

/// Shapes and strides passed by value to a kernel.
struct Dims {
  int rank = 0;
  int64_t size[kMaxDims] = {};
  int64_t a[kMaxDims] = {}; // strides of the first operand
  int64_t b[kMaxDims] = {}; // strides of the second

  __device__ void offsets(int64_t flat, int64_t &oa, int64_t &ob) const {
    oa = 0;
    ob = 0;
    for (int d = rank - 1; d >= 0; --d) {
      int64_t c = flat % size[d];
      flat /= size[d];
      oa += c * a[d];
      ob += c * b[d];
    }
  }
};

std::vector<int64_t> stridesOf(const std::vector<int64_t> &shape) {
  return cpu::stridesOf(shape);
}

[[noreturn]] void bad(const std::string &what) { throw KernelError(what); }

void launched(const char *what) { check(cudaGetLastError(), what); }

/// Calls fn(integral_constant<int, code>) for a float type.
template <typename Fn> void floatType(DType t, const char *op, Fn fn) {
  switch (t) {
  case DType::F64: return fn(std::integral_constant<int, kF64>{});
  case DType::F32: return fn(std::integral_constant<int, kF32>{});
  case DType::F16: return fn(std::integral_constant<int, kF16>{});
  case DType::BF16: return fn(std::integral_constant<int, kBF16>{});
  case DType::F8E4M3FN: return fn(std::integral_constant<int, kE4M3>{});
  case DType::F8E5M2: return fn(std::integral_constant<int, kE5M2>{});
  default:
    bad(std::string(op) + ": no CUDA kernel for element type " +
        std::string(name(t)));
  }
}

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

enum Unary : int {
  UNeg, UAbs, URelu, UExp, ULog, USqrt, URsqrt, UTanh, UErf, URecip, USigmoid,
  USilu, UGelu, UGeluTanh, UCopy
};
enum Binary : int { BAdd, BSub, BMul, BDiv, BMax, BMin, BPow };

template <typename C> __device__ C unaryOp(int op, C x) {
  switch (op) {
  case UNeg: return -x;
  case UAbs: return m::abs(x);
  case URelu: return m::relu(x);
  case UExp: return m::exponential(x);
  case ULog: return std::log(x);
  case USqrt: return std::sqrt(x);
  case URsqrt: return m::rsqrt(x);
  case UTanh: return std::tanh(x);
  case UErf: return std::erf(x);
  case URecip: return m::reciprocal(x);
  case USigmoid: return m::sigmoid(x);
  case USilu: return m::silu(x);
  case UGelu: return m::gelu(x, false);
  case UGeluTanh: return m::gelu(x, true);
  default: return x;
  }
}

template <typename C> __device__ C binaryOp(int op, C a, C b) {
  switch (op) {
  case BAdd: return a + b;
  case BSub: return a - b;
  case BMul: return a * b;
  case BDiv: return a / b;
  case BMax: return maximumOf(a, b);
  case BMin: return minimumOf(a, b);
  default: return std::pow(a, b);
  }
}

template <int T>
__global__ void unaryKernel(const typename Io<T>::Raw *x,
                            typename Io<T>::Raw *y, int64_t n, int op) {
  ERNIE_GRID_STRIDE(i, n) { Io<T>::store(y, i, unaryOp(op, Io<T>::load(x, i))); }
}

template <int T>
__global__ void binaryKernel(const typename Io<T>::Raw *a,
                             const typename Io<T>::Raw *b,
                             typename Io<T>::Raw *y, int64_t n, int op) {
  ERNIE_GRID_STRIDE(i, n) {
    Io<T>::store(y, i, binaryOp(op, Io<T>::load(a, i), Io<T>::load(b, i)));
  }
}

template <typename I>
__global__ void intUnaryKernel(const I *x, I *y, int64_t n, int op) {
  ERNIE_GRID_STRIDE(i, n) {
    I v = x[i];
    y[i] = op == UNeg ? I(-v) : op == UAbs ? (v < 0 ? I(-v) : v)
                                           : (v > 0 ? v : I(0));
  }
}

template <typename I>
__global__ void intBinaryKernel(const I *a, const I *b, I *y, int64_t n,
                                int op, int *error) {
  ERNIE_GRID_STRIDE(i, n) {
    I p = a[i], q = b[i];
    switch (op) {
    case BAdd: y[i] = p + q; break;
    case BSub: y[i] = p - q; break;
    case BMul: y[i] = p * q; break;
    case BDiv:
      if (q == 0) {
        *error = 1;
        y[i] = 0;
      } else {
        y[i] = p / q;
      }
      break;
    case BMax: y[i] = p > q ? p : q; break;
    default: y[i] = p < q ? p : q; break;
    }
  }
}

void unary(Registry &r, const char *name, int op, bool integers) {
  r[name] = [name, op, integers](const std::vector<TensorView> &in,
                                 const std::vector<TensorView> &out,
                                 const Attrs &attrs) {
    int code = op;
    if (op == UGelu && attrs.getBool("approximate"))
      code = UGeluTanh;
    const int64_t n = in[0].numElements();
    if (integers && (in[0].type == DType::I64 || in[0].type == DType::I32)) {
      if (in[0].type == DType::I64)
        intUnaryKernel<<<gridFor(n), kThreads, 0, stream()>>>(
            in[0].as<int64_t>(), out[0].as<int64_t>(), n, code);
      else
        intUnaryKernel<<<gridFor(n), kThreads, 0, stream()>>>(
            in[0].as<int32_t>(), out[0].as<int32_t>(), n, code);
      return launched(name);
    }
    floatType(in[0].type, name, [&](auto t) {
      constexpr int T = decltype(t)::value;
      using Raw = typename Io<T>::Raw;
      unaryKernel<T><<<gridFor(n), kThreads, 0, stream()>>>(
          in[0].as<Raw>(), out[0].as<Raw>(), n, code);
    });
    launched(name);
  };
}

void binary(Registry &r, const char *name, int op, bool integers) {
  r[name] = [name, op, integers](const std::vector<TensorView> &in,
                                 const std::vector<TensorView> &out,
                                 const Attrs &) {
    const int64_t n = in[0].numElements();
    if (integers && (in[0].type == DType::I64 || in[0].type == DType::I32)) {
      ErrorFlag error;
      if (in[0].type == DType::I64)
        intBinaryKernel<<<gridFor(n), kThreads, 0, stream()>>>(
            in[0].as<int64_t>(), in[1].as<int64_t>(), out[0].as<int64_t>(), n,
            op, error.device());
      else
        intBinaryKernel<<<gridFor(n), kThreads, 0, stream()>>>(
            in[0].as<int32_t>(), in[1].as<int32_t>(), out[0].as<int32_t>(), n,
            op, error.device());
      launched(name);
      if (op == BDiv && error.raised())
        bad("integer division by zero");
      return;
    }
    floatType(in[0].type, name, [&](auto t) {
      constexpr int T = decltype(t)::value;
      using Raw = typename Io<T>::Raw;
      binaryKernel<T><<<gridFor(n), kThreads, 0, stream()>>>(
          in[0].as<Raw>(), in[1].as<Raw>(), out[0].as<Raw>(), n, op);
    });
    launched(name);
  };
}

__global__ void compareKernel(const void *a, const void *b, int type,
                              uint8_t *y, int64_t n, int direction) {
  const bool integers = type == kI64 || type == kI32;
  ERNIE_GRID_STRIDE(i, n) {
    y[i] = integers ? m::compare(direction, loadInt(a, type, i),
                                 loadInt(b, type, i))
                    : m::compare(direction, loadAny(a, type, i),
                                 loadAny(b, type, i));
  }
}

template <typename U>
__global__ void selectKernel(const uint8_t *c, const U *a, const U *b, U *y,
                             int64_t n) {
  ERNIE_GRID_STRIDE(i, n) { y[i] = c[i] ? a[i] : b[i]; }
}

__global__ void castKernel(const void *x, int from, void *y, int to,
                           int64_t n) {
  const bool fromFloat = from != kI64 && from != kI32 && from != kI1;
  const bool toFloat = to != kI64 && to != kI32 && to != kI1;
  ERNIE_GRID_STRIDE(i, n) {
    if (fromFloat)
      storeAny(y, to, i, loadAny(x, from, i));
    else if (toFloat || to != kI1)
      storeInt(y, to, i, loadInt(x, from, i));
    else
      static_cast<uint8_t *>(y)[i] = loadInt(x, from, i) != 0;
  }
}

template <typename U> __global__ void fillKernel(U *y, U bits, int64_t n) {
  ERNIE_GRID_STRIDE(i, n) { y[i] = bits; }
}

__global__ void iotaKernel(void *y, int type, int64_t n, int64_t inner,
                           int64_t extent) {
  ERNIE_GRID_STRIDE(i, n) { storeAny(y, type, i, double((i / inner) % extent)); }
}

template <typename U>
void selectTyped(const std::vector<TensorView> &in, const TensorView &out) {
  const int64_t n = out.numElements();
  selectKernel<U><<<gridFor(n), kThreads, 0, stream()>>>(
      in[0].as<uint8_t>(), in[1].as<U>(), in[2].as<U>(), out.as<U>(), n);
}

void copyWhole(const TensorView &in, const TensorView &out) {
  if (out.data != in.data)
    check(cudaMemcpyAsync(out.data, in.data,
                          in.numElements() * byteSize(in.type),
                          cudaMemcpyDeviceToDevice, stream()),
          "copy");
}

} // namespace

void registerElementwiseKernels(Registry &r) {
  unary(r, "ernie.neg", UNeg, true);
  unary(r, "ernie.abs", UAbs, true);
  unary(r, "ernie.relu", URelu, true);
  unary(r, "ernie.exp", UExp, false);
  unary(r, "ernie.log", ULog, false);
  unary(r, "ernie.sqrt", USqrt, false);
  unary(r, "ernie.rsqrt", URsqrt, false);
  unary(r, "ernie.tanh", UTanh, false);
  unary(r, "ernie.erf", UErf, false);
  unary(r, "ernie.reciprocal", URecip, false);
  unary(r, "ernie.sigmoid", USigmoid, false);
  unary(r, "ernie.silu", USilu, false);
  unary(r, "ernie.gelu", UGelu, false);
  binary(r, "ernie.add", BAdd, true);
  binary(r, "ernie.sub", BSub, true);
  binary(r, "ernie.mul", BMul, true);
  binary(r, "ernie.div", BDiv, true);
  binary(r, "ernie.maximum", BMax, true);
  binary(r, "ernie.minimum", BMin, true);
  binary(r, "ernie.pow", BPow, false);

  r["ernie.compare"] = [](const std::vector<TensorView> &in,
                          const std::vector<TensorView> &out,
                          const Attrs &attrs) {
    int64_t direction = attrs.getInt("direction");
    if (direction < 0 || direction > 5)
      bad("unknown compare direction");
    const int64_t n = in[0].numElements();
    compareKernel<<<gridFor(n), kThreads, 0, stream()>>>(
        in[0].data, in[1].data, int(in[0].type), out[0].as<uint8_t>(), n,
        int(direction));
    launched("ernie.compare");
  };
  r["ernie.select"] = [](const std::vector<TensorView> &in,
                         const std::vector<TensorView> &out, const Attrs &) {
    switch (byteSize(in[1].type)) {
    case 1: selectTyped<uint8_t>(in, out[0]); break;
    case 2: selectTyped<uint16_t>(in, out[0]); break;
    case 4: selectTyped<uint32_t>(in, out[0]); break;
    default: selectTyped<uint64_t>(in, out[0]); break;
    }
    launched("ernie.select");
  };
  r["ernie.cast"] = [](const std::vector<TensorView> &in,
                       const std::vector<TensorView> &out, const Attrs &) {
    convert(in[0].data, in[0].type, out[0].data, out[0].type,
            static_cast<size_t>(in[0].numElements()));
  };
  r["ernie.stop_gradient"] = [](const std::vector<TensorView> &in,
                                const std::vector<TensorView> &out,
                                const Attrs &) { copyWhole(in[0], out[0]); };
  r["ernie.full"] = [](const std::vector<TensorView> &,
                       const std::vector<TensorView> &out, const Attrs &attrs) {
    // The value stored once as the CPU stores it, then its bits repeated.
    const int64_t n = out[0].numElements();
    uint64_t bits = 0;
    cpu::storeFromDouble({&bits, out[0].type, {1}}, 0,
                         attrs.getFloat("value", 0.0));
    switch (byteSize(out[0].type)) {
    case 1:
      fillKernel<<<gridFor(n), kThreads, 0, stream()>>>(out[0].as<uint8_t>(),
                                                        uint8_t(bits), n);
      break;
    case 2:
      fillKernel<<<gridFor(n), kThreads, 0, stream()>>>(out[0].as<uint16_t>(),
                                                        uint16_t(bits), n);
      break;
    case 4:
      fillKernel<<<gridFor(n), kThreads, 0, stream()>>>(out[0].as<uint32_t>(),
                                                        uint32_t(bits), n);
      break;
    default:
      fillKernel<<<gridFor(n), kThreads, 0, stream()>>>(out[0].as<uint64_t>(),
                                                        bits, n);
    }
    launched("ernie.full");
  };
  r["ernie.iota"] = [](const std::vector<TensorView> &,
                       const std::vector<TensorView> &out, const Attrs &attrs) {
    int64_t dim = attrs.getInt("dimension");
    if (dim < 0 || dim >= out[0].rank())
      bad("iota dimension out of range");
    int64_t inner = 1;
    for (int64_t d = dim + 1; d < out[0].rank(); ++d)
      inner *= out[0].shape[d];
    const int64_t n = out[0].numElements();
    iotaKernel<<<gridFor(n), kThreads, 0, stream()>>>(
        out[0].data, int(out[0].type), n, inner, out[0].shape[dim]);
    launched("ernie.iota");
  };
}

//===----------------------------------------------------------------------===//
// Data movement: strided copies, ordered reductions, conversions
//===----------------------------------------------------------------------===//

namespace {

template <typename U>
__global__ void copyStridedKernel(U *dst, int64_t dstBase, const U *src,
                                  int64_t srcBase, Dims dims, int64_t n) {
  ERNIE_GRID_STRIDE(i, n) {
    int64_t od, os;
    dims.offsets(i, od, os);
    dst[dstBase + od] = src[srcBase + os];
  }
}

__global__ void copyStridedBytes(uint8_t *dst, int64_t dstBase,
                                 const uint8_t *src, int64_t srcBase, Dims dims,
                                 int64_t n, int64_t width) {
  ERNIE_GRID_STRIDE(i, n) {
    int64_t od, os;
    dims.offsets(i, od, os);
    for (int64_t k = 0; k < width; ++k)
      dst[(dstBase + od) * width + k] = src[(srcBase + os) * width + k];
  }
}

struct Pointers {
  const void *in[kMaxReduceInputs];
  void *out[kMaxReduceInputs];
};

template <typename T>
__global__ void reduceInOrderKernel(Pointers p, int inputs, int outputs,
                                    int64_t count, int op) {
  ERNIE_GRID_STRIDE(i, count) {
    T acc = static_cast<const T *>(p.in[0])[i];
    for (int k = 1; k < inputs; ++k) {
      T x = static_cast<const T *>(p.in[k])[i];
      acc = op == int(ReduceOp::Max)   ? maximumOf(acc, x)
            : op == int(ReduceOp::Min) ? minimumOf(acc, x)
                                       : acc + x;
    }
    if constexpr (std::is_floating_point_v<T>)
      if (op == int(ReduceOp::Avg) && inputs > 1)
        acc /= T(inputs);
    for (int k = 0; k < outputs; ++k)
      static_cast<T *>(p.out[k])[i] = acc;
  }
}

/// Narrow floats: accumulated in f32, rounded once (reduceInOrderNarrow).
template <int T>
__global__ void reduceInOrderNarrowKernel(Pointers p, int inputs, int outputs,
                                          int64_t count, int op) {
  using Raw = typename Io<T>::Raw;
  ERNIE_GRID_STRIDE(i, count) {
    float acc = Io<T>::load(static_cast<const Raw *>(p.in[0]), i);
    for (int k = 1; k < inputs; ++k) {
      float x = Io<T>::load(static_cast<const Raw *>(p.in[k]), i);
      acc = op == int(ReduceOp::Max)   ? maximumOf(acc, x)
            : op == int(ReduceOp::Min) ? minimumOf(acc, x)
                                       : acc + x;
    }
    if (op == int(ReduceOp::Avg))
      acc /= float(inputs);
    Raw r;
    Io<T>::store(&r, 0, acc);
    for (int k = 0; k < outputs; ++k)
      static_cast<Raw *>(p.out[k])[i] = r;
  }
}

} // namespace

void copyStrided(void *dst, int64_t dstBase,
                 const std::vector<int64_t> &dstStrides, const void *src,
                 int64_t srcBase, const std::vector<int64_t> &srcStrides,
                 const std::vector<int64_t> &shape, size_t elementBytes) {
  // Merge and drop dimensions first (Strided.h): a block of rows becomes a
  // short loop, and most copies fit kMaxDims.
  cpu::StridedSpace<2> space{shape, {dstStrides, srcStrides}};
  space.simplify();
  int64_t n = elementCount(shape);
  if (n == 0)
    return;
  if (space.shape.size() > size_t(kMaxDims))
    bad("a strided copy of more than " + std::to_string(kMaxDims) +
        " dimensions after merging");
  Dims dims;
  dims.rank = int(space.shape.size());
  for (int d = 0; d < dims.rank; ++d) {
    dims.size[d] = space.shape[d];
    dims.a[d] = space.strides[0][d];
    dims.b[d] = space.strides[1][d];
  }
  auto launch = [&](auto unit) {
    using U = decltype(unit);
    copyStridedKernel<U><<<gridFor(n), kThreads, 0, stream()>>>(
        static_cast<U *>(dst), dstBase, static_cast<const U *>(src), srcBase,
        dims, n);
  };
  switch (elementBytes) {
  case 1: launch(uint8_t{}); break;
  case 2: launch(uint16_t{}); break;
  case 4: launch(uint32_t{}); break;
  case 8: launch(uint64_t{}); break;
  default:
    copyStridedBytes<<<gridFor(n), kThreads, 0, stream()>>>(
        static_cast<uint8_t *>(dst), dstBase, static_cast<const uint8_t *>(src),
        srcBase, dims, n, int64_t(elementBytes));
  }
  launched("strided copy");
}

void reduceInOrder(const std::vector<const void *> &inputs,
                   const std::vector<void *> &outputs, size_t count,
                   DType type, ReduceOp op) {
  if (inputs.empty() || outputs.empty() || inputs.size() > kMaxReduceInputs ||
      outputs.size() > kMaxReduceInputs)
    throw CommunicationError("a device reduction takes 1 to " +
                             std::to_string(kMaxReduceInputs) +
                             " inputs and outputs");
  const bool integer = type == DType::I64 || type == DType::I32;
  if (op == ReduceOp::Avg && integer)
    throw CommunicationError("avg reductions need a float type");
  if (!integer && !isFloat(type))
    throw CommunicationError(std::string("reductions of ") +
                             std::string(name(type)) + " are not supported");
  if (count == 0)
    return;
  Pointers p{};
  for (size_t k = 0; k < inputs.size(); ++k)
    p.in[k] = inputs[k];
  for (size_t k = 0; k < outputs.size(); ++k)
    p.out[k] = outputs[k];
  const int ni = int(inputs.size()), no = int(outputs.size()), o = int(op);
  const int64_t n = int64_t(count);
  const unsigned grid = gridFor(n);
  switch (type) {
  case DType::F64:
    reduceInOrderKernel<double><<<grid, kThreads, 0, stream()>>>(p, ni, no, n, o);
    break;
  case DType::F32:
    reduceInOrderKernel<float><<<grid, kThreads, 0, stream()>>>(p, ni, no, n, o);
    break;
  case DType::I64:
    reduceInOrderKernel<int64_t><<<grid, kThreads, 0, stream()>>>(p, ni, no, n, o);
    break;
  case DType::I32:
    reduceInOrderKernel<int32_t><<<grid, kThreads, 0, stream()>>>(p, ni, no, n, o);
    break;
  default:
    floatType(type, "reduction", [&](auto t) {
      constexpr int T = decltype(t)::value;
      if constexpr (T != kF64 && T != kF32)
        reduceInOrderNarrowKernel<T><<<grid, kThreads, 0, stream()>>>(p, ni, no,
                                                                      n, o);
    });
  }
  launched("ordered reduction");
}

void convert(const void *src, DType from, void *dst, DType to, size_t n) {
  if (n == 0)
    return;
  castKernel<<<gridFor(int64_t(n)), kThreads, 0, stream()>>>(
      src, int(from), dst, int(to), int64_t(n));
  launched("ernie.cast");
}

namespace {

template <typename I>
__global__ void integerMatmulKernel(bool ta, bool tb, int64_t m, int64_t n,
                                    int64_t k, int64_t batches, bool shared,
                                    const I *a, const I *b, I *d) {
  ERNIE_GRID_STRIDE(e, batches * m * n) {
    int64_t j = e % n, i = (e / n) % m, batch = e / (m * n);
    const I *ab = a + batch * m * k, *bb = b + (shared ? 0 : batch * k * n);
    I acc = 0;
    for (int64_t p = 0; p < k; ++p)
      acc += ab[ta ? p * m + i : i * k + p] * bb[tb ? j * k + p : p * n + j];
    d[e] = acc;
  }
}

__global__ void scaleIntoKernel(const float *acc, const float *scaleA,
                                const float *scaleB, void *out, int type,
                                int64_t n) {
  const float scale = *scaleA * *scaleB;
  ERNIE_GRID_STRIDE(i, n) { storeAny(out, type, i, double(acc[i] * scale)); }
}

} // namespace

void integerMatmul(DType type, bool ta, bool tb, int64_t m, int64_t n,
                   int64_t k, int64_t batches, bool sharedRhs, const void *a,
                   const void *b, void *d) {
  const int64_t total = batches * m * n;
  if (total == 0)
    return;
  if (type == DType::I64)
    integerMatmulKernel<<<gridFor(total), kThreads, 0, stream()>>>(
        ta, tb, m, n, k, batches, sharedRhs, static_cast<const int64_t *>(a),
        static_cast<const int64_t *>(b), static_cast<int64_t *>(d));
  else
    integerMatmulKernel<<<gridFor(total), kThreads, 0, stream()>>>(
        ta, tb, m, n, k, batches, sharedRhs, static_cast<const int32_t *>(a),
        static_cast<const int32_t *>(b), static_cast<int32_t *>(d));
  launched("ernie.matmul");
}

void scaleInto(const float *acc, const float *scaleA, const float *scaleB,
               void *out, DType type, int64_t n) {
  if (n == 0)
    return;
  scaleIntoKernel<<<gridFor(n), kThreads, 0, stream()>>>(acc, scaleA, scaleB,
                                                         out, int(type), n);
  launched("ernie.scaled_matmul");
}

//===----------------------------------------------------------------------===//
// Reductions, softmax, norms
//===----------------------------------------------------------------------===//

namespace {

enum ReduceKind : int { RSum, RMean, RMax };

/// One thread per output element walks its `count` terms in increasing
/// input index (the reduced dimensions' odometer, `reduced`), as the CPU's
/// accumulation does: the same sums, bit for bit. `kept` maps the output
/// element to its first input offset.
template <typename Raw, typename C, typename Load, typename Store>
__global__ void reduceKernel(const Raw *x, Raw *y, Dims kept, Dims reduced,
                             int64_t outputs, int64_t count, int kind,
                             Load load, Store store) {
  ERNIE_GRID_STRIDE(o, outputs) {
    int64_t base, unused;
    kept.offsets(o, base, unused);
    C acc = C(0);
    if (kind == RMax) {
      if constexpr (std::is_integral_v<C>)
        acc = std::numeric_limits<C>::lowest();
      else
        acc = C(-INFINITY);
    }
    for (int64_t r = 0; r < count; ++r) {
      int64_t at, unused2;
      reduced.offsets(r, at, unused2);
      C v = load(x, base + at);
      acc = kind == RMax ? maximumOf(acc, v) : acc + v;
    }
    if (kind == RMean)
      acc /= C(count);
    store(y, o, acc);
  }
}

template <int T> struct TypedLoad {
  __device__ typename Io<T>::C operator()(const typename Io<T>::Raw *p,
                                          int64_t i) const {
    return Io<T>::load(p, i);
  }
};
template <int T> struct TypedStore {
  __device__ void operator()(typename Io<T>::Raw *p, int64_t i,
                             typename Io<T>::C x) const {
    Io<T>::store(p, i, x);
  }
};
template <typename I> struct PlainLoad {
  __device__ I operator()(const I *p, int64_t i) const { return p[i]; }
};
template <typename I> struct PlainStore {
  __device__ void operator()(I *p, int64_t i, I x) const { p[i] = x; }
};

void reduce(const std::vector<TensorView> &in, const std::vector<TensorView> &out,
            const Attrs &attrs, int kind, const char *op) {
  const TensorView &x = in[0];
  std::vector<int64_t> axes = attrs.getInts("axes");
  std::vector<bool> isReduced(x.rank(), false);
  for (int64_t a : axes) {
    if (a < 0 || a >= x.rank())
      bad("reduction axis out of range");
    isReduced[a] = true;
  }
  std::vector<int64_t> strides = stridesOf(x.shape);
  Dims kept, reduced;
  int64_t outputs = 1, count = 1;
  for (int64_t d = 0; d < x.rank(); ++d) {
    Dims &into = isReduced[d] ? reduced : kept;
    if (into.rank == kMaxDims)
      bad(std::string(op) + ": more than " + std::to_string(kMaxDims) +
          " dimensions");
    into.size[into.rank] = x.shape[d];
    into.a[into.rank] = strides[d];
    ++into.rank;
    (isReduced[d] ? count : outputs) *= x.shape[d];
  }
  const unsigned grid = gridFor(outputs);
  if (x.type == DType::I64 || x.type == DType::I32) {
    auto launch = [&](auto zero) {
      using I = decltype(zero);
      reduceKernel<I, I><<<grid, kThreads, 0, stream()>>>(
          x.as<I>(), out[0].as<I>(), kept, reduced, outputs, count, kind,
          PlainLoad<I>{}, PlainStore<I>{});
    };
    if (x.type == DType::I64)
      launch(int64_t{});
    else
      launch(int32_t{});
    return launched(op);
  }
  floatType(x.type, op, [&](auto t) {
    constexpr int T = decltype(t)::value;
    using Raw = typename Io<T>::Raw;
    reduceKernel<Raw, typename Io<T>::C><<<grid, kThreads, 0, stream()>>>(
        x.as<Raw>(), out[0].as<Raw>(), kept, reduced, outputs, count, kind,
        TypedLoad<T>{}, TypedStore<T>{});
  });
  launched(op);
}

/// A block's sum or maximum, the same tree every time: deterministic.
template <typename C, bool Max> __device__ C blockReduce(C v, C *shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      C a = shared[threadIdx.x], b = shared[threadIdx.x + s];
      shared[threadIdx.x] = Max ? maximumOf(a, b) : a + b;
    }
    __syncthreads();
  }
  C result = shared[0];
  __syncthreads();
  return result;
}

/// One block per line of `len` elements `stride` apart.
template <int T>
__global__ void softmaxKernel(const typename Io<T>::Raw *x,
                              typename Io<T>::Raw *y, int64_t len,
                              int64_t inner, bool logarithm) {
  using C = typename Io<T>::C;
  __shared__ C shared[kThreads];
  const int64_t line = blockIdx.x, o = line / inner, i = line % inner;
  const int64_t base = o * len * inner + i;
  C peak = C(-INFINITY);
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
    peak = maximumOf(peak, Io<T>::load(x, base + j * inner));
  peak = blockReduce<C, true>(peak, shared);
  C total = 0;
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
    total += std::exp(Io<T>::load(x, base + j * inner) - peak);
  total = blockReduce<C, false>(total, shared);
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
    C shifted = Io<T>::load(x, base + j * inner) - peak;
    Io<T>::store(y, base + j * inner,
                 logarithm ? shifted - std::log(total) : std::exp(shifted) / total);
  }
}

/// One block per row of the last dimension.
template <int T>
__global__ void normKernel(const typename Io<T>::Raw *x,
                           const typename Io<T>::Raw *w,
                           const typename Io<T>::Raw *b,
                           typename Io<T>::Raw *y, int64_t d, double eps,
                           bool layer) {
  using C = typename Io<T>::C;
  __shared__ C shared[kThreads];
  const int64_t row = int64_t(blockIdx.x) * d;
  C mean = 0;
  if (layer) {
    C sum = 0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
      sum += Io<T>::load(x, row + j);
    mean = blockReduce<C, false>(sum, shared) / C(d);
  }
  C sq = 0;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    C v = Io<T>::load(x, row + j) - mean;
    sq += v * v;
  }
  sq = blockReduce<C, false>(sq, shared);
  const C scale = C(1) / std::sqrt(sq / C(d) + C(eps));
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
    Io<T>::store(y, row + j,
                 (Io<T>::load(x, row + j) - mean) * scale * Io<T>::load(w, j) +
                     (layer ? Io<T>::load(b, j) : C(0)));
}

} // namespace

void registerLinalgKernels(Registry &r) {
  r["ernie.reduce_sum"] = [](auto &in, auto &out, auto &a) {
    reduce(in, out, a, RSum, "ernie.reduce_sum");
  };
  r["ernie.reduce_mean"] = [](auto &in, auto &out, auto &a) {
    reduce(in, out, a, RMean, "ernie.reduce_mean");
  };
  r["ernie.reduce_max"] = [](auto &in, auto &out, auto &a) {
    reduce(in, out, a, RMax, "ernie.reduce_max");
  };
  for (bool logarithm : {false, true})
    r[logarithm ? "ernie.log_softmax" : "ernie.softmax"] =
        [logarithm](const std::vector<TensorView> &in,
                    const std::vector<TensorView> &out, const Attrs &attrs) {
          const char *op = logarithm ? "ernie.log_softmax" : "ernie.softmax";
          int64_t axis = attrs.getInt("axis");
          if (axis < 0 || axis >= in[0].rank())
            bad("softmax axis out of range");
          int64_t outer = 1, inner = 1, len = in[0].shape[axis];
          for (int64_t d = 0; d < axis; ++d)
            outer *= in[0].shape[d];
          for (int64_t d = axis + 1; d < in[0].rank(); ++d)
            inner *= in[0].shape[d];
          if (outer * inner == 0)
            return;
          floatType(in[0].type, op, [&](auto t) {
            constexpr int T = decltype(t)::value;
            using Raw = typename Io<T>::Raw;
            softmaxKernel<T><<<unsigned(outer * inner), kThreads, 0, stream()>>>(
                in[0].as<Raw>(), out[0].as<Raw>(), len, inner, logarithm);
          });
          launched(op);
        };
  for (bool layer : {false, true})
    r[layer ? "ernie.layer_norm" : "ernie.rms_norm"] =
        [layer](const std::vector<TensorView> &in,
                const std::vector<TensorView> &out, const Attrs &attrs) {
          const char *op = layer ? "ernie.layer_norm" : "ernie.rms_norm";
          const TensorView &x = in[0];
          if (in[1].type != x.type || (layer && in[2].type != x.type))
            bad("norm weights must have the input's type (cast them first)");
          double eps = attrs.getFloat("epsilon", layer ? 1e-5 : 1e-6);
          int64_t d = x.shape.back(), rows = x.numElements() / d;
          if (rows == 0)
            return;
          floatType(x.type, op, [&](auto t) {
            constexpr int T = decltype(t)::value;
            using Raw = typename Io<T>::Raw;
            normKernel<T><<<unsigned(rows), kThreads, 0, stream()>>>(
                x.as<Raw>(), in[1].as<Raw>(), layer ? in[2].as<Raw>() : nullptr,
                out[0].as<Raw>(), d, eps, layer);
          });
          launched(op);
        };
}

//===----------------------------------------------------------------------===//
// Shapes and indexing
//===----------------------------------------------------------------------===//

namespace {

/// out's coordinate c reads `in` at v.base + sum c_d * v.strides[d].
void gatherView(const TensorView &in, const TensorView &out,
                const cpu::StridedView &v) {
  copyStrided(out.data, 0, stridesOf(out.shape), in.data, v.base, v.strides,
              out.shape, byteSize(in.type));
}

/// Rows of `width` bytes: out row i = in row index[i] (< rows; else flag).
__global__ void gatherRowsKernel(const uint8_t *table, const void *indices,
                                 int indexType, uint8_t *out, int64_t outer,
                                 int64_t count, int64_t size, int64_t width,
                                 int *error) {
  const int64_t n = outer * count * width;
  ERNIE_GRID_STRIDE(k, n) {
    int64_t byte = k % width, flat = k / width, i = flat % count,
            o = flat / count;
    int64_t row = loadInt(indices, indexType, i);
    if (row < 0 || row >= size) {
      *error = 1;
      continue;
    }
    out[k] = table[((o * size + row) * width) + byte];
  }
}

/// index_add after a stable sort of (index, position): each run of equal
/// indices adds its updates in increasing position — the CPU's order.
template <typename Raw, typename C, typename Load, typename Store>
__global__ void indexAddKernel(Raw *y, const Raw *updates,
                               const int64_t *sortedKeys,
                               const int64_t *sortedPositions, int64_t outer,
                               int64_t count, int64_t size, int64_t inner,
                               Load load, Store store) {
  const int64_t n = outer * count * inner;
  ERNIE_GRID_STRIDE(k, n) {
    int64_t j = k % inner, p = (k / inner) % count, o = k / (inner * count);
    if (p > 0 && sortedKeys[p] == sortedKeys[p - 1])
      continue; // not the first of its run
    int64_t row = sortedKeys[p], at = (o * size + row) * inner + j;
    C acc = load(y, at);
    for (int64_t q = p; q < count && sortedKeys[q] == row; ++q)
      acc += load(updates, (o * count + sortedPositions[q]) * inner + j);
    store(y, at, acc);
  }
}

__global__ void keysKernel(const void *indices, int type, int64_t count,
                           int64_t size, int64_t *keys, int64_t *positions,
                           int *error) {
  ERNIE_GRID_STRIDE(i, count) {
    int64_t k = loadInt(indices, type, i);
    if (k < 0 || k >= size)
      *error = 1;
    keys[i] = k;
    positions[i] = i;
  }
}

/// topk along an axis, one thread per line: pick after pick, the best of
/// those ranked after the last pick in (value, index) order — larger values
/// first (NaN largest), ties to the lower index, as the CPU's stable sort.
template <typename Raw, typename C, typename Load, typename Store>
__global__ void topkKernel(const Raw *x, Raw *values, int64_t *indices,
                           int64_t outer, int64_t size, int64_t inner,
                           int64_t k, bool largest, Load load, Store store) {
  ERNIE_GRID_STRIDE(line, outer * inner) {
    const int64_t o = line / inner, j = line % inner;
    auto at = [&](int64_t p) { return load(x, (o * size + p) * inner + j); };
    auto less = [](C a, C b) {
      bool an = isnan(double(a)), bn = isnan(double(b));
      if (an || bn)
        return !an && bn;
      return a < b;
    };
    // a ranks before b: by value (descending when largest), then index.
    auto before = [&](C va, int64_t ia, C vb, int64_t ib) {
      bool better = largest ? less(vb, va) : less(va, vb);
      bool worse = largest ? less(va, vb) : less(vb, va);
      return better || (!worse && ia < ib);
    };
    C lastValue = C(0);
    int64_t last = -1;
    for (int64_t pick = 0; pick < k; ++pick) {
      int64_t best = -1;
      C bestValue = C(0);
      for (int64_t p = 0; p < size; ++p) {
        C v = at(p);
        if (last >= 0 && !before(lastValue, last, v, p))
          continue;
        if (best < 0 || before(v, p, bestValue, best)) {
          best = p;
          bestValue = v;
        }
      }
      store(values, (o * k + pick) * inner + j, bestValue);
      indices[(o * k + pick) * inner + j] = best;
      last = best;
      lastValue = bestValue;
    }
  }
}

template <typename Fn> void numericType(DType t, const char *op, Fn fn) {
  if (t == DType::I64)
    return fn(PlainLoad<int64_t>{}, PlainStore<int64_t>{}, int64_t{}, int64_t{});
  if (t == DType::I32)
    return fn(PlainLoad<int32_t>{}, PlainStore<int32_t>{}, int32_t{}, int32_t{});
  floatType(t, op, [&](auto tag) {
    constexpr int T = decltype(tag)::value;
    fn(TypedLoad<T>{}, TypedStore<T>{}, typename Io<T>::Raw{},
       typename Io<T>::C{});
  });
}

void outerInner(const std::vector<int64_t> &shape, int64_t axis,
                int64_t &outer, int64_t &inner) {
  outer = 1;
  inner = 1;
  for (int64_t d = 0; d < axis; ++d)
    outer *= shape[d];
  for (int64_t d = axis + 1; d < int64_t(shape.size()); ++d)
    inner *= shape[d];
}

} // namespace

void registerShapeKernels(Registry &r) {
  r["ernie.reshape"] = [](const std::vector<TensorView> &in,
                          const std::vector<TensorView> &out,
                          const Attrs &) { copyWhole(in[0], out[0]); };
  r["ernie.transpose"] = [](const std::vector<TensorView> &in,
                            const std::vector<TensorView> &out,
                            const Attrs &attrs) {
    gatherView(in[0], out[0], cpu::transposeView(in[0].shape, attrs.getInts("perm")));
  };
  r["ernie.broadcast"] = [](const std::vector<TensorView> &in,
                            const std::vector<TensorView> &out,
                            const Attrs &attrs) {
    gatherView(in[0], out[0], cpu::broadcastView(in[0].shape, out[0].rank(),
                                                 attrs.getInts("dims")));
  };
  r["ernie.slice"] = [](const std::vector<TensorView> &in,
                        const std::vector<TensorView> &out,
                        const Attrs &attrs) {
    gatherView(in[0], out[0], cpu::sliceView(in[0].shape, attrs.getInts("start"),
                                             attrs.getInts("step")));
  };
  r["ernie.pad"] = [](const std::vector<TensorView> &in,
                      const std::vector<TensorView> &out, const Attrs &attrs) {
    size_t bytes = byteSize(out[0].type);
    check(cudaMemsetAsync(out[0].data, 0, out[0].numElements() * bytes,
                          stream()),
          "ernie.pad");
    cpu::StridedView v = cpu::padView(out[0].shape, attrs.getInts("low"),
                                      attrs.getInts("interior"));
    copyStrided(out[0].data, v.base, v.strides, in[0].data, 0,
                stridesOf(in[0].shape), in[0].shape, bytes);
  };
  // split and concat: one pitched 2-D copy per piece.
  r["ernie.split"] = [](const std::vector<TensorView> &in,
                        const std::vector<TensorView> &out,
                        const Attrs &attrs) {
    int64_t axis = attrs.getInt("axis"), outer, inner;
    outerInner(in[0].shape, axis, outer, inner);
    size_t bytes = byteSize(in[0].type);
    size_t rowBytes = in[0].shape[axis] * inner * bytes, offset = 0;
    for (const TensorView &piece : out) {
      size_t pieceBytes = piece.shape[axis] * inner * bytes;
      if (pieceBytes && outer)
        check(cudaMemcpy2DAsync(piece.data, pieceBytes,
                                in[0].as<char>() + offset, rowBytes, pieceBytes,
                                outer, cudaMemcpyDeviceToDevice, stream()),
              "ernie.split");
      offset += pieceBytes;
    }
  };
  r["ernie.concat"] = [](const std::vector<TensorView> &in,
                         const std::vector<TensorView> &out,
                         const Attrs &attrs) {
    int64_t axis = attrs.getInt("axis"), outer, inner;
    outerInner(out[0].shape, axis, outer, inner);
    size_t bytes = byteSize(out[0].type);
    size_t rowBytes = out[0].shape[axis] * inner * bytes, offset = 0;
    for (const TensorView &piece : in) {
      size_t pieceBytes = piece.shape[axis] * inner * bytes;
      if (pieceBytes && outer)
        check(cudaMemcpy2DAsync(out[0].as<char>() + offset, rowBytes,
                                piece.data, pieceBytes, pieceBytes, outer,
                                cudaMemcpyDeviceToDevice, stream()),
              "ernie.concat");
      offset += pieceBytes;
    }
  };
  r["ernie.gather"] = [](const std::vector<TensorView> &in,
                         const std::vector<TensorView> &out,
                         const Attrs &attrs) {
    int64_t axis = attrs.getInt("axis"), outer, inner;
    const TensorView &x = in[0], &idx = in[1];
    outerInner(x.shape, axis, outer, inner);
    int64_t count = idx.numElements(), width = inner * byteSize(x.type);
    if (outer * count * width == 0)
      return;
    ErrorFlag error;
    gatherRowsKernel<<<gridFor(outer * count * width), kThreads, 0, stream()>>>(
        x.as<uint8_t>(), idx.data, int(idx.type), out[0].as<uint8_t>(), outer,
        count, x.shape[axis], width, error.device());
    launched("ernie.gather");
    if (error.raised())
      bad("gather index is outside [0, " + std::to_string(x.shape[axis]) + ")");
  };
  r["ernie.embedding"] = [](const std::vector<TensorView> &in,
                            const std::vector<TensorView> &out,
                            const Attrs &) {
    const TensorView &idx = in[0], &table = in[1];
    int64_t count = idx.numElements(),
            width = table.shape[1] * byteSize(table.type);
    if (count * width == 0)
      return;
    ErrorFlag error;
    gatherRowsKernel<<<gridFor(count * width), kThreads, 0, stream()>>>(
        table.as<uint8_t>(), idx.data, int(idx.type), out[0].as<uint8_t>(), 1,
        count, table.shape[0], width, error.device());
    launched("ernie.embedding");
    if (error.raised())
      bad("embedding index is outside the vocabulary of " +
          std::to_string(table.shape[0]));
  };
  r["ernie.index_add"] = [](const std::vector<TensorView> &in,
                            const std::vector<TensorView> &out,
                            const Attrs &attrs) {
    int64_t axis = attrs.getInt("axis"), outer, inner;
    const TensorView &base = in[0], &idx = in[1], &updates = in[2];
    outerInner(base.shape, axis, outer, inner);
    const int64_t count = idx.numElements(), size = base.shape[axis];
    copyWhole(base, out[0]);
    if (count == 0 || outer * inner == 0)
      return;
    // Keys and positions, stably sorted by key (CUB's radix sort).
    Scratch keys(count * 8), positions(count * 8), sortedKeys(count * 8),
        sortedPositions(count * 8);
    ErrorFlag error;
    keysKernel<<<gridFor(count), kThreads, 0, stream()>>>(
        idx.data, int(idx.type), count, size, keys.as<int64_t>(),
        positions.as<int64_t>(), error.device());
    launched("ernie.index_add");
    if (error.raised())
      bad("index_add index out of range");
    size_t temp = 0;
    check(cub::DeviceRadixSort::SortPairs(
              nullptr, temp, keys.as<int64_t>(), sortedKeys.as<int64_t>(),
              positions.as<int64_t>(), sortedPositions.as<int64_t>(),
              int(count), 0, 64, stream()),
          "ernie.index_add sort");
    Scratch work(temp ? temp : 1);
    check(cub::DeviceRadixSort::SortPairs(
              work.data(), temp, keys.as<int64_t>(), sortedKeys.as<int64_t>(),
              positions.as<int64_t>(), sortedPositions.as<int64_t>(),
              int(count), 0, 64, stream()),
          "ernie.index_add sort");
    numericType(base.type, "ernie.index_add",
                [&](auto load, auto store, auto raw, auto compute) {
                  using Raw = decltype(raw);
                  using C = decltype(compute);
                  indexAddKernel<Raw, C>
                      <<<gridFor(outer * count * inner), kThreads, 0, stream()>>>(
                          out[0].as<Raw>(), updates.as<Raw>(),
                          sortedKeys.as<int64_t>(), sortedPositions.as<int64_t>(),
                          outer, count, size, inner, load, store);
                });
    launched("ernie.index_add");
  };
  r["ernie.topk"] = [](const std::vector<TensorView> &in,
                       const std::vector<TensorView> &out,
                       const Attrs &attrs) {
    int64_t axis = attrs.getInt("axis"), k = attrs.getInt("k"), outer, inner;
    bool largest = !attrs.has("largest") || attrs.getBool("largest");
    const TensorView &x = in[0];
    int64_t size = x.shape[axis];
    if (k < 0 || k > size)
      bad("ernie.topk: k = " + std::to_string(k) + " is outside [0, " +
          std::to_string(size) + "]");
    outerInner(x.shape, axis, outer, inner);
    if (outer * inner * k == 0)
      return;
    numericType(x.type, "ernie.topk",
                [&](auto load, auto store, auto raw, auto compute) {
                  using Raw = decltype(raw);
                  using C = decltype(compute);
                  topkKernel<Raw, C><<<gridFor(outer * inner), kThreads, 0, stream()>>>(
                      x.as<Raw>(), out[0].as<Raw>(), out[1].as<int64_t>(), outer,
                      size, inner, k, largest, load, store);
                });
    launched("ernie.topk");
  };
}

//===----------------------------------------------------------------------===//
// Rope, cross-entropy, optimizers, MoE
//===----------------------------------------------------------------------===//

namespace {

/// One thread per (batch, position, head, pair): the CPU's angles in f64,
/// rounded to the compute type once.
template <int T>
__global__ void ropeKernel(const typename Io<T>::Raw *x,
                           typename Io<T>::Raw *y, const void *pos,
                           int posType, bool batched, int64_t B, int64_t S,
                           int64_t H, int64_t D, double theta,
                           bool interleaved) {
  using C = typename Io<T>::C;
  const int64_t half = D / 2, n = B * S * H * half;
  ERNIE_GRID_STRIDE(k, n) {
    int64_t i = k % half, h = (k / half) % H, s = (k / (half * H)) % S,
            b = k / (half * H * S);
    int64_t p = loadInt(pos, posType, batched ? b * S + s : s);
    double angle = double(p) * pow(theta, -2.0 * double(i) / double(D));
    C c = C(cos(angle)), sn = C(sin(angle));
    int64_t row = ((b * S + s) * H + h) * D;
    int64_t i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + half;
    C x0 = Io<T>::load(x, row + i0), x1 = Io<T>::load(x, row + i1);
    Io<T>::store(y, row + i0, x0 * c - x1 * sn);
    Io<T>::store(y, row + i1, x1 * c + x0 * sn);
  }
}

template <typename C> __device__ C expOf(C x) { return m::exponential(x); }

/// Per token (a block): the row's peak and sum of exponentials, then the
/// loss (forward) or the gradient row (backward). Labels out of the
/// vocabulary raise the flag.
template <int T>
__global__ void crossEntropyRows(const typename Io<T>::Raw *logits,
                                 const void *labels, int labelType,
                                 int64_t vocab, int64_t ignore,
                                 typename Io<T>::C *loss,
                                 typename Io<T>::Raw *grad,
                                 const typename Io<T>::Raw *dl, int reduction,
                                 const int64_t *kept, int *error) {
  using C = typename Io<T>::C;
  __shared__ C shared[kThreads];
  const int64_t t = blockIdx.x;
  const int64_t label = loadInt(labels, labelType, t);
  const int64_t row = t * vocab;
  if (label == ignore) {
    if (grad)
      for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x)
        Io<T>::store(grad, row + j, C(0));
    else if (threadIdx.x == 0)
      loss[t] = 0;
    return;
  }
  C peak = C(-INFINITY);
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x)
    peak = maximumOf(peak, Io<T>::load(logits, row + j));
  peak = blockReduce<C, true>(peak, shared);
  C total = 0;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x)
    total += expOf(Io<T>::load(logits, row + j) - peak);
  total = blockReduce<C, false>(total, shared);
  if (label < 0 || label >= vocab) {
    if (threadIdx.x == 0)
      *error = 1;
    return;
  }
  if (!grad) {
    if (threadIdx.x == 0)
      loss[t] = std::log(total) + peak - Io<T>::load(logits, row + label);
    return;
  }
  // dl: per token ("none"), or the scalar scaled by 1 / kept ("mean").
  C scale = reduction == 0   ? Io<T>::load(dl, t)
            : reduction == 1 ? Io<T>::load(dl, 0) / C(*kept)
                             : Io<T>::load(dl, 0);
  const C inverse = C(1) / total;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    C g = expOf(Io<T>::load(logits, row + j) - peak) * inverse * scale;
    if (j == label)
      g -= scale;
    Io<T>::store(grad, row + j, g);
  }
}

/// The tokens whose label is not ignored, counted by one thread in order.
__global__ void countKept(const void *labels, int type, int64_t tokens,
                          int64_t ignore, int64_t *kept) {
  int64_t n = 0;
  for (int64_t t = 0; t < tokens; ++t)
    n += loadInt(labels, type, t) != ignore;
  *kept = n;
}

/// The per-token losses summed in token order (one thread), or copied.
template <int T>
__global__ void crossEntropyReduce(const typename Io<T>::C *loss,
                                   typename Io<T>::Raw *y, int64_t tokens,
                                   int reduction, const int64_t *kept) {
  using C = typename Io<T>::C;
  if (reduction == 0) {
    ERNIE_GRID_STRIDE(t, tokens) { Io<T>::store(y, t, loss[t]); }
    return;
  }
  if (blockIdx.x != 0 || threadIdx.x != 0)
    return;
  C sum = 0;
  for (int64_t t = 0; t < tokens; ++t)
    sum += loss[t];
  Io<T>::store(y, 0, reduction == 1 ? sum / C(*kept) : sum);
}

int reductionCode(const std::string &reduction) {
  if (reduction == "none")
    return 0;
  if (reduction == "mean")
    return 1;
  if (reduction == "sum")
    return 2;
  bad("unknown cross-entropy reduction '" + reduction + "'");
}

void crossEntropy(const std::vector<TensorView> &in,
                  const std::vector<TensorView> &out, const Attrs &attrs,
                  bool backward) {
  const char *op = backward ? "ernie.cross_entropy_grad" : "ernie.cross_entropy";
  const TensorView &logits = in[0], &labels = in[1];
  const int64_t vocab = logits.shape.back(), tokens = labels.numElements();
  const int64_t ignore = attrs.getInt("ignore_index", -100);
  const int reduction = reductionCode(attrs.getString("reduction", "mean"));
  if (tokens == 0)
    return;
  Scratch kept(8);
  countKept<<<1, 1, 0, stream()>>>(labels.data, int(labels.type), tokens,
                                   ignore, kept.as<int64_t>());
  launched(op);
  ErrorFlag error;
  floatType(logits.type, op, [&](auto t) {
    constexpr int T = decltype(t)::value;
    using Raw = typename Io<T>::Raw;
    using C = typename Io<T>::C;
    if (backward) {
      crossEntropyRows<T><<<unsigned(tokens), kThreads, 0, stream()>>>(
          logits.as<Raw>(), labels.data, int(labels.type), vocab, ignore,
          nullptr, out[0].as<Raw>(), in[2].as<Raw>(), reduction,
          kept.as<int64_t>(), error.device());
      return;
    }
    Scratch loss(tokens * sizeof(C));
    crossEntropyRows<T><<<unsigned(tokens), kThreads, 0, stream()>>>(
        logits.as<Raw>(), labels.data, int(labels.type), vocab, ignore,
        loss.as<C>(), nullptr, nullptr, reduction, kept.as<int64_t>(),
        error.device());
    crossEntropyReduce<T><<<gridFor(tokens), kThreads, 0, stream()>>>(
        loss.as<C>(), out[0].as<Raw>(), tokens, reduction, kept.as<int64_t>());
  });
  launched(op);
  if (error.raised())
    bad("a label is outside the vocabulary of " + std::to_string(vocab));
}

/// Buffers of an optimizer update: each read in its own type, the
/// arithmetic in f64, each result rounded once into its type.
struct Typed {
  const void *in[6];
  int inType[6];
  void *out[3];
  int outType[3];
};

__global__ void sgdKernel(Typed b, int64_t n, double momentum, double decay,
                          bool nesterov) {
  const double lr = loadAny(b.in[3], b.inType[3], 0);
  ERNIE_GRID_STRIDE(i, n) {
    double p = loadAny(b.in[0], b.inType[0], i);
    double g = loadAny(b.in[1], b.inType[1], i);
    double buf = momentum != 0 ? loadAny(b.in[2], b.inType[2], i) : 0.0;
    double grad = g + decay * p;
    buf = momentum * buf + grad;
    double step = nesterov ? grad + momentum * buf : buf;
    p = p - lr * step;
    storeAny(b.out[1], b.outType[1], i, buf);
    storeAny(b.out[0], b.outType[0], i, p);
  }
}

__global__ void adamwKernel(Typed b, int64_t n, double b1, double b2,
                            double eps, double decay) {
  const double lr = loadAny(b.in[4], b.inType[4], 0);
  // The bias corrections from the step on the device (no host round trip).
  const double t = double(loadInt(b.in[5], b.inType[5], 0));
  const double c1 = 1 - pow(b1, t), c2 = 1 - pow(b2, t);
  ERNIE_GRID_STRIDE(i, n) {
    double p = loadAny(b.in[0], b.inType[0], i);
    double g = loadAny(b.in[1], b.inType[1], i);
    double mo = loadAny(b.in[2], b.inType[2], i);
    double v = loadAny(b.in[3], b.inType[3], i);
    mo = b1 * mo + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    double update = (mo / c1) / (sqrt(v / c2) + eps) + decay * p;
    p = p - lr * update;
    storeAny(b.out[1], b.outType[1], i, mo);
    storeAny(b.out[2], b.outType[2], i, v);
    storeAny(b.out[0], b.outType[0], i, p);
  }
}

Typed typed(const std::vector<TensorView> &in,
            const std::vector<TensorView> &out, const char *op,
            size_t floats) {
  Typed t{};
  for (size_t i = 0; i < in.size() && i < 6; ++i) {
    if (i < floats && !isFloat(in[i].type))
      bad(std::string(op) + ": buffer " + std::to_string(i) + " is " +
          std::string(name(in[i].type)) + ", not a float");
    t.in[i] = in[i].data;
    t.inType[i] = int(in[i].type);
  }
  for (size_t i = 0; i < out.size() && i < 3; ++i) {
    if (!isFloat(out[i].type))
      bad(std::string(op) + ": result " + std::to_string(i) + " is not a float");
    t.out[i] = out[i].data;
    t.outType[i] = int(out[i].type);
  }
  return t;
}

// MoE: buffers [experts, groups, capacity, hidden], choices [groups,
// tokens, k]. Each kernel gives every output element one thread that adds
// its terms in the CPU's order.

__device__ int64_t slotRow(int64_t g, int64_t expert, int64_t slot,
                           int64_t experts, int64_t groups, int64_t capacity,
                           int64_t hidden, int *error) {
  if (slot == -1)
    return -1;
  if (expert < 0 || expert >= experts || slot < 0 || slot >= capacity) {
    *error = 1;
    return -1;
  }
  return ((expert * groups + g) * capacity + slot) * hidden;
}

struct MoeShape {
  int64_t experts, groups, capacity, tokens, k, hidden;
};

__global__ void moeRouteKernel(const void *experts, int type, int64_t *slots,
                               int64_t groups, int64_t tokens, int64_t k,
                               int64_t numExperts, int64_t capacity,
                               int64_t *used, int *error) {
  // One thread per group, choice rank first, then tokens (the CPU's order).
  ERNIE_GRID_STRIDE(g, groups) {
    int64_t *count = used + g * numExperts;
    for (int64_t e = 0; e < numExperts; ++e)
      count[e] = 0;
    for (int64_t j = 0; j < k; ++j)
      for (int64_t t = 0; t < tokens; ++t) {
        int64_t i = (g * tokens + t) * k + j, e = loadInt(experts, type, i);
        if (e < 0 || e >= numExperts) {
          *error = 1;
          slots[i] = -1;
          continue;
        }
        int64_t slot = count[e]++;
        slots[i] = slot < capacity ? slot : -1;
      }
  }
}

/// dispatch: every (group, hidden) element walks the group's choices in
/// order, adding weight * token into each chosen slot (choices sharing a
/// slot add up in choice order).
template <typename C>
__global__ void moeDispatchKernel(const C *x, const void *ex, int exType,
                                  const void *sl, int slType, const C *w,
                                  C *buf, MoeShape s, int *error) {
  ERNIE_GRID_STRIDE(k, s.groups * s.hidden) {
    int64_t g = k / s.hidden, h = k % s.hidden;
    for (int64_t t = 0; t < s.tokens; ++t)
      for (int64_t j = 0; j < s.k; ++j) {
        int64_t i = (g * s.tokens + t) * s.k + j;
        int64_t row = slotRow(g, loadInt(ex, exType, i), loadInt(sl, slType, i),
                              s.experts, s.groups, s.capacity, s.hidden, error);
        if (row >= 0)
          buf[row + h] += w[i] * x[(g * s.tokens + t) * s.hidden + h];
      }
  }
}

template <typename C>
__global__ void moeCombineKernel(const C *buf, const void *ex, int exType,
                                 const void *sl, int slType, const C *w, C *y,
                                 MoeShape s, int *error) {
  ERNIE_GRID_STRIDE(k, s.groups * s.tokens * s.hidden) {
    int64_t h = k % s.hidden, gt = k / s.hidden, g = gt / s.tokens;
    C acc = 0;
    for (int64_t j = 0; j < s.k; ++j) {
      int64_t i = gt * s.k + j;
      int64_t row = slotRow(g, loadInt(ex, exType, i), loadInt(sl, slType, i),
                            s.experts, s.groups, s.capacity, s.hidden, error);
      if (row >= 0)
        acc += w[i] * buf[row + h];
    }
    y[k] = acc;
  }
}

template <typename C>
__global__ void moeWeightsGradKernel(const C *tokens, const C *buf,
                                     const void *ex, int exType, const void *sl,
                                     int slType, C *dw, MoeShape s, int *error) {
  ERNIE_GRID_STRIDE(i, s.groups * s.tokens * s.k) {
    int64_t gt = i / s.k, g = gt / s.tokens;
    int64_t row = slotRow(g, loadInt(ex, exType, i), loadInt(sl, slType, i),
                          s.experts, s.groups, s.capacity, s.hidden, error);
    C sum = 0;
    if (row >= 0)
      for (int64_t h = 0; h < s.hidden; ++h)
        sum += tokens[gt * s.hidden + h] * buf[row + h];
    dw[i] = sum;
  }
}

MoeShape moeShape(const TensorView &choices, const TensorView &buffers) {
  return {buffers.shape[0], choices.shape[0], buffers.shape[2],
          choices.shape[1], choices.shape[2], buffers.shape[3]};
}

/// The MoE kernels compute in f32 or f64 on buffers of that type; narrow
/// buffers are widened into scratch first and the result rounded once.
template <typename Fn>
void moeFloat(const char *op, const std::vector<TensorView> &in,
              const std::vector<TensorView> &out,
              const std::vector<size_t> &floatInputs, Fn fn) {
  DType t = out[0].type;
  if (t == DType::F32 || t == DType::F64) {
    if (t == DType::F32)
      fn(float{}, in, out);
    else
      fn(double{}, in, out);
    return;
  }
  if (!isFloat(t))
    bad(std::string(op) + ": no CUDA kernel for " + std::string(name(t)));
  std::vector<std::unique_ptr<Scratch>> keep;
  auto widened = [&](const TensorView &v, bool read) {
    keep.push_back(std::make_unique<Scratch>(v.numElements() * 4));
    if (read)
      convert(v.data, v.type, keep.back()->data(), DType::F32, v.numElements());
    return TensorView{keep.back()->data(), DType::F32, v.shape};
  };
  std::vector<TensorView> win = in, wout = out;
  for (size_t i : floatInputs)
    win[i] = widened(in[i], true);
  wout[0] = widened(out[0], false);
  fn(float{}, win, wout);
  convert(wout[0].data, DType::F32, out[0].data, t, out[0].numElements());
}

} // namespace

void registerTransformerKernels(Registry &r) {
  r["ernie.rope"] = [](const std::vector<TensorView> &in,
                       const std::vector<TensorView> &out, const Attrs &attrs) {
    const TensorView &x = in[0], &pos = in[1];
    double theta = attrs.getFloat("theta", 10000.0);
    bool interleaved = attrs.getBool("interleaved");
    int64_t B = x.shape[0], S = x.shape[1], H = x.shape[2], D = x.shape[3];
    int64_t n = B * S * H * (D / 2);
    if (n == 0)
      return;
    floatType(x.type, "ernie.rope", [&](auto t) {
      constexpr int T = decltype(t)::value;
      using Raw = typename Io<T>::Raw;
      ropeKernel<T><<<gridFor(n), kThreads, 0, stream()>>>(
          x.as<Raw>(), out[0].as<Raw>(), pos.data, int(pos.type),
          pos.rank() == 2, B, S, H, D, theta, interleaved);
    });
    launched("ernie.rope");
  };
  r["ernie.cross_entropy"] = [](auto &in, auto &out, auto &a) {
    crossEntropy(in, out, a, false);
  };
  r["ernie.cross_entropy_grad"] = [](auto &in, auto &out, auto &a) {
    crossEntropy(in, out, a, true);
  };
  // The two kernels in turn (each computes its exponentials): the same bits
  // as the pair of ops, without the CPU's shared pass.
  r["ernie.cross_entropy_and_grad"] = [](auto &in, auto &out, auto &a) {
    crossEntropy({in.at(0), in.at(1)}, {out.at(0)}, a, false);
    crossEntropy(in, {out.at(1)}, a, true);
  };
  r["ernie.sgd_update"] = [](const std::vector<TensorView> &in,
                             const std::vector<TensorView> &out,
                             const Attrs &attrs) {
    Typed b = typed(in, out, "ernie.sgd_update", 4);
    int64_t n = in[0].numElements();
    if (n)
      sgdKernel<<<gridFor(n), kThreads, 0, stream()>>>(
          b, n, attrs.getFloat("momentum", 0.0),
          attrs.getFloat("weight_decay", 0.0), attrs.getBool("nesterov"));
    launched("ernie.sgd_update");
  };
  r["ernie.adamw_update"] = [](const std::vector<TensorView> &in,
                               const std::vector<TensorView> &out,
                               const Attrs &attrs) {
    Typed b = typed(in, out, "ernie.adamw_update", 5);
    double b1 = attrs.getFloat("beta1", 0.9), b2 = attrs.getFloat("beta2", 0.999);
    if (in[5].type != DType::I64 && in[5].type != DType::I32)
      bad("ernie.adamw_update: the step must be i32 or i64");
    int64_t n = in[0].numElements();
    if (n)
      adamwKernel<<<gridFor(n), kThreads, 0, stream()>>>(
          b, n, b1, b2, attrs.getFloat("epsilon", 1e-8),
          attrs.getFloat("weight_decay", 0.01));
    launched("ernie.adamw_update");
  };
  r["ernie.moe_route"] = [](const std::vector<TensorView> &in,
                            const std::vector<TensorView> &out,
                            const Attrs &attrs) {
    const TensorView &experts = in[0];
    int64_t numExperts = attrs.getInt("num_experts"),
            capacity = attrs.getInt("capacity"), groups = experts.shape[0];
    if (groups == 0)
      return;
    Scratch used(groups * std::max<int64_t>(numExperts, 1) * 8);
    ErrorFlag error;
    moeRouteKernel<<<gridFor(groups), kThreads, 0, stream()>>>(
        experts.data, int(experts.type), out[0].as<int64_t>(), groups,
        experts.shape[1], experts.shape[2], numExperts, capacity,
        used.as<int64_t>(), error.device());
    launched("ernie.moe_route");
    if (error.raised())
      bad("ernie.moe_route: a token chose an expert outside [0, " +
          std::to_string(numExperts) + ")");
  };
  r["ernie.moe_dispatch"] = [](const std::vector<TensorView> &in,
                               const std::vector<TensorView> &out,
                               const Attrs &) {
    moeFloat("ernie.moe_dispatch", in, out, {0, 3},
             [](auto zero, const std::vector<TensorView> &i,
                const std::vector<TensorView> &o) {
               using C = decltype(zero);
               MoeShape s = moeShape(i[1], o[0]);
               check(cudaMemsetAsync(o[0].data, 0, o[0].numElements() * sizeof(C),
                                     stream()),
                     "ernie.moe_dispatch");
               ErrorFlag error;
               if (s.groups * s.hidden != 0)
                 moeDispatchKernel<C><<<gridFor(s.groups * s.hidden), kThreads, 0,
                                        stream()>>>(
                     i[0].as<C>(), i[1].data, int(i[1].type), i[2].data,
                     int(i[2].type), i[3].as<C>(), o[0].as<C>(), s,
                     error.device());
               launched("ernie.moe_dispatch");
               if (error.raised())
                 bad("ernie.moe_dispatch: an expert or slot is out of range");
             });
  };
  r["ernie.moe_combine"] = [](const std::vector<TensorView> &in,
                              const std::vector<TensorView> &out,
                              const Attrs &) {
    moeFloat("ernie.moe_combine", in, out, {0, 3},
             [](auto zero, const std::vector<TensorView> &i,
                const std::vector<TensorView> &o) {
               using C = decltype(zero);
               MoeShape s = moeShape(i[1], i[0]);
               ErrorFlag error;
               int64_t n = s.groups * s.tokens * s.hidden;
               if (n)
                 moeCombineKernel<C><<<gridFor(n), kThreads, 0, stream()>>>(
                     i[0].as<C>(), i[1].data, int(i[1].type), i[2].data,
                     int(i[2].type), i[3].as<C>(), o[0].as<C>(), s,
                     error.device());
               launched("ernie.moe_combine");
               if (error.raised())
                 bad("ernie.moe_combine: an expert or slot is out of range");
             });
  };
  r["ernie.moe_weights_grad"] = [](const std::vector<TensorView> &in,
                                   const std::vector<TensorView> &out,
                                   const Attrs &) {
    moeFloat("ernie.moe_weights_grad", in, out, {0, 1},
             [](auto zero, const std::vector<TensorView> &i,
                const std::vector<TensorView> &o) {
               using C = decltype(zero);
               MoeShape s = moeShape(i[2], i[1]);
               ErrorFlag error;
               int64_t n = s.groups * s.tokens * s.k;
               if (n)
                 moeWeightsGradKernel<C><<<gridFor(n), kThreads, 0, stream()>>>(
                     i[0].as<C>(), i[1].as<C>(), i[2].data, int(i[2].type),
                     i[3].data, int(i[3].type), o[0].as<C>(), s,
                     error.device());
               launched("ernie.moe_weights_grad");
               if (error.raised())
                 bad("ernie.moe_weights_grad: an expert or slot is out of range");
             });
  };
}

//===----------------------------------------------------------------------===//
// ernie.fused: the CPU's lowering, interpreted an element per thread
//===----------------------------------------------------------------------===//

namespace {

constexpr int kMaxRegisters = 32, kMaxOperands = 16, kMaxSteps = 64;

/// The lowered body, flat, passed by value (a kernel parameter).
struct FusedPlan {
  int rank = 0;
  int64_t shape[kMaxDims] = {};
  int loads = 0, steps = 0, stores = 0;
  // Loads then stores: their strides over the iteration shape.
  int64_t strides[kMaxOperands][kMaxDims] = {};
  struct LoadInfo {
    int input, reg, type;
  } load[kMaxOperands];
  struct StepInfo {
    int code, out, a, b, c, to, direction;
    double fill;
  } step[kMaxSteps];
  struct StoreInfo {
    int reg, output, type, reduces, kind;
    int64_t count;
  } store[kMaxOperands];
};

struct FusedBuffers {
  const void *in[kMaxOperands];
  void *out[kMaxOperands];
};

/// A value rounded to `type` and back (Fused.cpp's roundTo).
template <typename C> __device__ C roundTo(int type, C x) {
  switch (type) {
  case kF64: return C(double(x));
  case kF32: return C(float(x));
  case kBF16: return C(bf16Load(bf16Store(roundToOddFloat(double(x)))));
  case kF16: return C(f16Load(f16Store(roundToOddFloat(double(x)))));
  case kE4M3: return C(e4m3Load(e4m3Store(roundToOddFloat(double(x)))));
  case kE5M2: return C(e5m2Load(e5m2Store(roundToOddFloat(double(x)))));
  case kI1: return x != C(0) ? C(1) : C(0);
  default: return x;
  }
}

template <typename C>
__device__ void runSteps(const FusedPlan &p, C *regs) {
  using fused::Code;
  for (int s = 0; s < p.steps; ++s) {
    const auto &st = p.step[s];
    C a = regs[st.a], b = regs[st.b], c = regs[st.c], y;
    switch (Code(st.code)) {
    case Code::Neg: y = -a; break;
    case Code::Exp: y = m::exponential(a); break;
    case Code::Log: y = std::log(a); break;
    case Code::Sqrt: y = std::sqrt(a); break;
    case Code::Rsqrt: y = m::rsqrt(a); break;
    case Code::Tanh: y = std::tanh(a); break;
    case Code::Sigmoid: y = m::sigmoid(a); break;
    case Code::Silu: y = m::silu(a); break;
    case Code::Relu: y = m::relu(a); break;
    case Code::Abs: y = m::abs(a); break;
    case Code::Reciprocal: y = m::reciprocal(a); break;
    case Code::Erf: y = std::erf(a); break;
    case Code::Gelu: y = m::gelu(a, false); break;
    case Code::GeluTanh: y = m::gelu(a, true); break;
    case Code::Copy: y = a; break;
    case Code::Cast: y = roundTo(st.to, a); break;
    case Code::Add: y = a + b; break;
    case Code::Sub: y = a - b; break;
    case Code::Mul: y = a * b; break;
    case Code::Div: y = a / b; break;
    case Code::Maximum: y = maximumOf(a, b); break;
    case Code::Minimum: y = minimumOf(a, b); break;
    case Code::Pow: y = std::pow(a, b); break;
    case Code::Compare: y = m::compare(st.direction, a, b) ? C(1) : C(0); break;
    case Code::Select: y = a != C(0) ? b : c; break;
    default: y = C(st.fill); break;
    }
    regs[st.out] = y;
  }
}

/// Loads every input at iteration point `flat`, runs the steps.
template <typename C>
__device__ void evaluate(const FusedPlan &p, const FusedBuffers &b,
                         int64_t flat, C *regs) {
  int64_t coord[kMaxDims];
  for (int d = p.rank - 1; d >= 0; --d) {
    coord[d] = flat % p.shape[d];
    flat /= p.shape[d];
  }
  for (int l = 0; l < p.loads; ++l) {
    int64_t at = 0;
    for (int d = 0; d < p.rank; ++d)
      at += coord[d] * p.strides[l][d];
    regs[p.load[l].reg] = C(loadAny(b.in[p.load[l].input], p.load[l].type, at));
  }
  runSteps(p, regs);
}

/// Every iteration point: the stores that do not reduce.
template <typename C>
__global__ void fusedElementwise(FusedPlan p, FusedBuffers b, int64_t points) {
  ERNIE_GRID_STRIDE(i, points) {
    C regs[kMaxRegisters];
    evaluate(p, b, i, regs);
    int64_t coord[kMaxDims], flat = i;
    for (int d = p.rank - 1; d >= 0; --d) {
      coord[d] = flat % p.shape[d];
      flat /= p.shape[d];
    }
    for (int s = 0; s < p.stores; ++s) {
      if (p.store[s].reduces)
        continue;
      int64_t at = 0;
      for (int d = 0; d < p.rank; ++d)
        at += coord[d] * p.strides[p.loads + s][d];
      storeAny(b.out[p.store[s].output], p.store[s].type, at,
               double(regs[p.store[s].reg]));
    }
  }
}

/// One reduction store: a thread per result element walks the iteration
/// points that reduce into it in increasing order (the CPU's order).
template <typename C>
__global__ void fusedReduction(FusedPlan p, FusedBuffers b, int store,
                               int64_t elements) {
  const auto &st = p.store[store];
  const int64_t *to = p.strides[p.loads + store];
  // Kept dimensions (stride != 0) index the result; the others are walked.
  int kept[kMaxDims], walked[kMaxDims], nk = 0, nw = 0;
  int64_t walkCount = 1;
  for (int d = 0; d < p.rank; ++d) {
    if (to[d] != 0)
      kept[nk++] = d;
    else {
      walked[nw++] = d;
      walkCount *= p.shape[d];
    }
  }
  ERNIE_GRID_STRIDE(e, elements) {
    // The result element's coordinates along the kept dimensions, from its
    // offset (kept strides are row-major over the kept extents).
    int64_t coord[kMaxDims] = {}, rest = e;
    for (int k = nk - 1; k >= 0; --k) {
      int d = kept[k];
      coord[d] = rest % p.shape[d];
      rest /= p.shape[d];
    }
    C acc = st.kind == int(fused::Reduction::Max) ? C(-INFINITY) : C(0);
    for (int64_t w = 0; w < walkCount; ++w) {
      int64_t r = w;
      for (int k = nw - 1; k >= 0; --k) {
        int d = walked[k];
        coord[d] = r % p.shape[d];
        r /= p.shape[d];
      }
      int64_t flat = 0;
      for (int d = 0; d < p.rank; ++d)
        flat = flat * p.shape[d] + coord[d];
      C regs[kMaxRegisters];
      evaluate(p, b, flat, regs);
      C v = regs[st.reg];
      acc = st.kind == int(fused::Reduction::Max) ? maximumOf(acc, v) : acc + v;
    }
    if (st.kind == int(fused::Reduction::Mean))
      acc /= C(st.count);
    int64_t at = 0;
    for (int d = 0; d < p.rank; ++d)
      at += coord[d] * to[d];
    storeAny(b.out[st.output], st.type, at, double(acc));
  }
}

} // namespace

Kernel makeFusedKernel(const FusedBody &body) {
  fused::Compiled c = fused::compileFused(body);
  auto plan = std::make_shared<FusedPlan>();
  FusedPlan &p = *plan;
  const auto &shape = c.space.shape;
  if (shape.size() > size_t(kMaxDims) || c.registers > size_t(kMaxRegisters) ||
      c.loads.size() + c.stores.size() > size_t(kMaxOperands) ||
      c.steps.size() > size_t(kMaxSteps))
    bad("a fused region beyond what the CUDA interpreter holds (" +
        std::to_string(kMaxDims) + " dimensions, " +
        std::to_string(kMaxRegisters) + " registers, " +
        std::to_string(kMaxOperands) + " loads and stores, " +
        std::to_string(kMaxSteps) + " steps)");
  p.rank = int(shape.size());
  for (int d = 0; d < p.rank; ++d)
    p.shape[d] = shape[d];
  p.loads = int(c.loads.size());
  p.steps = int(c.steps.size());
  p.stores = int(c.stores.size());
  for (size_t k = 0; k < c.space.strides.size(); ++k)
    for (int d = 0; d < p.rank; ++d)
      p.strides[k][d] = c.space.strides[k][d];
  for (int l = 0; l < p.loads; ++l)
    p.load[l] = {int(c.loads[l].input), int(c.loads[l].reg),
                 int(c.loads[l].type)};
  for (int s = 0; s < p.steps; ++s) {
    const fused::Step &st = c.steps[s];
    p.step[s] = {int(st.code), int(st.out), int(st.a), int(st.b), int(st.c),
                 int(st.to), int(st.direction), st.fill};
  }
  for (int s = 0; s < p.stores; ++s) {
    const fused::Store &st = c.stores[s];
    p.store[s] = {int(st.reg), int(st.output), int(st.type), st.reduces ? 1 : 0,
                  int(st.kind), st.count};
  }
  const bool f64 = c.f64;
  std::vector<int64_t> reductionElements;
  for (const fused::Store &st : c.stores)
    reductionElements.push_back(st.reduces ? st.elements : 0);
  const size_t inputs = body.inputs, outputs = body.yields.size();
  return [plan, f64, reductionElements, inputs,
          outputs](const std::vector<TensorView> &in,
                   const std::vector<TensorView> &out, const Attrs &) {
    if (in.size() != inputs || out.size() != outputs)
      throw KernelError("a fused loop got the wrong number of buffers");
    FusedBuffers b{};
    for (size_t i = 0; i < in.size(); ++i)
      b.in[i] = in[i].data;
    for (size_t i = 0; i < out.size(); ++i)
      b.out[i] = out[i].data;
    const FusedPlan &p = *plan;
    int64_t points = 1;
    for (int d = 0; d < p.rank; ++d)
      points *= p.shape[d];
    bool elementwise = false;
    for (int s = 0; s < p.stores; ++s)
      elementwise |= !p.store[s].reduces;
    if (elementwise && points) {
      if (f64)
        fusedElementwise<double><<<gridFor(points), kThreads, 0, stream()>>>(
            p, b, points);
      else
        fusedElementwise<float><<<gridFor(points), kThreads, 0, stream()>>>(
            p, b, points);
    }
    for (int s = 0; s < p.stores; ++s) {
      int64_t n = reductionElements[s];
      if (!p.store[s].reduces || n == 0)
        continue;
      if (f64)
        fusedReduction<double><<<gridFor(n), kThreads, 0, stream()>>>(p, b, s, n);
      else
        fusedReduction<float><<<gridFor(n), kThreads, 0, stream()>>>(p, b, s, n);
    }
    launched("ernie.fused");
  };
}

} // namespace ernie::runtime::cuda

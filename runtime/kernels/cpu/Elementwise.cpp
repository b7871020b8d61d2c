//===- Elementwise.cpp - CPU kernels of elementwise and creation ops --------===//
//
// One loop per op family; the math of each op is one lambda next to its
// name. f32/f64 compute natively; integer ops where the dialect allows.
// cast, compare, select and the creation ops take every element type
// directly; the rest see narrow floats as f32 (see Registry).
//
//===----------------------------------------------------------------------===//

#include "kernels/common/ElementwiseMath.h"
#include "kernels/common/Registry.h"

#include "ernie/runtime/FloatConvert.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace ernie::runtime::cpu {

namespace {

template <typename Fn>
void unaryFloat(Registry &r, const char *name, Fn fn) {
  r[name] = [fn](const std::vector<TensorView> &in,
                 const std::vector<TensorView> &out, const Attrs &attrs) {
    expectCount(in, 1, "unary op");
    dispatchFloat(in[0].type, [&](auto zero) {
      using T = decltype(zero);
      const T *x = in[0].as<T>();
      T *y = out[0].as<T>();
      for (int64_t i = 0, n = in[0].numElements(); i < n; ++i)
        y[i] = fn(x[i], attrs);
    });
  };
}

template <typename Fn>
void unaryNumeric(Registry &r, const char *name, Fn fn) {
  r[name] = [fn](const std::vector<TensorView> &in,
                 const std::vector<TensorView> &out, const Attrs &) {
    expectCount(in, 1, "unary op");
    dispatchNumeric(in[0].type, [&](auto zero) {
      using T = decltype(zero);
      const T *x = in[0].as<T>();
      T *y = out[0].as<T>();
      for (int64_t i = 0, n = in[0].numElements(); i < n; ++i)
        y[i] = fn(x[i]);
    });
  };
}

template <typename Fn>
void binaryNumeric(Registry &r, const char *name, Fn fn, bool floatOnly) {
  r[name] = [fn, floatOnly, name](const std::vector<TensorView> &in,
                                  const std::vector<TensorView> &out,
                                  const Attrs &) {
    expectCount(in, 2, name);
    auto body = [&](auto zero) {
      using T = decltype(zero);
      const T *a = in[0].as<T>(), *b = in[1].as<T>();
      T *y = out[0].as<T>();
      for (int64_t i = 0, n = in[0].numElements(); i < n; ++i)
        y[i] = fn(a[i], b[i]);
    };
    if (floatOnly)
      dispatchFloat(in[0].type, body);
    else
      dispatchNumeric(in[0].type, body);
  };
}

template <typename T> T integerDivide(T a, T b) {
  if (b == 0)
    throw KernelError("integer division by zero");
  return a / b;
}

/// Float to integer, rounding toward zero: out-of-range values saturate and
/// NaN becomes 0 (a plain static_cast is undefined behaviour for both).
template <typename I> I saturatingToInt(double x) {
  if (std::isnan(x))
    return 0;
  // -min (2^63, 2^31) is an exact double; max may not be.
  const double limit = -static_cast<double>(std::numeric_limits<I>::min());
  if (x >= limit)
    return std::numeric_limits<I>::max();
  if (x < -limit)
    return std::numeric_limits<I>::min();
  return static_cast<I>(std::trunc(x));
}

/// Integer to any type: floats round once (an i64 past 2^53 would round
/// twice through the nearest double), integers saturate.
void storeFromInt(const TensorView &v, int64_t i, int64_t x) {
  switch (v.type) {
  case DType::F64: v.as<double>()[i] = static_cast<double>(x); return;
  case DType::I64: v.as<int64_t>()[i] = x; return;
  case DType::I32:
    v.as<int32_t>()[i] = static_cast<int32_t>(
        std::clamp<int64_t>(x, std::numeric_limits<int32_t>::min(),
                            std::numeric_limits<int32_t>::max()));
    return;
  case DType::I1: v.as<uint8_t>()[i] = x != 0; return;
  default: storeFromDouble(v, i, roundToOddDouble(x)); return;
  }
}

} // namespace

double loadAsDouble(const TensorView &v, int64_t i) {
  switch (v.type) {
  case DType::F64: return v.as<double>()[i];
  case DType::F32: return v.as<float>()[i];
  case DType::F16: return f16ToFloat(v.as<uint16_t>()[i]);
  case DType::BF16: return bf16ToFloat(v.as<uint16_t>()[i]);
  case DType::F8E4M3FN: return f8E4M3FNToFloat(v.as<uint8_t>()[i]);
  case DType::F8E5M2: return f8E5M2ToFloat(v.as<uint8_t>()[i]);
  case DType::I64: return static_cast<double>(v.as<int64_t>()[i]);
  case DType::I32: return v.as<int32_t>()[i];
  case DType::I1: return v.as<uint8_t>()[i] ? 1.0 : 0.0;
  }
  throw KernelError("unknown element type");
}

void storeFromDouble(const TensorView &v, int64_t i, double x) {
  switch (v.type) {
  case DType::F64: v.as<double>()[i] = x; return;
  case DType::F32: v.as<float>()[i] = static_cast<float>(x); return;
  case DType::F16: v.as<uint16_t>()[i] = doubleToF16(x); return;
  case DType::BF16: v.as<uint16_t>()[i] = doubleToBf16(x); return;
  case DType::F8E4M3FN: v.as<uint8_t>()[i] = doubleToF8E4M3FN(x); return;
  case DType::F8E5M2: v.as<uint8_t>()[i] = doubleToF8E5M2(x); return;
  case DType::I64: v.as<int64_t>()[i] = saturatingToInt<int64_t>(x); return;
  case DType::I32: v.as<int32_t>()[i] = saturatingToInt<int32_t>(x); return;
  case DType::I1: v.as<uint8_t>()[i] = x != 0.0; return;
  }
  throw KernelError("unknown element type");
}

void loadBlockAsDouble(const TensorView &v, int64_t start, int64_t n,
                       double *out) {
  auto widen = [&](auto *p, auto fn) {
    for (int64_t i = 0; i < n; ++i)
      out[i] = fn(p[start + i]);
  };
  auto same = [](auto x) { return static_cast<double>(x); };
  switch (v.type) {
  case DType::F64: return widen(v.as<double>(), same);
  case DType::F32: return widen(v.as<float>(), same);
  case DType::F16: return widen(v.as<uint16_t>(), f16ToFloat);
  case DType::BF16: return widen(v.as<uint16_t>(), bf16ToFloat);
  default:
    for (int64_t i = 0; i < n; ++i)
      out[i] = loadAsDouble(v, start + i);
  }
}

void storeBlockFromDouble(const TensorView &v, int64_t start, int64_t n,
                          const double *x) {
  auto narrow = [&](auto *p, auto fn) {
    for (int64_t i = 0; i < n; ++i)
      p[start + i] = fn(x[i]);
  };
  switch (v.type) {
  case DType::F64: return narrow(v.as<double>(), [](double d) { return d; });
  case DType::F32:
    return narrow(v.as<float>(), [](double d) { return static_cast<float>(d); });
  case DType::BF16: return narrow(v.as<uint16_t>(), doubleToBf16);
  case DType::F16: return narrow(v.as<uint16_t>(), doubleToF16);
  default:
    for (int64_t i = 0; i < n; ++i)
      storeFromDouble(v, start + i, x[i]);
  }
}

void registerElementwiseKernels(Registry &r) {
  unaryNumeric(r, "ernie.neg", [](auto x) { return -x; });
  unaryNumeric(r, "ernie.abs", [](auto x) { return math::abs(x); });
  unaryNumeric(r, "ernie.relu", [](auto x) { return math::relu(x); });
  unaryFloat(r, "ernie.exp",
             [](auto x, const Attrs &) { return math::exponential(x); });
  unaryFloat(r, "ernie.log", [](auto x, const Attrs &) { return std::log(x); });
  unaryFloat(r, "ernie.sqrt", [](auto x, const Attrs &) { return std::sqrt(x); });
  unaryFloat(r, "ernie.rsqrt", [](auto x, const Attrs &) { return math::rsqrt(x); });
  unaryFloat(r, "ernie.tanh", [](auto x, const Attrs &) { return std::tanh(x); });
  unaryFloat(r, "ernie.erf", [](auto x, const Attrs &) { return std::erf(x); });
  unaryFloat(r, "ernie.reciprocal",
             [](auto x, const Attrs &) { return math::reciprocal(x); });
  unaryFloat(r, "ernie.sigmoid",
             [](auto x, const Attrs &) { return math::sigmoid(x); });
  unaryFloat(r, "ernie.silu", [](auto x, const Attrs &) { return math::silu(x); });
  unaryFloat(r, "ernie.gelu", [](auto x, const Attrs &attrs) {
    return math::gelu(x, attrs.getBool("approximate"));
  });

  binaryNumeric(r, "ernie.add", [](auto a, auto b) { return a + b; }, false);
  binaryNumeric(r, "ernie.sub", [](auto a, auto b) { return a - b; }, false);
  binaryNumeric(r, "ernie.mul", [](auto a, auto b) { return a * b; }, false);
  binaryNumeric(r, "ernie.div", [](auto a, auto b) {
    if constexpr (std::is_integral_v<decltype(a)>)
      return integerDivide(a, b);
    else
      return a / b;
  }, false);
  binaryNumeric(r, "ernie.maximum",
                [](auto a, auto b) { return maximumOf(a, b); }, false);
  binaryNumeric(r, "ernie.minimum",
                [](auto a, auto b) { return minimumOf(a, b); }, false);
  binaryNumeric(r, "ernie.pow", [](auto a, auto b) { return std::pow(a, b); },
                true);

  r.addForEveryType("ernie.compare", [](const std::vector<TensorView> &in,
                                        const std::vector<TensorView> &out,
                                        const Attrs &attrs) {
    expectCount(in, 2, "ernie.compare");
    int64_t direction = attrs.getInt("direction");
    if (direction < 0 || direction > 5)
      throw KernelError("unknown compare direction");
    uint8_t *y = out[0].as<uint8_t>();
    auto compare = [&](auto a, auto b) {
      return math::compare(direction, a, b);
    };
    // Integers compare exactly: doubles cannot tell 2^53 from 2^53 + 1.
    bool integers = !isFloat(in[0].type) && in[0].type != DType::I1;
    for (int64_t i = 0, n = in[0].numElements(); i < n; ++i)
      y[i] = integers ? compare(indexAt(in[0], i), indexAt(in[1], i))
                      : compare(loadAsDouble(in[0], i), loadAsDouble(in[1], i));
  });
  r.addForEveryType("ernie.select", [](const std::vector<TensorView> &in,
                                       const std::vector<TensorView> &out,
                                       const Attrs &) {
    expectCount(in, 3, "ernie.select");
    size_t bytes = byteSize(in[1].type);
    const uint8_t *c = in[0].as<uint8_t>();
    const char *a = in[1].as<char>(), *b = in[2].as<char>();
    char *y = out[0].as<char>();
    for (int64_t i = 0, n = in[0].numElements(); i < n; ++i)
      std::memcpy(y + i * bytes, (c[i] ? a : b) + i * bytes, bytes);
  });
  // Every float widens exactly to f64, so converting from there rounds
  // once; integers keep all 64 bits on their way.
  r.addForEveryType("ernie.cast", [](const std::vector<TensorView> &in,
                                     const std::vector<TensorView> &out,
                                     const Attrs &) {
    expectCount(in, 1, "ernie.cast");
    const TensorView &x = in[0];
    if (isFloat(x.type) && isFloat(out[0].type)) {
      double block[kDoubleBlock];
      for (int64_t start = 0, n = x.numElements(); start < n; start += kDoubleBlock) {
        int64_t m = std::min(kDoubleBlock, n - start);
        loadBlockAsDouble(x, start, m, block);
        storeBlockFromDouble(out[0], start, m, block);
      }
      return;
    }
    for (int64_t i = 0, n = x.numElements(); i < n; ++i) {
      if (isFloat(x.type))
        storeFromDouble(out[0], i, loadAsDouble(x, i));
      else if (x.type == DType::I1)
        storeFromInt(out[0], i, x.as<uint8_t>()[i] != 0);
      else
        storeFromInt(out[0], i, indexAt(x, i));
    }
  });
  auto copy = [](const std::vector<TensorView> &in,
                 const std::vector<TensorView> &out, const Attrs &) {
    if (out[0].data != in[0].data)
      std::memcpy(out[0].data, in[0].data,
                  in[0].numElements() * byteSize(in[0].type));
  };
  r.addForEveryType("ernie.stop_gradient", copy);
  r.addForEveryType("ernie.full", [](const std::vector<TensorView> &,
                                     const std::vector<TensorView> &out,
                                     const Attrs &attrs) {
    // The value once as the element type stores it, then copied bytewise.
    double value = attrs.getFloat("value", 0.0);
    const int64_t n = out[0].numElements();
    if (n == 0)
      return;
    storeFromDouble(out[0], 0, value);
    const size_t width = byteSize(out[0].type);
    char *y = out[0].as<char>();
    auto fill = [&](auto unit) {
      using U = decltype(unit);
      U bits;
      std::memcpy(&bits, y, sizeof bits);
      std::fill(reinterpret_cast<U *>(y), reinterpret_cast<U *>(y) + n, bits);
    };
    switch (width) {
    case 1: return fill(uint8_t{});
    case 2: return fill(uint16_t{});
    case 4: return fill(uint32_t{});
    default: return fill(uint64_t{});
    }
  });
  r.addForEveryType("ernie.iota", [](const std::vector<TensorView> &,
                                     const std::vector<TensorView> &out,
                                     const Attrs &attrs) {
    int64_t dim = attrs.getInt("dimension");
    const auto &shape = out[0].shape;
    if (dim < 0 || dim >= out[0].rank())
      throw KernelError("iota dimension out of range");
    int64_t inner = 1;
    for (int64_t d = dim + 1; d < out[0].rank(); ++d)
      inner *= shape[d];
    for (int64_t i = 0, n = out[0].numElements(); i < n; ++i)
      storeFromDouble(out[0], i, static_cast<double>((i / inner) % shape[dim]));
  });
}

} // namespace ernie::runtime::cpu

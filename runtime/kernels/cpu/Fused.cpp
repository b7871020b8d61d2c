//===- Fused.cpp - the CPU interpreter of ernie.fused loops -----------------===//
//
// A fused body is compiled once, when the program loads, into
//  - loads: an input (or a broadcast of one) read into a chunk register,
//  - steps: an op over chunk registers (the same math as its own kernel,
//    ElementwiseMath.h, in f32 — or f64 for f64 regions),
//  - stores and reductions: a register written to a result, or accumulated
//    into one along the reduced dimensions,
// and one strided space over the iteration shape in which every load,
// store and reduction has its element strides (0 where a broadcast or a
// reduction stands still). A call walks that space a row at a time, kChunk
// elements at once: each input is read and each result written once, and
// the intermediates live only in the registers (kChunk elements each).
//
// Bit for bit: every step computes what its op's kernel computes on f32
// (f64) elements, and a reduction adds its terms in increasing input index
// into an accumulator of the compute type, as the reduce kernel does. What
// differs from the unfused ops is only that narrow floats (bf16, f16, fp8)
// are not rounded between steps: a region rounds where it writes.
//
//===----------------------------------------------------------------------===//

#include "kernels/common/ElementwiseMath.h"
#include "kernels/common/FusedProgram.h"
#include "kernels/common/Registry.h"
#include "kernels/common/Strided.h"

#include "ernie/runtime/FloatConvert.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

namespace ernie::runtime {

namespace {

using cpu::DynamicStridedSpace;
using cpu::stridesOf;
using namespace fused;

/// Elements per chunk register: a region's registers stay in L1/L2.
constexpr int64_t kChunk = 1024;

struct OpInfo {
  const char *name;
  Code code;
  int operands;
};

constexpr OpInfo kOps[] = {
    {"ernie.neg", Code::Neg, 1},         {"ernie.exp", Code::Exp, 1},
    {"ernie.log", Code::Log, 1},         {"ernie.sqrt", Code::Sqrt, 1},
    {"ernie.rsqrt", Code::Rsqrt, 1},     {"ernie.tanh", Code::Tanh, 1},
    {"ernie.sigmoid", Code::Sigmoid, 1}, {"ernie.silu", Code::Silu, 1},
    {"ernie.relu", Code::Relu, 1},       {"ernie.abs", Code::Abs, 1},
    {"ernie.reciprocal", Code::Reciprocal, 1},
    {"ernie.erf", Code::Erf, 1},         {"ernie.gelu", Code::Gelu, 1},
    {"ernie.stop_gradient", Code::Copy, 1},
    {"ernie.cast", Code::Cast, 1},       {"ernie.add", Code::Add, 2},
    {"ernie.sub", Code::Sub, 2},         {"ernie.mul", Code::Mul, 2},
    {"ernie.div", Code::Div, 2},         {"ernie.maximum", Code::Maximum, 2},
    {"ernie.minimum", Code::Minimum, 2}, {"ernie.pow", Code::Pow, 2},
    {"ernie.compare", Code::Compare, 2}, {"ernie.select", Code::Select, 3},
    {"ernie.full", Code::Fill, 0},
};

[[noreturn]] void bad(const std::string &what) { throw KernelError(what); }

const OpInfo *opInfo(const std::string &name) {
  for (const OpInfo &info : kOps)
    if (name == info.name)
      return &info;
  return nullptr;
}

/// `x` after a cast to `type` and back to the compute type: casts inside a
/// region round as the user asked, wherever they are.
template <typename T> T roundTo(DType type, T x) {
  switch (type) {
  case DType::F64: return static_cast<T>(static_cast<double>(x));
  case DType::F32: return static_cast<T>(static_cast<float>(x));
  case DType::BF16: return static_cast<T>(bf16ToFloat(doubleToBf16(x)));
  case DType::F16: return static_cast<T>(f16ToFloat(doubleToF16(x)));
  case DType::F8E4M3FN:
    return static_cast<T>(f8E4M3FNToFloat(doubleToF8E4M3FN(x)));
  case DType::F8E5M2: return static_cast<T>(f8E5M2ToFloat(doubleToF8E5M2(x)));
  case DType::I1: return x != T(0) ? T(1) : T(0);
  default: return x;
  }
}

Compiled compile(const FusedBody &body) {
  if (body.inputs > body.values.size())
    bad("a fused body has fewer values than inputs");
  Compiled c;
  // The iteration shape: the widest value's, on a tie an op's over an
  // input, the first op's among ops (as ernie.fused defines it).
  const std::vector<int64_t> *shape = nullptr;
  bool input = false;
  for (size_t i = 0; i < body.values.size(); ++i) {
    const FusedValue &v = body.values[i];
    bool isInput = i < body.inputs;
    if (!shape || elementCount(v.shape) > elementCount(*shape) ||
        (elementCount(v.shape) == elementCount(*shape) && input && !isInput)) {
      shape = &v.shape;
      input = isInput;
    }
  }
  if (!shape)
    bad("a fused body has no values");
  const std::vector<int64_t> iteration = *shape;
  bool narrowOrF32 = false;
  for (const FusedValue &v : body.values) {
    if (v.type == DType::F64)
      c.f64 = true;
    else if (isFloat(v.type))
      narrowOrF32 = true;
    else if (v.type != DType::I1)
      bad(std::string("a fused body computes on ") + std::string(name(v.type)) +
          ": only floats and i1 masks are fused");
  }
  if (c.f64 && narrowOrF32)
    bad("a fused body mixes f64 with narrower floats");

  constexpr uint32_t kNone = ~0u;
  std::vector<uint32_t> reg(body.values.size(), kNone);
  // Reductions: value -> (the register reduced, its kind, axes, keepdim).
  struct Reduced {
    uint32_t reg;
    Reduction kind;
    std::vector<int64_t> axes;
  };
  std::vector<std::unique_ptr<Reduced>> reduced(body.values.size());
  std::vector<std::vector<int64_t>> strides; // per space operand
  auto newRegister = [&](uint32_t value) {
    reg[value] = static_cast<uint32_t>(c.registers++);
    return reg[value];
  };
  auto isInput = [&](uint32_t v) { return v < body.inputs; };
  // An input read whole gets its register on first use.
  auto registerOf = [&](uint32_t v) -> uint32_t {
    if (v >= body.values.size())
      bad("a fused step reads value " + std::to_string(v) +
          ", which does not exist");
    if (reg[v] != kNone)
      return reg[v];
    if (reduced[v])
      bad("a fused step reads a reduction's result: reductions end a region");
    if (!isInput(v))
      bad("a fused step reads value " + std::to_string(v) +
          " before it is computed");
    if (body.values[v].shape != iteration)
      bad("fused input " + std::to_string(v) +
          " is read without a broadcast but does not have the iteration shape");
    c.loads.push_back({v, newRegister(v), body.values[v].type});
    strides.push_back(stridesOf(iteration));
    return reg[v];
  };

  uint32_t next = static_cast<uint32_t>(body.inputs);
  for (const FusedStep &s : body.steps) {
    if (s.results.size() != 1 || s.results[0] != next)
      bad("fused step '" + s.op + "' must define value " +
          std::to_string(next) + " and nothing else");
    if (next >= body.values.size())
      bad("fused step '" + s.op + "' defines a value the body does not list");
    const uint32_t out = next++;
    const FusedValue &result = body.values[out];
    if (s.op == "ernie.reduce_sum" || s.op == "ernie.reduce_mean" ||
        s.op == "ernie.reduce_max") {
      if (s.operands.size() != 1)
        bad(s.op + " takes one operand");
      auto r = std::make_unique<Reduced>();
      r->reg = registerOf(s.operands[0]);
      r->kind = s.op == "ernie.reduce_sum"    ? Reduction::Sum
                : s.op == "ernie.reduce_mean" ? Reduction::Mean
                                              : Reduction::Max;
      r->axes = s.attrs.getInts("axes");
      std::vector<bool> seen(iteration.size(), false);
      std::vector<int64_t> kept;
      for (int64_t a : r->axes) {
        if (a < 0 || a >= static_cast<int64_t>(iteration.size()) || seen[a])
          bad(s.op + ": reduction axes must be distinct dimensions of the "
                     "iteration shape");
        seen[a] = true;
      }
      for (size_t d = 0; d < iteration.size(); ++d)
        if (!seen[d] || s.attrs.getBool("keepdim"))
          kept.push_back(seen[d] ? 1 : iteration[d]);
      if (kept != result.shape)
        bad(s.op + ": the result's shape does not follow from its axes");
      reduced[out] = std::move(r);
      continue;
    }
    if (s.op == "ernie.broadcast") {
      if (s.operands.size() != 1 || !isInput(s.operands[0]))
        bad("a fused broadcast reads one of the region's inputs");
      const FusedValue &in = body.values[s.operands[0]];
      std::vector<int64_t> dims = s.attrs.getInts("dims");
      if (result.shape != iteration || dims.size() != in.shape.size())
        bad("a fused broadcast must produce the iteration shape");
      std::vector<int64_t> from(iteration.size(), 0), own = stridesOf(in.shape);
      for (size_t k = 0; k < dims.size(); ++k) {
        int64_t d = dims[k];
        if (d < 0 || d >= static_cast<int64_t>(iteration.size()) ||
            (k && d <= dims[k - 1]) ||
            (in.shape[k] != 1 && in.shape[k] != iteration[d]))
          bad("a fused broadcast's dims do not map its input");
        from[d] = in.shape[k] == 1 ? 0 : own[k];
      }
      if (result.type != in.type)
        bad("a fused broadcast keeps its input's element type");
      c.loads.push_back({s.operands[0], newRegister(out), in.type});
      strides.push_back(std::move(from));
      continue;
    }
    const OpInfo *info = opInfo(s.op);
    if (!info)
      bad("'" + s.op + "' cannot be part of a fused body");
    if (s.operands.size() != size_t(info->operands))
      bad(s.op + " takes " + std::to_string(info->operands) + " operand(s)");
    if (result.shape != iteration)
      bad(s.op + ": a fused value off the iteration shape");
    Step step{info->code};
    uint32_t *operandRegs[] = {&step.a, &step.b, &step.c};
    for (size_t k = 0; k < s.operands.size(); ++k)
      *operandRegs[k] = registerOf(s.operands[k]);
    switch (info->code) {
    case Code::Gelu:
      if (s.attrs.getBool("approximate"))
        step.code = Code::GeluTanh;
      break;
    case Code::Cast:
      step.to = result.type;
      break;
    case Code::Compare:
      step.direction = s.attrs.getInt("direction");
      if (step.direction < 0 || step.direction > 5)
        bad("unknown compare direction");
      break;
    case Code::Fill: {
      // The value as the fill kernel stores it, then widened.
      double stored = s.attrs.getFloat("value", 0.0);
      step.fill = roundTo<double>(result.type, stored);
      break;
    }
    default:
      break;
    }
    step.out = newRegister(out);
    c.steps.push_back(step);
  }
  if (next != body.values.size())
    bad("a fused body lists values no step defines");

  // Results: stores, then reductions into their outputs.
  for (size_t k = 0; k < body.yields.size(); ++k) {
    uint32_t v = body.yields[k];
    if (v >= body.values.size())
      bad("a fused body yields a value that does not exist");
    Store store{0, static_cast<uint32_t>(k), body.values[v].type};
    if (const Reduced *r = reduced[v].get()) {
      store.reg = r->reg;
      store.reduces = true;
      store.kind = r->kind;
      std::vector<int64_t> kept = iteration;
      for (int64_t a : r->axes) {
        store.count *= iteration[a];
        kept[a] = 1;
      }
      store.elements = elementCount(kept);
      store.accumulator = c.accumulators;
      c.accumulators += store.elements;
      std::vector<int64_t> to = stridesOf(kept);
      for (int64_t a : r->axes)
        to[a] = 0;
      strides.push_back(std::move(to));
    } else {
      store.reg = registerOf(v);
      strides.push_back(stridesOf(iteration));
    }
    c.stores.push_back(store);
  }
  c.space.shape = iteration;
  c.space.strides = std::move(strides);
  c.space.simplify();
  return c;
}

/// n elements of `type` at `src` (every `step`th) widened into `dst`.
template <typename T>
void load(DType type, const void *src, int64_t step, int64_t n, T *dst) {
  auto widen = [&](auto *p, auto convert) {
    if (step == 0) {
      std::fill(dst, dst + n, static_cast<T>(convert(p[0])));
      return;
    }
    for (int64_t j = 0; j < n; ++j)
      dst[j] = static_cast<T>(convert(p[j * step]));
  };
  auto same = [](auto x) { return x; };
  switch (type) {
  case DType::F64: return widen(static_cast<const double *>(src), same);
  case DType::F32:
    if constexpr (std::is_same_v<T, float>)
      if (step == 1) {
        std::memcpy(dst, src, n * sizeof(float));
        return;
      }
    return widen(static_cast<const float *>(src), same);
  case DType::BF16: return widen(static_cast<const uint16_t *>(src), bf16ToFloat);
  case DType::F16: return widen(static_cast<const uint16_t *>(src), f16ToFloat);
  case DType::F8E4M3FN:
    return widen(static_cast<const uint8_t *>(src), f8E4M3FNToFloat);
  case DType::F8E5M2:
    return widen(static_cast<const uint8_t *>(src), f8E5M2ToFloat);
  case DType::I1:
    return widen(static_cast<const uint8_t *>(src),
                 [](uint8_t b) { return b ? 1.0f : 0.0f; });
  default: bad("a fused load of a type it does not compute on");
  }
}

/// n elements of `src` rounded (once) into `type` at `dst`, every `step`th.
template <typename T>
void store(DType type, const T *src, int64_t n, void *dst, int64_t step) {
  auto narrow = [&](auto *p, auto convert) {
    for (int64_t j = 0; j < n; ++j)
      p[j * step] = convert(src[j]);
  };
  switch (type) {
  case DType::F64:
    return narrow(static_cast<double *>(dst), [](T x) { return double(x); });
  case DType::F32:
    if constexpr (std::is_same_v<T, float>)
      if (step == 1) {
        std::memcpy(dst, src, n * sizeof(float));
        return;
      }
    return narrow(static_cast<float *>(dst), [](T x) { return float(x); });
  case DType::BF16: return narrow(static_cast<uint16_t *>(dst), doubleToBf16);
  case DType::F16: return narrow(static_cast<uint16_t *>(dst), doubleToF16);
  case DType::F8E4M3FN:
    return narrow(static_cast<uint8_t *>(dst), doubleToF8E4M3FN);
  case DType::F8E5M2: return narrow(static_cast<uint8_t *>(dst), doubleToF8E5M2);
  case DType::I1:
    return narrow(static_cast<uint8_t *>(dst),
                  [](T x) { return uint8_t(x != T(0)); });
  default: bad("a fused store of a type it does not compute on");
  }
}

/// One step over n elements: operands through `at` (a register, or the
/// input itself where it is read in place), the result into its register.
/// Built for AVX-512, AVX2 and the baseline (the loader picks the CPU's);
/// no FMA contraction, so every build computes the per-op kernels' bits.
template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default"),
               optimize("fp-contract=off"))) void
run(const Step &s, const T *const *at, T *regs, int64_t n) {
  T *y = regs + s.out * kChunk;
  const T *a = at[s.a], *b = at[s.b], *c = at[s.c];
  auto unary = [&](auto fn) {
    for (int64_t j = 0; j < n; ++j)
      y[j] = fn(a[j]);
  };
  auto binary = [&](auto fn) {
    for (int64_t j = 0; j < n; ++j)
      y[j] = fn(a[j], b[j]);
  };
  namespace m = cpu::math;
  switch (s.code) {
  case Code::Neg: return unary([](T x) { return -x; });
  case Code::Exp: return unary([](T x) { return m::exponential(x); });
  case Code::Log: return unary([](T x) { return std::log(x); });
  case Code::Sqrt: return unary([](T x) { return std::sqrt(x); });
  case Code::Rsqrt: return unary([](T x) { return m::rsqrt(x); });
  case Code::Tanh: return unary([](T x) { return std::tanh(x); });
  case Code::Sigmoid: return unary([](T x) { return m::sigmoid(x); });
  case Code::Silu: return unary([](T x) { return m::silu(x); });
  case Code::Relu: return unary([](T x) { return m::relu(x); });
  case Code::Abs: return unary([](T x) { return m::abs(x); });
  case Code::Reciprocal: return unary([](T x) { return m::reciprocal(x); });
  case Code::Erf: return unary([](T x) { return std::erf(x); });
  case Code::Gelu: return unary([](T x) { return m::gelu(x, false); });
  case Code::GeluTanh: return unary([](T x) { return m::gelu(x, true); });
  case Code::Copy: return unary([](T x) { return x; });
  case Code::Cast: {
    DType to = s.to;
    return unary([to](T x) { return roundTo(to, x); });
  }
  case Code::Add: return binary([](T p, T q) { return p + q; });
  case Code::Sub: return binary([](T p, T q) { return p - q; });
  case Code::Mul: return binary([](T p, T q) { return p * q; });
  case Code::Div: return binary([](T p, T q) { return p / q; });
  case Code::Maximum: return binary([](T p, T q) { return maximumOf(p, q); });
  case Code::Minimum: return binary([](T p, T q) { return minimumOf(p, q); });
  case Code::Pow: return binary([](T p, T q) { return std::pow(p, q); });
  case Code::Compare: {
    int64_t d = s.direction;
    return binary([d](T p, T q) { return m::compare(d, p, q) ? T(1) : T(0); });
  }
  case Code::Select:
    for (int64_t j = 0; j < n; ++j)
      y[j] = a[j] != T(0) ? b[j] : c[j];
    return;
  case Code::Fill:
    std::fill(y, y + n, static_cast<T>(s.fill));
    return;
  }
}

/// Adds (or takes the maximum of) n register elements into the
/// accumulators at `acc`, every `step`th, in order.
template <typename T>
void accumulate(Reduction kind, const T *x, int64_t n, T *acc, int64_t step) {
  const bool max = kind == Reduction::Max;
  if (step == 0) {
    T sum = *acc;
    for (int64_t j = 0; j < n; ++j)
      sum = max ? maximumOf(sum, x[j]) : sum + x[j];
    *acc = sum;
    return;
  }
  for (int64_t j = 0; j < n; ++j) {
    T &y = acc[j * step];
    y = max ? maximumOf(y, x[j]) : y + x[j];
  }
}

template <typename T>
void execute(const Compiled &c, const std::vector<TensorView> &in,
             const std::vector<TensorView> &out) {
  // Registers and accumulators, reused by every call on this thread. A
  // register is read through `at`: its own storage, or for an input read
  // contiguously in the compute type the input's memory (no copy).
  thread_local std::vector<T> registers, accumulators;
  thread_local std::vector<const T *> at;
  if (registers.size() < c.registers * kChunk)
    registers.resize(c.registers * kChunk);
  T *regs = registers.data();
  if (at.size() < c.registers)
    at.resize(c.registers);
  for (size_t r = 0; r < c.registers; ++r)
    at[r] = regs + r * kChunk;
  constexpr DType compute = std::is_same_v<T, float> ? DType::F32 : DType::F64;
  // Reductions accumulate in the compute type, one run per reduction.
  if (accumulators.size() < c.accumulators)
    accumulators.resize(c.accumulators);
  for (const Store &s : c.stores)
    if (s.reduces) {
      T init = s.kind == Reduction::Max ? -std::numeric_limits<T>::infinity()
                                        : T(0);
      std::fill_n(accumulators.data() + s.accumulator, s.elements, init);
    }
  const size_t loads = c.loads.size();
  c.space.forEachRow([&](const std::vector<int64_t> &offsets, int64_t length,
                         const std::vector<int64_t> &step) {
    for (int64_t start = 0; start < length; start += kChunk) {
      const int64_t n = std::min(kChunk, length - start);
      for (size_t k = 0; k < loads; ++k) {
        const Load &l = c.loads[k];
        const TensorView &v = in[l.input];
        const char *base = static_cast<const char *>(v.data) +
                           (offsets[k] + start * step[k]) * byteSize(l.type);
        if (l.type == compute && step[k] == 1) {
          at[l.reg] = reinterpret_cast<const T *>(base);
          continue;
        }
        load(l.type, base, step[k], n, regs + l.reg * kChunk);
      }
      for (const Step &s : c.steps)
        run(s, at.data(), regs, n);
      for (size_t k = 0; k < c.stores.size(); ++k) {
        const Store &s = c.stores[k];
        const int64_t offset = offsets[loads + k] + start * step[loads + k];
        if (s.reduces) {
          accumulate(s.kind, at[s.reg], n,
                     accumulators.data() + s.accumulator + offset,
                     step[loads + k]);
          continue;
        }
        char *base = static_cast<char *>(out[s.output].data) +
                     offset * byteSize(s.type);
        store(s.type, at[s.reg], n, base, step[loads + k]);
      }
    }
  });
  for (const Store &s : c.stores) {
    if (!s.reduces)
      continue;
    T *acc = accumulators.data() + s.accumulator;
    const int64_t n = s.elements;
    if (s.kind == Reduction::Mean)
      for (int64_t j = 0; j < n; ++j)
        acc[j] /= static_cast<T>(s.count);
    store(s.type, acc, n, out[s.output].data, 1);
  }
}

} // namespace

fused::Compiled fused::compileFused(const FusedBody &body) {
  return compile(body);
}

Kernel makeCpuFusedKernel(const FusedBody &body) {
  auto compiled = std::make_shared<const Compiled>(compile(body));
  const size_t inputs = body.inputs, outputs = body.yields.size();
  return [compiled, inputs, outputs](const std::vector<TensorView> &in,
                                     const std::vector<TensorView> &out,
                                     const Attrs &) {
    if (in.size() != inputs || out.size() != outputs)
      throw KernelError("a fused loop got the wrong number of buffers");
    if (compiled->f64)
      execute<double>(*compiled, in, out);
    else
      execute<float>(*compiled, in, out);
  };
}

} // namespace ernie::runtime

//===- Kernel.cpp - attributes and the CPU kernel table ---------------------===//

#include "ernie/runtime/Kernel.h"

#include "ernie/runtime/FloatConvert.h"

#include "kernels/common/Registry.h"

#include <algorithm>

namespace ernie::runtime {

const Attrs::Value &Attrs::at(const std::string &name) const {
  auto it = values_.find(name);
  if (it == values_.end())
    throw KernelError("missing attribute '" + name + "'");
  return it->second;
}

int64_t Attrs::getInt(const std::string &name) const {
  const Value &v = at(name);
  if (auto *i = std::get_if<int64_t>(&v))
    return *i;
  throw KernelError("attribute '" + name + "' is not an integer");
}

int64_t Attrs::getInt(const std::string &name, int64_t fallback) const {
  return has(name) ? getInt(name) : fallback;
}

double Attrs::getFloat(const std::string &name, double fallback) const {
  if (!has(name))
    return fallback;
  const Value &v = at(name);
  if (auto *d = std::get_if<double>(&v))
    return *d;
  if (auto *i = std::get_if<int64_t>(&v))
    return static_cast<double>(*i);
  if (auto *b = std::get_if<bool>(&v)) // an i1 fill value
    return *b ? 1.0 : 0.0;
  throw KernelError("attribute '" + name + "' is not a number");
}

bool Attrs::getBool(const std::string &name) const {
  if (!has(name))
    return false;
  const Value &v = at(name);
  if (auto *b = std::get_if<bool>(&v))
    return *b;
  throw KernelError("attribute '" + name + "' is not a flag");
}

std::vector<int64_t> Attrs::getInts(const std::string &name) const {
  const Value &v = at(name);
  if (auto *list = std::get_if<std::vector<int64_t>>(&v))
    return *list;
  throw KernelError("attribute '" + name + "' is not a list of integers");
}

std::string Attrs::getString(const std::string &name,
                             const std::string &fallback) const {
  if (!has(name))
    return fallback;
  const Value &v = at(name);
  if (auto *s = std::get_if<std::string>(&v))
    return *s;
  throw KernelError("attribute '" + name + "' is not a string");
}

/// `kernel` for buffers of any float type: f16, bf16 and fp8 inputs are
/// widened (exactly) to f32 copies, the kernel computes in f32, and each
/// narrow output is rounded once from its f32 result. Integer, i1, f32 and
/// f64 buffers pass through as they are (topk's i64 indices, say).
static Kernel computeNarrowInF32(Kernel kernel) {
  return [kernel = std::move(kernel)](const std::vector<TensorView> &in,
                                      const std::vector<TensorView> &out,
                                      const Attrs &attrs) {
    auto narrow = [](const TensorView &v) { return isNarrowFloat(v.type); };
    if (std::none_of(in.begin(), in.end(), narrow) &&
        std::none_of(out.begin(), out.end(), narrow))
      return kernel(in, out, attrs);
    // Every input is read before any output is written back, so an output
    // that aliases an input (an in-place update) stays correct.
    std::vector<std::vector<float>> wide;
    wide.reserve(in.size() + out.size());
    auto widened = [&](const TensorView &v, bool read) {
      if (!narrow(v))
        return v;
      std::vector<float> &copy = wide.emplace_back(v.numElements());
      if (read)
        narrowToFloat(v.type, v.data, copy.data(), v.numElements());
      return TensorView{copy.data(), DType::F32, v.shape};
    };
    std::vector<TensorView> wideIn, wideOut;
    for (const TensorView &v : in)
      wideIn.push_back(widened(v, true));
    for (const TensorView &v : out)
      wideOut.push_back(widened(v, false));
    kernel(wideIn, wideOut, attrs);
    for (size_t i = 0; i < out.size(); ++i)
      if (narrow(out[i]))
        floatToNarrow(out[i].type, wideOut[i].as<float>(), out[i].data,
                      out[i].numElements());
  };
}

static const cpu::Registry &cpuRegistry() {
  static const cpu::Registry registry = [] {
    cpu::Registry r;
    cpu::registerElementwiseKernels(r);
    cpu::registerLinalgKernels(r);
    cpu::registerShapeKernels(r);
    cpu::registerMoeKernels(r);
    cpu::registerIndexingKernels(r);
    cpu::registerTransformerKernels(r);
    cpu::registerOptimizerKernels(r);
    for (auto &[op, kernel] : r)
      if (!r.everyType.count(op))
        kernel = computeNarrowInF32(std::move(kernel));
    return r;
  }();
  return registry;
}

const Kernel *findCpuKernel(std::string_view op) {
  const cpu::Registry &registry = cpuRegistry();
  auto it = registry.find(op);
  return it == registry.end() ? nullptr : &it->second;
}

std::vector<std::string> cpuKernelNames() {
  std::vector<std::string> names;
  for (const auto &[name, kernel] : cpuRegistry())
    names.push_back(name);
  return names;
}

} // namespace ernie::runtime

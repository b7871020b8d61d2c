//===- Kernel.cpp - attributes and the CPU kernel table ---------------------===//

#include "ernie/runtime/Kernel.h"

#include "../kernels/cpu/Registry.h"

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

static const cpu::Registry &cpuRegistry() {
  static const cpu::Registry registry = [] {
    cpu::Registry r;
    cpu::registerElementwiseKernels(r);
    cpu::registerLinalgKernels(r);
    cpu::registerShapeKernels(r);
    cpu::registerIndexingKernels(r);
    cpu::registerTransformerKernels(r);
    cpu::registerOptimizerKernels(r);
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

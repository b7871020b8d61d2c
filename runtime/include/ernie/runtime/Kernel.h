//===- Kernel.h - the kernels an executor dispatches to ----------*- C++ -*-===//
//
// A kernel computes one ernie op on local (per-rank) buffers: inputs and
// outputs are views of planned memory, attributes come from the program
// file. Kernels are found by op name ("ernie.matmul"); each backend (CPU
// now, CUDA later) registers its own table behind the same signature.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_KERNEL_H
#define ERNIE_RUNTIME_KERNEL_H

#include "ernie/runtime/DType.h"

#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace ernie::runtime {

/// The number of elements of a shape (1 for a scalar).
inline int64_t elementCount(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

/// A buffer and what it holds; row-major, contiguous.
struct TensorView {
  void *data = nullptr;
  DType type = DType::F32;
  std::vector<int64_t> shape;

  int64_t numElements() const { return elementCount(shape); }
  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  template <typename T> T *as() const { return static_cast<T *>(data); }
};

/// A kernel failed on its inputs (bad attributes, an index out of range):
/// the executor adds the rank and the instruction.
struct KernelError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// An op's attributes, as the program file carries them.
class Attrs {
public:
  using Value = std::variant<int64_t, double, bool, std::string,
                             std::vector<int64_t>>;
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<const std::string, Value>> values)
      : values_(values) {}

  void set(const std::string &name, Value value) { values_[name] = value; }
  bool has(const std::string &name) const { return values_.count(name); }
  int64_t getInt(const std::string &name) const;
  int64_t getInt(const std::string &name, int64_t fallback) const;
  double getFloat(const std::string &name, double fallback) const;
  bool getBool(const std::string &name) const; // absent: false
  std::vector<int64_t> getInts(const std::string &name) const;
  std::string getString(const std::string &name,
                        const std::string &fallback) const;

private:
  const Value &at(const std::string &name) const;
  std::map<std::string, Value> values_;
};

using Kernel = std::function<void(const std::vector<TensorView> &inputs,
                                  const std::vector<TensorView> &outputs,
                                  const Attrs &attrs)>;

/// The CPU kernel of `op`, or null when there is none.
/// It also takes f16, bf16 and fp8 buffers: they compute in f32 (widened
/// exactly) and each narrow result is rounded once, to nearest even (fp8
/// saturates); cast, creation, data movement and the optimizer updates handle
/// every type themselves (FloatConvert.h has the conversions).
const Kernel *findCpuKernel(std::string_view op);
/// Every op the CPU backend implements, sorted.
std::vector<std::string> cpuKernelNames();

/// The body of an "ernie.fused" instruction (the program file's FusedBody):
/// `values` are the body's tensors — the first `inputs` of them the
/// instruction's operands, then each step's results in turn — and `yields`
/// the values written to the instruction's results, in order.
struct FusedValue {
  DType type = DType::F32;
  std::vector<int64_t> shape;
};
struct FusedStep {
  std::string op;
  std::vector<uint32_t> operands, results; // indices into values
  Attrs attrs;
};
struct FusedBody {
  size_t inputs = 0;
  std::vector<FusedValue> values;
  std::vector<FusedStep> steps;
  std::vector<uint32_t> yields;
};

/// The CPU kernel of a fused body: one walk over its iteration shape, a
/// chunk of elements at a time, each input read and each result written
/// once (Fused.cpp). Throws KernelError when the body is not one a fused
/// region may be (an op it cannot hold, a value off the iteration shape,
/// f64 mixed with narrower floats): the loader reports that as a malformed
/// program.
Kernel makeCpuFusedKernel(const FusedBody &body);

/// Threads each GEMM may use (OpenBLAS). Ranks that share a process each
/// run their own GEMMs, so the default for them is one thread per rank:
/// OpenBLAS's own threads would oversubscribe the cores and serialize
/// concurrent calls on its internal lock.
void setCpuBlasThreads(int threads);

/// The GEMM library the CPU kernels call and the kernel family it picked
/// for this CPU, for banners and reports ("OpenBLAS 0.3.21 ... kernels
/// COOPERLAKE"). `warning` is non-empty when OpenBLAS chose by itself (no
/// OPENBLAS_CORETYPE) a family weaker than preferredGemmKernels() (it has
/// misdetected virtual CPUs as Prescott: SSE3 kernels, ~8x slower than its
/// AVX-512 ones; ernie-run and `import ernie` prevent that where they can).
struct GemmLibrary {
  std::string library; // "OpenBLAS 0.3.21 NO_AFFINITY ..." (its config)
  std::string kernels; // the core the kernels were chosen for
  std::string warning;
  std::string describe() const; // "<library>, <kernels> kernels"
};
GemmLibrary cpuGemmLibrary();

/// The OpenBLAS kernel family ernie runs on this CPU, chosen from its
/// features rather than its model number (which OpenBLAS 0.3.21 does not
/// know for recent CPUs, falling back to Haswell's or SSE3 kernels):
/// "Cooperlake" with AVX-512 BF16, "SkylakeX" with AVX-512, "Haswell" with
/// AVX2 and FMA; empty elsewhere (OpenBLAS's own choice stands).
std::string preferredGemmKernels();

/// For a program's main(): when OpenBLAS chose other kernels than
/// preferredGemmKernels() and OPENBLAS_CORETYPE is unset, re-executes the
/// program (argv as main got it) with the variable set — OpenBLAS reads it
/// only as it loads. Returns when nothing needs to change.
void chooseCpuGemmKernels(char **argv);

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_KERNEL_H

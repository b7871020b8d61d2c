//===- FusedProgram.h - an ernie.fused body lowered for interpretation -*- C++ -*-===//
//
// What Fused.cpp's compile step makes of a FusedBody: loads (an input, or a
// broadcast of one), steps over registers, stores and reductions, and one
// strided space over the iteration shape in which every load and store has
// its element strides. The CPU interpreter (Fused.cpp) walks it a chunk at a
// time; the CUDA interpreter (kernels/cuda/Kernels.cu) walks it an element
// per thread. One lowering, so both run the same program.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_KERNELS_CPU_FUSEDPROGRAM_H
#define ERNIE_RUNTIME_KERNELS_CPU_FUSEDPROGRAM_H

#include "kernels/common/Strided.h"

#include "ernie/runtime/Kernel.h"

#include <cstdint>
#include <vector>

namespace ernie::runtime::fused {

using cpu::DynamicStridedSpace;

enum class Code : uint8_t {
  Neg, Exp, Log, Sqrt, Rsqrt, Tanh, Sigmoid, Silu, Relu, Abs, Reciprocal, Erf,
  Gelu, GeluTanh, Copy, Cast, Add, Sub, Mul, Div, Maximum, Minimum, Pow,
  Compare, Select, Fill
};

enum class Reduction { Sum, Mean, Max };

struct Step {
  Code code;
  uint32_t out = 0, a = 0, b = 0, c = 0; // registers
  DType to = DType::F32;                 // casts: the type rounded to
  int64_t direction = 0;                 // compares
  double fill = 0;                       // fills, rounded to their type
};

/// An input read into a register; `operand` is its place in the space.
struct Load {
  uint32_t input, reg;
  DType type;
};

/// A register written to a result, or a reduction into one.
struct Store {
  uint32_t reg, output;
  DType type;
  bool reduces = false;
  Reduction kind = Reduction::Sum;
  int64_t count = 1;     // terms per reduced element (for the mean)
  int64_t elements = 0;  // reductions: the result's
  size_t accumulator = 0; // reductions: where its accumulators start
};

struct Compiled {
  bool f64 = false;
  size_t registers = 0;
  std::vector<Load> loads;   // space operands [0, loads)
  std::vector<Step> steps;
  std::vector<Store> stores; // space operands [loads, loads + stores)
  DynamicStridedSpace space;
  size_t accumulators = 0;   // elements of all reductions' accumulators
};

/// Validates and lowers `body`; throws KernelError when it is not one a
/// fused region may be.
Compiled compileFused(const FusedBody &body);

} // namespace ernie::runtime::fused

#endif // ERNIE_RUNTIME_KERNELS_CPU_FUSEDPROGRAM_H

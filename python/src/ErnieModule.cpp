//===- ErnieModule.cpp - the _ernie Python extension ---------------------===//
//
// What the pure-Python package stands on, one file per seam (Extension.h):
//   * Tracer.cpp: builds an ernie module op by op in C++ (Python never prints
//     MLIR text); every op is verified as it is created, so a bad call fails
//     at the Python line that made it; the module stays a handle;
//   * Compile.cpp: the training pipeline (TrainingPipelineOptions), the
//     program file and the plan report;
//   * Runtime.cpp: the runtime's in-process sessions over numpy arrays, the
//     float conversions, schedules, checkpoints and safetensors;
//   * Spmd.cpp: infer_spmd and the dims_mapping conversions.
// This file: the one context and the module.
//
//===----------------------------------------------------------------------===//

#include "Extension.h"

#include "ernie/InitAll.h"

namespace ernie_py {

/// One context for everything the extension builds: dialects are loaded
/// once, and modules from different tracers can meet in compile().
MLIRContext &context() {
  static MLIRContext *ctx = [] {
    DialectRegistry registry;
    ec::registerAllDialects(registry);
    auto *c = new MLIRContext(registry, MLIRContext::Threading::DISABLED);
    c->loadAllAvailableDialects();
    ec::registerAllPasses();
    return c;
  }();
  return *ctx;
}

} // namespace ernie_py

PYBIND11_MODULE(_ernie, m) {
  m.doc() = "ernie's C++ core: tracing, compilation and the runtime";
  ernie_py::bindTracer(m);
  ernie_py::bindCompile(m);
  ernie_py::bindRuntime(m);
  ernie_py::bindSpmd(m);
}

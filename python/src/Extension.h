//===- Extension.h - what the _ernie extension's files share ---*- C++ -*-===//
//
// The extension is split by the seams of the package it serves: Tracer.cpp
// (building IR from Python values; the module handle), Compile.cpp (the
// training pipeline's options, compile, the plan report, estimates),
// Runtime.cpp (sessions, program descriptions, schedules, checkpoints and
// weights over numpy) and Spmd.cpp (Paddle's infer_spmd). ErnieModule.cpp
// holds the one MLIR context and the module definition, which calls each
// file's bindings. Errors become Python exceptions carrying the MLIR
// diagnostics.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_PYTHON_EXTENSION_H
#define ERNIE_PYTHON_EXTENSION_H

#include "ernie/Dialect/Ernie/IR/ErnieDialect.h"
#include "ernie/Dialect/Ernie/IR/Sharding.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OperationSupport.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/Support/raw_ostream.h"

#include <string>
#include <utility>
#include <vector>

#include <pybind11/pybind11.h>

namespace ernie_py {

namespace py = pybind11;
namespace ec = mlir::ernie;
using namespace mlir;

/// Collects every diagnostic emitted while alive, for the exception text.
class DiagnosticCollector {
public:
  explicit DiagnosticCollector(MLIRContext *ctx)
      : handler(ctx, [this](Diagnostic &d) {
          llvm::raw_string_ostream os(text);
          if (!text.empty())
            os << "\n";
          os << d.getLocation() << ": " << d;
          for (Diagnostic &note : d.getNotes())
            os << "\n  note: " << note;
          return success();
        }) {}
  std::string take(const std::string &fallback) {
    return text.empty() ? fallback : text;
  }

private:
  std::string text;
  ScopedDiagnosticHandler handler;
};

/// One context for everything the extension builds: dialects are loaded
/// once, and modules from different tracers can meet in compile().
MLIRContext &context();

/// IR from Python values (Tracer.cpp): element types by their MLIR
/// spelling, tensor types, `#ernie.sharding` from per-dimension axes and
/// partials, and an op attribute from a Python value.
Type elementType(MLIRContext *ctx, const std::string &dtype);
std::string dtypeName(Type t);
RankedTensorType tensorType(MLIRContext *ctx, const std::vector<int64_t> &shape,
                            const std::string &dtype);
ec::ShardingAttr shardingAttr(MLIRContext *ctx, const std::string &mesh,
                              const std::vector<std::vector<std::string>> &dims,
                              const std::vector<std::pair<std::string, std::string>> &partials);
Attribute toAttribute(MLIRContext *ctx, StringRef name, py::handle value,
                      Type resultElement);

/// A module held in C++ (the traced IR, or a compiled one): Python keeps a
/// handle and the text exists only when asked for.
/// `module`'s text; with `debugInfo` its locations too (the tracer's user
/// source lines), so that parsing it again gives the same program.
inline std::string printModule(ModuleOp module, bool debugInfo) {
  std::string s;
  llvm::raw_string_ostream os(s);
  OpPrintingFlags flags;
  if (debugInfo)
    flags.enableDebugInfo(/*enable=*/true, /*prettyForm=*/false);
  module.print(os, flags);
  return s;
}

class PyModule {
public:
  explicit PyModule(OwningOpRef<ModuleOp> module) : module_(std::move(module)) {}

  ModuleOp get() const { return module_.get(); }
  std::string text(bool debugInfo) const { return printModule(get(), debugInfo); }

private:
  OwningOpRef<ModuleOp> module_;
};

/// Each file's part of the module.
void bindTracer(py::module_ &m);
void bindCompile(py::module_ &m);
void bindRuntime(py::module_ &m);
void bindSpmd(py::module_ &m);

} // namespace ernie_py

#endif // ERNIE_PYTHON_EXTENSION_H

//===- ErnieModule.cpp - the _ernie Python extension ---------------------===//
//
// What the pure-Python package stands on:
//   * Tracer: builds an ernie module op by op in C++ (Python never prints
//     MLIR text); every op is verified as it is created, so a bad call fails
//     at the Python line that made it;
//   * compile(): runs a pass pipeline (the same textual pipelines ernie-opt
//     takes) and writes the program file, returning its bytes;
//   * Session: the runtime's in-process sessions over numpy arrays;
//   * convert_float: the runtime's exact f32 <-> narrow float conversions;
//   * infer_spmd and the dims_mapping conversions of the sharding library;
//   * pipeline_schedule / simulate_pipeline: the runtime's schedule library
//     (PipelineSchedule.h), the orders a pipelined program runs and their
//     timing with given step costs.
// Errors become Python exceptions carrying the MLIR diagnostics.
//
//===----------------------------------------------------------------------===//

#include "ernie/Cost/CostModel.h"
#include "ernie/Dialect/Ernie/IR/ErnieDialect.h"
#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Dialect/Ernie/IR/Sharding.h"
#include "ernie/Export/MemoryPlan.h"
#include "ernie/Export/ProgramFile.h"
#include "ernie/InitAll.h"
#include "ernie/Sharding/BuildOp.h"
#include "ernie/Sharding/InferSpmd.h"
#include "ernie/runtime/Checkpoint.h"
#include "ernie/runtime/FloatConvert.h"
#include "ernie/runtime/PipelineSchedule.h"
#include "ernie/runtime/Safetensors.h"
#include "ernie/runtime/Session.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/AsmState.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <map>
#include <memory>
#include <tuple>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

namespace py = pybind11;
using namespace mlir;
namespace rt = ::ernie::runtime;
namespace ec = mlir::ernie;

namespace {

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

Type elementType(MLIRContext *ctx, const std::string &dtype) {
  Builder b(ctx);
  if (dtype == "f64") return b.getF64Type();
  if (dtype == "f32") return b.getF32Type();
  if (dtype == "f16") return b.getF16Type();
  if (dtype == "bf16") return b.getBF16Type();
  if (dtype == "f8E4M3FN") return b.getType<Float8E4M3FNType>();
  if (dtype == "f8E5M2") return b.getType<Float8E5M2Type>();
  if (dtype == "i64") return b.getI64Type();
  if (dtype == "i32") return b.getI32Type();
  if (dtype == "i1") return b.getI1Type();
  throw py::value_error("unknown dtype '" + dtype +
                        "' (f64, f32, f16, bf16, f8E4M3FN, f8E5M2, i64, i32, i1)");
}

std::string dtypeName(Type t) {
  std::string s;
  llvm::raw_string_ostream os(s);
  t.print(os);
  return s;
}

RankedTensorType tensorType(MLIRContext *ctx, const std::vector<int64_t> &shape,
                            const std::string &dtype) {
  for (int64_t d : shape)
    if (d < 0)
      throw py::value_error("shapes must be static and non-negative");
  return RankedTensorType::get(shape, elementType(ctx, dtype));
}

/// `#ernie.sharding` from per-dimension axis lists and (axis, kind) partials.
ec::ShardingAttr shardingAttr(MLIRContext *ctx, const std::string &mesh,
                                 const std::vector<std::vector<std::string>> &dims,
                                 const std::vector<std::pair<std::string, std::string>> &partials) {
  SmallVector<SmallVector<StringRef>> dimRefs;
  for (const auto &d : dims)
    dimRefs.emplace_back(d.begin(), d.end());
  SmallVector<std::pair<StringRef, ec::ReduceKind>> partialRefs;
  for (const auto &[axis, kind] : partials) {
    auto k = ec::symbolizeReduceKind(kind);
    if (!k)
      throw py::value_error("unknown reduce type '" + kind +
                            "' (sum, avg, max, min)");
    partialRefs.push_back({axis, *k});
  }
  // Names come from the user: a bad one is a ValueError, not an assertion.
  DiagnosticCollector diagnostics(ctx);
  ec::ShardingAttr sharding = ec::ShardingAttr::getCheckedFromNames(
      [&] { return emitError(UnknownLoc::get(ctx)); }, ctx,
      FlatSymbolRefAttr::get(ctx, mesh), dimRefs, partialRefs);
  if (!sharding)
    throw py::value_error(diagnostics.take("invalid sharding"));
  return sharding;
}

/// A Python value as the attribute an ernie op expects under `name`. The
/// dialect's attributes are few: flags (unit, except topk's `largest`),
/// i64 integers, f64 floats, i64 lists, enums by keyword, and fill values
/// typed like the result.
Attribute toAttribute(MLIRContext *ctx, StringRef name, py::handle value,
                      Type resultElement) {
  Builder b(ctx);
  if (py::isinstance<py::bool_>(value)) {
    bool flag = value.cast<bool>();
    if (name == "largest")
      return b.getBoolAttr(flag);
    return flag ? Attribute(b.getUnitAttr()) : Attribute();
  }
  if (name == "value" && resultElement &&
      (py::isinstance<py::int_>(value) || py::isinstance<py::float_>(value))) {
    if (auto ft = dyn_cast<FloatType>(resultElement))
      return b.getFloatAttr(ft, value.cast<double>());
    return b.getIntegerAttr(resultElement, value.cast<int64_t>());
  }
  if (py::isinstance<py::int_>(value))
    return b.getI64IntegerAttr(value.cast<int64_t>());
  if (py::isinstance<py::float_>(value))
    return b.getF64FloatAttr(value.cast<double>());
  if (py::isinstance<py::str>(value)) {
    std::string s = value.cast<std::string>();
    if (name == "reduction") {
      if (auto r = ec::symbolizeLossReduction(s))
        return ec::LossReductionAttr::get(ctx, *r);
      throw py::value_error("reduction must be none, mean or sum, not '" + s + "'");
    }
    if (name == "kind") {
      if (auto k = ec::symbolizeReduceKind(s))
        return ec::ReduceKindAttr::get(ctx, *k);
      throw py::value_error("kind must be sum, avg, max or min, not '" + s + "'");
    }
    if (name == "direction") {
      if (auto d = ec::symbolizeCompareDirection(s))
        return ec::CompareDirectionAttr::get(ctx, *d);
      throw py::value_error("direction must be eq, ne, lt, le, gt or ge, not '" + s + "'");
    }
    return b.getStringAttr(s);
  }
  if (name == "sharding" && py::isinstance<py::tuple>(value)) {
    auto [mesh, dims, partials] = value.cast<std::tuple<
        std::string, std::vector<std::vector<std::string>>,
        std::vector<std::pair<std::string, std::string>>>>();
    return shardingAttr(ctx, mesh, dims, partials);
  }
  if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value))
    return b.getDenseI64ArrayAttr(value.cast<std::vector<int64_t>>());
  if (py::isinstance<py::array>(value)) {
    // A constant's value: a contiguous numpy array of a supported dtype.
    auto array = py::array::ensure(value, py::array::c_style);
    std::string kind = py::str(array.dtype()).cast<std::string>();
    static const std::map<std::string, std::string> dtypes = {
        {"float64", "f64"}, {"float32", "f32"}, {"int64", "i64"}, {"int32", "i32"}};
    auto it = dtypes.find(kind);
    if (it == dtypes.end())
      throw py::value_error("constants must be float64, float32, int64 or int32, not " + kind);
    std::vector<int64_t> shape(array.shape(), array.shape() + array.ndim());
    auto type = tensorType(ctx, shape, it->second);
    ArrayRef<char> raw(static_cast<const char *>(array.data()), array.nbytes());
    return DenseElementsAttr::getFromRawBuffer(type, raw);
  }
  throw py::type_error("attribute '" + name.str() + "' has an unsupported value " +
                       py::repr(value).cast<std::string>());
}

class Tracer {
public:
  explicit Tracer(const std::string &function) : b_(&context()) {
    MLIRContext *ctx = &context();
    module_ = ModuleOp::create(UnknownLoc::get(ctx));
    b_.setInsertionPointToEnd(module_->getBody());
    fn_ = func::FuncOp::create(b_, UnknownLoc::get(ctx), function,
                               b_.getFunctionType({}, {}));
    entry_ = fn_.addEntryBlock();
    b_.setInsertionPointToEnd(entry_);
  }

  void setMesh(const std::string &name, const std::vector<std::string> &axes,
               const std::vector<int64_t> &sizes, bool evenSplits) {
    if (axes.size() != sizes.size() || axes.empty())
      throw py::value_error("a mesh needs one size per axis name");
    OpBuilder::InsertionGuard guard(b_);
    b_.setInsertionPointToStart(module_->getBody());
    SmallVector<StringRef> names(axes.begin(), axes.end());
    auto mesh = ec::MeshOp::create(b_, b_.getUnknownLoc(), name,
                                   b_.getStrArrayAttr(names),
                                   b_.getDenseI64ArrayAttr(sizes));
    if (evenSplits)
      mesh->setAttr(ec::kEvenSplitsAttrName, b_.getUnitAttr());
  }

  int argument(const std::vector<int64_t> &shape, const std::string &dtype,
               std::optional<std::string> param, py::object sharding,
               std::optional<std::vector<int64_t>> pipelineStages,
               std::optional<std::string> state) {
    if (param && state)
      throw py::value_error("an argument is a parameter or a state, not both");
    RankedTensorType type = tensorType(&context(), shape, dtype);
    Value v = entry_->addArgument(type, b_.getUnknownLoc());
    SmallVector<NamedAttribute> attrs;
    if (param)
      attrs.push_back(b_.getNamedAttr(ec::ErnieDialect::kParamAttrName,
                                      b_.getStringAttr(*param)));
    // State the forward updates by a rule of its own (finish's `updates`).
    if (state)
      attrs.push_back(b_.getNamedAttr(ec::ErnieDialect::kOptStateAttrName,
                                      b_.getStringAttr(*state)));
    if (!sharding.is_none()) {
      auto [mesh, dims, partials] = sharding.cast<std::tuple<
          std::string, std::vector<std::vector<std::string>>,
          std::vector<std::pair<std::string, std::string>>>>();
      attrs.push_back(b_.getNamedAttr(
          ec::kShardingAttrName,
          shardingAttr(&context(), mesh, dims, partials)));
    }
    if (pipelineStages) {
      // The virtual stages declared to hold this parameter (a
      // SharedLayerDesc's occurrences), sorted and distinct, as
      // --ernie-pipeline-split reads them.
      if (!param)
        throw py::value_error("pipeline_stages belongs to a parameter argument");
      std::vector<int64_t> stages = *pipelineStages;
      std::sort(stages.begin(), stages.end());
      stages.erase(std::unique(stages.begin(), stages.end()), stages.end());
      if (!stages.empty() && stages.front() < 0)
        throw py::value_error("pipeline_stages are virtual stage indices (>= 0)");
      attrs.push_back(b_.getNamedAttr(ec::ErnieDialect::kPipelineStagesAttrName,
                                      b_.getDenseI64ArrayAttr(stages)));
    }
    argAttrs_.push_back(b_.getDictionaryAttr(attrs));
    return add(v);
  }

  std::vector<int> op(const std::string &name, const std::vector<int> &operands,
                      py::dict attrs, py::object resultTypes,
                      const std::string &location) {
    MLIRContext *ctx = &context();
    Location loc = location.empty()
                       ? Location(UnknownLoc::get(ctx))
                       : Location(NameLoc::get(b_.getStringAttr(location)));
    std::optional<RegisteredOperationName> info =
        RegisteredOperationName::lookup(name, ctx);
    if (!info)
      throw py::value_error("unknown op '" + name + "'");
    SmallVector<Value> values;
    for (int id : operands)
      values.push_back(value(id));
    SmallVector<Type> types;
    if (!resultTypes.is_none())
      for (auto t : resultTypes.cast<std::vector<
               std::pair<std::vector<int64_t>, std::string>>>())
        types.push_back(tensorType(ctx, t.first, t.second));
    Type fillElement = types.empty() ? Type()
                                     : cast<RankedTensorType>(types[0]).getElementType();
    SmallVector<NamedAttribute> named;
    for (auto [key, v] : attrs) {
      std::string k = key.cast<std::string>();
      if (Attribute a = toAttribute(ctx, k, v, fillElement))
        named.push_back(b_.getNamedAttr(k, a));
    }
    DiagnosticCollector diagnostics(ctx);
    FailureOr<Operation *> op = ec::buildOp(
        b_, loc, name, values, b_.getDictionaryAttr(named), types);
    if (failed(op))
      throw py::value_error("'" + name + "': " +
                            diagnostics.take("invalid operands or attributes"));
    if (!layer_.empty())
      (*op)->setAttr(ec::ErnieDialect::kLayerAttrName, b_.getStringAttr(layer_));
    std::vector<int> ids;
    for (Value r : (*op)->getResults())
      ids.push_back(add(r));
    return ids;
  }

  /// The layer (`ernie.layer`) the ops recorded from now on belong to;
  /// empty: none. --ernie-recompute reads it.
  void setLayer(const std::string &name) { layer_ = name; }

  std::pair<std::vector<int64_t>, std::string> typeOf(int id) {
    auto t = cast<RankedTensorType>(value(id).getType());
    return {t.getShape().vec(), dtypeName(t.getElementType())};
  }

  /// Returns `results`; result i + 1 is the new value of state
  /// `updates[i]` (the loss comes first).
  void finish(const std::vector<int> &results,
              const std::vector<std::string> &updates) {
    if (updates.size() + 1 != results.size() && !(results.empty() && updates.empty()))
      throw py::value_error("finish: one state name per result after the first");
    SmallVector<Value> values;
    for (int id : results)
      values.push_back(value(id));
    func::ReturnOp::create(b_, b_.getUnknownLoc(), values);
    fn_.setType(b_.getFunctionType(entry_->getArgumentTypes(),
                                   ValueRange(values).getTypes()));
    fn_.setAllArgAttrs(argAttrs_);
    for (auto [i, name] : llvm::enumerate(updates))
      fn_.setResultAttr(i + 1, ec::ErnieDialect::kUpdatesAttrName,
                        b_.getStringAttr(name));
    DiagnosticCollector diagnostics(&context());
    if (failed(verify(*module_)))
      throw py::value_error(diagnostics.take("the traced module does not verify"));
  }

  std::string text() {
    std::string s;
    llvm::raw_string_ostream os(s);
    module_->print(os);
    return s;
  }

private:
  int add(Value v) {
    values_.push_back(v);
    return static_cast<int>(values_.size() - 1);
  }
  Value value(int id) {
    if (id < 0 || id >= static_cast<int>(values_.size()))
      throw py::value_error("unknown value handle " + std::to_string(id));
    return values_[id];
  }

  OpBuilder b_;
  OwningOpRef<ModuleOp> module_;
  func::FuncOp fn_;
  Block *entry_ = nullptr;
  std::string layer_;
  std::vector<Value> values_;
  SmallVector<DictionaryAttr> argAttrs_;
};

/// Runs `pipeline` (ernie-opt's textual syntax) over the module in `text`;
/// returns the compiled module's text and its program file.
/// Runs `pipeline` over `text`: (the module's text, its program file when
/// `writeProgram`, {function: activation bytes} — what its memory plan
/// keeps live from the forward into the backward, for the plan report).
std::tuple<std::string, py::bytes, py::dict>
compileModule(const std::string &text, const std::string &pipeline,
              bool writeProgram) {
  MLIRContext *ctx = &context();
  DiagnosticCollector diagnostics(ctx);
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(text, ctx);
  if (!module)
    throw py::value_error(diagnostics.take("cannot parse the module"));
  if (!pipeline.empty()) {
    // The textual form anchors itself: "builtin.module(pass, ...)".
    std::string error;
    llvm::raw_string_ostream errs(error);
    FailureOr<OpPassManager> parsed = parsePassPipeline(pipeline, errs);
    if (failed(parsed))
      throw py::value_error("bad pipeline '" + pipeline + "': " + error);
    PassManager pm(ctx, parsed->getOpAnchorName());
    static_cast<OpPassManager &>(pm) = std::move(*parsed);
    if (failed(pm.run(*module)))
      throw py::value_error(diagnostics.take("compilation failed"));
  }
  std::string out;
  llvm::raw_string_ostream os(out);
  module->print(os);
  std::string program;
  py::dict activations;
  if (writeProgram) {
    llvm::raw_string_ostream ps(program);
    if (failed(ec::writeProgramFile(*module, ps)))
      throw py::value_error(diagnostics.take("cannot write the program file"));
    // The writer planned every function; so did this, and it is cheap next
    // to parsing and printing the module again for the report.
    for (auto fn : module->getOps<func::FuncOp>()) {
      if (fn.isExternal())
        continue;
      FailureOr<ec::MemoryPlan> plan = ec::planMemory(fn);
      if (succeeded(plan) && plan->activationBytes)
        activations[py::str(fn.getName().str())] = plan->activationBytes;
    }
  }
  return {out, py::bytes(program), activations};
}

/// The cost model's estimate of one step of a compiled module on a cluster
/// (JSON text; a "device" string is a file relative to `deviceDir`), as the
/// JSON text --ernie-step-cost writes.
std::string estimateStep(const std::string &text, const std::string &cluster,
                         const std::string &where,
                         const std::string &deviceDir) {
  MLIRContext *ctx = &context();
  DiagnosticCollector diagnostics(ctx);
  llvm::Expected<llvm::json::Value> json = llvm::json::parse(cluster);
  if (!json)
    throw py::value_error(where + ": not JSON: " +
                          llvm::toString(json.takeError()));
  llvm::Expected<ec::cost::ClusterSpec> spec =
      ec::cost::readCluster(*json, where, deviceDir);
  if (!spec)
    throw py::value_error(llvm::toString(spec.takeError()));
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(text, ctx);
  if (!module)
    throw py::value_error(diagnostics.take("cannot parse the module"));
  FailureOr<ec::cost::StepCost> step = ec::cost::estimateStep(*module, *spec);
  if (failed(step))
    throw py::value_error(diagnostics.take("cannot estimate the step"));
  std::string out;
  llvm::raw_string_ostream os(out);
  os << ec::cost::toJSON(*step);
  return out;
}

//===----------------------------------------------------------------------===//
// The runtime over numpy.
//===----------------------------------------------------------------------===//

const char *numpyDtype(rt::DType t) {
  switch (t) {
  case rt::DType::F64: return "float64";
  case rt::DType::F32: return "float32";
  case rt::DType::F16: return "float16";
  case rt::DType::BF16: return "uint16"; // raw bits
  case rt::DType::F8E4M3FN:
  case rt::DType::F8E5M2: return "uint8"; // raw bits
  case rt::DType::I64: return "int64";
  case rt::DType::I32: return "int32";
  case rt::DType::I1: return "bool";
  }
  return "";
}

rt::HostTensor fromNumpy(py::handle object) {
  auto array = py::array::ensure(object, py::array::c_style);
  if (!array)
    throw py::type_error("expected a numpy array");
  std::string kind = py::str(array.dtype()).cast<std::string>();
  static const std::map<std::string, rt::DType> types = {
      {"float64", rt::DType::F64}, {"float32", rt::DType::F32},
      {"float16", rt::DType::F16}, {"int64", rt::DType::I64},
      {"int32", rt::DType::I32},   {"bool", rt::DType::I1}};
  auto it = types.find(kind);
  if (it == types.end())
    throw py::type_error("unsupported array dtype " + kind);
  rt::HostTensor t;
  t.type = it->second;
  t.shape.assign(array.shape(), array.shape() + array.ndim());
  const auto *data = static_cast<const uint8_t *>(array.data());
  t.bytes.assign(data, data + array.nbytes());
  return t;
}

/// A numpy array that owns the tensor's bytes (no copy).
py::array toNumpy(rt::HostTensor tensor) {
  auto *owned = new rt::HostTensor(std::move(tensor));
  py::capsule free(owned, [](void *p) { delete static_cast<rt::HostTensor *>(p); });
  std::vector<py::ssize_t> shape(owned->shape.begin(), owned->shape.end());
  return py::array(py::dtype(numpyDtype(owned->type)), shape, owned->bytes.data(), free);
}

//===----------------------------------------------------------------------===//
// safetensors files (the runtime's reader and writer)
//===----------------------------------------------------------------------===//

/// {name: (dtype, array)} and the metadata of a safetensors file; narrow
/// floats come as their raw bits (uint16 for BF16, uint8 for F8_*), named by
/// their safetensors dtype ("BF16", "F8_E4M3", ...).
py::tuple readSafetensors(const std::string &path) {
  std::unique_ptr<rt::SafetensorsFile> file;
  try {
    file = std::make_unique<rt::SafetensorsFile>(path);
  } catch (const std::runtime_error &e) {
    throw py::value_error(e.what());
  }
  py::dict tensors;
  for (const rt::SafetensorsEntry &e : file->tensors())
    tensors[py::str(e.name)] = py::make_tuple(rt::safetensorsDtype(e.type),
                                              toNumpy(file->read(e.name)));
  return py::make_tuple(tensors, file->metadata());
}

/// Writes [(name, dtype, array)] in order; `dtype` is a safetensors dtype,
/// and a narrow float's array holds its raw bits.
void writeSafetensors(const std::string &path,
                      const std::vector<std::tuple<std::string, std::string, py::array>> &items,
                      const std::map<std::string, std::string> &metadata) {
  std::vector<rt::HostTensor> tensors;
  tensors.reserve(items.size());
  for (const auto &[name, dtype, object] : items) {
    rt::DType type;
    if (!rt::parseSafetensorsDtype(dtype, type))
      throw py::value_error("'" + name + "': unknown safetensors dtype '" + dtype + "'");
    auto array = py::array::ensure(object, py::array::c_style);
    std::string kind = py::str(array.dtype()).cast<std::string>();
    if (kind != numpyDtype(type))
      throw py::type_error("'" + name + "': " + dtype + " is written from a " +
                           numpyDtype(type) + " array, not " + kind);
    rt::HostTensor t;
    t.type = type;
    t.shape.assign(array.shape(), array.shape() + array.ndim());
    const auto *data = static_cast<const uint8_t *>(array.data());
    t.bytes.assign(data, data + array.nbytes());
    tensors.push_back(std::move(t));
  }
  std::vector<std::pair<std::string, const rt::HostTensor *>> named;
  for (size_t i = 0; i < items.size(); ++i)
    named.emplace_back(std::get<0>(items[i]), &tensors[i]);
  std::string error;
  {
    py::gil_scoped_release release;
    try {
      rt::writeSafetensors(path, named, metadata);
    } catch (const std::runtime_error &e) {
      error = e.what();
    }
  }
  if (!error.empty())
    throw py::value_error(error);
}

/// The role as Python's describe() spells it (an identifier).
const char *roleKey(rt::Role r) {
  switch (r) {
  case rt::Role::Input: return "input";
  case rt::Role::Parameter: return "parameter";
  case rt::Role::OptimizerState: return "optimizer_state";
  case rt::Role::LearningRate: return "learning_rate";
  case rt::Role::Step: return "step";
  case rt::Role::Loss: return "loss";
  case rt::Role::Residual: return "residual";
  case rt::Role::Gradient: return "gradient";
  case rt::Role::MicroBatchMax: return "micro_batch_max";
  case rt::Role::MicroBatchSum: return "micro_batch_sum";
  }
  return "";
}

py::dict describeTensor(const rt::TensorSpec &t) {
  py::dict d;
  d["name"] = t.name;
  d["role"] = roleKey(t.role);
  d["dtype"] = std::string(rt::name(t.type));
  d["global_shape"] = t.globalShape;
  d["local_shape"] = t.localShape;
  d["updates"] = t.updates;
  std::vector<std::vector<std::string>> dims(t.sharding.dims.begin(), t.sharding.dims.end());
  d["sharding"] = dims;
  return d;
}

/// A function's arguments, results and arena, for Python.
py::dict describeFunction(const rt::Function &f) {
  py::list args, results;
  for (const auto &a : f.arguments)
    args.append(describeTensor(a));
  for (const auto &r : f.results)
    results.append(describeTensor(r));
  py::dict d;
  d["arguments"] = args;
  d["results"] = results;
  d["arena_bytes"] = f.arenaBytes;
  d["argument_bytes"] = f.argumentBytes;
  // What fusion did: instructions the runtime dispatches, and the ops they
  // stand for (a fused loop counts its body's steps).
  size_t ops = 0;
  for (const auto &inst : f.instructions)
    ops += inst.body ? inst.body->steps.size() : 1;
  d["instructions"] = f.instructions.size();
  d["unfused_instructions"] = ops;
  return d;
}

/// Runs `fn` with the GIL released: the ranks are C++ threads.
template <typename Fn> auto withoutGil(Fn fn) {
  py::gil_scoped_release release;
  return fn();
}

/// The runtime's errors as Python exceptions with their messages.
template <typename Fn> auto translateErrors(Fn fn) {
  try {
    return fn();
  } catch (const rt::ProgramError &e) {
    throw py::value_error(e.what());
  } catch (const rt::ExecutionError &e) {
    throw std::runtime_error(e.what());
  } catch (const std::invalid_argument &e) {
    throw py::value_error(e.what());
  }
}

/// Runs `fn` without the GIL; checkpoint faults as Python exceptions.
template <typename Fn> auto checkpointErrors(Fn fn) {
  std::string error;
  bool os = false;
  std::optional<decltype(fn())> result;
  {
    py::gil_scoped_release release;
    try {
      result.emplace(fn());
    } catch (const std::filesystem::filesystem_error &e) {
      error = e.what();
      os = true;
    } catch (const std::exception &e) {
      error = e.what();
    }
  }
  if (!result) {
    if (os) {
      PyErr_SetString(PyExc_OSError, error.c_str());
      throw py::error_already_set();
    }
    throw py::value_error(error);
  }
  return std::move(*result);
}

class PySession {
public:
  PySession(py::bytes file, double timeoutSeconds, bool checkFinite, bool trace,
            const std::string &device) {
    std::string bytes = file;
    rt::SessionOptions options;
    options.device = device;
    if (!(timeoutSeconds > 0 && timeoutSeconds <= 1e9)) // NaN fails too
      throw py::value_error("timeout must be a finite number of seconds > 0, not " +
                            std::to_string(timeoutSeconds));
    options.timeout = std::chrono::milliseconds(int64_t(timeoutSeconds * 1000));
    options.executor.checkFinite = checkFinite;
    options.executor.trace = trace;
    session_ = translateErrors([&] {
      return std::make_unique<rt::Session>(
          rt::Program::fromBytes(bytes, "<compiled program>"),
          options);
    });
  }

  py::dict signature(const std::string &fn) {
    return describeFunction(translateErrors([&]() -> const rt::Function & {
      return session_->program().requireFunction(0, fn);
    }));
  }

  void initState(const std::string &fn, py::dict given, uint64_t seed) {
    std::map<std::string, rt::HostTensor> values;
    for (auto [k, v] : given)
      values[k.cast<std::string>()] = fromNumpy(v);
    rt::StateSource source = [&](const rt::TensorSpec &spec) -> std::optional<rt::HostTensor> {
      auto it = values.find(spec.name);
      if (it == values.end())
        return std::nullopt;
      if (it->second.shape != spec.globalShape)
        throw std::invalid_argument("'" + spec.name + "' has the wrong shape");
      return it->second;
    };
    translateErrors([&] { session_->initState(fn, source, seed); return 0; });
  }

  void setState(const std::string &fn, const std::string &name, py::handle v) {
    rt::HostTensor t = fromNumpy(v);
    translateErrors([&] { session_->setState(fn, name, t); return 0; });
  }

  py::array state(const std::string &fn, const std::string &name) {
    return toNumpy(translateErrors([&] { return session_->state(fn, name); }));
  }

  /// `updates=False`: results that update state come back as None (the
  /// state moves instead of being copied out).
  py::list call(const std::string &fn, py::list inputs, double lr, int64_t step,
                bool updates) {
    std::vector<rt::HostTensor> ins;
    for (py::handle h : inputs)
      ins.push_back(fromNumpy(h));
    rt::Results wanted = updates ? rt::Results::All : rt::Results::ExceptUpdates;
    std::vector<rt::HostTensor> outs = translateErrors([&] {
      return withoutGil([&] { return session_->call(fn, ins, lr, step, wanted); });
    });
    py::list result;
    for (rt::HostTensor &t : outs) {
      if (t.bytes.empty() && t.shape.empty())
        result.append(py::none()); // left out: it updates state
      else
        result.append(toNumpy(std::move(t)));
    }
    return result;
  }

  int64_t numRanks() const { return session_->numRanks(); }
  /// "cpu", or the CUDA device the ranks share ("cuda:0 (NVIDIA H100...)").
  std::string deviceName() const { return session_->device().describe(); }

  /// Checkpoint.h through the session; a damaged or missing checkpoint is
  /// a ValueError (OSError for the file system's own faults). Each returns
  /// what it returns in C++ and the bytes moved and seconds taken; with
  /// `progress` it prints progress and MB/s on stderr.
  py::tuple saveCheckpoint(const std::string &root, int64_t step,
                           const std::string &metadata, int keep, bool progress) {
    rt::IoMeter meter(progress ? rt::IoMeter::printer("saving " + root) : nullptr);
    std::string dir = checkpointErrors([&] {
      return session_->saveCheckpoint(root, step, metadata, keep, &meter);
    });
    double seconds = meter.finish();
    return py::make_tuple(dir, meter.bytes(), seconds);
  }

  py::tuple loadCheckpoint(const std::string &path, bool progress) {
    rt::IoMeter meter(progress ? rt::IoMeter::printer("loading " + path) : nullptr);
    rt::CheckpointInfo info = checkpointErrors([&] {
      return session_->loadCheckpoint(path, &meter);
    });
    double seconds = meter.finish();
    return py::make_tuple(info.step, info.metadataJson, meter.bytes(), seconds);
  }

  /// `weights`: {state: [(file, tensor, offsets, transposed)]}.
  py::tuple loadWeights(
      const std::map<std::string,
                     std::vector<std::tuple<std::string, std::string,
                                            std::vector<int64_t>, bool>>> &weights,
      bool progress) {
    rt::WeightMap map;
    for (const auto &[name, pieces] : weights)
      for (const auto &[file, tensor, offsets, transposed] : pieces)
        map[name].push_back({file, tensor, offsets, transposed});
    rt::IoMeter meter(progress ? rt::IoMeter::printer("loading weights") : nullptr);
    std::vector<std::string> loaded = checkpointErrors([&] {
      return session_->loadWeights(map, &meter);
    });
    double seconds = meter.finish();
    return py::make_tuple(loaded, meter.bytes(), seconds);
  }

  void writeTrace(const std::string &path) {
    translateErrors([&] {
      rt::writeChromeTrace(path, session_->traceEvents());
      return 0;
    });
  }

private:
  std::unique_ptr<rt::Session> session_;
};

/// f32 values to a narrow float type's bits, or bits back to f32, with the
/// runtime's conversions (FloatConvert.h), so Python sees exactly the
/// numbers the kernels compute with. Bits travel as numpy's unsigned
/// integers of the type's width, as HostTensor's .npy files store them.
py::array convertFloat(py::handle object, const std::string &from,
                       const std::string &to) {
  auto narrowType = [](const std::string &spelling) {
    std::optional<rt::DType> t = rt::parseDType(spelling);
    if (!t || !rt::isNarrowFloat(*t))
      throw py::value_error("'" + spelling +
                            "' is not a narrow float type (f16, bf16, "
                            "f8E4M3FN, f8E5M2)");
    return *t;
  };
  if ((from == "f32") == (to == "f32"))
    throw py::value_error("convert_float converts f32 to a narrow float "
                          "type or back, not '" +
                          from + "' to '" + to + "'");
  bool encode = from == "f32";
  rt::DType narrow = narrowType(encode ? to : from);
  auto array = py::array::ensure(object, py::array::c_style);
  if (!array)
    throw py::type_error("convert_float expects a numpy array");
  std::string kind = py::str(array.dtype()).cast<std::string>();
  std::string bits = rt::byteSize(narrow) == 1 ? "uint8" : "uint16";
  std::string want = encode ? "float32" : bits;
  if (kind != want)
    throw py::type_error("converting " + from + " to " + to + " needs a " +
                         want + " array, not " + kind);
  std::vector<py::ssize_t> shape(array.shape(), array.shape() + array.ndim());
  py::array out(py::dtype(encode ? bits : "float32"), shape);
  int64_t n = array.size();
  const void *src = array.data();
  void *dst = out.mutable_data();
  {
    py::gil_scoped_release release;
    if (encode)
      rt::floatToNarrow(narrow, static_cast<const float *>(src), dst, n);
    else
      rt::narrowToFloat(narrow, src, static_cast<float *>(dst), n);
  }
  return out;
}

//===----------------------------------------------------------------------===//
// infer_spmd
//===----------------------------------------------------------------------===//

ec::MeshShape meshShape(const std::vector<std::string> &axes,
                           const std::vector<int64_t> &sizes) {
  ec::MeshShape mesh;
  mesh.name = FlatSymbolRefAttr::get(&context(), "mesh");
  for (const std::string &a : axes)
    mesh.axes.push_back(StringAttr::get(&context(), a).getValue());
  mesh.sizes.assign(sizes.begin(), sizes.end());
  return mesh;
}

using SpmdMapping = std::pair<std::vector<int64_t>, std::vector<int64_t>>;
using SpmdType = std::pair<std::vector<int64_t>, std::string>;

/// Shardings from (dims_mapping, partial_dims) pairs, one per tensor of
/// `types` (None: all unknown, Paddle's forward or backward alone).
SmallVector<ec::ShardingAttr>
spmdShardings(const std::string &op, const std::string &what,
              const std::optional<std::vector<SpmdMapping>> &mappings,
              ArrayRef<std::vector<int64_t>> shapes, const ec::MeshShape &mesh) {
  SmallVector<ec::ShardingAttr> shardings;
  if (!mappings)
    return shardings;
  if (!shapes.empty() && mappings->size() != shapes.size())
    throw py::value_error("infer_spmd('" + op + "'): " + std::to_string(mappings->size()) +
                          " " + what + " dims_mappings for " + std::to_string(shapes.size()) +
                          " " + what + "s");
  for (auto [i, mapping] : llvm::enumerate(*mappings)) {
    std::string name = what + " " + std::to_string(i);
    if (!shapes.empty() && mapping.first.size() != shapes[i].size())
      throw py::value_error("infer_spmd('" + op + "'): the dims_mapping of " + name + " has " +
                            std::to_string(mapping.first.size()) +
                            " entries for a tensor of rank " + std::to_string(shapes[i].size()));
    for (int64_t d : mapping.first)
      if (d < -1 || d >= static_cast<int64_t>(mesh.axes.size()))
        throw py::value_error("infer_spmd('" + op + "'): the dims_mapping of " + name +
                              " names mesh dimension " + std::to_string(d) + " of a mesh of " +
                              std::to_string(mesh.axes.size()));
    ec::DimsMapping dm{SmallVector<int64_t>(mapping.first.begin(), mapping.first.end()),
                       SmallVector<int64_t>(mapping.second.begin(), mapping.second.end())};
    FailureOr<ec::ShardingAttr> s = ec::shardingFromDimsMapping(&context(), mesh, dm);
    if (failed(s))
      throw py::value_error("infer_spmd('" + op + "'): invalid dims_mapping/partial_dims for " +
                            name + " (a mesh dimension out of range or used twice)");
    shardings.push_back(*s);
  }
  return shardings;
}

/// One op's rule on (dims_mapping, partial_dims) pairs, as Paddle's
/// infer_spmd (known inputs) and infer_backward (known outputs) take them;
/// returns per input (dims_mapping, partial_dims) and per output
/// (dims_mapping, partial_dims, {mesh_dim: reduce type}).
py::tuple inferSpmd(const std::string &op, const std::vector<SpmdType> &inputTypes,
                    const std::optional<std::vector<SpmdMapping>> &mappings,
                    const std::vector<std::string> &axes,
                    const std::vector<int64_t> &sizes, py::dict attrs,
                    const std::optional<std::vector<SpmdMapping>> &outputMappings) {
  MLIRContext *ctx = &context();
  std::string prefix = "infer_spmd('" + op + "'): ";
  if (axes.size() != sizes.size() || axes.empty())
    throw py::value_error(prefix + "a mesh needs one size per axis name");
  for (const std::string &a : axes)
    if (a.empty())
      throw py::value_error(prefix + "mesh axis names must be non-empty");
  ec::MeshShape mesh = meshShape(axes, sizes);
  SmallVector<RankedTensorType> types;
  std::vector<std::vector<int64_t>> shapes;
  for (const SpmdType &type : inputTypes) {
    try {
      types.push_back(tensorType(ctx, type.first, type.second));
    } catch (py::error_already_set &) {
      throw;
    } catch (const std::exception &e) {
      throw py::value_error(prefix + e.what());
    }
    shapes.push_back(type.first);
  }
  SmallVector<ec::ShardingAttr> shardings =
      spmdShardings(op, "input", mappings, shapes, mesh);
  SmallVector<ec::ShardingAttr> outShardings =
      spmdShardings(op, "output", outputMappings, {}, mesh);
  SmallVector<NamedAttribute> named;
  Builder b(ctx);
  for (auto [key, v] : attrs) {
    std::string k = key.cast<std::string>();
    Attribute a;
    try {
      a = toAttribute(ctx, k, v, Type());
    } catch (const std::exception &e) {
      throw py::value_error(prefix + "attribute '" + k + "': " + e.what());
    }
    if (a)
      named.push_back(b.getNamedAttr(k, a));
  }
  std::string error;
  FailureOr<ec::SpmdResult> result =
      ec::inferSpmd(ctx, op, types, shardings, b.getDictionaryAttr(named),
                    mesh, error, {}, outShardings);
  if (failed(result)) {
    // Every message names the op.
    std::string name = op.rfind("ernie.", 0) == 0 ? op : "ernie." + op;
    if (error.empty())
      error = "failed";
    throw py::value_error(error.find("'" + name + "'") == std::string::npos
                              ? prefix + error
                              : error);
  }
  auto convert = [&](ArrayRef<ec::ShardingAttr> list, bool withKinds) {
    py::list out;
    for (ec::ShardingAttr s : list) {
      FailureOr<ec::DimsMapping> dm = ec::dimsMappingFromSharding(s, mesh);
      if (failed(dm))
        throw py::value_error(prefix + "a result sharding has no dims_mapping form");
      std::vector<int64_t> dims(dm->dims.begin(), dm->dims.end());
      std::vector<int64_t> partial(dm->partialDims.begin(), dm->partialDims.end());
      if (!withKinds) {
        out.append(py::make_tuple(dims, partial));
        continue;
      }
      py::dict kinds;
      auto partials = s.getPartials();
      for (auto [meshDim, entry] : llvm::zip(partial, partials))
        kinds[py::int_(meshDim)] = ec::stringifyReduceKind(entry.second).str();
      out.append(py::make_tuple(dims, partial, kinds));
    }
    return out;
  };
  return py::make_tuple(convert(result->inputs, false), convert(result->outputs, true));
}

/// Every registered ernie op, with whether it has a sharding rule (what
/// infer_spmd can run): the sweep tests enumerate the dialect with it.
std::vector<std::pair<std::string, bool>> spmdOps() {
  std::vector<std::pair<std::string, bool>> ops;
  for (RegisteredOperationName name : context().getRegisteredOperations())
    if (name.getDialectNamespace() == ec::ErnieDialect::getDialectNamespace())
      ops.emplace_back(name.getStringRef().str(),
                       name.hasInterface<ec::ShardingRuleOpInterface>());
  return ops;
}

//===----------------------------------------------------------------------===//
// Pipeline schedules and pipelined programs
//===----------------------------------------------------------------------===//

rt::PipelineShape pipelineShape(int64_t stages, int64_t virtualStages,
                                int64_t microBatches) {
  rt::PipelineShape shape;
  shape.stages = stages;
  shape.virtualStages = virtualStages;
  shape.microBatches = microBatches;
  return shape;
}

/// The schedule of `kind` for the shape; the library's message as a
/// ValueError when the kind is unknown or does not suit the shape.
rt::PipelineSchedule buildSchedule(const std::string &kindName,
                                   const rt::PipelineShape &shape) {
  rt::ScheduleKind kind;
  if (!rt::parseScheduleKind(kindName, kind))
    throw py::value_error("unknown pipeline schedule '" + kindName +
                          "' (FThenB, 1F1B, interleaved)");
  rt::PipelineSchedule schedule;
  std::string error = rt::buildSchedule(kind, shape, schedule);
  if (!error.empty())
    throw py::value_error(error);
  return schedule;
}

py::tuple stepTuple(const rt::PipelineStep &step) {
  return py::make_tuple(step.action == rt::PipelineAction::Forward ? "F" : "B",
                        step.chunk, step.microBatch);
}

py::list scheduleList(const rt::PipelineSchedule &schedule) {
  py::list ranks;
  for (const auto &steps : schedule) {
    py::list rank;
    for (const rt::PipelineStep &step : steps)
      rank.append(stepTuple(step));
    ranks.append(rank);
  }
  return ranks;
}

py::list pipelineSchedule(const std::string &kind, int64_t stages,
                          int64_t virtualStages, int64_t microBatches) {
  return scheduleList(
      buildSchedule(kind, pipelineShape(stages, virtualStages, microBatches)));
}

py::dict simulatePipeline(const std::string &kind, int64_t stages,
                          int64_t virtualStages, int64_t microBatches,
                          double forwardCost, double backwardCost) {
  if (!(forwardCost >= 0) || !(backwardCost >= 0))
    throw py::value_error("step costs must be non-negative");
  rt::PipelineShape shape = pipelineShape(stages, virtualStages, microBatches);
  rt::PipelineSchedule schedule = buildSchedule(kind, shape);
  rt::ScheduleTimeline timeline;
  std::string error = rt::simulateSchedule(schedule, shape, forwardCost,
                                           backwardCost, timeline);
  if (!error.empty())
    throw py::value_error(error);
  py::list ranks;
  for (const auto &steps : timeline.ranks) {
    py::list rank;
    for (const rt::TimedStep &t : steps)
      rank.append(py::make_tuple(
          t.step.action == rt::PipelineAction::Forward ? "F" : "B",
          t.step.chunk, t.step.microBatch, t.start, t.end));
    ranks.append(rank);
  }
  py::dict out;
  out["bubble_fraction"] = timeline.bubbleFraction;
  out["makespan"] = timeline.makespan;
  out["busy"] = timeline.busy;
  out["ranks"] = ranks;
  return out;
}

/// A program file's ranks, functions (every stage's: a pipelined program's
/// names are distinct across stages; each with its "stage") and, for a
/// pipelined program, its pipeline: stages, virtual stages, micro-batches,
/// schedule name and steps, the micro-batch inputs, and per state name the
/// stages holding it.
py::tuple describeProgram(py::bytes file) {
  // Validates the file; allocates nothing (abstract compilation of
  // full-size models uses it).
  std::string bytes = file;
  rt::Program program = translateErrors(
      [&] { return rt::Program::fromBytes(bytes, "<compiled program>"); });
  py::dict functions;
  for (int64_t s = 0; s < program.numStages(); ++s)
    for (const rt::Function &f : program.functions(s)) {
      py::dict d = describeFunction(f);
      d["stage"] = s;
      functions[py::str(f.name)] = d;
    }
  py::object pipeline = py::none();
  if (const rt::PipelineSpec *spec = program.pipeline()) {
    py::dict p;
    p["stages"] = program.numStages();
    p["virtual_stages"] = spec->virtualStages;
    p["micro_batches"] = spec->microBatches;
    p["schedule"] = spec->schedule;
    p["axis"] = program.stageAxis();
    p["steps"] = scheduleList(spec->steps);
    py::list inputs;
    for (const rt::TensorSpec &t : spec->inputs)
      inputs.append(describeTensor(t));
    p["inputs"] = inputs;
    py::dict holding;
    for (const std::string &name : program.stateNames())
      holding[py::str(name)] = program.stagesHolding(name);
    p["state_stages"] = holding;
    pipeline = p;
  }
  return py::make_tuple(program.mesh().numRanks(), functions, pipeline);
}

} // namespace

PYBIND11_MODULE(_ernie, m) {
  m.doc() = "ernie's C++ core: tracing, compilation and the runtime";

  py::class_<Tracer>(m, "Tracer")
      .def(py::init<const std::string &>(), py::arg("function") = "forward")
      .def("set_mesh", &Tracer::setMesh, py::arg("name"), py::arg("axes"),
           py::arg("sizes"), py::arg("even_splits") = false)
      .def("argument", &Tracer::argument, py::arg("shape"), py::arg("dtype"),
           py::arg("param") = py::none(), py::arg("sharding") = py::none(),
           py::arg("pipeline_stages") = py::none(), py::arg("state") = py::none())
      .def("op", &Tracer::op, py::arg("name"), py::arg("operands"),
           py::arg("attrs") = py::dict(), py::arg("result_types") = py::none(),
           py::arg("location") = "")
      .def("type_of", &Tracer::typeOf)
      .def("set_layer", &Tracer::setLayer, py::arg("name"))
      .def("finish", &Tracer::finish, py::arg("results"),
           py::arg("updates") = std::vector<std::string>())
      .def("text", &Tracer::text);

  m.def("compile", &compileModule, py::arg("module"), py::arg("pipeline"),
        py::arg("write_program") = true,
        "Runs a pass pipeline over a module; returns (text, program file bytes)");

  m.def("estimate_step", &estimateStep, py::arg("module"), py::arg("cluster"),
        py::arg("where") = "cluster", py::arg("device_dir") = ".",
        "The cost model's step estimate (JSON text) of a compiled module");

  py::class_<PySession>(m, "Session")
      .def(py::init<py::bytes, double, bool, bool, std::string>(),
           py::arg("program"), py::arg("timeout") = 60.0,
           py::arg("check_finite") = false, py::arg("trace") = false,
           py::arg("device") = "cpu")
      .def_property_readonly("device", [](PySession &s) {
        return s.deviceName();
      })
      .def("write_trace", &PySession::writeTrace)
      .def_property_readonly("num_ranks", &PySession::numRanks)
      .def("signature", &PySession::signature)
      .def("init_state", &PySession::initState, py::arg("function"),
           py::arg("values") = py::dict(), py::arg("seed") = 0)
      .def("set_state", &PySession::setState)
      .def("save_checkpoint", &PySession::saveCheckpoint, py::arg("root"),
           py::arg("step"), py::arg("metadata") = "{}", py::arg("keep") = 0,
           py::arg("progress") = false)
      .def("load_checkpoint", &PySession::loadCheckpoint, py::arg("path"),
           py::arg("progress") = false)
      .def("load_weights", &PySession::loadWeights, py::arg("weights"),
           py::arg("progress") = false)
      .def("state", &PySession::state)
      .def("call", &PySession::call, py::arg("function"), py::arg("inputs"),
           py::arg("lr") = 0.0, py::arg("step") = 1, py::arg("updates") = true);

  m.def("describe", &describeProgram, py::arg("program"),
        "(ranks, {function: signature}, pipeline or None) of a program file");

  m.def("pipeline_schedule", &pipelineSchedule, py::arg("kind"),
        py::arg("stages"), py::arg("virtual_stages") = 1,
        py::arg("micro_batches") = 1,
        "Per pipeline rank its steps in order: (\"F\"|\"B\", chunk, micro_batch)");
  m.def("simulate_pipeline", &simulatePipeline, py::arg("kind"),
        py::arg("stages"), py::arg("virtual_stages") = 1,
        py::arg("micro_batches") = 1, py::arg("forward_cost") = 1.0,
        py::arg("backward_cost") = 2.0,
        "The schedule's timeline with zero-cost transfers: bubble_fraction, "
        "makespan, busy, and per rank (action, chunk, micro_batch, start, end)");

  m.def("gemm_library", [] {
    rt::GemmLibrary g = rt::cpuGemmLibrary();
    py::dict d;
    d["library"] = g.library;
    d["kernels"] = g.kernels;
    d["warning"] = g.warning;
    return d;
  }, "The GEMM library the CPU runtime calls and the kernels it chose.");
  m.def("preferred_gemm_kernels", &rt::preferredGemmKernels,
        "The OpenBLAS kernel family ernie picks for this CPU from its features "
        "(empty: OpenBLAS's own choice).");
  m.def("convert_float", &convertFloat, py::arg("array"), py::arg("from"),
        py::arg("to"),
        "f32 to a narrow float type's raw bits (uint8/uint16), or back; "
        "types by their MLIR spelling (f16, bf16, f8E4M3FN, f8E5M2)");

  m.def("verify_checkpoint", [](const std::string &dir) {
        return checkpointErrors([&] {
          return rt::verifyCheckpoint(rt::resolveCheckpoint(dir));
        });
      }, py::arg("path"), "checks every byte of a checkpoint; returns a summary");
  m.def("safetensors_header", [](const std::string &path) {
        std::unique_ptr<rt::SafetensorsFile> file;
        try {
          file = std::make_unique<rt::SafetensorsFile>(path);
        } catch (const std::runtime_error &e) {
          throw py::value_error(e.what());
        }
        py::dict tensors;
        for (const rt::SafetensorsEntry &e : file->tensors())
          tensors[py::str(e.name)] = py::make_tuple(rt::safetensorsDtype(e.type), e.shape);
        return py::make_tuple(tensors, file->metadata());
      }, py::arg("path"),
        "({name: (dtype, shape)}, metadata) of a safetensors file; no data read");
  m.def("read_safetensors", &readSafetensors, py::arg("path"),
        "({name: (dtype, array)}, metadata) of a safetensors file");
  m.def("write_safetensors", &writeSafetensors, py::arg("path"),
        py::arg("tensors"), py::arg("metadata") = std::map<std::string, std::string>{},
        "writes [(name, safetensors dtype, array)] and metadata");
  m.def("infer_spmd", &inferSpmd, py::arg("op"), py::arg("input_types"),
        py::arg("dims_mappings"), py::arg("mesh_axes"), py::arg("mesh_sizes"),
        py::arg("attrs") = py::dict(),
        py::arg("output_dims_mappings") = py::none());
  m.def("spmd_ops", &spmdOps,
        "(name, has a sharding rule) for every registered ernie op");
}

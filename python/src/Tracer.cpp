//===- Tracer.cpp - IR built from Python ---------------------------------===//

#include "Extension.h"

#include "ernie/Dialect/Ernie/IR/ErnieOps.h"
#include "ernie/Sharding/BuildOp.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Parser/Parser.h"

#include <map>
#include <optional>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

namespace ernie_py {

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
  /// `updates[i]` (the loss comes first), the last ones the metrics
  /// `metrics` names.
  void finish(const std::vector<int> &results,
              const std::vector<std::string> &updates,
              const std::vector<std::string> &metrics) {
    if (updates.size() + metrics.size() + 1 != results.size() &&
        !(results.empty() && updates.empty() && metrics.empty()))
      throw py::value_error("finish: one state or metric name per result after the first");
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
    for (auto [i, name] : llvm::enumerate(metrics))
      fn_.setResultAttr(1 + updates.size() + i, ec::ErnieDialect::kMetricAttrName,
                        b_.getStringAttr(name));
    DiagnosticCollector diagnostics(&context());
    if (failed(verify(*module_)))
      throw py::value_error(diagnostics.take("the traced module does not verify"));
  }

  PyModule module() { return PyModule(OwningOpRef<ModuleOp>(module_->clone())); }
  std::string text() { return printModule(*module_, false); }

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

PyModule parseModule(const std::string &text) {
  MLIRContext *ctx = &context();
  DiagnosticCollector diagnostics(ctx);
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(text, ctx);
  if (!module)
    throw py::value_error(diagnostics.take("cannot parse the module"));
  return PyModule(std::move(module));
}

void bindTracer(py::module_ &m) {
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
           py::arg("updates") = std::vector<std::string>(),
           py::arg("metrics") = std::vector<std::string>())
      .def("module", &Tracer::module,
           "The traced module (a copy, held in C++)")
      .def("text", &Tracer::text, "The traced module's text");

  py::class_<PyModule>(m, "Module")
      .def("text", &PyModule::text, py::arg("debug_info") = false,
           "The module's text (with debug_info: its locations too)")
      .def("__str__", [](const PyModule &m) { return m.text(false); });
  m.def("parse_module", &parseModule, py::arg("text"),
        "A module from its text");
}

} // namespace ernie_py

//===- Compile.cpp - the training pipeline from Python -------------------===//

#include "Extension.h"

#include "ernie/Cost/CostModel.h"
#include "ernie/Export/MemoryPlan.h"
#include "ernie/Export/PlanReport.h"
#include "ernie/Export/ProgramFile.h"
#include "ernie/Passes/Pipelines.h"

#include "mlir/Pass/PassManager.h"

#include <memory>
#include <set>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

namespace ernie_py {

/// The plan report (JSON text) of `module`, with the writer's plan figures
/// where given.
std::string planReport(ModuleOp module,
                       const llvm::StringMap<ec::PlanFigures> *planned) {
  DiagnosticCollector diagnostics(module.getContext());
  FailureOr<llvm::json::Value> report = ec::buildPlanReport(module, planned);
  if (failed(report))
    throw py::value_error(diagnostics.take("cannot plan the module"));
  std::string text;
  llvm::raw_string_ostream os(text);
  os << *report;
  return text;
}

/// The program file of `module` and its plan report (JSON text), whose
/// memory figures are the plan the file holds: nothing is planned twice.
std::pair<py::bytes, std::string> writeProgram(ModuleOp module) {
  DiagnosticCollector diagnostics(module.getContext());
  std::string program;
  llvm::raw_string_ostream ps(program);
  llvm::StringMap<ec::PlanFigures> planned;
  if (failed(ec::writeProgramFile(module, ps, &planned)))
    throw py::value_error(diagnostics.take("cannot write the program file"));
  return {py::bytes(program), planReport(module, &planned)};
}

/// Runs the training pipeline configured by `options` (none: no pass) over
/// a copy of `traced`; returns (the compiled module, its program file and
/// plan report when `writeProgram`).
py::tuple compileModule(const PyModule &traced,
                        const ec::TrainingPipelineOptions *options,
                        bool writeProgramFile) {
  MLIRContext *ctx = &context();
  DiagnosticCollector diagnostics(ctx);
  OwningOpRef<ModuleOp> module(traced.get().clone());
  if (options) {
    PassManager pm(ctx, ModuleOp::getOperationName());
    ec::buildTrainingPipeline(pm, *options);
    if (failed(pm.run(*module)))
      throw py::value_error(diagnostics.take("compilation failed"));
  }
  PyModule compiled(std::move(module));
  if (!writeProgramFile)
    return py::make_tuple(std::move(compiled), py::bytes(), py::none());
  auto [program, report] = writeProgram(compiled.get());
  return py::make_tuple(std::move(compiled), program, report);
}

/// The mesh axes any sharding of `module` names (arguments, results, ops'
/// attributes, sharding constraints): the axes a plan uses.
std::vector<std::string> axesInShardings(const PyModule &module) {
  std::set<std::string> axes;
  auto note = [&](Attribute attr) {
    attr.walk([&](ec::ShardingAttr s) {
      for (int64_t d = 0; d < s.getRank(); ++d)
        for (StringRef axis : s.getDimAxes(d))
          axes.insert(axis.str());
      for (Attribute a : s.getPartialAxes())
        axes.insert(cast<StringAttr>(a).getValue().str());
    });
  };
  module.get()->walk([&](Operation *op) {
    for (NamedAttribute attr : op->getAttrs())
      note(attr.getValue());
  });
  return {axes.begin(), axes.end()};
}

/// A `TrainingPipelineOptions` property of Python type T for `member`.
template <typename T, typename Options>
void defineOption(py::class_<Options> &cls, const char *name,
                  mlir::detail::PassOptions::Option<T> Options::*member) {
  cls.def_property(
      name, [member](const Options &o) { return T((o.*member).getValue()); },
      [member](Options &o, const T &value) { o.*member = value; });
}

/// A cluster description (JSON text; a "device" string is a file relative
/// to `deviceDir`); errors name it as `where`.
ec::cost::ClusterSpec parseCluster(const std::string &cluster,
                                   const std::string &where,
                                   const std::string &deviceDir) {
  llvm::Expected<llvm::json::Value> json = llvm::json::parse(cluster);
  if (!json)
    throw py::value_error(where + ": not JSON: " +
                          llvm::toString(json.takeError()));
  llvm::Expected<ec::cost::ClusterSpec> spec =
      ec::cost::readCluster(*json, where, deviceDir);
  if (!spec)
    throw py::value_error(llvm::toString(spec.takeError()));
  return std::move(*spec);
}

/// The cost model's estimate of one step of a compiled module on a cluster,
/// as the JSON text --ernie-step-cost writes.
std::string estimateStep(const PyModule &module, const std::string &cluster,
                         const std::string &where,
                         const std::string &deviceDir) {
  DiagnosticCollector diagnostics(&context());
  ec::cost::ClusterSpec spec = parseCluster(cluster, where, deviceDir);
  FailureOr<ec::cost::StepCost> step =
      ec::cost::estimateStep(module.get(), spec);
  if (failed(step))
    throw py::value_error(diagnostics.take("cannot estimate the step"));
  std::string out;
  llvm::raw_string_ostream os(out);
  os << ec::cost::toJSON(*step);
  return out;
}

void bindCompile(py::module_ &m) {
  using Options = ec::TrainingPipelineOptions;
  py::class_<Options> options(m, "TrainingPipelineOptions",
                              "ernie-opt's --ernie-training-pipeline options");
  options.def(py::init<>());
  defineOption<bool>(options, "differentiate", &Options::differentiate);
  defineOption<std::string>(options, "optimizer", &Options::optimizer);
  defineOption<double>(options, "momentum", &Options::momentum);
  defineOption<double>(options, "weight_decay", &Options::weightDecay);
  defineOption<double>(options, "beta1", &Options::beta1);
  defineOption<double>(options, "beta2", &Options::beta2);
  defineOption<double>(options, "epsilon", &Options::epsilon);
  defineOption<double>(options, "clip_norm", &Options::clipNorm);
  defineOption<bool>(options, "multi_precision", &Options::multiPrecision);
  defineOption<bool>(options, "grad_norm", &Options::gradNorm);
  defineOption<bool>(options, "partition", &Options::partition);
  defineOption<int64_t>(options, "pipeline_stages", &Options::pipelineStages);
  defineOption<int64_t>(options, "virtual_stages", &Options::virtualStages);
  defineOption<int64_t>(options, "micro_batches", &Options::microBatches);
  defineOption<std::string>(options, "schedule", &Options::schedule);
  defineOption<std::string>(options, "accumulate", &Options::accumulate);
  defineOption<unsigned>(options, "zero_level", &Options::zeroLevel);
  defineOption<std::string>(options, "zero_axis", &Options::zeroAxis);
  defineOption<bool>(options, "fp8", &Options::fp8);
  defineOption<std::string>(options, "fp8_recipe", &Options::fp8Recipe);
  defineOption<std::string>(options, "fp8_fwd_format", &Options::fp8FwdFormat);
  defineOption<std::string>(options, "fp8_grad_format", &Options::fp8GradFormat);
  defineOption<std::string>(options, "fp8_exclude", &Options::fp8Exclude);
  defineOption<std::string>(options, "fp8_include", &Options::fp8Include);
  defineOption<unsigned>(options, "fp8_history_length",
                         &Options::fp8HistoryLength);
  defineOption<unsigned>(options, "fp8_margin", &Options::fp8Margin);
  defineOption<std::string>(options, "fp8_amax_compute",
                            &Options::fp8AmaxCompute);
  defineOption<unsigned>(options, "fp8_block_size", &Options::fp8BlockSize);
  defineOption<bool>(options, "fp8_pow2_scale", &Options::fp8Pow2Scale);
  defineOption<std::string>(options, "recompute", &Options::recompute);
  defineOption<bool>(options, "sequence_parallel_overlap",
                     &Options::sequenceParallelOverlap);
  defineOption<int64_t>(options, "bucket_bytes", &Options::bucketBytes);
  defineOption<std::string>(options, "grad_reduce", &Options::gradReduce);
  defineOption<bool>(options, "fuse", &Options::fuse);
  options
      .def("set_cluster",
           [](Options &o, const std::string &cluster, const std::string &where) {
             o.clusterSpec = std::make_shared<const ec::cost::ClusterSpec>(
                 parseCluster(cluster, where, "."));
           },
           py::arg("cluster"), py::arg("where") = "cluster",
           "Compile for a cluster (a description as JSON text, its device "
           "inlined): propagation and partition weigh collectives by time")
      .def("__str__", [](const Options &o) {
        std::string s;
        llvm::raw_string_ostream os(s);
        o.print(os);
        // "{a=1 b=2}": the braces belong to --pass-pipeline's syntax, not
        // to --ernie-training-pipeline=<options>.
        return s.size() >= 2 ? s.substr(1, s.size() - 2) : s;
      });

  m.def("compile", &compileModule, py::arg("module"), py::arg("options"),
        py::arg("write_program") = true,
        "Runs the training pipeline (options None: no pass) over a copy of a "
        "module; returns (compiled module, program file bytes, plan report "
        "JSON)");
  m.def("axes_in_shardings", &axesInShardings, py::arg("module"),
        "The mesh axes any sharding of a module names");
  m.def("write_program", [](const PyModule &m) { return writeProgram(m.get()); },
        py::arg("module"), "(program file bytes, plan report JSON) of a module");
  m.def("plan_report", [](const PyModule &m) { return planReport(m.get(), nullptr); },
        py::arg("module"),
        "The plan report (JSON) of a module: per function its memory, "
        "collectives and recomputed ops (--ernie-plan-report's)");

  m.def("estimate_step", &estimateStep, py::arg("module"), py::arg("cluster"),
        py::arg("where") = "cluster", py::arg("device_dir") = ".",
        "The cost model's step estimate (JSON text) of a compiled module");
}

} // namespace ernie_py

//===- Runtime.cpp - the runtime over numpy ------------------------------===//

#include "Extension.h"

#include "ernie/runtime/Checkpoint.h"
#include "ernie/runtime/FloatConvert.h"
#include "ernie/runtime/HfLayout.h"
#include "ernie/runtime/BoundedInput.h"
#include "ernie/runtime/PipelineSchedule.h"
#include "ernie/runtime/Safetensors.h"
#include "ernie/runtime/Session.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <tuple>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

namespace ernie_py {

namespace rt = ::ernie::runtime;

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

/// A safetensors file opened (its header read and checked); a damaged one
/// is a ValueError naming it.
std::unique_ptr<rt::SafetensorsFile> openSafetensors(const std::string &path) {
  try {
    return std::make_unique<rt::SafetensorsFile>(path);
  } catch (const std::runtime_error &e) {
    throw py::value_error(e.what());
  }
}

/// {name: (dtype, array)} and the metadata of a safetensors file; narrow
/// floats come as their raw bits (uint16 for BF16, uint8 for F8_*), named by
/// their safetensors dtype ("BF16", "F8_E4M3", ...).
py::tuple readSafetensors(const std::string &path) {
  std::unique_ptr<rt::SafetensorsFile> file = openSafetensors(path);
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
  case rt::Role::Metric: return "metric";
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
  /// `job`: None (every rank here), or this process's place in a
  /// multi-process job: {"process", "processes", "ranks_per_process",
  /// "store_address", "hostname"}; `identity` what the processes compare.
  PySession(py::bytes file, double timeoutSeconds,
            const std::string &checkFinite, bool trace,
            const std::string &device, py::object job,
            const std::string &identity) {
    std::string bytes = file;
    rt::SessionOptions options;
    options.device = device;
    if (!job.is_none()) {
      py::dict d = job.cast<py::dict>();
      rt::ProcessGroupOptions group;
      group.process = d["process"].cast<int64_t>();
      group.processes = d["processes"].cast<int64_t>();
      group.ranksPerProcess = d["ranks_per_process"].cast<int64_t>();
      group.storeAddress = d["store_address"].cast<std::string>();
      group.hostname = d["hostname"].cast<std::string>();
      options.job = group;
      options.identity = identity;
    }
    if (!(timeoutSeconds > 0 && timeoutSeconds <= 1e9)) // NaN fails too
      throw py::value_error("timeout must be a finite number of seconds > 0, not " +
                            std::to_string(timeoutSeconds));
    options.timeout = std::chrono::milliseconds(int64_t(timeoutSeconds * 1000));
    options.executor.checkFinite =
        translateErrors([&] { return rt::parseFiniteCheck(checkFinite); });
    options.executor.trace = trace;
    // A job's processes meet here (up to the timeout): without the GIL.
    session_ = translateErrors([&] {
      return withoutGil([&] {
        return std::make_unique<rt::Session>(
            rt::Program::fromBytes(bytes, "<compiled program>"), options);
      });
    });
  }

  /// This process's ranks: (first, count).
  std::pair<int64_t, int64_t> localRanks() const {
    return {session_->firstRank(), session_->localRanks()};
  }

  void abort(const std::string &reason) { session_->abort(reason); }
  bool anyProcess(bool flag) { return session_->anyProcess(flag); }
  void setCheckFinite(const std::string &check) {
    session_->setFiniteCheck(
        translateErrors([&] { return rt::parseFiniteCheck(check); }));
  }

  /// The rows of a global batch (dimension 0) this process's ranks read,
  /// ascending: through `fn`'s batch inputs, or a pipeline's micro-batches
  /// (micro-batch k holds rows [k * m, (k + 1) * m)). std::invalid_argument
  /// when the inputs split their rows differently.
  std::vector<int64_t> localRows(const std::string &fn) const {
    const rt::Program &p = program();
    std::vector<const rt::TensorSpec *> inputs;
    int64_t micro = 1;
    if (const rt::PipelineSpec *pipeline = p.pipeline()) {
      for (const rt::TensorSpec &t : pipeline->inputs)
        inputs.push_back(&t);
      micro = pipeline->microBatches;
    } else {
      for (const rt::TensorSpec &t : p.requireFunction(0, fn).arguments)
        if (t.role == rt::Role::Input)
          inputs.push_back(&t);
    }
    std::optional<std::set<int64_t>> rows;
    for (const rt::TensorSpec *spec : inputs) {
      if (spec->globalShape.empty())
        continue; // a scalar: every rank reads it whole
      std::set<int64_t> mine;
      const int64_t first = session_->firstRank();
      for (int64_t r = first; r < first + session_->localRanks(); ++r) {
        std::vector<int64_t> at = rt::pieceOffsets(*spec, p.mesh(), r);
        std::vector<int64_t> extent = rt::realExtent(*spec, at);
        if (extent.empty())
          continue;
        for (int64_t k = 0; k < micro; ++k)
          for (int64_t i = 0; i < extent[0]; ++i)
            mine.insert(k * spec->globalShape[0] + at[0] + i);
      }
      if (rows && *rows != mine)
        throw std::invalid_argument(
            "the batch inputs of @" + fn + " split their rows differently, "
            "so a process's rows are no one set: pass the global batch");
      rows = std::move(mine);
    }
    if (!rows)
      return {};
    return {rows->begin(), rows->end()};
  }

  const rt::Program &program() const { return session_->program(); }

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
    translateErrors([&] {
      return withoutGil([&] { session_->initState(fn, source, seed); return 0; });
    });
  }

  void setState(const std::string &fn, const std::string &name, py::handle v) {
    rt::HostTensor t = fromNumpy(v);
    translateErrors([&] { session_->setState(fn, name, t); return 0; });
  }

  py::array state(const std::string &fn, const std::string &name) {
    // In a job, a collective with the other processes.
    return toNumpy(translateErrors(
        [&] { return withoutGil([&] { return session_->state(fn, name); }); }));
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

  /// In a job every process gathers every rank's events; process 0 writes.
  void writeTrace(const std::string &path) {
    translateErrors([&] {
      auto events = withoutGil([&] { return session_->traceEvents(); });
      if (session_->firstRank() == 0)
        rt::writeChromeTrace(path, events);
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
py::tuple describeProgram(const rt::Program &program) {
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

/// The same of a program file's bytes: validates the file and allocates
/// nothing (abstract compilation of full-size models uses it).
py::tuple describeFile(py::bytes file) {
  std::string bytes = file;
  rt::Program program = translateErrors(
      [&] { return rt::Program::fromBytes(bytes, "<compiled program>"); });
  return describeProgram(program);
}

void bindRuntime(py::module_ &m) {
  py::class_<PySession>(m, "Session")
      .def(py::init<py::bytes, double, std::string, bool, std::string,
                    py::object, std::string>(),
           py::arg("program"), py::arg("timeout") = 60.0,
           py::arg("check_finite") = "off", py::arg("trace") = false,
           py::arg("device") = "cpu", py::arg("job") = py::none(),
           py::arg("identity") = "")
      .def_property_readonly("local_ranks", &PySession::localRanks,
                             "(first mesh rank, count) this process runs")
      .def("local_rows",
           [](const PySession &s, const std::string &fn) {
             return translateErrors([&] { return s.localRows(fn); });
           },
           py::arg("function"),
           "the global batch's rows this process's ranks read")
      .def("any_process",
           [](PySession &s, bool flag) {
             return translateErrors([&] {
               return withoutGil([&] { return s.anyProcess(flag); });
             });
           },
           py::arg("flag"), "whether `flag` is true on any process of the job")
      .def("set_check_finite", &PySession::setCheckFinite, py::arg("check"),
           "What the next calls check for NaN and infinity: off, results "
           "(the loss and the step's metrics) or tensors (every tensor "
           "written: names the first that is not finite)")
      .def("abort", &PySession::abort, py::arg("reason"),
           "fails every process's collectives with `reason`")
      .def_property_readonly("device", [](PySession &s) {
        return s.deviceName();
      })
      .def("write_trace", &PySession::writeTrace)
      .def_property_readonly("num_ranks", &PySession::numRanks)
      .def("signature", &PySession::signature)
      .def("describe",
           [](PySession &s) { return describeProgram(s.program()); },
           "describe() of the session's program (decoded once, when the "
           "session was made)")
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

  m.def("describe", &describeFile, py::arg("program"),
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
        std::unique_ptr<rt::SafetensorsFile> file = openSafetensors(path);
        py::dict tensors;
        for (const rt::SafetensorsEntry &e : file->tensors())
          tensors[py::str(e.name)] = py::make_tuple(rt::safetensorsDtype(e.type), e.shape);
        return py::make_tuple(tensors, file->metadata());
      }, py::arg("path"),
        "({name: (dtype, shape)}, metadata) of a safetensors file; no data read");
  m.def("hf_layout", [](const std::string &configJson, const rt::NamedShapes &states) {
        std::vector<rt::HfTensor> tensors;
        try {
          tensors = rt::hfTensorsOfStates(rt::parseBoundedJson(configJson, "config.json"),
                                          states);
        } catch (const std::runtime_error &e) {
          throw py::value_error(e.what());
        }
        py::list out;
        for (const rt::HfTensor &t : tensors)
          out.append(py::make_tuple(t.name, t.shape, t.state, t.offsets, t.transposed));
        return out;
      }, py::arg("config_json"), py::arg("states"),
        "[(Hugging Face name, its shape, state, offsets, transposed)] of ernie "
        "states [(name, shape)] of the model config.json describes (HfLayout.h)");
  m.def("hf_states", [](const std::string &configJson, const rt::NamedShapes &tensors) {
        std::pair<rt::NamedShapes, std::vector<rt::HfTensor>> found;
        try {
          found = rt::statesOfHfTensors(rt::parseBoundedJson(configJson, "config.json"),
                                        tensors);
        } catch (const std::runtime_error &e) {
          throw py::value_error(e.what());
        }
        py::list placed;
        for (const rt::HfTensor &t : found.second)
          placed.append(py::make_tuple(t.name, t.shape, t.state, t.offsets, t.transposed,
                                       t.sourceOffsets, t.sourceShape));
        return py::make_tuple(found.first, placed);
      }, py::arg("config_json"), py::arg("tensors"),
        "([(state, shape)], [(Hugging Face name, shape, state, offsets, transposed, "
        "source offsets, source shape)]) of a folder's tensors [(name, shape)] "
        "(HfLayout.h's reading direction)");
  m.def("read_safetensors", &readSafetensors, py::arg("path"),
        "({name: (dtype, array)}, metadata) of a safetensors file");
  m.def("write_safetensors", &writeSafetensors, py::arg("path"),
        py::arg("tensors"), py::arg("metadata") = std::map<std::string, std::string>{},
        "writes [(name, safetensors dtype, array)] and metadata");
}

} // namespace ernie_py

//===- Session.cpp - steps with state, one rank or every rank ----------------===//

#include "ernie/runtime/Session.h"

#include "ernie/runtime/Checkpoint.h"

#include <cmath>
#include <cstring>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

namespace ernie::runtime {

namespace {

/// FNV-1a: a name's hash that every process and platform agrees on.
uint64_t stableHash(const std::string &text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text)
    h = (h ^ c) * 1099511628211ull;
  return h;
}

/// splitmix64: a small, well-mixed generator whose sequence is fixed by its
/// seed everywhere (std::uniform_real_distribution is not).
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, 1).
  double uniform() { return (next() >> 11) * 0x1.0p-53; }
};

const TensorSpec *findArgument(const Function &fn, const std::string &name) {
  for (const TensorSpec &arg : fn.arguments)
    if (arg.name == name &&
        (arg.role == Role::Parameter || arg.role == Role::OptimizerState))
      return &arg;
  return nullptr;
}

bool isState(const TensorSpec &spec) {
  return spec.role == Role::Parameter || spec.role == Role::OptimizerState;
}

HostTensor scalar(DType type, double value) {
  HostTensor wide(DType::F64, {});
  *wide.as<double>() = value;
  return convert(wide, type);
}

double scalarValue(const HostTensor &t) {
  return *convert(t, DType::F64).as<double>();
}

/// The tag of the loss the last stage sends the others after a pipelined
/// step: below every program tag (channel * micro_batches + k >= 0).
constexpr int64_t kLossTag = -1;
/// The tag of the k-th metric (grad_norm) the stage computing it sends the
/// others: below the loss's.
int64_t metricTag(size_t k) { return -2 - static_cast<int64_t>(k); }

/// Rows [begin, begin + count) of `t` along dimension 0 (contiguous).
HostTensor rowsOf(const HostTensor &t, int64_t begin, int64_t count) {
  std::vector<int64_t> shape = t.shape;
  shape[0] = count;
  HostTensor out(t.type, shape);
  if (!out.bytes.empty())
    std::memcpy(out.bytes.data(),
                t.bytes.data() + begin * (t.bytes.size() / t.shape[0]),
                out.bytes.size());
  return out;
}

/// k of a batch input "input.<k>" (Program::load checked the name).
size_t batchInput(const TensorSpec &arg) {
  return static_cast<size_t>(std::stoll(arg.name.substr(6)));
}

/// A state's first value: from `source`, else the default — a parameter
/// drawn from the seeded generator, a master weight ("<p>:master") as its
/// parameter `findParam(p)` starts, other slots zero.
HostTensor initialValue(
    const TensorSpec &spec, const StateSource &source, uint64_t seed,
    const std::function<const TensorSpec *(const std::string &)> &findParam) {
  if (source)
    if (std::optional<HostTensor> given = source(spec))
      return convert(*given, spec.type);
  if (spec.role == Role::Parameter)
    return defaultParameter(spec, seed);
  if (std::string param = masterWeightOf(spec.name); !param.empty()) {
    if (const TensorSpec *p = findParam(param)) {
      std::optional<HostTensor> given = source ? source(*p) : std::nullopt;
      return convert(given ? *given : defaultParameter(*p, seed), spec.type);
    }
  }
  return HostTensor(spec.type, spec.globalShape);
}

} // namespace

HostTensor defaultParameter(const TensorSpec &spec, uint64_t seed) {
  HostTensor wide(DType::F64, spec.globalShape);
  double *data = wide.as<double>();
  if (spec.globalShape.size() < 2) {
    std::fill(data, data + wide.numElements(), 1.0);
  } else {
    SplitMix64 gen{stableHash(spec.name) ^ seed};
    double bound = 1.0 / std::sqrt(static_cast<double>(spec.globalShape[0]));
    for (int64_t i = 0; i < wide.numElements(); ++i)
      data[i] = (2.0 * gen.uniform() - 1.0) * bound;
  }
  return convert(wide, spec.type);
}

//===----------------------------------------------------------------------===//
// RankRunner
//===----------------------------------------------------------------------===//

RankRunner::RankRunner(const Program &program, Communicator &comm,
                       ExecutorOptions options)
    : program_(program), comm_(comm), executor_(program, comm, options) {}

void RankRunner::initState(const std::string &fnName, const StateSource &source,
                           uint64_t seed) {
  if (program_.isPipelined()) {
    requirePipelinedName(fnName);
    initPipelinedState(source, seed);
    return;
  }
  const Function &fn = function(fnName);
  const Mesh &mesh = program_.mesh();
  auto findParam = [&](const std::string &name) { return findArgument(fn, name); };
  for (const TensorSpec &arg : fn.arguments)
    if (isState(arg) && !state_.count(arg.name))
      state_[arg.name] = {
          arg, DeviceTensor::upload(
                   device(), pieceOf(initialValue(arg, source, seed, findParam),
                                     arg, mesh, comm_.rank()))};
  initialised_ = true;
}

void RankRunner::setState(const std::string &fnName, const std::string &name,
                          const HostTensor &global) {
  if (program_.isPipelined()) {
    requirePipelinedName(fnName);
    auto held = state_.find(name);
    const TensorSpec *found =
        held != state_.end() ? &held->second.spec : stageStateSpec(name);
    if (!found)
      throw std::invalid_argument(
          "stage " + std::to_string(executor_.stage()) +
          " has no state named '" + name + "'");
    TensorSpec spec = *found;
    state_[name] = {spec, DeviceTensor::upload(
                              device(), pieceOf(convert(global, spec.type), spec,
                                                program_.mesh(), comm_.rank()))};
    return;
  }
  const TensorSpec *spec = findArgument(function(fnName), name);
  if (!spec)
    throw std::invalid_argument("@" + fnName + " has no state named '" + name +
                                "'");
  state_[name] = {*spec, DeviceTensor::upload(
                             device(), pieceOf(convert(global, spec->type), *spec,
                                               program_.mesh(), comm_.rank()))};
}

HostTensor RankRunner::localState(const std::string &name) const {
  auto it = state_.find(name);
  if (it == state_.end())
    throw std::invalid_argument("no state named '" + name + "'");
  return it->second.piece.download();
}

void RankRunner::replaceLocalState(const std::string &name, HostTensor piece) {
  auto it = state_.find(name);
  if (it == state_.end())
    throw std::invalid_argument("no state named '" + name + "'");
  if (piece.type != it->second.spec.type ||
      piece.shape != it->second.spec.localShape)
    throw std::invalid_argument("state '" + name + "': a piece of another layout");
  it->second.piece.assign(piece);
}

const TensorSpec &RankRunner::stateSpec(const std::string &name) const {
  auto it = state_.find(name);
  if (it == state_.end())
    throw std::invalid_argument("no state named '" + name + "'");
  return it->second.spec;
}

/// The layout of a result that updates a state, named as the state.
static TensorSpec stateLayout(const Function &, const TensorSpec &result) {
  TensorSpec spec = result;
  spec.name = result.updates;
  return spec;
}

static bool sameLayout(const TensorSpec &a, const TensorSpec &b) {
  return a.type == b.type && a.localShape == b.localShape &&
         a.sharding.dims == b.sharding.dims &&
         a.sharding.partials == b.sharding.partials;
}

const DeviceTensor &RankRunner::stateFor(const TensorSpec &spec) {
  auto it = state_.find(spec.name);
  if (it == state_.end())
    throw std::invalid_argument("state '" + spec.name +
                                "' has no value yet (initState first)");
  State &state = it->second;
  if (!sameLayout(state.spec, spec)) {
    // Every rank calls the same function (pipelines: every rank of the
    // stage), so every such rank gathers here too.
    HostTensor local = state.piece.download();
    HostTensor global = program_.isPipelined()
                            ? gatherInStage(state.spec, local)
                            : gather(state.spec, local);
    state = {spec, DeviceTensor::upload(
                       device(), pieceOf(convert(global, spec.type), spec,
                                         program_.mesh(), comm_.rank()))};
  }
  return state.piece;
}

std::vector<std::string> RankRunner::stateNames() const {
  std::vector<std::string> names;
  for (const auto &entry : state_)
    names.push_back(entry.first);
  return names;
}

std::vector<HostTensor> RankRunner::call(const std::string &fnName,
                                         const std::vector<HostTensor> &inputs,
                                         double lr, int64_t step,
                                         Results results) {
  // Every rank refuses alike, before anything talks.
  if (std::string problem = callProblem(program_, fnName, inputs, lr, step);
      !problem.empty())
    throw std::invalid_argument(problem);
  if (program_.isPipelined())
    return callPipelined(fnName, inputs, lr, step);
  return callFunction(fnName, inputs, lr, step, results);
}

std::vector<HostTensor>
RankRunner::callFunction(const std::string &fnName,
                         const std::vector<HostTensor> &inputs, double lr,
                         int64_t step, Results wanted) {
  const Function &fn = function(fnName);
  size_t next = 0;
  CallSources from;
  from.input = [&](const TensorSpec &) -> const HostTensor & {
    if (next == inputs.size())
      throw std::invalid_argument("@" + fnName + " needs more than " +
                                  std::to_string(inputs.size()) + " inputs");
    return inputs[next++];
  };
  from.lr = lr;
  from.step = step;
  Arguments args = arguments(fn, from);
  if (next != inputs.size())
    throw std::invalid_argument("@" + fnName + " takes " + std::to_string(next) +
                                " inputs, not " + std::to_string(inputs.size()));
  // Results that update nothing go to the host; updated state stays on the
  // device (downloaded below only when Results::All wants it too).
  std::vector<bool> toHost(fn.results.size());
  for (size_t i = 0; i < fn.results.size(); ++i)
    toHost[i] = fn.results[i].updates.empty();
  std::vector<HostTensor> host;
  std::vector<DeviceTensor> results = executor_.runOnDevice(
      fnName, args.views, 0, updateTargets(fn), &host, toHost);
  // The arguments point into the state the updates replace.
  args.views.clear();
  keepUpdates(fn, results);
  for (size_t i = 0; i < results.size(); ++i)
    if (!fn.results[i].updates.empty() && wanted == Results::All &&
        host[i].bytes.empty() && host[i].shape.empty())
      host[i] = state_.at(fn.results[i].updates).piece.download();
  return host;
}

RankRunner::Arguments RankRunner::arguments(const Function &fn,
                                            const CallSources &from) {
  Arguments args;
  // `views` points into `owned`: it must not reallocate.
  args.owned.reserve(fn.arguments.size());
  auto own = [&](HostTensor t) {
    args.owned.push_back(std::move(t));
    args.views.push_back(args.owned.back());
  };
  for (const TensorSpec &arg : fn.arguments) {
    switch (arg.role) {
    case Role::Parameter:
    case Role::OptimizerState:
      args.views.push_back(stateFor(arg));
      break;
    case Role::LearningRate:
      own(scalar(arg.type, from.lr));
      break;
    case Role::Step:
      own(scalar(arg.type, static_cast<double>(from.step)));
      break;
    case Role::Input:
    case Role::Loss:
      own(pieceOf(convert(from.input(arg), arg.type), arg, program_.mesh(),
                  comm_.rank()));
      break;
    case Role::Metric: // (Program::load keeps metrics to results.)
    case Role::Residual:
    case Role::Gradient:
    case Role::MicroBatchMax:
    case Role::MicroBatchSum: {
      // Program::load keeps these to pipelines and matches every name to
      // a result of the function that makes it.
      const char *kind = roleName(arg.role);
      const std::map<std::string, DeviceTensor> *handOffs =
          arg.role == Role::Residual ? from.residuals : from.sums;
      if (!handOffs)
        throw std::invalid_argument("@" + fn.name + " takes a pipeline's " +
                                    kind + " '" + arg.name + "'");
      auto it = handOffs->find(arg.name);
      if (it == handOffs->end())
        throw std::runtime_error("@" + fn.name + ": nothing on stage " +
                                 std::to_string(executor_.stage()) +
                                 " made its " + kind + " '" + arg.name + "'");
      args.views.push_back(it->second);
      break;
    }
    }
  }
  return args;
}

std::vector<DeviceTensor *> RankRunner::updateTargets(const Function &fn) {
  std::vector<DeviceTensor *> into(fn.results.size(), nullptr);
  for (size_t i = 0; i < fn.results.size(); ++i) {
    const TensorSpec &res = fn.results[i];
    if (res.updates.empty())
      continue;
    auto it = state_.find(res.updates);
    if (it != state_.end() && it->second.piece.type == res.type &&
        it->second.piece.shape == res.localShape)
      into[i] = &it->second.piece;
  }
  return into;
}

void RankRunner::keepUpdates(const Function &fn,
                             std::vector<DeviceTensor> &results) {
  for (size_t i = 0; i < results.size(); ++i) {
    const TensorSpec &res = fn.results[i];
    if (res.updates.empty())
      continue;
    if (results[i].empty()) // written in place
      state_.at(res.updates).spec = stateLayout(fn, res);
    else
      state_[res.updates] = {stateLayout(fn, res), std::move(results[i])};
  }
}

HostTensor RankRunner::gather(const TensorSpec &spec, const HostTensor &local) {
  const Mesh &mesh = program_.mesh();
  size_t bytes = local.bytes.size();
  std::vector<uint8_t> all(bytes * mesh.numRanks());
  // A group over every axis, in mesh order, is every rank in rank order.
  hostAllGather(comm_, local.bytes.data(), all.data(), bytes, mesh.axisNames());
  std::vector<HostTensor> pieces(mesh.numRanks(), HostTensor(spec.type, spec.localShape));
  for (int64_t r = 0; r < mesh.numRanks(); ++r)
    std::copy(all.begin() + r * bytes, all.begin() + (r + 1) * bytes,
              pieces[r].bytes.begin());
  return assemble(pieces, spec, mesh);
}

HostTensor RankRunner::gatherInStage(const TensorSpec &spec,
                                     const HostTensor &local) {
  const Mesh &mesh = program_.mesh();
  Axes axes;
  for (const std::string &axis : mesh.axisNames())
    if (axis != program_.stageAxis())
      axes.push_back(axis);
  size_t bytes = local.bytes.size();
  int64_t members = axes.empty() ? 1 : mesh.group(comm_.rank(), axes).size();
  std::vector<uint8_t> all(bytes * members);
  if (members == 1)
    std::copy(local.bytes.begin(), local.bytes.end(), all.begin());
  else
    hostAllGather(comm_, local.bytes.data(), all.data(), bytes, axes);
  // Every rank's piece is its counterpart's in this stage: shardings never
  // name the stage axis (Program::load).
  std::vector<HostTensor> pieces(mesh.numRanks(),
                                 HostTensor(spec.type, spec.localShape));
  for (int64_t r = 0; r < mesh.numRanks(); ++r) {
    int64_t j = axes.empty() ? 0 : mesh.indexInGroup(r, axes);
    std::copy(all.begin() + j * bytes, all.begin() + (j + 1) * bytes,
              pieces[r].bytes.begin());
  }
  return assemble(pieces, spec, mesh);
}

//===----------------------------------------------------------------------===//
// RankRunner: pipelines
//===----------------------------------------------------------------------===//

void RankRunner::requirePipelinedName(const std::string &fn) const {
  if (fn != "train_step" && fn != "eval_step")
    throw std::invalid_argument(program_.source() +
                                ": a pipelined program runs train_step and "
                                "eval_step, not '" + fn + "'");
}

/// Stage `s`'s pipeline functions, train_update first.
static std::vector<const Function *> functionsOfStage(const Program &program,
                                                      int64_t s) {
  std::vector<const Function *> fns;
  auto add = [&](const std::string &name) {
    if (const Function *fn = program.function(s, name))
      if (std::find(fns.begin(), fns.end(), fn) == fns.end())
        fns.push_back(fn);
  };
  add(pipelineFunction("train_update", s));
  for (int64_t c : program.chunksOf(s)) {
    add(pipelineFunction("train_forward", c));
    add(pipelineFunction("train_backward", c));
    add(pipelineFunction("eval_forward", c));
  }
  add(pipelineFunction("init", s));
  for (const Function &fn : program.functions(s))
    add(fn.name);
  return fns;
}

std::vector<const Function *> RankRunner::stageFunctions() const {
  return functionsOfStage(program_, executor_.stage());
}

const TensorSpec *RankRunner::stageStateSpec(const std::string &name) const {
  for (const Function *fn : stageFunctions())
    if (const TensorSpec *spec = findArgument(*fn, name))
      return spec;
  return nullptr;
}

void RankRunner::initPipelinedState(const StateSource &source, uint64_t seed) {
  const int64_t s = executor_.stage();
  const Mesh &mesh = program_.mesh();
  auto findParam = [&](const std::string &name) -> const TensorSpec * {
    const TensorSpec *spec = stageStateSpec(name);
    return spec && spec->role == Role::Parameter ? spec : nullptr;
  };
  try {
    for (const Function *fn : stageFunctions())
      for (const TensorSpec &arg : fn->arguments)
        if (isState(arg) && !state_.count(arg.name))
          state_[arg.name] = {
              arg, DeviceTensor::upload(
                       device(),
                       pieceOf(initialValue(arg, source, seed, findParam), arg,
                               mesh, comm_.rank()))};
  } catch (const std::exception &e) {
    // Stages with an @init.<s> are about to talk to this one: stop them.
    bool anyInit = false;
    for (int64_t t = 0; t < program_.numStages(); ++t)
      anyInit |= program_.function(t, pipelineFunction("init", t)) != nullptr;
    if (anyInit)
      comm_.abort("rank " + std::to_string(comm_.rank()) +
                  ": initState: " + e.what());
    throw;
  }
  if (initialised_)
    return;
  initialised_ = true;
  const std::string init = pipelineFunction("init", s);
  if (program_.function(s, init))
    callFunction(init, {}, 0.0, 1, Results::All);
}

RankRunner::CallSources RankRunner::microBatch(
    const std::vector<std::vector<HostTensor>> &micro, int64_t k) const {
  CallSources from;
  from.input = [&micro, k](const TensorSpec &arg) -> const HostTensor & {
    return micro[batchInput(arg)][k];
  };
  return from;
}

std::vector<double> RankRunner::trainPipelined(
    const std::vector<std::vector<HostTensor>> &micro, double lr, int64_t step,
    std::map<std::string, HostTensor> &metrics) {
  const PipelineSpec &pipeline = *program_.pipeline();
  const int64_t s = executor_.stage(), lastChunk = program_.numChunks() - 1;
  const bool tracing = executor_.tracing();
  // Residuals by (chunk, micro-batch) between a forward and its backward;
  // what the update takes by name: gradients summed, maxima (fp8 amaxes)
  // their largest, over the micro-batches.
  std::map<std::pair<int64_t, int64_t>, std::map<std::string, DeviceTensor>>
      kept;
  std::map<std::string, DeviceTensor> handed;
  // A backward that adds into the running sums it takes: zeros before the
  // first micro-batch, and each result written over its sum (in place: the
  // executor binds the sum as the argument's and the result's memory).
  auto sumTargets = [&](const Function &fn) {
    std::vector<DeviceTensor *> into(fn.results.size(), nullptr);
    for (const TensorSpec &arg : fn.arguments) {
      if (arg.role != Role::Gradient)
        continue;
      auto [it, fresh] = handed.try_emplace(arg.name);
      if (fresh) {
        it->second = DeviceTensor(device(), arg.type, arg.localShape);
        device().fill(it->second.buffer.data(), 0, it->second.bytes());
      }
      for (size_t j = 0; j < fn.results.size(); ++j)
        if (fn.results[j].role == Role::Gradient &&
            fn.results[j].name == arg.name)
          into[j] = &it->second;
    }
    return into;
  };
  auto hand = [&](const TensorSpec &res, DeviceTensor &value) {
    auto it = handed.find(res.name);
    if (it == handed.end()) {
      handed.emplace(res.name, std::move(value));
      return;
    }
    // reduceInto: the running value's block is read before it is written.
    device().reduceInOrder({it->second.buffer.data(), value.buffer.data()},
                           {it->second.buffer.data()},
                           static_cast<size_t>(value.numElements()), res.type,
                           res.role == Role::MicroBatchMax ? ReduceOp::Max
                                                           : ReduceOp::Sum);
  };
  std::vector<double> losses(pipeline.microBatches, 0.0);
  for (const PipelineStep &st : pipeline.steps[s]) {
    const int64_t c = st.chunk, k = st.microBatch;
    const bool forward = st.action == PipelineAction::Forward;
    const std::string name =
        pipelineFunction(forward ? "train_forward" : "train_backward", c);
    const Function &fn = executor_.function(name);
    int64_t begin = tracing ? traceClockMicros() : 0;
    std::map<std::string, DeviceTensor> residuals;
    if (!forward) {
      auto it = kept.find({c, k});
      if (it == kept.end()) // checkSchedule rules this out.
        throw std::logic_error("B" + std::to_string(c) + " mb" +
                               std::to_string(k) + " before its forward");
      residuals = std::move(it->second);
      kept.erase(it);
    }
    CallSources from = microBatch(micro, k);
    from.residuals = &residuals;
    from.sums = &handed;
    std::vector<DeviceTensor *> into =
        forward ? std::vector<DeviceTensor *>{} : sumTargets(fn);
    std::vector<DeviceTensor> results =
        executor_.runOnDevice(name, arguments(fn, from).views, k, into);
    if (forward)
      kept[{c, k}]; // A forward may keep nothing for its backward.
    for (size_t i = 0; i < results.size(); ++i) {
      const TensorSpec &res = fn.results[i];
      if (forward && res.role == Role::Residual) {
        kept[{c, k}][res.name] = std::move(results[i]);
      } else if (forward && res.role == Role::Loss && c == lastChunk) {
        losses[k] = scalarValue(results[i].download());
      } else if (!results[i].empty() &&
                 (isMicroBatchReduced(res.role) ||
                  (!forward && res.role == Role::Gradient))) {
        // (A result written into its running sum is already summed.)
        hand(res, results[i]);
      }
    }
    if (tracing)
      executor_.recordSpan((forward ? "F" : "B") + std::to_string(c) + " mb" +
                               std::to_string(k),
                           name, begin, traceClockMicros());
  }

  const std::string name = pipelineFunction("train_update", s);
  const Function &fn = executor_.function(name);
  int64_t begin = tracing ? traceClockMicros() : 0;
  CallSources from = microBatch(micro, 0);
  from.lr = lr;
  from.step = step;
  from.sums = &handed;
  std::vector<DeviceTensor> results = executor_.runOnDevice(
      name, arguments(fn, from).views, 0, updateTargets(fn));
  for (size_t i = 0; i < results.size(); ++i)
    if (fn.results[i].role == Role::Metric)
      metrics[fn.results[i].name] =
          convert(results[i].download(), DType::F32);
  keepUpdates(fn, results);
  if (tracing)
    executor_.recordSpan("update", name, begin, traceClockMicros());
  if (program_.stageOf(comm_.rank()) != lastChunk % program_.numStages())
    return {};
  return losses;
}

std::vector<double> RankRunner::evalPipelined(
    const std::vector<std::vector<HostTensor>> &micro) {
  const PipelineSpec &pipeline = *program_.pipeline();
  const int64_t s = executor_.stage(), lastChunk = program_.numChunks() - 1;
  const bool tracing = executor_.tracing();
  std::vector<double> losses(pipeline.microBatches, 0.0);
  for (int64_t k = 0; k < pipeline.microBatches; ++k)
    for (int64_t c : program_.chunksOf(s)) {
      const std::string name = pipelineFunction("eval_forward", c);
      const Function &fn = executor_.function(name);
      int64_t begin = tracing ? traceClockMicros() : 0;
      std::vector<DeviceTensor> results =
          executor_.runOnDevice(name, arguments(fn, microBatch(micro, k)).views, k);
      if (c == lastChunk)
        for (size_t i = 0; i < results.size(); ++i)
          if (fn.results[i].role == Role::Loss)
            losses[k] = scalarValue(results[i].download());
      if (tracing)
        executor_.recordSpan("F" + std::to_string(c) + " mb" + std::to_string(k),
                             name, begin, traceClockMicros());
    }
  if (s != lastChunk % program_.numStages())
    return {};
  return losses;
}

std::vector<HostTensor>
RankRunner::callPipelined(const std::string &fnName,
                          const std::vector<HostTensor> &inputs, double lr,
                          int64_t step) {
  requirePipelinedName(fnName);
  const PipelineSpec &pipeline = *program_.pipeline();
  const int64_t m = pipeline.microBatches;
  // What every rank checks alike, before anything talks: a mistake here
  // leaves the session usable.
  if (inputs.size() != pipeline.inputs.size())
    throw std::invalid_argument(
        "@" + fnName + " of this pipelined program takes " +
        std::to_string(pipeline.inputs.size()) + " batch inputs, not " +
        std::to_string(inputs.size()));
  for (size_t k = 0; k < inputs.size(); ++k) {
    std::vector<int64_t> microShape = pipeline.inputs[k].globalShape,
                         want = microShape;
    want[0] *= m;
    if (inputs[k].shape != want)
      throw std::invalid_argument(
          "@" + fnName + ": batch input " + std::to_string(k) + " must be " +
          shapeString(want) + " (" + std::to_string(m) + " micro-batches of " +
          shapeString(microShape) + "), not " + shapeString(inputs[k].shape));
  }
  if (!initialised_)
    throw std::invalid_argument("@" + fnName +
                                ": the state has no value yet (initState "
                                "first)");
  std::vector<std::vector<HostTensor>> micro(inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k) {
    int64_t rows = pipeline.inputs[k].globalShape[0];
    for (int64_t mb = 0; mb < m; ++mb)
      micro[k].push_back(rowsOf(inputs[k], mb * rows, rows));
  }

  // From here on a failure on this rank must stop the others, which may be
  // waiting for it.
  auto stop = [&](const std::string &cause) {
    std::string message = "rank " + std::to_string(comm_.rank()) + ": @" +
                          fnName + ": " + cause;
    comm_.abort(message);
    return message;
  };
  try {
    std::map<std::string, HostTensor> metrics;
    std::vector<double> losses = fnName == "train_step"
                                     ? trainPipelined(micro, lr, step, metrics)
                                     : evalPipelined(micro);
    // `value`, which the ranks of stage `owner` hold, on every stage.
    auto fromStage = [&](HostTensor &value, int64_t owner, int64_t tag) {
      if (executor_.stage() != owner) {
        hostRecv(comm_, value.bytes.data(), value.bytes.size(),
                 program_.rankInStage(comm_.rank(), owner), tag);
        return;
      }
      for (int64_t t = 0; t < program_.numStages(); ++t)
        if (t != owner)
          hostSend(comm_, value.bytes.data(), value.bytes.size(),
                   program_.rankInStage(comm_.rank(), t), tag);
    };
    const int64_t last = (program_.numChunks() - 1) % program_.numStages();
    HostTensor loss(DType::F32, {});
    if (executor_.stage() == last) {
      double sum = 0;
      for (double l : losses)
        sum += l;
      *loss.as<float>() = static_cast<float>(sum / static_cast<double>(m));
    }
    fromStage(loss, last, kLossTag);
    // The step's metrics after the loss, in stage order: each from the
    // stage whose update computes it.
    std::vector<HostTensor> out{std::move(loss)};
    if (fnName != "train_step")
      return out;
    for (int64_t t = 0; t < program_.numStages(); ++t) {
      const Function *update =
          program_.function(t, pipelineFunction("train_update", t));
      for (const TensorSpec &res : update->results) {
        if (res.role != Role::Metric)
          continue;
        HostTensor value(DType::F32, {});
        if (executor_.stage() == t)
          value = metrics.at(res.name);
        fromStage(value, t, metricTag(out.size() - 1));
        out.push_back(std::move(value));
      }
    }
    return out;
  } catch (const ExecutionError &) {
    throw; // The executor stopped the others already.
  } catch (const CommunicationError &e) {
    throw ExecutionError(stop(e.what()), /*inCollective=*/true);
  } catch (const std::exception &e) {
    throw ExecutionError(stop(e.what()), /*inCollective=*/false);
  }
}

//===----------------------------------------------------------------------===//
// Session
//===----------------------------------------------------------------------===//

Session::Session(Program program, SessionOptions options)
    : Session(std::move(program), options, openDevice(options.device)) {}

Session::Session(Program program, SessionOptions options,
                 std::shared_ptr<Device> device)
    : program_(std::move(program)), device_(std::move(device)),
      world_(program_.mesh(), options.timeout, *device_) {
  const Mesh &mesh = program_.mesh();
  int64_t local = mesh.numRanks();
  if (options.job && options.job->processes > 1) {
    ProcessGroupOptions job = *options.job;
    if (job.ranksPerProcess * job.processes != mesh.numRanks())
      throw std::invalid_argument(
          program_.source() + ": its mesh " + mesh.str() + " has " +
          std::to_string(mesh.numRanks()) + " ranks, but the job is " +
          std::to_string(job.processes) + " processes x " +
          std::to_string(job.ranksPerProcess) +
          " ranks: launch as many processes as the mesh's ranks divided by "
          "the ranks each runs");
    job.timeout = options.timeout;
    job_ = std::make_unique<ProcessGroup>(job);
    firstRank_ = job.process * job.ranksPerProcess;
    local = job.ranksPerProcess;
  }
  // What can refuse this process alone is checked before the processes
  // meet, and a refusal travels with the identity: every process then
  // stops with its reason instead of waiting for this one.
  std::string refusal;
  try {
    if (job_ && !device_->hostAddressable() && local != 1)
      throw std::invalid_argument(
          "on a GPU a process runs one rank (NCCL puts one rank of a "
          "communicator on a device): launch one process per GPU");
    // The ranks here share the one device: what they need must fit.
    if (std::optional<DeviceMemory> memory = device_->memory()) {
      uint64_t needed = 0;
      for (int64_t r = firstRank_; r < firstRank_ + local; ++r)
        needed += deviceBytesNeeded(program_, program_.stageOf(r));
      if (needed > memory->free)
        throw DeviceError(program_.source() + ": its " + std::to_string(local) +
                          " ranks here need " + std::to_string(needed) +
                          " bytes of device memory together (arenas and "
                          "state); " + device_->describe() + " has " +
                          std::to_string(memory->free) + " bytes free of " +
                          std::to_string(memory->total));
    }
    // Results are assembled as if every rank ran the same function, except
    // for pipelines, whose results (the loss, then the step's metrics)
    // every rank returns.
    if (program_.numStages() != 1 && !program_.isPipelined())
      throw std::invalid_argument(program_.source() + ": a Session runs one "
                                  "stage; this program has " +
                                  std::to_string(program_.numStages()));
  } catch (const std::exception &e) {
    if (!job_)
      throw;
    refusal = e.what();
  }
  if (job_)
    job_->join(options.identity + "\nmesh=" + mesh.str() +
                   "\nprocesses=" + std::to_string(job_->options().processes) +
                   "\nranks per process=" + std::to_string(local) +
                   "\ndevice kind=" +
                   (device_->hostAddressable() ? "cpu" : "gpu"),
               refusal);
  if (options.blasThreads > 0)
    setCpuBlasThreads(options.blasThreads);
  for (int64_t r = firstRank_; r < firstRank_ + local; ++r) {
    if (!job_) {
      comms_.push_back(world_.communicator(r));
    } else if (!device_->hostAddressable()) {
      NcclOptions nccl;
      nccl.device = options.device;
      comms_.push_back(job_->ncclCommunicator(mesh, r, nccl));
    } else {
      comms_.push_back(job_->communicator(mesh, r, world_.communicator(r)));
    }
    ranks_.push_back(
        std::make_unique<RankRunner>(program_, *comms_.back(), options.executor));
  }
}

Session::~Session() {
  ranks_.clear();
  comms_.clear();
}

void Session::onEveryRank(const std::function<void(int64_t)> &work) {
  std::mutex mutex;
  std::exception_ptr root, first;
  std::vector<std::thread> threads;
  for (int64_t i = 0; i < localRanks(); ++i)
    threads.emplace_back([&, i] {
      try {
        work(i);
      } catch (const ExecutionError &e) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!first)
          first = std::current_exception();
        if (!root && !e.inCollective)
          root = std::current_exception();
      } catch (const CommunicationError &) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!first)
          first = std::current_exception();
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!first)
          first = std::current_exception();
        if (!root)
          root = std::current_exception();
      }
    });
  for (std::thread &t : threads)
    t.join();
  if (root)
    std::rethrow_exception(root);
  if (!first)
    return;
  // Only collectives failed here: in a job, a process that died is the
  // likely cause, and its rank is what the error should name.
  std::string stopped = job_ ? job_->stoppedProcesses() : "";
  if (stopped.empty())
    std::rethrow_exception(first);
  try {
    std::rethrow_exception(first);
  } catch (const ExecutionError &e) {
    throw ExecutionError(stopped + ". " + e.what(), e.inCollective);
  } catch (const std::exception &e) {
    throw CommunicationError(stopped + ". " + e.what());
  }
}

void Session::abort(const std::string &reason) {
  for (auto &comm : comms_)
    comm->abort(reason);
  if (job_)
    job_->abort(reason);
}

bool Session::anyProcess(bool flag) {
  if (allLocal())
    return flag;
  std::vector<int64_t> any(localRanks());
  onEveryRank([&](int64_t i) {
    int64_t mine = flag ? 1 : 0;
    hostAllReduce(*comms_[i], &mine, &any[i], 1, DType::I64, ReduceOp::Max,
                  program_.mesh().axisNames());
  });
  return any[0] != 0;
}

void Session::setFiniteCheck(FiniteCheck check) {
  for (auto &rank : ranks_)
    rank->setFiniteCheck(check);
}

void Session::initState(const std::string &fn, const StateSource &source,
                        uint64_t seed) {
  if (program_.isPipelined()) {
    // @init.<s> talks between stages.
    onEveryRank([&](int64_t i) { ranks_[i]->initState(fn, source, seed); });
    return;
  }
  // No communication: each rank slices its own pieces.
  for (auto &rank : ranks_)
    rank->initState(fn, source, seed);
}

/// Pipelines: the stages holding state `name`; throws when none does.
static std::vector<int64_t> holdingStages(const Program &program,
                                          const std::string &fn,
                                          const std::string &name) {
  if (fn != "train_step" && fn != "eval_step")
    throw std::invalid_argument(program.source() +
                                ": a pipelined program runs train_step and "
                                "eval_step, not '" + fn + "'");
  std::vector<int64_t> stages = program.stagesHolding(name);
  if (stages.empty())
    throw std::invalid_argument("@" + fn + " has no state named '" + name +
                                "'");
  return stages;
}

void Session::setState(const std::string &fn, const std::string &name,
                       const HostTensor &global) {
  if (program_.isPipelined()) {
    std::vector<int64_t> stages = holdingStages(program_, fn, name);
    for (int64_t i = 0; i < localRanks(); ++i)
      if (std::count(stages.begin(), stages.end(),
                     program_.stageOf(firstRank_ + i)))
        ranks_[i]->setState(fn, name, global);
    return;
  }
  for (auto &rank : ranks_)
    rank->setState(fn, name, global);
}

HostTensor Session::state(const std::string &fn, const std::string &name) {
  if (program_.isPipelined()) {
    // From the first stage holding it: its ranks' pieces stand for every
    // rank's (shardings never name the stage axis).
    int64_t stage = holdingStages(program_, fn, name).front();
    if (allLocal()) {
      std::vector<HostTensor> pieces;
      for (int64_t r = 0; r < numRanks(); ++r)
        pieces.push_back(ranks_[program_.rankInStage(r, stage)]->localState(name));
      return assemble(pieces,
                      ranks_[program_.rankInStage(0, stage)]->stateSpec(name),
                      program_.mesh());
    }
    // Gathered within that stage, then sent along the stage axis to the
    // ranks of the other stages (the stage is the index along that axis).
    const TensorSpec *spec = nullptr;
    for (const Function *f : functionsOfStage(program_, stage))
      if ((spec = findArgument(*f, name)))
        break;
    if (!spec)
      throw std::invalid_argument("stage " + std::to_string(stage) +
                                  " has no function taking state '" + name +
                                  "'");
    std::vector<HostTensor> global(localRanks(),
                                   HostTensor(spec->type, spec->globalShape));
    onEveryRank([&](int64_t i) {
      RankRunner &rank = *ranks_[i];
      if (program_.stageOf(firstRank_ + i) == stage)
        global[i] = rank.gatherInStage(rank.stateSpec(name), rank.localState(name));
      if (program_.numStages() > 1)
        hostBroadcast(*comms_[i], global[i].bytes.data(), global[i].bytes.size(),
                      stage, {program_.stageAxis()});
    });
    return std::move(global[0]);
  }
  if (!findArgument(ranks_[0]->function(fn), name))
    throw std::invalid_argument("@" + fn + " has no state named '" + name + "'");
  if (allLocal()) {
    std::vector<HostTensor> pieces;
    for (const auto &rank : ranks_)
      pieces.push_back(rank->localState(name));
    return assemble(pieces, ranks_[0]->stateSpec(name), program_.mesh());
  }
  std::vector<HostTensor> global(localRanks());
  onEveryRank([&](int64_t i) {
    global[i] = ranks_[i]->gather(ranks_[i]->stateSpec(name),
                                  ranks_[i]->localState(name));
  });
  return std::move(global[0]);
}

std::string Session::saveCheckpoint(const std::string &root, int64_t step,
                                    const std::string &metadataJson, int keep,
                                    IoMeter *meter) {
  // Every rank writes its pieces; rank 0 (of process 0) commits.
  std::vector<std::string> dirs(localRanks());
  onEveryRank([&](int64_t i) {
    dirs[i] = saveCheckpointOnRank(program_, *ranks_[i], *comms_[i], root, step,
                                   metadataJson, keep, meter);
  });
  return dirs[0];
}

CheckpointInfo Session::loadCheckpoint(const std::string &path, IoMeter *meter) {
  std::vector<CheckpointInfo> infos(localRanks());
  onEveryRank([&](int64_t i) {
    infos[i] = loadCheckpointOnRank(program_, *ranks_[i], *comms_[i], path, meter);
  });
  return infos[0];
}

std::vector<std::string> Session::loadWeights(const WeightMap &weights,
                                              IoMeter *meter) {
  std::vector<std::string> states = program_.stateNames();
  auto isState = [&](const std::string &name) {
    return std::find(states.begin(), states.end(), name) != states.end();
  };
  std::set<std::string> loaded;
  for (const auto &[name, pieces] : weights) {
    if (!isState(name))
      throw std::invalid_argument("the program has no state '" + name +
                                  "' to load weights into");
    loaded.insert(name);
    if (isState(name + ":master"))
      loaded.insert(name + ":master");
  }
  onEveryRank([&](int64_t i) {
    loadWeightsOnRank(program_, *ranks_[i], *comms_[i], weights, meter);
  });
  return {loaded.begin(), loaded.end()};
}

std::vector<HostTensor> Session::call(const std::string &fn,
                                      const std::vector<HostTensor> &inputs,
                                      double lr, int64_t step, Results wanted) {
  if (std::string problem = callProblem(program_, fn, inputs, lr, step);
      !problem.empty())
    throw std::invalid_argument(problem); // before a thread starts
  const bool pipelined = program_.isPipelined();
  const Function *f = pipelined ? nullptr : &ranks_[0]->function(fn);
  auto skipped = [&](size_t j) {
    return wanted == Results::ExceptUpdates && !f->results[j].updates.empty();
  };
  std::vector<std::vector<HostTensor>> perRank(localRanks());
  onEveryRank([&](int64_t i) {
    perRank[i] = ranks_[i]->call(fn, inputs, lr, step, wanted);
    if (pipelined || allLocal())
      return;
    // The other processes hold the rest of each result.
    for (size_t j = 0; j < f->results.size(); ++j)
      if (!skipped(j) && !f->results[j].sharding.isReplicated())
        perRank[i][j] = ranks_[i]->gather(f->results[j], perRank[i][j]);
  });
  if (pipelined || !allLocal())
    return std::move(perRank[0]); // global values (a pipeline's: the loss)
  std::vector<HostTensor> results;
  for (size_t j = 0; j < f->results.size(); ++j) {
    if (skipped(j)) {
      results.emplace_back();
      continue;
    }
    std::vector<HostTensor> pieces;
    for (int64_t r = 0; r < numRanks(); ++r)
      pieces.push_back(std::move(perRank[r][j]));
    results.push_back(assemble(pieces, f->results[j], program_.mesh()));
  }
  return results;
}

namespace {

void putInt(std::string &out, int64_t v) {
  out.append(reinterpret_cast<const char *>(&v), sizeof v);
}
void putText(std::string &out, const std::string &text) {
  putInt(out, static_cast<int64_t>(text.size()));
  out += text;
}

/// One rank's trace events as bytes (a process's own format: the processes
/// of a job run the same build).
std::string encodeEvents(const std::vector<TraceEvent> &events) {
  std::string out;
  putInt(out, static_cast<int64_t>(events.size()));
  for (const TraceEvent &e : events) {
    putText(out, e.name);
    putText(out, e.function);
    putInt(out, e.collective);
    putInt(out, e.startMicros);
    putInt(out, e.durationMicros);
  }
  return out;
}

std::vector<TraceEvent> decodeEvents(const char *data, size_t size) {
  size_t at = 0;
  auto getInt = [&] {
    if (at + sizeof(int64_t) > size)
      throw CommunicationError("a peer's trace events are truncated");
    int64_t v;
    std::memcpy(&v, data + at, sizeof v);
    at += sizeof v;
    return v;
  };
  auto getText = [&] {
    int64_t n = getInt();
    if (n < 0 || at + size_t(n) > size)
      throw CommunicationError("a peer's trace events are truncated");
    std::string text(data + at, size_t(n));
    at += size_t(n);
    return text;
  };
  std::vector<TraceEvent> events(size_t(std::max<int64_t>(getInt(), 0)));
  for (TraceEvent &e : events) {
    e.name = getText();
    e.function = getText();
    e.collective = getInt() != 0;
    e.startMicros = getInt();
    e.durationMicros = getInt();
  }
  return events;
}

} // namespace

std::vector<std::vector<TraceEvent>> Session::traceEvents() {
  std::vector<std::vector<TraceEvent>> events;
  if (allLocal()) {
    for (const auto &rank : ranks_)
      events.push_back(rank->executor().traceEvents());
    return events;
  }
  // Every rank's events, from every process: sizes first, then the bytes
  // padded to the largest.
  const Axes all = program_.mesh().axisNames();
  const int64_t n = numRanks();
  events.resize(n);
  onEveryRank([&](int64_t i) {
    std::string mine = encodeEvents(ranks_[i]->executor().traceEvents());
    int64_t size = static_cast<int64_t>(mine.size());
    std::vector<int64_t> sizes(n);
    hostAllGather(*comms_[i], &size, sizes.data(), sizeof size, all);
    size_t width = size_t(*std::max_element(sizes.begin(), sizes.end()));
    mine.resize(width);
    std::vector<char> everyone(width * n);
    hostAllGather(*comms_[i], mine.data(), everyone.data(), width, all);
    if (i == 0)
      for (int64_t r = 0; r < n; ++r)
        events[r] = decodeEvents(everyone.data() + r * width, size_t(sizes[r]));
  });
  return events;
}

} // namespace ernie::runtime

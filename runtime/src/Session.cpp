//===- Session.cpp - steps with state, one rank or every rank ----------------===//

#include "ernie/runtime/Session.h"

#include <cmath>
#include <mutex>
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
  const Function &fn = function(fnName);
  const Mesh &mesh = program_.mesh();
  auto initial = [&](const TensorSpec &spec) -> HostTensor {
    if (source)
      if (std::optional<HostTensor> given = source(spec))
        return convert(*given, spec.type);
    if (spec.role == Role::Parameter)
      return defaultParameter(spec, seed);
    // A master weight starts as its parameter; other slots start at zero.
    const std::string suffix = ":master";
    if (spec.name.size() > suffix.size() &&
        spec.name.compare(spec.name.size() - suffix.size(), suffix.size(),
                          suffix) == 0) {
      std::string param = spec.name.substr(0, spec.name.size() - suffix.size());
      if (const TensorSpec *p = findArgument(fn, param)) {
        std::optional<HostTensor> given = source ? source(*p) : std::nullopt;
        return convert(given ? *given : defaultParameter(*p, seed), spec.type);
      }
    }
    return HostTensor(spec.type, spec.globalShape);
  };
  for (const TensorSpec &arg : fn.arguments)
    if (isState(arg) && !state_.count(arg.name))
      state_[arg.name] = {arg, pieceOf(initial(arg), arg, mesh, comm_.rank())};
}

void RankRunner::setState(const std::string &fnName, const std::string &name,
                          const HostTensor &global) {
  const TensorSpec *spec = findArgument(function(fnName), name);
  if (!spec)
    throw std::invalid_argument("@" + fnName + " has no state named '" + name +
                                "'");
  state_[name] = {*spec, pieceOf(convert(global, spec->type), *spec,
                                 program_.mesh(), comm_.rank())};
}

const HostTensor &RankRunner::localState(const std::string &name) const {
  auto it = state_.find(name);
  if (it == state_.end())
    throw std::invalid_argument("no state named '" + name + "'");
  return it->second.piece;
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

const HostTensor &RankRunner::stateFor(const TensorSpec &spec) {
  auto it = state_.find(spec.name);
  if (it == state_.end())
    throw std::invalid_argument("state '" + spec.name +
                                "' has no value yet (initState first)");
  State &state = it->second;
  if (!sameLayout(state.spec, spec)) {
    // Every rank calls the same function, so every rank gathers here too.
    HostTensor global = gather(state.spec, state.piece);
    state = {spec, pieceOf(convert(global, spec.type), spec, program_.mesh(),
                           comm_.rank())};
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
                                         double lr, int64_t step) {
  const Function &fn = function(fnName);
  std::vector<HostTensor> local;
  size_t next = 0;
  for (const TensorSpec &arg : fn.arguments) {
    switch (arg.role) {
    case Role::Parameter:
    case Role::OptimizerState:
      local.push_back(stateFor(arg));
      break;
    case Role::LearningRate:
      local.push_back(scalar(arg.type, lr));
      break;
    case Role::Step:
      local.push_back(scalar(arg.type, static_cast<double>(step)));
      break;
    case Role::Input:
    case Role::Loss:
      if (next == inputs.size())
        throw std::invalid_argument("@" + fnName + " needs more than " +
                                    std::to_string(inputs.size()) + " inputs");
      local.push_back(
          pieceOf(convert(inputs[next++], arg.type), arg, program_.mesh(),
                  comm_.rank()));
      break;
    }
  }
  if (next != inputs.size())
    throw std::invalid_argument("@" + fnName + " takes " + std::to_string(next) +
                                " inputs, not " + std::to_string(inputs.size()));
  std::vector<HostTensor> results = executor_.run(fnName, local);
  for (size_t i = 0; i < results.size(); ++i)
    if (!fn.results[i].updates.empty())
      state_[fn.results[i].updates] = {stateLayout(fn, fn.results[i]), results[i]};
  return results;
}

HostTensor RankRunner::gather(const TensorSpec &spec, const HostTensor &local) {
  const Mesh &mesh = program_.mesh();
  size_t bytes = local.bytes.size();
  std::vector<uint8_t> all(bytes * mesh.numRanks());
  // A group over every axis, in mesh order, is every rank in rank order.
  comm_.allGather(local.bytes.data(), all.data(), bytes, mesh.axisNames());
  std::vector<HostTensor> pieces(mesh.numRanks(), HostTensor(spec.type, spec.localShape));
  for (int64_t r = 0; r < mesh.numRanks(); ++r)
    std::copy(all.begin() + r * bytes, all.begin() + (r + 1) * bytes,
              pieces[r].bytes.begin());
  return assemble(pieces, spec, mesh);
}

//===----------------------------------------------------------------------===//
// Session
//===----------------------------------------------------------------------===//

Session::Session(Program program, SessionOptions options)
    : program_(std::move(program)), world_(program_.mesh(), options.timeout) {
  if (options.blasThreads > 0)
    setCpuBlasThreads(options.blasThreads);
  // Results are assembled as if every rank ran the same function.
  if (program_.numStages() != 1)
    throw std::invalid_argument(program_.source() + ": a Session runs one "
                                "stage; this program has " +
                                std::to_string(program_.numStages()));
  for (int64_t r = 0; r < program_.mesh().numRanks(); ++r) {
    comms_.push_back(world_.communicator(r));
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
  for (int64_t r = 0; r < numRanks(); ++r)
    threads.emplace_back([&, r] {
      try {
        work(r);
      } catch (const ExecutionError &e) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!first)
          first = std::current_exception();
        if (!root && !e.inCollective)
          root = std::current_exception();
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
  if (first)
    std::rethrow_exception(first);
}

void Session::initState(const std::string &fn, const StateSource &source,
                        uint64_t seed) {
  // No communication: each rank slices its own pieces.
  for (auto &rank : ranks_)
    rank->initState(fn, source, seed);
}

void Session::setState(const std::string &fn, const std::string &name,
                       const HostTensor &global) {
  for (auto &rank : ranks_)
    rank->setState(fn, name, global);
}

HostTensor Session::state(const std::string &fn, const std::string &name) const {
  const TensorSpec *spec = findArgument(ranks_[0]->function(fn), name);
  if (!spec)
    throw std::invalid_argument("@" + fn + " has no state named '" + name + "'");
  (void)spec;
  std::vector<HostTensor> pieces;
  for (const auto &rank : ranks_)
    pieces.push_back(rank->localState(name));
  return assemble(pieces, ranks_[0]->stateSpec(name), program_.mesh());
}

std::vector<HostTensor> Session::call(const std::string &fn,
                                      const std::vector<HostTensor> &inputs,
                                      double lr, int64_t step) {
  std::vector<std::vector<HostTensor>> perRank(numRanks());
  onEveryRank([&](int64_t r) { perRank[r] = ranks_[r]->call(fn, inputs, lr, step); });
  const Function &f = ranks_[0]->function(fn);
  std::vector<HostTensor> results;
  for (size_t i = 0; i < f.results.size(); ++i) {
    std::vector<HostTensor> pieces;
    for (int64_t r = 0; r < numRanks(); ++r)
      pieces.push_back(std::move(perRank[r][i]));
    results.push_back(assemble(pieces, f.results[i], program_.mesh()));
  }
  return results;
}

std::vector<std::vector<TraceEvent>> Session::traceEvents() const {
  std::vector<std::vector<TraceEvent>> events;
  for (const auto &rank : ranks_)
    events.push_back(rank->executor().traceEvents());
  return events;
}

} // namespace ernie::runtime

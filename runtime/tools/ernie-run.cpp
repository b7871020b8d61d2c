//===- ernie-run.cpp - run an ernie program file -----------------------------===//
//
//   ernie-run prog.ernie [--ranks N] [--device cpu|cuda|cuda:N]
//             [--backend threads|gloo|nccl] [--steps K]
//             [--function NAME] [--inputs DIR] [--outputs DIR] [--lr X]
//             [--seed S] [--check-finite[-tensors]] [--timeout SECONDS]
//             [--quiet]
//             [--trace FILE] [--save DIR --save-every K [--keep N]]
//             [--resume PATH]
//             [--rank R (--store DIR | --store-address HOST:PORT)]
//
// Runs K calls of a function (train_step when the program has one), carrying
// parameters and optimizer state from step to step, and prints the loss and
// the step time. `--backend threads` (the default) runs every rank as a
// thread of this process; `--backend gloo` runs one process per rank: without
// --rank, ernie-run launches them itself on this host; with --rank, this
// process is that one rank of a run started by hand (on several hosts, with
// --store-address). Any failure on any rank exits non-zero with a message
// naming the rank and the instruction.
//
// Devices: --device cpu (the default) or cuda / cuda:N (UNVERIFIED: the CUDA
// backend has not run on a GPU yet). On a GPU, `--backend threads` runs every
// rank as a thread on that one GPU (the shared-device engine) and
// `--backend nccl` one process per GPU over NCCL (launched here, one per
// visible GPU, or by hand with --rank). Gloo carries host memory only.
// Without a CUDA build or a visible GPU, --device cuda says so and exits 1.
//
// Launched the way PyTorch jobs are (torchrun, a scheduler): with RANK and
// WORLD_SIZE in the environment, this process is rank RANK of a multi-process
// run (Gloo on the CPU, NCCL on a GPU unless --backend says otherwise),
// rendezvousing at MASTER_ADDR:MASTER_PORT (rank 0 serves the store there)
// unless --store or --store-address is given; LOCAL_RANK picks the GPU.
//
// Checkpoints: --save DIR --save-every K saves a distributed checkpoint
// (Checkpoint.h) every K steps into DIR/step-<N>, keeping the newest N at or
// below the step with --keep (a higher step is another run's, never
// removed); --resume PATH (a checkpoint, or a directory of them: the newest
// whose files are all there) loads one, every block's checksum verified,
// resharded to this program's mesh and plan, and
// continues from its step to --steps (the last step, counted from the
// start of training). Each save and load prints its MB/s.
//
// Pipelined programs run train_step (the default) or eval_step on either
// backend: the batch inputs are input<k>.npy (or input.<k>.npy), each of
// micro_batches times the program's micro-batch rows. Every rank gets the
// loss (the last stage sends it); rank 0 prints it. With --outputs, each
// state is written by the first rank of the first stage holding it.
//
//===----------------------------------------------------------------------===//

#include "ernie/runtime/Checkpoint.h"
#include "ernie/runtime/Device.h"
#include "ernie/runtime/GlooCommunicator.h"
#include "ernie/runtime/NcclCommunicator.h"
#include "ernie/runtime/Session.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace fs = std::filesystem;
using namespace ernie::runtime;

namespace {

struct Options {
  std::string program;
  std::optional<int64_t> ranks;
  std::string backend = "threads";
  bool backendGiven = false;
  std::string device = "cpu";
  bool nativeReductions = false;
  int64_t steps = 1;
  std::string function;
  std::string inputs, outputs, trace;
  std::string save, resume;
  int64_t saveEvery = 0;
  int keep = 0;
  double lr = 1e-3;
  uint64_t seed = 0;
  FiniteCheck checkFinite = FiniteCheck::Off;
  double timeoutSeconds = 60;
  bool quiet = false;
  int blasThreads = 1;
  // One Gloo rank of a run launched elsewhere.
  std::optional<int64_t> rank;
  std::string store, storeAddress;
};

const char *kUsage =
    "usage: ernie-run PROGRAM [--ranks N] [--device cpu|cuda|cuda:N]\n"
    "                 [--backend threads|gloo|nccl] [--steps K]\n"
    "                 [--function NAME] [--inputs DIR] [--outputs DIR] [--lr X]\n"
    "                 [--trace FILE]\n"
    "                 [--seed S] [--check-finite[-tensors]] [--timeout SECONDS]\n"
    "                 [--quiet]\n"
    "                 [--blas-threads N]\n"
    "                 [--save DIR --save-every K [--keep N]] [--resume PATH]\n"
    "                 [--rank R (--store DIR | --store-address HOST:PORT)]\n"
    "\n"
    "Runs K steps of a program file written by `ernie-translate "
    "--ernie-to-program`.\n"
    "  --ranks N         ranks to run (default: the program's mesh size)\n"
    "  --device D        cpu (default), cuda or cuda:N (the CUDA backend is\n"
    "                    unverified: it has not yet run on a GPU)\n"
    "  --backend B       threads (one process; on a GPU every rank shares it),\n"
    "                    gloo (one process per rank, CPU) or nccl (one process\n"
    "                    per GPU); RANK/WORLD_SIZE in the environment pick\n"
    "                    gloo or nccl\n"
    "  --nccl-native-reductions  NCCL's own all-reduce and reduce-scatter\n"
    "                    (default: exchange and reduce in group order, the\n"
    "                    bits of every other backend)\n"
    "  --steps K         calls of the function, state carried between them\n"
    "  --function NAME   the function to call (default: train_step if present)\n"
    "  --inputs DIR      global batch inputs (input<k>.npy: the k-th input\n"
    "                    argument, or arg<i>.npy) and initial state (<name>.npy)\n"
    "  --outputs DIR     writes result<i>.npy of the last step, the final state\n"
    "                    <name>.npy and losses.npy (every step's loss, f64)\n"
    "  --lr X            the learning rate fed to train_step (default 1e-3)\n"
    "  --check-finite    fail when the loss (or a metric) is NaN or infinite\n"
    "  --check-finite-tensors  fail at the first instruction that writes a\n"
    "                    NaN or infinity, naming it (slow: finds a NaN)\n"
    "  --trace FILE      a Chrome-trace / Perfetto timeline of every\n"
    "                    instruction on every rank (Gloo: FILE.rank<r>.json)\n"
    "  --timeout S       seconds a collective waits for its peers (default 60)\n"
    "  --save DIR        save a distributed checkpoint DIR/step-<N> every\n"
    "  --save-every K    K steps (and keep the newest N up to the step with\n"
    "                    --keep N)\n"
    "  --resume PATH     start from a checkpoint (or the newest complete one\n"
    "                    under PATH), checksums verified,\n"
    "                    resharded; runs its step + 1 to --steps\n";

[[noreturn]] void usageError(const std::string &message) {
  std::cerr << "ernie-run: error: " << message << "\n" << kUsage;
  std::exit(2);
}

template <typename T> T parseNumber(const std::string &flag, const std::string &text) {
  std::istringstream in(text);
  T value;
  if (!(in >> value) || !in.eof())
    usageError(flag + " expects a number, not '" + text + "'");
  return value;
}

Options parseOptions(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc)
        usageError(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      std::exit(0);
    } else if (arg == "--ranks") {
      o.ranks = parseNumber<int64_t>(arg, value());
    } else if (arg == "--backend") {
      o.backend = value();
      o.backendGiven = true;
      if (o.backend != "threads" && o.backend != "gloo" && o.backend != "nccl")
        usageError("--backend must be threads, gloo or nccl, not '" +
                   o.backend + "'");
    } else if (arg == "--device") {
      o.device = value();
      if (o.device != "cpu" && o.device != "cuda" &&
          o.device.rfind("cuda:", 0) != 0)
        usageError("--device must be cpu, cuda or cuda:N, not '" + o.device +
                   "'");
    } else if (arg == "--nccl-native-reductions") {
      o.nativeReductions = true;
    } else if (arg == "--steps") {
      o.steps = parseNumber<int64_t>(arg, value());
      if (o.steps < 1)
        usageError("--steps must be at least 1");
    } else if (arg == "--function") {
      o.function = value();
    } else if (arg == "--inputs") {
      o.inputs = value();
    } else if (arg == "--outputs") {
      o.outputs = value();
    } else if (arg == "--trace") {
      o.trace = value();
    } else if (arg == "--lr") {
      o.lr = parseNumber<double>(arg, value());
    } else if (arg == "--seed") {
      o.seed = parseNumber<uint64_t>(arg, value());
    } else if (arg == "--check-finite") {
      o.checkFinite = FiniteCheck::Results;
    } else if (arg == "--check-finite-tensors") {
      o.checkFinite = FiniteCheck::Tensors;
    } else if (arg == "--timeout") {
      o.timeoutSeconds = parseNumber<double>(arg, value());
      if (!(o.timeoutSeconds > 0 && o.timeoutSeconds <= 1e9)) // NaN too
        usageError("--timeout must be a finite number of seconds > 0");
    } else if (arg == "--quiet") {
      o.quiet = true;
    } else if (arg == "--blas-threads") {
      o.blasThreads = parseNumber<int>(arg, value());
    } else if (arg == "--save") {
      o.save = value();
    } else if (arg == "--save-every") {
      o.saveEvery = parseNumber<int64_t>(arg, value());
      if (o.saveEvery < 1)
        usageError("--save-every must be at least 1");
    } else if (arg == "--keep") {
      o.keep = parseNumber<int>(arg, value());
      if (o.keep < 1)
        usageError("--keep must be at least 1");
    } else if (arg == "--resume") {
      o.resume = value();
    } else if (arg == "--rank") {
      o.rank = parseNumber<int64_t>(arg, value());
    } else if (arg == "--store") {
      o.store = value();
    } else if (arg == "--store-address") {
      o.storeAddress = value();
    } else if (!arg.empty() && arg[0] == '-') {
      usageError("unknown option '" + arg + "'");
    } else if (o.program.empty()) {
      o.program = arg;
    } else {
      usageError("more than one program file given");
    }
  }
  if (o.program.empty())
    usageError("no program file given");
  if (o.save.empty() != (o.saveEvery == 0))
    usageError("--save DIR and --save-every K go together");
  if (o.keep && o.save.empty())
    usageError("--keep applies to --save");
  // PyTorch's launch variables: this process is rank RANK of WORLD_SIZE.
  if (!o.rank) {
    if (const char *rank = std::getenv("RANK")) {
      o.rank = parseNumber<int64_t>("RANK", rank);
      if (!o.backendGiven)
        o.backend = o.device == "cpu" ? "gloo" : "nccl";
      const char *addr = std::getenv("MASTER_ADDR"),
                 *port = std::getenv("MASTER_PORT");
      if (o.store.empty() && o.storeAddress.empty() && addr && port)
        o.storeAddress = std::string(addr) + ":" + port;
    }
  }
  const bool cpu = o.device == "cpu";
  if (o.backend == "nccl" && cpu)
    usageError("--backend nccl runs on GPUs: add --device cuda");
  if (o.backend == "gloo" && !cpu)
    usageError("Gloo carries host memory: with --device " + o.device +
               " use --backend nccl (one process per GPU) or threads (every "
               "rank on one GPU)");
  if (o.rank && o.backend == "threads")
    usageError(std::getenv("RANK") && !o.backendGiven
                   ? "RANK is set: a multi-process run needs --backend gloo or nccl"
                   : "--rank runs one rank of a multi-process run: add "
                     "--backend gloo or nccl");
  if (o.rank && o.store.empty() && o.storeAddress.empty())
    usageError("--rank (or RANK) needs --store DIR, --store-address HOST:PORT "
               "or MASTER_ADDR and MASTER_PORT");
  return o;
}

/// The function to run: the one asked for, else train_step, else the only one.
std::string chooseFunction(const Program &program, const Options &o) {
  if (!o.function.empty())
    return o.function;
  if (program.isPipelined())
    return "train_step";
  const auto &fns = program.functions(0);
  for (const Function &fn : fns)
    if (fn.name == "train_step")
      return fn.name;
  if (fns.size() == 1)
    return fns[0].name;
  std::string names;
  for (const Function &fn : fns)
    names += " @" + fn.name;
  throw std::invalid_argument("the program has several functions (" + names +
                              " ); choose one with --function");
}

std::string fileName(const TensorSpec &spec, size_t index) {
  return spec.name.empty() ? "arg" + std::to_string(index) : spec.name;
}

/// A deterministic batch input: floats uniform in [-1, 1), integers zero
/// (valid indices for any table).
HostTensor generatedInput(const TensorSpec &spec, uint64_t seed, size_t index) {
  if (!isFloat(spec.type))
    return HostTensor(spec.type, spec.globalShape);
  HostTensor wide(DType::F64, spec.globalShape);
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + index + 1;
  for (int64_t i = 0; i < wide.numElements(); ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    wide.as<double>()[i] = ((state >> 11) * 0x1.0p-53) * 2.0 - 1.0;
  }
  return convert(wide, spec.type);
}

/// What a call of `name` takes from the caller, with each one's argument
/// index: the function's inputs or, for a pipeline, its batch inputs (whole
/// batches: micro_batches times the micro-batch's rows).
std::vector<std::pair<size_t, TensorSpec>> batchInputs(const Program &program,
                                                       const std::string &name) {
  std::vector<std::pair<size_t, TensorSpec>> out;
  if (const PipelineSpec *pipeline = program.pipeline()) {
    for (size_t k = 0; k < pipeline->inputs.size(); ++k) {
      TensorSpec spec = pipeline->inputs[k];
      spec.globalShape[0] *= pipeline->microBatches;
      out.emplace_back(k, spec);
    }
    return out;
  }
  const Function &fn = program.requireFunction(0, name);
  for (size_t i = 0; i < fn.arguments.size(); ++i)
    if (fn.arguments[i].role == Role::Input)
      out.emplace_back(i, fn.arguments[i]);
  return out;
}

/// The global batch inputs, in argument order.
std::vector<HostTensor> loadInputs(const Program &program,
                                   const std::string &name, const Options &o) {
  std::vector<HostTensor> inputs;
  for (const auto &[i, arg] : batchInputs(program, name)) {
    if (o.inputs.empty()) {
      inputs.push_back(generatedInput(arg, o.seed, i));
      continue;
    }
    // By name, by position among the inputs, or by argument index.
    fs::path dir(o.inputs);
    fs::path candidates[] = {
        dir / (fileName(arg, i) + ".npy"),
        dir / ("input" + std::to_string(inputs.size()) + ".npy"),
        dir / ("arg" + std::to_string(i) + ".npy")};
    fs::path path;
    for (const fs::path &c : candidates)
      if (path.empty() && fs::exists(c))
        path = c;
    if (path.empty())
      throw std::runtime_error("no input for @" + name + " argument " +
                               std::to_string(i) + ": none of " +
                               candidates[1].string() + ", " +
                               candidates[2].string() + " exists");
    HostTensor t = readNpy(path.string(), arg.type);
    if (t.shape != arg.globalShape)
      throw std::runtime_error(path.string() + ": has the wrong shape for @" +
                               name + " argument " + std::to_string(i));
    inputs.push_back(std::move(t));
  }
  return inputs;
}

StateSource stateFrom(const Options &o) {
  return [dir = o.inputs](const TensorSpec &spec) -> std::optional<HostTensor> {
    if (dir.empty())
      return std::nullopt;
    fs::path path = fs::path(dir) / (spec.name + ".npy");
    if (!fs::exists(path))
      return std::nullopt;
    HostTensor t = readNpy(path.string(), spec.type);
    if (t.shape != spec.globalShape)
      throw std::runtime_error(path.string() + ": has the wrong shape for '" +
                               spec.name + "'");
    return t;
  };
}

/// Index of the loss result, if the function has one.
std::optional<size_t> lossIndex(const Function &fn) {
  for (size_t i = 0; i < fn.results.size(); ++i)
    if (fn.results[i].role == Role::Loss)
      return i;
  return std::nullopt;
}

double scalarValue(const HostTensor &t) {
  HostTensor wide = convert(t, DType::F64);
  return wide.numElements() ? wide.as<double>()[0] : NAN;
}

/// Step lines and the progress bar (rank 0 only).
class Reporter {
public:
  Reporter(int64_t steps, bool quiet)
      : steps_(steps), quiet_(quiet), bar_(steps > 20 && isatty(2)) {}

  void step(int64_t step, std::optional<double> loss, double ms) {
    if (step > 1 || steps_ == 1) {
      total_ += ms;
      ++timed_;
    }
    if (quiet_)
      return;
    int64_t every = steps_ <= 20 ? 1 : steps_ / 10;
    if (step % every == 0 || step == 1 || step == steps_) {
      if (bar_)
        std::cerr << "\r\033[K";
      std::printf("step %*lld/%lld", int(std::to_string(steps_).size()),
                  (long long)step, (long long)steps_);
      if (loss)
        std::printf("  loss %.6f", *loss);
      std::printf("  time %.3f ms\n", ms);
      std::fflush(stdout);
    }
    if (bar_) {
      int width = 40, filled = int(width * step / steps_);
      std::cerr << "\r[" << std::string(filled, '#')
                << std::string(width - filled, ' ') << "] " << step << "/"
                << steps_ << std::flush;
      if (step == steps_)
        std::cerr << "\n";
    }
  }

  void summary() {
    if (!quiet_ && timed_)
      std::printf("%lld steps, mean step time %.3f ms%s\n", (long long)steps_,
                  total_ / timed_, steps_ > 1 ? " (first step excluded)" : "");
  }

private:
  int64_t steps_;
  bool quiet_, bar_;
  double total_ = 0;
  int64_t timed_ = 0;
};

double millisecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now() - start)
      .count();
}

void writeOutputs(const std::string &dir,
                  const std::vector<std::pair<size_t, HostTensor>> &results,
                  const std::vector<std::pair<std::string, HostTensor>> &state,
                  const std::vector<double> &losses) {
  fs::create_directories(dir);
  if (!losses.empty()) {
    HostTensor t(DType::F64, {static_cast<int64_t>(losses.size())});
    std::copy(losses.begin(), losses.end(), t.as<double>());
    writeNpy((fs::path(dir) / "losses.npy").string(), t);
  }
  for (const auto &[i, t] : results)
    writeNpy((fs::path(dir) / ("result" + std::to_string(i) + ".npy")).string(), t);
  for (const auto &[name, t] : state)
    writeNpy((fs::path(dir) / (name + ".npy")).string(), t);
}

/// --resume: loads the checkpoint through `load` and returns the first
/// step to run (1 without --resume).
int64_t resumeFrom(const Options &o, bool report,
                   const std::function<CheckpointInfo(IoMeter &)> &load) {
  if (o.resume.empty())
    return 1;
  std::string who = o.rank ? " (rank " + std::to_string(*o.rank) + ")" : "";
  IoMeter meter(report ? IoMeter::printer("loading " + o.resume + who) : nullptr);
  CheckpointInfo info = load(meter);
  meter.finish();
  if (info.step >= o.steps)
    throw std::invalid_argument(
        o.resume + ": the checkpoint is at step " + std::to_string(info.step) +
        "; --steps " + std::to_string(o.steps) +
        " (the last step to run) leaves nothing to run");
  return info.step + 1;
}

/// --save: after every --save-every steps, saves through `save`.
void saveIfDue(const Options &o, int64_t step, bool report,
               const std::function<void(IoMeter &, const std::string &)> &save) {
  if (o.save.empty() || step % o.saveEvery != 0)
    return;
  char metadata[160];
  std::snprintf(metadata, sizeof metadata,
                "{\"tool\": \"ernie-run\", \"lr\": %.17g, \"seed\": %llu}", o.lr,
                (unsigned long long)o.seed);
  // A Gloo rank meters its own bytes only.
  std::string who = o.rank ? " (rank " + std::to_string(*o.rank) + ")" : "";
  IoMeter meter(report ? IoMeter::printer("saving step " + std::to_string(step) +
                                          " to " + o.save + who)
                       : nullptr);
  save(meter, metadata);
  meter.finish();
}

/// Which GEMM kernels run (a known-slow fallback is warned about on
/// stderr), or which GPU: step times mean little without it.
void printGemmBanner(bool print, const Device &device = cpuDevice()) {
  if (!print)
    return;
  if (!device.hostAddressable()) {
    std::printf("Device: %s (the CUDA backend is unverified)\n",
                device.describe().c_str());
    return;
  }
  GemmLibrary gemm = cpuGemmLibrary();
  std::printf("GEMM: %s\n", gemm.describe().c_str());
  if (!gemm.warning.empty())
    std::fprintf(stderr, "ernie-run: warning: %s\n", gemm.warning.c_str());
}

/// Every rank in this process, on threads.
int runThreads(const Program &program, const Options &o) {
  SessionOptions options;
  options.executor.checkFinite = o.checkFinite;
  options.executor.trace = !o.trace.empty();
  options.timeout = std::chrono::milliseconds(int64_t(o.timeoutSeconds * 1000));
  options.device = o.device;
  Session session(program, options);
  printGemmBanner(!o.quiet, session.device());
  std::string name = chooseFunction(program, o);
  const bool pipelined = program.isPipelined();
  // A pipeline's call returns the loss alone.
  const Function *fn = pipelined ? nullptr : &program.requireFunction(0, name);
  std::vector<HostTensor> inputs = loadInputs(program, name, o);
  session.initState(name, stateFrom(o), o.seed);
  std::optional<size_t> loss = pipelined ? std::optional<size_t>(0) : lossIndex(*fn);
  int64_t first = resumeFrom(o, !o.quiet, [&](IoMeter &meter) {
    return session.loadCheckpoint(o.resume, &meter);
  });
  Reporter reporter(o.steps, o.quiet);
  std::vector<HostTensor> outputs;
  std::vector<double> losses;
  for (int64_t step = first; step <= o.steps; ++step) {
    auto start = std::chrono::steady_clock::now();
    // Only the last step's results are written (--outputs), and those that
    // update state are read from the state: the others move, not copy.
    outputs = session.call(name, inputs, o.lr, step, Results::ExceptUpdates);
    double ms = millisecondsSince(start);
    std::optional<double> lossValue;
    if (loss)
      losses.push_back(*(lossValue = scalarValue(outputs[*loss])));
    reporter.step(step, lossValue, ms);
    saveIfDue(o, step, !o.quiet, [&](IoMeter &meter, const std::string &metadata) {
      session.saveCheckpoint(o.save, step, metadata, o.keep, &meter);
    });
  }
  reporter.summary();
  if (!o.outputs.empty()) {
    std::vector<std::pair<size_t, HostTensor>> results;
    std::vector<std::pair<std::string, HostTensor>> state;
    if (pipelined) {
      results.emplace_back(0, outputs[0]);
      for (const std::string &stateName : program.stateNames())
        state.emplace_back(stateName, session.state(name, stateName));
    } else {
      for (size_t i = 0; i < fn->results.size(); ++i)
        if (fn->results[i].updates.empty())
          results.emplace_back(i, outputs[i]);
      for (const TensorSpec &arg : fn->arguments)
        if (arg.role == Role::Parameter || arg.role == Role::OptimizerState)
          state.emplace_back(arg.name, session.state(name, arg.name));
    }
    writeOutputs(o.outputs, results, state, losses);
  }
  if (!o.trace.empty())
    writeChromeTrace(o.trace, session.traceEvents());
  return 0;
}

/// This rank's communicator of a multi-process run: Gloo, or NCCL on its GPU.
std::unique_ptr<Communicator> rankCommunicator(const Program &program,
                                               const Options &o) {
  auto timeout = std::chrono::milliseconds(int64_t(o.timeoutSeconds * 1000));
  if (o.backend == "nccl") {
    NcclOptions nccl;
    nccl.storePath = o.store;
    nccl.storeAddress = o.storeAddress;
    nccl.device = o.device;
    nccl.timeout = timeout;
    nccl.nativeReductions = o.nativeReductions;
    return createNcclCommunicator(program.mesh(), *o.rank, nccl);
  }
  GlooOptions gloo;
  gloo.storePath = o.store;
  gloo.storeAddress = o.storeAddress;
  gloo.timeout = timeout;
  return createGlooCommunicator(program.mesh(), *o.rank, gloo);
}

/// One rank of a multi-process run (Gloo or NCCL).
int runRank(const Program &program, const Options &o) {
  std::unique_ptr<Communicator> comm = rankCommunicator(program, o);
  ExecutorOptions options;
  options.checkFinite = o.checkFinite;
  options.trace = !o.trace.empty();
  RankRunner runner(program, *comm, options);
  std::string name = chooseFunction(program, o);
  const bool pipelined = program.isPipelined();
  const Function *fn = pipelined ? nullptr : &runner.function(name);
  std::vector<HostTensor> inputs = loadInputs(program, name, o);
  runner.initState(name, stateFrom(o), o.seed);
  std::optional<size_t> loss = pipelined ? std::optional<size_t>(0) : lossIndex(*fn);
  bool leader = *o.rank == 0;
  int64_t first = resumeFrom(o, leader && !o.quiet, [&](IoMeter &meter) {
    return loadCheckpointOnRank(program, runner, *comm, o.resume, &meter);
  });
  printGemmBanner(leader && !o.quiet, comm->device());
  Reporter reporter(o.steps, o.quiet || !leader);
  std::vector<HostTensor> local;
  std::vector<double> losses;
  for (int64_t step = first; step <= o.steps; ++step) {
    auto start = std::chrono::steady_clock::now();
    local = runner.call(name, inputs, o.lr, step, Results::ExceptUpdates);
    std::optional<double> lossValue;
    if (loss)
      lossValue = scalarValue(pipelined || fn->results[*loss].sharding.isReplicated()
                                  ? local[*loss]
                                  : runner.gather(fn->results[*loss], local[*loss]));
    if (lossValue)
      losses.push_back(*lossValue);
    reporter.step(step, lossValue, millisecondsSince(start));
    saveIfDue(o, step, leader && !o.quiet,
              [&](IoMeter &meter, const std::string &metadata) {
                saveCheckpointOnRank(program, runner, *comm, o.save, step, metadata,
                                     o.keep, &meter);
              });
  }
  reporter.summary();
  if (!o.outputs.empty() && pipelined) {
    // Each state from the first stage holding it, gathered over that
    // stage's ranks and written by its first rank; rank 0 writes the loss.
    const int64_t stage = program.stageOf(*o.rank);
    const bool stageLeader = program.rankInStage(0, stage) == *o.rank;
    std::vector<std::pair<std::string, HostTensor>> state;
    for (const std::string &stateName : program.stateNames()) {
      if (program.stagesHolding(stateName).front() != stage)
        continue;
      HostTensor global = runner.gatherInStage(runner.stateSpec(stateName),
                                               runner.localState(stateName));
      if (stageLeader)
        state.emplace_back(stateName, std::move(global));
    }
    std::vector<std::pair<size_t, HostTensor>> results;
    if (leader)
      results.emplace_back(0, local[0]);
    if (stageLeader)
      writeOutputs(o.outputs, results, state,
                   leader ? losses : std::vector<double>{});
  } else if (!o.outputs.empty()) {
    // Every rank joins the gathers; rank 0 writes.
    std::vector<std::pair<size_t, HostTensor>> results;
    for (size_t i = 0; i < fn->results.size(); ++i)
      if (fn->results[i].updates.empty())
        results.emplace_back(i, runner.gather(fn->results[i], local[i]));
    std::vector<std::pair<std::string, HostTensor>> state;
    for (const TensorSpec &arg : fn->arguments)
      if (arg.role == Role::Parameter || arg.role == Role::OptimizerState)
        state.emplace_back(arg.name,
                           runner.gather(arg, runner.localState(arg.name)));
    if (leader)
      writeOutputs(o.outputs, results, state, losses);
  }
  if (!o.trace.empty())
    writeChromeTrace(o.trace + ".rank" + std::to_string(*o.rank) + ".json",
                     {runner.executor().traceEvents()}, *o.rank);
  comm->barrier(program.mesh().axisNames());
  return 0;
}

/// Starts one process per rank (this program, with --rank; on GPUs each
/// with its LOCAL_RANK) and waits for them; when one fails, the others get
/// the timeout to stop on their own (they see its abort) before they are
/// killed.
int launchProcesses(const Program &program, const Options &o, char **argv) {
  if (o.backend == "nccl") {
    // NCCL puts at most one rank of a communicator on a GPU.
    std::string reason;
    int gpus = cudaDeviceCount(&reason);
    if (gpus == 0)
      throw DeviceError("--backend nccl: " + reason);
    if (program.mesh().numRanks() > gpus)
      throw std::invalid_argument(
          "--backend nccl runs one rank per GPU: the mesh has " +
          std::to_string(program.mesh().numRanks()) + " ranks, " +
          std::to_string(gpus) +
          " GPU(s) are visible (--backend threads runs every rank on one "
          "GPU; or start ranks on other hosts with --rank)");
  }
  // One process per rank on this host: the same bound as the thread
  // backend's ranks per process (more is a fork storm, not a run; start
  // ranks by hand with --rank across hosts instead).
  if (program.mesh().numRanks() > kMaxThreadRanks)
    throw std::invalid_argument(
        "--backend " + o.backend + " starts at most " +
        std::to_string(kMaxThreadRanks) +
        " rank processes on one host; this mesh has " +
        std::to_string(program.mesh().numRanks()) +
        " (run each rank with --rank and --store-address)");
  std::string store = o.store;
  bool ownStore = store.empty() && o.storeAddress.empty();
  if (ownStore) {
    char pattern[] = "/tmp/ernie-run-XXXXXX";
    if (!mkdtemp(pattern))
      throw std::runtime_error("cannot create a store directory in /tmp");
    store = pattern;
  }
  std::vector<pid_t> children;
  int64_t n = program.mesh().numRanks();
  for (int64_t r = 0; r < n; ++r) {
    std::vector<std::string> args = {argv[0]};
    for (char **a = argv + 1; *a; ++a)
      args.push_back(*a);
    args.insert(args.end(), {"--rank", std::to_string(r)});
    if (o.storeAddress.empty())
      args.insert(args.end(), {"--store", store});
    pid_t pid = fork();
    if (pid < 0)
      throw std::runtime_error("fork failed");
    if (pid == 0) {
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      std::vector<char *> cargs;
      for (std::string &a : args)
        cargs.push_back(a.data());
      cargs.push_back(nullptr);
      execv("/proc/self/exe", cargs.data());
      std::perror("ernie-run: exec");
      _exit(127);
    }
    children.push_back(pid);
  }
  int failures = 0;
  std::optional<std::chrono::steady_clock::time_point> deadline;
  size_t running = children.size();
  while (running) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, deadline ? WNOHANG : 0);
    if (pid > 0) {
      --running;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        ++failures;
        if (!deadline)
          deadline = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(int64_t(o.timeoutSeconds * 1000));
      }
      continue;
    }
    if (deadline && std::chrono::steady_clock::now() > *deadline) {
      for (pid_t child : children)
        kill(child, SIGKILL);
      while (waitpid(-1, nullptr, 0) > 0) {
      }
      std::cerr << "ernie-run: killed the ranks still running after a failure\n";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (ownStore)
    fs::remove_all(store);
  return failures ? 1 : 0;
}

} // namespace

int main(int argc, char **argv) {
  chooseCpuGemmKernels(argv);
  Options o = parseOptions(argc, argv);
  setCpuBlasThreads(o.blasThreads);
  std::string who = o.rank ? "ernie-run: rank " + std::to_string(*o.rank) + ": "
                           : "ernie-run: ";
  try {
    Program program = Program::load(o.program);
    int64_t meshRanks = program.mesh().numRanks();
    if (o.ranks && *o.ranks != meshRanks)
      throw std::invalid_argument(
          "the program's mesh " + program.mesh().str() + " has " +
          std::to_string(meshRanks) + " ranks; --ranks asks for " +
          std::to_string(*o.ranks));
    if (const char *world = std::getenv("WORLD_SIZE");
        world && std::getenv("RANK") && std::atoll(world) != meshRanks)
      throw std::invalid_argument(
          "WORLD_SIZE is " + std::string(world) + " but the program's mesh " +
          program.mesh().str() + " has " + std::to_string(meshRanks) +
          " ranks");
    if (o.backend == "threads")
      return runThreads(program, o);
    if (o.rank) {
      if (*o.rank < 0 || *o.rank >= meshRanks)
        throw std::invalid_argument("--rank " + std::to_string(*o.rank) +
                                    " is not a rank of the mesh " +
                                    program.mesh().str());
      return runRank(program, o);
    }
    return launchProcesses(program, o, argv);
  } catch (const std::exception &e) {
    std::cerr << who << "error: " << e.what() << "\n";
    return 1;
  }
}

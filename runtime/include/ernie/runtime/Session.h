//===- Session.h - running a program's steps, with its state -----*- C++ -*-===//
//
// The API a driver (ernie-run, the Python binding) uses. Callers speak in
// global tensors; the runtime keeps each rank's pieces.
//
// A RankRunner is one rank: it keeps that rank's pieces of the program's
// state (parameters and optimizer slots, by name) between calls, feeds a
// function's arguments by role (state, batch input, learning rate, step),
// stores the results that update state, and can gather any result to its
// global value through the communicator. It is what each process of a
// multi-process run uses.
//
// A Session is every rank of a mesh in this process (the thread engine): it
// runs one RankRunner per rank on its own thread and assembles results
// directly from the pieces.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_SESSION_H
#define ERNIE_RUNTIME_SESSION_H

#include "ernie/runtime/Executor.h"
#include "ernie/runtime/ThreadCommunicator.h"

#include <functional>
#include <map>
#include <optional>

namespace ernie::runtime {

/// Where a state's first value comes from: a global tensor, or nullopt for
/// the default (parameters drawn from a seeded generator, slots zero).
using StateSource = std::function<std::optional<HostTensor>(const TensorSpec &)>;

/// A parameter's default initial value: uniform in ±1/sqrt(fan-in) for
/// matrices (fan-in = dimension 0), ones for vectors and scalars; the same
/// for a given (name, shape, seed) on every rank and every mesh.
HostTensor defaultParameter(const TensorSpec &spec, uint64_t seed);

class RankRunner {
public:
  RankRunner(const Program &program, Communicator &comm,
             ExecutorOptions options = {});

  Executor &executor() { return executor_; }
  const Function &function(const std::string &name) const {
    return executor_.function(name);
  }

  /// Gives every state argument of `fn` that has none yet its first value
  /// (from `source`, else the default; a master weight starts as its
  /// parameter's value).
  void initState(const std::string &fn, const StateSource &source,
                 uint64_t seed = 0);
  /// Replaces the state `name` (as `fn`'s argument spec describes it).
  void setState(const std::string &fn, const std::string &name,
                const HostTensor &global);
  /// This rank's piece of state `name`; throws when there is none.
  const HostTensor &localState(const std::string &name) const;
  /// The layout that piece belongs to.
  const TensorSpec &stateSpec(const std::string &name) const;
  std::vector<std::string> stateNames() const;

  /// Runs `fn`: state arguments from the state, learning rate and step from
  /// `lr` and `step`, every other argument from `inputs` (global values, in
  /// argument order). Results that update state replace it. Returns this
  /// rank's pieces of every result.
  std::vector<HostTensor> call(const std::string &fn,
                               const std::vector<HostTensor> &inputs,
                               double lr = 0.0, int64_t step = 1);

  /// The global value of a piece described by `spec`: an all-gather over
  /// every mesh axis, then assembly. Every rank must call it.
  HostTensor gather(const TensorSpec &spec, const HostTensor &local);

private:
  const Program &program_;
  Communicator &comm_;
  Executor executor_;
  /// A state's piece on this rank, and the layout it is a piece of: each
  /// function's propagation may place a state differently, and a piece is
  /// re-laid out (gathered, re-sliced) when a function wants another.
  struct State {
    TensorSpec spec;
    HostTensor piece;
  };
  /// The piece of `name` in `spec`'s layout, re-laid out if needed.
  const HostTensor &stateFor(const TensorSpec &spec);
  std::map<std::string, State> state_;
};

struct SessionOptions {
  ExecutorOptions executor;
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
  /// GEMM threads per rank (setCpuBlasThreads); 0 leaves the setting alone.
  int blasThreads = 1;
};

class Session {
public:
  explicit Session(Program program, SessionOptions options = {});
  ~Session();

  const Program &program() const { return program_; }
  int64_t numRanks() const { return program_.mesh().numRanks(); }

  void initState(const std::string &fn, const StateSource &source,
                 uint64_t seed = 0);
  void setState(const std::string &fn, const std::string &name,
                const HostTensor &global);
  /// The global value of state `name`.
  HostTensor state(const std::string &fn, const std::string &name) const;

  /// Every rank's recorded intervals (SessionOptions::executor.trace).
  std::vector<std::vector<TraceEvent>> traceEvents() const;

  /// RankRunner::call on every rank at once; returns the global results.
  /// The first rank to fail stops the others; its error is rethrown.
  std::vector<HostTensor> call(const std::string &fn,
                               const std::vector<HostTensor> &inputs,
                               double lr = 0.0, int64_t step = 1);

private:
  /// Runs `work(rank)` on one thread per rank; rethrows the root failure.
  void onEveryRank(const std::function<void(int64_t)> &work);

  Program program_;
  ThreadWorld world_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<RankRunner>> ranks_;
};

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_SESSION_H

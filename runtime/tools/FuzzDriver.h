//===- FuzzDriver.h - forked batches of fuzz inputs -------------*- C++ -*-===//
//
// What the mutation fuzzers (ernie-fuzz-program, ernie-fuzz-formats) share:
// inputs run in batches in forked children under an address-space limit
// (a crash, a hang — an alarm per input — or an allocation past the limit
// kills only the child); the parent saves the input that was running into
// the crash directory and continues after it. Input i depends only on
// (seed, i), so every finding replays alone.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_TOOLS_FUZZDRIVER_H
#define ERNIE_RUNTIME_TOOLS_FUZZDRIVER_H

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>

namespace ernie::runtime {

struct FuzzBatches {
  std::string tool;     // for messages
  std::string crashDir; // findings are saved here
  std::string suffix;   // of a saved input's file name (".ernie", ".npy")
  uint64_t seed = 1;
  int64_t iterations = 2000;
  double maxSeconds = 0; // 0: no limit
  uint64_t addressSpace = uint64_t(4) << 30;
  unsigned alarmSeconds = 20; // per input: longer is a hang
  int64_t batch = 500;
};

struct FuzzSummary {
  int64_t ran = 0, accepted = 0, findings = 0;
  double seconds = 0;
};

/// `given` when set (>= 0), else $ERNIE_FUZZ_ITERATIONS, else 2000.
inline int64_t fuzzIterations(int64_t given) {
  if (given >= 0)
    return given;
  const char *env = std::getenv("ERNIE_FUZZ_ITERATIONS");
  return env ? std::stoll(env) : 2000;
}

/// Runs inputs 0..iterations-1: `input(i, current)` writes input i to the
/// file `current` (so a crash leaves it behind), runs it and returns whether
/// the code under test accepted it; a refusal is a caught exception. A
/// child that dies (a signal, an alarm, exit status not 0) is a finding.
inline FuzzSummary
runFuzzBatches(const FuzzBatches &o,
               const std::function<bool(int64_t, const std::string &)> &input) {
  namespace fs = std::filesystem;
  fs::create_directories(o.crashDir);
  const std::string current =
      (fs::path(o.crashDir) / (".current" + o.suffix)).string();
  const std::string counts = (fs::path(o.crashDir) / ".counts").string();
  auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                         start)
        .count();
  };
  FuzzSummary sum;
  int64_t next = 0;
  while (next < o.iterations &&
         !(o.maxSeconds > 0 && elapsed() > o.maxSeconds)) {
    int64_t end = std::min(o.iterations, next + o.batch);
    std::remove(counts.c_str());
    pid_t child = fork();
    if (child == 0) {
      rlimit limit{rlim_t(o.addressSpace), rlim_t(o.addressSpace)};
      setrlimit(RLIMIT_AS, &limit);
      int64_t took = 0;
      for (int64_t i = next; i < end; ++i) {
        alarm(o.alarmSeconds);
        took += input(i, current);
        // Progress, so the parent knows where a dead child stopped.
        std::ofstream(counts, std::ios::trunc) << i + 1 << " " << took << "\n";
      }
      _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    int64_t done = next, took = 0;
    if (std::ifstream in(counts); in)
      in >> done >> took;
    sum.accepted += took;
    sum.ran += done - next;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      next = end;
      continue;
    }
    // Input `done` was running when the child died.
    ++sum.findings;
    ++sum.ran;
    std::string saved =
        (fs::path(o.crashDir) / ("input-" + std::to_string(done) + o.suffix))
            .string();
    std::error_code ignored;
    fs::copy_file(current, saved, fs::copy_options::overwrite_existing,
                  ignored);
    std::cerr << o.tool << ": input " << done << " (--seed " << o.seed
              << " --replay " << done << ") "
              << (WIFSIGNALED(status)
                      ? std::string(WTERMSIG(status) == SIGALRM
                                        ? "hung"
                                        : "died of signal " +
                                              std::to_string(WTERMSIG(status)))
                      : "exited " + std::to_string(WEXITSTATUS(status)))
              << "; saved as " << saved << "\n";
    next = done + 1;
  }
  sum.seconds = elapsed();
  return sum;
}

} // namespace ernie::runtime

#endif // ERNIE_RUNTIME_TOOLS_FUZZDRIVER_H

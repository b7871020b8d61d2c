//===- ernie-comm-bench.cpp - all-reduce bandwidth by engine ------------------===//
//
//   ernie-comm-bench --ranks-per-process R [--sizes-mib 1,4,16,64]
//                    [--iterations N] [--collective all_reduce|all_gather|all_to_all]
//
// One process of a job (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, as the
// launcher sets them; none: a job of this process alone) running R ranks:
// an f32 sum all-reduce over all of the job's ranks, per size, timed as the
// median of N after two warm-ups. One process is the thread engine; one
// rank per process is Gloo; several of each is the mixed engine (threads
// inside a process, Gloo across). Process 0 prints one line per size: the
// time, the algorithm bandwidth (bytes / time) and the bus bandwidth
// (algorithm bandwidth x 2(n - 1)/n, NCCL's convention), beside a memcpy of
// the same bytes on this host. bench/multiprocess.py runs it.
//
//===----------------------------------------------------------------------===//

#include "ernie/runtime/ProcessGroup.h"
#include "ernie/runtime/ThreadCommunicator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <thread>
#include <vector>

using namespace ernie::runtime;

namespace {

int64_t envInt(const char *name, int64_t fallback) {
  const char *v = std::getenv(name);
  return v && *v ? std::atoll(v) : fallback;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Seconds of one memcpy of `bytes` (median of `n`), source and
/// destination touched first.
double memcpySeconds(size_t bytes, int n) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  std::vector<double> t;
  for (int i = 0; i < n + 2; ++i) {
    auto start = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    std::chrono::duration<double> d = std::chrono::steady_clock::now() - start;
    if (i >= 2)
      t.push_back(d.count());
  }
  return median(t);
}

} // namespace

int main(int argc, char **argv) {
  int64_t perProcess = 1;
  int iterations = 5;
  std::string collective = "all_reduce";
  std::vector<int64_t> sizes = {1, 4, 16, 64};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "ernie-comm-bench: " << arg << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--ranks-per-process") {
      perProcess = std::atoll(value().c_str());
    } else if (arg == "--collective") {
      collective = value();
    } else if (arg == "--iterations") {
      iterations = std::atoi(value().c_str());
    } else if (arg == "--sizes-mib") {
      sizes.clear();
      std::stringstream list(value());
      for (std::string item; std::getline(list, item, ',');)
        sizes.push_back(std::atoll(item.c_str()));
    } else {
      std::cerr << "usage: ernie-comm-bench --ranks-per-process R "
                   "[--sizes-mib 1,4,16,64] [--iterations N]\n";
      return 2;
    }
  }
  if (perProcess < 1 || iterations < 1 || sizes.empty()) {
    std::cerr << "ernie-comm-bench: bad arguments\n";
    return 2;
  }
  const int64_t process = envInt("RANK", 0), processes = envInt("WORLD_SIZE", 1);
  const int64_t ranks = processes * perProcess;
  Mesh mesh({"dp"}, {ranks});
  try {
    std::unique_ptr<ProcessGroup> job;
    if (processes > 1) {
      ProcessGroupOptions o;
      o.process = process;
      o.processes = processes;
      o.ranksPerProcess = perProcess;
      o.storeAddress = std::string(std::getenv("MASTER_ADDR") ? std::getenv("MASTER_ADDR")
                                                              : "127.0.0.1") +
                       ":" + std::to_string(envInt("MASTER_PORT", 29500));
      job = std::make_unique<ProcessGroup>(o);
      job->join("bench");
    }
    ThreadWorld world(mesh);
    const int64_t first = process * perProcess;
    std::vector<std::unique_ptr<Communicator>> comms;
    for (int64_t r = first; r < first + perProcess; ++r)
      comms.push_back(job ? job->communicator(mesh, r, world.communicator(r))
                          : world.communicator(r));
    const char *engine = processes == 1 ? "threads"
                         : perProcess == 1 ? "gloo"
                                           : "mixed";
    for (int64_t mib : sizes) {
      const size_t count = size_t(mib) << 18, bytes = count * sizeof(float);
      std::vector<std::vector<double>> seconds(perProcess);
      std::vector<std::thread> threads;
      for (int64_t i = 0; i < perProcess; ++i)
        threads.emplace_back([&, i] {
          std::vector<float> in(count, 1.0f + i), out(count * ranks);
          for (int k = 0; k < iterations + 2; ++k) {
            comms[i]->barrier({"dp"});
            auto start = std::chrono::steady_clock::now();
            if (collective == "all_gather")
              comms[i]->allGather(in.data(), out.data(), bytes / ranks, {"dp"});
            else if (collective == "all_to_all")
              comms[i]->allToAll(in.data(), out.data(), bytes / ranks, {"dp"});
            else
              comms[i]->allReduce(in.data(), out.data(), count, DType::F32,
                                  ReduceOp::Sum, {"dp"});
            std::chrono::duration<double> d =
                std::chrono::steady_clock::now() - start;
            if (k >= 2)
              seconds[i].push_back(d.count());
          }
        });
      for (auto &t : threads)
        t.join();
      if (process != 0)
        continue;
      double t = median(seconds[0]);
      double algbw = bytes / t / 1e9;
      double busbw = algbw * 2.0 * (ranks - 1) / ranks;
      std::printf("%s %lldx%lld %lld MiB: %.3f ms, algbw %.2f GB/s, busbw "
                  "%.2f GB/s, memcpy %.2f GB/s\n",
                  engine, (long long)processes, (long long)perProcess,
                  (long long)mib, t * 1e3, algbw, busbw,
                  bytes / memcpySeconds(bytes, iterations) / 1e9);
      std::fflush(stdout);
    }
    // Every rank leaves together: rank 0 serves the store the others read.
    std::vector<std::thread> leaving;
    for (auto &c : comms)
      leaving.emplace_back([&c] { c->barrier({"dp"}); });
    for (auto &t : leaving)
      t.join();
  } catch (const std::exception &e) {
    std::cerr << "ernie-comm-bench: process " << process << ": " << e.what()
              << "\n";
    return 1;
  }
  return 0;
}

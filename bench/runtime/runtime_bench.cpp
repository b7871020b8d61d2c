//===- runtime_bench.cpp - the runtime against its limits --------------------===//
//
// Google Benchmark measurements of the ernie runtime, each beside the limit
// it cannot beat:
//
//   gemm/kernel/...      the `ernie.matmul` CPU kernel (findCpuKernel), f32;
//   gemm/blas/...        one cblas_sgemm of the same product, called
//                        directly (for a batched lhs with a shared rhs: one
//                        GEMM over all the rows). Both on 1 BLAS thread.
//   allreduce/R/bytes    a sum all-reduce of f32 on the thread engine
//                        (ThreadWorld, R ranks as threads), timed on rank 0;
//   memcpy/bytes         memcpy of the same size on one thread.
//   dispatch/executor/N  an Executor running a program of N 1-element adds
//                        (written in memory with the generated FlatBuffers
//                        header, envelope and CRC-32 as ernie-translate
//                        writes them);
//   dispatch/kernel      the same add kernel called directly.
//
// After Google Benchmark's own table, a summary prints each number beside
// its limit, as a ratio. Usual benchmark flags apply
// (--benchmark_filter, --benchmark_repetitions: the summary takes the
// median when there are repetitions).
//
//===----------------------------------------------------------------------===//

#include "ernie/program/program_generated.h"
#include "ernie/runtime/Executor.h"
#include "ernie/runtime/Kernel.h"
#include "ernie/runtime/ProgramFormat.h"
#include "ernie/runtime/ThreadCommunicator.h"

#include <benchmark/benchmark.h>
#include <cblas.h>
#include <zlib.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

extern "C" void openblas_set_num_threads(int);

using namespace ernie::runtime;
namespace fb = ernie::program;

namespace {

std::vector<float> filled(size_t n, float seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = seed + 0.001f * float(i % 1000);
  return v;
}

//===--------------------------------------------------------------------===//
// GEMM
//===--------------------------------------------------------------------===//

/// A product `x[batch, m, k] @ w[k, n]` (batch 1: plain rank-2 matmul).
struct GemmShape {
  std::string name;
  int64_t batch, m, k, n;
  double flops() const { return 2.0 * batch * m * k * n; }
};

std::vector<GemmShape> gemmShapes() {
  std::vector<GemmShape> shapes;
  for (int64_t s : {64, 128, 256, 512, 1024})
    shapes.push_back({std::to_string(s), 1, s, s, s});
  // Transformer-ish: a QKV projection (batch 8 x seq 128, hidden 512) and an
  // MLP up-projection over short sequences (batch 32 x seq 16).
  shapes.push_back({"x8x128x512*w512x1536", 8, 128, 512, 1536});
  shapes.push_back({"x32x16x512*w512x2048", 32, 16, 512, 2048});
  return shapes;
}

void gemmKernel(benchmark::State &state, GemmShape s) {
  const Kernel *kernel = findCpuKernel("ernie.matmul");
  if (!kernel) {
    state.SkipWithError("no ernie.matmul kernel");
    return;
  }
  std::vector<float> a = filled(s.batch * s.m * s.k, 1.0f),
                     b = filled(s.k * s.n, 2.0f), c(s.batch * s.m * s.n);
  std::vector<int64_t> aShape =
      s.batch == 1 ? std::vector<int64_t>{s.m, s.k}
                   : std::vector<int64_t>{s.batch, s.m, s.k};
  std::vector<int64_t> cShape =
      s.batch == 1 ? std::vector<int64_t>{s.m, s.n}
                   : std::vector<int64_t>{s.batch, s.m, s.n};
  std::vector<TensorView> in = {{a.data(), DType::F32, aShape},
                                {b.data(), DType::F32, {s.k, s.n}}};
  std::vector<TensorView> out = {{c.data(), DType::F32, cShape}};
  Attrs attrs;
  for (auto _ : state) {
    (*kernel)(in, out, attrs);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      s.flops() / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void gemmBlas(benchmark::State &state, GemmShape s) {
  int64_t m = s.batch * s.m; // a shared rhs: one GEMM over every row
  std::vector<float> a = filled(m * s.k, 1.0f), b = filled(s.k * s.n, 2.0f),
                     c(m * s.n);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, s.n, s.k, 1.0f,
                a.data(), s.k, b.data(), s.n, 0.0f, c.data(), s.n);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      s.flops() / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

//===--------------------------------------------------------------------===//
// All-reduce on the thread engine, and memcpy
//===--------------------------------------------------------------------===//

std::vector<int64_t> transferSizes() {
  return {64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20};
}

std::string sizeName(int64_t bytes) {
  return bytes >= (1 << 20) ? std::to_string(bytes >> 20) + "MiB"
                            : std::to_string(bytes >> 10) + "KiB";
}

/// Rank 0 runs the timed loop; ranks 1..R-1 run the same number of
/// all-reduces on their own threads (the benchmark fixes the iteration count
/// before the loop starts, so every rank knows it).
void allReduce(benchmark::State &state, int64_t ranks, int64_t bytes) {
  ThreadWorld world(Mesh({"x"}, {ranks}));
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int64_t r = 0; r < ranks; ++r)
    comms.push_back(world.communicator(r));
  size_t count = bytes / sizeof(float);
  std::vector<std::vector<float>> in, out;
  for (int64_t r = 0; r < ranks; ++r) {
    in.push_back(filled(count, float(r)));
    out.emplace_back(count);
  }
  const Axes axes = {"x"};
  benchmark::IterationCount iterations = state.max_iterations;
  std::vector<std::thread> peers;
  for (int64_t r = 1; r < ranks; ++r)
    peers.emplace_back([&, r] {
      for (benchmark::IterationCount i = 0; i < iterations; ++i)
        comms[r]->allReduce(in[r].data(), out[r].data(), count, DType::F32,
                            ReduceOp::Sum, axes);
    });
  for (auto _ : state) {
    comms[0]->allReduce(in[0].data(), out[0].data(), count, DType::F32,
                        ReduceOp::Sum, axes);
    benchmark::ClobberMemory();
  }
  for (std::thread &t : peers)
    t.join();
  state.counters["GB/s"] = benchmark::Counter(
      double(bytes) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void memcpyBench(benchmark::State &state, int64_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] = benchmark::Counter(
      double(bytes) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

//===--------------------------------------------------------------------===//
// Executor dispatch
//===--------------------------------------------------------------------===//

/// A one-rank program whose function @chain takes x: tensor<1xf32> and runs
/// `n` adds, y_i = x + y_{i-1} (y_0 = x + x), alternating between two
/// buffers; it returns the last. Serialized exactly as ernie-translate does
/// it: the Program as a nested FlatBuffer inside a ProgramFile envelope with
/// the format version and the payload's CRC-32.
std::vector<uint64_t> chainProgramFile(int64_t n) {
  flatbuffers::FlatBufferBuilder b;
  const uint64_t align = fb::kBufferAlignment;
  std::vector<flatbuffers::Offset<fb::Buffer>> buffers;
  for (uint64_t i = 0; i < 3; ++i)
    buffers.push_back(fb::CreateBuffer(b, fb::DType::F32,
                                       b.CreateVector(std::vector<int64_t>{1}),
                                       i * align, sizeof(float)));
  auto tensor = [&](uint32_t buffer) {
    std::vector<int64_t> shape = {1};
    return fb::CreateTensorSpec(b, b.CreateString(""), fb::Role::Input,
                                fb::DType::F32, b.CreateVector(shape),
                                b.CreateVector(shape), 0, buffer);
  };
  std::vector<flatbuffers::Offset<fb::TensorSpec>> arguments = {tensor(0)};
  std::vector<flatbuffers::Offset<fb::Instruction>> instructions;
  uint32_t prev = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t cur = 1 + uint32_t(i % 2);
    instructions.push_back(fb::CreateInstruction(
        b, b.CreateString("ernie.add"),
        b.CreateVector(std::vector<uint32_t>{0, prev}),
        b.CreateVector(std::vector<uint32_t>{cur}),
        b.CreateVector(std::vector<flatbuffers::Offset<fb::Attr>>{}), 0, 0,
        b.CreateString("bench")));
    prev = cur;
  }
  std::vector<flatbuffers::Offset<fb::TensorSpec>> results = {tensor(prev)};
  auto function = fb::CreateFunction(
      b, b.CreateString("chain"), b.CreateVector(arguments),
      b.CreateVector(results), b.CreateVector(buffers),
      b.CreateVector(instructions), 3 * align);
  std::vector<flatbuffers::Offset<fb::Stage>> stages = {
      fb::CreateStage(b, b.CreateVector(
                             std::vector<flatbuffers::Offset<fb::Function>>{
                                 function}))};
  std::vector<flatbuffers::Offset<fb::Axis>> axes = {
      fb::CreateAxis(b, b.CreateString("world"), 1)};
  b.Finish(fb::CreateProgram(b, b.CreateString("mesh"), b.CreateVector(axes),
                             b.CreateString(""), b.CreateVector(stages),
                             b.CreateString("runtime_bench")));

  const uint8_t *payload = b.GetBufferPointer();
  size_t payloadSize = b.GetSize();
  flatbuffers::FlatBufferBuilder envelope(payloadSize + 256);
  envelope.ForceVectorAlignment(payloadSize, sizeof(uint8_t), 16);
  auto program = envelope.CreateVector(payload, payloadSize);
  uLong crc = crc32(crc32(0L, Z_NULL, 0), payload, uInt(payloadSize));
  fb::FinishProgramFileBuffer(
      envelope, fb::CreateProgramFile(envelope, fb::kFormatVersion,
                                      uint32_t(crc), program));
  // FlatBuffers reads scalars in place: an 8-byte aligned copy.
  std::vector<uint64_t> file((envelope.GetSize() + 7) / 8 + 1, 0);
  file.back() = envelope.GetSize(); // the size rides at the end
  std::memcpy(file.data(), envelope.GetBufferPointer(), envelope.GetSize());
  return file;
}

void dispatchExecutor(benchmark::State &state, int64_t n) {
  std::vector<uint64_t> file = chainProgramFile(n);
  Program program = Program::parse(file.data(), file.back(), "chain.ernie");
  ThreadWorld world(program.mesh());
  std::unique_ptr<Communicator> comm = world.communicator(0);
  Executor executor(program, *comm);
  HostTensor x(DType::F32, {1});
  *x.as<float>() = 1.0f;
  std::vector<HostTensor> inputs = {x};
  for (auto _ : state) {
    std::vector<HostTensor> out = executor.run("chain", inputs);
    benchmark::DoNotOptimize(out.data());
  }
  if (n > 0)
    state.counters["ns/op"] = benchmark::Counter(
        double(n), benchmark::Counter::kIsIterationInvariantRate |
                       benchmark::Counter::kInvert);
}

void dispatchKernel(benchmark::State &state) {
  const Kernel *add = findCpuKernel("ernie.add");
  float x = 1.0f, y = 1.0f, z = 0.0f;
  std::vector<TensorView> in = {{&x, DType::F32, {1}}, {&y, DType::F32, {1}}};
  std::vector<TensorView> out = {{&z, DType::F32, {1}}};
  Attrs attrs;
  for (auto _ : state) {
    (*add)(in, out, attrs);
    benchmark::DoNotOptimize(z);
    benchmark::ClobberMemory();
  }
}

//===--------------------------------------------------------------------===//
// The summary: each number beside its limit
//===--------------------------------------------------------------------===//

/// Google Benchmark's console table, and the seconds per iteration of every
/// run by name (the median when there are repetitions).
class Recorder : public benchmark::ConsoleReporter {
public:
  explicit Recorder(OutputOptions options) : ConsoleReporter(options) {}
  void ReportRuns(const std::vector<Run> &runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run &run : runs) {
      if (run.error_occurred || run.iterations == 0)
        continue;
      std::string name = run.run_name.str();
      double seconds = run.real_accumulated_time / double(run.iterations);
      if (run.run_type == Run::RT_Aggregate) {
        if (run.aggregate_name == "median") {
          seconds_[name] = seconds;
          median_[name] = true;
        }
      } else if (!median_[name]) {
        auto it = seconds_.find(name);
        seconds_[name] = it == seconds_.end() ? seconds
                                              : std::min(it->second, seconds);
      }
    }
  }
  /// Seconds per iteration of `name`, or a negative number when it did not run.
  double seconds(const std::string &name) const {
    // Benchmarks registered with UseRealTime() carry a "/real_time" suffix.
    for (const std::string &key : {name + "/real_time", name}) {
      auto it = seconds_.find(key);
      if (it != seconds_.end())
        return it->second;
    }
    return -1;
  }

private:
  std::map<std::string, double> seconds_;
  std::map<std::string, bool> median_;
};

void printSummary(const Recorder &r) {
  // Each section only when its benchmarks ran (--benchmark_filter).
  bool any = false;
  for (const GemmShape &s : gemmShapes()) {
    double k = r.seconds("gemm/kernel/" + s.name),
           b = r.seconds("gemm/blas/" + s.name);
    if (k < 0 || b < 0)
      continue;
    if (!any) {
      std::printf("\n== GEMM, f32, 1 BLAS thread: GFLOP/s ==\n");
      std::printf("%-24s | %12s %12s | %12s\n", "shape", "ernie.matmul",
                  "cblas_sgemm", "kernel/blas");
      std::printf("%s\n", std::string(68, '-').c_str());
      any = true;
    }
    std::printf("%-24s | %12.1f %12.1f | %12.2f\n", s.name.c_str(),
                s.flops() / k / 1e9, s.flops() / b / 1e9, b / k);
  }

  any = false;
  for (int64_t bytes : transferSizes()) {
    double m = r.seconds("memcpy/" + sizeName(bytes));
    if (m < 0)
      continue;
    if (!any) {
      std::printf("\n== all-reduce (sum, f32) on the thread engine vs memcpy: "
                  "GB/s (bytes per rank / time) ==\n");
      std::printf("%-8s | %10s | %10s %10s | %10s %10s\n", "size", "memcpy",
                  "2 ranks", "/memcpy", "4 ranks", "/memcpy");
      std::printf("%s\n", std::string(72, '-').c_str());
      any = true;
    }
    std::printf("%-8s | %10.2f |", sizeName(bytes).c_str(), bytes / m / 1e9);
    for (int64_t ranks : {2, 4}) {
      double a = r.seconds("allreduce/" + std::to_string(ranks) + "ranks/" +
                           sizeName(bytes));
      if (a < 0)
        std::printf(" %10s %10s", "-", "-");
      else
        std::printf(" %10.2f %10.3f", bytes / a / 1e9, m / a);
      std::printf(ranks == 2 ? " |" : "\n");
    }
  }

  double kernel = r.seconds("dispatch/kernel");
  double base = r.seconds("dispatch/executor/0");
  if (kernel < 0 || base < 0)
    return;
  std::printf("\n== dispatch: an Executor running N 1-element f32 adds ==\n");
  std::printf("direct kernel call (ernie.add, 1 element): %.1f ns\n",
              kernel * 1e9);
  std::printf("Executor::run with no instructions: %.1f ns\n", base * 1e9);
  std::printf("%-8s | %12s %16s %16s\n", "N", "ns/op", "ns/op - run(0)/N",
              "overhead ns/op");
  std::printf("%s\n", std::string(58, '-').c_str());
  for (int64_t n : {10, 100, 1000, 10000}) {
    double t = r.seconds("dispatch/executor/" + std::to_string(n));
    if (t < 0)
      continue;
    double perOp = t / n, marginal = (t - base) / n;
    std::printf("%-8lld | %12.1f %16.1f %16.1f\n", (long long)n, perOp * 1e9,
                marginal * 1e9, (marginal - kernel) * 1e9);
  }
  std::printf("(overhead = (run(N) - run(0)) / N - direct kernel call)\n");
}

} // namespace

int main(int argc, char **argv) {
  openblas_set_num_threads(1);
  for (const GemmShape &s : gemmShapes()) {
    benchmark::RegisterBenchmark(("gemm/kernel/" + s.name).c_str(), gemmKernel, s)
        ->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("gemm/blas/" + s.name).c_str(), gemmBlas, s)
        ->UseRealTime()->Unit(benchmark::kMillisecond);
  }
  for (int64_t bytes : transferSizes()) {
    benchmark::RegisterBenchmark(("memcpy/" + sizeName(bytes)).c_str(),
                                 memcpyBench, bytes)
        ->UseRealTime()->Unit(benchmark::kMicrosecond);
    for (int64_t ranks : {2, 4})
      benchmark::RegisterBenchmark(("allreduce/" + std::to_string(ranks) +
                                    "ranks/" + sizeName(bytes)).c_str(),
                                   allReduce, ranks, bytes)
          ->UseRealTime()->Unit(benchmark::kMicrosecond);
  }
  benchmark::RegisterBenchmark("dispatch/kernel", dispatchKernel)
      ->UseRealTime()->Unit(benchmark::kNanosecond);
  for (int64_t n : {0, 10, 100, 1000, 10000})
    benchmark::RegisterBenchmark(("dispatch/executor/" + std::to_string(n)).c_str(),
                                 dispatchExecutor, n)
        ->UseRealTime()->Unit(benchmark::kMicrosecond);

  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv))
    return 1;
  // Colours only on a terminal (--benchmark_color reaches only the
  // library's own reporter).
  Recorder recorder(isatty(fileno(stdout))
                        ? benchmark::ConsoleReporter::OO_ColorTabular
                        : benchmark::ConsoleReporter::OO_Tabular);
  benchmark::RunSpecifiedBenchmarks(&recorder);
  printSummary(recorder);
  benchmark::Shutdown();
  return 0;
}

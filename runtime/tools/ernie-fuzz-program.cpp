//===- ernie-fuzz-program.cpp - mutation fuzzing of program files ----------===//
//
// A deterministic random-mutation harness over Program::fromBytes: each input
// is a seed program file whose nested program bytes get a few mutations
// (random bytes; aligned 32- and 64-bit integers set to boundary values or
// nudged by one — buffer indices, offsets, dimensions, vector lengths), then
// a fresh envelope with the CRC recomputed, so the structural checks behind
// the checksum are what is exercised. A mutant the loader accepts is run for
// one step on the thread backend (collective timeout 2 s): the validator must
// be enough for every kernel and collective. Anything but a clean
// ProgramError / std::exception is a finding.
//
// Inputs run in batches in forked children (FuzzDriver.h: a crash or a hang
// kills only the child); the parent saves the input that was running into
// --crash-dir and continues after it. Input i depends only on (--seed, i),
// so every finding replays with --replay i.
//
//   ernie-fuzz-program --seeds DIR [--seed N] [--iterations N]
//                      [--max-seconds S] [--crash-dir DIR] [--replay I]
//
// --iterations defaults to $ERNIE_FUZZ_ITERATIONS, else 2000. Exit status 1
// when anything was found.
//
//===----------------------------------------------------------------------===//

#include "ernie/program/program_generated.h"
#include "ernie/runtime/Program.h"
#include "ernie/runtime/ProgramFormat.h"
#include "ernie/runtime/Session.h"

#include "FuzzDriver.h"
#include "StepInputs.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

using namespace ernie::runtime;
namespace fs = std::filesystem;
namespace fb = ernie::program;

namespace {

struct Options {
  std::string seeds, crashDir = "fuzz-crashes";
  uint64_t seed = 1;
  int64_t iterations = -1, replay = -1;
  double maxSeconds = 0;
};

/// A seed file: its nested program bytes.
struct Seed {
  std::string name;
  std::vector<uint8_t> program;
};

std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// The envelope the writer makes (lib/Export/ProgramFile.cpp), CRC included.
std::string wrap(const std::vector<uint8_t> &program) {
  flatbuffers::FlatBufferBuilder b(program.size() + 256);
  b.ForceVectorAlignment(program.size(), sizeof(uint8_t),
                         ernie::program::kPayloadAlignment);
  auto bytes = b.CreateVector(program.data(), program.size());
  uLong crc = crc32(crc32(0L, Z_NULL, 0), program.data(),
                    static_cast<uInt>(program.size()));
  fb::FinishProgramFileBuffer(
      b, fb::CreateProgramFile(b, ernie::program::kFormatVersion,
                               static_cast<uint32_t>(crc), bytes));
  return {reinterpret_cast<const char *>(b.GetBufferPointer()), b.GetSize()};
}

std::vector<Seed> loadSeeds(const std::string &dir) {
  std::vector<Seed> seeds;
  std::vector<fs::path> paths;
  for (const auto &entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".ernie")
      paths.push_back(entry.path());
  std::sort(paths.begin(), paths.end()); // the same order everywhere
  for (const fs::path &path : paths) {
    std::string bytes = readFile(path.string());
    Program::fromBytes(bytes, path.string()); // seeds must be valid
    std::vector<uint64_t> aligned((bytes.size() + 7) / 8);
    std::memcpy(aligned.data(), bytes.data(), bytes.size());
    const fb::ProgramFile *file = fb::GetProgramFile(aligned.data());
    seeds.push_back({path.filename().string(),
                     {file->program()->begin(), file->program()->end()}});
  }
  if (seeds.empty())
    throw std::runtime_error(dir + ": no .ernie seed files");
  return seeds;
}

/// Input `i`: a seed's program with 1-4 mutations.
std::vector<uint8_t> mutant(const std::vector<Seed> &seeds, uint64_t seed,
                            int64_t i, std::string &from) {
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + uint64_t(i));
  const Seed &s = seeds[rng() % seeds.size()];
  from = s.name;
  std::vector<uint8_t> p = s.program;
  int mutations = 1 + int(rng() % 4);
  for (int m = 0; m < mutations; ++m) {
    size_t at = rng() % p.size();
    switch (rng() % 4) {
    case 0: // one random byte
      p[at] = uint8_t(rng());
      break;
    case 1: { // a small change to an aligned 32-bit integer
      at &= ~size_t(3);
      if (at + 4 > p.size())
        break;
      int32_t v;
      std::memcpy(&v, &p[at], 4);
      const int32_t choices[] = {0, 1, -1, 2, 3, 4, 7, 8, 64, 255, 65536,
                                 INT32_MAX, INT32_MIN, v + 1, v - 1, v * 2};
      v = choices[rng() % std::size(choices)];
      std::memcpy(&p[at], &v, 4);
      break;
    }
    case 2: { // a boundary value in an aligned 64-bit integer
      at &= ~size_t(7);
      if (at + 8 > p.size())
        break;
      int64_t v;
      std::memcpy(&v, &p[at], 8);
      const int64_t choices[] = {0, 1, -1, 2, 3, int64_t(1) << 20,
                                 int64_t(1) << 32, int64_t(1) << 40,
                                 int64_t(1) << 62, INT64_MAX, INT64_MIN,
                                 v + 1, v - 1, v * 2, v * 3};
      v = choices[rng() % std::size(choices)];
      std::memcpy(&p[at], &v, 8);
      break;
    }
    default: { // copy a 4-byte word from elsewhere (a valid index, a size)
      size_t from4 = (rng() % p.size()) & ~size_t(3);
      at &= ~size_t(3);
      if (at + 4 <= p.size() && from4 + 4 <= p.size())
        std::memmove(&p[at], &p[from4], 4);
      break;
    }
    }
  }
  return p;
}

/// What ernie-run would do for one step: train_step if there is one (a
/// pipeline always), else the only function; batch inputs generated (small
/// floats, zero indices).
void runOneStep(const Program &program) {
  // A mesh far past what one process should start costs time, not
  // coverage: the thread backend's own bound is tested elsewhere.
  if (program.mesh().numRanks() > 16)
    return;
  std::vector<HostTensor> inputs;
  std::string name = stepInputs(program, inputs);
  if (name.empty())
    return;
  SessionOptions options;
  options.timeout = std::chrono::seconds(2);
  Session session(program, options);
  session.initState(name, {}, 1);
  session.call(name, inputs, 0.01, 1);
}

/// Runs input `i`: true when it ended cleanly (accepted and ran, or refused
/// with an exception). `accepted` says whether the loader took it.
bool runInput(const std::vector<Seed> &seeds, uint64_t seed, int64_t i,
              bool &accepted, const std::string &current) {
  std::string from;
  std::string file = wrap(mutant(seeds, seed, i, from));
  if (!current.empty()) {
    std::ofstream out(current, std::ios::binary | std::ios::trunc);
    out << file;
  }
  accepted = false;
  try {
    Program program = Program::fromBytes(file, "mutant-" + std::to_string(i));
    accepted = true;
    runOneStep(program);
  } catch (const std::exception &) {
    // A clean refusal, at load or at run.
  }
  return true;
}

Options parse(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "ernie-fuzz-program: " << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--seeds")
      o.seeds = value();
    else if (a == "--seed")
      o.seed = std::stoull(value());
    else if (a == "--iterations")
      o.iterations = std::stoll(value());
    else if (a == "--max-seconds")
      o.maxSeconds = std::stod(value());
    else if (a == "--crash-dir")
      o.crashDir = value();
    else if (a == "--replay")
      o.replay = std::stoll(value());
    else {
      std::cerr << "ernie-fuzz-program: unknown option " << a << "\n";
      std::exit(2);
    }
  }
  if (o.seeds.empty()) {
    std::cerr << "ernie-fuzz-program: --seeds DIR is required\n";
    std::exit(2);
  }
  o.iterations = fuzzIterations(o.iterations);
  return o;
}

} // namespace

int main(int argc, char **argv) {
  Options o = parse(argc, argv);
  std::vector<Seed> seeds;
  try {
    seeds = loadSeeds(o.seeds);
  } catch (const std::exception &e) {
    std::cerr << "ernie-fuzz-program: " << e.what() << "\n";
    return 2;
  }
  setCpuBlasThreads(1);
  if (o.replay >= 0) {
    bool accepted;
    runInput(seeds, o.seed, o.replay, accepted, "");
    std::cout << "input " << o.replay << (accepted ? " accepted" : " refused")
              << ", ended cleanly\n";
    return 0;
  }
  FuzzBatches batches;
  batches.tool = "ernie-fuzz-program";
  batches.crashDir = o.crashDir;
  batches.suffix = ".ernie";
  batches.seed = o.seed;
  batches.iterations = o.iterations;
  batches.maxSeconds = o.maxSeconds;
  // 4 GiB of address space: a huge accepted allocation is a bad_alloc, not
  // the machine's memory; 20 s per input (the collective timeout is 2 s).
  FuzzSummary sum = runFuzzBatches(batches, [&](int64_t i, const std::string &current) {
    bool wasAccepted;
    runInput(seeds, o.seed, i, wasAccepted, current);
    return wasAccepted;
  });
  std::cout << "ernie-fuzz-program: " << sum.ran << " inputs (seed " << o.seed
            << ", " << seeds.size() << " seed files), " << sum.accepted
            << " accepted and run, " << sum.findings << " findings, "
            << sum.seconds << " s\n";
  return sum.findings ? 1 : 0;
}

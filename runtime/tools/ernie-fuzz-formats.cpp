//===- ernie-fuzz-formats.cpp - mutation fuzzing of ernie's file formats --===//
//
// Deterministic mutation harnesses for every format ernie reads besides
// program files (ernie-fuzz-program): safetensors files, checkpoint
// manifests, .npy inputs, Hugging Face index/config JSON, and the TCP
// store's messages. Each input is a valid seed (written here by ernie's own
// writers) with a few mutations: random bytes, boundary integers in the
// text, inserted tokens ("NaN", "1e999", "-1", quotes, brackets), deep
// nesting, spliced or deleted ranges, and for the binary formats their
// length fields set to boundary values. The reader must accept the input
// or refuse it with an exception; a signal, a hang or an allocation past
// the address-space limit (2 GiB: std::bad_alloc aborts) is a finding.
//
//   ernie-fuzz-formats FORMAT [--seed N] [--iterations N] [--max-seconds S]
//                             [--crash-dir DIR] [--replay I]
//   FORMAT: safetensors | manifest | npy | json | store
//
// --iterations defaults to $ERNIE_FUZZ_ITERATIONS, else 2000. Exit status 1
// when anything was found.
//
//===----------------------------------------------------------------------===//

#include "ernie/runtime/BoundedInput.h"
#include "ernie/runtime/Checkpoint.h"
#include "ernie/runtime/HostTensor.h"
#include "ernie/runtime/Safetensors.h"

#include "comm/gloo/TcpStore.h"
#include "FuzzDriver.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <vector>

using namespace ernie::runtime;
namespace fs = std::filesystem;

namespace {

using Rng = std::mt19937_64;

std::string readFile(const fs::path &path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void writeFile(const fs::path &path, const std::string &bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

/// A few mutations of `s` (text or binary): bytes, tokens, nesting, splices.
void mutate(std::string &s, Rng &rng) {
  static const char *tokens[] = {"NaN",
                                 "-Infinity",
                                 "1e999",
                                 "-1",
                                 "0",
                                 "18446744073709551616",
                                 "9223372036854775807",
                                 "\"",
                                 "\\",
                                 "{",
                                 "}",
                                 "[",
                                 "]",
                                 ",",
                                 ":",
                                 "\"\\ud800\"",
                                 "null",
                                 "true",
                                 "\"F32\"",
                                 "\"dtype\"",
                                 "\"shape\"",
                                 "[1,2]",
                                 "{}",
                                 "\"..\"",
                                 "\"/etc/passwd\"",
                                 "\xff\xfe"};
  int mutations = 1 + int(rng() % 4);
  for (int m = 0; m < mutations; ++m) {
    size_t at = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 8) {
    case 0: // a random byte
      if (!s.empty())
        s[rng() % s.size()] = char(rng());
      break;
    case 1: // a bit
      if (!s.empty())
        s[rng() % s.size()] ^= char(1 << (rng() % 8));
      break;
    case 2: // a token
      s.insert(at, tokens[rng() % std::size(tokens)]);
      break;
    case 3: { // deep nesting
      size_t depth = size_t(1) << (rng() % 18);
      char open = rng() % 2 ? '[' : '{';
      s.insert(at, std::string(depth, open));
      break;
    }
    case 4: { // a range deleted
      size_t n = s.empty()
                     ? 0
                     : rng() % (1 + std::min<size_t>(
                                        s.size() - std::min(at, s.size()), 64));
      s.erase(std::min(at, s.size()), n);
      break;
    }
    case 5: { // a range of the input copied elsewhere
      if (s.empty())
        break;
      size_t from = rng() % s.size(),
             n = 1 + rng() % std::min<size_t>(s.size() - from, 64);
      s.insert(at, s.substr(from, n));
      break;
    }
    case 6: { // a digit run replaced by a boundary number
      size_t digit = s.find_first_of("0123456789", at);
      if (digit == std::string::npos)
        break;
      size_t end = s.find_first_not_of("0123456789", digit);
      const char *numbers[] = {"0",
                               "4294967295",
                               "4294967296",
                               "18446744073709551615",
                               "9223372036854775808",
                               "1099511627776",
                               "65536",
                               "-8"};
      s.replace(digit, (end == std::string::npos ? s.size() : end) - digit,
                numbers[rng() % std::size(numbers)]);
      break;
    }
    default: // the input cut short
      s.resize(rng() % (s.size() + 1));
      break;
    }
  }
}

/// Sets the little-endian length field of `bytes` at `at` (`width` bytes)
/// to a boundary value.
void boundaryLength(std::string &bytes, size_t at, size_t width, Rng &rng) {
  if (bytes.size() < at + width)
    return;
  uint64_t real = 0;
  for (size_t i = 0; i < width; ++i)
    real |= uint64_t(uint8_t(bytes[at + i])) << (8 * i);
  const uint64_t choices[] = {0,
                              1,
                              7,
                              real - 1,
                              real + 1,
                              real * 2,
                              uint64_t(bytes.size()),
                              UINT32_MAX,
                              uint64_t(1) << 40,
                              UINT64_MAX};
  uint64_t v = choices[rng() % std::size(choices)];
  for (size_t i = 0; i < width; ++i)
    bytes[at + i] = char(v >> (8 * i));
}

/// One format: seeds written by ernie's writers into `work`, and a reader.
struct Format {
  std::string suffix;
  std::vector<std::string> seeds;
  /// A mutant of seed bytes (mutate, plus a format's own length fields).
  std::function<void(std::string &, Rng &)> mutate;
  /// Reads the bytes written to `current`; true when accepted.
  std::function<bool(const std::string &current)> read;
};

HostTensor ramp(DType type, std::vector<int64_t> shape) {
  HostTensor t(type, std::move(shape));
  for (size_t i = 0; i < t.bytes.size(); ++i)
    t.bytes[i] = uint8_t(i * 37);
  return t;
}

Format safetensorsFormat(const fs::path &work) {
  Format f;
  f.suffix = ".safetensors";
  HostTensor a = ramp(DType::F32, {2, 3}), b = ramp(DType::BF16, {4}),
             c = ramp(DType::I64, {});
  writeSafetensors((work / "s1.safetensors").string(),
                   {{"a", &a}, {"b.weight", &b}}, {{"format", "pt"}}, false);
  writeSafetensors((work / "s2.safetensors").string(), {{"c", &c}}, {}, false);
  f.seeds = {readFile(work / "s1.safetensors"),
             readFile(work / "s2.safetensors")};
  f.mutate = [](std::string &s, Rng &rng) {
    if (rng() % 4 == 0)
      boundaryLength(s, 0, 8, rng);
    else
      mutate(s, rng);
  };
  f.read = [](const std::string &path) {
    SafetensorsFile file(path);
    for (const SafetensorsEntry &e : file.tensors())
      file.read(e.name);
    return true;
  };
  return f;
}

Format npyFormat(const fs::path &work) {
  Format f;
  f.suffix = ".npy";
  writeNpy((work / "a.npy").string(), ramp(DType::F32, {3, 4}));
  writeNpy((work / "b.npy").string(), ramp(DType::I64, {5}));
  writeNpy((work / "c.npy").string(), ramp(DType::F64, {}));
  for (const char *name : {"a.npy", "b.npy", "c.npy"})
    f.seeds.push_back(readFile(work / name));
  f.mutate = [](std::string &s, Rng &rng) {
    if (rng() % 4 == 0) {
      boundaryLength(s, 8, s.size() > 6 && s[6] == 1 ? 2 : 4, rng);
    } else {
      if (rng() % 4 == 0 && s.size() > 6)
        s[6] = char(1 + rng() % 3); // another version
      mutate(s, rng);
    }
  };
  f.read = [](const std::string &path) {
    readNpy(path, DType::F32);
    return true;
  };
  return f;
}

/// A checkpoint (imported from a small file) whose manifest is the input:
/// verified, described and resolved through its parent.
Format manifestFormat(const fs::path &work) {
  Format f;
  f.suffix = ".json";
  HostTensor a = ramp(DType::F32, {4, 3}), b = ramp(DType::F16, {3});
  writeSafetensors((work / "m.safetensors").string(), {{"a", &a}, {"b", &b}},
                   {}, false);
  std::string dir = importCheckpoint((work / "m.safetensors").string(),
                                     (work / "ckpt").string(), 7);
  f.seeds = {readFile(fs::path(dir) / "manifest.json")};
  f.mutate = mutate;
  f.read = [dir](const std::string &path) {
    fs::copy_file(path, fs::path(dir) / "manifest.json",
                  fs::copy_options::overwrite_existing);
    describeCheckpoint(dir);
    verifyCheckpoint(dir);
    resolveCheckpoint(fs::path(dir).parent_path().string());
    return true;
  };
  return f;
}

/// A Hugging Face folder whose index is the input (imported into a fresh
/// root), and the same text as a config (parsed within the limits).
Format jsonFormat(const fs::path &work) {
  Format f;
  f.suffix = ".json";
  fs::path folder = work / "hf";
  fs::create_directories(folder);
  HostTensor a = ramp(DType::F32, {2, 2}), b = ramp(DType::F32, {3});
  writeSafetensors((folder / "model-00001-of-00002.safetensors").string(),
                   {{"a", &a}}, {}, false);
  writeSafetensors((folder / "model-00002-of-00002.safetensors").string(),
                   {{"b", &b}}, {}, false);
  f.seeds = {
      R"({"metadata": {"total_size": 28}, "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})",
      R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "num_hidden_layers": 2, "rope_scaling": null, "rms_norm_eps": 1e-05, "torch_dtype": "bfloat16"})"};
  f.mutate = mutate;
  f.read = [folder, work](const std::string &path) {
    std::string text = readFile(path);
    try {
      parseBoundedJson(text, "config.json");
    } catch (const std::runtime_error &) {
    }
    writeFile(folder / "model.safetensors.index.json", text);
    fs::path root = work / "imported";
    fs::remove_all(root);
    importCheckpoint(folder.string(), root.string(), 1);
    return true;
  };
  return f;
}

std::string u32(uint32_t v) {
  std::string out;
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(char((v >> shift) & 0xff));
  return out;
}
std::string message(const std::string &body) {
  return u32(uint32_t(body.size())) + body;
}
std::string field(const std::string &s) { return u32(uint32_t(s.size())) + s; }

/// The store's messages: a server per batch (a child's), each input a
/// connection sending a mutated request sequence; after each, a client of
/// the job must still set and get.
Format storeFormat() {
  Format f;
  f.suffix = ".bin";
  std::string ms(8, '\0');
  f.seeds = {message("S" + field("key") + field("value")),
             message("G" + ms + field("key")),
             message("W" + std::string(7, '\0') + "\x05" + u32(2) +
                     field("key") + field("other")),
             message("S" + field("a") + field(std::string(300, 'v'))) +
                 message("G" + ms + field("a"))};
  f.mutate = [](std::string &s, Rng &rng) {
    if (rng() % 4 == 0 && s.size() >= 4) {
      uint32_t v = 0;
      const uint32_t choices[] = {0,        1, 4, 0xffffffffu, (64u << 20) + 1,
                                  64u << 20};
      v = choices[rng() % std::size(choices)];
      std::string len = u32(v);
      s.replace(0, 4, len);
    }
    mutate(s, rng);
  };
  struct Server {
    int port = 0;
    std::unique_ptr<TcpStoreServer> server;
    std::unique_ptr<TcpStore> client;
  };
  auto server = std::make_shared<Server>();
  f.read = [server](const std::string &path) {
    if (!server->server) { // once per child
      int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      socklen_t len = sizeof addr;
      ::bind(fd, reinterpret_cast<sockaddr *>(&addr), len);
      ::getsockname(fd, reinterpret_cast<sockaddr *>(&addr), &len);
      server->port = ntohs(addr.sin_port);
      ::close(fd);
      StoreAddress at{"127.0.0.1", uint16_t(server->port)};
      TcpStoreLimits limits;
      limits.bufferedBytes = 64u << 20;
      limits.storedBytes = 16u << 20;
      server->server = std::make_unique<TcpStoreServer>(at, "", limits);
      server->client =
          std::make_unique<TcpStore>(at, std::chrono::seconds(5), "watch", "");
    }
    std::string bytes = readFile(path);
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(uint16_t(server->port));
    if (::connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr) == 0) {
      ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      pollfd p{fd, POLLIN, 0};
      char buffer[4096];
      while (::poll(&p, 1, 2) > 0 && ::recv(fd, buffer, sizeof buffer, 0) > 0) {
      }
    }
    ::close(fd);
    // The job's own client is still served.
    server->client->set("alive", {'y'});
    if (server->client->get("alive") != std::vector<char>{'y'})
      std::abort();
    return true;
  };
  return f;
}

struct Options {
  std::string format, crashDir = "fuzz-crashes";
  uint64_t seed = 1;
  int64_t iterations = -1, replay = -1;
  double maxSeconds = 0;
};

Options parse(int argc, char **argv) {
  Options o;
  auto usage = [] {
    std::cerr
        << "usage: ernie-fuzz-formats safetensors|manifest|npy|json|store "
           "[--seed N] [--iterations N] [--max-seconds S] [--crash-dir DIR] "
           "[--replay I]\n";
    std::exit(2);
  };
  if (argc < 2)
    usage();
  o.format = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc)
      usage();
    std::string v = argv[++i];
    if (a == "--seed")
      o.seed = std::stoull(v);
    else if (a == "--iterations")
      o.iterations = std::stoll(v);
    else if (a == "--max-seconds")
      o.maxSeconds = std::stod(v);
    else if (a == "--crash-dir")
      o.crashDir = v;
    else if (a == "--replay")
      o.replay = std::stoll(v);
    else
      usage();
  }
  o.iterations = fuzzIterations(o.iterations);
  return o;
}

} // namespace

int main(int argc, char **argv) {
  Options o = parse(argc, argv);
  // Scratch files on a RAM disk where there is one: saves and imports fsync.
  fs::path base =
      fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
  fs::path work =
      base / ("ernie-fuzz-" + o.format + "-" + std::to_string(::getpid()));
  fs::remove_all(work);
  fs::create_directories(work);
  Format format;
  try {
    if (o.format == "safetensors")
      format = safetensorsFormat(work);
    else if (o.format == "npy")
      format = npyFormat(work);
    else if (o.format == "manifest")
      format = manifestFormat(work);
    else if (o.format == "json")
      format = jsonFormat(work);
    else if (o.format == "store")
      format = storeFormat();
    else
      parse(1, argv);
  } catch (const std::exception &e) {
    std::cerr << "ernie-fuzz-formats: cannot write the seeds: " << e.what()
              << "\n";
    return 2;
  }
  // Input i: a seed picked and mutated by a generator of (seed, i) only.
  auto runInput = [&](int64_t i, const std::string &current) {
    Rng rng(o.seed * 0x9e3779b97f4a7c15ull + uint64_t(i));
    std::string bytes = format.seeds[rng() % format.seeds.size()];
    format.mutate(bytes, rng);
    writeFile(current, bytes);
    try {
      return format.read(current);
    } catch (const std::bad_alloc &) {
      std::abort(); // memory before validation: a finding
    } catch (const std::exception &) {
      return false; // a clean refusal
    }
  };
  int status = 0;
  if (o.replay >= 0) {
    fs::path current = work / ("replay" + format.suffix);
    bool accepted = runInput(o.replay, current.string());
    std::cout << "input " << o.replay << (accepted ? " accepted" : " refused")
              << ", ended cleanly (written to " << current << ")\n";
  } else {
    FuzzBatches batches;
    batches.tool = "ernie-fuzz-formats " + o.format;
    batches.crashDir = o.crashDir;
    batches.suffix = format.suffix;
    batches.seed = o.seed;
    batches.iterations = o.iterations;
    batches.maxSeconds = o.maxSeconds;
    batches.addressSpace = uint64_t(2) << 30;
    batches.alarmSeconds = 10;
    FuzzSummary sum = runFuzzBatches(batches, runInput);
    std::cout << "ernie-fuzz-formats " << o.format << ": " << sum.ran
              << " inputs (seed " << o.seed << "), " << sum.accepted
              << " accepted, " << sum.findings << " findings, " << sum.seconds
              << " s\n";
    status = sum.findings ? 1 : 0;
  }
  fs::remove_all(work);
  return status;
}

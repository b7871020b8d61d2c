//===- ernie-ckpt.cpp - inspect, verify and convert checkpoints ------------===//
//
//   ernie-ckpt info DIR                  tensors, shapes, dtypes, mesh, sizes
//   ernie-ckpt verify DIR                every byte covered once, checksums
//   ernie-ckpt consolidate DIR OUT [--max-shard-bytes N]
//                                        the global tensors under the
//                                        checkpoint's names: one safetensors
//                                        file (OUT.safetensors), or a folder
//                                        of shards of at most N bytes and an
//                                        index
//   ernie-ckpt import SOURCE ROOT [STEP] a checkpoint from such a file or
//                                        folder
//   ernie-ckpt export-hf DIR OUT --config config.json
//                        [--dtype float32|bfloat16|float16] [--max-shard-bytes N]
//                                        a Hugging Face model folder that
//                                        transformers loads: its names and
//                                        layout, no optimizer state
//   ernie-ckpt import-hf FOLDER ROOT [STEP]
//                                        a weights-only checkpoint of a
//                                        Hugging Face folder, which a program
//                                        of any mesh loads (its optimizer
//                                        state starting afresh)
//
// The names and layouts of export-hf and import-hf are HfLayout.h's, the
// ones the Python models' from_pretrained and save_pretrained use.
// DIR is a checkpoint or a directory of them (the newest complete one).
// Exit status 0 on success, 1 with a message naming the file and tensor on
// any fault, 2 on bad usage.
//
//===----------------------------------------------------------------------===//

#include "ernie/runtime/Checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

using namespace ernie::runtime;

static int usage() {
  std::cerr << "usage: ernie-ckpt info DIR | verify DIR\n"
               "       ernie-ckpt consolidate DIR OUT.safetensors\n"
               "       ernie-ckpt consolidate DIR FOLDER [--max-shard-bytes N]\n"
               "       ernie-ckpt import FILE.safetensors|FOLDER ROOT [STEP]\n"
               "       ernie-ckpt export-hf DIR OUT --config config.json\n"
               "                  [--dtype float32|bfloat16|float16] "
               "[--max-shard-bytes N]\n"
               "       ernie-ckpt import-hf FOLDER ROOT [STEP]\n";
  return 2;
}

/// A non-negative integer argument, or nullopt.
static std::optional<long long> count(const std::string &text) {
  char *end = nullptr;
  errno = 0;
  long long n = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || n < 0 || errno == ERANGE)
    return std::nullopt;
  return n;
}

/// A command's positional arguments and --options (each taking a value),
/// or a message saying what is wrong.
struct Arguments {
  std::vector<std::string> positional;
  std::map<std::string, std::string> options;
  std::string error;
};

static Arguments parse(int argc, char **argv,
                       const std::vector<std::string> &known) {
  Arguments a;
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) {
      a.positional.push_back(arg);
      continue;
    }
    if (std::find(known.begin(), known.end(), arg) == known.end()) {
      a.error = "unknown option " + arg;
      return a;
    }
    if (i + 1 == argc || a.options.count(arg)) {
      a.error = arg + (i + 1 == argc ? " takes a value" : " given twice");
      return a;
    }
    a.options[arg] = argv[++i];
  }
  return a;
}

/// --max-shard-bytes N (N > 0), 0 when absent, nullopt when malformed.
static std::optional<uint64_t> maxShardBytes(const Arguments &a) {
  auto it = a.options.find("--max-shard-bytes");
  if (it == a.options.end())
    return 0;
  std::optional<long long> n = count(it->second);
  if (!n || *n == 0)
    return std::nullopt;
  return static_cast<uint64_t>(*n);
}

static int bad(const std::string &why) {
  std::cerr << "ernie-ckpt: " << why << "\n";
  return 2;
}

int main(int argc, char **argv) {
  if (argc < 3)
    return usage();
  std::string command = argv[1];
  Arguments a = parse(argc, argv, {"--max-shard-bytes", "--config", "--dtype"});
  if (!a.error.empty())
    return bad(command + ": " + a.error);
  const auto &pos = a.positional;
  auto step = [&](size_t i) -> std::optional<long long> {
    return pos.size() > i ? count(pos[i]) : 0;
  };
  try {
    if ((command == "info" || command == "verify") && pos.size() == 1 && a.options.empty()) {
      std::string dir = resolveCheckpoint(pos[0]);
      std::cout << (command == "info" ? describeCheckpoint(dir) : verifyCheckpoint(dir));
    } else if (command == "consolidate" && pos.size() == 2 &&
               a.options.size() == a.options.count("--max-shard-bytes")) {
      std::optional<uint64_t> shard = maxShardBytes(a);
      if (!shard)
        return bad("consolidate takes --max-shard-bytes N (N > 0)");
      consolidateCheckpoint(resolveCheckpoint(pos[0]), pos[1], *shard);
      std::cout << "wrote " << pos[1] << "\n";
    } else if ((command == "import" || command == "import-hf") &&
               (pos.size() == 2 || pos.size() == 3) && a.options.empty()) {
      if (!step(2))
        return bad("STEP must be a non-negative integer, not '" + pos[2] + "'");
      std::string dir = command == "import" ? importCheckpoint(pos[0], pos[1], *step(2))
                                            : importHfFolder(pos[0], pos[1], *step(2));
      std::cout << "wrote " << dir << "\n";
    } else if (command == "export-hf" && pos.size() == 2) {
      if (!a.options.count("--config"))
        return bad("export-hf takes --config config.json: the model's Hugging Face "
                   "config, which names the family and its sizes");
      std::optional<uint64_t> shard = maxShardBytes(a);
      if (!shard)
        return bad("export-hf takes --max-shard-bytes N (N > 0)");
      std::optional<DType> dtype;
      if (auto it = a.options.find("--dtype"); it != a.options.end()) {
        dtype = parseTorchDtype(it->second);
        if (!dtype)
          return bad("--dtype is float32, bfloat16 or float16, not '" + it->second + "'");
      }
      exportHfFolder(resolveCheckpoint(pos[0]), pos[1], a.options.at("--config"), dtype,
                     *shard);
      std::cout << "wrote " << pos[1] << "\n";
    } else {
      return usage();
    }
  } catch (const std::exception &e) {
    std::cerr << "ernie-ckpt: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

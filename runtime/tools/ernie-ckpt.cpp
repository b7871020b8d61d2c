//===- ernie-ckpt.cpp - inspect, verify and convert checkpoints ------------===//
//
//   ernie-ckpt info DIR                  tensors, shapes, dtypes, mesh, sizes
//   ernie-ckpt verify DIR                every byte covered once, checksums
//   ernie-ckpt consolidate DIR OUT [--max-shard-bytes N]
//                                        the global tensors: one safetensors
//                                        file (OUT.safetensors), or a folder
//                                        in Hugging Face's layout (shards of
//                                        at most N bytes and an index)
//   ernie-ckpt import SOURCE ROOT [STEP] a checkpoint from such a file or
//                                        folder
//
// The tensors keep the checkpoint's names; a model's own Hugging Face names
// and layout come from Python (LlamaForCausalLM.save_pretrained(folder,
// state=program.state_dict()), Program.load_pretrained(folder)).
// DIR is a checkpoint or a directory of them (the newest complete one).
// Exit status 0 on success, 1 with a message naming the file and tensor on
// any fault, 2 on bad usage.
//
//===----------------------------------------------------------------------===//

#include "ernie/runtime/Checkpoint.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>

using namespace ernie::runtime;

static int usage() {
  std::cerr << "usage: ernie-ckpt info DIR | verify DIR\n"
               "       ernie-ckpt consolidate DIR OUT.safetensors\n"
               "       ernie-ckpt consolidate DIR FOLDER [--max-shard-bytes N]\n"
               "       ernie-ckpt import FILE.safetensors|FOLDER ROOT [STEP]\n";
  return 2;
}

/// A non-negative integer argument, or nullopt.
static std::optional<long long> count(const char *text) {
  char *end = nullptr;
  errno = 0;
  long long n = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || n < 0 || errno == ERANGE)
    return std::nullopt;
  return n;
}

int main(int argc, char **argv) {
  if (argc < 3)
    return usage();
  std::string command = argv[1];
  try {
    if (command == "info" && argc == 3) {
      std::cout << describeCheckpoint(resolveCheckpoint(argv[2]));
    } else if (command == "verify" && argc == 3) {
      std::cout << verifyCheckpoint(resolveCheckpoint(argv[2]));
    } else if (command == "consolidate" && (argc == 4 || argc == 6)) {
      uint64_t maxShard = 0;
      if (argc == 6) {
        std::optional<long long> n = count(argv[5]);
        if (std::strcmp(argv[4], "--max-shard-bytes") != 0 || !n || *n == 0) {
          std::cerr << "ernie-ckpt: consolidate takes --max-shard-bytes N (N > 0)\n";
          return 2;
        }
        maxShard = *n;
      }
      consolidateCheckpoint(resolveCheckpoint(argv[2]), argv[3], maxShard);
      std::cout << "wrote " << argv[3] << "\n";
    } else if (command == "import" && (argc == 4 || argc == 5)) {
      std::optional<long long> step = argc == 5 ? count(argv[4]) : 0;
      if (!step) {
        std::cerr << "ernie-ckpt: STEP must be a non-negative integer, not '"
                  << argv[4] << "'\n";
        return 2;
      }
      std::string dir = importCheckpoint(argv[2], argv[3], *step);
      std::cout << "wrote " << dir << "\n";
    } else {
      return usage();
    }
  } catch (const std::exception &e) {
    std::cerr << "ernie-ckpt: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

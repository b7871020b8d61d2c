//===- ernie-ckpt.cpp - inspect, verify and convert checkpoints ------------===//
//
//   ernie-ckpt info DIR                  tensors, shapes, dtypes, mesh, sizes
//   ernie-ckpt verify DIR                every byte covered once, checksums
//   ernie-ckpt consolidate DIR OUT       one safetensors file of global tensors
//   ernie-ckpt import FILE ROOT [STEP]   a checkpoint from such a file
//
// DIR is a checkpoint or a directory of them (the newest complete one).
// Exit status 0 on success, 1 with a message naming the file and tensor on
// any fault, 2 on bad usage.
//
//===----------------------------------------------------------------------===//

#include "ernie/runtime/Checkpoint.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>

using namespace ernie::runtime;

static int usage() {
  std::cerr << "usage: ernie-ckpt info DIR | verify DIR | consolidate DIR OUT"
               ".safetensors | import FILE.safetensors ROOT [STEP]\n";
  return 2;
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
    } else if (command == "consolidate" && argc == 4) {
      consolidateCheckpoint(resolveCheckpoint(argv[2]), argv[3]);
      std::cout << "wrote " << argv[3] << "\n";
    } else if (command == "import" && (argc == 4 || argc == 5)) {
      char *end = nullptr;
      long long step = argc == 5 ? std::strtoll(argv[4], &end, 10) : 0;
      if (argc == 5 && (*end != '\0' || step < 0)) {
        std::cerr << "ernie-ckpt: STEP must be a non-negative integer, not '"
                  << argv[4] << "'\n";
        return 2;
      }
      std::cout << "wrote " << importCheckpoint(argv[2], argv[3], step) << "\n";
    } else {
      return usage();
    }
  } catch (const std::exception &e) {
    std::cerr << "ernie-ckpt: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

//===- ProgramDecoding.h - what the program loader's files share -*- C++ -*-===//
//
// The loader is split by job: Program.cpp decodes a program file and checks
// its functions; OpSignatures.cpp says what each op's instruction must look
// like (the executor's own ops, and every kernel's operand and result rules,
// kept equal to the dialect's by test/Unit/OpSignatureTest.cpp);
// PipelineDecoding.cpp decodes and checks a pipelined program's stages,
// hand-offs and schedule. A private header: nothing outside runtime/src
// includes it.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_RUNTIME_SRC_PROGRAMDECODING_H
#define ERNIE_RUNTIME_SRC_PROGRAMDECODING_H

#include "ernie/program/program_generated.h"
#include "ernie/runtime/Program.h"

#include <string>
#include <vector>

namespace ernie::runtime::loader {

namespace fb = ernie::program;

/// The ops the executor runs itself, besides constants: how many operands
/// and results each takes and whether it names a group by axes.
struct ExecutorOpSignature {
  const char *op;
  size_t operands, results; // kVariadic: as many results as operands, >= 1
  bool needsAxes;
};

constexpr size_t kVariadic = ~size_t(0);

/// The executor's signature of `op`, or null.
const ExecutorOpSignature *executorOpSignature(const std::string &op);

/// The pipeline's point-to-point ops: they talk across stages.
bool isStageOp(const std::string &op);

/// Collects the first problem found, prefixed with where it is.
class Checker {
public:
  explicit Checker(std::string source) : source_(std::move(source)) {}
  [[noreturn]] void fail(const std::string &what) const {
    throw ProgramError(source_ + ": " + what);
  }
  void require(bool ok, const std::string &what) const {
    if (!ok)
      fail(what);
  }

private:
  std::string source_;
};

inline std::string str(const flatbuffers::String *s) { return s ? s->str() : ""; }

/// A program without a pipeline has one stage and no stage ops; refused
/// otherwise.
void checkNotPipelined(const std::vector<std::vector<Function>> &stages,
                       const Checker &check);

/// The pipeline of program `p` (its stages' functions already decoded),
/// checked: micro-batches, schedule, and the hand-offs between chunks.
PipelineSpec decodePipeline(const fb::Program *p,
                            const std::vector<std::vector<Function>> &stages,
                            const std::string &stageAxis, const Checker &check);

} // namespace ernie::runtime::loader

#endif // ERNIE_RUNTIME_SRC_PROGRAMDECODING_H

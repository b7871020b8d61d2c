//===- PipelineInfo.h - the module's pipeline, read with checks -*- C++ -*-===//
//
// The one reader of a module's `ernie.pipeline` dictionary and its
// `ernie.pipeline_schedule` array, used by the verifier, the pipeline passes
// and the program writer, so a missing or ill-typed key is a diagnostic
// naming it wherever the dictionary is read.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_DIALECT_ERNIE_IR_PIPELINEINFO_H
#define ERNIE_DIALECT_ERNIE_IR_PIPELINEINFO_H

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"

#include <optional>
#include <string>
#include <vector>

namespace mlir::ernie {

/// What `ernie.pipeline` says. --ernie-pipeline-split writes `stages`,
/// `virtual_stages` and `axis`; --ernie-pipeline-schedule adds
/// `micro_batches` and `schedule`, and the module's per-rank steps.
struct PipelineInfo {
  int64_t stages = 1;
  int64_t virtualStages = 1;
  std::string axis;
  /// Both set once the pipeline is scheduled.
  std::optional<int64_t> microBatches;
  std::optional<std::string> schedule;
  /// `ernie.pipeline_schedule`: one string of steps per pipeline rank
  /// (possibly given before scheduling, for schedule=custom).
  std::optional<std::vector<std::string>> rankSteps;

  bool isScheduled() const { return microBatches.has_value(); }
};

/// Checks and reads an `ernie.pipeline` dictionary: `stages` (i64 in
/// [1, 4096]) and `virtual_stages` (i64 in [1, 2^20]), `axis` a non-empty
/// string, `micro_batches` (i64 in [1, 2^20]) and `schedule` (a non-empty
/// string) both or neither, no other key, at most 2^22 steps. Diagnostics
/// name the key.
FailureOr<PipelineInfo>
parsePipelineInfo(DictionaryAttr dict,
                  function_ref<InFlightDiagnostic()> emitError);

/// Checks an `ernie.pipeline_schedule` value: an array of strings.
FailureOr<std::vector<std::string>>
parsePipelineSteps(Attribute steps,
                   function_ref<InFlightDiagnostic()> emitError);

/// The module's pipeline: std::nullopt when it has no `ernie.pipeline`;
/// failure, with a diagnostic at the module, when the dictionary or the
/// per-rank steps are ill-formed, or when more than one stage does not
/// match the mesh's `axis`.
FailureOr<std::optional<PipelineInfo>> readPipelineInfo(ModuleOp module);

} // namespace mlir::ernie

#endif // ERNIE_DIALECT_ERNIE_IR_PIPELINEINFO_H

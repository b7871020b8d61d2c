//===- Pipelines.h - ernie's pass pipelines as code -------------*- C++ -*-===//
//
// The documented pipeline builders and their option structs. Each pipeline is
// registered under its flag, so `ernie-opt` runs exactly what the Python
// package runs: `ernie.compile` fills a `TrainingPipelineOptions` through the
// extension and calls `buildTrainingPipeline`, never pipeline text.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_PASSES_PIPELINES_H
#define ERNIE_PASSES_PIPELINES_H

#include "ernie/Passes/Passes.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"

#include <memory>

namespace mlir::ernie {

/// Options of `--ernie-simplify-pipeline`.
struct SimplifyPipelineOptions
    : public PassPipelineOptions<SimplifyPipelineOptions> {
  Option<bool> runCse{*this, "cse",
                      llvm::cl::desc("Run common-subexpression elimination"),
                      llvm::cl::init(true)};
};

/// Checks the program contract, then canonicalizes (folding ernie's
/// algebraic identities and shape-op chains) and, optionally, runs CSE.
void buildSimplifyPipeline(OpPassManager &pm,
                           const SimplifyPipelineOptions &options);

/// Options of `--ernie-auto-parallel-pipeline`.
struct AutoParallelPipelineOptions
    : public PassPipelineOptions<AutoParallelPipelineOptions> {
  Option<bool> partition{
      *this, "partition",
      llvm::cl::desc("Partition into the per-rank program (off: stop after "
                     "propagation, every value annotated, for inspection)"),
      llvm::cl::init(true)};
  Option<bool> runCse{*this, "cse",
                      llvm::cl::desc("Run common-subexpression elimination"),
                      llvm::cl::init(true)};
  Option<std::string> cluster{
      *this, "cluster",
      llvm::cl::desc("Choose layouts and collectives by their time on this "
                     "cluster (JSON file) instead of by bytes")};
  /// A cluster already parsed (C++ callers); it wins over `cluster`.
  std::shared_ptr<const cost::ClusterSpec> clusterSpec;
};

/// The whole compiler, from a single-device module with a few placements to
/// the SPMD program every rank runs: the program-contract check, mean losses
/// written as sum / count, sharding propagation, SPMD partition, then
/// canonicalization and CSE.
void buildAutoParallelPipeline(OpPassManager &pm,
                               const AutoParallelPipelineOptions &options);

/// Options of `--ernie-training-pipeline`: one field per decision the user's
/// plan makes, named after the pass option it becomes, with that pass's
/// default. The defaults compile a gradient function with fusion.
struct TrainingPipelineOptions
    : public PassPipelineOptions<TrainingPipelineOptions> {
  // --ernie-autodiff: the training step.
  Option<bool> differentiate{
      *this, "differentiate",
      llvm::cl::desc("Build the gradient (and with an optimizer the training "
                     "step); off: the forward alone"),
      llvm::cl::init(true)};
  Option<std::string> optimizer{*this, "optimizer",
                                llvm::cl::desc("none, sgd or adamw"),
                                llvm::cl::init("none")};
  Option<double> momentum{*this, "momentum", llvm::cl::desc("SGD momentum"),
                          llvm::cl::init(AutodiffPassOptions().momentum)};
  Option<double> weightDecay{
      *this, "weight-decay", llvm::cl::desc("Weight decay"),
      llvm::cl::init(AutodiffPassOptions().weightDecay)};
  Option<double> beta1{*this, "beta1", llvm::cl::desc("AdamW beta1"),
                       llvm::cl::init(AutodiffPassOptions().beta1)};
  Option<double> beta2{*this, "beta2", llvm::cl::desc("AdamW beta2"),
                       llvm::cl::init(AutodiffPassOptions().beta2)};
  Option<double> epsilon{*this, "epsilon", llvm::cl::desc("AdamW epsilon"),
                         llvm::cl::init(AutodiffPassOptions().epsilon)};
  Option<double> clipNorm{
      *this, "clip-norm",
      llvm::cl::desc("Clip gradients to this global norm (0: off)"),
      llvm::cl::init(AutodiffPassOptions().clipNorm)};
  Option<bool> multiPrecision{
      *this, "multi-precision",
      llvm::cl::desc("f32 master weights for narrower parameters"),
      llvm::cl::init(AutodiffPassOptions().multiPrecision)};
  Option<bool> gradNorm{
      *this, "grad-norm",
      llvm::cl::desc("Return the gradients' global norm as the step's "
                     "metric \"grad_norm\""),
      llvm::cl::init(AutodiffPassOptions().gradNorm)};

  // --ernie-auto-parallel-pipeline and what only runs on a partitioned
  // program.
  Option<bool> partition{
      *this, "partition",
      llvm::cl::desc("Propagate shardings and partition over the module's "
                     "mesh (off: a single-device program)"),
      llvm::cl::init(true)};
  Option<std::string> cluster{
      *this, "cluster",
      llvm::cl::desc("Choose layouts and collectives by their time on this "
                     "cluster (JSON file) instead of by bytes")};
  /// A cluster already parsed (what Python passes); it wins over `cluster`.
  std::shared_ptr<const cost::ClusterSpec> clusterSpec;

  // --ernie-pipeline-split / -shared-weight-dedup / -pipeline-schedule.
  Option<int64_t> pipelineStages{
      *this, "pipeline-stages",
      llvm::cl::desc("Pipeline stages (the pp axis size; 1: no pipeline)"),
      llvm::cl::init(1)};
  Option<int64_t> virtualStages{
      *this, "virtual-stages",
      llvm::cl::desc("Model chunks per pipeline rank (interleaved)"),
      llvm::cl::init(1)};
  Option<int64_t> microBatches{*this, "micro-batches",
                               llvm::cl::desc("Micro-batches per step"),
                               llvm::cl::init(1)};
  Option<std::string> schedule{
      *this, "schedule",
      llvm::cl::desc("FThenB, 1F1B or VPP (the runtime's schedules)"),
      llvm::cl::init("1F1B")};
  Option<std::string> accumulate{
      *this, "accumulate",
      llvm::cl::desc("How a pipelined backward sums micro-batch gradients: "
                     "gemm (a weight gradient's GEMM adds into the sum: "
                     "Megatron's gradient accumulation fusion), add, runtime"),
      llvm::cl::init("gemm")};

  // --ernie-zero-sharding.
  Option<unsigned> zeroLevel{*this, "zero-level",
                             llvm::cl::desc("ZeRO level 0-3 (0: off)"),
                             llvm::cl::init(0)};
  Option<std::string> zeroAxis{*this, "zero-axis",
                               llvm::cl::desc("The mesh axis ZeRO shards over"),
                               llvm::cl::init("dp")};

  // --ernie-fp8-lowering (its options, prefixed).
  Option<bool> fp8{*this, "fp8",
                   llvm::cl::desc("Run the linear layers' GEMMs in FP8"),
                   llvm::cl::init(false)};
  Option<std::string> fp8Recipe{
      *this, "fp8-recipe", llvm::cl::desc("current, delayed or blockwise"),
      llvm::cl::init(Fp8LoweringPassOptions().recipe)};
  Option<std::string> fp8FwdFormat{
      *this, "fp8-fwd-format", llvm::cl::desc("e4m3 or e5m2"),
      llvm::cl::init(Fp8LoweringPassOptions().fwdFormat)};
  Option<std::string> fp8GradFormat{
      *this, "fp8-grad-format", llvm::cl::desc("e4m3 or e5m2"),
      llvm::cl::init(Fp8LoweringPassOptions().gradFormat)};
  Option<std::string> fp8Exclude{
      *this, "fp8-exclude",
      llvm::cl::desc("Parameters (regex) whose GEMMs stay as they are"),
      llvm::cl::init(Fp8LoweringPassOptions().exclude)};
  Option<std::string> fp8Include{
      *this, "fp8-include", llvm::cl::desc("Parameters (regex) lowered"),
      llvm::cl::init(Fp8LoweringPassOptions().include)};
  Option<unsigned> fp8HistoryLength{
      *this, "fp8-history-length", llvm::cl::desc("delayed: amax history"),
      llvm::cl::init(Fp8LoweringPassOptions().historyLength)};
  Option<unsigned> fp8Margin{
      *this, "fp8-margin", llvm::cl::desc("delayed: scale margin (2^-m)"),
      llvm::cl::init(Fp8LoweringPassOptions().margin)};
  Option<std::string> fp8AmaxCompute{
      *this, "fp8-amax-compute", llvm::cl::desc("delayed: max or most_recent"),
      llvm::cl::init(Fp8LoweringPassOptions().amaxCompute)};
  Option<unsigned> fp8BlockSize{
      *this, "fp8-block-size", llvm::cl::desc("blockwise: tile size"),
      llvm::cl::init(Fp8LoweringPassOptions().blockSize)};
  Option<bool> fp8Pow2Scale{
      *this, "fp8-pow2-scale", llvm::cl::desc("Round scales to powers of two"),
      llvm::cl::init(Fp8LoweringPassOptions().pow2Scale)};

  // --ernie-recompute.
  Option<std::string> recompute{*this, "recompute",
                                llvm::cl::desc("none, selective or full"),
                                llvm::cl::init("none")};

  // After partition.
  Option<bool> sequenceParallelOverlap{
      *this, "sequence-parallel-overlap",
      llvm::cl::desc("Decompose sequence parallelism's collective matmuls"),
      llvm::cl::init(false)};
  Option<int64_t> bucketBytes{
      *this, "bucket-bytes",
      llvm::cl::desc("Gradient bucket size in bytes (0: no buckets)"),
      llvm::cl::init(BucketGradientsPassOptions().bucketBytes)};
  Option<std::string> gradReduce{
      *this, "grad-reduce",
      llvm::cl::desc("f32 (narrow gradients reduced in f32) or native"),
      llvm::cl::init("f32")};
  Option<bool> fuse{*this, "fuse",
                    llvm::cl::desc("Group elementwise chains (last)"),
                    llvm::cl::init(true)};
};

/// The training compiler's whole pass order, the one `ernie.compile` runs:
///
///   [pipeline-split, shared-weight-dedup]  a pipelined model (stages > 1)
///   [autodiff]                             fwd + bwd (+ optimizer)
///   [zero-sharding] [fp8-lowering] [recompute]
///   auto-parallel-pipeline                 check, propagate, partition
///   [sequence-parallel-overlap] [pipeline-schedule] [bucket-gradients]
///   [fuse]                                 last: per-rank elementwise loops
///
/// Without `partition` the module is simplified (canonicalize, CSE) in
/// place of the auto-parallel pipeline and nothing after it runs. The
/// memory plan and program file follow in the writer (`ernie-translate
/// --ernie-to-program`), not here.
void buildTrainingPipeline(OpPassManager &pm,
                           const TrainingPipelineOptions &options);

} // namespace mlir::ernie

#endif // ERNIE_PASSES_PIPELINES_H

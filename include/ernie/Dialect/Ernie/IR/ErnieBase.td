//===- ErnieBase.td - ernie dialect definition and base classes -*- tablegen -*-===//
//
// The dialect, the element types it computes on and the base class of its ops.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_DIALECT_ERNIE_IR_ERNIEBASE_TD
#define ERNIE_DIALECT_ERNIE_IR_ERNIEBASE_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"

def Ernie_Dialect : Dialect {
  let name = "ernie";
  let cppNamespace = "::mlir::ernie";
  let summary = "Tensor ops of a decoder-only transformer, ready for auto-parallelism";
  let description = [{
    The `ernie` dialect holds a training program at the level a researcher
    writes it: value-semantic ops on statically shaped, ranked builtin tensors
    (`matmul`, `rms_norm`, `attention`, `cross_entropy`, ...). Every op knows
    its own shape rules and carries the interfaces the auto-parallel passes
    talk to it through: its sharding rule and its cost (the gradient
    interface is declared; its rules arrive with autodiff).

    Broadcasting is never implicit: elementwise binary ops take operands of
    one shape, and `ernie.broadcast` says which dimensions are expanded.

    Trainable parameters are function arguments named by `ernie.param`
    (their qualified name in the model), optionally grouped by `ernie.tied`
    when several arguments are one shared weight.
  }];
  let hasConstantMaterializer = 1;
  // `ernie.param` / `ernie.tied` / `ernie.sharding` on function arguments,
  // `ernie.sharding` on results, `ernie.shardings` on ops.
  let hasRegionArgAttrVerify = 1;
  let hasRegionResultAttrVerify = 1;
  let hasOperationAttrVerify = 1;
  let extraClassDeclaration = [{
    /// Names a function argument as a trainable parameter:
    /// `{ernie.param = "llama.layers.0.mlp.down_proj.weight"}`.
    static constexpr ::llvm::StringLiteral kParamAttrName = "ernie.param";
    /// Groups arguments that are one shared weight: `{ernie.tied = "embed"}`.
    static constexpr ::llvm::StringLiteral kTiedAttrName = "ernie.tied";

    // What a training step's arguments and results are to the runtime
    // (written by --ernie-autodiff, read by the program file export).
    /// An optimizer slot argument: `{ernie.opt_state = "<param>:<slot>"}`.
    static constexpr ::llvm::StringLiteral kOptStateAttrName = "ernie.opt_state";
    /// A result that replaces a parameter or slot for the next step.
    static constexpr ::llvm::StringLiteral kUpdatesAttrName = "ernie.updates";
    /// The scalar learning-rate and step-number arguments (unit attrs).
    static constexpr ::llvm::StringLiteral kLearningRateAttrName = "ernie.learning_rate";
    static constexpr ::llvm::StringLiteral kStepAttrName = "ernie.step";
    /// The result that is the training loss (unit attr).
    static constexpr ::llvm::StringLiteral kLossAttrName = "ernie.loss";
    /// A scalar result the step reports beside the loss, by name
    /// (`{ernie.metric = "grad_norm"}`): monitored, never fed back.
    static constexpr ::llvm::StringLiteral kMetricAttrName = "ernie.metric";

    // Activation recomputation (--ernie-recompute).
    /// On ops: the layer (a recomputation unit) whose forward the op is in,
    /// e.g. "layers.3" (string). Read and removed by --ernie-recompute.
    static constexpr ::llvm::StringLiteral kLayerAttrName = "ernie.layer";
    /// On ops: a forward op recomputed in the backward (unit). Keeps CSE
    /// from merging the copy back into the value it replaces.
    static constexpr ::llvm::StringLiteral kRecomputedAttrName = "ernie.recomputed";

    // Pipeline parallelism (--ernie-pipeline-split, --ernie-shared-weight-dedup,
    // --ernie-pipeline-schedule).
    /// On ops: the virtual stage (model chunk) an op runs on (i64).
    static constexpr ::llvm::StringLiteral kStageAttrName = "ernie.stage";
    /// On ops: the op is part of the backward pass (unit).
    static constexpr ::llvm::StringLiteral kBackwardAttrName = "ernie.backward";
    /// On the module: {stages, virtual_stages, axis[, micro_batches, schedule]}.
    static constexpr ::llvm::StringLiteral kPipelineAttrName = "ernie.pipeline";
    /// On the module: per pipeline rank its steps, "F<chunk>:<mb> B..." .
    static constexpr ::llvm::StringLiteral kPipelineScheduleAttrName = "ernie.pipeline_schedule";
    /// On functions: the stage-axis coordinate whose ranks run it (i64).
    static constexpr ::llvm::StringLiteral kPipelineStageAttrName = "ernie.pipeline_stage";
    /// On parameters: the virtual stages holding a replica (i64 array).
    static constexpr ::llvm::StringLiteral kPipelineStagesAttrName = "ernie.pipeline_stages";
    /// On parameters and slots: the stage-axis coordinate of this replica.
    static constexpr ::llvm::StringLiteral kPipelineRankAttrName = "ernie.pipeline_rank";
    /// On shared parameters: the coordinates of every replica (i64 array).
    static constexpr ::llvm::StringLiteral kSharedStagesAttrName = "ernie.shared_stages";
    /// On stage-function arguments: the position in the step's batch (i64).
    static constexpr ::llvm::StringLiteral kInputAttrName = "ernie.input";
    /// On stage-function arguments and results: a value the forward keeps
    /// for the backward, and a gradient summed over micro-batches (string).
    static constexpr ::llvm::StringLiteral kResidualAttrName = "ernie.residual";
    static constexpr ::llvm::StringLiteral kGradientAttrName = "ernie.gradient";
    /// On stage-function results and update arguments: a max-reduced
    /// statistic (an fp8 amax) each micro-batch makes, combined over the
    /// step's micro-batches by max (string).
    static constexpr ::llvm::StringLiteral kMicroBatchMaxAttrName = "ernie.micro_batch_max";
    /// Likewise a sum over the batch (MoE routing's usage per expert),
    /// combined over the step's micro-batches by sum (string).
    static constexpr ::llvm::StringLiteral kMicroBatchSumAttrName = "ernie.micro_batch_sum";

    /// On the reshape that cuts a blockwise-fp8 operand into tiles: the tile
    /// (rows, columns) over its last two dimensions, which partition checks
    /// no shard boundary cuts.
    static constexpr ::llvm::StringLiteral kFp8TileAttrName = "ernie.fp8_tile";

    // The memory plan, recorded by --ernie-memory-plan for inspection.
    static constexpr ::llvm::StringLiteral kArenaBytesAttrName = "ernie.arena_bytes";
    static constexpr ::llvm::StringLiteral kArgumentBytesAttrName = "ernie.argument_bytes";
    static constexpr ::llvm::StringLiteral kLivePeakBytesAttrName = "ernie.live_peak_bytes";
    static constexpr ::llvm::StringLiteral kActivationBytesAttrName = "ernie.activation_bytes";
    static constexpr ::llvm::StringLiteral kBufferOffsetAttrName = "ernie.buffer_offset";
    static constexpr ::llvm::StringLiteral kBufferOffsetsAttrName = "ernie.buffer_offsets";
  }];
  let useDefaultAttributePrinterParser = 1;
  let useDefaultTypePrinterParser = 1;
}

//===----------------------------------------------------------------------===//
// Element types and tensor constraints.
//===----------------------------------------------------------------------===//

def Ernie_FloatElement : AnyTypeOf<[F64, F32, F16, BF16, F8E4M3FN, F8E5M2],
                                   "floating-point">;
def Ernie_IntElement : AnyTypeOf<[I64, I32], "signless 32/64-bit integer">;
def Ernie_BoolElement : AnyTypeOf<[I1], "boolean">;
def Ernie_NumericElement : AnyTypeOf<[F64, F32, F16, BF16, F8E4M3FN, F8E5M2,
                                      I64, I32], "numeric">;
def Ernie_Element : AnyTypeOf<[F64, F32, F16, BF16, F8E4M3FN, F8E5M2,
                               I64, I32, I1], "ernie element">;

// Shapes are static (a distributed program plans every buffer ahead of time)
// and small enough that their byte size fits in an int64 in any element type
// (8 bytes an element: passes widen bf16 to f32 and indices to i64).
class Ernie_TensorOf<list<Type> allowedTypes>
    : Type<And<[StaticShapeTensorOf<allowedTypes>.predicate,
                CPred<"::mlir::ernie::hasAddressableSize("
                      "::llvm::cast<::mlir::ShapedType>($_self))">]>,
           StaticShapeTensorOf<allowedTypes>.summary #
               " with fewer than 2^60 elements",
           "::mlir::TensorType">;

def Ernie_Tensor : Ernie_TensorOf<[F64, F32, F16, BF16, F8E4M3FN, F8E5M2,
                                   I64, I32, I1]>;
def Ernie_FloatTensor : Ernie_TensorOf<[F64, F32, F16, BF16, F8E4M3FN,
                                        F8E5M2]>;
def Ernie_NumericTensor : Ernie_TensorOf<[F64, F32, F16, BF16, F8E4M3FN,
                                          F8E5M2, I64, I32]>;
def Ernie_IndexTensor : Ernie_TensorOf<[I64, I32]>;
def Ernie_BoolTensor : Ernie_TensorOf<[I1]>;
def Ernie_I64Tensor : Ernie_TensorOf<[I64]>;

//===----------------------------------------------------------------------===//
// Base op class.
//===----------------------------------------------------------------------===//

// Ernie tensors have no zero-size dimension (no kernel sees an empty
// extent). Checked on every op's operands and results after their type
// constraints, so the message names the cause.
def Ernie_NoZeroSizeTensors : NativeOpTrait<"NoZeroSizeTensors"> {
  let cppNamespace = "::mlir::ernie";
}

// An ernie op that reads values lives where values are defined before
// their uses (a function's body), not in a graph region (the module's body),
// where a value may feed itself: no program computes that, and folding
// chases it forever (`%0 = ernie.neg %0` hung the canonicalizer).
def Ernie_OperandsDominate : NativeOpTrait<"OperandsDominate"> {
  let cppNamespace = "::mlir::ernie";
}

class Ernie_Op<string mnemonic, list<Trait> traits = []>
    : Op<Ernie_Dialect, mnemonic,
         !listconcat([Ernie_NoZeroSizeTensors, Ernie_OperandsDominate],
                     traits)>;

#endif // ERNIE_DIALECT_ERNIE_IR_ERNIEBASE_TD

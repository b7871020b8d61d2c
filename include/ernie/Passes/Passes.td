//===- Passes.td - ernie passes -------------------------------*- tablegen -*-===//
//
// Every ernie pass, with its flag, summary, description and options. Passes
// run alone under ernie-opt; the pipelines in Passes.h compose them.
//
//===----------------------------------------------------------------------===//

#ifndef ERNIE_PASSES_PASSES_TD
#define ERNIE_PASSES_PASSES_TD

include "mlir/Pass/PassBase.td"

def CheckStaticProgramPass : Pass<"ernie-check-static-program", "ModuleOp"> {
  let summary = "Check that a module is an ernie program the later passes accept";
  let description = [{
    The auto-parallel passes plan every buffer ahead of time and talk to ops
    through the ernie interfaces, so they accept only functions whose values
    are statically shaped ranked tensors (or scalars) and whose ops are
    `ernie`, `func` or `arith` constant ops, and parameters are named once per
    function. This pass reports every value, op and parameter that breaks this
    contract, at its location, before any expensive pass runs. It changes
    nothing.

    ```mlir
    // error: 'tensor.empty' op is not part of an ernie program
    ```
  }];
  let dependentDialects = ["::mlir::ernie::ErnieDialect"];
}

def AutodiffPass : Pass<"ernie-autodiff", "ModuleOp"> {
  let summary = "Build the gradient of a loss function by reverse-mode AD";
  let description = [{
    For the function named by `function` (its one result a scalar float
    loss), adds `@<function>_grad` with the same arguments, returning the
    loss followed by one gradient per `ernie.param` argument, in argument
    order (each result tagged `ernie.grad_of = "<param name>"`). Calls are
    inlined first, so AD sees the whole computation, and mean cross-entropy
    losses are written as sum / count (`--ernie-expand-mean-loss`), so their
    gradients shard over the batch like the loss does.

    Every op between a parameter and the loss contributes its
    vector-Jacobian product through GradientOpInterface; gradients of a
    value used several times add up; integer values and `stop_gradient`
    results take none. A parameter the loss does not reach gets an explicit
    zero gradient, so every rank later joins the same collectives.

    Autodiff runs before sharding: gradients are values like any other, and
    the gradient of a replicated weight used under a batch split comes out
    of propagation as a pending sum over the batch axis, which partition
    completes with an all-reduce. Data-parallel gradient synchronisation
    needs no pass of its own.

    With `optimizer=sgd|adamw` it also adds the training step and the
    evaluation step:

    ```
    @train_step(params..., opt_state..., batch..., lr: tensor<f32>,
                step: tensor<i64>) -> (loss, params'..., opt_state'...)
    @eval_step(params..., batch...) -> loss      // no backward, no update
    ```
    The step calls `@<function>_grad`, optionally clips the gradients to a
    global norm, and applies `ernie.sgd_update` / `ernie.adamw_update` per
    parameter. With `multi-precision`, parameters narrower than f32 keep an
    f32 master copy in the optimizer state (Paddle's `multi_precision`):
    the update runs on the master and the parameter is its rounding. State
    arguments carry `ernie.opt_state = "<param>:<slot>"`, updated results
    `ernie.updates = "<param>"` or `"<param>:<slot>"`. A `loss-scale`
    other than 1 seeds the backward with that value and divides every
    gradient by it before it is returned.

    Errors name the op: a result that is not a scalar float, a parameter
    that is not a float tensor, an op without a gradient rule on the path.
  }];
  let options = [
    Option<"function", "function", "std::string", /*default=*/"\"forward\"",
           "The loss function to differentiate">,
    Option<"optimizer", "optimizer", "std::string", /*default=*/"\"none\"",
           "none (gradients only), sgd or adamw">,
    Option<"momentum", "momentum", "double", /*default=*/"0.0",
           "SGD momentum">,
    Option<"weightDecay", "weight-decay", "double", /*default=*/"0.0",
           "Weight decay (decoupled for AdamW)">,
    Option<"beta1", "beta1", "double", /*default=*/"0.9", "AdamW beta1">,
    Option<"beta2", "beta2", "double", /*default=*/"0.999", "AdamW beta2">,
    Option<"epsilon", "epsilon", "double", /*default=*/"1.0e-8",
           "AdamW epsilon">,
    Option<"clipNorm", "clip-norm", "double", /*default=*/"0.0",
           "Clip gradients to this global L2 norm (0: no clipping)">,
    Option<"multiPrecision", "multi-precision", "bool", /*default=*/"false",
           "Keep f32 master weights for narrower parameters">,
    Option<"lossScale", "loss-scale", "double", /*default=*/"1.0",
           "Static loss scale: the backward starts from this instead of 1 "
           "and the gradients are divided by it (keeps small bf16/f16 "
           "gradients representable)">,
  ];
  let dependentDialects = ["::mlir::ernie::ErnieDialect",
                           "::mlir::func::FuncDialect"];
}

def ExpandMeanLossPass : Pass<"ernie-expand-mean-loss"> {
  let summary = "Write mean cross-entropy as a sum over a count";
  let description = [{
    `cross_entropy` with `reduction = mean` divides by the number of tokens
    not ignored, a global count: its token dimensions could not be split
    without changing the answer. Written as
    `cross_entropy(sum) / count(labels != ignore_index)` both parts are sums,
    so a data-parallel batch split leaves two pending sums that one small
    all-reduce each completes, and the result is exactly the single-device
    mean. The auto-parallel pipeline runs this before propagation.

    ```mlir
    %l = ernie.cross_entropy %logits, %labels : ... -> tensor<f32>
    // becomes
    %s = ernie.cross_entropy %logits, %labels {reduction = #ernie<loss_reduction sum>} : ...
    %n = ... reduce_sum(cast(compare ne, %labels, ignore_index)) ...
    %l = ernie.div %s, %n : tensor<f32>
    ```
  }];
  let dependentDialects = ["::mlir::ernie::ErnieDialect"];
}

def ShardingPropagationPass
    : Pass<"ernie-sharding-propagation", "ModuleOp"> {
  let summary = "Give every tensor a sharding, from a few user annotations";
  let description = [{
    Starts from the user's placements — `ernie.sharding` on function
    arguments and results, `ernie.shardings` already on ops, and
    `ernie.sharding_constraint` ops — and spreads them through every op's
    sharding rule, forwards and backwards, across functions and calls, to a
    fixed point. Annotations are honoured in priority order (0 first):
    everything the strongest ones imply is settled before weaker ones speak.
    Where an op's known operands disagree, the factor choice whose
    resharding costs least wins (ties: the earliest operand). Without
    `cluster` a collective costs the bytes one rank sends; with it, its time
    on that cluster (the cost model's alpha-beta per collective: each hop's
    link latency plus bytes over the bandwidth of the links its group
    spans), so latency counts and a slow inter-node axis is avoided.

    Afterwards every op carries `ernie.shardings` (one per result), every
    tensor argument and result of a function carries `ernie.sharding`, and
    wherever a value's sharding differs from what its user needs an
    `ernie.reshard` says so explicitly: partition turns those into
    collectives. Constraints become reshards (or vanish when already met).
    Values left unconstrained are replicated.

    ```mlir
    ernie.mesh @mesh(dp = 2)
    func.func @f(%x: tensor<8x4xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {} ]>}, ...)
    // every value computed from %x row by row comes out split over dp too
    ```
  }];
  let options = [
    Option<"cluster", "cluster", "std::string", "\"\"",
           "Cost reshards as time on this cluster (JSON), not bytes">,
  ];
  let dependentDialects = ["::mlir::ernie::ErnieDialect"];
}

def SpmdPartitionPass : Pass<"ernie-spmd-partition", "ModuleOp"> {
  let summary = "Rewrite a sharded module into the program every rank runs";
  let description = [{
    Takes a module where every value has a sharding (after
    `--ernie-sharding-propagation`) and makes it local: every type becomes
    one rank's piece, every `ernie.reshard` becomes the cheapest sequence of
    collectives (`all_reduce`, `reduce_scatter`, `all_gather`, `all_to_all`)
    and local steps (`shard_slice`, `partial_init`) found by a shortest-path
    search over intermediate shardings (weighted by bytes, or by time on
    `cluster`, as propagation weighed them), and ops whose local form differs from
    their global one are expanded (a vocabulary-split embedding looks up the
    rows this rank owns and zeroes the rest). Collectives name mesh axes, not
    ranks: the program is the same for every rank and its size does not
    depend on the mesh.

    Function arguments and results keep the global layout they are a piece
    of as `ernie.shard_of`; op result shardings are dropped.

    In a function that computes a loss, a value all-gathered before the
    loss and read again after it (in the backward: a weight gradient reads
    a column-parallel matmul's gathered input, ZeRO-3 a parameter) is
    gathered again where the backward first needs it: the forward keeps the
    1/n piece (Megatron's sequence parallelism and ZeRO-3 make this trade).

    ```mlir
    // before: %r = ernie.reshard %y <@mesh, [{dp}, {} ]> (y Partial over mp)
    // after:  %r = ernie.all_reduce %y over @mesh[mp] sum : tensor<4x16xf32>
    ```
  }];
  let options = [
    Option<"cluster", "cluster", "std::string", "\"\"",
           "Cost reshards as time on this cluster (JSON), not bytes">,
  ];
  let dependentDialects = ["::mlir::ernie::ErnieDialect"];
}

def MemoryPlanPass : Pass<"ernie-memory-plan", "ModuleOp"> {
  let summary = "Plan every buffer of each function into one arena per rank";
  let description = [{
    Runs the memory planner the program file export uses (MemoryPlan.h) on
    every function with a body and records the plan for inspection:
    `ernie.arena_bytes` and `ernie.live_peak_bytes` on the function, the
    offset of every argument (`ernie.buffer_offset`) and of every op result
    (`ernie.buffer_offsets`, one per result). A result written over its
    operand in place has the operand's offset. Each function also gets a
    remark with its per-rank peak:

    ```
    remark: memory plan: arena 8192 bytes per rank, live peak 8192, 7 buffers, 2 written in place
    ```
    The arena is the per-rank peak the runtime allocates; the live peak is
    the most bytes alive at once, a lower bound no plan can beat.
  }];
}

def ZeroShardingPass : Pass<"ernie-zero-sharding", "ModuleOp"> {
  let summary = "ZeRO: shard optimizer state, gradients and parameters over dp";
  let description = [{
    Runs after `--ernie-autodiff` built `@train_step`, before propagation,
    and says where ZeRO keeps the model state — as placements only; the
    collectives come out of propagation and partition:

    * level 1: every optimizer slot (`ernie.opt_state`: moments, fp32
      master weights) and the result that updates it is split over `axis`
      on its first dimension that divides; gradients are made whole on every
      rank first (an all-reduce), each rank updates its shard, and the new
      parameters, replicated as before, are all-gathered;
    * level 2: as level 1, but gradients are only ever kept as shards
      (Partial -> Shard: a reduce-scatter instead of the all-reduce);
    * level 3: parameters (`ernie.param`) are split too; their uses in the
      forward and backward all-gather them just before use.

    A tensor none of whose dimensions divides stays replicated (with a
    remark). The split goes minor to any axes already on that dimension
    (dp x mp plans keep their mp split).

    ```mlir
    // level 1, dp = 4: {ernie.opt_state = "w:moment1"} on tensor<64x32xf32>
    // gets ernie.sharding = #ernie.sharding<@mesh, [{dp}, {} ]>
    ```
  }];
  let options = [
    Option<"level", "level", "unsigned", "1", "ZeRO level: 1, 2 or 3">,
    Option<"axis", "axis", "std::string", "\"dp\"", "The mesh axis to shard over">,
    Option<"function", "function", "std::string", "\"train_step\"",
           "The training step to shard">,
  ];
  let dependentDialects = ["::mlir::ernie::ErnieDialect"];
}

def SequenceParallelOverlapPass
    : Pass<"ernie-sequence-parallel-overlap", "ModuleOp"> {
  let summary = "Overlap sequence-parallel collectives with their matmuls";
  let description = [{
    Runs after partition. Rewrites the collectives sequence parallelism puts
    around its matmuls into decomposed collective matmuls (Wang et al.,
    "Overlap communication with dependent computation via decomposition";
    ERNIE's `all_gather_gemm` / `gemm_reduce_scatter`), forward and backward
    alike:

    * `all_gather` along a row dimension of a matmul's left operand: the
      `n` pieces travel around the ring (`collective_permute_start` shift 1
      / `wait`), and each piece's GEMM runs while the next one moves; the
      products land in place with `shard_insert`. Several matmuls of one
      gathered value share the ring, and a user that needs the gathered
      value itself (a weight gradient contracting over the sequence) gets
      it assembled from the same pieces.
    * a matmul (or a sum of matmuls, each read only by the sum: the data
      gradient of a value several projections read) whose only user is a
      sum `reduce_scatter` along one of its row dimensions: each rank
      computes its partial product for one
      destination at a time and sends it there (`shift = k` at step `k`)
      while it computes the next; the received partials are summed in rank
      order, the order `reduce_scatter` itself sums in, so the result is
      bitwise that of the original.

    Pairs whose matmul reads the gathered dimension as its contraction, or
    whose weight is not yet available where the collective stands, are left
    alone.

    ```mlir
    // before (mp = 2)
    %g = ernie.all_gather %x over @mesh[mp] dim = 1 : tensor<2x4x8xf32> -> tensor<2x8x8xf32>
    %y = ernie.matmul %g, %w : tensor<2x8x8xf32>, tensor<8x16xf32> -> tensor<2x8x16xf32>
    // after
    %f = ernie.collective_permute_start %x over @mesh[mp] shift = 1 : tensor<2x4x8xf32>
    %p0 = ernie.matmul %x, %w : ...
    %y0 = ernie.shard_insert %p0 into %init over @mesh[mp] dim = 1 : ...
    %x1 = ernie.wait %f : tensor<2x4x8xf32>
    %p1 = ernie.matmul %x1, %w : ...
    %y = ernie.shard_insert %p1 into %y0 over @mesh[mp] dim = 1 shift = -1 : ...
    ```
  }];
  let dependentDialects = ["::mlir::ernie::ErnieDialect"];
}

def Fp8LoweringPass : Pass<"ernie-fp8-lowering", "ModuleOp"> {
  let summary = "Run the linear layers' GEMMs in FP8";
  let description = [{
    Runs after `--ernie-autodiff`, before propagation, so the scale
    reductions shard like every other reduction (a per-tensor amax of a
    split tensor becomes a pending max that partition all-reduces: every
    rank uses one scale). The GEMMs of a linear layer — the forward `x @ W`,
    the data gradient `dy @ W^T` and the weight gradient `x^T @ dy` of every
    parameter `W` whose `ernie.param` name `exclude` does not match — become
    `ernie.scaled_matmul`s of fp8 operands: activations and weights in
    `fwd-format`, gradients in `grad-format`, accumulated in f32, the result
    cast back to the GEMM's type.

    Recipe `current`: per-tensor scaling by this step's amax, `s = fp8_max /
    amax` (1 for an all-zero or infinite tensor, at most FLT_MAX), codes =
    the saturating round-to-nearest-even of `x * s`, the GEMM scaled by the
    two `1 / s` — the conventions of `ernie.fp8.quantize`. Each tensor is
    quantised once (a reshaped one before its reshape), so a weight
    gradient reads the forward's fp8 input.

    Recipe `delayed` (Transformer Engine's default): in the gradient
    function, each quantised tensor's scale comes from an amax history of
    `history-length` earlier steps (its max, or the most recent), divided
    by `2^margin`; this step's amax enters the history at the front. The
    histories are new arguments (`ernie.opt_state = "<param>:fp8_amax.
    input|weight|output_grad"`, zeros at the start: scale 1 on the first
    step) that the training step carries like optimizer state; functions
    without gradients scale by the current amax.

    Recipe `blockwise` (DeepSeek-V3, ERNIE 4.5): one scale per tile — 1 x
    `block-size` along the contraction as the GEMM reads an activation or
    gradient (`block-size` x 1 for a transposed read: the weight gradient
    quantises its operands along the tokens), `block-size` squares for
    weights — and the GEMM multiplies the dequantised tiles in f32. A
    dimension the tiles do not divide is an error at the GEMM.

    ```
    ernie-opt m.mlir --ernie-autodiff=optimizer=adamw "--ernie-fp8-lowering=recipe=current" --ernie-auto-parallel-pipeline
    ```
  }];
  let options = [
    Option<"recipe", "recipe", "std::string", "\"current\"",
           "Scaling recipe: current (delayed, blockwise: not yet)">,
    Option<"fwdFormat", "fwd-format", "std::string", "\"e4m3\"",
           "Format of activations and weights: e4m3 or e5m2">,
    Option<"gradFormat", "grad-format", "std::string", "\"e5m2\"",
           "Format of gradients: e4m3 or e5m2">,
    Option<"exclude", "exclude", "std::string",
           "\"(^|.*\\\\.)(embed|embed_tokens|lm_head|router)(\\\\..*)?$\"",
           "Parameters (regex on the ernie.param name) whose GEMMs stay as they are">,
    Option<"include", "include", "std::string", "\".*\"",
           "Parameters (regex) whose GEMMs run in fp8; each must be read by matmuls only">,
    Option<"historyLength", "history-length", "unsigned", "16",
           "delayed: steps of amax history">,
    Option<"margin", "margin", "unsigned", "0",
           "delayed: the scale is divided by 2^margin">,
    Option<"amaxCompute", "amax-compute", "std::string", "\"max\"",
           "delayed: max over the history, or most_recent">,
    Option<"blockSize", "block-size", "unsigned", "128",
           "blockwise: tile length along the contraction; weights use squares">,
    Option<"pow2Scale", "pow2-scale", "bool", "false",
           "Round every scale down to a power of two (exact dequantisation)">,
  ];
  let dependentDialects = ["::mlir::ernie::ErnieDialect"];
}

def RecomputePass : Pass<"ernie-recompute", "ModuleOp"> {
  let summary = "Recompute forward activations in the backward instead of keeping them";
  let description = [{
    After autodiff (and ZeRO, FP8 lowering), before propagation: in every
    function that returns a loss and computes past it (`@<fn>_grad`), forward
    values the backward reads are recomputed right before their first
    backward reader instead of living from the forward to the backward. The
    forward is what runs up to the loss, the backward what follows it.

    - `mode=full` (Megatron's full recomputation): each layer — the ops
      carrying one `ernie.layer` name (Python sets it for the elements of an
      `ernie.nn.LayerList` that `recompute` selects) — keeps only what it
      reads from outside (its input, the parameters) and what leaves it in
      the forward (its output, the next layer's input); everything else its
      backward needs is recomputed from those, once, before the layer's
      backward starts.
    - `mode=selective` (Megatron's selective recomputation): only the
      attention core, the ops whose results have the shape of a softmax that
      lies between two matmuls (scores = q k^T, the mask and scaling,
      softmax, up to probabilities x v) — the [b, heads, s, s] tensors that
      are large and cheap to recompute. Within the ops marked
      `ernie.layer`, or everywhere when nothing is marked. A fused
      `ernie.attention` keeps no such tensor (its backward recomputes the
      scores from q, k, v): there is nothing to do for it.
    - `mode=none` recomputes nothing.

    Every mode removes the `ernie.layer` marks. Copies are marked
    `ernie.recomputed` (so CSE leaves them apart) and keep the original's
    pipeline stage, as backward ops. Results are bit for bit those without
    recomputation: the copies compute the same ops on the same values.
  }];
  let options = [
    Option<"mode", "mode", "std::string", "\"full\"",
           "none, selective (attention core) or full (each marked layer)">,
  ];
}

def PlanReportPass : Pass<"ernie-plan-report", "ModuleOp"> {
  let summary = "Write the per-rank memory and communication of a partitioned program";
  let description = [{
    For every function with a body, after partition: the bytes per rank of
    its arguments by role (parameters, optimizer state, batch inputs), of
    the gradients (`@forward_grad`'s results after the loss), the planned
    arena and live peak (MemoryPlan.h), and the collectives one call runs —
    its callees included — by kind and mesh axes: count and bytes of the
    operands per rank; `padding_bytes`, what unevenly split arguments hold
    beyond their share of the global tensor on an average rank. Written as
    JSON to `file` ("-": stdout). Changes nothing.

    ```
    ernie-opt prog.mlir --ernie-auto-parallel-pipeline "--ernie-plan-report=file=plan.json"
    ```
  }];
  let options = [
    Option<"file", "file", "std::string", "\"-\"", "Where to write the JSON report">,
  ];
}

def StepCostPass : Pass<"ernie-step-cost", "ModuleOp"> {
  let summary = "Write the predicted step time of a partitioned program on a cluster";
  let description = [{
    The cost model (include/ernie/Cost/CostModel.h) over the partitioned,
    scheduled program, on the cluster described by the JSON file `cluster`:
    each instruction's roofline time on the cluster's device, each
    collective's alpha-beta time on the links its group crosses,
    asynchronous transfers overlapping compute, a pipeline's steps through
    the schedule simulator. Written as JSON to `file` ("-": stdout): the
    step time, its compute, recomputation, bubble, processor contention,
    communication and exposed communication per mesh-axis group, and MFU.
    Changes nothing. A cluster file that cannot be read, or names a bad
    field, is an error naming the file and the field.

    ```
    ernie-opt prog.mlir --ernie-auto-parallel-pipeline "--ernie-step-cost=cluster=dgx_h100.json"
    ```
  }];
  let options = [
    Option<"cluster", "cluster", "std::string", "\"\"", "The cluster description (JSON)">,
    Option<"file", "file", "std::string", "\"-\"", "Where to write the JSON estimate">,
  ];
}

def BucketGradientsPass : Pass<"ernie-bucket-gradients", "ModuleOp"> {
  let summary = "Data-parallel gradients and ZeRO's gathers in buckets, overlapped";
  let description = [{
    After partition: the all-reduces and reduce-scatters (sum or mean)
    whose results only a function's return reads, as results marked
    gradients (`ernie.grad_of`, `ernie.gradient`) — the data-parallel and
    ZeRO-2/3 gradient reductions partition leaves at the end of the
    backward — and the all-gathers whose results only the return reads
    (ZeRO-1/2's gathers of the updated parameters) are grouped by
    collective, mesh, axes, kind, dimension and element type, in the order
    their inputs are computed, into buckets of at least `bucket-bytes` of
    whole tensors (the last one smaller). Each bucket becomes one
    `ernie.all_reduce_start`, `ernie.reduce_scatter_start` or
    `ernie.all_gather_start` right after its last input is computed, so
    the communication thread moves it while the rest of the step runs,
    and one `ernie.wait` per tensor before the return. With
    `accumulate=f32` (the default) bf16 and f16 gradients are reduced in
    f32 and rounded once (Megatron's f32 main gradients); `native` reduces
    them in their own type. f32 results are bit for bit the unbucketed
    ones: every element is summed over the group in the same order.

    ```
    ernie-opt step.mlir --ernie-auto-parallel-pipeline "--ernie-bucket-gradients=bucket-bytes=26214400"
    ```
  }];
  let options = [
    Option<"bucketBytes", "bucket-bytes", "int64_t", "26214400",
           "Bytes of gradients per bucket (DDP's default: 25 MiB)">,
    Option<"accumulate", "accumulate", "std::string", "\"f32\"",
           "f32 (narrow float gradients reduced in f32) or native">,
  ];
}

def FusePass : Pass<"ernie-fuse", "ModuleOp"> {
  let summary = "Group elementwise chains into loops the runtime runs once";
  let description = [{
    Groups each function's chains of elementwise ops, the broadcasts of their
    inputs, fills, and the reductions that end them into `ernie.fused`
    regions (see the op): the runtime runs a region as one loop over its
    iteration shape, reading each input and writing each result once, so the
    intermediates need no buffers and the memory plan shrinks. Runs last,
    after partition and the pipeline schedule, on per-rank programs: a region
    never spans a collective, a wait or a send/receive (each closes every
    open region), and never mixes f64 with narrower floats. A region of one
    op is left as it was.

    Ops join greedily in program order: an op joins the open regions its
    operands come from when they share its iteration shape, merging them;
    a region closes once an op outside it reads one of its values (later
    members would have to move past that reader) or a reduction's result.
    The region is placed where its last member was.

    Results are bit for bit those of the unfused program where every value
    is f32 or f64. Narrower floats (bf16, f16, fp8) inside a region stay in
    f32 and round once where the region writes them, as a fused kernel on a
    GPU does: a chain of bf16 ops differs from its unfused form (which
    rounds after every op) by those roundings.
  }];
}

def PrintShardingRulesPass : Pass<"ernie-print-sharding-rules"> {
  let summary = "Report every op's sharding rule as a remark";
  let description = [{
    For inspection and tests: each op with a ShardingRuleOpInterface gets a
    remark with its factor map in einsum-like form, factors named i, j, k...:

    ```
    remark: sharding rule ([i, k], [k, j]) -> ([i, j]) k:reduction(sum)
    ```
    A dimension made of several factors lists them major to minor (`ij`);
    a size-1 dimension has none (`_`). Factors not marked are parallel.
  }];
}

def PipelineSplitPass : Pass<"ernie-pipeline-split", "ModuleOp"> {
  let summary = "assign every op of the loss function to a pipeline stage";
  let description = [{
    Runs on the traced loss function, before `--ernie-autodiff`. Each
    `ernie.split_point` starts the next virtual stage: an op's stage is the
    largest stage among its operands (arguments count as stage 0), and a
    marker's result is one stage past its operand. The pass writes
    `ernie.stage` on every op that reads an argument or a staged value
    (constant expressions stay unstaged: each stage that needs one builds
    it), removes the markers, lists on every parameter the virtual stages
    using it (`ernie.pipeline_stages`, added to any a frontend declared) and
    records `ernie.pipeline = {stages, virtual_stages, axis}` on the module.
    Autodiff then gives every gradient op its forward op's stage.

    Chunk `c` of the `stages * virtual-stages` chunks runs on the pipeline
    rank (coordinate along `axis`) `c mod stages`. Errors: the markers make
    more or fewer chunks than that, a chunk with no op, a loss not computed
    on the last chunk, a mesh without `axis` of size `stages`.

    ```mlir
    %h1 = ernie.split_point %h : tensor<4x16x64xf32>
    // becomes: every op computed from %h carries {ernie.stage = 1}
    ```
  }];
  let options = [
    Option<"stages", "stages", "int64_t", "2", "Pipeline ranks (the axis size)">,
    Option<"virtualStages", "virtual-stages", "int64_t", "1",
           "Model chunks per pipeline rank (interleaving)">,
    Option<"axis", "axis", "std::string", "\"pp\"", "The mesh axis of the stages">,
    Option<"function", "function", "std::string", "\"forward\"",
           "The loss function to split">,
  ];
  let dependentDialects = ["::mlir::ernie::ErnieDialect"];
}

def SharedWeightDedupPass : Pass<"ernie-shared-weight-dedup", "ModuleOp"> {
  let summary = "one replica per pipeline stage of a parameter several stages use";
  let description = [{
    Runs after `--ernie-pipeline-split`, before `--ernie-autodiff`. A
    parameter whose virtual stages live on more than one pipeline rank (a
    tied embedding and LM head; every attribute of a shared layer) becomes
    one argument per rank, each with the parameter's name,
    `ernie.pipeline_rank` and the sorted group `ernie.shared_stages`; each
    op reads its own rank's replica. Autodiff then computes each replica's
    gradient on its own stage (zeros on a stage that holds it but does not
    use it) and the training step sums them with `ernie.stage_all_reduce`
    over the group before the update, so every replica takes the same step.
    `--ernie-pipeline-schedule` starts the replicas equal with an
    `ernie.stage_broadcast` from the group's first stage. Every parameter
    gets its rank. Forward-only functions hold no such sum.
  }];
  let options = [
    Option<"function", "function", "std::string", "\"forward\"",
           "The loss function whose parameters to place">,
  ];
  let dependentDialects = ["::mlir::ernie::ErnieDialect"];
}

def PipelineSchedulePass : Pass<"ernie-pipeline-schedule", "ModuleOp"> {
  let summary = "stage functions, sends and receives, and each rank's step order";
  let description = [{
    Runs after partition. Splits `@train_step` (with its gradient inlined)
    into, per chunk `c`, `@train_forward.c` and `@train_backward.c`, and per
    pipeline rank `s` `@train_update.s` (and `@init.s` for shared
    parameters); `@eval_step` into `@eval_forward.c`. A value read on
    another chunk is sent (`ernie.send`) and received (`ernie.recv`); a
    forward value the backward reads is a residual (`ernie.residual`); a
    gradient the update reads is summed over micro-batches by the runtime
    (`ernie.gradient`) and divided by their count in the update. A
    gradient's trailing sum collectives (all-reduce, reduce-scatter over
    data parallelism) move to the update: they run once per step, not once
    per micro-batch; a narrow (bf16) gradient's sum there adds the f32
    means the runtime accumulated (`grad-reduce=f32`, the default; `native`
    adds them narrowed), and one whose shard alone the update reads
    (ZeRO-1) is a reduce-scatter. With `accumulate=gemm` (the default) or
    `add` each backward takes the running sums of its gradients
    (`ernie.gradient` arguments named as its results) and returns them with
    its micro-batch added, under `gemm` a weight gradient's GEMM adding
    into the f32 sum itself (`matmul_accumulate`). The schedule (`FThenB`, `1F1B`, `interleaved`, or
    `custom`: the module's own `ernie.pipeline_schedule`) is built, checked
    for deadlocks by simulating every rank, and recorded on the module.
  }];
  let options = [
    Option<"microBatches", "micro-batches", "int64_t", "1",
           "Micro-batches per step (gradient accumulation)">,
    Option<"schedule", "schedule", "std::string", "\"1F1B\"",
           "FThenB, 1F1B, interleaved or custom">,
    Option<"gradReduce", "grad-reduce", "std::string", "\"f32\"",
           "f32: a narrow gradient's data-parallel sum in the update adds "
           "the f32 micro-batch means (Megatron's main grads); native: the "
           "narrowed ones">,
    Option<"accumulate", "accumulate", "std::string", "\"gemm\"",
           "gemm: each backward adds its gradients into the running sums "
           "it takes, a weight gradient's GEMM directly (matmul_accumulate: "
           "Megatron's gradient accumulation fusion); add: by adds after "
           "the GEMMs (Megatron without it); runtime: the runtime adds the "
           "gradients each backward returns">,
  ];
  let dependentDialects = ["::mlir::ernie::ErnieDialect",
                           "::mlir::func::FuncDialect"];
}

#endif // ERNIE_PASSES_PASSES_TD

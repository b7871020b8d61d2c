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
    through the ernie interfaces, so they accept only programs that keep the
    contract below. Every ernie pipeline runs this check first: it reports
    every violation at its location, changes nothing, and fails if it found
    any.

    * Ops: any `ernie` op, `builtin.module`, `func.func`, `func.return`,
      `func.call` and `arith.constant`. Anything else is `'<op>' op is not
      part of an ernie program`.
    * Types: every block argument, op result and declaration signature is a
      ranked tensor of static shape (whose bytes the runtime can address) or
      a scalar, of an ernie element type: f64, f32, f16, bf16, f8E4M3FN,
      f8E5M2, i64, i32 or i1.
    * Parameters: within one function an `ernie.param` name names one
      argument (after `--ernie-shared-weight-dedup`, one per
      `ernie.pipeline_rank`); a duplicate is an error that suggests
      `ernie.tied`.

    ```mlir
    // error: block argument #0 has type 'tensor<?x4xf32>'; ernie programs need
    //        statically shaped ernie tensors or scalars
    func.func @dynamic(%x: tensor<?x4xf32>) { return }

    // error: parameter 'w' names arguments #0 and #1; tie shared weights with
    //        'ernie.tied' instead
    func.func @dup(%a: tensor<4xf32> {ernie.param = "w"},
                   %b: tensor<4xf32> {ernie.param = "w"}) { return }
    ```
  }];
  let dependentDialects = ["::mlir::ernie::ErnieDialect"];
}

def AutodiffPass : Pass<"ernie-autodiff", "ModuleOp"> {
  let summary = "Build the gradient of a loss function by reverse-mode AD";
  let description = [{
    For the function named by `function` (default `forward`), adds
    `@<function>_grad` with the same arguments, returning the loss (marked
    `ernie.loss`) followed by one gradient per `ernie.param` argument, in
    argument order, each marked `ernie.grad_of = "<param name>"`. Calls are
    inlined first, so AD sees the whole computation, and mean cross-entropy
    losses are written as sum / count (`--ernie-expand-mean-loss`), so their
    gradients shard over the batch like the loss does.

    The ops fed by a parameter and feeding the loss are walked backwards,
    each contributing its vector-Jacobian product through
    GradientOpInterface; gradients of a value used several times add up;
    integer values and `stop_gradient` results take none. A parameter the
    loss does not reach gets an explicit zero gradient, so every rank later
    joins the same collectives. Gradient ops have no rules: no second
    derivatives.

    Autodiff runs before sharding: gradients are values like any other, and
    the gradient of a replicated weight used under a batch split comes out of
    propagation as a pending sum over the batch axis, which partition
    completes with an all-reduce; data-parallel gradient synchronisation
    needs no pass of its own. The gradient of a parameter with an
    `ernie.sharding` is constrained to that layout at priority 1, weaker than
    the plan, so a pending sum is all-reduced into it rather than the
    activations gathered.

    With `optimizer=sgd|adamw` it also adds the training and evaluation steps:

    ```
    @train_step(params..., opt_state..., state..., batch...,
                lr: tensor<f32> {ernie.learning_rate}, step: tensor<i64> {ernie.step})
        -> (loss, params'..., opt_state'..., state'...)
    @eval_step(params..., state..., batch...) -> loss   // no backward, no update
    ```
    The step calls `@<function>_grad`, clips the gradients to the global L2
    norm `clip-norm` when it is positive, and applies `ernie.sgd_update`
    (`momentum`, `weight-decay`) or `ernie.adamw_update` (`beta1`, `beta2`,
    `epsilon`, decoupled `weight-decay`) per parameter. Its slots
    (`momentum`; `moment1`, `moment2`) are arguments marked
    `ernie.opt_state = "<param>:<slot>"`, laid out like their parameter;
    updated results are marked `ernie.updates = "<param>"` or
    `"<param>:<slot>"`. With `multi-precision`, parameters narrower than f32
    keep an f32 `master` slot (Paddle's `multi_precision`): the update runs on
    the master and the parameter is its rounding. A `loss-scale` other than 1
    seeds the backward with that value and divides every gradient by it
    before it is returned.

    With `grad-norm`, `@train_step` also returns the gradients' global L2
    norm before clipping (f32, computed once when clipping needs it too) as
    its last result, marked `ernie.metric = "grad_norm"`; in a pipeline it
    is computed where clipping computes it, on the last rank that holds a
    parameter.

    Results of the loss function after the loss must each update a state
    argument (`ernie.updates` naming an `ernie.opt_state` argument of the same
    type): state a rule of the forward updates, not the optimizer (MoE's
    aux-free routing bias). It is not differentiated; the step carries it.

    In a pipelined module (`--ernie-pipeline-split` ran), every op a forward
    op's rule builds gets that op's `ernie.stage` and `ernie.backward`, and
    the step's ops their parameter's `ernie.pipeline_rank`; global-norm
    clipping adds the ranks' partial sums in rank order, counting a shared
    parameter once, and a shared parameter's replica gradients are summed
    with `ernie.stage_all_reduce` before the update.

    Errors: no function `function`; a declaration or a function of several
    blocks; a first result that is not a scalar float tensor; a parameter
    that is not a float tensor; an op without a gradient rule between a
    parameter and the loss (named at the op); an unknown optimizer; a
    `momentum`, `beta1` or `beta2` outside [0, 1), a negative or non-finite
    `weight-decay`, `epsilon` or `clip-norm`, a `loss-scale` that is not
    positive; a module that already has `@<function>_grad`, `@train_step` or
    `@eval_step`.

    Defaults: `optimizer=none`, `momentum=0`, `weight-decay=0`, `beta1=0.9`,
    `beta2=0.999`, `epsilon=1e-8`, `clip-norm=0` (off),
    `multi-precision=false`, `grad-norm=false`, `loss-scale=1`.
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
    Option<"gradNorm", "grad-norm", "bool", /*default=*/"false",
           "Return the gradients' global L2 norm (before clipping) as the "
           "step's metric \"grad_norm\"">,
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
    not ignored, a global count: its sharding rule keeps the token dimensions
    whole. Written as `cross_entropy(sum) / count(labels != ignore_index)`
    both parts are sums, so a data-parallel batch split leaves two pending
    sums that one scalar all-reduce each completes, and the result is exactly
    the single-device mean. The new ops keep the loss's `ernie.stage`. The
    auto-parallel pipeline runs this before propagation, and
    `--ernie-autodiff` before differentiating.

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
    arguments and results, `ernie.shardings` already on ops,
    `ernie.sharding_constraint` results (with their `priority`, 0 strongest)
    and `ernie.reshard` results — and spreads them through every op's
    sharding rule (`ShardingRuleOpInterface`), forwards and backwards, across
    functions and calls, to a fixed point. Annotations are honoured priority
    level by level: everything the strongest imply is settled before weaker
    ones speak. The levels are walked twice: in the first round an op gives
    an open value only a sharding it fully determines (every factor of the
    value appears in a tensor of the op that has one, or cannot be split),
    so a replicated weight cannot declare the activations it meets unsplit
    before their own constraints are heard; in the second the projection
    fills in the rest. What a
    caller or a function's own result layout wants of a returned value (ZeRO's
    split gradients) binds only after that, where the function left it open,
    so a gradient pending a sum is reduced at the return rather than its
    operands gathered.

    For each op the choice of factor axes is seeded in turn by each operand or
    result that already has a sharding (a dimension that is one factor takes
    all of its axes, dividing or not: an uneven split); the choice whose
    reshards cost least wins, ties to the earliest within 1e-9. A tensor not
    yet known is charged the gather from the best layout another choice would
    give it. A minor factor of a dimension keeps its axes only when every
    more major factor is fully split (no strided pieces). Without `cluster` a
    collective costs the bytes one rank sends; with `cluster` (a JSON cluster
    file) its time on that cluster, the cost model's alpha-beta formula the
    step estimate uses (each hop's link latency plus bytes over the bandwidth
    of the links its group spans), so latency counts and a slow inter-node
    axis is avoided.

    Partial (pending-sum) values are completed before an op reads them, except
    by an `add` of operands pending the same sum. A pending sum whose one
    reader is the return or a constraint (a weight gradient) is made in the
    wanted layout directly, its operands resharded, only when that moves at
    least 4x less and computes no more per rank (a sequence-parallel
    embedding's table gradient: an all-to-all of the output gradient instead
    of a reduce-scatter of the whole table); otherwise it stays pending and is
    reduced where read.

    Only with `cluster`: an op none of whose tensors is split or pending over
    an axis (other than the pipeline's) computes the same on every rank of
    it; it is split along one of its factors when the compute this saves
    (FLOPs-bound work only) exceeds 4x everything the divided op moves. A
    replicated LM head's GEMMs are the case for it. Without a cluster nothing
    is divided. Choices are greedy, per op.

    Afterwards every op carries `ernie.shardings` (one per result), every
    tensor argument and result of a function carries `ernie.sharding` (a
    returned value without pending axes), and wherever a value's sharding
    differs from what its user needs an `ernie.reshard` says so explicitly:
    partition turns those into collectives. Where a use wants what the
    producer's rule cannot make, the op produces what its rule allows and a
    reshard follows. Constraints become reshards (or vanish when already
    met). Values left unconstrained are replicated. A module without a mesh
    is left as it is.

    Errors: a sharding naming another mesh than the module's (one mesh per
    module); a `cluster` file that cannot be read or names a bad field; a
    mesh with more ranks than the cluster has devices.

    ```mlir
    ernie.mesh @mesh(dp = 2, mp = 4)
    func.func @megatron_mlp(%x: tensor<8x16xf32> {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {} ]>},
                            %w1: tensor<16x64xf32> {ernie.sharding = #ernie.sharding<@mesh, [{}, {mp} ]>},
                            %w2: tensor<64x16xf32> {ernie.sharding = #ernie.sharding<@mesh, [{mp}, {} ]>})
        -> tensor<8x16xf32> {
      %h = ernie.matmul %x, %w1 : tensor<8x16xf32>, tensor<16x64xf32> -> tensor<8x64xf32>
      %g = ernie.gelu %h : tensor<8x64xf32>
      %y = ernie.matmul %g, %w2 : tensor<8x64xf32>, tensor<64x16xf32> -> tensor<8x16xf32>
      %z = ernie.add %y, %x : tensor<8x16xf32>
      return %z : tensor<8x16xf32>
    }
    // after: %h and %g are [{dp}, {mp} ], %y is [{dp}, {} ] partial = {mp = sum},
    // and %r = ernie.reshard %y <@mesh, [{dp}, {} ]> feeds the add: the one all-reduce.
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
    `--ernie-sharding-propagation`) and makes it the program each rank runs:

    * Types: every type becomes one rank's piece. Function arguments and
      results keep the global layout they are a piece of as `ernie.shard_of`;
      op shardings are dropped.
    * Reshards: every `ernie.reshard` becomes the cheapest sequence of
      single-axis steps — `all_reduce`, `reduce_scatter`, `all_gather`,
      `all_to_all` and the local `shard_slice` and `partial_init` — found by a
      shortest-path search over intermediate shardings, exhaustive since the
      states are few, weighted by bytes or, with `cluster`, by time on that
      cluster, as propagation weighed them. Collectives name mesh axes, not
      ranks: the program is the same for every rank and its size does not
      depend on the mesh.
    * Ops whose local form differs are expanded: a vocabulary-split
      `embedding` looks up the rows this rank owns (`axis_index`, shifted ids,
      a mask) and zeroes the rest; a vocabulary-split `cross_entropy` or
      `cross_entropy_grad` becomes Megatron's vocab-parallel loss (a max and a
      sum all-reduce complete the log-sum-exp; bf16 logits widened to f32); a
      sharded constant is built whole and sliced.
    * Uneven splits are padded: padding before a scatter, a slice after a
      gather; padding of a dimension an op reduces holds the reduction's
      identity (zero for a sum or contraction, -inf for a max), a
      `reduce_mean` is rescaled, padded vocabulary columns are -inf and padded
      token positions `ignore_index`; padded arguments carry
      `ernie.global_shape`.
    * Regather in the backward: in a function that computes a loss, a value
      all-gathered before the loss and read again after it (a weight gradient
      reading a column-parallel matmul's gathered input; a ZeRO-3 parameter)
      is gathered again before its first backward reader, so the forward
      keeps only the 1/n piece (Megatron's sequence parallelism, ZeRO-3) —
      only where the step computes at least the gathered bytes in between.
    * A gather of a reshaped value reuses the gather of the value when the
      reshape keeps the gathered dimension whole and all readers sit on one
      pipeline stage and one side of the loss.

    Canonicalization after partition moves a rank's piece towards its root
    (`shard_slice` of an elementwise op becomes the op of `shard_slice`s,
    `shard_slice(all_reduce(x))` a `reduce_scatter`, and the all-reduce of a
    narrowed reduction runs before the narrowing cast); the auto-parallel
    pipeline runs it.

    Refused, at the op: a result without a sharding (propagation did not
    run); more than one mesh; a function of several blocks or an op with
    regions; a split that does not divide on a mesh marked
    `ernie.even_splits`; a blockwise-fp8 tile (`ernie.fp8_tile`) that
    straddles shards, with the block sizes that would fit. A module without a
    mesh is left as it is.

    ```mlir
    // before (mesh dp = 2, mp = 4): %y is [{dp}, {} ] partial = {mp = sum}
    %r = ernie.reshard %y <@mesh, [{dp}, {} ]> : tensor<8x16xf32>
    // after: local types, one collective
    %r = ernie.all_reduce %y over @mesh[mp] sum : tensor<4x16xf32>
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
    Runs the memory planner the program file writer and the plan report use
    (`planMemory`, include/ernie/Export/MemoryPlan.h) on every function with
    a body and records the plan for inspection: on the function
    `ernie.arena_bytes`, `ernie.argument_bytes`, `ernie.live_peak_bytes` and,
    when it returns a loss, `ernie.activation_bytes` (what is live just after
    the loss, arguments aside: what the forward keeps for the backward); the
    offset of every argument (`ernie.buffer_offset`) and of every op result
    (`ernie.buffer_offsets`, one per result). Each function also gets a
    remark:

    ```
    remark: memory plan: arena 64 bytes per rank (arguments 128 beside it), live peak 64, 3 buffers, 2 written in place
    ```
    The arena is the per-rank peak the runtime allocates; the live peak is
    the most bytes alive at once, a bound no plan can beat. The plan:

    * a value lives from its definition to its last use (returned values to
      the end); fills (`full`, `iota`, `axis_index`) are first copied before
      each reader, so a constant the backward reads holds no memory from the
      top of the function;
    * a result takes the buffer of an operand that dies at it for elementwise
      ops of the operand's exact type, `matmul_accumulate`'s accumulator,
      `shard_insert`'s destination, a fused loop's inputs and the optimizer
      updates' parameter and state; over an argument, only a result the
      function returns (or anything, over a pipeline's `ernie.gradient`
      running sum, which the call consumes);
    * a reshape's result is a view at its operand's offset: the kernel moves
      nothing;
    * arguments are not in the arena: they get offsets in a region after it
      (`argument_bytes`) that the runtime binds to the tensors it holds;
    * an asynchronous collective's input stays alive until its wait;
    * buffers are placed largest first, each at the lowest aligned offset
      free for its whole lifetime.
  }];
}

def ZeroShardingPass : Pass<"ernie-zero-sharding", "ModuleOp"> {
  let summary = "ZeRO: shard optimizer state, gradients and parameters over dp";
  let description = [{
    Runs after `--ernie-autodiff` built the training step (`function`,
    default `train_step`), before propagation, and says where ZeRO at
    `level` (default 1) keeps the model state over `axis` (default `dp`) —
    as placements only; the collectives come out of propagation and
    partition:

    * every level: each optimizer slot (`ernie.opt_state`: moments, fp32
      master weights) and the result that updates it gets `axis` added, minor
      to any axes already there, to the first dimension it divides, starting
      from its parameter's layout (a dp x mp plan keeps its mp split). When
      no dimension divides, the largest dimension is split unevenly — unless
      the mesh is marked `ernie.even_splits`: then the slot stays replicated,
      with a remark;
    * level 1: the gradients the step's call returns are constrained whole
      over `axis` (an all-reduce); each rank updates its shard and the new
      parameters, replicated as before, are all-gathered;
    * level 2: the gradient function returns each gradient split like its
      slots (a reduce-scatter instead of the all-reduce, or an all-to-all of
      activations where that is cheaper);
    * level 3: parameters (`ernie.param`) are split too; their uses in the
      forward and backward all-gather them just before use (regathered in
      the backward by partition, prefetched by `--ernie-bucket-gradients`).

    Below level 3 every parameter gets its current layout as an explicit
    `ernie.sharding` (left open, the update would hand it its slots' split).
    Other public functions taking the parameters (`@eval_step`) take them as
    the step keeps them: the runtime stores one layout per state.

    Errors: a level other than 1, 2 or 3; no function `function` (run
    `--ernie-autodiff` with an optimizer first); not exactly one mesh; a mesh
    without `axis`.

    ```mlir
    // level 1, mesh (dp = 2, mp = 2), w laid out [{}, {mp} ] on tensor<16x8xf32>:
    //   {ernie.opt_state = "w:moment1"} gets
    //   ernie.sharding = #ernie.sharding<@mesh, [{dp}, {mp} ]>
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

    * `all_gather` along a row dimension (a batch dimension or `m`) of a
      matmul's left operand: the `n` pieces travel around the ring
      (`collective_permute_start` shift 1, then `wait`), and each piece's GEMM
      runs while the next one moves; the products land in place with
      `shard_insert`. Several matmuls of one gathered value share the ring,
      and a user that needs the gathered value itself (a weight gradient
      contracting over the sequence) gets it assembled from the same pieces.
    * a matmul (or a sum of matmuls, each read only by the sum: the data
      gradient of a value q, k and v projections read) whose only user is a
      sum `reduce_scatter` along one of its row dimensions: at step `k` each
      rank computes its partial product for member `i + k` and sends it there
      (`shift = k`) while it computes the next, its own partial last, under
      the last transfer. The received partials are summed in rank order, the
      order `reduce_scatter` itself sums in, so the result is bitwise that of
      the original.

    Left alone: a matmul that contracts the gathered dimension (or reads its
    left operand transposed), a batch-dimension split whose weight is batched
    too (it would need slicing), and a weight not yet defined where the ring
    would start. The runtime runs the transfers on its communication thread.

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
    Runs after `--ernie-autodiff` (and ZeRO), before recomputation and
    propagation, so the scale reductions shard like every other reduction (a
    per-tensor amax of a split tensor becomes a pending max that partition
    all-reduces: every rank uses one scale).

    Which GEMMs: those of every parameter `W` whose `ernie.param` name
    `include` matches (default: all) and `exclude` does not (default: the
    embedding, LM head and router) and that only matmuls read as their right
    operand. With the default `include`, a parameter something else reads is
    skipped; an explicit `include` of it is an error at the reading op. For
    each: the forward `x @ W` (both operands in `fwd-format`, default e4m3),
    the data gradient `dy @ W^T` (the gradient in `grad-format`, default
    e5m2), and the weight gradient, the matmuls `W`'s `ernie.grad_of` result
    is made of. They become `ernie.scaled_matmul`s of fp8 operands,
    accumulated in f32, the result cast back to the GEMM's type. A MoE
    layer's expert GEMMs (`expert_matmul`, `expert_weight_grad`) are
    selected the same way; having no scaled form yet, they multiply the
    dequantised fp8 codes in f32: fp8's rounding, not yet its speed. Each tensor
    is quantised once per function (a reshaped one before its reshape), so
    the weight gradient reads the forward's fp8 input.

    Recipe `current` (the default): per-tensor scaling by this step's amax,
    written in ordinary ops — `abs`, `reduce_max`, `s = fp8_max / amax` (1 for
    an all-zero or infinite amax, at most FLT_MAX), codes = the saturating
    round-to-nearest-even cast of `x * s`, the GEMM scaled by the two `1 / s`
    — the conventions of `ernie.fp8.quantize`.

    Recipe `delayed` (Transformer Engine's default): in the gradient function,
    each quantised tensor's scale comes from an amax history of
    `history-length` (16) earlier steps — its max, or with
    `amax-compute=most_recent` its latest entry — divided by `2^margin`
    (`margin` 0); this step's amax enters the history at the front. The
    histories are new arguments, zeros at the start (scale 1 on the first
    step), marked
    `ernie.opt_state = "<param>:fp8_amax.input|weight|output_grad"` and
    returned as `ernie.updates`, that the training step carries like
    optimizer state; a pipeline updates them once per step with the batch's
    amax. Functions without gradients scale by the current amax.

    Recipe `blockwise` (DeepSeek-V3, ERNIE 4.5): one scale per tile — 1 x
    `block-size` (128) along the contraction as the GEMM reads an activation
    or gradient (`block-size` x 1 for a transposed read: the weight gradient
    quantises its operands along the tokens), `block-size` squares for
    weights — through a reshape to `[..., rows/r, r, cols/c, c]` marked
    `ernie.fp8_tile`; the GEMM is an f32 `matmul` of the dequantised tiles.
    The backward starts from the forward's codes (re-tiled): only codes and
    scales live across. A dimension the tiles do not divide is an error at the
    GEMM; a split whose shard the tiles do not divide is an error in
    partition, naming block sizes that fit.

    `pow2-scale` rounds every scale down to a power of two (exact
    dequantisation). Errors also name an unknown recipe, format or
    `amax-compute`, a `block-size` or `history-length` below 1, and an
    `include` or `exclude` that is not a regex.

    ```
    ernie-opt m.mlir --ernie-autodiff=optimizer=adamw "--ernie-fp8-lowering=recipe=delayed" --ernie-auto-parallel-pipeline
    ```
  }];
  let options = [
    Option<"recipe", "recipe", "std::string", "\"current\"",
           "Scaling recipe: current, delayed or blockwise">,
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
    forward is what runs up to the loss, the backward what follows it. A
    *unit* is a set of forward ops; of the values of a unit the backward
    reads, those that do not leave the unit in the forward are made again by
    copies of their ops, placed before the first backward reader. What the
    copies read from outside the unit stays live; broadcasts and fills they
    read are copied too, even from outside the unit (a causal mask broadcast
    to [b, heads, s, s] would otherwise live through the backward).

    - `mode=full` (the default; Megatron's full recomputation): a unit is a
      layer, the ops carrying one `ernie.layer` name (Python sets it on the
      ops of each `ernie.nn.LayerList` element `recompute` selects). It keeps
      only what it reads from outside (its input, the parameters) and what
      leaves it in the forward (its output, the next layer's input). A
      function with no marked forward op is an error.
    - `mode=selective` (Megatron's selective recomputation): a unit is an
      attention core, the ops of a softmax's shape between the matmul that
      feeds it and the matmul that reads it (scores = q k^T, the mask and
      scaling, softmax, up to probabilities x v) — the [b, heads, s, s]
      tensors that are large and cheap to recompute. Within the ops marked
      `ernie.layer`, or everywhere when nothing is marked. A fused
      `ernie.attention` keeps no such tensor (its backward recomputes the
      scores from q, k, v): there is nothing to do for it.
    - `mode=none` recomputes nothing.

    Every mode removes the `ernie.layer` marks. Copies are marked
    `ernie.recomputed` (so CSE leaves them apart) and, in a pipeline, keep
    the original's `ernie.stage` and are marked `ernie.backward`. Nothing
    downstream needs to know: the memory plan sees shorter lifetimes. Results
    are bit for bit those without recomputation: the copies compute the same
    ops on the same values. An unknown mode is an error.

    ```mlir
    // mode=full, layers.1 = (matmul %a1, %w2; tanh) in @forward_grad:
    %h2 = ernie.matmul %a1, %w2 {ernie.recomputed} : ...  // before layers.1's backward
    %a2 = ernie.tanh %h2 {ernie.recomputed} : tensor<4x8xf32>
    %d = ernie.mul %g, %a2 : tensor<4x8xf32>               // the backward reads the copy
    ```
  }];
  let options = [
    Option<"mode", "mode", "std::string", "\"full\"",
           "none, selective (attention core) or full (each marked layer)">,
  ];
}

def PlanReportPass : Pass<"ernie-plan-report", "ModuleOp"> {
  let summary = "Write the per-rank memory and communication of a partitioned program";
  let description = [{
    After partition, for every function with a body, the per-rank figures of
    its plan, written as JSON to `file` ("-", the default: stdout). Changes
    nothing. Per function: `parameter_bytes`, `optimizer_state_bytes` and
    `input_bytes` (its arguments by role), `gradient_bytes` (the
    `ernie.grad_of` results), the memory plan's `arena_bytes`,
    `argument_bytes`, `live_peak_bytes` and `activation_bytes` (live at the
    loss, arguments aside: what the forward keeps for the backward),
    `padding_bytes` (what unevenly split arguments hold beyond their share of
    the global tensor, on an average rank), `collectives` (one call's,
    callees included) and `collectives_in_body` by kind and mesh axes (count
    and operand bytes per rank), the pipeline transfers of its body, and the
    ops `--ernie-recompute` copied. Python's `Program.report()` and the plan
    search read this report. A function that cannot be planned, or a `file`
    that cannot be written, is an error.

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
    scheduled program, on the cluster described by the JSON file `cluster`
    (required): each instruction's roofline time on the cluster's device,
    each collective's alpha-beta time on the links its group crosses,
    asynchronous transfers overlapping compute, a pipeline's steps through
    the schedule simulator. Written as JSON to `file` ("-", the default:
    stdout): `step_seconds`, and its `compute_seconds` (with
    `compute_by_op`), `recompute_seconds`, `bubble_seconds`,
    `contention_seconds`, `comm_seconds` and `exposed_comm_seconds` per
    mesh-axis group, `model_flops`, `peak_flops`, `mfu` and `hfu`. Changes
    nothing. Python's `Program.estimate` and `ernie.cost.estimate` call the
    same model. A missing `cluster`, a cluster file that cannot be read or
    names a bad field (the error names the file and the field), or a `file`
    that cannot be written, is an error.

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
    After partition and the pipeline schedule. Partition leaves each
    data-parallel gradient's all-reduce (ZeRO-2/3: its reduce-scatter) at the
    return, after the whole backward, and ZeRO-1/2's gathers of the updated
    parameters at the end of the step: one collective per tensor, none
    overlapped. This pass takes the sum or mean all-reduces and
    reduce-scatters whose results only the return reads as gradients
    (results marked `ernie.grad_of` or `ernie.gradient`, or added there to an
    `ernie.gradient` running sum) and the all-gathers whose results only the
    return reads; groups them by collective, mesh, axes, reduce kind,
    dimension and element type; orders each group by where its inputs are
    computed; and cuts it into buckets of at least `bucket-bytes` of whole
    tensors (the last one smaller). Each bucket becomes one
    `ernie.all_reduce_start`, `ernie.reduce_scatter_start` or
    `ernie.all_gather_start` (one future per tensor) right after its last
    input is computed, so the communication thread moves it while the rest
    of the step runs, and one `ernie.wait` per tensor before its reader.

    ZeRO-3's gathers of parameter shards (arguments) are prefetched the same
    way, in buckets: bucket i starts where bucket i - 1's first tensor is
    needed, so it moves while that bucket's layer computes, at the price of
    up to one bucket of parameters gathered early.

    With `accumulate=f32` (the default) a bucket of gradients narrower than
    f32 carries `accumulate = f32`: it is reduced in f32 and rounded once
    (Megatron's f32 main gradients; the message counts as f32 bytes);
    `native` reduces them in their own type. Results are bit for bit the
    unbucketed ones: every element is summed over the group in the same
    order. A `bucket-bytes` that is not positive or another `accumulate` is
    an error.

    ```mlir
    // bucket-bytes=1024: c (1 KiB) fills a bucket alone; a and b (512 B each) share one
    %c = ernie.exp %z : tensor<256xf32>
    %f0 = ernie.all_reduce_start %c over @mesh[dp] sum : tensor<256xf32>
    %a = ernie.neg %x : tensor<128xf32>
    %b = ernie.tanh %y : tensor<128xf32>
    %f1:2 = ernie.all_reduce_start %a, %b over @mesh[dp] sum : tensor<128xf32>, tensor<128xf32>
    ...
    %wa = ernie.wait %f1#0 : tensor<128xf32>
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
    after partition and the pipeline schedule, on per-rank programs.

    One forward walk per function body. An op a region may hold (elementwise
    float math, casts, compares and selects with i1 masks, `full`, a
    broadcast of an outside value, and `reduce_sum` / `reduce_mean` /
    `reduce_max`, which end a region) joins the open regions its operands
    come from when they share its iteration shape and compute type (f32 for
    every float up to f32, f64 alone), merging them; it also joins an open
    region that already reads one of its operands whole (siblings: SwiGLU's
    backward). A region closes once an op outside it reads one of its values
    (later members would have to move past that reader) or when a
    collective, a wait or a send/receive comes by: no region spans
    communication. Each region of two or more ops becomes an `ernie.fused` op
    where its last member was, its inputs the values it reads from outside,
    its results the values read outside; a region of one op is left as it
    was.

    Before the walk:

    * each fusible reader of a shared `full` or broadcast gets its own copy,
      filled in a register or read with stride 0, instead of one region
      writing it out for the others;
    * an elementwise op whose operands are all broadcasts of one source shape
      along the same dimensions (or constants) computes on the sources and
      its result is broadcast (the RMSNorm backward's `rsqrt` per row);
      narrow-float ops are left alone;
    * `cross_entropy` and `cross_entropy_grad` over the same logits, labels
      and attributes become one `ernie.cross_entropy_and_grad` where the loss
      was (a seed computed after the loss moves above it). In a pipeline the
      last chunk's forward computes both and returns the gradient under the
      logits' residual name, when the gradient is the backward's only reader
      of the logits and the seed is effect-free arithmetic on residuals,
      inputs and constants.

    Results are bit for bit those of the unfused program where every value
    is f32 or f64. Narrower floats (bf16, f16, fp8) inside a region stay in
    f32 and round once where the region writes them, as a fused kernel on a
    GPU does: a chain of bf16 ops differs from its unfused form (which rounds
    after every op) by those roundings.

    ```mlir
    %sq = ernie.mul %x, %x : tensor<4x8xf32>
    %sum = ernie.reduce_sum %sq axes = [1] keepdim : tensor<4x8xf32> -> tensor<4x1xf32>
    // becomes
    %sum = ernie.fused(%x) : (tensor<4x8xf32>) -> tensor<4x1xf32> {
    ^bb0(%a: tensor<4x8xf32>):
      %sq = ernie.mul %a, %a : tensor<4x8xf32>
      %s = ernie.reduce_sum %sq axes = [1] keepdim : tensor<4x8xf32> -> tensor<4x1xf32>
      ernie.yield %s : tensor<4x1xf32>
    }
    ```
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
    a size-1 dimension has none (`_`). Factors not marked are parallel; a
    factor that must stay whole is marked `replicated`, a reduction factor
    `reduction(<kind>)`.
  }];
}

def PipelineSplitPass : Pass<"ernie-pipeline-split", "ModuleOp"> {
  let summary = "Assign every op of the loss function to a pipeline stage";
  let description = [{
    Runs first, on the traced loss function `function` (default `forward`),
    before `--ernie-autodiff`. The function is cut into `stages *
    virtual-stages` chunks; chunk `c` runs on the pipeline rank (coordinate
    along `axis`, default `pp`) `c mod stages`. Each `ernie.split_point`
    starts the next chunk:

    * an op's chunk is the latest among its operands'; a marker's result is
      one chunk past its operand's;
    * an op reading only arguments and constants (a tied LM head's transpose
      of the embedding table, a mask) goes to the chunk that reads it, copied
      once per further chunk that reads it, so no chunk waits for another's
      constant;
    * the loss must be computed on the last chunk; a result that updates
      state (`ernie.updates`, MoE's routing bias) stays with what it is
      computed from.

    Every op gets `ernie.stage`; the markers are removed; every parameter
    lists the chunks reading it (`ernie.pipeline_stages`, merged with any a
    frontend declared; chunk 0 for an unused one); the module records
    `ernie.pipeline = {stages, virtual_stages, axis}`, the dictionary
    include/ernie/Dialect/Ernie/IR/PipelineInfo.h reads (with its bounds)
    for the later passes and the program writer. Autodiff then gives every
    gradient op its forward op's stage.

    Errors: `stages` or `virtual-stages` below 1; no function `function`, or
    one of several blocks; a marker beyond the last chunk; a chunk with no
    op; a loss not computed on the last chunk; a declared chunk out of range;
    a mesh without `axis`, or with `axis` of another size than `stages`.

    ```mlir
    // --ernie-pipeline-split=stages=2
    %a0 = ernie.relu %h0 : tensor<8x16xf32>                    // {ernie.stage = 0}
    %s = ernie.split_point %a0 : tensor<8x16xf32>              // removed
    %h1 = ernie.matmul %s, %w1 : ... -> tensor<8x16xf32>       // {ernie.stage = 1}, reads %a0
    %et = ernie.transpose %emb, perm = [1, 0] : ...            // {ernie.stage = 1}: where it is read
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
  let summary = "One replica per pipeline stage of a parameter several stages use";
  let description = [{
    Runs after `--ernie-pipeline-split`, before `--ernie-autodiff`, on
    `function` (default `forward`), which must have no callers. A parameter
    whose chunks live on more than one pipeline rank (a tied embedding and LM
    head; every attribute of a shared layer) becomes one argument per rank,
    each with the parameter's `ernie.param` name, its `ernie.pipeline_rank`
    and the sorted group of ranks `ernie.shared_stages`, computed from the
    program so that every rank agrees; each op reads its own rank's replica.
    Every other parameter gets its rank too.

    Autodiff then computes each replica's gradient on its own stage (zeros on
    a stage that holds it but does not read it, so every member joins the
    sum) and the training step sums them with `ernie.stage_all_reduce` over
    the group before the update (on a channel per shared name), so every
    replica takes the same step. `--ernie-pipeline-schedule` starts the
    replicas equal: `@init.<rank>` broadcasts each from its group's first
    rank (`ernie.stage_broadcast`). Forward-only functions hold no such sum.

    Errors: no function `function` split by `--ernie-pipeline-split`; a
    function with callers; an op reading a shared parameter outside any
    stage.

    ```mlir
    // before: %emb {ernie.param = "embed.weight", ernie.pipeline_stages = array<i64: 0, 1>}
    // after:
    %e0: tensor<10x16xf32> {ernie.param = "embed.weight", ernie.pipeline_rank = 0 : i64,
                            ernie.pipeline_stages = array<i64: 0>, ernie.shared_stages = array<i64: 0, 1>},
    %e1: tensor<10x16xf32> {ernie.param = "embed.weight", ernie.pipeline_rank = 1 : i64,
                            ernie.pipeline_stages = array<i64: 1>, ernie.shared_stages = array<i64: 0, 1>}
    // ernie.embedding reads %e0 (stage 0); the LM head's ernie.transpose reads %e1 (stage 1)
    ```
  }];
  let options = [
    Option<"function", "function", "std::string", "\"forward\"",
           "The loss function whose parameters to place">,
  ];
  let dependentDialects = ["::mlir::ernie::ErnieDialect"];
}

def PipelineSchedulePass : Pass<"ernie-pipeline-schedule", "ModuleOp"> {
  let summary = "Stage functions, sends and receives, and each rank's step order";
  let description = [{
    Runs after partition (and the overlap pass) on a module split by
    `--ernie-pipeline-split` whose `@train_step` autodiff built with an
    optimizer. The gradient is inlined into the step and each op placed:
    forward or backward of its chunk, or the update of its parameter's rank.
    Ops partition added take their operands' latest place; constants and ops
    of arguments alone (ZeRO-3's parameter gathers) are rebuilt in each
    function that reads them.

    Then the step is cut into, per chunk `c`, `@train_forward.c` and
    `@train_backward.c`, and per pipeline rank `r` `@train_update.r` (and
    `@init.r` for shared parameters); `@eval_step` into `@eval_forward.c`. By
    where an operand is defined:

    * an earlier forward chunk, a later backward chunk or another rank's
      update: an `ernie.send` / `ernie.recv` pair on a fresh channel;
    * the chunk's own forward, read by its backward: a residual
      (`ernie.residual = "residual.<k>"`), kept per micro-batch by the
      runtime;
    * a backward, read by the update: a gradient (`ernie.gradient =
      "grad.<k>"`), summed over micro-batches by the runtime and divided by
      their count in the update;
    * a maximum over the batch's dimensions read by the update (an fp8
      amax): `ernie.micro_batch_max`, the runtime keeps the largest;
    * a forward's sum over the batch's dimensions read by the update (MoE
      routing counts): `ernie.micro_batch_sum`, added in order, in f32 for
      narrower floats.

    Forward values only flow up the chunks and gradients only down, so the
    dependencies are exactly those the schedule simulates; a value for a
    later chunk of the same rank (interleaving, a skip connection) is relayed
    by the chunks between. A gradient's trailing ops that commute with the
    sum over micro-batches (sum all-reduces, gathers, transposes, reshapes,
    float casts, and a reduce-scatter that is only gathered whole again)
    move to the update: the data-parallel reduction runs once per step, not
    once per micro-batch. A reduce-scatter (ZeRO-2/3) otherwise stays, so the
    summed gradient is never held whole. A gather partition added whose
    readers are all in one later chunk runs there, so stages exchange shards.
    State the step updates outside the optimizer (fp8 histories, MoE bias)
    moves into the update, once per step.

    Gradients narrower than f32 are summed over micro-batches in f32; with
    `grad-reduce=f32` (the default; Megatron's main grads) their
    data-parallel sum in the update adds those f32 means, with `native` the
    narrowed ones. With `accumulate=gemm` (the default; Megatron's gradient
    accumulation fusion) or `add`, each backward takes the running sums of
    its gradients (`ernie.gradient` arguments named as its results) and
    returns them with its micro-batch added — under `gemm` a weight
    gradient's GEMM adds into the f32 sum itself (`ernie.matmul_accumulate`),
    under `add` by adds after the GEMMs; `runtime` leaves the sum to the
    runtime.

    The schedule — `FThenB`, `1F1B` (the default), `interleaved`, or
    `custom`: the module's own `ernie.pipeline_schedule` — over
    `micro-batches` (default 1) is built by the runtime's schedule library,
    checked (every step once, on its chunk's rank, and a simulation of every
    rank that names a blocked rank, the step it waits at and what for) and
    recorded: `micro_batches` and `schedule` in `ernie.pipeline`, one string
    of steps per rank in `ernie.pipeline_schedule`.

    Errors: no `ernie.pipeline` or no `@train_step`; `micro-batches` out of
    range; an unknown schedule, `accumulate` or `grad-reduce`; a custom
    schedule that is missing, malformed or deadlocks; data flowing against
    the pipeline (a backward reading a later chunk's forward); a loss not on
    the last chunk's forward; state updated from the batch other than by a
    maximum or a sum over it (a pipeline sees one micro-batch at a time).

    ```mlir
    // --ernie-pipeline-schedule=micro-batches=4, 2 stages:
    module attributes {ernie.pipeline = {axis = "pp", micro_batches = 4 : i64, schedule = "1F1B", stages = 2 : i64, virtual_stages = 1 : i64},
                       ernie.pipeline_schedule = ["F0:0 F0:1 B0:0 F0:2 B0:1 F0:3 B0:2 B0:3",
                                                  "F1:0 B1:0 F1:1 B1:1 F1:2 B1:2 F1:3 B1:3"]}
    // func.func @train_forward.0 ... ernie.send %h to stage 1 channel 0 : tensor<2x8xf32>
    // func.func @train_forward.1 ... ernie.recv from stage 0 channel 0 : tensor<2x8xf32>
    ```
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

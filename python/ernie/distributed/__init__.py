"""Paddle's auto-parallel API (`paddle.distributed`), over ernie's shardings.

Names and semantics follow Paddle so plans port as written: a `ProcessMesh`
with named dimensions; per mesh dimension a placement — `Shard(dim)`,
`Replicate()` or `Partial(reduce_type)`; `shard_tensor` / `reshard`;
`parallelize(model, optimizer, mesh, config)` with `dp_config`, `mp_config`
(a `parallelize_plan` of regexes matched against full sub-layer or parameter
names) and `pp_config` (split_spec, global_spec, accumulate_steps,
schedule_mode, vpp_degree; `ernie.pipeline`, re-exported here with
`SplitPoint`, `PipelineLayer`, `LayerDesc`, `SharedLayerDesc`,
`pipeline_schedule` and `simulate_pipeline`). A placement list becomes an
`#ernie.sharding`: tensor dimension d is split by the mesh dimensions that
`Shard(d)`, in mesh order. Meshes and placements are `ernie.mesh`'s,
re-exported here; `auto_plan` and `parallelize(config="auto")` run the plan
search of `ernie.autoplan`, which the package hands in (see "The plan
search" below: it sits above this module).
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np

from .. import _ernie
from .. import functional as F
from ..mesh import (Partial, Placement, ProcessMesh, ReduceType, Replicate, Shard,  # noqa: F401
                   _check_placements, dims_mapping_to_placements, get_mesh,
                   placements_to_dims_mapping, placements_to_sharding, set_mesh)
from ..moe import MoEConfig, MoELayer  # noqa: F401  (Paddle users look here)
from ..moe import moe_layers, set_token_groups
from ..nn import Embedding, Linear, Module, Parameter
from ..pipeline import (LayerDesc, PipelineLayer, SharedLayerDesc, SplitPoint,  # noqa: F401
                       pipeline_schedule, simulate_pipeline)
from ..pipeline import clear_split_marks as _clear_split_marks
from ..pipeline import configure as _configure_pipeline
from ..strategy import (FP8, DataParallel, ExpertParallel, MoE, PipelineParallel,  # noqa: F401
                       Recompute, Strategy, TensorParallel)
from ..tensor import Tensor, dtype_name, record
from .env import LaunchError, ParallelEnv, init_parallel_env, initialize, parallel_env  # noqa: F401


# ---------------------------------------------------------------------------
# Distributed tensors
# ---------------------------------------------------------------------------

class DistTensor:
    """A global value with its placements (an example input of compile)."""

    def __init__(self, value, mesh, placements):
        self.value = np.asarray(value)
        self.process_mesh = mesh
        self.placements = _check_placements(mesh, placements, self.value.shape)

    @property
    def shape(self):
        return self.value.shape

    def numpy(self):
        return self.value


def shard_tensor(data, mesh: ProcessMesh, placements):
    """Paddle's shard_tensor: a Parameter gets the placements (the plan), a
    numpy value becomes a DistTensor, a traced Tensor gets a sharding
    constraint."""
    if isinstance(data, Parameter):
        data.placements = _check_placements(mesh, placements, data.shape)
        data.mesh = mesh
        return data
    if isinstance(data, Tensor):
        return F.sharding_constraint(data, placements_to_sharding(mesh, placements, data.shape))
    return DistTensor(data, mesh, placements)


def dtensor_from_fn(fn, mesh, placements, *args, **kwargs):
    return shard_tensor(fn(*args, **kwargs), mesh, placements)


def reshard(x, mesh: ProcessMesh, placements):
    """Moves `x` to `placements`. In a traced program this is an explicit
    `ernie.reshard` (the partitioner plans its collectives); a DistTensor's
    global value does not change."""
    if isinstance(x, Tensor):
        (out,) = record("ernie.reshard", [x], {"sharding": placements_to_sharding(mesh, placements, x.shape)})
        return out
    if isinstance(x, DistTensor):
        return DistTensor(x.value, mesh, placements)
    raise TypeError(f"reshard takes a traced Tensor or a DistTensor, not {type(x).__name__}")


class SpmdSpec(tuple):
    """One tensor's answer from infer_spmd/infer_backward: a
    (dims_mapping, partial_dims) pair, as Paddle's dist attrs read
    (`dims_mapping`, `_partial_dims()`), plus `partial_types`: per partial
    mesh dimension its reduce type ("sum", "avg", "max", "min")."""

    def __new__(cls, dims_mapping, partial_dims, partial_types=None):
        spec = super().__new__(cls, (list(dims_mapping), list(partial_dims)))
        spec.partial_types = dict(partial_types or {})
        return spec

    @property
    def dims_mapping(self):
        return self[0]

    @property
    def partial_dims(self):
        return self[1]

    def is_partial(self):
        return bool(self[1])


def _spmd_call(op, inputs, dims_mappings, mesh, partial_dims, out_mappings, out_partial, attrs):
    name = op if op.startswith("ernie.") else f"ernie.{op}"
    try:
        types = [(list(shape), dtype_name(dtype)) for shape, dtype in inputs]
    except (TypeError, ValueError) as e:
        raise ValueError(f"infer_spmd('{name}'): inputs are (shape, dtype) pairs: {e}") from None
    if "dtype" in attrs:  # cast's target, full's element type
        try:
            attrs = {**attrs, "dtype": dtype_name(attrs["dtype"])}
        except (TypeError, ValueError) as e:
            raise ValueError(f"infer_spmd('{name}'): attribute 'dtype': {e}") from None

    def pairs(mappings, partial, what):
        if mappings is None:
            return None
        mappings = [list(m) for m in mappings]
        partial = [[] for _ in mappings] if partial is None else [list(p) for p in partial]
        if len(partial) != len(mappings):
            raise ValueError(f"infer_spmd('{name}'): {len(partial)} {what} partial_dims "
                             f"for {len(mappings)} dims_mappings")
        return list(zip(mappings, partial))

    try:
        ins, outs = _ernie.infer_spmd(name, types, pairs(dims_mappings, partial_dims, "input"),
                                      list(mesh.dim_names), list(mesh.shape), attrs,
                                      pairs(out_mappings, out_partial, "output"))
    except TypeError as e:  # a value pybind11 cannot convert
        raise ValueError(f"infer_spmd('{name}'): {e}") from None
    return [list(m) for m, _ in ins], [SpmdSpec(*o) for o in outs]


def infer_spmd(op: str, inputs, dims_mappings, mesh: ProcessMesh, partial_dims=None, **attrs):
    """One op's sharding rule, Paddle's `infer_forward`: `inputs` are
    (shape, dtype) pairs, `dims_mappings` one list per input (Paddle's:
    -1 or the mesh dimension splitting each tensor dimension),
    `partial_dims` per input the mesh dimensions it is a pending sum over.
    Attributes as Paddle or ernie spell them (`trans_x=True`, `axis=-1`,
    `keepdim`, reshape's `shape` with 0 and -1, split's `num_or_sections`).
    Returns (input dims_mappings, one SpmdSpec per output); a ValueError
    names the op and what it cannot take."""
    return _spmd_call(op, inputs, dims_mappings, mesh, partial_dims, None, None, attrs)


def infer_backward(op: str, inputs, output_dims_mappings, mesh: ProcessMesh,
                   output_partial_dims=None, **attrs):
    """Paddle's `infer_backward`: the rule run from the outputs'
    dims_mappings (the inputs give only shapes and dtypes); returns the
    inputs' dims_mappings and the outputs' SpmdSpecs as the rule makes them."""
    return _spmd_call(op, inputs, None, mesh, None, output_dims_mappings, output_partial_dims, attrs)


# ---------------------------------------------------------------------------
# parallelize and its plans
# ---------------------------------------------------------------------------

class PlanBase:
    def apply(self, layer, mesh, mp_axis, name):
        raise NotImplementedError


def _mp_index(mesh, mp_axis):
    return mesh.dim_names.index(mp_axis)


def _shard_param(param, mesh, mp_axis, dim):
    placements = list(param.placements or [Replicate() for _ in range(mesh.ndim)])
    placements += [Replicate()] * (mesh.ndim - len(placements))
    placements[_mp_index(mesh, mp_axis)] = Shard(dim) if dim is not None else Replicate()
    shard_tensor(param, mesh, placements)


def _wrap_forward(layer, post=None, pre=None):
    inner = layer.forward

    def forward(*args, **kwargs):
        if pre is not None:
            args = pre(layer, args)
        out = inner(*args, **kwargs)
        return post(layer, out) if post is not None else out

    object.__setattr__(layer, "forward", forward)


class ColWiseParallel(PlanBase):
    """Megatron's column-parallel layer: a Linear's weight [in, out] split on
    out (its bias too); an Embedding split on the hidden dimension. With
    gather_output the output is replicated again."""

    def __init__(self, gather_output=False):
        self.gather_output = gather_output

    def apply(self, layer, mesh, mp_axis, name):
        if isinstance(layer, Parameter):
            _shard_param(layer, mesh, mp_axis, len(layer.shape) - 1)
            return
        if isinstance(layer, Linear):
            _shard_param(layer.weight, mesh, mp_axis, 1)
            if layer.has_bias:
                _shard_param(layer.bias, mesh, mp_axis, 0)
        elif isinstance(layer, Embedding):
            _shard_param(layer.weight, mesh, mp_axis, 1)
        else:
            raise TypeError(f"ColWiseParallel applies to Linear or Embedding; {name} is "
                            f"{type(layer).__name__}")
        if self.gather_output:
            _wrap_forward(layer, post=lambda _, y: shard_tensor(y, mesh, [Replicate()] * mesh.ndim))


class RowWiseParallel(PlanBase):
    """Megatron's row-parallel layer: a Linear's weight split on in (the
    bias replicated, added once after the reduction); an Embedding split on
    the vocabulary. is_input_parallel says the input arrives split on its
    last dimension, as a ColWiseParallel layer leaves it."""

    def __init__(self, is_input_parallel=True):
        self.is_input_parallel = is_input_parallel

    def apply(self, layer, mesh, mp_axis, name):
        if isinstance(layer, Parameter):
            # The input dimension: 0 of a Linear's [in, out], 1 of stacked
            # experts' [E, in, out].
            _shard_param(layer, mesh, mp_axis, max(len(layer.shape) - 2, 0))
            return
        if isinstance(layer, Linear):
            _shard_param(layer.weight, mesh, mp_axis, 0)
        elif isinstance(layer, Embedding):
            _shard_param(layer.weight, mesh, mp_axis, 0)
        else:
            raise TypeError(f"RowWiseParallel applies to Linear or Embedding; {name} is "
                            f"{type(layer).__name__}")
        if not self.is_input_parallel:
            # The input is whole on every rank: split it as the weight is.
            def pre(_, args):
                x = args[0]
                placements = [Replicate()] * mesh.ndim
                placements[_mp_index(mesh, mp_axis)] = Shard(x.ndim - 1)
                return (shard_tensor(x, mesh, placements),) + tuple(args[1:])
            _wrap_forward(layer, pre=pre)


class PrepareLayerInput(PlanBase):
    """`fn(process_mesh)` returns a hook `(layer, inputs) -> inputs`."""

    def __init__(self, fn):
        self.fn = fn

    def apply(self, layer, mesh, mp_axis, name):
        hook = self.fn(mesh)
        _wrap_forward(layer, pre=lambda l, args: tuple(hook(l, args)))


class PrepareLayerOutput(PlanBase):
    """`fn(process_mesh)` returns a hook `(layer, inputs, outputs) -> outputs`."""

    def __init__(self, fn):
        self.fn = fn

    def apply(self, layer, mesh, mp_axis, name):
        hook = self.fn(mesh)
        _wrap_forward(layer, post=lambda l, out: hook(l, None, out))


# Sequence parallelism (Korthikanti et al.): between Begin and End the
# activations stay split along the sequence over mp; layers marked Disable
# (attention, MLP: the tensor-parallel ones) gather their input and hand
# back a sequence-split output, so the column-parallel matmul is preceded by
# an all-gather and the row-parallel one followed by a reduce-scatter. The
# plan only places constraints; propagation and partition derive the
# collectives (and mirror them in the backward). The constraints are weaker
# (priority 1) than parameter placements, so a weight's mp split wins over
# an activation's sequence split where they meet: the activation moves.
_SP_PRIORITY = 1


def _batch_dims(x, mesh):
    """The batch dimension's split, as the inputs have it: over the
    data-parallel axis (a constraint that left it out would gather the
    whole batch onto every data-parallel rank)."""
    dims = [[] for _ in x.shape]
    if "dp" in mesh.dim_names and x.ndim and x.shape[0] % mesh.get_dim_size("dp") == 0:
        dims[0] = ["dp"]
    return dims


def _sequence_split(x, mesh, mp_axis):
    """x [batch, seq, ...] split along seq over mp (the batch over dp)."""
    if x.ndim < 2:
        return x
    dims = _batch_dims(x, mesh)
    dims[1] = [mp_axis]
    if x.shape[1] % mesh.get_dim_size(mp_axis):
        raise ValueError(f"sequence parallelism: sequence length {x.shape[1]} does not divide "
                         f"over {mp_axis}={mesh.get_dim_size(mp_axis)}")
    return F.sharding_constraint(x, ("mesh", dims, []), _SP_PRIORITY)


def _sequence_whole(x, mesh, mp_axis):
    """x [batch, seq, ...] whole along seq (the batch over dp)."""
    return F.sharding_constraint(x, ("mesh", _batch_dims(x, mesh), []), _SP_PRIORITY)


def _first(out, fn):
    if isinstance(out, tuple):
        return (fn(out[0]),) + out[1:]
    return fn(out)


class _SequenceParallelPlan(PlanBase):
    def __init__(self, need_transpose=True):
        # Paddle's SP layout is [seq, batch, hidden] and need_transpose moves
        # between it and [batch, seq, hidden]; ernie keeps [batch, seq, ...]
        # throughout and splits dimension 1, so there is nothing to move.
        self.need_transpose = need_transpose

    def apply(self, layer, mesh, mp_axis, name):
        if isinstance(layer, Parameter):
            raise TypeError(f"{type(self).__name__} applies to a layer; {name} is a parameter")
        self._apply(layer, mesh, mp_axis)


class SequenceParallelBegin(_SequenceParallelPlan):
    """The layer's output starts the sequence-parallel region."""

    def _apply(self, layer, mesh, mp_axis):
        _wrap_forward(layer, post=lambda _, out: _first(out, lambda y: _sequence_split(y, mesh, mp_axis)))


class SequenceParallelEnd(_SequenceParallelPlan):
    """The layer's output leaves the region: gathered along the sequence."""

    def _apply(self, layer, mesh, mp_axis):
        _wrap_forward(layer, post=lambda _, out: _first(out, lambda y: _sequence_whole(y, mesh, mp_axis)))


class SequenceParallelEnable(_SequenceParallelPlan):
    """The layer runs on its share of the tokens (norms, elementwise)."""

    def _apply(self, layer, mesh, mp_axis):
        _wrap_forward(layer,
                      pre=lambda _, args: (_sequence_split(args[0], mesh, mp_axis),) + tuple(args[1:]),
                      post=lambda _, out: _first(out, lambda y: _sequence_split(y, mesh, mp_axis)))


class SequenceParallelDisable(_SequenceParallelPlan):
    """A tensor-parallel layer inside the region: its input is gathered
    along the sequence and its output handed back split."""

    def _apply(self, layer, mesh, mp_axis):
        _wrap_forward(layer,
                      pre=lambda _, args: (_sequence_whole(args[0], mesh, mp_axis),) + tuple(args[1:]),
                      post=lambda _, out: _first(out, lambda y: _sequence_split(y, mesh, mp_axis)))


class ShardingStage1:
    """ZeRO stage 1 over mesh dimension `mesh_dim`: optimizer state split."""
    level = 1

    def __init__(self, mesh_dim="dp", mesh=None):
        self.mesh_dim, self.mesh = mesh_dim, mesh


class ShardingStage2(ShardingStage1):
    level = 2


class ShardingStage3(ShardingStage1):
    level = 3


def shard_optimizer(optimizer, shard_fn=None):
    """Paddle's shard_optimizer: ZeRO over `shard_fn`'s mesh dimension."""
    if shard_fn is not None and not isinstance(shard_fn, ShardingStage1):
        raise TypeError("shard_optimizer takes ShardingStage1/2/3")
    optimizer.sharding_level = shard_fn.level if shard_fn else 0
    optimizer.sharding_axis = shard_fn.mesh_dim if shard_fn else None
    return optimizer





def _configure_moe(model, moe):
    """moe_config: routing settings of every MoE layer (capacity_factor —
    None for dropless —, the three loss coefficients, norm_min, and
    aux_free_rate: the selection bias's step after each training step)."""
    layers = moe_layers(model)
    if not layers:
        raise ValueError("moe_config: the model has no MoE layer (ernie.moe.MoELayer)")
    for _, layer in layers:
        layer.cfg = replace(layer.cfg, **moe)  # moe_config keys are MoEConfig fields


def _configure_experts(model, mesh, ep, plan_state):
    """ep_config: the MoE layers' experts split over `axis` (a mesh
    dimension or a list of them; default "ep"). Tokens are split over the
    data-parallel axis and the expert axes alike (an expert axis that is
    the dp / ZeRO axis is Paddle's ep_degree == sharding_degree), and each
    MoE layer routes one group per token shard (`token_groups` overrides
    the count). Under mp_config the tokens, whole on every mp rank, are
    split over mp too for routing and dispatch: each tensor-parallel rank
    dispatches its share, so the all-to-all bytes per rank fall by the mp
    degree (the groups then count the mp ranks as shards too)."""
    axes = ep.get("axis", "ep")
    axes = [axes] if isinstance(axes, str) else list(axes)
    layers = moe_layers(model)
    if not layers:
        raise ValueError("ep_config: the model has no MoE layer (ernie.moe.MoELayer)")
    for a in axes:
        if a not in mesh.dim_names:
            named = ", ".join(n for n, _ in layers[:3]) + (", ..." if len(layers) > 3 else "")
            raise ValueError(f"ep_config: the expert axis {a!r} of the MoE layers ({named}) is "
                             f"not a mesh dimension (the mesh has {mesh.dim_names})")
    degree = int(np.prod([mesh.get_dim_size(a) for a in axes]))
    if "degree" in ep and ep["degree"] != degree:
        raise ValueError(f"ep_config.degree = {ep['degree']!r}, but the expert axes "
                         f"{' x '.join(axes)} have {degree} ranks")
    batch_axes = [plan_state["dp_axis"]] if plan_state["dp_axis"] else []
    batch_axes += [a for a in axes if a not in batch_axes]
    route_axes = [a for a in [plan_state.get("mp_axis")] if a and a not in batch_axes
                  and mesh.get_dim_size(a) > 1]
    shards = int(np.prod([mesh.get_dim_size(a) for a in batch_axes + route_axes]))
    groups = ep.get("token_groups", shards)
    if not isinstance(groups, int) or groups < 1 or groups % shards:
        raise ValueError(f"ep_config.token_groups = {groups!r} must be a positive multiple of "
                         f"the {shards} token shards ({' x '.join(batch_axes + route_axes)})")
    set_token_groups(model, groups)
    for name, layer in layers:
        experts = layer.cfg.num_experts
        if experts % degree:
            raise ValueError(f"{name}: {experts} experts do not split over ep = {degree} "
                             f"({' x '.join(axes)})")
        for _, p in layer.experts.named_parameters():
            for a in axes:
                _shard_param(p, mesh, a, 0)
        layer.expert_axes = list(axes)
        layer.group_axes = [a for a in batch_axes if a not in axes]
        layer.route_axes = route_axes
        layer.token_shards = int(np.prod([mesh.get_dim_size(a) for a in batch_axes]))
        layer.experts_split_over_route_axes = any(
            isinstance(p.placements[mesh.dim_names.index(a)], Shard)
            for _, p in layer.experts.named_parameters() if p.placements for a in route_axes)
    plan_state["batch_axes"] = batch_axes


# ---------------------------------------------------------------------------
# The plan search, where Paddle users look for it
# ---------------------------------------------------------------------------
# auto_plan and parallelize(config="auto") run the plan search,
# ernie.autoplan. The search compiles its candidates, so it lives on the
# planning floor, above the compiler, which builds on this module: this
# module does not import it. The package hands it in instead
# (ernie/__init__.py calls `_use_plan_search` once both are loaded), so the
# search is here for every user of ernie.distributed.

_plan_search = None


def _use_plan_search(search) -> None:
    """Makes `search` (ernie.autoplan.auto_plan) the search auto_plan and
    parallelize(config="auto") run."""
    global _plan_search
    _plan_search = search


def auto_plan(model: Module, inputs=None, **options):
    """The fastest plans that fit a cluster (ernie.autoplan.auto_plan):
    `auto_plan(model, inputs, cluster="meta_llama3_h100", global_batch=...)`."""
    if _plan_search is None:  # only while the package itself is loading
        raise RuntimeError("the plan search (ernie.autoplan) is not loaded: import ernie")
    return _plan_search(model, inputs, **options)


def parallelize(model: Module, optimizer=None, mesh: ProcessMesh | None = None, config=None,
                *, cluster=None, inputs=None, global_batch=None, seq_len=None):
    """Applies Paddle's parallel config to `model` (and `optimizer`); returns
    both, as Paddle does. The plan is recorded on the model and its
    parameters; ernie.compile turns it into shardings.

    config="auto" chooses the plan: ernie.autoplan.auto_plan's fastest
    plan that fits `cluster` (default "dgx_h100") for the batch of
    `inputs` (or `global_batch` x `seq_len`); it is kept as
    `model.auto_plan` (its mesh, config, predicted time and memory)."""
    if isinstance(config, str):
        if config != "auto":
            raise ValueError(f"config is a dict or 'auto', not {config!r}")
        best = auto_plan(model, inputs, cluster=cluster or "dgx_h100",
                         global_batch=global_batch, seq_len=seq_len, top=1)[0]
        object.__setattr__(model, "auto_plan", best)
        if best.mesh is None:
            return model, optimizer
        return parallelize(model, optimizer, best.mesh, best.config)
    mesh = mesh or get_mesh()
    if mesh is None:
        raise ValueError("parallelize needs a mesh (argument or dist.set_mesh)")
    strategy = Strategy.from_config(config)  # every key and value checked here
    config = strategy.to_config()
    model._name_parameters()
    plan_state = {"mesh": mesh, "dp_axis": None, "sharding_level": 0, "pp_config": None,
                  "pipeline": None, "sequence_parallel_overlap": False,
                  "even_splits": strategy.even_splits}

    # Pipeline first, as Paddle applies it: split_spec marks layers, whose
    # calls then place the stage boundaries while the model is traced.
    _clear_split_marks(model)
    pp = config.get("pp_config")
    if pp is not None:
        plan_state["pipeline"] = _configure_pipeline(model, mesh, pp)
        plan_state["pp_config"] = dict(pp)

    dp = strategy.dp
    if dp is not None:
        plan_state["gradient_buckets"] = {"bucket_mb": dp.bucket_mb,
                                          "grad_reduce_dtype": dp.grad_reduce_dtype}
        level = dp.sharding_level
        if "dp" not in mesh.dim_names:
            raise ValueError(f"dp_config needs a mesh dimension named 'dp'; the mesh has {mesh.dim_names}")
        plan_state["dp_axis"] = "dp"
        plan_state["sharding_level"] = level
        if optimizer is not None and level:
            optimizer.sharding_level = level  # (level 0 keeps a shard_optimizer choice)

    mp = strategy.mp
    if mp is not None:
        if "mp" not in mesh.dim_names:
            raise ValueError(f"mp_config needs a mesh dimension named 'mp'; the mesh has {mesh.dim_names}")
        # Decomposed collective matmuls (--ernie-sequence-parallel-overlap).
        plan_state["sequence_parallel_overlap"] = mp.sequence_parallel_overlap
        plan_state["mp_axis"] = "mp"
        layers = dict(model.named_sublayers())
        params = dict(model.named_parameters())
        for key, plans in mp.parallelize_plan.items():
            plans = plans if isinstance(plans, (list, tuple)) else [plans]
            try:
                pattern = re.compile(key)
            except re.error as e:
                raise ValueError(f"parallelize_plan key {key!r} is not a regex: {e}") from None
            targets = [(n, l) for n, l in layers.items() if pattern.fullmatch(n)]
            targets += [(n, p) for n, p in params.items() if pattern.fullmatch(n)]
            if not targets:
                raise ValueError(f"parallelize_plan key {key!r} matches no sub-layer or parameter")
            for name, target in targets:
                for plan in plans:
                    if not isinstance(plan, PlanBase):
                        raise TypeError(f"parallelize_plan[{key!r}] holds {plan!r}, not a plan")
                    plan.apply(target, mesh, "mp", name)

    if config.get("moe_config") is not None:
        _configure_moe(model, config["moe_config"])
    ep = config.get("ep_config")
    if ep is not None:
        _configure_experts(model, mesh, ep, plan_state)

    if strategy.fp8 is not None:
        plan_state["fp8_config"] = strategy.fp8.to_config()

    if strategy.recompute is not None:
        strategy.recompute.plan(model)  # its layers checked here, applied by compile
        plan_state["recompute"] = strategy.recompute

    object.__setattr__(model, "_ernie_plan", plan_state)
    return model, optimizer


# ---------------------------------------------------------------------------
# Checkpoints, by Paddle's names
# ---------------------------------------------------------------------------

def save_state_dict(program, path, keep=None, data_position=None):
    """Paddle's `dist.save_state_dict`: `program.save_checkpoint(path)`."""
    return program.save_checkpoint(path, keep=keep, data_position=data_position)


def load_state_dict(program, path):
    """Paddle's `dist.load_state_dict`: `program.load_checkpoint(path)`,
    resharded onto the program's mesh and plan."""
    return program.load_checkpoint(path)


# ---------------------------------------------------------------------------
# Multi-process jobs: which data this process reads
# ---------------------------------------------------------------------------

def get_rank() -> int:
    """This process's index in the job (Paddle's and PyTorch's name)."""
    return parallel_env().rank


def get_world_size() -> int:
    """The job's process count (Paddle's and PyTorch's name)."""
    return parallel_env().world_size


def local_batch(program, global_rows=None) -> np.ndarray:
    """The rows of a global batch this process's ranks read, so that a data
    loader reads nothing else: their positions in the batch (ascending), or
    with `global_rows` (the global batch's sample ids, one per row, the same
    on every process) those entries of it. Pass the rows read with the
    positions: `program.step(x[mine], y[mine], rows=local_batch(program))`.
    In one process it is every row."""
    rows = program.local_rows()
    if global_rows is None:
        return rows.copy()
    ids = np.asarray(global_rows)
    batch = program._inputs[0][0][0] if program._inputs and program._inputs[0][0] else None
    if ids.ndim != 1 or (batch is not None and len(ids) != batch):
        raise ValueError(f"global_rows must list one sample per row of the global batch "
                         f"({batch} rows), not shape {list(ids.shape)}")
    return ids[rows]

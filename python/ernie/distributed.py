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
`Shard(d)`, in mesh order.
"""

from __future__ import annotations

import math
import re

import numpy as np

from . import _ernie
from .nn import Module, Parameter
from .pipeline import (LayerDesc, PipelineLayer, SharedLayerDesc, SplitPoint,  # noqa: F401
                       pipeline_schedule, simulate_pipeline)
from .moe import MoEConfig, MoELayer  # noqa: F401  (Paddle users look here)
from .pipeline import configure as _configure_pipeline
from .pipeline import clear_split_marks as _clear_split_marks
from .tensor import Tensor, dtype_name


# ---------------------------------------------------------------------------
# Meshes and placements
# ---------------------------------------------------------------------------

class ProcessMesh:
    """`ProcessMesh(mesh, dim_names)`: `mesh` is a (nested) list of process
    ids whose shape is the mesh shape."""

    # The compiler's bound on a mesh's rank count (MeshOp::kMaxRanks; the
    # runtime checks the same), so a mesh built here compiles and runs.
    MAX_RANKS = 1 << 20

    def __init__(self, mesh, dim_names=None):
        try:
            ids = np.asarray(mesh)
        except ValueError as e:  # ragged nesting
            raise ValueError(f"ProcessMesh needs a rectangular (nested) list of ids: {e}") from None
        if ids.ndim == 0:
            raise ValueError("ProcessMesh needs at least one dimension")
        if ids.size == 0:
            raise ValueError(f"ProcessMesh dimensions must have at least one process, got shape {list(ids.shape)}")
        if ids.dtype.kind not in "iu":
            raise ValueError(f"ProcessMesh process ids must be integers, got {ids.dtype}")
        if ids.size > self.MAX_RANKS:
            raise ValueError(f"ProcessMesh has {ids.size} processes; at most {self.MAX_RANKS} are supported")
        self.shape = list(ids.shape)
        self.process_ids = [int(i) for i in ids.reshape(-1)]
        if sorted(self.process_ids) != list(range(ids.size)):
            raise ValueError("ProcessMesh process ids must be 0..n-1, each once")
        self.dim_names = list(dim_names) if dim_names else [f"d{i}" for i in range(ids.ndim)]
        if len(self.dim_names) != ids.ndim:
            raise ValueError(f"ProcessMesh has {ids.ndim} dimensions but {len(self.dim_names)} names")
        if not all(isinstance(n, str) and n for n in self.dim_names):
            raise ValueError(f"ProcessMesh dimension names must be non-empty strings, got {self.dim_names}")
        if len(set(self.dim_names)) != len(self.dim_names):
            raise ValueError("ProcessMesh dimension names must differ")

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape))

    def get_dim_size(self, name):
        return self.shape[self.dim_names.index(name)]

    def __repr__(self):
        return f"ProcessMesh(shape={self.shape}, dim_names={self.dim_names})"


_global_mesh = None


def set_mesh(mesh: ProcessMesh):
    global _global_mesh
    _global_mesh = mesh


def get_mesh() -> ProcessMesh | None:
    return _global_mesh


class Placement:
    def is_shard(self, dim=None):
        return False

    def is_replicated(self):
        return False

    def is_partial(self):
        return False


class Shard(Placement):
    def __init__(self, dim: int):
        self.dim = dim

    def is_shard(self, dim=None):
        return dim is None or dim == self.dim

    def get_dim(self):
        return self.dim

    def __eq__(self, other):
        return isinstance(other, Shard) and other.dim == self.dim

    def __repr__(self):
        return f"Shard(dim={self.dim})"


class Replicate(Placement):
    def is_replicated(self):
        return True

    def __eq__(self, other):
        return isinstance(other, Replicate)

    def __repr__(self):
        return "Replicate()"


class ReduceType:
    kRedSum, kRedAvg, kRedMax, kRedMin = "sum", "avg", "max", "min"


class Partial(Placement):
    def __init__(self, reduce_type: str = ReduceType.kRedSum):
        if reduce_type not in ("sum", "avg", "max", "min"):
            raise ValueError(f"Partial reduce_type must be sum, avg, max or min, not {reduce_type!r}")
        self.reduce_type = reduce_type

    def is_partial(self):
        return True

    def __eq__(self, other):
        return isinstance(other, Partial) and other.reduce_type == self.reduce_type

    def __repr__(self):
        return f"Partial({self.reduce_type})"


def _check_placements(mesh: ProcessMesh, placements, shape):
    if len(placements) > mesh.ndim:
        raise ValueError(f"{len(placements)} placements for a {mesh.ndim}-dimensional mesh "
                         f"{mesh.dim_names}")
    placements = list(placements) + [Replicate()] * (mesh.ndim - len(placements))
    for i, p in enumerate(placements):
        if not isinstance(p, Placement):
            raise TypeError(f"placement {i} is {p!r}, not Shard/Replicate/Partial")
        if isinstance(p, Shard):
            if not -len(shape) <= p.dim < len(shape):
                raise ValueError(f"Shard({p.dim}) is out of range for a tensor of rank {len(shape)}")
    # A dimension the mesh does not divide is split unevenly (the last
    # pieces padded, as GSPMD does); config={"even_splits": True} makes the
    # compiler reject it instead.
    return placements


def placements_to_sharding(mesh: ProcessMesh, placements, shape):
    """(mesh name, per-dim axes, partials) for the tracer."""
    placements = _check_placements(mesh, placements, shape)
    dims = [[] for _ in shape]
    partials = []
    for i, p in enumerate(placements):
        if isinstance(p, Shard):
            dims[p.dim % len(shape)].append(mesh.dim_names[i])
        elif isinstance(p, Partial):
            partials.append((mesh.dim_names[i], p.reduce_type))
    return ("mesh", dims, partials)


def placements_to_dims_mapping(placements, ndim):
    """Paddle's (dims_mapping, partial_dims): for each tensor dim the mesh dim
    sharding it or -1, and the mesh dims holding a pending reduction."""
    mapping = [-1] * ndim
    partial = []
    for i, p in enumerate(placements):
        if isinstance(p, Shard):
            d = p.dim % ndim
            if mapping[d] != -1:
                raise ValueError("dims_mapping holds one mesh dim per tensor dim")
            mapping[d] = i
        elif isinstance(p, Partial):
            partial.append(i)
    return mapping, partial


def dims_mapping_to_placements(dims_mapping, mesh_ndim, partial_dims=(), reduce_type="sum"):
    placements = [Replicate() for _ in range(mesh_ndim)]
    for d, m in enumerate(dims_mapping):
        if m >= 0:
            if m >= mesh_ndim:
                raise ValueError(f"dims_mapping names mesh dim {m} of a {mesh_ndim}-d mesh")
            placements[m] = Shard(d)
    for m in partial_dims:
        placements[m] = Partial(reduce_type)
    return placements


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
        from . import functional as F
        return F.sharding_constraint(data, placements_to_sharding(mesh, placements, data.shape))
    return DistTensor(data, mesh, placements)


def dtensor_from_fn(fn, mesh, placements, *args, **kwargs):
    return shard_tensor(fn(*args, **kwargs), mesh, placements)


def reshard(x, mesh: ProcessMesh, placements):
    """Moves `x` to `placements`. In a traced program this is an explicit
    `ernie.reshard` (the partitioner plans its collectives); a DistTensor's
    global value does not change."""
    if isinstance(x, Tensor):
        from .tensor import record
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
        from .nn import Embedding, Linear
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
        from .nn import Embedding, Linear
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
    from . import functional as F
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
    from . import functional as F
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


_CONFIG_KEYS = {"dp_config", "mp_config", "pp_config", "ep_config", "moe_config", "fp8_config",
                "even_splits", "recompute"}

# moe_config keys -> MoEConfig fields.
_MOE_KEYS = {"capacity_factor": "capacity_factor", "aux_loss_coef": "aux_loss_coef",
             "orthogonal_loss_coef": "orthogonal_loss_coef", "z_loss_coef": "z_loss_coef",
             "norm_min": "norm_min", "aux_free_rate": "aux_free_rate"}


def _configure_moe(model, moe):
    """moe_config: routing settings of every MoE layer (capacity_factor —
    None for dropless —, the three loss coefficients, norm_min, and
    aux_free_rate: the selection bias's step after each training step)."""
    from dataclasses import replace

    from .moe import moe_layers
    if not isinstance(moe, dict):
        raise TypeError("moe_config is a dict (" + ", ".join(sorted(_MOE_KEYS)) + ")")
    unknown = set(moe) - set(_MOE_KEYS)
    if unknown:
        raise ValueError(f"unknown moe_config keys {sorted(unknown)} (known: {sorted(_MOE_KEYS)})")
    layers = moe_layers(model)
    if not layers:
        raise ValueError("moe_config: the model has no MoE layer (ernie.moe.MoELayer)")
    for _, layer in layers:
        layer.cfg = replace(layer.cfg, **{_MOE_KEYS[k]: v for k, v in moe.items()})


def _configure_experts(model, mesh, ep, plan_state):
    """ep_config: the MoE layers' experts split over `axis` (a mesh
    dimension or a list of them; default "ep"). Tokens are split over the
    data-parallel axis and the expert axes alike (an expert axis that is
    the dp / ZeRO axis is Paddle's ep_degree == sharding_degree), and each
    MoE layer routes one group per token shard (`token_groups` overrides
    the count)."""
    from .moe import moe_layers, set_token_groups
    if not isinstance(ep, dict):
        raise TypeError("ep_config is a dict (axis, token_groups)")
    unknown = set(ep) - {"axis", "degree", "token_groups"}
    if unknown:
        raise ValueError(f"unknown ep_config keys {sorted(unknown)} (known: axis, degree, "
                         f"token_groups)")
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
    shards = int(np.prod([mesh.get_dim_size(a) for a in batch_axes]))
    groups = ep.get("token_groups", shards)
    if not isinstance(groups, int) or groups < 1 or groups % shards:
        raise ValueError(f"ep_config.token_groups = {groups!r} must be a positive multiple of "
                         f"the {shards} token shards ({' x '.join(batch_axes)})")
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
    plan_state["batch_axes"] = batch_axes


def auto_plan(model: Module, inputs=None, **options):
    """The fastest plans that fit a cluster (ernie.autoplan.auto_plan):
    `auto_plan(model, inputs, cluster="meta_llama3_h100", global_batch=...)`."""
    from .autoplan import auto_plan as search
    return search(model, inputs, **options)


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
        from .autoplan import auto_plan
        best = auto_plan(model, inputs, cluster=cluster or "dgx_h100",
                         global_batch=global_batch, seq_len=seq_len, top=1)[0]
        object.__setattr__(model, "auto_plan", best)
        if best.mesh is None:
            return model, optimizer
        return parallelize(model, optimizer, best.mesh, best.config)
    mesh = mesh or get_mesh()
    if mesh is None:
        raise ValueError("parallelize needs a mesh (argument or dist.set_mesh)")
    config = dict(config or {})
    unknown = set(config) - _CONFIG_KEYS
    if unknown:
        raise ValueError(f"unknown parallelize config keys {sorted(unknown)} "
                         f"(known: {sorted(_CONFIG_KEYS)})")
    model._name_parameters()
    plan_state = {"mesh": mesh, "dp_axis": None, "sharding_level": 0, "pp_config": None,
                  "pipeline": None, "sequence_parallel_overlap": False}
    even = config.get("even_splits", False)
    if not isinstance(even, bool):
        raise TypeError(f"even_splits is a bool, not {even!r}")
    # Every split must divide its dimension (else it is padded).
    plan_state["even_splits"] = even

    # Pipeline first, as Paddle applies it: split_spec marks layers, whose
    # calls then place the stage boundaries while the model is traced.
    _clear_split_marks(model)
    pp = config.get("pp_config")
    if pp is not None:
        if not isinstance(pp, dict):
            raise TypeError("pp_config is a dict (split_spec, global_spec, accumulate_steps, "
                            "schedule_mode, vpp_degree)")
        plan_state["pipeline"] = _configure_pipeline(model, mesh, pp)
        plan_state["pp_config"] = dict(pp)

    dp = config.get("dp_config")
    if dp is not None:
        unknown = set(dp) - {"sharding_level", "bucket_mb", "grad_reduce_dtype"}
        if unknown:
            raise ValueError(f"unknown dp_config keys {sorted(unknown)}")
        level = dp.get("sharding_level", 0)
        if level not in (0, 1, 2, 3):
            raise ValueError(f"dp_config.sharding_level must be 0..3, not {level!r}")
        # Gradient all-reduces in buckets (--ernie-bucket-gradients): MiB
        # per bucket (DDP's 25; 0 reduces each gradient on its own, at the
        # end of the backward), narrow-float gradients reduced in f32 (the
        # default, Megatron's main grads) or in their own type ("native").
        bucket = dp.get("bucket_mb", 25)
        if (isinstance(bucket, bool) or not isinstance(bucket, (int, float))
                or not math.isfinite(bucket) or bucket < 0):
            raise ValueError(f"dp_config.bucket_mb is a size in MiB >= 0, not {bucket!r}")
        reduce_dtype = dp.get("grad_reduce_dtype", "float32")
        if reduce_dtype not in ("float32", "native"):
            raise ValueError(f"dp_config.grad_reduce_dtype is 'float32' or 'native', "
                             f"not {reduce_dtype!r}")
        plan_state["gradient_buckets"] = {"bucket_mb": bucket, "grad_reduce_dtype": reduce_dtype}
        if "dp" not in mesh.dim_names:
            raise ValueError(f"dp_config needs a mesh dimension named 'dp'; the mesh has {mesh.dim_names}")
        plan_state["dp_axis"] = "dp"
        plan_state["sharding_level"] = level
        if optimizer is not None and level:
            optimizer.sharding_level = level  # (level 0 keeps a shard_optimizer choice)

    mp = config.get("mp_config")
    if mp is not None:
        unknown = set(mp) - {"parallelize_plan", "sequence_parallel_overlap"}
        if unknown:
            raise ValueError(f"unknown mp_config keys {sorted(unknown)}")
        if "mp" not in mesh.dim_names:
            raise ValueError(f"mp_config needs a mesh dimension named 'mp'; the mesh has {mesh.dim_names}")
        overlap = mp.get("sequence_parallel_overlap", False)
        if not isinstance(overlap, bool):
            raise TypeError(f"mp_config.sequence_parallel_overlap is a bool, not {overlap!r}")
        # Decomposed collective matmuls (--ernie-sequence-parallel-overlap).
        plan_state["sequence_parallel_overlap"] = overlap
        layers = dict(model.named_sublayers())
        params = dict(model.named_parameters())
        for key, plans in mp.get("parallelize_plan", {}).items():
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

    if config.get("fp8_config") is not None:
        if not isinstance(config["fp8_config"], dict):
            raise TypeError("fp8_config is a dict (recipe, fwd_format, grad_format, exclude, include)")
        plan_state["fp8_config"] = dict(config["fp8_config"])

    if config.get("recompute") is not None:
        from .compiler import recompute_plan
        recompute_plan(model, config["recompute"])  # checked here, applied by compile
        plan_state["recompute"] = config["recompute"]

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

"""Functional ops on symbolic tensors, one per ernie dialect op.

Each function records its op through the C++ tracer; shapes are inferred
and checked there. Binary ops broadcast numpy-style by inserting an explicit
`ernie.broadcast`, and Python scalars become `ernie.full` fills.
"""

from __future__ import annotations

import numpy as np

from .tensor import Tensor, dtype_name, record


def _one(name, operands, attrs=None, result_types=None) -> Tensor:
    (result,) = record(name, operands, attrs, result_types)
    return result


# ---------------------------------------------------------------------------
# Creation and conversion
# ---------------------------------------------------------------------------

def full(shape, value, dtype="f32") -> Tensor:
    return _one("ernie.full", [], {"value": value}, [(shape, dtype)])


def iota(shape, dimension=0, dtype="i64") -> Tensor:
    return _one("ernie.iota", [], {"dimension": dimension}, [(shape, dtype)])


def constant(array) -> Tensor:
    array = np.ascontiguousarray(array)
    return _one("ernie.constant", [], {"value": array}, [(array.shape, array.dtype)])


def cast(x: Tensor, dtype) -> Tensor:
    return _one("ernie.cast", [x], {}, [(x.shape, dtype_name(dtype))])


def as_tensor(value, like: Tensor) -> Tensor:
    """`value` as a tensor next to `like`: Tensors pass through, Python
    numbers become a fill of `like`'s shape and dtype."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (int, float, np.number)):
        return full(like.shape, float(value) if like.dtype.startswith("f") or like.dtype == "bf16"
                    else int(value), like.dtype)
    raise TypeError(f"cannot combine a Tensor with {type(value).__name__}")


# ---------------------------------------------------------------------------
# Shapes
# ---------------------------------------------------------------------------

def reshape(x: Tensor, shape) -> Tensor:
    shape = list(shape)
    if shape.count(-1) > 1:
        raise ValueError("reshape: at most one -1")
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1]))
        total = int(np.prod(x.shape))
        if known == 0 or total % known:
            raise ValueError(f"reshape: cannot make {list(x.shape)} into {shape}")
        shape[shape.index(-1)] = total // known
    return _one("ernie.reshape", [x], {}, [(shape, x.dtype)])


def transpose(x: Tensor, perm) -> Tensor:
    return _one("ernie.transpose", [x], {"perm": list(perm)})


def broadcast_to(x: Tensor, shape) -> Tensor:
    """numpy broadcasting: x's dimensions align with the trailing ones."""
    shape = list(shape)
    if list(x.shape) == shape:
        return x
    offset = len(shape) - x.ndim
    if offset < 0:
        raise ValueError(f"cannot broadcast {list(x.shape)} to {shape}")
    # Size-1 dimensions that grow are dropped first: broadcast maps each
    # remaining operand dimension to a result dimension of the same size.
    keep = [d for d in range(x.ndim) if x.shape[d] == shape[offset + d]]
    for d in range(x.ndim):
        if x.shape[d] != shape[offset + d] and x.shape[d] != 1:
            raise ValueError(f"cannot broadcast {list(x.shape)} to {shape}")
    if len(keep) != x.ndim:
        x = reshape(x, [x.shape[d] for d in keep])
    return _one("ernie.broadcast", [x], {"dims": [offset + d for d in keep]},
                [(shape, x.dtype)])


def _broadcast_pair(a: Tensor, b: Tensor):
    shape = list(np.broadcast_shapes(a.shape, b.shape))
    return broadcast_to(a, shape), broadcast_to(b, shape)


def slice(x: Tensor, start, limit, step=None) -> Tensor:  # noqa: A001 - dialect name
    step = list(step) if step is not None else [1] * x.ndim
    return _one("ernie.slice", [x], {"start": list(start), "limit": list(limit), "step": step})


def split(x: Tensor, sizes, axis: int) -> list:
    return record("ernie.split", [x], {"axis": axis % x.ndim, "sizes": list(sizes)})


def concat(xs, axis: int) -> Tensor:
    return _one("ernie.concat", list(xs), {"axis": axis % xs[0].ndim})


# ---------------------------------------------------------------------------
# Elementwise
# ---------------------------------------------------------------------------

def _binary(name):
    def op(a, b):
        if not isinstance(a, Tensor):
            a = as_tensor(a, b)
        b = as_tensor(b, a)
        a, b = _broadcast_pair(a, b)
        return _one(f"ernie.{name}", [a, b])
    op.__name__ = name
    op.__doc__ = f"Elementwise {name}, numpy broadcasting."
    return op


add, sub, mul, div = _binary("add"), _binary("sub"), _binary("mul"), _binary("div")
maximum, minimum, pow = _binary("maximum"), _binary("minimum"), _binary("pow")  # noqa: A001


def _unary(name):
    def op(x: Tensor) -> Tensor:
        return _one(f"ernie.{name}", [x])
    op.__name__ = name
    return op


neg, exp, log, sqrt, rsqrt = (_unary(n) for n in ("neg", "exp", "log", "sqrt", "rsqrt"))
tanh, sigmoid, silu, relu, abs = (_unary(n) for n in ("tanh", "sigmoid", "silu", "relu", "abs"))  # noqa: A001
erf, reciprocal, stop_gradient = (_unary(n) for n in ("erf", "reciprocal", "stop_gradient"))


def gelu(x: Tensor, approximate: bool = False) -> Tensor:
    return _one("ernie.gelu", [x], {"approximate": approximate})


def compare(a: Tensor, b, direction: str) -> Tensor:
    b = as_tensor(b, a)
    a, b = _broadcast_pair(a, b)
    return _one("ernie.compare", [a, b], {"direction": direction})


def where(cond: Tensor, on_true: Tensor, on_false: Tensor) -> Tensor:
    return _one("ernie.select", [cond, on_true, on_false])


# ---------------------------------------------------------------------------
# Linear algebra, reductions, normalisation
# ---------------------------------------------------------------------------

def matmul(a: Tensor, b: Tensor, transpose_a=False, transpose_b=False) -> Tensor:
    return _one("ernie.matmul", [a, b], {"transpose_a": transpose_a, "transpose_b": transpose_b})


def _axes(x, axis):
    if axis is None:
        return list(range(x.ndim))
    axes = [axis] if isinstance(axis, int) else list(axis)
    return sorted(a % x.ndim for a in axes)


def sum(x: Tensor, axis=None, keepdim=False) -> Tensor:  # noqa: A001
    return _one("ernie.reduce_sum", [x], {"axes": _axes(x, axis), "keepdim": keepdim})


def mean(x: Tensor, axis=None, keepdim=False) -> Tensor:
    return _one("ernie.reduce_mean", [x], {"axes": _axes(x, axis), "keepdim": keepdim})


def max(x: Tensor, axis=None, keepdim=False) -> Tensor:  # noqa: A001
    return _one("ernie.reduce_max", [x], {"axes": _axes(x, axis), "keepdim": keepdim})


def softmax(x: Tensor, axis=-1) -> Tensor:
    return _one("ernie.softmax", [x], {"axis": axis % x.ndim})


def log_softmax(x: Tensor, axis=-1) -> Tensor:
    return _one("ernie.log_softmax", [x], {"axis": axis % x.ndim})


def rms_norm(x: Tensor, weight: Tensor, epsilon=1e-6) -> Tensor:
    return _one("ernie.rms_norm", [x, weight], {"epsilon": float(epsilon)})


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, epsilon=1e-5) -> Tensor:
    return _one("ernie.layer_norm", [x, weight, bias], {"epsilon": float(epsilon)})


# ---------------------------------------------------------------------------
# Transformer pieces
# ---------------------------------------------------------------------------

def topk(x: Tensor, k: int, axis=-1, largest=True):
    """(values, i64 indices) of the k largest (smallest) entries along
    `axis`, sorted; ties keep the lower index first."""
    values, indices = record("ernie.topk", [x], {"k": int(k), "axis": axis % x.ndim,
                                                 "largest": bool(largest)})
    return values, indices


def embedding(ids: Tensor, weight: Tensor) -> Tensor:
    return _one("ernie.embedding", [ids, weight])


def rope(x: Tensor, positions: Tensor, theta=10000.0, interleaved=False) -> Tensor:
    """Rotary embedding of x [batch, seq, heads, head_dim] at `positions` [seq]."""
    return _one("ernie.rope", [x, positions], {"theta": float(theta), "interleaved": interleaved})


def attention(q: Tensor, k: Tensor, v: Tensor, causal=False, scale=None,
              window=None) -> Tensor:
    """Scaled dot-product attention, [batch, seq, heads, head_dim] layout;
    k and v may have fewer heads (grouped-query attention). `window` (with
    `causal`): each query sees only the last `window` keys, itself
    included (sliding-window attention, Mistral's `sliding_window`)."""
    attrs = {"causal": causal}
    if scale is not None:
        attrs["scale"] = float(scale)
    if window is not None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1 or not causal:
            raise ValueError(f"attention: a sliding window is a number of keys >= 1 with "
                             f"causal=True, not window={window!r} (causal={causal})")
        attrs["window"] = window
    return _one("ernie.attention", [q, k, v], attrs)


def report_metric(name: str, x: Tensor) -> None:
    """Reports float scalar `x` as metric `name` of a training step (an
    auxiliary loss apart from the loss): Program.last_metrics after step(),
    Program.eval_metrics after eval(), the trainer's log. Not reported by
    a program that does not train, or a pipelined one."""
    x.trace.report_metric(name, x)


def cross_entropy(logits: Tensor, labels: Tensor, reduction="mean", ignore_index=-100) -> Tensor:
    return _one("ernie.cross_entropy", [logits, labels],
                {"reduction": reduction, "ignore_index": ignore_index})


# ---------------------------------------------------------------------------
# Mixture of experts (tokens in groups: [groups, tokens, ...])
# ---------------------------------------------------------------------------

def moe_route(experts: Tensor, num_experts: int, capacity: int) -> Tensor:
    """Each choice's slot in its expert's buffer of its group, -1 when the
    expert is full (choice rank first, then tokens in order)."""
    return _one("ernie.moe_route", [experts],
                {"num_experts": int(num_experts), "capacity": int(capacity)})


def moe_dispatch(x: Tensor, experts: Tensor, slots: Tensor, weights: Tensor,
                 num_experts: int, capacity: int) -> Tensor:
    """x [groups, tokens, hidden] into buffers [num_experts, groups,
    capacity, hidden], each copy scaled by its weight."""
    return _one("ernie.moe_dispatch", [x, experts, slots, weights],
                {"num_experts": int(num_experts), "capacity": int(capacity)})


def moe_combine(y: Tensor, experts: Tensor, slots: Tensor, weights: Tensor) -> Tensor:
    """The weighted sum of each token's kept expert outputs."""
    return _one("ernie.moe_combine", [y, experts, slots, weights])


def expert_matmul(x: Tensor, weight: Tensor, rows: Tensor, transpose_weight=False,
                  fill=1.0) -> Tensor:
    """Each expert's GEMM over the slots routing filled: x [E, groups,
    capacity, in] times weight [E, in, out] ([E, out, in] with
    `transpose_weight`) for the first rows[e, g] rows of each buffer, zeros
    for the rest. `fill`: the average fraction of slots filled, for the cost
    model."""
    return _one("ernie.expert_matmul", [x, weight, rows],
                {"transpose_weight": transpose_weight, "fill": float(fill)})


# ---------------------------------------------------------------------------
# Sharding in the traced program
# ---------------------------------------------------------------------------

def sharding_constraint(x: Tensor, sharding: tuple, priority: int = 0) -> Tensor:
    """Asks propagation for `sharding` here (mesh, dims, partials)."""
    return _one("ernie.sharding_constraint", [x], {"sharding": sharding, "priority": priority})


# ---------------------------------------------------------------------------
# Pipeline parallelism
# ---------------------------------------------------------------------------

def split_point(x):
    """A pipeline stage boundary (`ernie.split_point`, the identity): what is
    computed from the result belongs to the next virtual stage. Tuples and
    lists are marked element-wise; anything but a Tensor passes through.
    Outside a pipelined compile (no "pp" mesh axis of size > 1) nothing is
    recorded and `x` comes back as it is: the model runs as one stage."""
    if isinstance(x, (tuple, list)):
        return type(x)(split_point(v) for v in x)
    if not isinstance(x, Tensor) or not x.trace.split_points:
        return x
    x.trace.split_point_count += 1
    return _one("ernie.split_point", [x])


# ---------------------------------------------------------------------------
# Tensor's operators and methods: these ops. Attached here because Tensor
# (ernie.tensor) sits below this module and cannot import it.
# ---------------------------------------------------------------------------

def _operator(op, name, swap=False):
    """Tensor's operator `name` for `op`: a number beside a Tensor becomes a
    fill of its shape and dtype; `swap` is the reflected form (2 - x)."""
    def method(self, other):
        other = as_tensor(other, like=self)
        return op(other, self) if swap else op(self, other)
    method.__name__, method.__qualname__ = name, f"Tensor.{name}"
    return method


def _reshape(self, *shape):
    if len(shape) == 1 and isinstance(shape[0], (list, tuple)):
        shape = shape[0]
    return reshape(self, shape)


for _name, _op in (("add", add), ("sub", sub), ("mul", mul), ("truediv", div)):
    setattr(Tensor, f"__{_name}__", _operator(_op, f"__{_name}__"))
    setattr(Tensor, f"__r{_name}__", _operator(_op, f"__r{_name}__", swap=True))
del _name, _op
Tensor.__matmul__ = _operator(matmul, "__matmul__")
Tensor.__neg__ = neg
Tensor.reshape = _reshape
Tensor.transpose = transpose
Tensor.astype = cast

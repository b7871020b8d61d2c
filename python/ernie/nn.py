"""Layers, Paddle-style: `Module` with named sub-modules and parameters.

A parameter holds its initial value (numpy) and, once a plan is applied, its
placements on the mesh. While a model is traced each parameter is bound to
the `ernie.param` argument named by its qualified path
(`llama.layers.0.self_attn.qkv_proj.weight`).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict

import numpy as np

from . import functional as F
from .tensor import ERNIE_TO_NUMPY, Tensor, dtype_name
from .tensor import _state as _trace_state


_abstract = False


@contextlib.contextmanager
def abstract():
    """Models built inside have parameters with a shape and a dtype but no
    values: full-size models compile (ernie.compile(..., abstract=True))
    without allocating their tensors."""
    global _abstract
    previous, _abstract = _abstract, True
    try:
        yield
    finally:
        _abstract = previous


def parameter(shape, dtype, init):
    """A Parameter of `shape` whose value is `init()` — not called in
    abstract mode."""
    if _abstract:
        return Parameter(None, dtype, shape=shape)
    return Parameter(init(), dtype)


class Parameter:
    """A trainable tensor: its value, and where it lives on the mesh."""

    def __init__(self, value, dtype=None, shape=None):
        self.placements = None  # list of distributed placements, per mesh dim
        self.name = None        # set by the owning module tree
        self.traced: Tensor | None = None  # the argument while tracing
        # Virtual pipeline stages declared to hold a replica (SharedLayerDesc):
        # `ernie.pipeline_stages` on the argument of a pipelined trace.
        self.pipeline_stages: list[int] | None = None
        if value is None:  # abstract: shape and dtype only
            self.dtype, self.value, self.shape = dtype_name(dtype), None, tuple(shape)
            return
        value = np.asarray(value)
        self.dtype = dtype_name(dtype or value.dtype)
        self.value = value.astype(ERNIE_TO_NUMPY.get(self.dtype, value.dtype))
        self.shape = tuple(value.shape)

    def __repr__(self):
        return f"Parameter(name={self.name!r}, shape={list(self.shape)}, dtype={self.dtype})"


class Module:
    """Base of every layer. Attributes that are Modules or Parameters are
    registered under their attribute name, in assignment order."""

    def __init__(self):
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_parameters", OrderedDict())

    def __setattr__(self, name, value):
        if "_modules" not in self.__dict__:
            raise RuntimeError(f"{type(self).__name__}.__init__ must call super().__init__() first")
        if isinstance(value, Module):
            self._modules[name] = value
        elif isinstance(value, Parameter):
            self._parameters[name] = value
        object.__setattr__(self, name, value)

    def __getattr__(self, name):  # parameters that are bound while tracing
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def named_sublayers(self, prefix="", include_self=False):
        if include_self:
            yield prefix, self
        for name, m in self._modules.items():
            path = f"{prefix}.{name}" if prefix else name
            yield path, m
            yield from m.named_sublayers(path)

    def named_parameters(self, prefix=""):
        for name, p in self._parameters.items():
            yield (f"{prefix}.{name}" if prefix else name), p
        for name, m in self._modules.items():
            yield from m.named_parameters(f"{prefix}.{name}" if prefix else name)

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def state_dict(self):
        """{qualified name: numpy value} of every parameter (None in abstract
        models)."""
        return OrderedDict((n, p.value) for n, p in self.named_parameters())

    def set_state_dict(self, state, strict=True):
        params = dict(self.named_parameters())
        unknown = set(state) - set(params)
        if strict and unknown:
            raise KeyError(f"set_state_dict: unknown parameters {sorted(unknown)}")
        for name, value in state.items():
            if name not in params:
                continue
            value = np.asarray(value)
            p = params[name]
            if tuple(value.shape) != p.shape:
                raise ValueError(f"set_state_dict: {name} has shape {list(value.shape)}, "
                                 f"expected {list(p.shape)}")
            p.value = value.astype(p.value.dtype)

    def _name_parameters(self):
        for name, p in self.named_parameters():
            p.name = name

    def forward(self, *args, **kwargs):
        raise NotImplementedError

    def __call__(self, *args, **kwargs):
        trace = getattr(_trace_state, "trace", None)
        layer = trace.recompute_layers.get(id(self)) if trace is not None else None
        if layer is None or trace.layer is not None:
            return self._call(*args, **kwargs)
        trace.layer = layer  # the ops recorded inside are this layer's
        trace.tracer.set_layer(layer)
        try:
            return self._call(*args, **kwargs)
        finally:
            trace.layer = None
            trace.tracer.set_layer("")

    def _call(self, *args, **kwargs):
        # A pipeline split point placed on this layer (pp_config.split_spec):
        # "beginning" marks its inputs, "end" its outputs.
        split = self.__dict__.get("_ernie_split_point")
        if split is None:
            return self.forward(*args, **kwargs)
        if split == "beginning":
            args = F.split_point(tuple(args))
            kwargs = {k: F.split_point(v) for k, v in kwargs.items()}
        out = self.forward(*args, **kwargs)
        if split == "end":
            out = F.split_point(out)
        trace = getattr(_trace_state, "trace", None)
        if trace is not None:
            trace.split_layers_reached.add(id(self))
        return out

    def p(self, name) -> Tensor:
        """The traced argument of this module's parameter `name`."""
        param = self._parameters[name]
        if param.traced is None:
            raise RuntimeError(f"parameter {param.name or name} is used outside ernie.compile")
        return param.traced


def _uniform(rng, shape, bound, dtype):
    return rng.uniform(-bound, bound, size=shape).astype(ERNIE_TO_NUMPY.get(dtype, "float32"))


_default_rng = np.random.default_rng(0)


class Linear(Module):
    """y = x @ weight (+ bias); weight is [in_features, out_features] as in
    Paddle, so ColWiseParallel splits dimension 1 and RowWiseParallel 0."""

    def __init__(self, in_features, out_features, bias=True, dtype="f32", rng=None):
        super().__init__()
        rng = rng or _default_rng
        bound = 1.0 / np.sqrt(in_features)
        self.weight = parameter((in_features, out_features), dtype,
                                lambda: _uniform(rng, (in_features, out_features), bound, dtype))
        if bias:
            self.bias = parameter((out_features,), dtype, lambda: np.zeros(out_features))
        self.has_bias = bias

    def forward(self, x):
        y = F.matmul(x, self.p("weight"))
        return y + self.p("bias") if self.has_bias else y


class Embedding(Module):
    def __init__(self, num_embeddings, embedding_dim, dtype="f32", rng=None, std=0.02):
        super().__init__()
        rng = rng or _default_rng
        self.weight = parameter((num_embeddings, embedding_dim), dtype,
                                lambda: rng.normal(0, std, size=(num_embeddings, embedding_dim)))

    def forward(self, ids):
        return F.embedding(ids, self.p("weight"))


class RMSNorm(Module):
    def __init__(self, hidden_size, epsilon=1e-6, dtype="f32"):
        super().__init__()
        self.weight = parameter((hidden_size,), dtype, lambda: np.ones(hidden_size))
        self.epsilon = epsilon

    def forward(self, x):
        return F.rms_norm(x, self.p("weight"), self.epsilon)


class LayerNorm(Module):
    def __init__(self, hidden_size, epsilon=1e-5, dtype="f32"):
        super().__init__()
        self.weight = parameter((hidden_size,), dtype, lambda: np.ones(hidden_size))
        self.bias = parameter((hidden_size,), dtype, lambda: np.zeros(hidden_size))
        self.epsilon = epsilon

    def forward(self, x):
        return F.layer_norm(x, self.p("weight"), self.p("bias"), self.epsilon)


class LayerList(Module):
    """Sub-modules named 0, 1, 2, ..."""

    def __init__(self, modules=()):
        super().__init__()
        self._list = []
        for m in modules:
            self.append(m)

    def append(self, module):
        setattr(self, str(len(self._list)), module)
        self._list.append(module)

    def __iter__(self):
        return iter(self._list)

    def __len__(self):
        return len(self._list)

    def __getitem__(self, i):
        return self._list[i]


class SiLU(Module):
    def forward(self, x):
        return F.silu(x)


class GELU(Module):
    def __init__(self, approximate=False):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)


class ReLU(Module):
    def forward(self, x):
        return F.relu(x)

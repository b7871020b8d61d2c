"""Symbolic tensors: what a model sees while it is traced.

A `Tensor` is a handle to a value in the module the C++ tracer is building;
calling an op on it records the op there (verified on the spot, so a shape
error points at the Python line that made it). Shapes and dtypes come back
from C++, never from rules re-written in Python.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

import numpy as np

from . import _ernie

_state = threading.local()

# numpy dtype names <-> ernie element types.
NUMPY_TO_ERNIE = {"float64": "f64", "float32": "f32", "float16": "f16",
                  "int64": "i64", "int32": "i32", "bool": "i1"}
ERNIE_TO_NUMPY = {v: k for k, v in NUMPY_TO_ERNIE.items()}
FLOAT_DTYPES = ("f64", "f32", "f16", "bf16", "f8E4M3FN", "f8E5M2")


def dtype_name(dtype) -> str:
    """An ernie element type from 'f32', 'float32', np.float32 or np.dtype."""
    if isinstance(dtype, str) and dtype in FLOAT_DTYPES + ("i64", "i32", "i1"):
        return dtype
    name = np.dtype(dtype).name
    if name not in NUMPY_TO_ERNIE:
        raise TypeError(f"unsupported dtype {dtype!r}")
    return NUMPY_TO_ERNIE[name]


class Trace:
    """One function being recorded.

    `split_points`: whether pipeline stage boundaries
    (`ernie.functional.split_point`) are recorded. ernie.compile records
    them only for a pipelined program (a mesh with a "pp" axis of size > 1);
    elsewhere a boundary is the identity and leaves no op. `split_point_count`
    counts the markers recorded."""

    def __init__(self, name: str = "forward", split_points: bool = True,
                 updates_state: bool = False):
        self.tracer = _ernie.Tracer(name)
        self.split_points = split_points
        self.split_point_count = 0
        self.split_layers_reached = set()  # ids of layers whose marks ran
        # State the model updates by a rule of its own each training step
        # (MoE's aux-free balancing bias): recorded only when the program
        # trains (`updates_state`). name -> initial value, and the updates
        # (name, new value) the trace returns after the loss.
        self.updates_state = updates_state
        self.state_values = {}
        self.state_updates = []
        # Named float scalars a training step reports beside its loss
        # (`ernie.metric`, report_metric): recorded with the state.
        self.metrics = []
        # Activation recomputation: id(module) -> layer name for the layers
        # it recomputes; the ops recorded inside one carry its name
        # (`ernie.layer`, read by --ernie-recompute). `layer`: the one open.
        self.recompute_layers = {}
        self.layer = None

    def state(self, name, value) -> "Tensor":
        """A state argument `name` starting at numpy `value`; give its new
        value with `update_state`."""
        if name in self.state_values:
            raise ValueError(f"state '{name}' is declared twice")
        value = np.asarray(value)
        self.state_values[name] = value
        return Tensor(self, self.tracer.argument(list(value.shape), dtype_name(value.dtype),
                                                 None, None, None, name))

    def report_metric(self, name, value: "Tensor"):
        """Reports float scalar `value` as the step's metric `name` (an
        auxiliary loss apart from the loss): the program's train and eval
        steps return it (Program.last_metrics). Ignored where the program
        does not train, or is pipelined (a per-micro-batch metric is not
        one of the step's)."""
        if not self.updates_state or self.split_points:
            return
        if any(n == name for n, _ in self.metrics):
            raise ValueError(f"metric '{name}' is reported twice")
        if value.shape != () or value.dtype not in ("f32", "f64", "bf16", "f16"):
            raise ValueError(f"metric '{name}' must be a float scalar, got "
                             f"{value.dtype}{list(value.shape)}")
        self.metrics.append((name, value.astype("f32") if value.dtype != "f32" else value))

    def update_state(self, name, value: "Tensor"):
        if name not in self.state_values:
            raise ValueError(f"no state '{name}' to update")
        self.state_updates.append((name, value))

    def argument(self, shape, dtype, param=None, sharding=None, pipeline_stages=None) -> "Tensor":
        stages = None if pipeline_stages is None else [int(s) for s in pipeline_stages]
        handle = self.tracer.argument(list(shape), dtype_name(dtype), param, sharding, stages,
                                      None)
        return Tensor(self, handle)


@contextlib.contextmanager
def tracing(trace: Trace):
    previous = getattr(_state, "trace", None)
    _state.trace = trace
    try:
        yield trace
    finally:
        _state.trace = previous


def current_trace() -> Trace:
    trace = getattr(_state, "trace", None)
    if trace is None:
        raise RuntimeError("ernie ops run on symbolic tensors inside ernie.compile "
                           "(or an explicit ernie.tensor.tracing block)")
    return trace


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# The model families are model source as much as a user's file is: an op
# they build is located at their line, not at whoever called them.
_MODELS_DIR = os.path.join(_PACKAGE_DIR, "models") + os.sep


_OUTSIDE_PACKAGE: dict = {}  # code file name -> whether it is outside ernie


def _caller_location() -> str:
    """file:line of the first frame outside the ernie package or in
    ernie.models, for the op's location (errors and the program file name
    the model's line). Walks the
    frames themselves: inspect.stack() reads every frame's source lines,
    which was half of an 80-layer model's compile."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        outside = _OUTSIDE_PACKAGE.get(name)
        if outside is None:
            path = os.path.abspath(name)
            outside = _OUTSIDE_PACKAGE[name] = \
                not path.startswith(_PACKAGE_DIR) or path.startswith(_MODELS_DIR)
        if outside:
            return f"{os.path.basename(name)}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


def record(name: str, operands, attrs=None, result_types=None):
    """Records op `name` on `operands`; returns its results as Tensors."""
    operands = list(operands)
    trace = operands[0].trace if operands and isinstance(operands[0], Tensor) else current_trace()
    handles = []
    for x in operands:
        if not isinstance(x, Tensor):
            raise TypeError(f"{name}: operands must be ernie Tensors, got {type(x).__name__}")
        if x.trace is not trace:
            raise ValueError(f"{name}: operands come from different traces")
        handles.append(x.handle)
    types = None if result_types is None else [(list(s), dtype_name(d)) for s, d in result_types]
    results = trace.tracer.op(name, handles, dict(attrs or {}), types, _caller_location())
    return [Tensor(trace, h) for h in results]


class Tensor:
    """A symbolic tensor in a trace. Its operators (+, -, *, /, @, unary -)
    and `reshape`, `transpose`, `astype` are ernie.functional's ops, which
    that module attaches here: it builds on this one, so this one cannot
    import it (`import ernie` loads both)."""

    __array_priority__ = 1000  # numpy defers to our operators

    def __init__(self, trace: Trace, handle: int):
        self.trace = trace
        self.handle = handle
        shape, dtype = trace.tracer.type_of(handle)
        self.shape = tuple(shape)
        self.dtype = dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self):
        return f"Tensor(shape={list(self.shape)}, dtype={self.dtype})"

"""ernie.compile: trace a model, run the C++ pipeline, load the runtime.

The pipeline is the one `ernie-opt` runs — `--ernie-autodiff` (with the
optimizer's options) then `--ernie-auto-parallel-pipeline` when there is a
mesh — and the program file is the one `ernie-run` reads. Every rank runs as
a thread of this process (the runtime's Session).

A mesh with a "pp" axis of size > 1 makes a pipelined program: the model is
traced on one micro-batch (the example inputs' dimension 0 divided by
`pp_config.accumulate_steps`) with its split points recorded, and the
pipeline becomes `--ernie-pipeline-split`, `--ernie-shared-weight-dedup`,
`--ernie-autodiff`, [ZeRO, FP8], partition, [overlap], then
`--ernie-pipeline-schedule`. Such a program runs `step` and `eval` only (the
runtime splits each global batch into the micro-batches itself).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import tempfile
from collections import Counter, OrderedDict, namedtuple

import numpy as np

from . import _ernie
from .distributed import DistTensor, ProcessMesh, Replicate, Shard, get_mesh, placements_to_sharding
from .pipeline import configure as configure_pipeline
from .nn import Module
from .optimizer import Optimizer
from .tensor import ERNIE_TO_NUMPY, Trace, Tensor, dtype_name, tracing

_BYTES = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "f8E4M3FN": 1, "f8E5M2": 1,
          "i64": 8, "i32": 4, "i1": 1}


_FP8_KEYS = {"recipe": "recipe", "fwd_format": "fwd-format", "grad_format": "grad-format",
             "exclude": "exclude", "include": "include", "history_length": "history-length",
             "margin": "margin", "amax_compute": "amax-compute", "block_size": "block-size",
             "pow2_scale": "pow2-scale"}


def _fp8_pass(fp8_config: dict) -> str:
    """`fp8_config` as the --ernie-fp8-lowering pass with its options."""
    unknown = set(fp8_config) - set(_FP8_KEYS)
    if unknown:
        raise ValueError(f"unknown fp8_config keys {sorted(unknown)} (known: {sorted(_FP8_KEYS)})")
    recipe = fp8_config.get("recipe", "current")
    if recipe not in ("current", "delayed", "blockwise"):
        raise ValueError(f"fp8_config.recipe must be current, delayed or blockwise, not {recipe!r}")
    if recipe != "delayed" and {"history_length", "margin", "amax_compute"} & set(fp8_config):
        raise ValueError("history_length, margin and amax_compute belong to the delayed recipe")
    if recipe != "blockwise" and "block_size" in fp8_config:
        raise ValueError("block_size belongs to the blockwise recipe")
    if not isinstance(fp8_config.get("pow2_scale", False), bool):
        raise ValueError(f"fp8_config.pow2_scale is a bool, not {fp8_config['pow2_scale']!r}")
    for key in ("fwd_format", "grad_format"):
        if fp8_config.get(key, "e4m3") not in ("e4m3", "e5m2"):
            raise ValueError(f"fp8_config.{key} must be 'e4m3' or 'e5m2', not {fp8_config[key]!r}")
    if fp8_config.get("amax_compute", "max") not in ("max", "most_recent"):
        raise ValueError(f"fp8_config.amax_compute must be 'max' or 'most_recent', "
                         f"not {fp8_config['amax_compute']!r}")
    for key, least in (("history_length", 1), ("margin", 0), ("block_size", 1)):
        value = fp8_config.get(key, least)
        if not isinstance(value, int) or value < least:
            raise ValueError(f"fp8_config.{key} must be an integer >= {least}, not {value!r}")
    options = []
    for key, value in fp8_config.items():
        if isinstance(value, bool):
            value = str(value).lower()
        if '"' in str(value):
            raise ValueError(f"fp8_config.{key} may not contain a double quote")
        options.append(f'{_FP8_KEYS[key]}="{value}"')
    return f"ernie-fp8-lowering{{{' '.join(options)}}}"


# What load_state_dict(strict=False) returns, as PyTorch's `_IncompatibleKeys`.
IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])

# The numpy dtypes state_dict() hands out per runtime type (narrow floats as
# their raw bits) and load_state_dict() takes back.
_STATE_DTYPES = {"f64": "float", "f32": "float", "f16": "float", "bf16": "uint16",
                 "f8E4M3FN": "uint8", "f8E5M2": "uint8", "i64": "integer",
                 "i32": "integer", "i1": "bool"}


def _check_state_value(name, value, spec):
    """`value` as an array for state `spec` (global shape, runtime dtype):
    floats for a float state (any width, rounded once by the runtime), the
    raw bits state_dict() gives for bf16/fp8, integers for integers; bool or
    integer arrays are never read as float weights."""
    array = np.asarray(value)
    want = _STATE_DTYPES[spec["dtype"]]
    kind = array.dtype.kind
    ok = {"float": kind == "f", "integer": kind in "iu", "bool": kind == "b"}.get(
        want, array.dtype == np.dtype(want))
    if not ok:
        raise TypeError(f"load_state_dict: {name!r} is {spec['dtype']}; an array of "
                        f"{array.dtype} cannot be loaded into it"
                        + (" (narrow floats travel as their raw bits, as state_dict() "
                           f"gives them: {want})" if want in ("uint16", "uint8") else ""))
    if list(array.shape) != list(spec["global_shape"]):
        raise ValueError(f"load_state_dict: {name!r} has shape {list(array.shape)}, "
                         f"the program's is {list(spec['global_shape'])}")
    return np.ascontiguousarray(array)


_RECOMPUTE_MODES = ("none", "selective", "full")


def recompute_plan(model: Module, spec) -> tuple[str, dict]:
    """config["recompute"] as (mode, {id(layer): name}): the layers whose
    ops are marked for --ernie-recompute. `spec` is "none", "selective"
    (Megatron's: the attention core), "full" (each layer's forward again in
    its backward), a bool (True: "full", PaddleNLP's `recompute=True`), or
    {"granularity": one of those, "layers": a regex or a list of them,
    matched whole against the names of ernie.nn.LayerList elements, e.g.
    "layers.[0-3]"}: the layers recomputed (default: every element)."""
    if spec is None or spec is False:
        return "none", {}
    if spec is True:
        spec = "full"
    patterns = None
    if isinstance(spec, dict):
        unknown = set(spec) - {"granularity", "layers"}
        if unknown:
            raise ValueError(f"unknown recompute keys {sorted(unknown)} (known: granularity, layers)")
        patterns = spec.get("layers")
        if isinstance(patterns, str):
            patterns = [patterns]
        if patterns is not None and (not isinstance(patterns, (list, tuple))
                                     or not all(isinstance(p, str) for p in patterns)):
            raise TypeError(f"recompute.layers is a regex or a list of regexes, not {patterns!r}")
        spec = spec.get("granularity", "full")
    if spec not in _RECOMPUTE_MODES:
        raise ValueError(f"recompute is one of {', '.join(_RECOMPUTE_MODES)} (or a bool, or a dict "
                         f"with granularity and layers), not {spec!r}")
    from .nn import LayerList
    layers = {f"{name}.{i}" if name else str(i): child
              for name, sub in model.named_sublayers(include_self=True)
              if isinstance(sub, LayerList) for i, child in enumerate(sub)}
    if spec == "none":
        return spec, {}
    if spec == "full" and not layers:
        raise ValueError("recompute 'full' recomputes each element of an ernie.nn.LayerList, and the "
                         f"model ({type(model).__name__}) has none")
    if patterns is None:
        chosen = layers if spec == "full" else {}  # selective: every attention core
    else:
        chosen = {}
        for pattern in patterns:
            try:
                regex = re.compile(pattern)
            except re.error as e:
                raise ValueError(f"recompute.layers {pattern!r} is not a regex: {e}") from None
            hits = {n: l for n, l in layers.items() if regex.fullmatch(n)}
            if not hits:
                known = ", ".join(list(layers)[:4]) + (", ..." if len(layers) > 4 else "")
                raise ValueError(f"recompute.layers {pattern!r} matches no layer "
                                 f"(the model's: {known or 'none'})")
            chosen.update(hits)
    order = {name: i for i, name in enumerate(layers)}
    return spec, {id(chosen[name]): name for name in sorted(chosen, key=order.get)}


def _pipeline(optimizer: Optimizer | None, partition: bool, differentiate: bool,
              zero_level: int = 0, zero_axis: str = "dp", overlap: bool = False,
              fp8_config: dict | None = None, pipeline: dict | None = None,
              fuse: bool = True, buckets: dict | None = None, recompute: str = "none",
              cluster_file: str | None = None) -> str:
    """The textual pass pipeline. `pipeline` (a pipelined compile): stages,
    virtual_stages, accumulate_steps, schedule (FThenB, 1F1B, interleaved)
    and gradient_accumulation_fusion. `fuse`: group elementwise chains into fused loops
    (--ernie-fuse), last. `buckets` (dp_config's bucket_mb and
    grad_reduce_dtype; default 25 MiB, f32): data-parallel gradients
    all-reduced in buckets overlapping the backward
    (--ernie-bucket-gradients). `recompute`: none, selective or full
    (--ernie-recompute, after FP8 lowering so copies are the lowered ops).
    `cluster_file`: propagation and partition choose layouts and
    collectives by their time on that cluster, not by bytes."""
    options = optimizer.pass_options() if optimizer is not None else {"optimizer": "none"}
    text = " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in options.items())
    passes = []
    if pipeline is not None:
        passes.append(f"ernie-pipeline-split{{stages={pipeline['stages']} "
                      f"virtual-stages={pipeline['virtual_stages']}}}")
        passes.append("ernie-shared-weight-dedup")
    if differentiate:
        passes.append(f"ernie-autodiff{{{text}}}")
    if zero_level:
        passes.append(f"ernie-zero-sharding{{level={zero_level} axis={zero_axis}}}")
    if fp8_config is not None:
        passes.append(_fp8_pass(fp8_config))
    if differentiate and recompute != "none":
        passes.append(f"ernie-recompute{{mode={recompute}}}")
    if partition:
        passes.append(f'ernie-auto-parallel-pipeline{{cluster="{cluster_file}"}}' if cluster_file
                      else "ernie-auto-parallel-pipeline")
        if overlap:
            passes.append("ernie-sequence-parallel-overlap")
        buckets = buckets or {}
        accumulate = "native" if buckets.get("grad_reduce_dtype") == "native" else "f32"
        if pipeline is not None:
            # Megatron's flag: off, main_grad is added to after each GEMM.
            fused = "gemm" if pipeline.get("gradient_accumulation_fusion", True) else "add"
            passes.append(f"ernie-pipeline-schedule{{micro-batches={pipeline['accumulate_steps']} "
                          f"schedule={pipeline['schedule']} grad-reduce={accumulate} "
                          f"accumulate={fused}}}")
        if buckets.get("bucket_mb", 25) > 0:
            passes.append(f"ernie-bucket-gradients{{bucket-bytes="
                          f"{int(buckets.get('bucket_mb', 25) * 2**20)} accumulate={accumulate}}}")
    elif passes:
        passes.append("ernie-simplify-pipeline")  # canonicalize, CSE (as partition's pipeline does)
    if passes and fuse:
        passes.append("ernie-fuse")  # last: it groups the per-rank programs' elementwise chains
    return f"builtin.module({','.join(passes)})" if passes else ""


@contextlib.contextmanager
def _cluster_file(cluster):
    """`cluster` (a name, file or dict) as a JSON file with its device
    inlined, for the passes' cluster= option; None for no cluster."""
    if cluster is None:
        yield None
        return
    from . import cost
    spec = cost.load_cluster(cluster)
    # Named as the user named it: a bad field's error names the file.
    name = os.path.basename(str(cluster)).removesuffix(".json") \
        if isinstance(cluster, (str, os.PathLike)) else "cluster"
    with tempfile.TemporaryDirectory(prefix="ernie-cluster-") as directory:
        path = os.path.join(directory, f"{name}.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        yield path


def _staged_bytes(signature, size) -> int:
    """What the runtime copies in beside a function's arena and keeps: its
    arguments that are not device tensors it holds (the batch, the learning
    rate and step), which it cannot bind in place. Parameters, optimizer
    state, residuals and gradient sums are bound to the runtime's tensors
    (docs/architecture.md, the executor)."""
    return sum(size(a) for a in signature["arguments"]
               if a["role"] in ("input", "learning_rate", "step", "micro_batch_max",
                                  "micro_batch_sum"))


def _global_array(value) -> np.ndarray:
    """The global value of an example input or batch element."""
    return np.asarray(value.value if isinstance(value, DistTensor) else value)


def _input_sharding(mesh, value, shape, dp_axis):
    """Inputs split along dimension 0 over the data-parallel axis, or over
    each of a list of axes (dp and expert-parallel ones: they all hold
    different tokens)."""
    if isinstance(value, DistTensor):
        return placements_to_sharding(value.process_mesh, value.placements, shape)
    if mesh is None or not dp_axis or not shape:
        return None
    placements = [Replicate()] * mesh.ndim
    for axis in [dp_axis] if isinstance(dp_axis, str) else dp_axis:
        placements[mesh.dim_names.index(axis)] = Shard(0)
    return placements_to_sharding(mesh, placements, shape)


def _micro_batch(value, micro_batches: int, index: int):
    """The first of `micro_batches` equal slices of an example input along
    dimension 0 (a pipelined model is traced on one micro-batch)."""
    if micro_batches == 1:
        return value
    array = _global_array(value)
    if array.ndim == 0:
        raise ValueError(f"input {index} is a scalar: with accumulate_steps={micro_batches} every "
                         f"input is split into micro-batches along dimension 0")
    if array.shape[0] % micro_batches:
        raise ValueError(f"input {index} has {array.shape[0]} rows (dimension 0), which do not "
                         f"divide into accumulate_steps={micro_batches} micro-batches")
    rows = array.shape[0] // micro_batches
    if isinstance(value, DistTensor):
        return DistTensor(array[:rows], value.process_mesh, value.placements)
    return array[:rows]


def _is_pipelined(mesh) -> bool:
    return mesh is not None and "pp" in mesh.dim_names and mesh.get_dim_size("pp") > 1


def trace_model(model: Module, example_inputs, mesh: ProcessMesh | None, dp_axis=None,
                micro_batches: int = 1, split_points: bool | None = None) -> str:
    """The model's forward as an ernie module (the traced, unpartitioned IR).
    With micro_batches > 1 it is traced on the example inputs' first
    1/micro_batches along dimension 0. Split points are recorded when
    `split_points` is true (default: the mesh has a "pp" axis of size > 1);
    the parameters' declared pipeline stages go with them."""
    return _trace(model, example_inputs, mesh, dp_axis, micro_batches, split_points)[0]


def _trace(model, example_inputs, mesh, dp_axis, micro_batches=1, split_points=None,
           even_splits=False, trains=False, recompute_layers=None):
    """(traced text, the Trace). `trains`: the program has a training step,
    so state the model updates by its own rules is recorded."""
    model._name_parameters()
    if split_points is None:
        split_points = _is_pipelined(mesh)
    trace = Trace("forward", split_points=split_points, updates_state=trains)
    trace.recompute_layers = dict(recompute_layers or {})
    if mesh is not None:
        trace.tracer.set_mesh("mesh", mesh.dim_names, mesh.shape, even_splits)
    inputs = []
    for i, value in enumerate(example_inputs):
        value = _micro_batch(value, micro_batches, i)
        array = _global_array(value)
        inputs.append(trace.argument(array.shape, array.dtype,
                                     sharding=_input_sharding(mesh, value, array.shape, dp_axis)))
    params = list(model.named_parameters())
    try:
        for name, p in params:
            sharding = None
            if p.placements is not None:
                if mesh is None:
                    raise ValueError(f"parameter {name} has placements but compile has no mesh")
                sharding = placements_to_sharding(mesh, p.placements, p.shape)
            stages = p.pipeline_stages if split_points and p.pipeline_stages else None
            p.traced = trace.argument(p.shape, p.dtype, param=name, sharding=sharding,
                                      pipeline_stages=stages)
        with tracing(trace):
            out = model(*inputs)
        loss = out[0] if isinstance(out, (tuple, list)) else out
        if not isinstance(loss, Tensor):
            raise TypeError(f"the model must return a traced Tensor, not {type(loss).__name__}")
        trace.tracer.finish([loss.handle] + [t.handle for _, t in trace.state_updates],
                            [name for name, _ in trace.state_updates])
    finally:
        for _, p in params:
            p.traced = None
    return trace.tracer.text(), trace


class Program:
    """A compiled model on every rank of its mesh."""

    def __init__(self, model, optimizer, traced, compiled, program_file, mesh, example_inputs,
                 seed=0, check_finite=False, timeout=60.0, abstract=False, trace=False,
                 state_values=None, device="cpu"):
        self.model, self.optimizer, self.mesh = model, optimizer, mesh
        self.traced_mlir, self.mlir, self.program_file = traced, compiled, program_file
        self.cluster = None  # what compile() chose collectives for (estimate()'s default)
        # `pipeline`: None, or the pipelined program's stages, virtual_stages,
        # micro_batches, schedule, axis, steps (per pipeline rank its
        # ("F" | "B", chunk, micro_batch) in order), inputs (micro-batch
        # specs) and state_stages ({state name: stages holding it}).
        self.num_ranks, self._signatures, self.pipeline = _ernie.describe(program_file)
        self._step_fn = "train_step" if optimizer is not None else "forward_grad"
        self.abstract = abstract
        self._inputs = [(a.shape, a.dtype) for a in map(_global_array, example_inputs)]
        self.step_count = 0
        self.last_io = None  # _record_io
        if abstract:  # compiled and planned, never run: nothing allocated
            self._session = None
            return
        # A model built under ernie.nn.abstract() has no values; its
        # pretrained_weights (from_pretrained) are loaded rank by rank once
        # the state exists (drawn from the seed first, then replaced).
        pretrained = getattr(model, "pretrained_weights", None) or {}
        values = {name: p.value for name, p in model.named_parameters() if p.value is not None}
        values.update(state_values or {})  # state the model updates by its own rules
        valueless = [name for name, p in model.named_parameters()
                     if p.value is None and name not in pretrained]
        if valueless:
            raise ValueError(f"parameters {valueless[:5]} have no values (the model was built "
                             f"under ernie.nn.abstract()): compile it with abstract=True, or "
                             f"build it with from_pretrained")
        self._session = _ernie.Session(program_file, timeout, check_finite, trace, device)
        if self.pipeline is not None:
            # Every stage's state, then @init.<s> (shared parameters'
            # replicas start equal): once, through train_step.
            self._session.init_state("train_step", values, seed)
        else:
            for fn in self.functions():
                if fn in ("train_step", "eval_step", "forward", "forward_grad"):
                    self._session.init_state(fn, values, seed)
        if pretrained:
            self.load_weights(pretrained)

    def functions(self):
        """The program file's functions (a pipelined program's are its
        stage functions: train_forward.<chunk>, train_backward.<chunk>,
        eval_forward.<chunk>, train_update.<stage>, init.<stage>)."""
        return list(self._signatures)

    @property
    def device(self) -> str:
        """Where the ranks compute: "cpu", or the CUDA device they share
        (its name and memory)."""
        return self._require_session().device

    @property
    def is_pipelined(self) -> bool:
        return self.pipeline is not None

    def _not_pipelined(self, what):
        if self.pipeline is not None:
            raise RuntimeError(f"{what} is not available on a pipelined program (pp > 1), which "
                               f"runs step() and eval() only: compile the model without a 'pp' "
                               f"axis for {what}")

    def _stage_report(self, size):
        """Per pipeline stage (its ranks): the state it holds, the gradients
        it sums over micro-batches, the residuals one micro-batch keeps from
        forward to backward and the most its schedule keeps at once
        (`activation_bytes`: 1F1B keeps p - s micro-batches, GPipe m), the
        largest arena, and the collectives of one step (the chunk functions
        once per micro-batch, the update once), sends to other stages and
        shared-parameter sums included."""
        bodies = _function_bodies(self.mlir)
        m = self.pipeline["micro_batches"]
        stages = []
        for s in range(self.pipeline["stages"]):
            fns = {f: sig for f, sig in self._signatures.items() if sig.get("stage") == s}
            # A state may appear in several of the stage's functions (a
            # master-weight update reads the master, not the parameter); the
            # layout it is held in is the training functions'.
            held = {}
            for f in sorted(fns, key=lambda f: not f.startswith("train_")):
                for a in fns[f]["arguments"]:
                    held.setdefault((a["role"], a["name"]), size(a))
            role_bytes = lambda role: sum(b for (r, _), b in held.items() if r == role)
            residual = {int(f.split(".")[1]): sum(size(r) for r in sig["results"]
                                                  if r["role"] == "residual")
                        for f, sig in fns.items() if f.startswith("train_forward.")}
            counts, volume = Counter(), Counter()
            for f in fns:
                if not f.startswith(("train_forward.", "train_backward.", "train_update.")):
                    continue
                calls = 1 if f.startswith("train_update.") else m
                body = bodies.get(f, "")
                for kind, c in [*collectives_of(body).items(), *_transfers_of(body).items()]:
                    counts[kind] += c["count"] * calls
                    volume[kind] += c["bytes"] * calls
            stages.append({
                "staged_bytes": sum(_staged_bytes(sig, size) for sig in fns.values()),
                "parameter_bytes": role_bytes("parameter"),
                "optimizer_state_bytes": role_bytes("optimizer_state"),
                "gradient_bytes": role_bytes("gradient"),
                "residual_bytes_per_micro_batch": sum(residual.values()),
                "activation_bytes": _peak_residuals(self.pipeline["steps"][s], residual),
                "arena_bytes": max((sig["arena_bytes"] for sig in fns.values()), default=0),
                "arena_bytes_by_function": {f: sig["arena_bytes"] for f, sig in sorted(fns.items())},
                "collectives": {k: {"count": counts[k], "bytes": volume[k]} for k in sorted(counts)},
            })
        return stages

    def _require_session(self):
        if self._session is None:
            raise RuntimeError("an abstract program is compiled and planned but never runs")
        return self._session

    def to_mlir(self) -> str:
        """The traced (unpartitioned) module."""
        return self.traced_mlir

    def _check_batch(self, batch):
        if len(batch) != len(self._inputs):
            raise ValueError(f"the model takes {len(self._inputs)} inputs, got {len(batch)}")
        out = []
        for i, (x, (shape, dtype)) in enumerate(zip(batch, self._inputs)):
            x = _global_array(x)
            if x.shape != shape:
                raise ValueError(f"input {i} has shape {list(x.shape)}, compiled for {list(shape)}")
            if x.dtype != dtype:
                raise TypeError(f"input {i} has dtype {x.dtype}, compiled for {dtype}")
            out.append(np.ascontiguousarray(x))
        return out

    def _call(self, fn, batch, *args, updates=True):
        """Runs `fn`; results of narrow float types (bf16, fp8), which the
        runtime hands over as raw bits, come back as float32 values. With
        `updates=False` the results that update state are None (the state
        stays on the ranks, not copied out)."""
        results = self._require_session().call(fn, batch, *args, updates=updates)
        if fn not in self._signatures:  # a pipelined step: the f32 loss
            return list(results)
        kinds = [r["dtype"] for r in self._signatures[fn]["results"]]
        return [_ernie.convert_float(np.ascontiguousarray(r), kind, "f32").reshape(np.shape(r))
                if r is not None and kind in ("bf16", "f8E4M3FN", "f8E5M2") else r
                for r, kind in zip(results, kinds)]

    def step(self, *batch) -> float:
        """One training step on a global batch; returns the loss."""
        if self.optimizer is None:
            raise RuntimeError("compiled without an optimizer: use grad()")
        batch = self._check_batch(batch)
        self.step_count += 1
        lr = self.optimizer.get_lr(self.step_count)
        (loss, *_rest) = self._call("train_step", batch, lr, self.step_count,
                                    updates=False)
        return float(loss)

    def eval(self, *batch) -> float:
        """The loss on a global batch, parameters unchanged (a pipelined
        program: the mean over its micro-batches)."""
        if self.pipeline is not None:
            fn = "eval_step"
            if not any(f.startswith("eval_forward.") for f in self.functions()):
                raise RuntimeError("this pipelined program has no evaluation step")
        else:
            fn = "eval_step" if "eval_step" in self.functions() else "forward"
        (loss, *_rest) = self._call(fn, self._check_batch(batch))
        return float(loss)

    def forward(self, *batch):
        """The model's output (global) on a batch."""
        self._not_pipelined("forward()")
        return self._call("forward", self._check_batch(batch))[0]

    def grad(self, *batch):
        """(loss, {parameter: gradient}) at the current parameters."""
        self._not_pipelined("grad()")
        results = self._call("forward_grad", self._check_batch(batch))
        names = [r["name"] for r in self._signatures["forward_grad"]["arguments"]
                 if r["role"] == "parameter"]
        return float(results[0]), OrderedDict(zip(names, results[1:]))

    def _state_names(self):
        if self.pipeline is not None:
            # Each stage's update takes its parameters and slots; a shared
            # parameter's replicas are one state (the session reads the
            # first holding stage's).
            names = []
            for s in range(self.pipeline["stages"]):
                sig = self._signatures.get(f"train_update.{s}", {"arguments": []})
                names += [a["name"] for a in sig["arguments"]
                          if a["role"] in ("parameter", "optimizer_state") and a["name"] not in names]
            names += [n for n in self.pipeline["state_stages"] if n not in names]
            # As a program that is not pipelined orders them: the parameters
            # in the model's order, then each one's optimizer slots.
            roles = {a["name"]: a["role"] for sig in self._signatures.values()
                     for a in sig["arguments"]}
            params = [n for n, _ in self.model.named_parameters() if n in names]
            params += [n for n in names if roles.get(n) == "parameter" and n not in params]
            slots = [n for p in params for n in names if n.startswith(p + ":")]
            ordered = params + slots
            return "train_step", ordered + [n for n in names if n not in ordered]
        fn = self._step_fn if self._step_fn in self.functions() else "forward"
        return fn, [a["name"] for a in self._signatures[fn]["arguments"]
                    if a["role"] in ("parameter", "optimizer_state")]

    STEP_KEY = "optimizer.step"

    def state_dict(self):
        """Global parameters and optimizer state, gathered from every rank;
        with an optimizer also the number of steps taken (`STEP_KEY`), which
        AdamW's bias correction and the learning-rate schedule read, so a
        program loading the dictionary continues as this one would."""
        fn, names = self._state_names()
        state = OrderedDict((n, self._require_session().state(fn, n)) for n in names)
        if self.optimizer is not None:
            state[self.STEP_KEY] = np.array(self.step_count, dtype=np.int64)
        return state

    def load_state_dict(self, state, strict=True):
        """Sets parameters and optimizer state from global arrays (and the
        step count from `STEP_KEY`). Every value is checked against the
        program first (dtype kind, global shape) and nothing changes unless
        all pass. `strict` (the default, as in PyTorch): every state name
        must be given and nothing else (`STEP_KEY` is always allowed);
        otherwise a KeyError names the missing and unexpected keys.
        `strict=False` loads what matches and returns PyTorch's
        `(missing_keys, unexpected_keys)` named tuple."""
        fn, names = self._state_names()
        state = dict(state)
        step = state.pop(self.STEP_KEY, None)
        if step is not None:  # set once the tensors are in (ignored without an optimizer)
            step = np.asarray(step)
            if step.shape != () or step.dtype.kind not in "iu" or int(step) < 0:
                raise ValueError(f"load_state_dict: {self.STEP_KEY!r} must be a "
                                 f"non-negative integer scalar, not {step!r}")
            step = int(step)
        missing = [n for n in names if n not in state]
        unexpected = sorted(k for k in state if k not in names)
        if strict and (missing or unexpected):
            raise KeyError("load_state_dict: "
                           + "; ".join(([f"missing keys {missing}"] if missing else [])
                                       + ([f"unexpected keys {unexpected}"]
                                          if unexpected else []))
                           + " (strict=False loads the rest)")
        for k in unexpected:
            del state[k]
        specs = {a["name"]: a for sig in self._signatures.values() for a in sig["arguments"]
                 if a["role"] in ("parameter", "optimizer_state")}
        state = {name: _check_state_value(name, value, specs[name]) if name in specs
                 else np.ascontiguousarray(value) for name, value in state.items()}
        if self.pipeline is not None:  # every stage holding a name gets it
            for name, value in state.items():
                self._require_session().set_state(fn, name, np.ascontiguousarray(value))
        else:
            for f in self.functions():
                if f in ("train_step", "eval_step", "forward", "forward_grad"):
                    sig = [a["name"] for a in self._signatures[f]["arguments"]]
                    for name, value in state.items():
                        if name in sig:
                            self._require_session().set_state(f, name,
                                                              np.ascontiguousarray(value))
        if step is not None and self.optimizer is not None:
            self.step_count = step
        return IncompatibleKeys(missing, unexpected)

    def save_checkpoint(self, directory, keep=None, data_position=None, progress=False):
        """Saves the state as a distributed checkpoint `directory/step-<N>`:
        each rank writes the pieces it owns (safetensors, a replicated piece
        once), then a manifest of global shapes and offsets, the step, the
        optimizer's hyper-parameters, the mesh and `data_position` (any
        JSON value, given back by load_checkpoint). Atomic: a temporary
        directory renamed into place once complete. `keep` keeps the newest
        `keep` checkpoints at or below this step (a higher step is another
        run's: neither counted nor removed; docs/integrity.md). With
        `progress`, progress and MB/s go to stderr;
        `last_io` has the bytes written and the seconds either way. Returns
        the checkpoint's directory."""
        if keep is not None and (not isinstance(keep, int) or isinstance(keep, bool) or keep < 1):
            raise ValueError(f"keep is a positive number of checkpoints, not {keep!r}")
        metadata = {"data_position": data_position,
                    "optimizer": _optimizer_description(self.optimizer),
                    "mesh": (None if self.mesh is None else
                             {"dim_names": list(self.mesh.dim_names),
                              "shape": list(self.mesh.shape)})}
        try:
            text = json.dumps(metadata)
        except TypeError as e:
            raise TypeError(f"data_position must be JSON-serialisable: {e}") from None
        path, nbytes, seconds = self._require_session().save_checkpoint(
            str(directory), self.step_count, text, keep or 0, progress)
        self._record_io(nbytes, seconds)
        return path

    def load_checkpoint(self, directory, progress=False):
        """Loads a checkpoint saved by save_checkpoint on any mesh, plan,
        ZeRO level or pipeline split: each rank reads only the byte ranges
        of its own pieces, each block's checksum verified before any state
        changes. `directory` is a checkpoint or a directory of them (the
        newest one whose files are all present is taken). Sets the step count;
        returns the saved metadata ({"data_position": ..., ...}). `progress`
        and `last_io` as in save_checkpoint."""
        step, text, nbytes, seconds = self._require_session().load_checkpoint(
            str(directory), progress)
        self._record_io(nbytes, seconds)
        if self.optimizer is not None:
            self.step_count = int(step)
        return json.loads(text)

    def _record_io(self, nbytes, seconds):
        """`last_io`: what the last checkpoint or weight transfer moved."""
        self.last_io = {"bytes": int(nbytes), "seconds": float(seconds),
                        "mb_per_s": nbytes / 1e6 / seconds if seconds > 0 else float("inf")}

    def load_weights(self, weights, progress=False):
        """Sets parameters from tensors in safetensors files, each rank
        reading only the byte ranges of its own pieces (and master weights
        with their parameters). `weights`: {parameter: [(file, tensor,
        offsets, transposed)]}, the blocks covering each parameter exactly
        once (`offsets` where the block starts in the parameter;
        `transposed`: the file holds the block with its last two dimensions
        swapped, as Hugging Face's [out, in] Linears; a file tensor of lower
        rank is a block with leading unit dimensions, as one expert of
        stacked experts). Floats convert to the parameter's dtype
        (round to nearest even). All or nothing; errors name the file and
        the tensor. Returns the names set; `last_io` as in save_checkpoint."""
        spec = {}
        for name, blocks in dict(weights).items():
            spec[name] = [(str(file), str(tensor), [int(o) for o in offsets], bool(transposed))
                          for file, tensor, offsets, transposed in blocks]
        names, nbytes, seconds = self._require_session().load_weights(spec, progress)
        self._record_io(nbytes, seconds)
        return names

    def load_pretrained(self, folder, progress=False):
        """Sets the parameters from a Hugging Face folder of the model's own
        config (`model.hf_weight_map`), rank by rank (load_weights)."""
        if not hasattr(self.model, "hf_weight_map"):
            raise TypeError(f"{type(self.model).__name__} has no Hugging Face layout "
                            f"(hf_weight_map); use load_weights with a weight map")
        return self.load_weights(self.model.hf_weight_map(folder), progress)

    def write_trace(self, path):
        """The timeline of every instruction on every rank so far, as a
        Chrome-trace / Perfetto JSON file (compile(..., trace=True))."""
        self._require_session().write_trace(str(path))

    def save(self, path):
        """Writes the program file `ernie-run` runs."""
        with open(path, "wb") as f:
            f.write(self.program_file)

    def estimate(self, cluster=None) -> dict:
        """The cost model's prediction of one training step on `cluster` (a
        shipped cluster name such as "dgx_h100", a JSON file, a dict, or
        ernie.cost.calibrate_cpu()'s measured CPU; None: the cluster the
        program was compiled for): ernie.cost.estimate's breakdown (step,
        compute, exposed communication per axis, bubble, recompute, MFU). It
        needs no values: abstract programs estimate too."""
        from . import cost
        cluster = cluster if cluster is not None else self.cluster
        if cluster is None:
            raise ValueError("estimate() needs a cluster: this program was compiled without one")
        return cost.estimate(self.mlir, cluster)

    def report(self):
        """Per rank: each function's arena (the planned peak), the bytes of
        parameters, gradients and optimizer state (`model_state_bytes`,
        ZeRO's figure), the activations the forward keeps for the backward
        (`activation_bytes`), the padding uneven splits add to the step's
        arguments (`padding_bytes`, per function too), the collectives of
        one step, and the most any rank holds at once
        (`peak_bytes_per_rank`)."""
        out = {"ranks": self.num_ranks, "functions": {},
               "gemm": _ernie.gemm_library()}  # which CPU GEMM kernels run
        axis_sizes = dict(zip(self.mesh.dim_names, self.mesh.shape)) if self.mesh else {}
        size = lambda t: math.prod(t["local_shape"]) * _BYTES[t["dtype"]]
        for fn, sig in self._signatures.items():
            local = lambda role: sum(size(a) for a in sig["arguments"] if a["role"] == role)
            out["functions"][fn] = {"arena_bytes": sig["arena_bytes"],
                                    "staged_bytes": _staged_bytes(sig, size),
                                    "parameter_bytes": local("parameter"),
                                    "optimizer_state_bytes": local("optimizer_state"),
                                    "padding_bytes": sum(_padding(a, axis_sizes) for a in sig["arguments"]),
                                    # dispatched per call, and before --ernie-fuse
                                    "instructions": sig["instructions"],
                                    "unfused_instructions": sig["unfused_instructions"]}
        main = "train_step" if "train_step" in out["functions"] else next(iter(out["functions"]), None)
        # What uneven splits cost: the padding each rank's arguments hold.
        out["padding_bytes"] = out["functions"][main]["padding_bytes"] if main else 0
        if "forward_grad" in self._signatures:
            # Gradients as the step holds them: the gradient function's results.
            grads = sum(size(r) for r in self._signatures["forward_grad"]["results"]
                        if r["role"] != "loss")
            step = out["functions"].get("train_step", out["functions"]["forward_grad"])
            out["gradient_bytes"] = grads
            out["model_state_bytes"] = (step["parameter_bytes"] + grads +
                                        step["optimizer_state_bytes"])
        # What the forward keeps for the backward (the memory plan at the
        # loss of the gradient function): Korthikanti et al.'s activations.
        activations = getattr(self, "_activation_bytes", None)
        if activations is None:  # not from compile(): plan the module again
            planned, _, _ = _ernie.compile(self.mlir, "builtin.module(ernie-memory-plan)",
                                           write_program=False)
            activations = {name: int(v) for name, v in _ACTIVATION_BYTES.findall(planned)}
        for name, value in activations.items():
            if name in out["functions"]:
                out["functions"][name]["activation_bytes"] = int(value)
        if "forward_grad" in out["functions"]:
            out["activation_bytes"] = out["functions"]["forward_grad"].get("activation_bytes", 0)
        # What --ernie-recompute copied into the backward: ops (a fused
        # region of copies counts once) of one rank's program.
        out["recompute"] = dict(getattr(self, "recompute", {"mode": "none", "layers": []}),
                                recomputed_ops=len(_RECOMPUTED.findall(self.mlir)))
        if self.pipeline is not None:
            out["pipeline"] = {k: self.pipeline[k] for k in
                               ("stages", "virtual_stages", "micro_batches", "schedule")}
            out["stages"] = self._stage_report(size)
            # One rank of every stage together: a step's collectives.
            total = {}
            for stage in out["stages"]:
                for kind, c in stage["collectives"].items():
                    t = total.setdefault(kind, {"count": 0, "bytes": 0})
                    t["count"] += c["count"]
                    t["bytes"] += c["bytes"]
            out["collectives"] = dict(sorted(total.items()))
            # The fullest stage: its held state, accumulated gradients,
            # the residuals its schedule keeps and its largest arena.
            out["peak_bytes_per_rank"] = max(
                st["parameter_bytes"] + st["optimizer_state_bytes"] + st["gradient_bytes"] +
                st["activation_bytes"] + st["arena_bytes"] + st["staged_bytes"]
                for st in out["stages"])
            return out
        step = "train_step" if "train_step" in self.functions() else self.functions()[0]
        out["collectives"] = collectives_of(self.mlir, step)
        # Held state (parameters, optimizer state), the step's planned
        # arena (gradients and activations at their peak among them) and
        # its inputs, copied in beside it.
        fn = out["functions"][step]
        out["peak_bytes_per_rank"] = (fn["parameter_bytes"] + fn["optimizer_state_bytes"] +
                                      fn["arena_bytes"] + fn["staged_bytes"])
        return out


def _padding(tensor, axis_sizes):
    """Bytes of `tensor`'s local piece that are padding on an average rank:
    the piece less its share of the global tensor (0 unless a dimension is
    split unevenly over its mesh axes, `axis_sizes` by name)."""
    share = 1.0
    for d, g in enumerate(tensor["global_shape"]):
        axes = tensor["sharding"][d] if d < len(tensor["sharding"]) else []
        share *= g / math.prod(axis_sizes[a] for a in axes)
    return int(round((math.prod(tensor["local_shape"]) - share) * _BYTES[tensor["dtype"]]))


def _optimizer_description(optimizer):
    """The optimizer's class and plain hyper-parameters, for a manifest."""
    if optimizer is None:
        return None
    plain = {k: v for k, v in vars(optimizer).items()
             if isinstance(v, (int, float, str, bool, type(None)))}
    return {"type": type(optimizer).__name__, **plain}


def _peak_residuals(steps, residual_bytes):
    """The most residual bytes a rank holds at once while running `steps`:
    a forward of chunk c adds residual_bytes[c] until its backward."""
    live = best = 0
    for action, chunk, _mb in steps:
        live += residual_bytes.get(chunk, 0) * (1 if action == "F" else -1)
        best = max(best, live)
    return best


# An op of a function body (4 spaces in; a fused region's members are deeper)
# marked as recomputed.
_RECOMPUTED = re.compile(r"^    %\S.*\bernie\.recomputed\b", re.M)
_ACTIVATION_BYTES = re.compile(r"func\.func (?:private )?@(\w+)\(.*ernie\.activation_bytes = (\d+)")
_COLLECTIVE = re.compile(r"ernie\.(all_reduce|all_gather|reduce_scatter|all_to_all|collective_permute_start)"
                         r" %\S+ over "
                         r"@\w+\[([\w, ]+)\][^:]*: tensor<([0-9x]*)x?(\w+)>")

# A bucket (--ernie-bucket-gradients): one collective of all its inputs,
# counted as the blocking op it stands for, by its inputs' bytes.
_BUCKET = re.compile(r"ernie\.(all_reduce|reduce_scatter|all_gather)_start [^\n]*? over "
                     r"@\w+\[([\w, ]+)\]([^:\n]*): ([^\n]*?)(?: -> [^\n]*)?$", re.M)
_TENSOR = re.compile(r"tensor<([0-9x]*)x?(\w+)>")

# Pipeline transfers: a send to another stage, a sum among a shared
# parameter's stages (what each rank puts on the wire per call).
_TRANSFER = re.compile(r"ernie\.(send|stage_all_reduce) %\S+ (?:to stage|over stages)"
                       r"[^:]*: tensor<([0-9x]*)x?(\w+)>")


def _transfers_of(body: str):
    """{kind: {count, bytes}} of the pipeline transfers in a function body."""
    out = {}
    for kind, dims, dtype in _TRANSFER.findall(body):
        entry = out.setdefault(kind, {"count": 0, "bytes": 0})
        entry["count"] += 1
        entry["bytes"] += int(np.prod([int(d) for d in dims.split("x") if d])) * _BYTES.get(dtype, 4)
    return out


def _function_bodies(module_text: str):
    """{name: body text} of every function in a printed module."""
    starts = [(m.group(1), m.start()) for m in re.finditer(r"func\.func (?:private )?@([\w.]+)", module_text)]
    return {name: module_text[start:(starts[i + 1][1] if i + 1 < len(starts) else len(module_text))]
            for i, (name, start) in enumerate(starts)}


def collectives_of(module_text: str, function: str | None = None):
    """{"kind[axes]": {count, bytes per rank}} of the collectives one call of
    `function` runs (its callees included), or of the whole module."""
    text = module_text
    if function is not None:
        bodies = _function_bodies(module_text)
        seen, todo, text = set(), [function], ""
        while todo:
            name = todo.pop()
            if name in seen or name not in bodies:
                continue
            seen.add(name)
            text += bodies[name]
            todo += re.findall(r"call @(\w+)", bodies[name])
    counts = Counter()
    volume = Counter()
    for kind, axes, dims, dtype in _COLLECTIVE.findall(text):
        shape = [int(d) for d in dims.split("x") if d]
        key = f"{kind}[{axes}]"
        counts[key] += 1
        volume[key] += int(np.prod(shape)) * _BYTES.get(dtype, 4)
    for kind, axes, attrs, types in _BUCKET.findall(text):
        key = f"{kind}[{axes}]"
        counts[key] += 1
        # Narrow floats a bucket accumulates in f32 travel widened.
        widened = "accumulate = f32" in attrs
        for dims, dtype in _TENSOR.findall(types):
            width = 4 if widened and dtype in ("bf16", "f16") else _BYTES.get(dtype, 4)
            volume[key] += int(np.prod([int(d) for d in dims.split("x") if d])) * width
    return {k: {"count": counts[k], "bytes": volume[k]} for k in sorted(counts)}


def _check_micro_batches(example_inputs, micro_batches, mesh, dp_axis):
    """Each input splits into `micro_batches` micro-batches along dimension
    0, and each micro-batch over data parallelism."""
    dp = mesh.get_dim_size(dp_axis) if dp_axis and dp_axis in mesh.dim_names else 1
    for i, value in enumerate(example_inputs):
        micro = _global_array(_micro_batch(value, micro_batches, i))
        if dp > 1 and not isinstance(value, DistTensor) and micro.shape[0] % dp:
            raise ValueError(f"input {i}: a micro-batch has {micro.shape[0]} rows ({micro.shape[0] * micro_batches} "
                             f"/ accumulate_steps={micro_batches}), which do not divide over "
                             f"{dp_axis}={dp}")


def _check_split_points(model, mesh, pipeline, trace):
    if trace.split_point_count == 0:
        raise ValueError(f"the mesh has pp={mesh.get_dim_size('pp')} but the model places no split "
                         f"point: give pp_config.split_spec, build a PipelineLayer, or call "
                         f"ernie.functional.split_point")
    layers = dict(model.named_sublayers())
    for name in pipeline["split_layers"]:
        if id(layers[name]) not in trace.split_layers_reached:
            raise ValueError(f"split_spec places a split point at layer {name!r}, which the "
                             f"model's forward never calls")


def compile(model: Module, optimizer: Optimizer | None, example_inputs, mesh: ProcessMesh | None = None,  # noqa: A001
            config=None, seed=0, check_finite=False, timeout=60.0, differentiate=True,
            abstract=False, trace=False, fp8_config=None, fuse=True, device="cpu",
            cluster=None) -> Program:
    """Traces `model` on `example_inputs` (global numpy arrays or
    DistTensors), differentiates it, builds the training step for
    `optimizer` (None: gradients only), partitions it over `mesh` and loads
    it on every rank. With differentiate=False the model may return any
    tensor (logits, say) and the program has only @forward. With
    abstract=True nothing is loaded or allocated (build the model under
    ernie.nn.abstract()): the program is compiled and planned, and report()
    gives its per-rank memory. `fp8_config` ({"recipe": "current",
    "fwd_format": "e4m3", "grad_format": "e5m2", "exclude": regex, "include":
    regex}, or `config["fp8_config"]`) runs the linear layers' GEMMs in FP8
    (--ernie-fp8-lowering). `fuse=False` keeps every elementwise op its own
    loop (no --ernie-fuse; report()'s `instructions` shows the difference).
    `device` is where every rank computes: "cpu", or "cuda" / "cuda:N" (all
    ranks threads on that GPU, collectives as device copies; a build without
    CUDA, or a machine without a GPU, says so when the program loads — the
    CUDA backend has not yet run on a GPU, docs/architecture.md).
    `cluster` (a shipped cluster name such as "dgx_h100", a JSON file or a
    dict, as ernie.cost.load_cluster takes) is what the program will run
    on: sharding propagation and partition then weigh each collective by
    its time there (latency and the links its group crosses) instead of by
    its bytes, and estimate() defaults to it.

    A mesh with a "pp" axis of size > 1 pipelines the model (it needs an
    optimizer): split points come from `pp_config.split_spec`, a
    PipelineLayer or `ernie.functional.split_point`; the model is traced on
    one micro-batch (dimension 0 of the example inputs divided by
    `pp_config.accumulate_steps`, which must then divide over dp), and the
    program runs step() and eval() on global batches."""
    if not differentiate and optimizer is not None:
        raise ValueError("an optimizer needs differentiate=True")
    if not isinstance(device, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise ValueError(f"device {device!r}: expected 'cpu', 'cuda' or 'cuda:N'")
    from .distributed import parallelize
    if config is not None and (set(config) - {"recompute"} or mesh is not None or get_mesh()):
        parallelize(model, optimizer, mesh, config)
    plan = getattr(model, "_ernie_plan", None)
    recompute, recompute_layers = recompute_plan(
        model, config["recompute"] if config and "recompute" in config
        else (plan.get("recompute") if plan else None))
    if recompute != "none" and not (differentiate and optimizer is not None):
        raise ValueError(f"recompute {recompute!r} recomputes activations for a training step's "
                         "backward: it needs an optimizer and differentiate=True")
    mesh = mesh or (plan["mesh"] if plan else None) or get_mesh()
    dp_axis = plan["dp_axis"] if plan else ("dp" if mesh is not None and "dp" in mesh.dim_names else None)
    zero_level = max(plan.get("sharding_level", 0) if plan else 0,
                     getattr(optimizer, "sharding_level", 0) if optimizer is not None else 0)
    zero_axis = getattr(optimizer, "sharding_axis", None) or dp_axis or "dp"
    if zero_level:
        if optimizer is None:
            raise ValueError("ZeRO (sharding_level > 0) shards optimizer state: it needs an optimizer")
        if mesh is None or zero_axis not in mesh.dim_names:
            raise ValueError(f"ZeRO shards over mesh dimension {zero_axis!r}, which the mesh lacks")
    pipeline = None
    if _is_pipelined(mesh):
        if not differentiate or optimizer is None:
            raise ValueError("a pipelined program (a 'pp' mesh axis of size > 1) trains: it needs "
                             "an optimizer and differentiate=True")
        pipeline = configure_pipeline(model, mesh, plan.get("pp_config") if plan else None)
        _check_micro_batches(example_inputs, pipeline["accumulate_steps"], mesh, dp_axis)
    batch_axes = (plan.get("batch_axes") if plan else None) or dp_axis
    traced, trace_state = _trace(model, example_inputs, mesh, batch_axes,
                                 pipeline["accumulate_steps"] if pipeline else 1,
                                 split_points=pipeline is not None,
                                 even_splits=bool(plan and plan.get("even_splits")),
                                 trains=differentiate and optimizer is not None,
                                 recompute_layers=recompute_layers)
    if pipeline is not None:
        _check_split_points(model, mesh, pipeline, trace_state)
    with _cluster_file(cluster if mesh is not None else None) as cluster_file:
        compiled, program_file, activations = _ernie.compile(
            traced, _pipeline(optimizer, mesh is not None, differentiate, zero_level, zero_axis,
                              overlap=bool(plan and plan.get("sequence_parallel_overlap")),
                              fp8_config=fp8_config if fp8_config is not None
                              else (plan.get("fp8_config") if plan else None),
                              pipeline=pipeline, fuse=fuse,
                              buckets=plan.get("gradient_buckets") if plan else None,
                              recompute=recompute, cluster_file=cluster_file))
    program = Program(model, optimizer, traced, compiled, program_file, mesh, example_inputs,
                      seed=seed, check_finite=check_finite, timeout=timeout, abstract=abstract,
                      trace=trace, state_values=trace_state.state_values, device=device)
    program.cluster = cluster
    program.recompute = {"mode": recompute, "layers": list(recompute_layers.values())}
    program._activation_bytes = activations
    return program

"""ernie.compile: trace a model, run the C++ pipeline, load the runtime.

The pipeline is the one `ernie-opt` runs — `--ernie-autodiff` (with the
optimizer's options) then `--ernie-auto-parallel-pipeline` when there is a
mesh — and the program file is the one `ernie-run` reads. Every rank runs as
a thread of this process (the runtime's Session), or under a multi-process
launch (`ernie.distributed.init_parallel_env`) this process's block of ranks:
every process compiles the same program and runs its own ranks, groups that
span processes meeting over Gloo (docs/guide/devices.md).

A mesh with a "pp" axis of size > 1 makes a pipelined program: the model is
traced on one micro-batch (the example inputs' dimension 0 divided by
`pp_config.accumulate_steps`) with its split points recorded, and the
pipeline becomes `--ernie-pipeline-split`, `--ernie-shared-weight-dedup`,
`--ernie-autodiff`, [ZeRO, FP8], partition, [overlap], then
`--ernie-pipeline-schedule`. Such a program runs `step` and `eval` only (the
runtime splits each global batch into the micro-batches itself).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
from collections import Counter, OrderedDict, namedtuple

import numpy as np

from . import _ernie, cost_model
from .distributed import DistTensor, parallel_env, parallelize
from .mesh import ProcessMesh, Replicate, Shard, get_mesh, placements_to_sharding
from .nn import Module
from .pipeline import configure as configure_pipeline
from .optimizer import Optimizer
from .strategy import FP8, UNSET, Recompute, Strategy
from .tensor import ERNIE_TO_NUMPY, Trace, Tensor, dtype_name, tracing

_BYTES = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "f8E4M3FN": 1, "f8E5M2": 1,
          "i64": 8, "i32": 4, "i1": 1}


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


def recompute_plan(model: Module, spec) -> tuple[str, dict]:
    """`recompute` (a mode string, a bool, {"granularity", "layers"} or a
    Strategy's Recompute) as (mode, {id(layer): name}): the layers whose
    ops are marked for --ernie-recompute (Recompute.plan)."""
    return Recompute.from_config(spec).plan(model)


def pipeline_options(optimizer: Optimizer | None, partition: bool, differentiate: bool,
                     zero_level: int = 0, zero_axis: str = "dp", overlap: bool = False,
                     fp8_config=None, pipeline: dict | None = None,
                     fuse: bool = True, buckets: dict | None = None, recompute: str = "none",
                     cluster=None) -> _ernie.TrainingPipelineOptions:
    """The C++ training pipeline's options (`--ernie-training-pipeline`;
    str() of them is its option text). `pipeline` (a pipelined compile):
    stages, virtual_stages, accumulate_steps, schedule and
    gradient_accumulation_fusion. `buckets`: dp_config's bucket_mb and
    grad_reduce_dtype (default 25 MiB, f32). `recompute`: none, selective or
    full. `fp8_config`: an FP8 section or its dict. `cluster` (a name, file or dict): propagation and partition choose
    layouts and collectives by their time on it, not by bytes."""
    options = _ernie.TrainingPipelineOptions()
    options.differentiate = differentiate
    options.partition = partition
    if optimizer is not None:
        for key, value in optimizer.pass_options().items():
            setattr(options, key.replace("-", "_"), value)
    if pipeline is not None:
        options.pipeline_stages = pipeline["stages"]
        options.virtual_stages = pipeline["virtual_stages"]
        options.micro_batches = pipeline["accumulate_steps"]
        options.schedule = pipeline["schedule"]
        # Megatron's flag: off, the gradient sum is added to after each GEMM.
        options.accumulate = "gemm" if pipeline.get("gradient_accumulation_fusion", True) else "add"
    if zero_level:
        options.zero_level = zero_level
        options.zero_axis = zero_axis
    if fp8_config is not None:  # a Strategy's FP8, or its fp8_config dict
        options.fp8 = True
        for key, value in FP8.from_config(fp8_config).to_config().items():
            setattr(options, f"fp8_{key}", value)
    options.recompute = recompute
    options.sequence_parallel_overlap = overlap
    buckets = buckets or {}
    options.grad_reduce = "native" if buckets.get("grad_reduce_dtype") == "native" else "f32"
    bucket_mb = buckets.get("bucket_mb", 25)
    options.bucket_bytes = int(bucket_mb * 2**20) if bucket_mb > 0 else 0
    if bucket_mb > 0 and options.bucket_bytes == 0:
        raise ValueError(f"dp_config.bucket_mb={bucket_mb!r} is less than a byte: give 0 for no buckets")
    options.fuse = fuse
    if cluster is not None:
        spec = cost_model.load_cluster(cluster)
        # Named as the user named it: a bad field's error names the file.
        name = os.path.basename(str(cluster)).removesuffix(".json") \
            if isinstance(cluster, (str, os.PathLike)) else "cluster"
        options.set_cluster(json.dumps(spec), name)
    return options


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
    return _trace(model, example_inputs, mesh, dp_axis, micro_batches, split_points)[0].text()


def _trace(model, example_inputs, mesh, dp_axis, micro_batches=1, split_points=None,
           even_splits=False, trains=False, recompute_layers=None):
    """(traced module, the Trace). `trains`: the program has a training step,
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
        trace.tracer.finish([loss.handle] + [t.handle for _, t in trace.state_updates]
                            + [t.handle for _, t in trace.metrics],
                            [name for name, _ in trace.state_updates],
                            [name for name, _ in trace.metrics])
    finally:
        for _, p in params:
            p.traced = None
    return trace.tracer.module(), trace


def _abbreviated(rows) -> str:
    rows = np.asarray(rows).ravel().tolist()
    return str(rows) if len(rows) <= 8 else f"[{', '.join(map(str, rows[:6]))}, ... ({len(rows)} rows)]"


def _job_identity(program_file: bytes, values: dict, pretrained: dict, seed: int) -> str:
    """What every process of a job must agree on before it starts: the
    program file and the initial state (values, pretrained weights' files,
    the seed), each as a hash, as "key=value" lines."""
    state = hashlib.blake2b(digest_size=16)
    for name in sorted(values):
        v = np.ascontiguousarray(values[name])
        state.update(f"{name}:{v.dtype.str}:{v.shape};".encode())
        state.update(v.reshape(-1).view(np.uint8))
    for name in sorted(pretrained):
        state.update(f"{name}<-{pretrained[name]!r};".encode())
    program = hashlib.blake2b(program_file, digest_size=16).hexdigest()
    return (f"program hash={program}\ninitial state hash={state.hexdigest()}\n"
            f"seed={seed}")


def _finite_check(check) -> str:
    """compile()'s `check_finite` as the runtime's word."""
    if check is True or check is False:
        return "results" if check else "off"
    if check in ("off", "results", "tensors"):
        return check
    raise ValueError(f"check_finite must be True, False, 'off', 'results' or 'tensors', "
                     f"not {check!r}")


def _as_module(module):
    """A module handle from a handle or module text."""
    return module if isinstance(module, _ernie.Module) else _ernie.parse_module(module)


class Program:
    """A compiled model on every rank of its mesh."""

    def __init__(self, model, optimizer, traced, compiled, program_file, mesh, example_inputs,
                 seed=0, check_finite=False, timeout=60.0, abstract=False, trace=False,
                 state_values=None, device="cpu", plan_report=None):
        self.model, self.optimizer, self.mesh = model, optimizer, mesh
        # The traced and compiled modules stay in C++; text on request.
        self.traced_module, self.module = _as_module(traced), _as_module(compiled)
        self.program_file = program_file
        self.pipeline_options = None  # what compile() ran (str(): ernie-opt's options)
        self._plan_report = plan_report  # JSON text; planned from `compiled` when None
        self.cluster = None  # what compile() chose collectives for (estimate()'s default)
        # `pipeline`: None, or the pipelined program's stages, virtual_stages,
        # micro_batches, schedule, axis, steps (per pipeline rank its
        # ("F" | "B", chunk, micro_batch) in order), inputs (micro-batch
        # specs) and state_stages ({state name: stages holding it}).
        self._step_fn = "train_step" if optimizer is not None else "forward_grad"
        self.abstract = abstract
        self._inputs = [(a.shape, a.dtype) for a in map(_global_array, example_inputs)]
        self.step_count = 0
        self.last_metrics = {}  # the last step's metrics by name (grad_norm)
        self.eval_metrics = {}  # the last eval's metrics (aux_loss, lm_loss)
        self.last_io = None  # _record_io
        self.job = None  # the ParallelEnv of a multi-process job
        self._local_rows = None
        if abstract:  # compiled and planned, never run: nothing allocated
            self.num_ranks, self._signatures, self.pipeline = _ernie.describe(program_file)
            self._session = None
            return
        job = parallel_env()
        self.job = job if job.is_multi_process else None
        self._session_args = (timeout, trace, device, seed, state_values)
        self._open_session(_finite_check(check_finite))

    def _open_session(self, check_finite: str):
        """Loads the program on this process's ranks with its initial state:
        the parameters the model holds (or drew from the seed), then its
        pretrained weights."""
        timeout, trace, device, seed, state_values = self._session_args
        model, program_file = self.model, self.program_file
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
        job = self.job
        if job is None:
            self._session = _ernie.Session(program_file, timeout, check_finite, trace, device)
        else:
            # This process runs its own ranks; every process must have
            # compiled the same program from the same initial state.
            self._session = _ernie.Session(
                program_file, timeout, check_finite, trace, device,
                job={"process": job.rank, "processes": job.world_size,
                     "ranks_per_process": job.ranks_per_process,
                     "store_address": job.store_address, "hostname": job.hostname},
                identity=_job_identity(program_file, values, pretrained, seed))
        # Described from the program the session decoded: the bytes once.
        self.num_ranks, self._signatures, self.pipeline = self._session.describe()
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

    def reopen(self, check_finite=False) -> None:
        """Loads the program afresh, at its initial state and step 0, with
        `check_finite` (as compile()'s): a session a failed call stopped
        (a NaN found, a rank that failed) cannot run again, and a replay
        that checks every tensor starts here (then load_checkpoint()). One
        process only: the processes of a job meet once per session."""
        if self._session is None:
            raise RuntimeError("an abstract program is never loaded")
        if self.job is not None:
            raise RuntimeError("reopen() runs in one process; a job's processes meet once per "
                               "session (launch the job again)")
        check = _finite_check(check_finite)
        self._session = None  # the old ranks stop before the new ones start
        self.step_count = 0
        self.last_metrics = {}
        self._open_session(check)

    @functools.cached_property
    def mlir(self) -> str:
        """The compiled (per-rank) module's text."""
        return self.module.text()

    @functools.cached_property
    def plan_report(self) -> dict:
        """The compiler's plan report (--ernie-plan-report's JSON): per
        function its memory plan's figures, the bytes of each role, the
        collectives a call runs and those of its body, the pipeline
        transfers of its body and the ops recomputation copied."""
        text = self._plan_report if self._plan_report is not None \
            else _ernie.plan_report(self.module)
        return json.loads(text)

    @functools.cached_property
    def traced_mlir(self) -> str:
        """The traced (unpartitioned) module's text."""
        return self.traced_module.text()

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
        functions = self.plan_report["functions"]
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
                body = functions.get(f, {})
                for kind, c in [*body.get("collectives_in_body", {}).items(),
                                *body.get("transfers_in_body", {}).items()]:
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

    def local_rows(self) -> np.ndarray:
        """The rows of a global batch this process's ranks read (all of them
        in one process): `ernie.distributed.local_batch`."""
        if self._local_rows is None:
            fn = "train_step" if self.pipeline is not None else next(
                f for f in ("train_step", "forward_grad", "forward") if f in self.functions())
            self._local_rows = np.asarray(self._require_session().local_rows(fn),
                                          dtype=np.int64)
        return self._local_rows

    def _check_batch(self, batch, rows=None):
        """The global arrays of `batch`: the global batch itself, or with
        `rows` this process's rows of it (placed where its ranks read them;
        the rows no rank here reads stay zero). A wrong batch in a job also
        aborts the other processes: they stop, not wait for this one."""
        try:
            return self._global_batch(batch, rows)
        except (ValueError, TypeError) as e:
            if self.job is not None:
                self._session.abort(f"its batch was refused: {e}")
            raise

    def _global_batch(self, batch, rows):
        if len(batch) != len(self._inputs):
            raise ValueError(f"the model takes {len(self._inputs)} inputs, got {len(batch)}")
        if rows is not None:
            rows = np.asarray(rows)
            mine = self.local_rows()
            if rows.shape != mine.shape or not np.array_equal(rows, mine):
                raise ValueError(
                    f"rows {_abbreviated(rows)} are not the rows this process's ranks read "
                    f"({_abbreviated(mine)}; {self._where()}): pass "
                    f"rows=ernie.distributed.local_batch(program)")
        out = []
        for i, (x, (shape, dtype)) in enumerate(zip(batch, self._inputs)):
            x = _global_array(x)
            if x.dtype != dtype:
                raise TypeError(f"input {i} has dtype {x.dtype}, compiled for {dtype}")
            # Every row here (one process): the rows are the global batch.
            if rows is None or not shape or len(rows) == shape[0]:
                if x.shape != shape:
                    local = len(self.local_rows()) if self.job is not None else None
                    hint = (f"; this process's ranks read {local} of its rows: pass those with "
                            f"rows=ernie.distributed.local_batch(program)"
                            if local is not None and x.shape[:1] == (local,) else "")
                    raise ValueError(f"input {i} has shape {list(x.shape)}, compiled for "
                                     f"{list(shape)} (the global batch){hint}")
                out.append(np.ascontiguousarray(x))
                continue
            want = (len(rows), *shape[1:])
            if x.shape != want:
                raise ValueError(f"input {i} has shape {list(x.shape)}; this process's "
                                 f"{len(rows)} rows of the global {list(shape)} are {list(want)}")
            full = np.zeros(shape, dtype)
            full[rows] = x
            out.append(full)
        return out

    def any_process(self, flag: bool) -> bool:
        """Whether `flag` is true on any process of the job (one process:
        `flag`): every process calls it at the same point, and all act alike
        (a stop request one process received, say)."""
        return bool(self._require_session().any_process(bool(flag)))

    def _where(self) -> str:
        first, count = self._require_session().local_ranks
        return (f"process {self.job.rank} of {self.job.world_size}, mesh ranks "
                f"{first}..{first + count - 1}") if self.job else "every rank is in this process"

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

    def step(self, *batch, rows=None) -> float:
        """One training step on a global batch; returns the loss (the global
        one, on every process of a job). With `rows`
        (`ernie.distributed.local_batch(program)`), `batch` is only those
        rows of the global batch: what this process's ranks read."""
        if self.optimizer is None:
            raise RuntimeError("compiled without an optimizer: use grad()")
        batch = self._check_batch(batch, rows)
        self.step_count += 1
        lr = self.optimizer.get_lr(self.step_count)
        results = self._call("train_step", batch, lr, self.step_count, updates=False)
        self.last_metrics = {name: float(results[i]) for name, i in self._metric_results}
        return float(results[0])

    @functools.cached_property
    def _metric_results(self):
        """(name, index in train_step's results) of the step's metrics: a
        pipelined step returns them after the loss in stage order."""
        if self.pipeline is None:
            sig = self._signatures.get("train_step", {"results": []})
            return [(r["name"], i) for i, r in enumerate(sig["results"]) if r["role"] == "metric"]
        names = [r["name"] for s in range(self.pipeline["stages"])
                 for r in self._signatures.get(f"train_update.{s}", {"results": []})["results"]
                 if r["role"] == "metric"]
        return [(name, 1 + k) for k, name in enumerate(names)]

    @property
    def grad_norm(self) -> float | None:
        """The gradients' global L2 norm (before clipping) of the last
        step, when the optimizer was made with report_grad_norm=True."""
        return self.last_metrics.get("grad_norm")

    def set_check_finite(self, check) -> None:
        """What the next calls check for NaN and infinity (as compile()'s
        `check_finite`): False / "off", True / "results" (the loss and the
        step's metrics) or "tensors" (every tensor an instruction writes;
        the error names the first that is not finite — slow, for finding
        a NaN)."""
        self._require_session().set_check_finite(_finite_check(check))

    def eval(self, *batch, rows=None) -> float:
        """The loss on a global batch, parameters unchanged (a pipelined
        program: the mean over its micro-batches); `rows` as in step()."""
        if self.pipeline is not None:
            fn = "eval_step"
            if not any(f.startswith("eval_forward.") for f in self.functions()):
                raise RuntimeError("this pipelined program has no evaluation step")
        else:
            fn = "eval_step" if "eval_step" in self.functions() else "forward"
        (loss, *rest) = self._call(fn, self._check_batch(batch, rows))
        if self.pipeline is None and fn == "eval_step":
            results = self._signatures[fn]["results"][1:]
            self.eval_metrics = {r["name"]: float(v) for r, v in zip(results, rest)
                                 if r["role"] == "metric"}
        return float(loss)

    def forward(self, *batch, rows=None):
        """The model's output (global) on a batch; `rows` as in step()."""
        self._not_pipelined("forward()")
        return self._call("forward", self._check_batch(batch, rows))[0]

    def grad(self, *batch, rows=None):
        """(loss, {parameter: gradient}) at the current parameters; `rows`
        as in step()."""
        self._not_pipelined("grad()")
        results = self._call("forward_grad", self._check_batch(batch, rows))
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
        returns the saved metadata ({"data_position": ..., ...}). A
        weights-only checkpoint (`ernie-ckpt import-hf`'s, metadata
        {"weights_only": true}) sets the parameters (converted to their
        dtypes) and leaves the optimizer state and step count at their
        start. `progress` and `last_io` as in save_checkpoint."""
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
        Chrome-trace / Perfetto JSON file (compile(..., trace=True)). In a
        job every process must call it; process 0 writes every rank's."""
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
        cluster = cluster if cluster is not None else self.cluster
        if cluster is None:
            raise ValueError("estimate() needs a cluster: this program was compiled without one")
        return cost_model.estimate(self.module, cluster)

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
        planned = self.plan_report["functions"]
        for name, figures in planned.items():
            if name in out["functions"] and figures["activation_bytes"]:
                out["functions"][name]["activation_bytes"] = figures["activation_bytes"]
        if "forward_grad" in out["functions"]:
            out["activation_bytes"] = out["functions"]["forward_grad"].get("activation_bytes", 0)
        # What --ernie-recompute copied into the backward: ops (a fused
        # region of copies counts once) of one rank's program.
        out["recompute"] = dict(getattr(self, "recompute", {"mode": "none", "layers": []}),
                                recomputed_ops=sum(f["recomputed_ops"] for f in planned.values()))
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
        out["collectives"] = collectives_of(self, step)
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


def collectives_of(module, function: str | None = None):
    """{"kind[axes]": {count, bytes per rank}} of the collectives one call of
    `function` runs (its callees included), or of every function of the
    module once. `module`: a Program, a module handle or module text (the
    compiler's plan report, not the text, is read)."""
    if isinstance(module, Program):
        report = module.plan_report
    else:
        report = json.loads(_ernie.plan_report(_as_module(module)))
    functions = report["functions"]
    if function is not None:
        return dict(sorted(functions.get(function, {}).get("collectives", {}).items()))
    total = {}
    for body in functions.values():
        for kind, c in body["collectives_in_body"].items():
            t = total.setdefault(kind, {"count": 0, "bytes": 0})
            t["count"] += c["count"]
            t["bytes"] += c["bytes"]
    return dict(sorted(total.items()))


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


# What would put an idle mesh axis to work, by its usual name.
_AXIS_USES = {"mp": "mp_config (tensor parallelism) or placements that name it",
              "pp": "pp_config (pipeline parallelism)",
              "ep": "ep_config (expert parallelism)",
              "dp": "dp_config (data parallelism)"}


def _check_every_axis_is_used(mesh, traced, pipeline, zero_axis):
    """Refuses a mesh axis of more than one rank that nothing in the plan
    uses: no sharding names it, it is not the pipeline's or ZeRO's axis.
    Its ranks would silently repeat one another's work."""
    used = set(_ernie.axes_in_shardings(traced))
    if pipeline is not None:
        used.add("pp")
    if zero_axis:
        used.add(zero_axis)
    for axis, size in zip(mesh.dim_names, mesh.shape):
        if size > 1 and axis not in used:
            use = _AXIS_USES.get(axis, "placements that name it (shard_tensor, a "
                                       "parallelize_plan, ep_config's axis)")
            raise ValueError(f"mesh axis {axis!r} ({size} ranks) is used by nothing in the plan: "
                             f"its ranks would repeat one another's work. Use it ({use}) or "
                             f"leave it out of the mesh")


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
            abstract=False, trace=False, fp8_config=None, fuse=UNSET, device=UNSET,
            cluster=None, strategy: Strategy | None = None) -> Program:
    """Traces `model` on `example_inputs` (global numpy arrays or
    DistTensors), differentiates it, builds the training step for
    `optimizer` (None: gradients only), partitions it over `mesh` under
    `strategy` (an ernie.Strategy: every plan setting in one place) and
    loads it on every rank. `config` (Paddle's parallelize dicts) and the
    keywords `fp8_config`, `fuse`, `device` and `cluster` are the same
    settings spelled the old way (Strategy.from_config maps them; giving a
    setting both ways is an error). With differentiate=False the model may return any
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
    its bytes, and estimate() defaults to it. `check_finite` (True: the loss
    and the step's metrics; "tensors": every tensor written, naming the
    first that is not finite; see Program.set_check_finite) makes a NaN or
    infinity an error that stops every rank.

    A mesh with a "pp" axis of size > 1 pipelines the model (it needs an
    optimizer): split points come from `pp_config.split_spec`, a
    PipelineLayer or `ernie.functional.split_point`; the model is traced on
    one micro-batch (dimension 0 of the example inputs divided by
    `pp_config.accumulate_steps`, which must then divide over dp), and the
    program runs step() and eval() on global batches."""
    if not differentiate and optimizer is not None:
        raise ValueError("an optimizer needs differentiate=True")
    if strategy is not None and config is not None:
        raise ValueError("give the plan as strategy= or as config=, not both")
    given = strategy if strategy is not None else config
    strategy = Strategy.from_config(given, fp8_config=fp8_config, fuse=fuse, device=device,
                                    cluster=cluster)
    if strategy.parallel or (given is not None and (mesh is not None or get_mesh())):
        parallelize(model, optimizer, mesh, strategy)
    plan = getattr(model, "_ernie_plan", None)
    recompute, recompute_layers = recompute_plan(
        model, strategy.recompute if strategy.recompute is not None
        else (plan.get("recompute") if plan else None))
    if recompute != "none" and not (differentiate and optimizer is not None):
        raise ValueError(f"recompute {recompute!r} recomputes activations for a training step's "
                         "backward: it needs an optimizer and differentiate=True")
    mesh = mesh or (plan["mesh"] if plan else None) or get_mesh()
    # An axis named dp splits the batch unless the plan says otherwise.
    dp_axis = (plan["dp_axis"] if plan else None) or \
        ("dp" if mesh is not None and "dp" in mesh.dim_names else None)
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
    if mesh is not None:
        _check_every_axis_is_used(mesh, traced, pipeline, zero_level and zero_axis)
    options = pipeline_options(
        optimizer, mesh is not None, differentiate, zero_level, zero_axis,
        overlap=bool(plan and plan.get("sequence_parallel_overlap")),
        fp8_config=strategy.fp8 if strategy.fp8 is not None else (plan.get("fp8_config") if plan else None),
        pipeline=pipeline, fuse=strategy.fusion, buckets=plan.get("gradient_buckets") if plan else None,
        recompute=recompute, cluster=strategy.cluster if mesh is not None else None)
    compiled, program_file, plan_report = _ernie.compile(traced, options)
    program = Program(model, optimizer, traced, compiled, program_file, mesh, example_inputs,
                      seed=seed, check_finite=check_finite, timeout=timeout, abstract=abstract,
                      trace=trace, state_values=trace_state.state_values, device=strategy.device,
                      plan_report=plan_report)
    program.strategy = strategy
    program.cluster = strategy.cluster
    program.pipeline_options = options
    program.recompute = {"mode": recompute, "layers": list(recompute_layers.values())}
    return program

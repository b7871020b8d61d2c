"""Pipeline parallelism, Paddle-style: split points, PipelineLayer, schedules.

A pipelined model is one traced loss function with stage boundaries in it:
`ernie.split_point` markers (`ernie.functional.split_point`), each starting
the next virtual stage (model chunk). The compiler cuts the training step
there (`--ernie-pipeline-split`), gives a parameter used by several stages a
replica on each (`--ernie-shared-weight-dedup`), and emits per pipeline rank
its functions and the schedule's order (`--ernie-pipeline-schedule`); values
that cross a boundary, forward and backward, are sent and received where the
compiler finds them. There are three ways to place the boundaries:

- `pp_config["split_spec"]` (`ernie.distributed.parallelize`): a layer-name
  prefix (or a list of them) whose numbered sub-layers `prefix.<int>` are
  divided evenly into pp * vpp_degree chunks, or a dict
  `{layer_name: SplitPoint.END | SplitPoint.BEGINNING}` placing each
  boundary after (END) or before (BEGINNING) a named layer;
- `PipelineLayer(layers, num_stages, ...)`: a list of `LayerDesc` /
  `SharedLayerDesc` / layers / functions, segmented into num_stages *
  num_virtual_pipeline_stages chunks;
- `ernie.functional.split_point(x)` in a model's forward.

Chunk c runs on the pipeline rank (coordinate along the mesh's "pp" axis)
c mod pp. `pp_config` also carries `accumulate_steps` (micro-batches per
step: the model is traced on a micro-batch, and each step's global batch is
split along dimension 0), `schedule_mode` ("1F1B", "FThenB", "VPP" /
"interleaved"), `vpp_degree` (chunks per pipeline rank; > 1 means the
interleaved schedule) and `gradient_accumulation_fusion` (default True,
Megatron's flag: each backward adds its micro-batch's gradients into the
step's f32 running sums, a weight gradient's GEMM directly; False adds
them after the GEMMs, as Megatron does without the flag). `global_spec` names layers whose
outputs every stage needs (Paddle places them on the whole mesh); here it
is accepted and checked only: any value that crosses stages is sent to the
stages that read it, so it needs no action.
"""

from __future__ import annotations

import difflib
import enum
import functools
import re

from . import _ernie
from . import functional as F
from .mesh import get_mesh
from .nn import Module, Parameter
from .strategy import PipelineParallel


class SplitPoint(enum.Enum):
    """Where a `split_spec` dict places a boundary around its layer."""
    BEGINNING = "beginning"  # before the layer: its inputs start the next stage
    END = "end"              # after the layer: its outputs start the next stage


# ---------------------------------------------------------------------------
# Schedules (the runtime's schedule library)
# ---------------------------------------------------------------------------

_SCHEDULES = {"fthenb": "FThenB", "gpipe": "FThenB", "1f1b": "1F1B",
              "vpp": "interleaved", "interleaved": "interleaved"}


def schedule_name(mode) -> str:
    """The compiler's name of a schedule ("FThenB", "1F1B", "interleaved")
    from Paddle's ("FThenB", "1F1B", "VPP") or ours, any case."""
    if not isinstance(mode, str) or mode.lower() not in _SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {mode!r} (FThenB, 1F1B, VPP/interleaved)")
    return _SCHEDULES[mode.lower()]


def pipeline_schedule(kind, stages, virtual_stages=1, micro_batches=1):
    """Per pipeline rank, its steps in order: ("F" | "B", chunk, micro_batch).
    Chunk c of the stages * virtual_stages chunks runs on rank c % stages.
    The schedule a pipelined program runs (its per-rank instruction order)."""
    return _ernie.pipeline_schedule(schedule_name(kind), int(stages), int(virtual_stages),
                                    int(micro_batches))


def simulate_pipeline(kind, stages, virtual_stages=1, micro_batches=1, forward_cost=1.0,
                      backward_cost=2.0):
    """The schedule's timeline with zero-cost transfers, each chunk's forward
    taking `forward_cost` and its backward `backward_cost`: a dict with
    bubble_fraction (1 - busy / (stages * makespan)), makespan, busy, and
    ranks: per rank its (action, chunk, micro_batch, start, end)."""
    return _ernie.simulate_pipeline(schedule_name(kind), int(stages), int(virtual_stages),
                                    int(micro_batches), float(forward_cost), float(backward_cost))


# ---------------------------------------------------------------------------
# split_spec
# ---------------------------------------------------------------------------

def _numbered_under(model: Module, prefix: str):
    """(name, layer) of the sub-layers named `prefix.<int>`, by index."""
    pattern = re.compile(re.escape(prefix) + r"\.(\d+)")
    found = []
    for name, layer in model.named_sublayers():
        m = pattern.fullmatch(name)
        if m:
            found.append((int(m.group(1)), name, layer))
    return [(name, layer) for _, name, layer in sorted(found, key=lambda t: t[0])]


def _layer_lists(model: Module):
    """The prefixes under which the model has numbered sub-layers."""
    lists = []
    for name, _ in model.named_sublayers():
        m = re.fullmatch(r"(.+)\.\d+", name)
        if m and m.group(1) not in lists:
            lists.append(m.group(1))
    return lists


def _nearby(name: str, model: Module, candidates=None) -> str:
    names = [n for n, _ in model.named_sublayers()]
    candidates = candidates if candidates is not None else names
    close = difflib.get_close_matches(name, candidates, n=5, cutoff=0.5)
    if not close:
        close = _layer_lists(model) or names[:8]
    return ", ".join(repr(n) for n in close) if close else "(the model has no sub-layers)"


def _split_layers(model: Module, split_spec, chunks: int, layers_per_stage=None):
    """{layer name: (layer, "end" | "beginning")} for `split_spec` cut into
    `chunks` virtual stages: evenly, or `layers_per_stage[c]` layers in
    chunk c (Megatron's uneven first and last stages)."""
    if isinstance(split_spec, dict):
        layers = dict(model.named_sublayers())
        marks = {}
        for name, point in split_spec.items():
            if not isinstance(name, str) or name not in layers:
                raise ValueError(f"split_spec names {name!r}, which is not a sub-layer of the model "
                                 f"(nearby: {_nearby(str(name), model)})")
            if not isinstance(point, SplitPoint):
                raise TypeError(f"split_spec[{name!r}] is {point!r}, not SplitPoint.END or "
                                f"SplitPoint.BEGINNING")
            marks[name] = (layers[name], point.value)
        if len(marks) != chunks - 1:
            raise ValueError(f"split_spec places {len(marks)} split point(s); {chunks} stages "
                             f"(pp x vpp_degree) need {chunks - 1}")
        return marks
    prefixes = [split_spec] if isinstance(split_spec, str) else list(split_spec)
    if not prefixes or not all(isinstance(p, str) and p for p in prefixes):
        raise TypeError("pp_config.split_spec is a layer-name prefix, a list of them, or a "
                        "{name: SplitPoint} dict")
    matched = []
    for prefix in prefixes:
        found = _numbered_under(model, prefix)
        if not found:
            raise ValueError(f"split_spec {prefix!r} matches no sub-layer named '{prefix}.<int>' "
                             f"(nearby: {_nearby(prefix, model, _layer_lists(model) or None)})")
        matched += [(n, l) for n, l in found if n not in dict(matched)]
    spec = prefixes[0] if len(prefixes) == 1 else prefixes
    if layers_per_stage is not None:
        if len(layers_per_stage) != chunks or sum(layers_per_stage) != len(matched):
            raise ValueError(f"pp_config.layers_per_stage {list(layers_per_stage)} must give "
                             f"each of the {chunks} stages (pp x vpp_degree) its layers, "
                             f"{len(matched)} in all (split_spec {spec!r} matches {len(matched)})")
        ends = [sum(layers_per_stage[:c + 1]) for c in range(chunks - 1)]
        return {matched[e - 1][0]: (matched[e - 1][1], "end") for e in ends}
    if chunks > len(matched):
        raise ValueError(f"split_spec {spec!r} matches {len(matched)} layers: more stages ({chunks}) "
                         f"than layers")
    if len(matched) % chunks:
        raise ValueError(f"split_spec {spec!r} matches {len(matched)} layers, which do not divide "
                         f"into {chunks} stages")
    per = len(matched) // chunks
    return {matched[per * i - 1][0]: (matched[per * i - 1][1], "end") for i in range(1, chunks)}


def clear_split_marks(model: Module):
    for _, layer in model.named_sublayers(include_self=True):
        layer.__dict__.pop("_ernie_split_point", None)


def configure(model: Module, mesh, pp: dict | None):
    """Checks `pp_config` (or none: a PipelineLayer's own settings) against
    the model and the mesh, marks the split_spec layers, and returns the
    pipeline's settings: stages, virtual_stages, accumulate_steps, schedule,
    split_spec, global_spec and the marked layers' names."""
    pp = PipelineParallel.from_config(dict(pp or {})).to_config()  # keys and values checked
    if "pp" not in mesh.dim_names:
        raise ValueError(f"pipeline parallelism needs a mesh dimension named 'pp'; the mesh has "
                         f"{mesh.dim_names}")
    stages = mesh.get_dim_size("pp")
    accumulate = pp.get("accumulate_steps", 1)
    vpp = pp.get("vpp_degree")
    pipeline_layers = [l for _, l in model.named_sublayers(include_self=True)
                       if isinstance(l, PipelineLayer)]
    split_spec = pp.get("split_spec")
    if len(pipeline_layers) > 1:
        raise ValueError("the model holds several PipelineLayers; a pipelined model has one")
    if pipeline_layers:
        layer = pipeline_layers[0]
        if split_spec is not None:
            raise ValueError("pp_config.split_spec and a PipelineLayer both place split points: "
                             "use one of them")
        if layer.num_stages != stages:
            raise ValueError(f"the PipelineLayer has num_stages={layer.num_stages} but the mesh's "
                             f"'pp' dimension has {stages}")
        if vpp is not None and vpp != layer.num_virtual_stages:
            raise ValueError(f"pp_config.vpp_degree={vpp} but the PipelineLayer has "
                             f"num_virtual_pipeline_stages={layer.num_virtual_stages}")
        vpp = layer.num_virtual_stages
    vpp = vpp or 1
    if "schedule_mode" in pp:
        schedule = schedule_name(pp["schedule_mode"])
        if schedule == "interleaved" and vpp < 2:
            raise ValueError(f"schedule_mode {pp['schedule_mode']!r} interleaves several chunks "
                             f"per pipeline rank: it needs vpp_degree >= 2")
        if schedule != "interleaved" and vpp > 1:
            raise ValueError(f"schedule_mode {pp['schedule_mode']!r} runs one chunk per pipeline "
                             f"rank; vpp_degree={vpp} needs 'VPP' (interleaved)")
    else:
        schedule = "interleaved" if vpp > 1 else "1F1B"
    if schedule == "interleaved" and accumulate % stages:
        raise ValueError(f"the interleaved schedule needs accumulate_steps ({accumulate}) to be a "
                         f"multiple of pp ({stages})")
    fusion = pp.get("gradient_accumulation_fusion", True)
    global_spec = pp.get("global_spec")
    if global_spec is not None:
        global_spec = [global_spec] if isinstance(global_spec, str) else list(global_spec)
        layers = dict(model.named_sublayers())
        for name in global_spec:
            if name not in layers:
                raise ValueError(f"global_spec names {name!r}, which is not a sub-layer of the "
                                 f"model (nearby: {_nearby(str(name), model)})")
    clear_split_marks(model)
    uneven = pp.get("layers_per_stage")
    if uneven is not None and split_spec is None:
        raise ValueError("pp_config.layers_per_stage counts the layers split_spec names: "
                         "give split_spec too")
    marks = (_split_layers(model, split_spec, stages * vpp, uneven)
             if split_spec is not None else {})
    for _, (layer, point) in marks.items():
        object.__setattr__(layer, "_ernie_split_point", point)
    return {"stages": stages, "virtual_stages": vpp, "accumulate_steps": accumulate,
            "schedule": schedule, "split_spec": split_spec, "global_spec": global_spec,
            "split_layers": list(marks), "gradient_accumulation_fusion": fusion}


# ---------------------------------------------------------------------------
# PipelineLayer
# ---------------------------------------------------------------------------

class LayerDesc:
    """A layer to build: `layer_func(*inputs, **kwargs)` (a Module class or
    any callable returning a Module)."""

    def __init__(self, layer_func, *inputs, **kwargs):
        if not callable(layer_func):
            raise TypeError(f"LayerDesc takes a layer class or function, not {layer_func!r}")
        self.layer_func, self.inputs, self.kwargs = layer_func, inputs, kwargs

    def build_layer(self) -> Module:
        layer = self.layer_func(*self.inputs, **self.kwargs)
        if not isinstance(layer, Module):
            raise TypeError(f"{_func_name(self.layer_func)} built a {type(layer).__name__}, "
                            f"not an ernie.nn.Module")
        return layer

    def __repr__(self):
        return f"{type(self).__name__}({_func_name(self.layer_func)})"


def _func_name(f):
    return getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or repr(f)


class SharedLayerDesc(LayerDesc):
    """A layer used at several places of a PipelineLayer (a tied embedding
    and LM head). The first occurrence of `key` builds it (the pivot);
    later ones use the same layer, through `forward_func(layer, x)` when
    given. `shared_weight_attr` (a name or a list: "weight", ["weight",
    "bias"]) lists the parameters this occurrence shares; a later
    occurrence's must be a subset of the pivot's. Each shared parameter is
    one logical parameter with a replica on every stage that lists it
    (`ernie.pipeline_stages`) or uses it; the compiler keeps the replicas
    equal (a broadcast at start, the gradients summed over those stages)."""

    def __init__(self, key, layer_func, forward_func=None, shared_weight_attr="weight",
                 *inputs, **kwargs):
        super().__init__(layer_func, *inputs, **kwargs)
        if not isinstance(key, str) or not key or "." in key:
            raise ValueError(f"SharedLayerDesc key must be a non-empty name without '.', not {key!r}")
        if forward_func is not None and not callable(forward_func):
            raise TypeError(f"SharedLayerDesc {key!r}: forward_func must be callable")
        attrs = [shared_weight_attr] if isinstance(shared_weight_attr, str) else list(shared_weight_attr)
        if not attrs or not all(isinstance(a, str) and a for a in attrs):
            raise ValueError(f"SharedLayerDesc {key!r}: shared_weight_attr is an attribute name or "
                             f"a non-empty list of them, not {shared_weight_attr!r}")
        if len(set(attrs)) != len(attrs):
            raise ValueError(f"SharedLayerDesc {key!r}: shared_weight_attr {attrs} repeats a name")
        self.layer_name = key
        self.forward_func = forward_func
        self.shared_weight_attr = attrs


class LayerDict(Module):
    """Sub-modules by name (PipelineLayer.shared_layers)."""

    def __getitem__(self, key):
        return self._modules[key]

    def __contains__(self, key):
        return key in self._modules

    def __setitem__(self, key, module):
        setattr(self, key, module)


def _shared_parameter(layer: Module, attr: str, key: str) -> Parameter:
    target = layer
    for part in attr.split("."):
        target = target.__dict__.get(part) if isinstance(target, Module) else None
        if target is None:
            raise ValueError(f"SharedLayerDesc {key!r}: the layer ({type(layer).__name__}) has no "
                             f"attribute {attr!r}")
    if not isinstance(target, Parameter):
        raise ValueError(f"SharedLayerDesc {key!r}: {attr!r} of the layer is a "
                         f"{type(target).__name__}, not a Parameter")
    return target


class PipelineLayer(Module):
    """Paddle's PipelineLayer: `layers` (LayerDesc, SharedLayerDesc, built
    layers or parameter-free functions) run in order, each on the previous
    one's output (a tuple is passed as one argument, as in Paddle), split
    into num_stages * num_virtual_pipeline_stages chunks by `seg_method`:
    "uniform" (equal numbers of entries, the remainder to the last chunks)
    or "layer:<regex>" (equal numbers of entries whose class name matches,
    each chunk ending after its last one). forward(*inputs) runs the layers
    on the inputs (one input: itself; several: their tuple); with `loss_fn`
    the last input is the labels and it returns loss_fn(output, labels).

    Layers built from descs are named by their position ("3.weight"),
    shared ones `shared_layers.<key>`. num_stages defaults to the size of
    the global mesh's (dist.set_mesh) "pp" dimension."""

    def __init__(self, layers, num_stages=None, loss_fn=None, seg_method="uniform",
                 num_virtual_pipeline_stages=1):
        super().__init__()
        if num_stages is None:
            mesh = get_mesh()
            if mesh is None or "pp" not in mesh.dim_names:
                raise ValueError("PipelineLayer needs num_stages (or a global mesh with a 'pp' "
                                 "dimension: ernie.distributed.set_mesh)")
            num_stages = mesh.get_dim_size("pp")
        for value, what in ((num_stages, "num_stages"),
                            (num_virtual_pipeline_stages, "num_virtual_pipeline_stages")):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"PipelineLayer {what} must be an integer >= 1, not {value!r}")
        if loss_fn is not None and not callable(loss_fn):
            raise TypeError("PipelineLayer loss_fn must be callable: loss_fn(output, labels)")
        descs = list(layers)
        self.num_stages = num_stages
        self.num_virtual_stages = num_virtual_pipeline_stages
        self.loss_fn = loss_fn
        self.shared_layers = LayerDict()
        self.run_function = []
        pivots = {}  # key -> the pivot SharedLayerDesc
        kinds = []   # per entry: the class name seg_method "layer:" matches
        for i, desc in enumerate(descs):
            if isinstance(desc, SharedLayerDesc):
                key = desc.layer_name
                if key not in pivots:
                    layer = desc.build_layer()
                    for attr in desc.shared_weight_attr:
                        _shared_parameter(layer, attr, key)
                    self.shared_layers[key] = layer
                    pivots[key] = desc
                else:
                    pivot = pivots[key]
                    if desc.layer_func is not pivot.layer_func:
                        raise ValueError(f"SharedLayerDesc {key!r} is built by "
                                         f"{_func_name(pivot.layer_func)} at its first occurrence "
                                         f"but {_func_name(desc.layer_func)} at entry {i}")
                    extra = [a for a in desc.shared_weight_attr if a not in pivot.shared_weight_attr]
                    if extra:
                        raise ValueError(f"SharedLayerDesc {key!r} at entry {i} shares "
                                         f"{desc.shared_weight_attr}, which is not a subset of "
                                         f"the pivot's (first occurrence's) "
                                         f"{pivot.shared_weight_attr}: {extra} not shared there")
                    layer = self.shared_layers[key]
                fn = functools.partial(desc.forward_func, layer) if desc.forward_func else layer
                kinds.append(type(layer).__name__)
            elif isinstance(desc, LayerDesc):
                layer = desc.build_layer()
                setattr(self, str(i), layer)
                fn = layer
                kinds.append(type(layer).__name__)
            elif isinstance(desc, Module):
                setattr(self, str(i), desc)
                fn = desc
                kinds.append(type(desc).__name__)
            elif callable(desc):
                fn = desc
                kinds.append(_func_name(desc))
            else:
                raise TypeError(f"PipelineLayer entry {i} is {desc!r}: a LayerDesc, "
                                f"SharedLayerDesc, Module or function")
            self.run_function.append(fn)
        self._descs = descs
        chunks = num_stages * num_virtual_pipeline_stages
        if len(descs) < chunks:
            raise ValueError(f"PipelineLayer has {len(descs)} layers, fewer than its {chunks} "
                             f"chunks (num_stages={num_stages} x "
                             f"num_virtual_pipeline_stages={num_virtual_pipeline_stages})")
        self.segment_parts = _segment(kinds, chunks, seg_method)
        self._chunk_of = [c for c in range(chunks)
                          for _ in range(self.segment_parts[c], self.segment_parts[c + 1])]
        # Each shared parameter's declared holders: the chunks where its key
        # occurs with that attribute listed.
        holders = {}
        for i, desc in enumerate(descs):
            if isinstance(desc, SharedLayerDesc):
                layer = self.shared_layers[desc.layer_name]
                for attr in desc.shared_weight_attr:
                    p = _shared_parameter(layer, attr, desc.layer_name)
                    holders.setdefault(id(p), (p, set()))[1].add(self._chunk_of[i])
        for p, chunks_holding in holders.values():
            p.pipeline_stages = sorted(chunks_holding)

    def get_stage_from_index(self, index):
        """The chunk (virtual stage) of entry `index`."""
        return self._chunk_of[index]

    def forward(self, *inputs):
        if self.loss_fn is not None:
            if len(inputs) < 2:
                raise ValueError("a PipelineLayer with loss_fn takes its inputs and the labels last")
            *inputs, labels = inputs
        x = inputs[0] if len(inputs) == 1 else tuple(inputs)
        starts = set(self.segment_parts[1:-1])
        for i, fn in enumerate(self.run_function):
            if i in starts:
                x = F.split_point(x)
            x = fn(x)
        return self.loss_fn(x, labels) if self.loss_fn is not None else x


def _segment(kinds, parts, method):
    """Paddle's SegmentLayers: `parts + 1` boundaries over the entries."""
    n = len(kinds)
    if method == "uniform":
        size, extra = divmod(n, parts)
        bounds = [0] * (parts + 1)
        for i in range(1, parts):
            bounds[i] = min(bounds[i - 1] + size + (1 if i > parts - extra else 0), n)
        bounds[parts] = n
        return bounds
    if isinstance(method, str) and method.startswith("layer:"):
        try:
            pattern = re.compile(method[len("layer:"):])
        except re.error as e:
            raise ValueError(f"seg_method {method!r}: {e}") from None
        weights = [1 if pattern.search(k) else 0 for k in kinds]
        total = sum(weights)
        if total < parts or total % parts:
            raise ValueError(f"seg_method {method!r} matches {total} layers, which do not divide "
                             f"into {parts} chunks")
        size = total // parts
        bounds, count = [0], 0
        for i, w in enumerate(weights):
            count += w
            if w and count == size and len(bounds) < parts:
                bounds.append(i + 1)
                count = 0
        bounds.append(n)
        return bounds
    raise ValueError(f"seg_method must be 'uniform' or 'layer:<class name regex>', not {method!r}")

"""The plan, chosen for you: search dp / mp / pp / vpp / sequence parallelism
/ ZeRO / recomputation / micro-batch size — and for a mixture-of-experts
model the expert-parallel degree and whether the experts split over an
axis of their own or over the dp / ZeRO axis — over a cluster, prune by the
abstract compile's exact memory, rank by the cost model's step time.

How it scales. A candidate's program is compiled abstractly (no values) at
two reduced depths, one and two layers per pipeline chunk, and its step
time, memory and traffic are extrapolated linearly to the model's depth
(every quantity the report and the cost model give is affine in the
layers per chunk: each layer adds the same ops, state and collectives; a
MoE model's shallow copies make every layer a MoE layer, so the few dense
layers some families start with are counted as MoE ones until the
finalists' full-depth compile, which is exact).
So a candidate costs two small compiles whatever the model's depth. Not
every structure is searched whole (branch and bound): each one's fastest
knobs (no ZeRO, no recomputation) bound its time from below, and a
structure that does not fit with them is searched only while it can still
beat the best found (docs/decisions/0030). Per
structure (dp, mp, pp, vpp, sp, micro-batch size) the memory knobs are
tried from the fastest (no ZeRO, no recomputation) on, stopping at the
first that fits: a higher ZeRO level or more recomputation never makes a
step faster, only smaller. Where full recomputation fits and keeping every
activation did not, only as many layers per stage are recomputed as that
takes (Megatron's --recompute-num-layers; each layer trades the same
memory for the same time, so the guess lies between the two compiles).
The best `top` plans are then compiled at full depth: the table's memory
is the abstract compile's report of the real program, exact, and its time
that program's estimate.

    python -m ernie.autoplan --cluster dgx_h100 --global-batch 64 --seq 2048 \\
        --model llama --set hidden_size=4096,num_hidden_layers=32,num_attention_heads=32,...
    python -m ernie.autoplan --hf-config bench/configs/ernie4_5_21b_a3b.json \\
        --global-batch 512 --seq 4096 --ranks 64
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import dataclasses
import inspect
import itertools
import json
import math
import multiprocessing
import os
import pickle
import re
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np

from .. import cost as _cost
from .. import distributed as dist
from ..compiler import compile as ernie_compile
from ..models.auto import FAMILIES, family_of
from ..nn import LayerList, abstract
from ..optimizer import AdamW
from ..weights import read_json

_RECOMPUTE_ORDER = ("none", "selective", "full")


@dataclasses.dataclass(frozen=True)
class Candidate:
    dp: int
    mp: int
    pp: int
    vpp: int = 1
    sequence_parallel: bool = False
    zero: int = 0
    recompute: str = "none"
    # With recompute "full": how many layers of each pipeline stage are
    # recomputed (Megatron's --recompute-num-layers); 0: all of them.
    recompute_layers: int = 0
    micro_batch_size: int = 1
    micro_batches: int = 1
    # Under pp: weight-gradient GEMMs add into the f32 micro-batch sums
    # (Megatron's --gradient-accumulation-fusion); False adds after them.
    gradient_accumulation_fusion: bool = True
    # MoE: the experts split `ep` ways, over an "ep" axis of their own
    # inside dp (the batch split over dp x ep, dense gradients reduced over
    # both), or with `ep_on_dp` over the dp / ZeRO axis itself (ep = dp:
    # Paddle's and ERNIE's expert parallelism on the sharding axis).
    ep: int = 1
    ep_on_dp: bool = False
    # Layers per model chunk (pp x vpp of them, chunk v * pp + s on stage
    # s) when the chunks do not divide the layers (empty: even): the chunks
    # holding the embedding and the head one layer fewer first, as Meta's
    # 126 layers on pp 16 are [7, 8 x 14, 7] (pp_config.layers_per_stage).
    layers_per_stage: tuple = ()

    def chunk_layers(self, layers: int) -> list:
        """Layers of each model chunk of a `layers`-deep model."""
        if self.layers_per_stage and sum(self.layers_per_stage) == layers:
            return list(self.layers_per_stage)
        return [layers // (self.pp * self.vpp)] * (self.pp * self.vpp)

    def stage_layers(self, layers: int) -> list:
        """Layers each pipeline stage holds (its chunks together)."""
        chunks = self.chunk_layers(layers)
        return [sum(chunks[v * self.pp + s] for v in range(self.vpp)) for s in range(self.pp)]

    @property
    def name(self) -> str:
        parts = [f"dp{self.dp}", f"mp{self.mp}", f"pp{self.pp}"]
        if self.ep > 1:
            parts.append(f"ep{self.ep}" + ("@dp" if self.ep_on_dp else ""))
        if self.vpp > 1:
            parts.append(f"vpp{self.vpp}")
        if self.layers_per_stage:
            parts.append("L" + "/".join(f"{n}x{times}" if times > 1 else str(n)
                                        for n, times in _runs(self.layers_per_stage)))
        if self.sequence_parallel:
            parts.append("sp")
        if self.zero:
            parts.append(f"zero{self.zero}")
        if self.recompute != "none":
            parts.append(f"rc-{self.recompute}" +
                         (f":{self.recompute_layers}" if self.recompute_layers else ""))
        if self.pp > 1:
            parts.append(f"m{self.micro_batches}x{self.micro_batch_size}")
            if not self.gradient_accumulation_fusion:
                parts.append("no-gaf")
        return " ".join(parts)


@dataclasses.dataclass(repr=False)
class Plan:
    """One row of the table; printed as one line."""
    candidate: Candidate
    step_seconds: float
    mfu: float
    memory_bytes: int
    comm_bytes: int
    estimate: dict
    exact: bool  # compiled at full depth (else extrapolated)
    mesh: dist.ProcessMesh | None = None
    config: dict | None = None

    # The best plan the search found for each other expert layout (ep and
    # its axis), as (candidate name, predicted step seconds, estimate):
    # what explain() compares the chosen one with.
    alternatives: list = dataclasses.field(default_factory=list)

    @property
    def name(self) -> str:
        return self.candidate.name

    def __repr__(self) -> str:
        how = "compiled at full depth" if self.exact else "extrapolated from shallower compiles"
        return (f"Plan({self.name}: {self.step_seconds:.4g} s per step, MFU "
                f"{self.mfu * 100:.1f} %, {self.memory_bytes / 2**30:.2f} GiB per rank, "
                f"{self.comm_bytes / 1e9:.2f} GB sent per rank, {how})")

    __str__ = __repr__


def _runs(counts):
    """(value, how many in a row) per run of equal values in `counts`."""
    return [(n, len(list(run))) for n, run in itertools.groupby(counts)]


def uneven_stages(layers: int, pp: int) -> tuple:
    """Layers per stage (or model chunk: pp x vpp of them) for `layers`
    that `pp` do not divide: every one the ceiling, then one layer fewer on
    the last, the first, the second last, ... until they add up — the ones
    that also hold the head and the embedding give theirs up first (Meta's
    Llama 3 405B: 126 layers on 16 stages are [7, 8 x 14, 7]; Megatron's
    --decoder-first/last-pipeline-num-layers)."""
    if pp < 2 or layers < pp:
        raise ValueError(f"{layers} layers on {pp} stages")
    top = -(-layers // pp)
    counts = [top] * pp
    order = [i for pair in zip(range(pp - 1, -1, -1), range(pp)) for i in pair]
    order = list(dict.fromkeys(order))  # last, first, second last, second, ...
    for i in order[: top * pp - layers]:
        counts[i] -= 1
    return tuple(counts)


class NothingFits(ValueError):
    """No candidate fits the devices' memory: says the smallest memory any
    needed and which plan came closest."""


# ---------------------------------------------------------------------------
# The model's family: how to rebuild it shallower and split it.
# ---------------------------------------------------------------------------

def _layer_list(model):
    """The sub-layer name of the decoder layers (the LayerList as long as
    config.num_hidden_layers)."""
    n = model.config.num_hidden_layers
    for name, layer in model.named_sublayers():
        if isinstance(layer, LayerList) and len(layer) == n:
            return name
    raise ValueError(f"{type(model).__name__} has no LayerList of its {n} layers to split")


def _tp_plan(model, sequence_parallel):
    """The family's tensor-parallel plan: the model's own parallelize_plan()
    (it knows its layers: a Qwen3-MoE of only sparse layers has no dense
    MLP to split), else the module-level one beside the model's class or
    beside the class it derives from (a user's subclass of
    LlamaForCausalLM keeps Llama's plan); None when the family has no
    sequence-parallel form and `sequence_parallel` asks for one."""
    own = getattr(model, "parallelize_plan", None)
    if callable(own):
        try:
            return own(sequence_parallel=sequence_parallel)
        except ValueError:
            if sequence_parallel:
                return None
            raise
    plan_fn = next((getattr(sys.modules.get(cls.__module__), "parallelize_plan", None)
                    for cls in type(model).__mro__
                    if getattr(sys.modules.get(cls.__module__), "parallelize_plan", None)),
                   None)
    if plan_fn is None:
        raise ValueError(f"{type(model).__module__} (nor a module of {type(model).__name__}'s "
                         "bases) has no parallelize_plan() for tensor parallelism")
    params = inspect.signature(plan_fn).parameters
    kwargs = {}
    if "tie_word_embeddings" in params:
        kwargs["tie_word_embeddings"] = model.config.tie_word_embeddings
    if sequence_parallel:
        if "sequence_parallel" not in params:
            return None
        kwargs["sequence_parallel"] = True
    return plan_fn(**kwargs)


# Config fields that place a family's MoE layers, and the value that makes
# every layer one (ERNIE 4.5, Qwen3-MoE).
_EVERY_LAYER_MOE = {"moe_layer_start_index": 0, "moe_layer_end_index": -1,
                    "moe_layer_interval": 1, "decoder_sparse_step": 1, "mlp_only_layers": ()}


def _is_moe(config) -> bool:
    return callable(getattr(config, "is_moe_layer", None)) and \
        any(map(config.is_moe_layer, range(config.num_hidden_layers)))


def _num_experts(config) -> int:
    return getattr(config, "moe_num_experts", 0) or getattr(config, "num_experts", 0)


def _shallow(family, layers):
    """A new abstract model of `family` ((model class, config): Llama,
    ERNIE 4.5, Qwen, ...), `layers` deep. A MoE family's is MoE in every
    layer unless `layers` is its depth: at one or two layers per chunk the
    first dense layers would otherwise be all there is."""
    model_type, config = family
    fields = {"num_hidden_layers": layers}
    if layers != config.num_hidden_layers and _is_moe(config):
        fields.update({k: v for k, v in _EVERY_LAYER_MOE.items() if hasattr(config, k)})
    with abstract():
        return model_type(dataclasses.replace(config, **fields))


def _mesh_and_config(model, c: Candidate):
    # The expert axis inside dp: an expert group's ranks are neighbours
    # (within a node when ep x mp fits one).
    own_ep = c.ep if c.ep > 1 and not c.ep_on_dp else 1
    axes = [(n, s) for n, s in (("pp", c.pp), ("dp", c.dp), ("ep", own_ep), ("mp", c.mp))
            if s > 1]
    if not axes:
        return None, {}
    names, shape = [a[0] for a in axes], [a[1] for a in axes]
    mesh = dist.ProcessMesh(np.arange(int(np.prod(shape))).reshape(shape), names)
    config: dict = {}
    if c.dp > 1:
        config["dp_config"] = {"sharding_level": c.zero}
    if c.ep > 1:
        config["ep_config"] = {"axis": "dp" if c.ep_on_dp else "ep"}
    if c.mp > 1:
        config["mp_config"] = {"parallelize_plan": _tp_plan(model, c.sequence_parallel)}
    if c.pp > 1:
        config["pp_config"] = {"split_spec": _layer_list(model),
                               "accumulate_steps": c.micro_batches, "vpp_degree": c.vpp,
                               "gradient_accumulation_fusion": c.gradient_accumulation_fusion}
        # Uneven stages at the model's depth (shallow copies split evenly).
        if c.layers_per_stage and sum(c.layers_per_stage) == model.config.num_hidden_layers:
            config["pp_config"]["layers_per_stage"] = list(c.layers_per_stage)
    if c.recompute_layers:
        name = _layer_list(model)
        config["recompute"] = {"granularity": c.recompute,
                               "layers": [re.escape(f"{name}.{i}")
                                          for i in _recomputed_layers(c, model.config.num_hidden_layers)]}
    elif c.recompute != "none":
        config["recompute"] = c.recompute
    return mesh, config


def _recomputed_layers(c: Candidate, layers):
    """The layers `c.recompute_layers` names: that many of each pipeline
    stage's, taken round-robin over the stage's chunks (chunk v of stage s
    is chunk v * pp + s, as the interleaved schedule places them) from each
    chunk's first layer on, so every chunk gives up its share."""
    counts = c.chunk_layers(layers)
    starts = [sum(counts[:k]) for k in range(len(counts))]
    chosen = []
    for stage in range(c.pp):
        chunks = [v * c.pp + stage for v in range(c.vpp)]
        order = [starts[k] + j for j in range(max(counts)) for k in chunks if j < counts[k]]
        chosen += order[:c.recompute_layers]
    return sorted(chosen)


# ---------------------------------------------------------------------------
# One candidate: compiled, estimated, measured.
# ---------------------------------------------------------------------------

def _evaluate(family, c: Candidate, layers, batch, seq, cluster, optimizer):
    """Compiles `c` abstractly on a `family` model `layers` deep, on the
    global batch (a pipeline traces one micro-batch of it), for `cluster`
    (propagation weighs collectives by their time there): its report and
    estimate."""
    shallow = _shallow(family, layers)  # fresh: parallelize marks what it plans
    mesh, config = _mesh_and_config(shallow, c)
    ids = np.zeros((batch, seq), np.int64)
    prog = ernie_compile(shallow, copy.deepcopy(optimizer), [ids, ids], mesh=mesh,
                         config=config or None, abstract=True, cluster=cluster)
    report = prog.report()
    est = prog.estimate()
    comm = sum(v["bytes"] for v in report["collectives"].values())
    # Per stage and function: each is affine in the layers, their max is
    # not (the fullest stage, and the function with a stage's largest
    # arena, can change with depth), so each is carried on its own.
    functions = [[st["parameter_bytes"] + st["optimizer_state_bytes"] + st["gradient_bytes"] +
                  st["activation_bytes"] + st["staged_bytes"] + arena
                  for arena in st["arena_bytes_by_function"].values()]
                 for st in report["stages"]] \
        if "stages" in report else [[report["peak_bytes_per_rank"]]]
    stages = [max(f) for f in functions]
    assert max(stages) == report["peak_bytes_per_rank"]
    # What recomputation cannot shrink: parameters, gradients, optimizer state.
    state = [st["parameter_bytes"] + st["optimizer_state_bytes"] + st["gradient_bytes"]
             for st in report["stages"]] if "stages" in report else \
        [report.get("model_state_bytes", 0)]
    # What ZeRO cannot shrink: the activations kept for the backward (and
    # the micro-batches' hand-offs a stage holds).
    kept = [st["activation_bytes"] + st["staged_bytes"] for st in report["stages"]] \
        if "stages" in report else [report.get("activation_bytes", 0)]
    return {"step_seconds": est["step_seconds"], "memory_bytes": max(stages),
            "function_bytes": functions, "stage_bytes": stages, "state_bytes": state,
            "kept_bytes": kept, "comm_bytes": comm, "estimate": est}


def _between(a, b, t):
    """a + t (b - a), through the nested results of _evaluate."""
    if isinstance(a, dict):
        return {key: _between(a.get(key, 0), b.get(key, 0), t) for key in set(a) | set(b)}
    if isinstance(a, list):
        return [_between(x, y, t) for x, y in zip(a, b)]
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        return a + t * (b - a)
    return b


def _shift(a, b, c):
    """a + b - c, through the nested results of _evaluate."""
    if isinstance(a, dict):
        return {key: _shift(a.get(key, 0), b.get(key, 0), c.get(key, 0))
                for key in set(a) | set(b)}
    if isinstance(a, list):
        return [_shift(x, y, z) for x, y, z in zip(a, b, c)]
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        return a + b - c
    return b


def _derived(out, like):
    """Sets what is not affine in the layers from what is: the fullest
    stage's memory (the fullest stage, and a stage's largest arena, can
    change), MFU and HFU (ratios); `like` gives the peak FLOP/s and the
    ranks."""
    out["stage_bytes"] = [max(f) for f in out["function_bytes"]]
    out["memory_bytes"] = max(out["stage_bytes"])
    out["state_bytes"] = max(out["state_bytes"]) if isinstance(out["state_bytes"], list) \
        else out["state_bytes"]
    e = out["estimate"]
    e["peak_flops"], e["ranks"] = like["estimate"]["peak_flops"], like["estimate"]["ranks"]
    capacity = e["step_seconds"] * e["peak_flops"] * e["ranks"]
    e["mfu"] = e["model_flops"] / capacity if capacity > 0 else 0.0
    e["hfu"] = (e["model_flops"] + e["recompute_flops"]) / capacity if capacity > 0 else 0.0
    return out


def _extrapolate(one, two, per_chunk, stage_layers=()):
    """Affine in the layers per chunk: one at 1, two at 2, wanted at
    per_chunk; with uneven `stage_layers` (each stage's layers per chunk),
    each stage's memory at its own count (the step at the fullest chunk's:
    the pipeline waits for it)."""
    out = _between(one, two, per_chunk - 1)
    if stage_layers:
        for key in ("function_bytes", "state_bytes"):
            out[key] = [_between(a, b, n - 1) for a, b, n in zip(one[key], two[key], stage_layers)]
    return _derived(out, two)


def _partial_recompute(c: Candidate, kept, recomputed, limit, stage_layers):
    """Between keeping every layer's activations (`kept`, too big) and
    recomputing every layer (`recomputed`, fits): the fewest layers per
    stage to recompute so that every stage fits, as (candidate, guess), or
    None when that is all of them. Each recomputed layer trades the same
    memory for the same time, so the guess is the two ends' mix by the
    share of layers recomputed."""
    share = 0.0
    for full_kept, full_recomputed in zip(kept["stage_bytes"], recomputed["stage_bytes"]):
        if full_kept > limit:
            saved = full_kept - full_recomputed
            if saved <= 0:
                return None
            share = max(share, (full_kept - limit) / saved)
    layers = max(1, math.ceil(share * stage_layers - 1e-9))
    if layers >= stage_layers:
        return None
    guess = _derived(_between(kept, recomputed, layers / stage_layers), recomputed)
    return dataclasses.replace(c, recompute_layers=layers), guess


def _candidates(model, n, devices_per_node, global_batch, micro_batch_sizes, max_vpp,
                choices=None):
    choices = choices or {}
    allowed = lambda knob, v: knob not in choices or v in choices[knob]
    cfg = model.config
    heads, kv, layers = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_hidden_layers
    has_sp = _tp_plan(model, True) is not None
    experts = _num_experts(cfg) if _is_moe(cfg) else 0
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    for mp in divisors:
        # Megatron keeps tensor parallelism inside a node; heads split evenly.
        if mp > devices_per_node or heads % mp or kv % mp:
            continue
        for pp in (d for d in divisors if (n // mp) % d == 0):
            dp = n // (mp * pp)
            if global_batch % dp or layers < pp:
                continue
            local = global_batch // dp
            for vpp in range(1, max_vpp + 1):
                if (vpp > 1 and pp == 1) or layers < pp * vpp:
                    continue
                # Chunks of unequal layer counts where pp x vpp does not
                # divide the layers, when no stage holds over 1.5x another's
                # (126 layers on 16 stages, 7 or 8 each, yes; 28 on 16, 1 or
                # 2, no: a pipeline that deep has nothing to balance).
                uneven = uneven_stages(layers, pp * vpp) if pp > 1 and layers % (pp * vpp) \
                    else ()
                if uneven:
                    per_stage = [sum(uneven[v * pp + s] for v in range(vpp)) for s in range(pp)]
                    if max(per_stage) > 1.5 * min(per_stage):
                        continue
                sizes = micro_batch_sizes if pp > 1 else (local,)
                for mbs in sizes:
                    if local % mbs:
                        continue
                    m = local // mbs
                    if pp > 1 and (m < pp or (vpp > 1 and m % pp)):
                        continue
                    # Fused gradient accumulation is never slower: the
                    # other way is searched only when asked for.
                    fusions = choices.get("gradient_accumulation_fusion", (True,)) \
                        if pp > 1 else (True,)
                    for sp, fusion, (ep, on_dp) in itertools.product(
                            (False, True) if mp > 1 and has_sp else (False,), fusions,
                            _expert_layouts(experts, dp)):
                        c = Candidate(dp // ep if ep > 1 and not on_dp else dp, mp, pp, vpp, sp,
                                      micro_batch_size=mbs, micro_batches=m,
                                      gradient_accumulation_fusion=fusion, ep=ep,
                                      ep_on_dp=on_dp, layers_per_stage=uneven)
                        if all(allowed(k, getattr(c, k)) for k in
                               ("dp", "mp", "pp", "vpp", "sequence_parallel", "micro_batch_size",
                                "ep", "ep_on_dp")):
                            yield c


def _expert_layouts(experts, width):
    """(ep, on the dp axis) for a MoE model of `experts` experts on `width`
    data-parallel ranks: none (every rank holds every expert), each divisor
    of the width that divides the experts on an axis of its own, and the
    whole width as the dp / ZeRO axis itself. A dense model: none."""
    if not experts or width == 1:
        return [(1, False)]
    layouts = [(1, False)]
    layouts += [(ep, False) for ep in range(2, width) if width % ep == 0 and experts % ep == 0]
    if experts % width == 0:
        layouts.append((width, True))
    return layouts


def _memory_knobs(c: Candidate):
    """The candidate with each memory saving, the cheapest first."""
    zeros = (0, 1, 2, 3) if c.dp > 1 else (0,)
    # Under pp, ZeRO-3 regathers the parameters and ZeRO-2 reduce-scatters
    # the gradients in every micro-batch (m times ZeRO-1's traffic): not
    # offered there, as Megatron and DeepSpeed do not.
    if c.pp > 1:
        zeros = tuple(z for z in zeros if z <= 1)
    order = sorted(itertools.product(_RECOMPUTE_ORDER, zeros),
                   key=lambda rz: (_RECOMPUTE_ORDER.index(rz[0]) * 2 + rz[1]))
    for recompute, zero in order:
        yield dataclasses.replace(c, zero=zero, recompute=recompute)


@dataclasses.dataclass
class _Job:
    """One structure to search, and what the search knows of it."""
    family: tuple
    base: Candidate
    batch: int
    seq: int
    spec: dict
    optimizer: object
    limit: float
    verbose: bool
    first_only: bool = False  # only the fastest knobs (no ZeRO, no recomputation)
    first: dict | None = None  # their extrapolated result, when known
    # Selective recomputation saved nothing in another structure: it drops
    # the same ops in all (attention's softmax, which fused attention does
    # not keep), so it is not tried.
    skip_selective: bool = False

    @property
    def bound(self) -> float:
        """No memory knob makes a step faster: the structure's fastest
        knobs' time bounds every plan it has from below (0: unknown)."""
        return self.first["step_seconds"] if self.first else 0.0


def _guess(job: _Job, c: Candidate):
    """`c` compiled at one and two layers per chunk, extrapolated to the
    model's depth: (result, compiles)."""
    config = job.family[1]
    chunks = c.pp * c.vpp
    per_chunk = max(c.chunk_layers(config.num_hidden_layers))
    args = (job.batch, job.seq, job.spec, job.optimizer)
    one = _evaluate(job.family, c, chunks, *args)
    # At one layer per chunk the first compile is the model itself.
    two = _evaluate(job.family, c, 2 * chunks, *args) if per_chunk > 1 else one
    guess = _extrapolate(one, two, per_chunk,
                         [n / c.vpp for n in c.stage_layers(config.num_hidden_layers)]
                         if c.layers_per_stage else ())
    return guess, 2 if per_chunk > 1 else 1


def _search_structure(job: _Job):
    """One structure (dp, mp, pp, vpp, sp, micro-batch size): its memory
    knobs from the fastest on, until one fits. Returns (time, candidate,
    extrapolated result) of the first that fits or None, (candidate,
    memory) of the smallest tried, the compiles made, verbose lines, the
    fastest knobs' result (the structure's bound) and what it learnt of
    selective recomputation ("useless", "useful" or None). Full recomputation
    is partial (as few layers as memory needs), so once it fits the other
    ZeRO levels' are tried too and the fastest kept: a ZeRO level up can
    leave memory for a layer's activations, which is worth more than the
    optimizer step's gather it costs. `job.first_only` stops after the
    fastest knobs; `job.first` is their result from such a run."""
    base, limit, verbose = job.base, job.limit, job.verbose
    config = job.family[1]
    hopeless_zero, useless = set(), set()  # what cannot help this structure
    if job.skip_selective:
        useless.add("selective")
    tried, closest, compiles, lines = {}, None, 0, []
    best, first = None, job.first

    learnt = None  # whether selective recomputation saved memory here
    skipped = {}  # ZeRO level: its knobs without recomputation, not compiled
    fulls = {}  # ZeRO level: its result with full recomputation

    for i, c in enumerate(_memory_knobs(base)):
        if i > 0 and job.first_only:
            break
        if c.zero in hopeless_zero or c.recompute in useless:
            continue
        if best is not None and c.recompute != "full":
            continue
        # Activations the fastest knobs keep that alone exceed the device:
        # no ZeRO level without recomputation fits (ZeRO shards only state).
        if c.recompute == "none" and first is not None and i > 0 and \
                max(first["kept_bytes"]) > limit:
            skipped[c.zero] = c
            continue
        if i == 0 and first is not None:
            guess = first
        else:
            try:
                guess, count = _guess(job, c)
            except (ValueError, RuntimeError) as e:  # a combination ernie does not build
                if verbose:
                    lines.append(f"  {c.name}: skipped ({str(e).splitlines()[0][:120]})")
                continue
            compiles += count
            if i == 0:
                first = guess
        if closest is None or guess["memory_bytes"] < closest[1]:
            closest = (c, guess["memory_bytes"])
        if c.recompute == "full":
            fulls[c.zero] = guess
        # The same ZeRO level with one recomputation less, if tried.
        previous = tried.get((c.zero, _RECOMPUTE_ORDER[_RECOMPUTE_ORDER.index(c.recompute) - 1])) \
            if c.recompute != "none" else None
        if c.recompute == "selective" and previous is not None:
            learnt = "useful" if guess["memory_bytes"] < previous["memory_bytes"] else "useless"
        if verbose and not (i == 0 and job.first is not None):  # said in the first pass
            lines.append(f"  {c.name}: {guess['step_seconds'] * 1e3:.1f} ms, "
                         f"{guess['memory_bytes'] / 2**30:.1f} GiB")
        if guess["memory_bytes"] <= limit:
            # Full recomputation fits where keeping everything did not:
            # recompute only as many layers as that takes.
            kept = tried.get((c.zero, "none"))
            if kept is None and c.recompute == "full" and c.zero in skipped and 0 in fulls:
                # Passed over as not fitting: ZeRO's and recomputation's
                # effects add up (one shards state, the other drops
                # activations), so it is the first knobs plus this ZeRO
                # level's difference under full recomputation.
                kept = _derived(_shift(first, guess, fulls[0]), guess)
            partial = _partial_recompute(c, kept, guess, limit,
                                         max(c.stage_layers(config.num_hidden_layers))) \
                if c.recompute == "full" and kept is not None else None
            if partial is not None:
                c, guess = partial
                if verbose:
                    lines.append(f"  {c.name}: {guess['step_seconds'] * 1e3:.1f} ms, "
                                 f"{guess['memory_bytes'] / 2**30:.1f} GiB")
            found = (guess["step_seconds"], c, guess)
            if c.recompute != "full":
                return found, closest, compiles, lines, first, learnt
            if best is None or found[0] < best[0]:
                best = found
            continue
        # Its state alone does not fit: no recomputation at this ZeRO level
        # will. A recomputation that saved nothing (fused attention keeps no
        # softmax for selective to drop) is not tried again.
        if guess["state_bytes"] > limit:
            hopeless_zero.add(c.zero)
        if previous is not None and guess["memory_bytes"] >= previous["memory_bytes"]:
            useless.add(c.recompute)
        tried[(c.zero, c.recompute)] = guess
    return best, closest, compiles, lines, first, learnt


def _search_structures(jobs, workers, keep, exhaustive=False):
    """_search_structure over every structure, branch and bound: first each
    structure's fastest knobs alone (its time bounds its plans from below;
    many fit there and are done), then the rest by that bound, fastest
    first, skipping a structure once `keep` plans are known faster than its
    bound and its expert layout has one too (explain() compares the
    layouts' best). The `keep` best and each layout's best are those an
    exhaustive search finds; `exhaustive` searches every structure (a
    bench ranking a published plan far down). Selective recomputation
    that saved nothing in one structure is not tried in those after it (it
    drops the same ops in all). Returns (found, closest, compiles, lines)
    per structure searched."""
    firsts = list(_map(_search_structure,
                       [dataclasses.replace(j, first_only=True) for j in jobs], workers))
    out, rest, times, layouts = [], [], [], {}
    selective = {"useful": False, "useless": False}  # what structures found

    def record(result):
        if result[5] is not None:
            selective[result[5]] = True
        found = result[0]
        if found is not None:
            times.append(found[0])
            layout = (found[1].ep, found[1].ep_on_dp)
            layouts[layout] = min(layouts.get(layout, math.inf), found[0])
        out.append(result[:4])

    for job, result in zip(jobs, firsts):
        if result[0] is not None:  # fits with its fastest knobs
            record(result)
        else:  # (bound 0 where those did not build: searched whole)
            rest.append(dataclasses.replace(job, first=result[4]))
            out.append((None, result[1], result[2], result[3]))
    rest.sort(key=lambda j: j.bound)

    def admit(job):
        if not exhaustive and len(times) >= keep:
            kth = sorted(times)[keep - 1]
            layout = layouts.get((job.base.ep, job.base.ep_on_dp), math.inf)
            if job.bound >= kth and job.bound >= layout:
                return None
        if selective["useless"] and not selective["useful"]:
            job = dataclasses.replace(job, skip_selective=True)
        return job

    for result in _stream(_search_structure, rest, workers, admit):
        record(result)
    return out


def _evaluate_job(job):
    """(candidate, its _evaluate)."""
    return job[1], _evaluate(*job)


def _worker_count(workers):
    """`workers`, or one per core when None."""
    return os.cpu_count() or 1 if workers is None else workers


def _in_process(jobs, workers):
    """Whether `jobs` run here: one worker or job, or a model class a fresh
    process cannot import."""
    try:
        pickle.dumps(jobs[0]) if jobs else None
        family = jobs[0].family if isinstance(jobs[0], _Job) else jobs[0][0]
        local = family[0].__module__ == "__main__"
    except (pickle.PicklingError, AttributeError, TypeError, IndexError):
        local = True
    return local or _worker_count(workers) <= 1 or len(jobs) <= 1


def _pool(workers, jobs):
    """Search worker processes (spawned: the compiler's threads do not
    survive a fork)."""
    return concurrent.futures.ProcessPoolExecutor(
        max_workers=min(_worker_count(workers), len(jobs)), mp_context=multiprocessing.get_context("spawn"),
        initializer=_exit_with_parent, initargs=(os.getpid(),))


def _map(fn, jobs, workers):
    """fn over jobs, in order: in `workers` processes, or here (_in_process)."""
    if _in_process(jobs, workers):
        return [fn(job) for job in jobs]
    with _pool(workers, jobs) as pool:
        with _workers_skip_main():
            results = pool.map(fn, jobs)  # starts the workers
        return list(results)


def _stream(fn, jobs, workers, admit):
    """fn over jobs in their order, each result as it comes; `admit(job)`,
    asked as a job would start (so with every result before it known but
    those still running), gives the job to run, or None to leave it out."""
    if _in_process(jobs, workers):
        for job in jobs:
            job = admit(job)
            if job is not None:
                yield fn(job)
        return
    with _pool(workers, jobs) as pool:
        width = min(_worker_count(workers), len(jobs))
        pending, queue = set(), iter(jobs)

        def fill():  # up to `width` jobs in flight
            for job in queue:
                job = admit(job)
                if job is not None:
                    pending.add(pool.submit(fn, job))
                    if len(pending) >= width:
                        return

        with _workers_skip_main():
            fill()  # starts the workers
        while pending:
            done, _ = concurrent.futures.wait(pending,
                                              return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                pending.discard(future)
                yield future.result()
            fill()


class _workers_skip_main:
    """While workers start: they import ernie, never the user's script
    (spawn re-runs `__main__` in each child, and a script calling auto_plan
    at its top level would search again there)."""

    def __enter__(self):
        self.main = sys.modules.get("__main__")
        self.saved = {k: getattr(self.main, k) for k in ("__file__", "__spec__")
                      if hasattr(self.main, k)}
        self.main.__spec__ = None
        if hasattr(self.main, "__file__"):
            del self.main.__file__

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            setattr(self.main, k, v)


def _exit_with_parent(parent: int) -> None:
    """In a search worker: end when the searching process is gone (killed,
    interrupted), instead of compiling the rest of its queue for no one."""

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)
    threading.Thread(target=watch, daemon=True).start()


def auto_plan(model, inputs=None, cluster="dgx_h100", global_batch=None, seq_len=None,
              ranks=None, top=5, memory_fraction=0.9, micro_batch_sizes=(1, 2, 4), max_vpp=2,
              optimizer=None, choices=None, verbose=False, workers=None, exhaustive=False):
    """The best plans for training `model` (built under ernie.nn.abstract(),
    with a `config` dataclass: any family of ernie.models — Llama, Qwen,
    ERNIE 4.5 dense and MoE, Qwen3-MoE) on `cluster` (a
    shipped name, a file or a dict; ernie.cost): a list of Plans, fastest
    first, each with predicted step time, MFU, memory per rank (exact: the
    abstract compile's report of the full model) and bytes communicated per
    step, and the mesh and parallelize config that build it
    (`parallelize(model, opt, plan.mesh, plan.config)`).

    The batch is `inputs` (token ids [global batch, sequence]) or
    `global_batch` and `seq_len`; `ranks` defaults to every device of the
    cluster; a plan fits when its peak per rank is at most
    `memory_fraction` of the device's memory. `optimizer` is the
    optimizer to plan for (default AdamW). `choices` narrows the search:
    {"mp": [4, 8], "pp": [8, 16], "sequence_parallel": [True], "ep": [8],
    "ep_on_dp": [True], ...}
    (Candidate's fields; "gradient_accumulation_fusion": [False] plans
    for Megatron without it, which the search otherwise leaves out as
    never faster). `workers` processes compile candidates at once
    (default: one per core; 1 searches in this process). Raises NothingFits
    with the smallest memory any plan needed.

    The search bounds each structure's time by its fastest knobs (no ZeRO,
    no recomputation) and leaves out structures that cannot reach the
    2 x `top` best or improve their expert layout's best;
    `exhaustive=True` searches all (to rank a plan far from the best).

    auto_plan.last_search keeps the search: candidates that fit, compiles,
    seconds, and `ranked` (every fitting candidate searched, by
    extrapolated time: exact up to 2 x `top`)."""
    if inputs is not None:
        shape = np.shape(inputs[0] if isinstance(inputs, (list, tuple)) else inputs)
        global_batch, seq_len = int(shape[0]), int(shape[1])
    if global_batch is None or seq_len is None:
        raise ValueError("auto_plan needs inputs, or global_batch and seq_len")
    if not hasattr(model, "config") or not hasattr(model.config, "num_hidden_layers"):
        raise ValueError(f"auto_plan needs a model with config.num_hidden_layers "
                         f"(Llama, ERNIE 4.5); {type(model).__name__} has none")
    spec = _cost.load_cluster(cluster)
    devices = spec["nodes"] * spec["devices_per_node"]
    n = ranks or devices
    if n > devices:
        raise ValueError(f"{n} ranks but the cluster has {devices} devices")
    limit = memory_fraction * spec["device"]["memory_bytes"]
    optimizer = optimizer or AdamW(1e-4)
    layers = model.config.num_hidden_layers
    started = time.perf_counter()

    structures = list(_candidates(model, n, spec["devices_per_node"], global_batch,
                                  micro_batch_sizes, max_vpp, choices))
    family = (type(model), model.config)
    jobs = [_Job(family, base, global_batch, seq_len, spec, optimizer, limit, verbose)
            for base in structures]
    scored, closest, compiles = [], None, 0
    for found, near, count, lines in _search_structures(jobs, workers, 2 * top, exhaustive):
        compiles += count
        for line in lines:
            print(line)
        if found is not None:
            scored.append(found)
        if near is not None and (closest is None or near[1] < closest[1]):
            closest = near
    if not scored:
        if closest is None:
            raise NothingFits(f"no plan of {n} ranks builds for this model and batch "
                              f"(global batch {global_batch}, {layers} layers)")
        c, need = closest
        raise NothingFits(
            f"nothing fits {spec['device'].get('name', 'the device')}'s "
            f"{limit / 2**30:.1f} GiB ({memory_fraction:.0%} of its memory) on {n} ranks: "
            f"the smallest plan, {c.name}, needs {need / 2**30:.1f} GiB per rank")

    scored.sort(key=lambda s: s[0])
    # The fastest of each expert layout, for explain().
    by_layout = {}
    for seconds, c, guess in scored:
        by_layout.setdefault((c.ep, c.ep_on_dp), (c.name, seconds, guess["estimate"]))
    # The best at full depth: exact memory (some may not fit after all),
    # compiled in order until `top` fit.
    finalists = [(family, c, layers, global_batch, seq_len, spec, optimizer)
                 for _, c, _ in scored[: 2 * top]]
    plans = []
    admit = lambda job: job if len(plans) < top else None  # noqa: E731
    for c, e in _stream(_evaluate_job, finalists, workers, admit):
        compiles += 1
        # A partial recomputation guessed a little short: one more layer
        # per stage until the real program fits (all of them is "full").
        stage_layers = max(c.stage_layers(layers))
        while e["memory_bytes"] > limit and 0 < c.recompute_layers < stage_layers:
            more = c.recompute_layers + 1
            c = dataclasses.replace(c, recompute_layers=0 if more == stage_layers else more)
            e = _evaluate(family, c, layers, global_batch, seq_len, spec, optimizer)
            compiles += 1
        if e["memory_bytes"] > limit:
            continue
        mesh, config = _mesh_and_config(model, c)
        est = e["estimate"]
        others = [alt for layout, alt in by_layout.items() if layout != (c.ep, c.ep_on_dp)]
        plans.append(Plan(c, est["step_seconds"], est["mfu"], e["memory_bytes"],
                          e["comm_bytes"], est, True, mesh, config, others))
    plans = sorted(plans, key=lambda p: p.step_seconds)[:top]
    auto_plan.last_search = {"candidates": len(scored), "compiles": compiles,
                             "seconds": time.perf_counter() - started,
                             "ranked": [(c, guess) for _, c, guess in scored]}
    return plans


# What a plan's name abbreviates, in the order its parts appear.
LEGEND = ("dpN mpN ppN: data, tensor and pipeline parallel degrees; vppN: model chunks per "
          "pipeline rank; sp: sequence parallelism; zeroN: ZeRO level N; rc-full[:L], "
          "rc-selective: activation recomputation (L: layers of each stage recomputed, all "
          "when absent); L7/8x14/7: layers per model chunk (pipeline stage x vpp) where "
          "they do not divide the layers (7, then 8 on 14 chunks, then 7); mMxB: M micro-batches of B sequences "
          "each; no-gaf: no gradient "
          "accumulation fusion; epN: the experts split N ways over an axis of their own "
          "inside dp (the batch split over dp x ep); epN@dp: over the dp / ZeRO axis itself.")


def format_table(plans, ranks_of_published=None, legend=True) -> str:
    """The plans as a table: step time, MFU, memory per rank, traffic; with
    `legend`, what the plan names abbreviate below it."""
    lines = [f"{'#':>2}  {'plan':44} {'step s':>9} {'MFU':>6} {'GiB/rank':>9} {'comm GB':>9}"]
    for i, p in enumerate(plans, 1):
        lines.append(f"{i:>2}  {p.name:44} {p.step_seconds:9.3f} {p.mfu * 100:5.1f}% "
                     f"{p.memory_bytes / 2**30:9.2f} {p.comm_bytes / 1e9:9.2f}")
    if legend:
        lines += ["", *textwrap.wrap(LEGEND, 100)]
    return "\n".join(lines)


def breakdown(estimate: dict) -> list:
    """Where a step goes, as (part, seconds): compute without recomputation,
    recomputation, exposed communication per mesh axis, the pipeline
    bubble, host overhead. The parts add up to the step."""
    e = estimate
    rows = [("compute", e["compute_seconds"] - e["recompute_seconds"]),
            ("recomputation", e["recompute_seconds"])]
    rows += [(f"exposed communication over {axis}", s)
             for axis, s in sorted(e["exposed_comm_seconds"].items())]
    rows += [("pipeline bubble", e["bubble_seconds"]), ("host overhead", e["overhead_seconds"])]
    return rows


def explain(plan: Plan) -> str:
    """The chosen plan's step, part by part (breakdown), as a table; for a
    MoE model, why its expert layout wins: the fastest plan of each other
    layout, and the parts of the step where it loses."""
    e = plan.estimate
    total = e["step_seconds"]
    out = [f"{plan.name}: {total:.3f} s per step, MFU {e['mfu'] * 100:.1f} %"]
    for what, s in breakdown(e):
        out.append(f"  {what:36} {s:9.4f} s  {s / total * 100 if total else 0:5.1f} %")
    if plan.alternatives:
        c = plan.candidate
        layout = f"ep{c.ep}" + ("@dp" if c.ep_on_dp else "") if c.ep > 1 else "no ep"
        out.append(f"why {layout}: the fastest plan of each other expert layout "
                   f"(extrapolated), and where its step is longer")
        mine = dict(breakdown(e))
        for name, seconds, estimate in sorted(plan.alternatives, key=lambda a: a[1]):
            worse = sorted(((s - mine.get(part, 0.0), part)
                            for part, s in breakdown(estimate)), reverse=True)
            because = ", ".join(f"{part} {d:+.4f} s" for d, part in worse[:2] if d > 0)
            out.append(f"  {name:40} {seconds:9.4f} s  {(seconds / total - 1) * 100:+6.1f} %"
                       + (f"  ({because})" if because else ""))
    return "\n".join(out)


def plot_breakdown(plans, path) -> None:
    """Writes a PNG of the plans' steps as stacked bars, one per plan, the
    chosen (first) on top: where each plan's time goes and why the first
    wins. Needs matplotlib (`pip install matplotlib`)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("plot_breakdown needs matplotlib: pip install matplotlib") from e
    parts = list(dict.fromkeys(part for p in plans for part, _ in breakdown(p.estimate)))
    colors = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.5 * len(plans)))
    rows = list(reversed(plans))  # the chosen plan on top
    left = [0.0] * len(rows)
    for i, part in enumerate(parts):
        widths = [dict(breakdown(p.estimate)).get(part, 0.0) for p in rows]
        ax.barh([p.name for p in rows], widths, left=left, color=colors(i % 10), label=part)
        left = [a + b for a, b in zip(left, widths)]
    for y, p in enumerate(rows):
        ax.text(left[y], y, f"  {p.step_seconds:.3g} s, MFU {p.mfu * 100:.1f} %",
                va="center", fontsize=8)
    ax.set_xlabel("predicted step time (s)")
    ax.set_xlim(0, max(left) * 1.35 if max(left) > 0 else 1)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(plans) < 4 else -0.15),
              ncol=3, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _model_from_args(a):
    """The abstract model the command line describes: a family (--model,
    or --hf-config's model_type / architectures) and its config fields
    (config.json's, then --set's)."""
    hf = {}
    if a.hf_config:
        path = Path(a.hf_config)
        path = path / "config.json" if path.is_dir() else path
        hf = read_json(path)
        if not isinstance(hf, dict):
            raise ValueError(f"{path}: not a JSON object")
        family = family_of(hf, path)
        if a.model and a.model != family:
            raise ValueError(f"--model {a.model} but {path} describes a {family}")
    else:
        family = a.model or "llama"
        if family not in FAMILIES:
            raise ValueError(f"--model {family!r} is not a family ernie has; it has "
                             f"{', '.join(sorted(FAMILIES))}")
        hf = {"model_type": family}
    make_config, model_class = FAMILIES[family]
    config_class = getattr(model_class, "config_class", None) or \
        type(make_config({"model_type": family}))
    names = {f.name for f in dataclasses.fields(config_class)}
    fields = {}
    for item in filter(None, ",".join(filter(None, (a.set, a.llama))).split(",")):
        key, _, value = item.partition("=")
        if key not in names:
            raise ValueError(f"--set {key}: {config_class.__name__} has no field {key!r}")
        try:
            fields[key] = json.loads(value)
        except json.JSONDecodeError:
            fields[key] = value  # a word: dtype=bf16
    if "dtype" in names and "dtype" not in fields and "torch_dtype" not in hf \
            and "dtype" not in hf:
        fields["dtype"] = "bf16"
    # A config.json's fields, then --set's; without one, the family's
    # defaults and --set's (checked together: one may need another).
    config = dataclasses.replace(make_config(hf), **fields) if a.hf_config \
        else config_class(**fields)
    with abstract():
        return model_class(config)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ernie.autoplan",
                                 description="The best parallel plans for a model on a cluster")
    ap.add_argument("--cluster", default="dgx_h100",
                    help=f"a shipped cluster ({', '.join(_cost.clusters())}) or a JSON file")
    ap.add_argument("--hf-config", help="a Hugging Face config.json (or its folder) of any "
                                        f"family ernie has ({', '.join(sorted(FAMILIES))})")
    ap.add_argument("--model", help="the family without --hf-config (default llama), as "
                                    "config.json's model_type")
    ap.add_argument("--set", default="", help="config fields: key=value,... (JSON values)")
    ap.add_argument("--llama", default="", help="the same as --set (Llama's fields)")
    ap.add_argument("--global-batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--ranks", type=int)
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--memory-fraction", type=float, default=0.9)
    ap.add_argument("--png", help="also write the plans' step breakdown as a PNG (matplotlib)")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args(argv)
    try:
        model = _model_from_args(a)
    except (ValueError, TypeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        plans = auto_plan(model, cluster=a.cluster, global_batch=a.global_batch, seq_len=a.seq,
                          ranks=a.ranks, top=a.top, memory_fraction=a.memory_fraction,
                          verbose=a.verbose)
    except NothingFits as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as e:  # a cluster too small, a file that does not load
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_table(plans))
    print()
    print(explain(plans[0]))
    if a.png:
        plot_breakdown(plans, a.png)
        print(f"\nbreakdown written to {a.png}")
    s = auto_plan.last_search
    print(f"\n{s['candidates']} candidates fit, {s['compiles']} abstract compiles, "
          f"{s['seconds']:.1f} s")
    return 0


"""ernie.Strategy: every setting of a compile in one documented place.

Paddle's `dist.Strategy` is the anchor: one object with a section per kind
of parallelism, each a dataclass whose fields are that section's settings.

    strategy = ernie.Strategy(dp=DataParallel(sharding_level=1),
                              mp=TensorParallel(parallelize_plan=plan),
                              pp=PipelineParallel(split_spec="llama.layers", accumulate_steps=4))
    program = ernie.compile(model, optimizer, [ids, labels], mesh, strategy=strategy)

Sections: `dp` (data parallelism and ZeRO), `mp` (tensor parallelism and
sequence parallelism), `pp` (pipeline), `ep` (experts), `moe` (routing),
`fp8`, `recompute`; and the settings of the whole compile: `cluster` (what
the program will run on), `device` ("cpu", "cuda", "cuda:N"), `fusion` and
`even_splits`. An absent section (None) is a parallelism not used.

The config dicts of Paddle's `parallelize` (`dp_config`, `mp_config`,
`pp_config`, `ep_config`, `moe_config`, `fp8_config`, `recompute`,
`even_splits`) and `compile`'s keywords (`fp8_config`, `fuse`, `device`,
`cluster`) are spellings of the same settings: `Strategy.from_config` reads
them, and this module is where every key and value is checked (a
misspelt key is an error naming the nearest valid one). Checks that need
the model or the mesh (a layer a regex must match, an axis the mesh must
have) are made where those are known, by parallelize and compile.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from dataclasses import dataclass, field
from typing import Any

from .nn import LayerList


def _unknown(what: str, given, known) -> ValueError | None:
    """The error for keys of `given` outside `known`, naming the nearest
    valid key of each; None when all are known."""
    unknown = sorted(set(given) - set(known))
    if not unknown:
        return None
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(str(key), [str(k) for k in known], n=1)
        if close:
            hints.append(f"{key!r}: did you mean {close[0]!r}?")
    return ValueError(f"unknown {what} keys {unknown} (known: {sorted(known)})"
                      + (f"; {'; '.join(hints)}" if hints else ""))


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class _Section:
    """A section: a dataclass whose `config_name` is its Paddle config key.
    Fields left at their defaults are not part of its config dict, so an
    absent key and a key set to its default mean the same."""

    config_name = ""

    @classmethod
    def from_config(cls, value):
        """The section from its config dict (or the section itself)."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise TypeError(f"{cls.config_name} is a dict ({', '.join(cls.keys())}), "
                            f"not {value!r}")
        error = _unknown(cls.config_name, value, cls.keys())
        if error:
            raise error
        return cls(**value)

    @classmethod
    def keys(cls):
        return [f.name for f in dataclasses.fields(cls)]

    def to_config(self) -> dict:
        """The section as its config dict: the fields that are not defaults."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            if value is not default and value != default:
                out[f.name] = value
        return out


@dataclass
class DataParallel(_Section):
    """`dp_config`: the batch split over the mesh axis "dp". `sharding_level`
    1-3 is ZeRO (optimizer state, + gradients, + parameters sharded over
    dp); gradients are reduced in buckets of `bucket_mb` MiB (0: each on its
    own) while the backward runs, narrow-float ones in f32 (`grad_reduce_dtype`
    "float32", Megatron's main grads) or in their own type ("native")."""

    config_name = "dp_config"
    sharding_level: int = 0
    bucket_mb: float = 25
    grad_reduce_dtype: str = "float32"

    def __post_init__(self):
        if self.sharding_level not in (0, 1, 2, 3) or isinstance(self.sharding_level, bool):
            raise ValueError(f"dp_config.sharding_level must be 0..3, not {self.sharding_level!r}")
        if not _finite_number(self.bucket_mb) or self.bucket_mb < 0:
            raise ValueError(f"dp_config.bucket_mb is a size in MiB >= 0, not {self.bucket_mb!r}")
        if self.grad_reduce_dtype not in ("float32", "native"):
            raise ValueError(f"dp_config.grad_reduce_dtype is 'float32' or 'native', "
                             f"not {self.grad_reduce_dtype!r}")


@dataclass
class TensorParallel(_Section):
    """`mp_config`: tensor parallelism over the mesh axis "mp".
    `parallelize_plan` maps a regex over sub-layer or parameter names to a
    plan (ColWiseParallel, RowWiseParallel, the sequence-parallel markers) or
    a list of them; `sequence_parallel_overlap` decomposes sequence
    parallelism's collective matmuls to overlap them."""

    config_name = "mp_config"
    parallelize_plan: dict = field(default_factory=dict)
    sequence_parallel_overlap: bool = False

    def __post_init__(self):
        if not isinstance(self.parallelize_plan, dict):
            raise TypeError(f"mp_config.parallelize_plan is a dict of regex to plans, "
                            f"not {self.parallelize_plan!r}")
        if not isinstance(self.sequence_parallel_overlap, bool):
            raise TypeError(f"mp_config.sequence_parallel_overlap is a bool, "
                            f"not {self.sequence_parallel_overlap!r}")


@dataclass
class PipelineParallel(_Section):
    """`pp_config`: pipeline parallelism over the mesh axis "pp".
    `split_spec` places the stage boundaries (a layer-name prefix, a list of
    them, or {name: SplitPoint}); `global_spec` names layers every stage
    runs; `accumulate_steps` micro-batches per step; `schedule_mode`
    "1F1B", "FThenB" or "VPP" (default: 1F1B, or VPP with vpp_degree > 1);
    `vpp_degree` chunks per pipeline rank; `gradient_accumulation_fusion`
    (Megatron's: each weight-gradient GEMM adds into the running sum);
    `layers_per_stage`: the layers split_spec matches, counted per stage
    (pp x vpp of them) when they do not divide evenly (Megatron's uneven
    first and last stages: 126 layers on 16 stages as [7, 8, ..., 8, 7])."""

    config_name = "pp_config"
    split_spec: Any = None
    global_spec: Any = None
    accumulate_steps: int = 1
    schedule_mode: str | None = None
    vpp_degree: int | None = None
    gradient_accumulation_fusion: bool = True
    layers_per_stage: Any = None

    def __post_init__(self):
        if self.layers_per_stage is not None:
            counts = self.layers_per_stage
            if not isinstance(counts, (list, tuple)) or not counts or \
                    not all(_is_int(c) and c >= 1 for c in counts):
                raise ValueError(f"pp_config.layers_per_stage is a list of layer counts >= 1, "
                                 f"one per stage, not {counts!r}")
            self.layers_per_stage = list(counts)
        for key in ("accumulate_steps", "vpp_degree"):
            value = getattr(self, key)
            if value is not None and (not _is_int(value) or value < 1):
                raise ValueError(f"pp_config.{key} must be an integer >= 1, not {value!r}")
        if not isinstance(self.gradient_accumulation_fusion, bool):
            raise TypeError(f"pp_config.gradient_accumulation_fusion is a bool, "
                            f"not {self.gradient_accumulation_fusion!r}")
        if self.split_spec is not None and not isinstance(self.split_spec, (str, list, tuple, dict)):
            raise TypeError("pp_config.split_spec is a layer-name prefix, a list of them, or a "
                            "{name: SplitPoint} dict")


@dataclass
class ExpertParallel(_Section):
    """`ep_config`: the MoE layers' experts split over `axis` (a mesh axis
    or a list of them: an axis of their own, or the dp / ZeRO axis);
    `degree` (checked against the axes); `token_groups` (default: one per
    token shard)."""

    config_name = "ep_config"
    axis: Any = "ep"
    degree: int | None = None
    token_groups: int | None = None

    def __post_init__(self):
        axes = [self.axis] if isinstance(self.axis, str) else self.axis
        if not isinstance(axes, (list, tuple)) or not axes or \
                not all(isinstance(a, str) and a for a in axes):
            raise TypeError(f"ep_config.axis is a mesh axis name or a list of them, "
                            f"not {self.axis!r}")
        for key in ("degree", "token_groups"):
            value = getattr(self, key)
            if value is not None and (not _is_int(value) or value < 1):
                raise ValueError(f"ep_config.{key} = {value!r} must be a positive integer")


class _Unset:
    """A compile keyword not given (so the Strategy's value holds)."""

    def __repr__(self):
        return "UNSET"


UNSET = _Unset()


class _Keep:
    """A MoE setting left as the model has it."""

    def __repr__(self):
        return "KEEP"


KEEP = _Keep()


@dataclass
class MoE(_Section):
    """`moe_config`: the routing settings of every MoE layer, each left as
    the model has it unless given: `capacity_factor` (None: dropless),
    `aux_loss_coef`, `orthogonal_loss_coef`, `z_loss_coef`, `norm_min`,
    `aux_free_rate` (the selection bias's step after each training step)."""

    config_name = "moe_config"
    capacity_factor: Any = KEEP
    aux_loss_coef: Any = KEEP
    orthogonal_loss_coef: Any = KEEP
    z_loss_coef: Any = KEEP
    norm_min: Any = KEEP
    aux_free_rate: Any = KEEP

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is KEEP or (f.name == "capacity_factor" and value is None):
                continue
            if not _finite_number(value) or value < 0:
                raise ValueError(f"moe_config.{f.name} must be a finite number >= 0, not {value!r}")


@dataclass
class FP8(_Section):
    """`fp8_config`: the linear layers' GEMMs in FP8. `recipe`: "current"
    (per-tensor scales from this step's amax), "delayed" (from an amax
    history of `history_length` steps, `margin`, `amax_compute` "max" or
    "most_recent") or "blockwise" (1 x `block_size` tiles, weights in
    squares); `fwd_format` / `grad_format` "e4m3" or "e5m2"; `exclude` /
    `include` regexes over parameter names (default exclude: embeddings,
    the LM head, routers); `pow2_scale` rounds scales to powers of two."""

    config_name = "fp8_config"
    recipe: str = "current"
    fwd_format: str = "e4m3"
    grad_format: str = "e5m2"
    exclude: str | None = None
    include: str | None = None
    history_length: int = 16
    margin: int = 0
    amax_compute: str = "max"
    block_size: int = 128
    pow2_scale: bool = False

    def __post_init__(self):
        given = self.to_config()
        if self.recipe not in ("current", "delayed", "blockwise"):
            raise ValueError(f"fp8_config.recipe must be current, delayed or blockwise, "
                             f"not {self.recipe!r}")
        if self.recipe != "delayed" and {"history_length", "margin", "amax_compute"} & set(given):
            raise ValueError("history_length, margin and amax_compute belong to the delayed recipe")
        if self.recipe != "blockwise" and "block_size" in given:
            raise ValueError("block_size belongs to the blockwise recipe")
        if not isinstance(self.pow2_scale, bool):
            raise ValueError(f"fp8_config.pow2_scale is a bool, not {self.pow2_scale!r}")
        for key in ("fwd_format", "grad_format"):
            if getattr(self, key) not in ("e4m3", "e5m2"):
                raise ValueError(f"fp8_config.{key} must be 'e4m3' or 'e5m2', "
                                 f"not {getattr(self, key)!r}")
        if self.amax_compute not in ("max", "most_recent"):
            raise ValueError(f"fp8_config.amax_compute must be 'max' or 'most_recent', "
                             f"not {self.amax_compute!r}")
        for key, least in (("history_length", 1), ("margin", 0), ("block_size", 1)):
            value = getattr(self, key)
            if not _is_int(value) or value < least:
                raise ValueError(f"fp8_config.{key} must be an integer >= {least}, not {value!r}")
        for key in ("exclude", "include"):
            value = getattr(self, key)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"fp8_config.{key} is a regex string, not {value!r}")


RECOMPUTE_MODES = ("none", "selective", "full")


@dataclass
class Recompute(_Section):
    """`recompute`: activations recomputed in the backward. `granularity`
    "none", "selective" (Megatron's: the attention core) or "full" (each
    ernie.nn.LayerList element's forward again); `layers`: a regex or a list
    of them, matched whole against the LayerList elements' names (default:
    every element). The config also takes a mode string, or a bool (True:
    "full", PaddleNLP's `recompute=True`)."""

    config_name = "recompute"
    granularity: str = "full"
    layers: Any = None

    @classmethod
    def from_config(cls, value):
        if isinstance(value, cls):
            return value
        if value is None or value is False:
            return cls("none")
        if value is True:
            return cls("full")
        if isinstance(value, str):
            return cls(value)
        if isinstance(value, dict):
            error = _unknown("recompute", value, cls.keys())
            if error:
                raise error
            return cls(**value)
        raise ValueError(f"recompute is one of {', '.join(RECOMPUTE_MODES)} (or a bool, or a dict "
                         f"with granularity and layers), not {value!r}")

    def __post_init__(self):
        if self.granularity not in RECOMPUTE_MODES:
            raise ValueError(f"recompute is one of {', '.join(RECOMPUTE_MODES)} (or a bool, or a "
                             f"dict with granularity and layers), not {self.granularity!r}")
        layers = [self.layers] if isinstance(self.layers, str) else self.layers
        if layers is not None and (not isinstance(layers, (list, tuple))
                                   or not all(isinstance(p, str) for p in layers)):
            raise TypeError(f"recompute.layers is a regex or a list of regexes, not {self.layers!r}")
        for pattern in layers or ():
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"recompute.layers {pattern!r} is not a regex: {e}") from None
        self.layers = None if layers is None else list(layers)

    def to_config(self) -> dict:
        return {"granularity": self.granularity, "layers": self.layers}

    def plan(self, model) -> tuple[str, dict]:
        """(mode, {id(layer): name}): the LayerList elements of `model`
        whose ops are marked for --ernie-recompute (selective without
        `layers`: every attention core, no layer)."""
        layers = {f"{name}.{i}" if name else str(i): child
                  for name, sub in model.named_sublayers(include_self=True)
                  if isinstance(sub, LayerList) for i, child in enumerate(sub)}
        if self.granularity == "none":
            return "none", {}
        if self.granularity == "full" and not layers:
            raise ValueError("recompute 'full' recomputes each element of an ernie.nn.LayerList, "
                             f"and the model ({type(model).__name__}) has none")
        if self.layers is None:
            chosen = layers if self.granularity == "full" else {}
        else:
            chosen = {}
            for pattern in self.layers:
                hits = {n: l for n, l in layers.items() if re.fullmatch(pattern, n)}
                if not hits:
                    known = ", ".join(list(layers)[:4]) + (", ..." if len(layers) > 4 else "")
                    raise ValueError(f"recompute.layers {pattern!r} matches no layer "
                                     f"(the model's: {known or 'none'})")
                chosen.update(hits)
        order = {name: i for i, name in enumerate(layers)}
        return self.granularity, {id(chosen[name]): name
                                  for name in sorted(chosen, key=order.get)}


# Section name -> its class, in Paddle's config order.
SECTIONS = {"dp": DataParallel, "mp": TensorParallel, "pp": PipelineParallel,
            "ep": ExpertParallel, "moe": MoE, "fp8": FP8, "recompute": Recompute}
_BY_CONFIG_NAME = {cls.config_name: name for name, cls in SECTIONS.items()}
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


@dataclass
class Strategy:
    """Every setting of a compile: a section per parallelism (None: not
    used) and the compile's own settings. See the module's docstring."""

    dp: DataParallel | None = None
    mp: TensorParallel | None = None
    pp: PipelineParallel | None = None
    ep: ExpertParallel | None = None
    moe: MoE | None = None
    fp8: FP8 | None = None
    recompute: Recompute | None = None
    cluster: Any = None
    device: str = "cpu"
    fusion: bool = True
    even_splits: bool = False

    def __post_init__(self):
        for name, cls in SECTIONS.items():
            value = getattr(self, name)
            if value is not None:  # a dict is the section's config spelling
                setattr(self, name, cls.from_config(value))
        if not isinstance(self.device, str) or not _DEVICE.fullmatch(self.device):
            raise ValueError(f"device {self.device!r}: expected 'cpu', 'cuda' or 'cuda:N'")
        if not isinstance(self.fusion, bool):
            raise TypeError(f"fusion is a bool, not {self.fusion!r}")
        if not isinstance(self.even_splits, bool):
            raise TypeError(f"even_splits is a bool, not {self.even_splits!r}")
        if self.cluster is not None and not isinstance(self.cluster, (str, dict)) \
                and not hasattr(self.cluster, "__fspath__"):
            raise TypeError(f"cluster is a shipped cluster name, a JSON file or a dict, "
                            f"not {self.cluster!r}")

    @classmethod
    def from_config(cls, config=None, *, fp8_config=None, fuse=UNSET, device=UNSET,
                    cluster=None) -> Strategy:
        """The strategy a Paddle `parallelize` config dict spells, with
        `compile`'s keywords (fp8_config and cluster: None, fuse and
        device: UNSET when not given). A Strategy passes through (keywords
        may not restate it)."""
        given = {k: v for k, v in (("fp8_config", fp8_config), ("cluster", cluster))
                 if v is not None}
        given.update({k: v for k, v in (("fuse", fuse), ("device", device)) if v is not UNSET})
        if isinstance(config, Strategy):
            if given:
                raise ValueError(f"{', '.join(sorted(given))} given both as compile keywords and "
                                 f"in the Strategy: give each setting once")
            return config
        if config is None:
            config = {}
        if not isinstance(config, dict):
            raise TypeError(f"config is a dict of Paddle's parallelize configs or an "
                            f"ernie.Strategy, not {config!r}")
        error = _unknown("parallelize config", config, [*_BY_CONFIG_NAME, "even_splits"])
        if error:
            raise error
        sections = {_BY_CONFIG_NAME[k]: v for k, v in config.items() if k in _BY_CONFIG_NAME}
        if "fp8_config" in given:
            sections["fp8"] = given["fp8_config"]  # the keyword wins, as it always has
        if sections.get("recompute", ...) is None:
            del sections["recompute"]
        return cls(**sections, even_splits=config.get("even_splits", False),
                   device=given.get("device", "cpu"), fusion=given.get("fuse", True),
                   cluster=given.get("cluster"))

    def to_config(self) -> dict:
        """The plan sections as Paddle's parallelize config dict."""
        config = {cls.config_name: getattr(self, name).to_config()
                  for name, cls in SECTIONS.items() if getattr(self, name) is not None}
        if self.even_splits:
            config["even_splits"] = True
        return config

    @property
    def parallel(self) -> bool:
        """Whether any section needs parallelize (a plan over a mesh)."""
        return any(getattr(self, name) is not None for name in ("dp", "mp", "pp", "ep", "moe")) \
            or self.even_splits

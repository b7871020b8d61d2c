"""A training job's configuration: TOML sections, command-line overrides and
one place where every key, type and range is checked.

    [model]        family, config (Hugging Face config fields), pretrained
    [data]         path (a Megatron .bin/.idx prefix), valid_fraction, eos_id
    [optimizer]    name, lr, weight_decay, beta1, beta2, eps, momentum
    [lr_schedule]  kind (cosine | linear | constant), warmup_steps, min_lr
    [training]     global_batch, seq_len, steps, grad_clip, seed, check_finite,
                   locate_nonfinite, recompute, fp8
    [parallel]     dp, mp, pp, zero, micro_batches, sequence_parallel,
                   ranks_per_process, schedule; or plan = "auto" with ranks
                   and cluster (the plan search chooses the rest)
    [checkpoint]   dir, every, keep, resume ("auto" | "never" | a path)
    [eval]         every, batches
    [metrics]      every, jsonl, tensorboard, plot, sample_ids
    [export]       hf (a Hugging Face folder written at the end)

`--section.key value` on the command line overrides a key (the value read as
a TOML value, else as a string). An unknown section or key, a value of the
wrong type or out of range is a ConfigError naming the key (and, for a
misspelling, the nearest valid one). Only the standard library.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A job configuration that cannot run: names the key."""


@dataclass
class Model:
    family: str = "llama"          # ernie.models.AutoConfig's model_type
    config: dict = field(default_factory=dict)  # the family's Hugging Face config fields
    pretrained: str = ""           # a Hugging Face folder to start from ("" : random init)


@dataclass
class Data:
    path: str = ""                 # prefix of the .bin / .idx pair (python -m ernie.data prepare)
    valid_fraction: float = 0.0    # documents held out for [eval]
    eos_id: int = -1               # appended between documents (-1: none)
    prefetch: int = 2              # batches prepared ahead in a thread


@dataclass
class Optimizer:
    name: str = "adamw"            # adamw | sgd
    lr: float = 3e-4
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    momentum: float = 0.0          # sgd only


@dataclass
class LrSchedule:
    kind: str = "cosine"           # cosine | linear | constant (after the warm-up)
    warmup_steps: int = 0
    min_lr: float = 0.0


@dataclass
class Training:
    global_batch: int = 8          # sequences per step
    seq_len: int = 128
    steps: int = 100
    grad_clip: float = 0.0         # global-norm bound (0: none)
    seed: int = 0                  # initial weights and the sample order
    check_finite: str = "results"  # off | results (a NaN / inf loss or gradient norm
                                   # stops the run) | tensors (every tensor checked: slow)
    locate_nonfinite: bool = True  # on a NaN (one process): replay from the last good
                                   # checkpoint checking every tensor, naming the first
    recompute: str = "none"        # none | selective (the attention core) | full (each layer)
    fp8: bool = False              # FP8 GEMMs (current scaling), e4m3 forward, e5m2 gradients


@dataclass
class Parallel:
    plan: str = "manual"           # manual | auto (the plan search over the mesh's ranks)
    dp: int = 1
    mp: int = 1
    pp: int = 1
    zero: int = 0                  # ZeRO level over dp (0-3)
    micro_batches: int = 1         # pipeline micro-batches (pp > 1)
    schedule: str = "1F1B"         # FThenB | 1F1B | VPP
    sequence_parallel: bool = False
    ranks_per_process: int = 0     # 0: every rank of the mesh in this process,
                                   # or the ranks / the launcher's process count
    ranks: int = 0                 # plan = "auto": the ranks to plan over (0: the
                                   # launched processes x ranks_per_process, at least 1)
    cluster: str = ""              # plan = "auto": a shipped cluster or a JSON file
                                   # ("": this machine, measured by calibrate_cpu)


@dataclass
class Checkpoint:
    dir: str = ""                  # "" : no checkpoints
    every: int = 0                 # steps between checkpoints (0: at the end only)
    keep: int = 2
    resume: str = "auto"           # auto (the newest complete one) | never | a checkpoint path


@dataclass
class Eval:
    every: int = 0                 # steps between evaluations (0: none)
    batches: int = 4               # validation batches per evaluation


@dataclass
class Metrics:
    every: int = 1                 # steps between log lines
    jsonl: str = ""                # a JSON line per logged step
    tensorboard: str = ""          # an event-file directory (needs the tensorboard package)
    plot: str = ""                 # a PNG of loss, lr and tokens/s at the end (needs matplotlib)
    sample_ids: bool = False       # JSONL: each step's global batch as sample ids


@dataclass
class Export:
    hf: str = ""                   # a Hugging Face folder written at the end


@dataclass
class JobConfig:
    model: Model = field(default_factory=Model)
    data: Data = field(default_factory=Data)
    optimizer: Optimizer = field(default_factory=Optimizer)
    lr_schedule: LrSchedule = field(default_factory=LrSchedule)
    training: Training = field(default_factory=Training)
    parallel: Parallel = field(default_factory=Parallel)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    eval: Eval = field(default_factory=Eval)
    metrics: Metrics = field(default_factory=Metrics)
    export: Export = field(default_factory=Export)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# Allowed values and ranges, by "section.key".
CHOICES = {
    "optimizer.name": ("adamw", "sgd"),
    "lr_schedule.kind": ("cosine", "linear", "constant"),
    "parallel.plan": ("manual", "auto"),
    "training.recompute": ("none", "selective", "full"),
    "training.check_finite": ("off", "results", "tensors"),
    "parallel.schedule": ("FThenB", "1F1B", "VPP"),
}
AT_LEAST = {  # inclusive lower bounds
    "training.global_batch": 1, "training.seq_len": 1, "training.steps": 1,
    "training.grad_clip": 0, "training.seed": 0, "optimizer.lr": 0,
    "optimizer.weight_decay": 0, "optimizer.eps": 0, "optimizer.momentum": 0,
    "lr_schedule.warmup_steps": 0, "lr_schedule.min_lr": 0,
    "parallel.dp": 1, "parallel.mp": 1, "parallel.pp": 1, "parallel.zero": 0,
    "parallel.micro_batches": 1, "parallel.ranks_per_process": 0, "parallel.ranks": 0,
    "checkpoint.every": 0, "checkpoint.keep": 1, "eval.every": 0, "eval.batches": 1,
    "metrics.every": 1, "data.valid_fraction": 0, "data.eos_id": -1, "data.prefetch": 1,
}
AS_WORDS = {"training.check_finite": ("off", "results")}  # a bool's word: (false, true)
BELOW = {"data.valid_fraction": 1, "optimizer.beta1": 1, "optimizer.beta2": 1}
AT_MOST = {"parallel.zero": 3}


def _nearest(name: str, options) -> str:
    close = difflib.get_close_matches(name, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_value(key: str, value, default):
    """`value` as the type of `default`, checked against the key's bounds."""
    kind = type(default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if key in AS_WORDS and isinstance(value, bool):  # check_finite = true
        value = AS_WORDS[key][value]
    if kind is bool and not isinstance(value, bool) or \
            kind is not bool and isinstance(value, bool) or not isinstance(value, kind):
        raise ConfigError(f"{key} must be {kind.__name__}, not {type(value).__name__} "
                          f"{value!r}")
    if kind is float and not math.isfinite(value):
        raise ConfigError(f"{key} must be finite, not {value!r}")
    if key in CHOICES and value not in CHOICES[key]:
        raise ConfigError(f"{key} = {value!r} is not one of {', '.join(CHOICES[key])}"
                          + _nearest(str(value), CHOICES[key]))
    if key in AT_LEAST and value < AT_LEAST[key]:
        raise ConfigError(f"{key} = {value!r} must be >= {AT_LEAST[key]}")
    if key in BELOW and value >= BELOW[key]:
        raise ConfigError(f"{key} = {value!r} must be < {BELOW[key]}")
    if key in AT_MOST and value > AT_MOST[key]:
        raise ConfigError(f"{key} = {value!r} must be <= {AT_MOST[key]}")
    return value


def from_dict(raw: dict, where: str = "the config") -> JobConfig:
    """A JobConfig from nested dicts (a parsed TOML file)."""
    job = JobConfig()
    sections = {f.name: f for f in dataclasses.fields(job)}
    for name, values in raw.items():
        if name not in sections:
            raise ConfigError(f"{where}: unknown section [{name}]{_nearest(name, sections)}")
        if not isinstance(values, dict):
            raise ConfigError(f"{where}: [{name}] must be a table, not {values!r}")
        section = getattr(job, name)
        keys = {f.name: f for f in dataclasses.fields(section)}
        for key, value in values.items():
            if key not in keys:
                raise ConfigError(f"{where}: unknown key {name}.{key}{_nearest(key, keys)}")
            setattr(section, key, _check_value(f"{name}.{key}", value, getattr(section, key)))
    return job


def parse_override(text: str) -> Any:
    """A command-line value: a TOML value ("3", "1e-3", "true", '"x"',
    "[1, 2]", "{a = 1}"), else the text itself as a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def load(path=None, overrides=()) -> JobConfig:
    """The job of TOML file `path` (None: every default) with `overrides`
    ([("section.key", text)]) applied."""
    raw: dict = {}
    where = "the config"
    if path is not None:
        where = str(path)
        try:
            raw = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such config file") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not TOML: {e}") from None
    for dotted, text in overrides:
        section, _, key = dotted.partition(".")
        if not key:
            raise ConfigError(f"--{dotted}: an override is --section.key value")
        table = raw.setdefault(section, {})
        if not isinstance(table, dict):
            raise ConfigError(f"--{dotted}: [{section}] is not a table")
        if section == "model" and key.startswith("config."):
            table.setdefault("config", {})[key[len("config."):]] = parse_override(text)
        else:
            table[key] = parse_override(text)
    return from_dict(raw, where)

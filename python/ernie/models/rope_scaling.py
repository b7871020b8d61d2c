"""Rotary embeddings with Hugging Face's frequency scalings.

A config.json names a scaling as `rope_scaling` (older transformers) or
inside `rope_parameters` (newer): `{"rope_type": "llama3", "factor": 8.0,
"low_freq_factor": 1.0, "high_freq_factor": 4.0,
"original_max_position_embeddings": 8192}` (Llama 3.1 and later) or
`{"rope_type": "linear", "factor": f}`. Their inverse frequencies are
transformers' (`modeling_rope_utils`): llama3 divides the low frequencies
by `factor`, keeps the high ones and interpolates between. A scaled rope is
the rotate-half rotation by cos/sin tables of the positions 0..seq-1
(constants of the program; ernie.rope computes the unscaled one itself).
Other kinds (yarn, dynamic, longrope) are refused naming the field.
"""

from __future__ import annotations

import math

import numpy as np

from .. import functional as F

KINDS = ("default", "linear", "llama3")
_REQUIRED = {"linear": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                        "original_max_position_embeddings")}


def from_hf(hf: dict, family: str):
    """(rope_theta or None, the scaling dict or None) of a config.json."""
    scaling = None
    for key in ("rope_scaling", "rope_parameters"):
        rope = hf.get(key)
        if rope is None:
            continue
        kind = rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else None
        if kind not in KINDS:
            raise ValueError(f"config.json: {key} = {str(rope)[:80]} is not supported (ernie's "
                             f"{family} computes the {', '.join(KINDS)} rotary embeddings, not "
                             f"{kind or 'this'} scaling)")
        if kind != "default":
            scaling = checked({k: v for k, v in rope.items() if k != "rope_theta"},
                              f"config.json: {key}")
    parameters = hf.get("rope_parameters")
    if isinstance(parameters, dict) and "rope_theta" in parameters:
        if "rope_theta" in hf and hf["rope_theta"] != parameters["rope_theta"]:
            raise ValueError(f"config.json: rope_theta {hf['rope_theta']!r} and "
                             f"rope_parameters.rope_theta {parameters['rope_theta']!r} differ")
        return parameters["rope_theta"], scaling
    return None, scaling


def checked(scaling: dict, where: str) -> dict:
    """`scaling` with `rope_type` set, its fields present and positive."""
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind not in _REQUIRED:
        raise ValueError(f"{where}: rope_type {kind!r} is not one of {sorted(_REQUIRED)}")
    for key in _REQUIRED[kind]:
        value = scaling.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not math.isfinite(value) or value <= 0:
            raise ValueError(f"{where}: {kind} scaling needs a positive {key}, got {value!r}")
    if kind == "llama3" and scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        raise ValueError(f"{where}: high_freq_factor must exceed low_freq_factor")
    return {**scaling, "rope_type": kind}


def inv_freq(dim: int, theta: float, scaling: dict | None) -> np.ndarray:
    """The dim/2 inverse frequencies, as transformers computes them."""
    freq = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    if scaling is None:
        return freq
    if scaling["rope_type"] == "linear":
        return freq / scaling["factor"]
    factor, low, high = (scaling[k] for k in ("factor", "low_freq_factor", "high_freq_factor"))
    old = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / freq
    scaled = np.where(wavelen > old / low, freq / factor, freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return np.where(medium, smoothed, scaled)


def rope(x, positions, theta: float, scaling: dict | None):
    """x [batch, seq, heads, head_dim] rotated at positions 0..seq-1
    (`positions`, ernie.rope's, unused under a scaling: the tables are
    constants of the sequence length)."""
    if scaling is None:
        return F.rope(x, positions, theta)
    b, s, h, d = x.shape
    angles = np.outer(np.arange(s, dtype=np.float64), inv_freq(d, theta, scaling))

    def table(f):
        t = F.constant(f(angles).astype(np.float64 if x.dtype == "f64" else np.float32)
                       .reshape(1, s, 1, d // 2))
        return F.broadcast_to(t if t.dtype == x.dtype else t.astype(x.dtype), [b, s, h, d // 2])
    cos, sin = table(np.cos), table(np.sin)
    x1, x2 = F.split(x, [d // 2, d // 2], axis=3)
    return F.concat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=3)

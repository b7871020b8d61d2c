"""Rotary embeddings with Hugging Face's frequency scalings.

A config.json names a scaling as `rope_scaling` (older transformers) or
inside `rope_parameters` (newer): `{"rope_type": "llama3", "factor": 8.0,
"low_freq_factor": 1.0, "high_freq_factor": 4.0,
"original_max_position_embeddings": 8192}` (Llama 3.1 and later) or
`{"rope_type": "linear", "factor": f}` or YaRN (`"yarn"`: `factor`,
`original_max_position_embeddings`, `beta_fast`/`beta_slow`, `mscale`,
`mscale_all_dim`, `attention_factor`, `truncate`; Qwen's long-context and
DeepSeek-V3's configs). Their inverse frequencies and cos/sin factor are
transformers' (`modeling_rope_utils`): llama3 divides the low frequencies
by `factor`, keeps the high ones and interpolates between; YaRN ramps
between interpolated and extrapolated frequencies and scales cos/sin. A
scaled rope is the rotation by cos/sin tables of the positions 0..seq-1
(constants of the program; ernie.rope computes the unscaled one itself),
of halves or, `interleaved`, of adjacent pairs. Other kinds (dynamic,
longrope) are refused naming the field.
"""

from __future__ import annotations

import math

import numpy as np

from .. import functional as F

KINDS = ("default", "linear", "llama3", "yarn")
_REQUIRED = {"linear": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                        "original_max_position_embeddings"),
             "yarn": ("factor", "original_max_position_embeddings")}


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


def mscale(factor: float, m: float = 1.0) -> float:
    """YaRN's attention scale (its Eq. 21): 0.1 m log(factor) + 1."""
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def attention_factor(scaling: dict | None) -> float:
    """What a scaling multiplies cos and sin by (YaRN's; 1 otherwise)."""
    if scaling is None or scaling["rope_type"] != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if m and m_all:
        return mscale(scaling["factor"], m) / mscale(scaling["factor"], m_all)
    return mscale(scaling["factor"])


def softmax_scale(scaling: dict | None) -> float:
    """The factor MLA (DeepSeek) folds into attention's softmax scale:
    YaRN's mscale(factor, mscale_all_dim) squared."""
    if scaling is None or scaling["rope_type"] != "yarn" or not scaling.get("mscale_all_dim"):
        return 1.0
    return mscale(scaling["factor"], scaling["mscale_all_dim"]) ** 2


def inv_freq(dim: int, theta: float, scaling: dict | None) -> np.ndarray:
    """The dim/2 inverse frequencies, as transformers computes them."""
    freq = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    if scaling is None:
        return freq
    if scaling["rope_type"] == "linear":
        return freq / scaling["factor"]
    if scaling["rope_type"] == "yarn":
        factor, old = scaling["factor"], scaling["original_max_position_embeddings"]
        fast, slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

        def correction(rotations):  # the dimension turning `rotations` times in `old`
            return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(theta))
        low, high = correction(fast), correction(slow)
        if scaling.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extrapolation = 1 - ramp
        return freq / factor * (1 - extrapolation) + freq * extrapolation
    factor, low, high = (scaling[k] for k in ("factor", "low_freq_factor", "high_freq_factor"))
    old = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / freq
    scaled = np.where(wavelen > old / low, freq / factor, freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return np.where(medium, smoothed, scaled)


def rope(x, positions, theta: float, scaling: dict | None, interleaved: bool = False):
    """x [batch, seq, heads, head_dim] rotated at positions 0..seq-1
    (`positions`, ernie.rope's, unused under a scaling: the tables are
    constants of the sequence length). `interleaved`: the pairs are
    adjacent dimensions, and the result holds their first members, then
    their second (transformers' layout for DeepSeek's interleaved rope: a
    permutation q and k share, so q.k is unchanged)."""
    if scaling is None:
        return F.rope(x, positions, theta, interleaved=interleaved)
    b, s, h, d = x.shape
    angles = np.outer(np.arange(s, dtype=np.float64), inv_freq(d, theta, scaling))
    factor = attention_factor(scaling)

    def table(f):  # [1, seq, 1, d/2], broadcast over batch and heads
        values = (f(angles) * factor).astype(np.float64 if x.dtype == "f64" else np.float32)
        t = F.constant(values.reshape(1, s, 1, d // 2))
        t = t if t.dtype == x.dtype else t.astype(x.dtype)
        return F.broadcast_to(t, [b, s, h, d // 2])
    cos, sin = table(np.cos), table(np.sin)
    if interleaved:
        x1, x2 = (p.reshape(b, s, h, d // 2)
                  for p in F.split(x.reshape(b, s, h, d // 2, 2), [1, 1], axis=4))
    else:
        x1, x2 = F.split(x, [d // 2, d // 2], axis=3)
    return F.concat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=3)

"""ernie.fp8: FP8 quantization, computed as the compiler's FP8 lowering computes it.

For users who want to inspect the numbers an FP8 recipe produces::

    codes, scales = ernie.fp8.quantize(w, "e4m3", block=(128, 128), pow2_scale=True)
    w_seen = ernie.fp8.dequantize(codes, scales, "e4m3", block=(128, 128))

The rules below are the contract the ``--ernie-fp8-lowering`` pass follows
too; change them in both places or neither.

Formats
    ``"e4m3"`` is float8 E4M3FN (bias 7, 3 mantissa bits, largest finite
    value 448, no infinity, NaN is S.1111.111); ``"e5m2"`` is float8 E5M2
    (bias 15, 2 mantissa bits, largest finite value 57344, IEEE infinities
    and NaNs). Anything else is a ValueError.

Scaling groups
    ``block=None``: one scale for the whole tensor (per-tensor, "current"
    scaling). ``block=(r, c)``: tiles of r x c elements over the LAST TWO
    dimensions; any leading dimensions are batch, and every batch element is
    tiled on its own. (1, 128) is the activation/gradient tile and
    (128, 128) the weight block of DeepSeek-V3 and ERNIE 4.5. r and c must
    divide the last two dimensions (a ValueError names the dimension that
    they do not), and a block needs an array of rank >= 2.

Per group
    The input is converted to float32 first (a float64 input is rounded to
    float32 once); every step below is float32 arithmetic.

    * amax = max |x| over the group. A NaN anywhere in the group makes amax
      NaN, and it propagates: the scale is NaN and every code of the group
      is NaN (x * NaN), so dequantized values are NaN too.
    * s = fp8_max / amax (one rounded float32 division), except: amax == 0
      gives s = 1; amax == inf gives s = 1 (Transformer Engine's choice: the
      infinity then saturates like any overflow below); an s that overflows
      float32 (amax below fp8_max / FLT_MAX) becomes FLT_MAX.
    * pow2_scale: s = 2**floor(log2(s)), computed exactly from s's binary
      exponent (as DeepSeek-V3 and Transformer Engine's power-of-two
      scales). For a finite nonzero amax that did not clamp s, amax * s is
      then in (fp8_max / 2, fp8_max], up to the float32 rounding of the
      division (amax * s can exceed fp8_max by 2**-24 relative; saturation
      absorbs it).
    * codes = fp8(x * s): the product rounded to float32, then to the format
      with round-to-nearest-even, subnormals kept, and the runtime's
      saturation, NVIDIA's __NV_SATFINITE (cuda_fp8.h, so the CPU and the
      GPU agree): overflow and +-inf become +-448 (e4m3) or +-57344 (e5m2);
      NaN stays NaN.
      Without pow2_scale (and for a finite nonzero amax that did not clamp
      s) the group's amax element lands exactly on +-fp8_max.

    The fp8 encoding and decoding are the runtime's own conversions
    (``runtime/include/ernie/runtime/FloatConvert.h``, checked against
    LLVM's APFloat), reached through ``ernie._ernie.convert_float``.

Results
    ``codes``: a numpy uint8 array of the input's shape holding the fp8 bit
    patterns (numpy has no fp8 dtype; the runtime's .npy files store fp8 the
    same way, as raw bits). ``decode(codes, format)`` gives their float32
    values.

    ``scales``: float32 DEQUANTIZATION multipliers, scale_inv = 1 / s
    rounded to float32 (Transformer Engine's ``scale_inv`` and DeepSeek's
    convention): x is approximately decode(codes) * scale_inv. Per-tensor,
    a 0-d array; with ``block=(r, c)``, the input's shape with the last two
    dimensions divided by r and c.

    ``dequantize(codes, scales, format, block)`` multiplies each decoded
    code by its group's scale: the exact product (fp8 x float32 fits a
    float64) rounded once to ``dtype`` (float32 by default; the same result
    as a float32 multiply).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import NamedTuple

import numpy as np

from . import _ernie

# The largest finite value of each format, by the name `quantize` takes.
FORMATS = MappingProxyType({"e4m3": 448.0, "e5m2": 57344.0})
# The runtime's (MLIR's) spelling of each format.
_RUNTIME_NAME = {"e4m3": "f8E4M3FN", "e5m2": "f8E5M2"}

_FLT_MAX = np.finfo(np.float32).max


class _Format(NamedTuple):
    name: str
    runtime_name: str
    max: np.float32


def _format(format: str) -> _Format:
    if not isinstance(format, str) or format not in FORMATS:
        raise ValueError(f"unknown fp8 format {format!r}; known formats: "
                         f"{', '.join(FORMATS)}")
    return _Format(format, _RUNTIME_NAME[format], np.float32(FORMATS[format]))


def _block(block, shape: tuple[int, ...], what: str) -> tuple[int, int]:
    """(r, c) checked against `shape`: two positive integers dividing its last two dims."""
    if (not isinstance(block, (tuple, list)) or len(block) != 2
            or not all(isinstance(b, (int, np.integer)) and not isinstance(b, bool) and b > 0
                       for b in block)):
        raise ValueError(f"block must be None or two positive integers (rows, columns), "
                         f"not {block!r}")
    r, c = int(block[0]), int(block[1])
    if len(shape) < 2:
        raise ValueError(f"block ({r}, {c}) tiles the last two dimensions, but {what} of "
                         f"shape {tuple(shape)} has rank {len(shape)}")
    for dim, b in ((len(shape) - 2, r), (len(shape) - 1, c)):
        if shape[dim] % b:
            raise ValueError(f"block ({r}, {c}) does not divide {what} of shape "
                             f"{tuple(shape)}: dimension {dim} has size {shape[dim]}, "
                             f"not a multiple of {b}")
    return r, c


def _tiled(x: np.ndarray, r: int, c: int) -> np.ndarray:
    """x[..., R, C] viewed as [..., R/r, r, C/c, c]."""
    *lead, rows, cols = x.shape
    return x.reshape(*lead, rows // r, r, cols // c, c)


def _scale(amax: np.ndarray, fmt: _Format, pow2_scale: bool) -> np.ndarray:
    """The quantization multipliers s of the module docstring, float32."""
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        s = (fmt.max / amax).astype(np.float32)
    s = np.where((amax == 0) | np.isinf(amax), np.float32(1), s)
    s = np.where(np.isposinf(s), _FLT_MAX, s).astype(np.float32)
    if pow2_scale:
        # s = m * 2**e with m in [0.5, 1): floor(log2(s)) = e - 1, exactly.
        _, e = np.frexp(s)
        p = np.ldexp(np.float32(1), (e - 1).astype(np.int32)).astype(np.float32)
        s = np.where(np.isnan(s), s, p).astype(np.float32)
    return s


def quantize(array, format: str, block=None, pow2_scale: bool = False
             ) -> tuple[np.ndarray, np.ndarray]:
    """`array` in fp8: (codes as uint8 bit patterns, float32 dequantization scales).

    See the module docstring for the exact rules.
    """
    fmt = _format(format)
    x = np.asarray(array)
    if x.dtype.kind not in "biuf":
        raise TypeError(f"quantize needs a real numeric array, not {x.dtype}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if block is None:
        amax = np.max(np.abs(x), initial=np.float32(0)).astype(np.float32)
        s = _scale(amax, fmt, pow2_scale)
        with np.errstate(invalid="ignore", over="ignore"):
            y = x * s
    else:
        r, c = _block(block, x.shape, "an array")
        t = _tiled(x, r, c)
        amax = np.max(np.abs(t), axis=(-3, -1), initial=np.float32(0)).astype(np.float32)
        s = _scale(amax, fmt, pow2_scale)
        with np.errstate(invalid="ignore", over="ignore"):
            y = (t * s[..., :, None, :, None]).reshape(x.shape)
    codes = _ernie.convert_float(np.ascontiguousarray(y, dtype=np.float32), "f32",
                                 fmt.runtime_name)
    with np.errstate(divide="ignore"):
        scales = (np.float32(1) / s).astype(np.float32)
    return codes, np.asarray(scales, dtype=np.float32)


def _codes(codes) -> np.ndarray:
    c = np.asarray(codes)
    if c.dtype != np.uint8:
        raise TypeError(f"fp8 codes are uint8 bit patterns, not {c.dtype}")
    return np.ascontiguousarray(c)


def decode(codes, format: str) -> np.ndarray:
    """The float32 values of fp8 bit patterns (uint8), exactly."""
    fmt = _format(format)
    return _ernie.convert_float(_codes(codes), fmt.runtime_name, "f32")


def dequantize(codes, scales, format: str, block=None, dtype=np.float32) -> np.ndarray:
    """decode(codes) times each group's scale (the `scales` quantize returned).

    `format` is required (uint8 codes do not say which format they hold)
    and comes third, as in `quantize`. `block` must be the one the codes
    were quantized with (None: per-tensor, a 0-d scale). `scales` are read
    as float32. The exact product is rounded once to `dtype`.
    """
    values = decode(codes, format)
    dtype = np.dtype(dtype)
    if dtype.kind != "f":
        raise ValueError(f"dequantize produces a floating-point dtype, not {dtype}")
    s = np.asarray(scales, dtype=np.float32)
    if block is None:
        if s.shape != ():
            raise ValueError(f"per-tensor dequantize (block=None) needs a 0-d scale, not "
                             f"shape {s.shape}; pass the block the codes were quantized with")
        return (values.astype(np.float64) * np.float64(s)).astype(dtype)
    r, c = _block(block, values.shape, "codes")
    *lead, rows, cols = values.shape
    expected = (*lead, rows // r, cols // c)
    if s.shape != expected:
        raise ValueError(f"scales of shape {s.shape} do not fit codes of shape "
                         f"{values.shape} in blocks ({r}, {c}): expected {expected}")
    product = _tiled(values.astype(np.float64), r, c) * s.astype(np.float64)[..., :, None, :, None]
    return product.reshape(values.shape).astype(dtype)


__all__ = ["FORMATS", "decode", "dequantize", "quantize"]

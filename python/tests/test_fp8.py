"""ernie.fp8 against references written here from the formats' definitions.

The decoder is checked on all 256 codes of each format, the encoder (the
runtime's, through `_ernie.convert_float`) against a nearest-value search
over those codes, and quantize/dequantize against the error bound each
format implies, per tensor and per block.
"""

import math
import zlib

import numpy as np
import pytest

from ernie import _ernie, fp8

# name: (exponent bits, mantissa bits, IEEE specials, runtime spelling, max finite)
FORMATS = {
    "e4m3": (4, 3, False, "f8E4M3FN", 448.0),
    "e5m2": (5, 2, True, "f8E5M2", 57344.0),
}
FLT_MAX = float(np.finfo(np.float32).max)


def reference_value(code: int, fmt: str) -> float:
    """One code's value from sign, biased exponent and mantissa fields."""
    e_bits, m_bits, ieee, _, _ = FORMATS[fmt]
    bias = 2 ** (e_bits - 1) - 1
    sign = -1.0 if code >> (e_bits + m_bits) else 1.0
    exponent = (code >> m_bits) & (2 ** e_bits - 1)
    mantissa = code & (2 ** m_bits - 1)
    ones = 2 ** e_bits - 1
    if ieee and exponent == ones:
        return sign * math.inf if mantissa == 0 else math.nan
    if not ieee and exponent == ones and mantissa == 2 ** m_bits - 1:
        return math.nan  # E4M3FN: only S.1111.111 is NaN, no infinity
    if exponent == 0:  # subnormal
        return sign * mantissa * 2.0 ** (1 - bias - m_bits)
    return sign * (1 + mantissa / 2 ** m_bits) * 2.0 ** (exponent - bias)


def reference_table(fmt: str) -> np.ndarray:
    return np.array([reference_value(c, fmt) for c in range(256)])


def smallest_subnormal(fmt: str) -> float:
    e_bits, m_bits, *_ = FORMATS[fmt]
    return 2.0 ** (2 - 2 ** (e_bits - 1) - m_bits)


def reference_encode(values: np.ndarray, fmt: str) -> np.ndarray:
    """Nearest code by search over the finite codes, ties to the even code,
    overflow (infinities included: NVIDIA's __NV_SATFINITE) saturating to
    the largest finite value."""
    fmax = FORMATS[fmt][4]
    table = reference_table(fmt)
    positive = [c for c in range(128) if np.isfinite(table[c])]
    grid = table[positive]  # increasing
    out = np.empty(values.shape, dtype=np.uint8)
    for i, v in enumerate(values.astype(np.float64).ravel()):
        sign = 0x80 if math.copysign(1.0, v) < 0 else 0
        a = abs(v)
        assert not math.isnan(v), "NaN is checked separately"
        if a >= fmax:
            code = positive[-1]
        else:
            hi = int(np.searchsorted(grid, a))
            if grid[hi] == a:
                code = positive[hi]
            else:
                lo = hi - 1
                dlo, dhi = a - grid[lo], grid[hi] - a
                if dlo != dhi:
                    code = positive[lo] if dlo < dhi else positive[hi]
                else:
                    code = positive[lo] if positive[lo] % 2 == 0 else positive[hi]
        out.flat[i] = sign | code
    return out


def is_nan_code(codes: np.ndarray, fmt: str) -> np.ndarray:
    return np.isnan(reference_table(fmt)[codes])


# --- decode -------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_all_codes(fmt):
    codes = np.arange(256, dtype=np.uint8)
    got = fp8.decode(codes, fmt)
    want = reference_table(fmt)
    assert got.dtype == np.float32 and got.shape == (256,)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    np.testing.assert_array_equal(got[finite].astype(np.float64), want[finite])
    np.testing.assert_array_equal(np.signbit(got[finite]), np.signbit(want[finite]))


def test_decode_landmarks():
    e4m3 = fp8.decode(np.array([0x7E, 0x08, 0x07, 0x01, 0x7F, 0xFF, 0x80], np.uint8), "e4m3")
    np.testing.assert_array_equal(e4m3[:4], [448, 2.0 ** -6, 7 * 2.0 ** -9, 2.0 ** -9])
    assert np.isnan(e4m3[4]) and np.isnan(e4m3[5])
    assert e4m3[6] == 0 and np.signbit(e4m3[6])
    e5m2 = fp8.decode(np.array([0x7B, 0x04, 0x01, 0x7C, 0xFC, 0x7D, 0x7F], np.uint8), "e5m2")
    np.testing.assert_array_equal(e5m2[:5], [57344, 2.0 ** -14, 2.0 ** -16, np.inf, -np.inf])
    assert np.isnan(e5m2[5:]).all()
    assert fp8.FORMATS == {"e4m3": 448.0, "e5m2": 57344.0}


# --- encode (the runtime's conversion, as quantize uses it) -------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_matches_nearest_even_search(fmt):
    _, _, _, runtime_name, fmax = FORMATS[fmt]
    table = reference_table(fmt)
    finite = np.sort(np.unique(np.abs(table[np.isfinite(table)])))
    midpoints = (finite[:-1] + finite[1:]) / 2  # every tie, exact in f32
    rng = np.random.default_rng(1)
    spread = np.exp2(rng.uniform(-20, np.log2(fmax) + 2, 20000)) * rng.choice([-1, 1], 20000)
    near = np.concatenate([midpoints * (1 + 2.0 ** -20), midpoints * (1 - 2.0 ** -20)])
    values = np.concatenate([finite, -finite, midpoints, -midpoints, near, spread,
                             [fmax * 1.5, -fmax * 1.0625, 1e30, FLT_MAX, -FLT_MAX,
                              smallest_subnormal(fmt) / 2, smallest_subnormal(fmt) / 4, -0.0]])
    values = values.astype(np.float32)
    got = _ernie.convert_float(values, "f32", runtime_name)
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, reference_encode(values, fmt))


def test_saturation_and_specials():
    x = np.array([500, 1e6, np.inf, -np.inf, -470, np.nan], np.float32)
    e4m3 = _ernie.convert_float(x, "f32", "f8E4M3FN")
    np.testing.assert_array_equal(e4m3[:5], [0x7E, 0x7E, 0x7E, 0xFE, 0xFE])
    assert (e4m3[5] & 0x7F) == 0x7F
    x = np.array([60000, 1e6, np.inf, -np.inf, -1e30, np.nan], np.float32)
    e5m2 = _ernie.convert_float(x, "f32", "f8E5M2")
    np.testing.assert_array_equal(e5m2[:5], [0x7B, 0x7B, 0x7B, 0xFB, 0xFB])
    assert is_nan_code(e5m2[5:], "e5m2").all()


def test_convert_float_checks_its_arguments():
    with pytest.raises(TypeError, match="needs a float32 array, not float64"):
        _ernie.convert_float(np.zeros(3), "f32", "f8E4M3FN")
    with pytest.raises(TypeError, match="needs a uint8 array"):
        _ernie.convert_float(np.zeros(3, np.uint16), "f8E5M2", "f32")
    with pytest.raises(ValueError, match="not a narrow float type"):
        _ernie.convert_float(np.zeros(3, np.float32), "f32", "i32")
    with pytest.raises(ValueError, match="f32 to a narrow float type or back"):
        _ernie.convert_float(np.zeros(3, np.uint8), "f8E4M3FN", "f8E5M2")


# --- quantize / dequantize ----------------------------------------------------


def data_with_outliers(shape, seed):
    """Gaussian data with outliers, and some rows and tiles many decades
    smaller, so groups differ in scale and some values land in subnormals."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    x[rng.random(shape) < 1e-3] *= 1e3
    x[..., ::7, :] *= 1e-3
    x[..., :, 128:256] *= 1e-5
    return x.astype(np.float32)


def groups(a, block):
    """a[..., R, C] as [..., groups, elements] for `block` (None: one group)."""
    if block is None:
        return a.reshape(1, -1)
    r, c = block
    *lead, rows, cols = a.shape
    t = a.reshape(*lead, rows // r, r, cols // c, c)
    t = np.moveaxis(t, -3, -2)
    return t.reshape(*lead, rows // r, cols // c, r * c)


CASES = [(None, (3, 256, 384)), ((1, 128), (3, 256, 384)), ((128, 128), (3, 256, 384)),
         ((128, 128), (256, 384)), ((1, 128), (4, 384))]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("block,shape", CASES)
def test_round_trip_error_within_format_bound(fmt, pow2, block, shape):
    _, m_bits, _, _, fmax = FORMATS[fmt]
    x = data_with_outliers(shape, seed=zlib.crc32(repr((fmt, pow2, block, shape)).encode()))
    codes, scales = fp8.quantize(x, fmt, block=block, pow2_scale=pow2)
    assert codes.dtype == np.uint8 and codes.shape == x.shape
    assert scales.dtype == np.float32
    if block is None:
        assert scales.shape == ()
    else:
        assert scales.shape == x.shape[:-2] + (x.shape[-2] // block[0], x.shape[-1] // block[1])
    y = fp8.dequantize(codes, scales, fmt, block=block)
    assert y.dtype == np.float32 and y.shape == x.shape

    # Per element: half an ulp (2^-(m+1) relative) or half the smallest
    # subnormal, in the scaled domain, plus float32 roundings.
    s = 1 / np.broadcast_to(scales[..., None] if block else scales,
                            groups(x, block).shape[:-1] + (1,)).astype(np.float64)
    gx = groups(x, block).astype(np.float64)
    gy = groups(y, block).astype(np.float64)
    bound = 2.0 ** -(m_bits + 1) * np.abs(gx) + smallest_subnormal(fmt) / 2 / s \
        + 2.0 ** -21 * np.abs(gx)
    assert (np.abs(gy - gx) <= bound).all()
    # The brief's per-group form: within half an ulp of the group's max.
    amax = np.abs(gx).max(axis=-1, keepdims=True)
    assert (np.abs(gy - gx) <= 2.0 ** -(m_bits + 1) * amax * (1 + 2.0 ** -20)).all()

    # Where the group's largest element lands.
    decoded_max = np.abs(groups(fp8.decode(codes, fmt), block)).max(axis=-1)
    scaled_amax = amax[..., 0] / scales.astype(np.float64).reshape(amax.shape[:-1])
    if pow2:
        mantissa, _ = np.frexp(scales)
        assert (mantissa == 0.5).all(), "power-of-two scales"
        assert (scaled_amax > fmax / 2).all() and (scaled_amax <= fmax * (1 + 2.0 ** -23)).all()
        assert (decoded_max >= fmax / 2).all() and (decoded_max <= fmax).all()
    else:
        assert (decoded_max == fmax).all()
        want = np.float32(1) / (np.float32(fmax) / amax[..., 0].astype(np.float32))
        np.testing.assert_array_equal(scales.reshape(want.shape), want)


@pytest.mark.parametrize("fmt", FORMATS)
def test_float64_input_is_rounded_to_float32_once(fmt):
    x = np.random.default_rng(2).standard_normal((4, 256)) * 10
    for block in (None, (1, 128)):
        a = fp8.quantize(x, fmt, block)
        b = fp8.quantize(x.astype(np.float32), fmt, block)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])


def test_dequantize_is_the_exact_product_rounded_once():
    x = data_with_outliers((2, 128, 256), seed=3)
    codes, scales = fp8.quantize(x, "e4m3", (1, 128))
    exact = fp8.dequantize(codes, scales, "e4m3", (1, 128), dtype=np.float64)
    assert exact.dtype == np.float64
    values = fp8.decode(codes, "e4m3").astype(np.float64)
    per_element = np.repeat(scales.astype(np.float64), 128, axis=-1)
    np.testing.assert_array_equal(exact, values * per_element)
    np.testing.assert_array_equal(fp8.dequantize(codes, scales, "e4m3", (1, 128)),
                                  exact.astype(np.float32))
    codes, scale = fp8.quantize(x, "e5m2")
    values = fp8.decode(codes, "e5m2")
    np.testing.assert_array_equal(fp8.dequantize(codes, scale, "e5m2", dtype=np.float64),
                                  values.astype(np.float64) * np.float64(scale))
    np.testing.assert_array_equal(fp8.dequantize(codes, scale, "e5m2"), values * scale)


@pytest.mark.parametrize("block", [(1, 128), (128, 128)])
def test_tiles_are_independent(block):
    x = data_with_outliers((2, 256, 384), seed=4)
    codes, scales = fp8.quantize(x, "e4m3", block, pow2_scale=True)
    x2 = x.copy()
    x2[1, 0, 5] = 1e4  # inside tile (batch 1, 0, 0) only
    codes2, scales2 = fp8.quantize(x2, "e4m3", block, pow2_scale=True)
    changed = scales != scales2
    assert changed[1, 0, 0] and changed.sum() == 1
    r, c = block
    outside = np.ones(x.shape, bool)
    outside[1, :r, :c] = False
    np.testing.assert_array_equal(codes[outside], codes2[outside])


@pytest.mark.parametrize("fmt", FORMATS)
def test_zero_tile_has_scale_one_and_zero_codes(fmt):
    x = data_with_outliers((256, 256), seed=5)
    x[128:, :128] = 0
    codes, scales = fp8.quantize(x, fmt, (128, 128))
    assert scales[1, 0] == 1 and (codes[128:, :128] == 0).all()
    codes, scales = fp8.quantize(np.zeros((3, 4)), fmt)
    assert scales == 1 and (codes == 0).all()
    codes, scales = fp8.quantize(np.zeros((0, 128)), fmt, (1, 128))
    assert codes.shape == (0, 128) and scales.shape == (0, 1)


@pytest.mark.parametrize("fmt", FORMATS)
def test_nan_propagates_through_its_group_only(fmt):
    x = data_with_outliers((2, 128), seed=6)
    x[0, 3] = np.nan
    codes, scales = fp8.quantize(x, fmt, (1, 128))
    assert np.isnan(scales[0, 0]) and np.isfinite(scales[1, 0])
    assert is_nan_code(codes[0], fmt).all() and not is_nan_code(codes[1], fmt).any()
    y = fp8.dequantize(codes, scales, fmt, (1, 128))
    assert np.isnan(y[0]).all() and np.isfinite(y[1]).all()
    codes, scales = fp8.quantize(x, fmt, pow2_scale=True)
    assert np.isnan(scales) and is_nan_code(codes, fmt).all()


@pytest.mark.parametrize("fmt", FORMATS)
def test_infinity_gives_scale_one_and_saturates(fmt):
    _, _, _, runtime_name, fmax = FORMATS[fmt]
    x = np.array([[np.inf, -np.inf, 1.0, 300.0, 1e-3, 0.0]], np.float32)
    codes, scales = fp8.quantize(x, fmt, (1, 6))
    assert scales[0, 0] == 1
    values = fp8.decode(codes, fmt)
    # Infinities saturate in both formats (NVIDIA's __NV_SATFINITE).
    np.testing.assert_array_equal(values[0, :2], [fmax, -fmax])
    np.testing.assert_array_equal(codes[0, 2:], _ernie.convert_float(x[0, 2:], "f32", runtime_name))


@pytest.mark.parametrize("fmt", FORMATS)
def test_tiny_amax_clamps_the_scale_to_flt_max(fmt):
    x = np.array([[1e-38, -3e-39, 0.0, 1e-45]], np.float32)
    for pow2 in (False, True):
        codes, scales = fp8.quantize(x, fmt, pow2_scale=pow2)
        assert scales == (np.float32(2.0 ** -127) if pow2 else np.float32(1) / np.float32(FLT_MAX))
        assert not is_nan_code(codes, fmt).any()
        assert fp8.decode(codes, fmt)[0, 0] > 0


def test_codes_follow_the_runtime_npy_convention(tmp_path):
    codes, _ = fp8.quantize(np.linspace(-1, 1, 12).reshape(3, 4), "e5m2")
    np.save(tmp_path / "codes.npy", codes)
    assert np.load(tmp_path / "codes.npy").dtype.str == "|u1"


# --- bad input ----------------------------------------------------------------


def test_unknown_format():
    with pytest.raises(ValueError,
                       match="unknown fp8 format 'e4m3fnuz'; known formats: e4m3, e5m2"):
        fp8.quantize(np.ones((2, 2)), "e4m3fnuz")
    with pytest.raises(ValueError, match="known formats"):
        fp8.decode(np.zeros(2, np.uint8), "E4M3")
    with pytest.raises(ValueError, match="known formats"):
        fp8.dequantize(np.zeros((1, 128), np.uint8), np.ones((1, 1), np.float32), (1, 128))


def test_block_that_does_not_divide():
    with pytest.raises(ValueError, match=r"does not divide an array of shape \(2, 100, 256\): "
                                         r"dimension 1 has size 100, not a multiple of 128"):
        fp8.quantize(np.ones((2, 100, 256)), "e4m3", (128, 128))
    with pytest.raises(ValueError, match=r"dimension 1 has size 200, not a multiple of 128"):
        fp8.quantize(np.ones((4, 200)), "e4m3", (1, 128))
    with pytest.raises(ValueError, match="two positive integers"):
        fp8.quantize(np.ones((4, 128)), "e4m3", (0, 128))
    with pytest.raises(ValueError, match="two positive integers"):
        fp8.quantize(np.ones((4, 128)), "e4m3", 128)


def test_block_on_a_vector():
    with pytest.raises(ValueError, match=r"tiles the last two dimensions, but an array of "
                                         r"shape \(128,\) has rank 1"):
        fp8.quantize(np.ones(128), "e4m3", (1, 128))


def test_dequantize_shapes():
    codes, scales = fp8.quantize(np.ones((2, 256, 256)), "e4m3", (128, 128))
    with pytest.raises(ValueError, match=r"scales of shape \(2, 2, 2\) do not fit codes of shape "
                                         r"\(2, 256, 256\) in blocks \(1, 128\): expected "
                                         r"\(2, 256, 2\)"):
        fp8.dequantize(codes, scales, "e4m3", (1, 128))
    with pytest.raises(ValueError, match="per-tensor dequantize .* needs a 0-d scale"):
        fp8.dequantize(codes, scales, "e4m3")
    with pytest.raises(ValueError, match=r"codes of shape \(2, 256, 256\): dimension 2 has size "
                                         r"256, not a multiple of 96"):
        fp8.dequantize(codes, scales, "e4m3", (128, 96))
    with pytest.raises(ValueError, match=r"but codes of shape \(256,\) has rank 1"):
        fp8.dequantize(codes[0, 0], scales, "e4m3", (1, 128))
    with pytest.raises(TypeError, match="uint8 bit patterns, not float32"):
        fp8.dequantize(codes.astype(np.float32), scales, "e4m3", (128, 128))
    with pytest.raises(ValueError, match="floating-point dtype"):
        fp8.dequantize(codes, scales, "e4m3", (128, 128), dtype=np.int32)


def test_non_numeric_input():
    with pytest.raises(TypeError, match="real numeric array"):
        fp8.quantize(np.ones(4, np.complex64), "e4m3")


def test_convert_float_16_bit_types():
    x = np.random.default_rng(7).standard_normal(4096).astype(np.float32) * 1e3
    x[:4] = [65520, 1e-8, np.inf, -0.0]
    # numpy's float16 cast rounds to nearest even, like the runtime (65520
    # is the tie between 65504 and infinity: even is infinity).
    with np.errstate(over="ignore"):
        f16 = x.astype(np.float16)
    np.testing.assert_array_equal(_ernie.convert_float(x, "f32", "f16"), f16.view(np.uint16))
    bf16 = _ernie.convert_float(x, "f32", "bf16")
    back = _ernie.convert_float(bf16, "bf16", "f32")
    np.testing.assert_array_equal(back.view(np.uint32) & 0xFFFF, 0)
    assert (np.abs(back[4:] - x[4:]) <= np.abs(x[4:]) * 2.0 ** -8).all()  # 7 mantissa bits
    np.testing.assert_array_equal(_ernie.convert_float(np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8],
                                                                np.float32), "f32", "bf16"),
                                  [0x3F80, 0x3F82])  # ties to even

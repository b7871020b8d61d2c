"""--ernie-fp8-lowering (the current, per-tensor recipe) against independent
references: the GEMM against ernie.fp8.quantize's codes and scales (which
are checked against the format definitions in test_fp8.py) and against f64,
training against the f32 run, and the distributed run against one rank."""

import numpy as np
import pytest

import ernie
import ernie.distributed as dist
from ernie import fp8
from ernie.models.llama import LlamaConfig, LlamaForCausalLM, parallelize_plan

TINY = dict(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)


class Projection(ernie.nn.Module):
    def __init__(self, k, n, rng):
        super().__init__()
        self.proj = ernie.nn.Linear(k, n, bias=False)
        self.proj.weight.value = rng.normal(0, 1, (k, n)).astype(np.float32)

    def forward(self, x):
        return self.proj(x)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_gemm_is_the_product_of_the_quantised_operands(fmt):
    """y = (codes_x * sx) @ (codes_w * sw), accumulated in f32: equal to the
    same product of ernie.fp8.quantize's codes and scales computed in f64 to
    f32 rounding (1e-5 relative to the row's |x||w|), and within the error
    the format implies of the exact f64 product: each operand within half
    an ulp (2^-4 e4m3, 2^-3 e5m2) relative, plus half the smallest
    subnormal of its scale."""
    rng = np.random.default_rng(3)
    k, n = 64, 32
    x = rng.normal(0, 1, (2, 8, k)).astype(np.float32)
    x[0, 0, 0] = 40.0  # an outlier sets the tensor's scale
    model = Projection(k, n, rng)
    w = model.proj.weight.value
    prog = ernie.compile(model, None, [x], differentiate=False,
                         fp8_config={"recipe": "current", "fwd_format": fmt})
    assert "ernie.scaled_matmul" in prog.mlir
    y = prog.forward(x)

    qx, sx = fp8.quantize(x, fmt)
    qw, sw = fp8.quantize(w, fmt)
    dx = fp8.decode(qx, fmt).astype(np.float64) * float(sx)
    dw = fp8.decode(qw, fmt).astype(np.float64) * float(sw)
    mag = np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64)
    assert np.all(np.abs(y - dx @ dw) <= 1e-5 * mag)

    ulp = {"e4m3": 2.0 ** -4, "e5m2": 2.0 ** -3}[fmt]
    tiny = {"e4m3": 2.0 ** -10, "e5m2": 2.0 ** -17}[fmt]  # half the smallest subnormal
    ex = ulp * np.abs(x) + tiny * float(sx)
    ew = ulp * np.abs(w) + tiny * float(sw)
    bound = ex @ np.abs(w) + np.abs(x) @ ew + ex @ ew + 1e-5 * mag
    err = np.abs(y - x.astype(np.float64) @ w.astype(np.float64))
    assert np.all(err <= bound)
    assert np.max(err) > 0  # it really is fp8


def _llama_losses(fp8_config, steps, mesh=None, config=None):
    cfg = LlamaConfig(**TINY, seed=5)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, cfg.vocab_size, (4, 8))
    labels = ids  # Hugging Face's labels: the model shifts them
    prog = ernie.compile(LlamaForCausalLM(cfg), ernie.optimizer.AdamW(3e-3), [ids, labels],
                         mesh=mesh, config=config, fp8_config=fp8_config)
    return prog, [prog.step(ids, labels) for _ in range(steps)]


@pytest.fixture(scope="module")
def fp8_single_rank():
    return _llama_losses({"recipe": "current"}, steps=40)


def test_fp8_llama_trains_like_f32(fp8_single_rank):
    """Every linear layer's forward, data- and weight-gradient GEMMs in fp8
    (e4m3 forward, e5m2 gradients; embedding and LM head excluded): after
    40 steps the loss is within 2% of the f32 run's."""
    prog, losses = fp8_single_rank
    _, reference = _llama_losses(None, steps=40)
    # 2 layers x 7 projections x (forward, data gradient, weight gradient).
    grad_fn = prog.mlir.split("func.func @forward_grad", 1)[1].split("func.func @", 1)[0]
    assert grad_fn.count("ernie.scaled_matmul ") == 2 * 7 * 3
    assert grad_fn.count("f8E5M2") > 0
    assert losses[-1] < losses[0] * 0.6
    assert abs(losses[-1] / reference[-1] - 1) < 0.02


@pytest.mark.parametrize("shape,names", [([2], ["dp"]), ([2, 2], ["dp", "mp"])])
def test_fp8_scales_are_global(fp8_single_rank, shape, names):
    """A per-tensor amax of a split tensor is all-reduced (max), so every rank
    quantises with the single-rank scale: the first steps equal the
    single-rank fp8 run to f32 rounding (1e-5; later steps may flip an fp8
    code where gradients summed in another order differ in their last
    bit)."""
    mesh = dist.ProcessMesh(np.arange(int(np.prod(shape))).reshape(shape), names)
    config = {"dp_config": {"sharding_level": 0}}
    if "mp" in names:
        config["mp_config"] = {"parallelize_plan": parallelize_plan()}
    prog, losses = _llama_losses({"recipe": "current"}, steps=3, mesh=mesh, config=config)
    np.testing.assert_allclose(losses, fp8_single_rank[1][:3], rtol=1e-5)
    kinds = ernie.collectives_of(prog.mlir, "forward_grad")
    assert "all_reduce[dp]" in kinds
    assert "ernie.all_reduce" in prog.mlir and " max :" in prog.mlir


def test_fp8_delayed_scaling_carries_amax_history(fp8_single_rank):
    """Transformer Engine's default: each tensor's scale comes from the max
    of an amax history carried from step to step as optimizer state (zeros
    at first: scale 1 on step 1). On a fixed batch the amaxes barely move,
    so the run tracks the current-scaling run after the first step, and the
    history holds the recent amaxes, most recent first."""
    config = {"recipe": "delayed", "history_length": 4, "amax_compute": "max"}
    prog, losses = _llama_losses(config, steps=40)
    current = fp8_single_rank[1]
    assert losses[0] != current[0]  # step 1 quantised with scale 1
    assert abs(losses[-1] / current[-1] - 1) < 0.02
    state = prog.state_dict()
    history = state["llama.layers.0.self_attn.q_proj.weight:fp8_amax.weight"]
    weight = state["llama.layers.0.self_attn.q_proj.weight"]
    assert history.shape == (4,)
    # The newest entry is the amax of the weight the last step read: the
    # weight before the last update, close to (not equal to) the current one.
    assert abs(history[0] / np.max(np.abs(weight)) - 1) < 0.05
    assert np.all(history > 0)


@pytest.mark.parametrize("config,error,match", [
    ({"recipe": "sometimes"}, ValueError, "recipe must be current, delayed or blockwise"),
    ({"recipe": "blockwise", "pow2_scale": 1}, ValueError, "pow2_scale is a bool"),
    ({"block_size": 8}, ValueError, "block_size belongs to the blockwise recipe"),
    ({"recipe": "blockwise", "block_size": 5}, ValueError, "tiles of 1x5 do not divide"),
    ({"margin": 1}, ValueError, "belong to the delayed recipe"),
    ({"recipe": "delayed", "history_length": 0}, ValueError, "history_length must be an integer >= 1"),
    ({"recipe": "delayed", "amax_compute": "mean"}, ValueError, "amax_compute must be"),
    ({"fwd_format": "e3m4"}, ValueError, "fwd_format must be 'e4m3' or 'e5m2'"),
    ({"scaling": "x"}, ValueError, "unknown fp8_config keys"),
])
def test_fp8_config_is_checked(config, error, match):
    with pytest.raises(error, match=match):
        _llama_losses(config, steps=0)


def test_fp8_on_a_non_matmul_parameter_is_an_error():
    with pytest.raises(ValueError, match="only matmuls run in fp8"):
        _llama_losses({"include": "input_layernorm"}, steps=0)


def test_fp8_weight_gradient_input_is_saved_in_fp8():
    """The weight gradient reads the forward's fp8 codes of each layer input
    (per-tensor scaling commutes with the 2-D reshape it takes; blockwise
    tiles along the last dimension survive it too), so the
    forward keeps those inputs in one byte instead of four: the plan
    report's activation bytes fall."""
    cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=4)
    ids = np.zeros((8, 64), np.int64)
    saved = {}
    for name, config in (("f32", None), ("fp8", {"recipe": "current"}),
                         ("blockwise", {"recipe": "blockwise", "block_size": 64})):
        with ernie.nn.abstract():
            model = LlamaForCausalLM(cfg)
        prog = ernie.compile(model, ernie.optimizer.AdamW(1e-3), [ids, ids], abstract=True,
                             fp8_config=config)
        saved[name] = prog.report()["activation_bytes"]
    # Per layer, the q/k/v, gate/up and o/down inputs ([8, 64, 128] and
    # [8, 64, 384] floats) are now codes; other saved tensors stay.
    assert saved["fp8"] < 0.9 * saved["f32"], saved
    # Blockwise: the weight gradient re-tiles the forward's 1x64 codes (one
    # f32 scale per 64 values besides), so the inputs are kept in fp8 too.
    assert saved["blockwise"] < 0.9 * saved["f32"], saved


def test_fp8_delayed_scaling_under_dp_mp_equals_single_rank():
    """The histories are replicated state and every amax is all-reduced, so
    every rank of a dp x mp run scales like the single rank: equal losses
    over the first steps (f32 rounding, 1e-5)."""
    config = {"recipe": "delayed", "history_length": 2}
    _, single = _llama_losses(config, steps=3)
    mesh = dist.ProcessMesh([[0, 1], [2, 3]], ["dp", "mp"])
    prog, losses = _llama_losses(config, steps=3, mesh=mesh,
                                 config={"dp_config": {"sharding_level": 0},
                                         "mp_config": {"parallelize_plan": parallelize_plan()}})
    np.testing.assert_allclose(losses, single, rtol=1e-5)
    assert "fp8_amax" in prog.mlir


@pytest.mark.parametrize("fmt,pow2", [("e4m3", False), ("e5m2", False), ("e4m3", True)])
def test_fp8_blockwise_gemm_is_the_product_of_the_quantised_tiles(fmt, pow2):
    """Blockwise (DeepSeek-V3): the activation in 1x128 tiles along the
    contraction, the weight in 128x128 blocks; the GEMM multiplies the
    dequantised tiles in f32. Equal to the same product of
    ernie.fp8.quantize's tiles (1e-5 of the row's |x||w|: f32 rounding),
    and an outlier spoils only its own tile. With power-of-two scales
    (DeepSeek-V3) the lowering's scales are exactly quantize's."""
    rng = np.random.default_rng(4)
    k, n = 256, 128
    x = rng.normal(0, 1, (2, 8, k)).astype(np.float32)
    x[0, 0, 0] = 500.0
    model = Projection(k, n, rng)
    w = model.proj.weight.value
    prog = ernie.compile(model, None, [x], differentiate=False,
                         fp8_config={"recipe": "blockwise", "fwd_format": fmt, "block_size": 128,
                                     "pow2_scale": pow2})
    y = prog.forward(x)
    qx, sx = fp8.quantize(x, fmt, block=(1, 128), pow2_scale=pow2)
    qw, sw = fp8.quantize(w, fmt, block=(128, 128), pow2_scale=pow2)
    if pow2:
        assert np.all(np.frexp(sx)[0] == 0.5) and "ernie.pow" in prog.mlir
    dx = fp8.dequantize(qx, sx, fmt, block=(1, 128)).astype(np.float64)
    dw = fp8.dequantize(qw, sw, fmt, block=(128, 128)).astype(np.float64)
    mag = np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64)
    assert np.all(np.abs(y - dx @ dw) <= 1e-5 * mag)
    # Per-tensor scaling would crush every other row under the outlier;
    # with tiles the other rows stay within the format's relative error.
    exact = x.astype(np.float64) @ w.astype(np.float64)
    ulp = {"e4m3": 2.0 ** -4, "e5m2": 2.0 ** -3}[fmt]
    rows = np.ones(y.shape[:2], bool)
    rows[0, 0] = False
    assert np.all(np.abs(y - exact)[rows] <= 3 * ulp * mag[rows])


def test_fp8_blockwise_llama_trains_like_f32():
    """A Llama whose hidden (64) and MLP (96) sizes are multiples of the
    32-wide tiles trains in blockwise fp8 within 2% of f32 over 15 steps (on
    one memorised batch the loss soon falls where relative differences grow)."""
    cfg = LlamaConfig(vocab_size=32, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, seed=2)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, cfg.vocab_size, (4, 32))
    labels = ids  # Hugging Face's labels: the model shifts them
    runs = {}
    for name, config in (("f32", None), ("fp8", {"recipe": "blockwise", "block_size": 32})):
        prog = ernie.compile(LlamaForCausalLM(cfg), ernie.optimizer.AdamW(3e-3), [ids, labels],
                             fp8_config=config)
        runs[name] = [prog.step(ids, labels) for _ in range(15)]
    assert runs["fp8"][-1] < runs["fp8"][0] * 0.8
    assert abs(runs["fp8"][-1] / runs["f32"][-1] - 1) < 0.02

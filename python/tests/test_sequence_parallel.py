"""Sequence parallelism against Korthikanti et al. (activation memory per
rank divided by t), and the overlap pass (decomposed collective matmuls)
against the program without it: bit for bit on the thread backend, with its
transfers running inside the GEMMs on the runtime's timeline."""

import json

import numpy as np
import pytest

import ernie
import ernie.distributed as dist
from ernie.models.llama import LlamaConfig, LlamaForCausalLM, parallelize_plan
from megatron_model import MEGATRON_SP, MegatronModel

B, S, H, HEADS, VOCAB = 2, 64, 64, 8, 128


def _activation_bytes(t, layers):
    """What the forward keeps for the backward, per rank (abstract compile)."""
    with ernie.nn.abstract():
        model = MegatronModel(VOCAB, H, HEADS, layers)
    ids = np.zeros((B, S), np.int64)
    kwargs = {}
    if t > 1:
        kwargs = dict(mesh=dist.ProcessMesh(list(range(t)), ["mp"]),
                      config={"mp_config": {"parallelize_plan": MEGATRON_SP}})
    prog = ernie.compile(model, ernie.optimizer.SGD(0.1), [ids, ids], abstract=True, **kwargs)
    return prog.report()["activation_bytes"]


@pytest.fixture(scope="module")
def unparallelised_layer_bytes():
    return _activation_bytes(1, 3) - _activation_bytes(1, 2)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_activation_memory_per_layer_divides_by_t(unparallelised_layer_bytes, t):
    """Korthikanti et al.: with tensor and sequence parallelism every
    activation a transformer layer keeps for its backward is split t ways.
    Per layer (the difference of a 3- and a 2-layer model, so embedding and
    head drop out), within 5%."""
    # The block keeps 16 activations of b*s*h floats unparallelised: two norm
    # inputs and outputs, q, k, v, attention output, 4h up and 4h gelu.
    assert unparallelised_layer_bytes == 16 * B * S * H * 4
    per_layer = _activation_bytes(t, 3) - _activation_bytes(t, 2)
    assert abs(per_layer * t / unparallelised_layer_bytes - 1) < 0.05, (t, per_layer)


# ---------------------------------------------------------------------------
# The overlap pass: numerics and plan.
# ---------------------------------------------------------------------------

def _megatron_run(shape, names, overlap, steps=4, trace=False, zero=0):
    b, s, h, layers, vocab = 2, 8, 16, 2, 32
    rng = np.random.default_rng(0)
    ids, labels = rng.integers(0, vocab, (b * 2, s)), rng.integers(0, vocab, (b * 2, s))
    model = MegatronModel(vocab, h, 4, layers)
    for i, (_, p) in enumerate(model.named_parameters()):  # the same weights in every run
        p.value = np.random.default_rng(i).normal(0, 0.1, p.shape).astype(np.float32)
    opt = ernie.optimizer.AdamW(1e-2, weight_decay=0.01)
    if shape is None:
        prog = ernie.compile(model, opt, [ids, labels])
    else:
        mesh = dist.ProcessMesh(np.arange(int(np.prod(shape))).reshape(shape), names)
        config = {"mp_config": {"parallelize_plan": MEGATRON_SP, "sequence_parallel_overlap": overlap}}
        if "dp" in names:
            config["dp_config"] = {"sharding_level": zero}
        prog = ernie.compile(model, opt, [ids, labels], mesh=mesh, config=config, trace=trace)
    losses = [prog.step(ids, labels) for _ in range(steps)]
    return prog, losses, prog.state_dict()


@pytest.fixture(scope="module")
def megatron_single_rank():
    return _megatron_run(None, None, False)


@pytest.mark.parametrize("shape,names,zero", [([2], ["mp"], 0), ([4], ["mp"], 0),
                                              ([2, 2], ["dp", "mp"], 0), ([2, 2], ["dp", "mp"], 2),
                                              ([2, 2], ["dp", "mp"], 3)])
def test_overlap_is_bitwise_the_plain_program(megatron_single_rank, shape, names, zero):
    """Every forward GEMM row is the same dot product in a piece as in the
    whole, and the scattered partials are summed in rank order, as
    reduce_scatter sums: the first step's loss is identical bit for bit. The
    weight gradients are not always: a ring step's GEMM reduces over its
    piece of the sequence and the pieces are then added, which reassociates
    the sum over tokens against one GEMM over all of them, and whether that
    lands on the same bits depends on how the BLAS kernel blocks K
    (OpenBLAS's SkylakeX kernels did, its Haswell ones do not). Later steps
    and the trained state agree to f32 rounding (1e-6 relative per step;
    AdamW turns a gradient near 0 into a full step, so weights to 1e-6),
    and both runs equal the single-rank run within 1e-5."""
    _, plain, plain_state = _megatron_run(shape, names, overlap=False, zero=zero)
    prog, overlapped, state = _megatron_run(shape, names, overlap=True, zero=zero)
    assert plain[0] == overlapped[0]
    np.testing.assert_allclose(overlapped, plain, rtol=1e-6)
    for name, value in plain_state.items():
        np.testing.assert_allclose(state[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(overlapped, megatron_single_rank[1], rtol=1e-5)
    # No blocking sequence-parallel collective is left around a matmul:
    # every reduce-scatter became sends, every all-gather a ring.
    t = shape[names.index("mp")]
    kinds = ernie.collectives_of(prog.mlir, "forward_grad")
    assert "reduce_scatter[mp]" not in kinds, kinds
    assert kinds["collective_permute_start[mp]"]["count"] % (t - 1) == 0


def test_overlap_plan_per_layer():
    """Per layer and forward, sequence parallelism's two all-gathers and two
    reduce-scatters become 4 (t - 1) transfers of one b*s/t*h piece each —
    the volume of the collectives they replace — and the gather where the
    region ends (the replicated head multiplies its rows) t - 1 more."""
    t, layers = 4, 2
    prog, _, _ = _megatron_run([t], ["mp"], overlap=True, steps=1)
    fwd = ernie.collectives_of(prog.mlir, "forward")
    b, s, h = 4, 8, 16
    piece = b * s // t * h * 4
    count = (4 * layers + 1) * (t - 1)
    assert fwd == {"collective_permute_start[mp]": {"count": count, "bytes": count * piece}}, fwd


def test_overlap_on_llama_matches_without(tmp_path):
    """The Llama plan with sequence parallelism on dp x mp, with and without
    the overlap pass: identical losses; the timeline shows transfers on the
    communication thread running while the compute thread multiplies."""
    cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, seed=3)
    rng = np.random.default_rng(1)
    ids, labels = rng.integers(0, 32, (4, 8)), rng.integers(0, 32, (4, 8))
    runs = {}
    for overlap in (False, True):
        mesh = dist.ProcessMesh([[0, 1], [2, 3]], ["dp", "mp"])
        config = {"dp_config": {"sharding_level": 1},
                  "mp_config": {"parallelize_plan": parallelize_plan(True),
                                "sequence_parallel_overlap": overlap}}
        prog = ernie.compile(LlamaForCausalLM(cfg), ernie.optimizer.AdamW(1e-2), [ids, labels],
                             mesh=mesh, config=config, trace=overlap)
        runs[overlap] = (prog, [prog.step(ids, labels) for _ in range(5)])
    assert runs[False][1] == runs[True][1]
    assert "collective_permute_start[mp]" in runs[True][0].report()["collectives"]

    runs[True][0].write_trace(tmp_path / "t.json")
    spans = [e for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"] if e["ph"] == "X"]
    transfers = [e for e in spans if e["tid"] == 1 and e["name"] == "ernie.collective_permute_start"]
    gemms = [e for e in spans if e["tid"] == 0 and e["name"] == "ernie.matmul"]
    assert transfers and gemms

    def overlaps(a, b):
        return a["pid"] == b["pid"] and a["ts"] < b["ts"] + b["dur"] and b["ts"] < a["ts"] + a["dur"]
    assert any(overlaps(c, g) for c in transfers for g in gemms)


def test_overlap_option_is_checked():
    model = MegatronModel(32, 16, 4, 1)
    mesh = dist.ProcessMesh([0, 1], ["mp"])
    with pytest.raises(TypeError, match="sequence_parallel_overlap is a bool"):
        dist.parallelize(model, None, mesh, {"mp_config": {"parallelize_plan": MEGATRON_SP,
                                                            "sequence_parallel_overlap": "yes"}})

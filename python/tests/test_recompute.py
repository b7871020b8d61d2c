"""Activation recomputation (--ernie-recompute, config["recompute"]):
activation memory per layer against Korthikanti et al. (2022), and training
bit for bit equal to the program that keeps every activation — on one rank
and under every parallelism, since the recomputed ops are the same ops on
the same values."""

import numpy as np
import pytest

import ernie
import ernie.distributed as dist
from ernie.models.llama import LlamaConfig, LlamaForCausalLM, parallelize_plan
from gpt_model import GPTModel
from megatron_model import MEGATRON_SP, MegatronModel

# ---------------------------------------------------------------------------
# Memory: Korthikanti et al., "Reducing Activation Recomputation in Large
# Transformer Models" (2022), §4, for 16-bit activations. Per layer they keep
#   attention: 2sbh (qkv input) + 4sbh (q, k) + 2as²b (softmax) + as²b
#              (dropout mask) + 2as²b (dropout output) + 2sbh (v)
#              + 2sbh (output-projection input) + sbh (dropout mask)
#   MLP:       2sbh (input) + 8sbh (GeLU input) + 8sbh (GeLU output)
#              + sbh (dropout mask)
#   norms:     4sbh
# = sbh(34 + 5as/h). ernie has no dropout: without the masks and the dropout
# output that is sbh(32 + 2as/h); selective recomputation drops the as²b
# terms (sbh·32, theirs 34); full recomputation keeps the layer's input,
# 2sbh (theirs too).
# ---------------------------------------------------------------------------

KORTHIKANTI = {
    "none": lambda s, b, h, a: s * b * h * (32 + 2 * a * s / h),
    "selective": lambda s, b, h, a: s * b * h * 32,
    "full": lambda s, b, h, a: 2 * s * b * h,
}


def _activation_bytes(recompute, layers, s, b, h, a, mesh=None, config=None):
    with ernie.nn.abstract():
        model = GPTModel(128, h, a, layers, dtype="bf16")
    ids = np.zeros((b, s), np.int64)
    config = dict(config or {}, recompute=recompute)
    prog = ernie.compile(model, ernie.optimizer.SGD(0.1), [ids, ids], abstract=True,
                         mesh=mesh, config=config)
    return prog.report()


@pytest.mark.parametrize("recompute", sorted(KORTHIKANTI))
@pytest.mark.parametrize("s,b,h,a", [(64, 2, 64, 8), (128, 1, 96, 4)])
def test_activation_memory_per_layer_is_korthikantis(recompute, s, b, h, a):
    """Per layer (a 3-layer model less a 2-layer one: embedding, head and
    loss drop out), bf16, within 1 % of the formula (it comes out exact)."""
    per_layer = (_activation_bytes(recompute, 3, s, b, h, a)["activation_bytes"]
                 - _activation_bytes(recompute, 2, s, b, h, a)["activation_bytes"])
    want = KORTHIKANTI[recompute](s, b, h, a)
    assert abs(per_layer / want - 1) <= 0.01, (per_layer, want)


def test_recomputation_shrinks_the_arena_and_says_so():
    """The memory plan reflects it: the gradient function's arena shrinks
    with each mode, and report() names the mode and counts the copies."""
    reports = {r: _activation_bytes(r, 3, 64, 2, 64, 8) for r in ("none", "selective", "full")}
    arena = {r: rep["functions"]["forward_grad"]["arena_bytes"] for r, rep in reports.items()}
    assert arena["full"] < arena["selective"] < arena["none"], arena
    assert reports["none"]["recompute"] == {"mode": "none", "layers": [], "recomputed_ops": 0}
    assert reports["selective"]["recompute"]["mode"] == "selective"
    assert reports["selective"]["recompute"]["recomputed_ops"] > 0
    full = reports["full"]["recompute"]
    assert full["layers"] == ["layers.0", "layers.1", "layers.2"]
    assert full["recomputed_ops"] > reports["selective"]["recompute"]["recomputed_ops"]


def test_named_layers_only():
    """{"layers": regex}: only the named layers recompute; each saves its
    share, so the activations land in between."""
    dims = (64, 2, 64, 8)
    none, full = (_activation_bytes(r, 3, *dims)["activation_bytes"] for r in ("none", "full"))
    one = _activation_bytes({"granularity": "full", "layers": "layers.1"}, 3, *dims)
    per_layer = KORTHIKANTI["none"](*dims) - KORTHIKANTI["full"](*dims)
    # The copies broadcast the model's one [s, s] causal mask again (rather
    # than keep its [b, a, s, s] broadcast): it stays, once for all layers.
    mask = dims[0] ** 2 * 2
    assert one["activation_bytes"] == none - per_layer + mask
    assert one["recompute"]["layers"] == ["layers.1"]
    two = _activation_bytes({"granularity": "full", "layers": ["layers.[02]"]}, 3, *dims)
    assert two["activation_bytes"] == none - 2 * per_layer + mask == full + per_layer


def test_tensor_and_sequence_parallel_divide_it_by_t():
    """Korthikanti et al. Table 2: with tensor and sequence parallelism a
    layer's recomputed activations are split t ways too (full: the input,
    split over the sequence, 2sbh/t)."""
    s, b, h, a, t = 64, 2, 64, 8, 2

    def per_layer(layers):
        with ernie.nn.abstract():
            model = MegatronModel(128, h, a, layers)
        ids = np.zeros((b, s), np.int64)
        prog = ernie.compile(model, ernie.optimizer.SGD(0.1), [ids, ids], abstract=True,
                             mesh=dist.ProcessMesh(list(range(t)), ["mp"]),
                             config={"recompute": "full",
                                     "mp_config": {"parallelize_plan": MEGATRON_SP}})
        return prog.report()["activation_bytes"]

    assert per_layer(3) - per_layer(2) == s * b * h * 4 // t  # f32: 4 bytes an element


# ---------------------------------------------------------------------------
# Numbers: bit for bit the program without recomputation.
# ---------------------------------------------------------------------------

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, seed=3)
RNG = np.random.default_rng(11)
IDS = RNG.integers(0, TINY["vocab_size"], size=(4, 16))
LABELS = IDS  # Hugging Face's labels: the model shifts them
PLANS = {
    "1 rank": (None, None, {}),
    "dp2 zero3": ([2], ["dp"], {"dp_config": {"sharding_level": 3}}),
    "dp2 x mp2": ([2, 2], ["dp", "mp"], {"dp_config": {"sharding_level": 1},
                                         "mp_config": {"parallelize_plan": parallelize_plan()}}),
    "pp2": ([2], ["pp"], {"pp_config": {"split_spec": "llama.layers", "accumulate_steps": 2}}),
}


def _train(plan, recompute, model_cls=LlamaForCausalLM, steps=3):
    shape, names, config = PLANS[plan]
    mesh = (dist.ProcessMesh(np.arange(int(np.prod(shape))).reshape(shape), names)
            if shape else None)
    model = model_cls(LlamaConfig(**TINY))
    prog = ernie.compile(model, ernie.optimizer.AdamW(1e-2), [IDS, LABELS], mesh=mesh,
                         config=dict(config, recompute=recompute))
    return prog, [prog.step(IDS, LABELS) for _ in range(steps)]


@pytest.mark.parametrize("plan", sorted(PLANS))
def test_recomputed_training_is_bit_identical(plan):
    plain, want = _train(plan, "none")
    for mode in ("full",):
        prog, got = _train(plan, mode)
        assert got == want, mode  # every step's loss, bit for bit
        for name, value in plain.state_dict().items():
            np.testing.assert_array_equal(prog.state_dict()[name], value, err_msg=f"{mode} {name}")
        assert prog.report()["recompute"]["recomputed_ops"] > 0


def test_selective_training_of_written_out_attention_is_bit_identical():
    """The attention core recomputed (the GPT layer writes softmax(q k^T) v
    out), f32, one rank and mp2: the same losses and weights."""
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 128, (2, 16))
    labels = np.roll(ids, -1, axis=1)  # GPTModel's own loss takes shifted labels

    def train(recompute, mesh=None, config=None):
        model = GPTModel(128, 32, 4, 2)
        for i, (_, p) in enumerate(model.named_parameters()):
            p.value = np.random.default_rng(i).normal(0, 0.1, p.shape).astype(np.float32)
        prog = ernie.compile(model, ernie.optimizer.SGD(0.1), [ids, labels], mesh=mesh,
                             config=dict(config or {}, recompute=recompute))
        return [prog.step(ids, labels) for _ in range(3)], prog.state_dict()

    for mesh, config in [(None, None),
                         (dist.ProcessMesh([0, 1], ["mp"]),
                          {"mp_config": {"parallelize_plan": {
                              "layers.*.[qkv]": dist.ColWiseParallel(),
                              "layers.*.o": dist.RowWiseParallel(),
                              "layers.*.fc1": dist.ColWiseParallel(),
                              "layers.*.fc2": dist.RowWiseParallel()}}})]:
        want, want_state = train("none", mesh, config)
        for mode in ("selective", "full"):
            got, state = train(mode, mesh, config)
            assert got == want, mode
            for name, value in want_state.items():
                np.testing.assert_array_equal(state[name], value, err_msg=f"{mode} {name}")


# ---------------------------------------------------------------------------
# Bad input: clear errors, before anything is compiled.
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("spec,error,match", [
    ("everything", ValueError, "recompute is one of none, selective, full"),
    ({"granularity": "full", "layers": "decoder.*"}, ValueError, "matches no layer .*layers.0"),
    ({"granularity": "full", "layers": "layers.["}, ValueError, "is not a regex"),
    ({"granularity": "full", "every": 2}, ValueError, "unknown recompute keys"),
    ({"granularity": "full", "layers": 3}, TypeError, "regex or a list of regexes"),
])
def test_bad_recompute_configs(spec, error, match):
    model = LlamaForCausalLM(LlamaConfig(**TINY))
    with pytest.raises(error, match=match):
        ernie.compile(model, ernie.optimizer.SGD(0.1), [IDS, LABELS], config={"recompute": spec})


def test_full_recomputation_needs_layers():
    class Flat(ernie.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = ernie.nn.Embedding(64, 8)
            self.head = ernie.nn.Linear(8, 64)

        def forward(self, ids, labels):
            return ernie.functional.cross_entropy(self.head(self.embed(ids)), labels)

    with pytest.raises(ValueError, match="LayerList, and the model .*Flat.* has none"):
        ernie.compile(Flat(), ernie.optimizer.SGD(0.1), [IDS, LABELS], config={"recompute": "full"})
    with pytest.raises(ValueError, match="needs an optimizer"):
        ernie.compile(LlamaForCausalLM(LlamaConfig(**TINY)), None, [IDS, LABELS],
                      config={"recompute": "full"})


def test_recompute_through_parallelize():
    """parallelize(...) records it; compile applies it (and checks it early)."""
    model = LlamaForCausalLM(LlamaConfig(**TINY))
    mesh = dist.ProcessMesh([0, 1], ["dp"])
    with pytest.raises(ValueError, match="recompute is one of"):
        dist.parallelize(model, None, mesh, {"recompute": "some"})
    dist.parallelize(model, None, mesh, {"dp_config": {}, "recompute": True})
    prog = ernie.compile(model, ernie.optimizer.SGD(0.1), [IDS, LABELS], mesh=mesh, abstract=True)
    assert prog.report()["recompute"]["mode"] == "full"

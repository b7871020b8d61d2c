"""Mistral and Mixtral (ernie.models.mistral, mixtral): sliding-window
attention, Hugging Face's config fields and weight names (Mixtral's
`block_sparse_moe.experts.<e>.w1/w3/w2`), refusals, training under plans
equal to one rank, and parity with `transformers` itself (the reference
environment, scripts/reference_env.sh; skipped without it).
"""

import json

import numpy as np
import pytest

import ernie
import ernie.functional as F
from ernie.models import AutoConfig, AutoModelForCausalLM
from ernie.models.mistral import MistralConfig, MistralForCausalLM
from ernie.models.mixtral import MixtralConfig, MixtralForCausalLM
from ernie.weights import read_hf_folder

from test_qwen import (assert_transformers_numbers, hf_run, plan_config, reference, train,
                       unfused, write_config)

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)

# Published configs (Hugging Face), the fields that matter.
MISTRAL_7B_V01 = {"architectures": ["MistralForCausalLM"], "model_type": "mistral",
                  "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
                  "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-5,
                  "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": False,
                  "torch_dtype": "bfloat16", "vocab_size": 32000, "hidden_act": "silu",
                  "max_position_embeddings": 32768}
MIXTRAL_8X7B = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
                "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
                "num_experts_per_tok": 2, "rms_norm_eps": 1e-5, "rope_theta": 1e6,
                "sliding_window": None, "router_aux_loss_coef": 0.02,
                "output_router_logits": False, "torch_dtype": "bfloat16", "vocab_size": 32000,
                "hidden_act": "silu", "tie_word_embeddings": False}


def test_published_configs_and_their_parameter_counts(tmp_path):
    cfg = AutoConfig.from_pretrained(write_config(tmp_path / "m", MISTRAL_7B_V01))
    assert type(cfg) is MistralConfig and cfg.sliding_window == 4096 and cfg.head_dim == 128
    with ernie.nn.abstract():
        model = MistralForCausalLM(cfg)
    count = sum(int(np.prod(p.shape)) for p in model.parameters())
    assert count == 7_241_732_096  # Mistral-7B's model card: 7.24B

    cfg = AutoConfig.from_pretrained(write_config(tmp_path / "x", MIXTRAL_8X7B))
    assert type(cfg) is MixtralConfig
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size,
            cfg.sliding_window, cfg.norm_topk_prob, cfg.rope_theta) == (8, 2, 14336, None, True,
                                                                         1e6)
    with ernie.nn.abstract():
        model = MixtralForCausalLM(cfg)
    count = sum(int(np.prod(p.shape)) for p in model.parameters())
    assert count == 46_702_792_704  # Mixtral-8x7B: 46.7B


@pytest.mark.parametrize("family,change,field", [
    ("mistral", {"sliding_window": 0}, "sliding_window"),
    ("mistral", {"hidden_act": "gelu"}, "hidden_act"),
    ("mistral", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
    ("mixtral", {"router_jitter_noise": 0.1}, "router_jitter_noise"),
    ("mixtral", {"num_experts_per_tok": 9}, "num_experts_per_tok = 9"),
    ("mixtral", {"num_local_experts": 0}, "num_local_experts"),
])
def test_fields_a_family_cannot_express_are_refused_naming_them(tmp_path, family, change, field):
    config = {"mistral": MISTRAL_7B_V01, "mixtral": MIXTRAL_8X7B}[family]
    with pytest.raises((ValueError, TypeError), match=field):
        AutoConfig.from_pretrained(write_config(tmp_path, {**config, **change}))


class Windowed(ernie.nn.Module):
    def __init__(self, window):
        super().__init__()
        self.window = window

    def forward(self, q, k, v):
        return F.attention(q, k, v, causal=True, scale=0.5, window=self.window)


def test_the_window_is_transformers_mask():
    """F.attention(window=w): query i sees keys i-w+1..i, against the mask
    written out (numpy); w >= seq is full causal. (Gradients: the kernels'
    finite-difference tests and test_gradients.py.)"""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 7, 2, 4)).astype(np.float32) for _ in range(3))

    def reference_attention(window):
        s = np.einsum("bshd,bthd->bhst", q, k) / 2.0
        i, j = np.indices((7, 7))
        s = np.where((j <= i) & (j > i - window), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        return np.einsum("bhst,bthd->bshd", p, v)

    for window in (1, 3, 7, 20):
        got = ernie.compile(Windowed(window), None, [q, k, v], differentiate=False).forward(q, k, v)
        np.testing.assert_allclose(got, reference_attention(min(window, 7)), rtol=1e-5,
                                   atol=1e-6)
    with pytest.raises(ValueError, match="a sliding window is a number of keys >= 1 with "
                                         "causal=True"):
        F.attention(None, None, None, causal=False, window=3)


def small(family, **changes):
    if family == "mistral":
        return MistralForCausalLM(MistralConfig(**{**TINY, "sliding_window": 3, "seed": 3,
                                                   **changes}))
    return MixtralForCausalLM(MixtralConfig(**{**TINY, "sliding_window": 5, "num_experts": 4,
                                               "output_router_logits": True,
                                               "router_aux_loss_coef": 0.05, "seed": 3,
                                               **changes}))


def test_the_window_changes_the_loss_and_none_is_llama():
    ids = np.random.default_rng(1).integers(0, 64, size=(2, 8))
    losses = {}
    for window in (2, None, 8):
        model = small("mistral", sliding_window=window)
        losses[window] = ernie.compile(model, None, [ids, ids], differentiate=False).eval(ids, ids)
    assert losses[2] != pytest.approx(losses[None], rel=1e-4)
    assert losses[8] == losses[None]  # a window as long as the sequence hides nothing


def test_mixtral_writes_hugging_faces_names(tmp_path):
    model = small("mixtral")
    model.save_pretrained(tmp_path / "out")
    config, weights, _ = read_hf_folder(tmp_path / "out")
    assert config["num_local_experts"] == 4 and "num_experts" not in config
    assert config["sliding_window"] == 5 and config["model_type"] == "mixtral"
    assert weights["model.layers.1.block_sparse_moe.experts.3.w2.weight"].shape == (32, 48)
    assert weights["model.layers.0.block_sparse_moe.gate.weight"].shape == (4, 32)
    assert not any(".mlp." in n for n in weights)
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    for (name, p), (_, q) in zip(model.named_parameters(), again.named_parameters()):
        np.testing.assert_array_equal(p.value, q.value, err_msg=name)


@pytest.mark.parametrize("family,shape,names,sp", [
    ("mistral", [2, 2], ["dp", "mp"], False),
    ("mistral", [2], ["mp"], True),
    ("mistral", [2, 2], ["pp", "mp"], False),
    ("mixtral", [2, 2], ["dp", "ep"], False),
    ("mixtral", [2, 2], ["ep", "mp"], False),
])
def test_training_under_plans_matches_single_rank(family, shape, names, sp):
    _, want = train(small(family), None, None, None)
    model = small(family)
    _, got = train(model, shape, names, plan_config(model, names, sp, zero=1))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert got[-1] < got[0]


def saved_names(state):
    """transformers' in-memory Mixtral state (fused experts, `mlp.`) in the
    names it saves."""
    out = {}
    for name, value in unfused(state).items():
        for ours, theirs in ((".mlp.experts.", ".block_sparse_moe.experts."),
                             (".mlp.gate.", ".block_sparse_moe.gate."),
                             ("gate_proj.", "w1."), ("up_proj.", "w3."), ("down_proj.", "w2.")):
            name = name.replace(ours, theirs)
        out[name] = value
    return out


@pytest.mark.parametrize("family,shape,names", [("mistral", [2, 2], ["dp", "mp"]),
                                                ("mixtral", [2, 2, 2], ["dp", "mp", "ep"])])
def test_transformers_parity_both_ways(tmp_path, family, shape, names):
    """A transformers-made folder (Mistral with a window of 3, Mixtral of 5,
    on 8 tokens): ernie's logits (<= 1e-5 relative) and loss are
    transformers'; after 5 steps on a mesh, save_pretrained reloads in
    transformers with every tensor equal and the same loss."""
    import ernie.distributed as dist
    reference("make", family, 7, tmp_path / "made")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "made")
    ids = np.random.default_rng(8).integers(0, model.config.vocab_size, size=(4, 8))
    assert_transformers_numbers(model, tmp_path / "made", ids, tmp_path)

    mesh = dist.ProcessMesh(np.arange(int(np.prod(shape))).reshape(shape), names)
    config = {"dp_config": {}, "mp_config": {"parallelize_plan": model.parallelize_plan()}}
    if "ep" in names:
        config["ep_config"] = {"axis": "ep"}
    prog = ernie.compile(model, ernie.optimizer.AdamW(1e-2), [ids, ids], mesh=mesh,
                         config=config)
    for _ in range(5):
        prog.step(ids, ids)
    model.save_pretrained(tmp_path / "trained", state=prog.state_dict())
    trained = hf_run(tmp_path / "trained", ids, tmp_path, "trained")
    _, ours, _ = read_hf_folder(tmp_path / "trained")
    hf_state = {k[len("state/"):]: v for k, v in trained.items() if k.startswith("state/")}
    hf_state = saved_names(hf_state) if family == "mixtral" else hf_state
    assert set(hf_state) == set(ours)
    for name, value in ours.items():
        np.testing.assert_array_equal(hf_state[name], value, err_msg=name)
    assert prog.eval(ids, ids) == pytest.approx(float(trained["loss"]), rel=1e-5)
    assert json.loads((tmp_path / "trained" / "config.json").read_text())["sliding_window"] == \
        model.config.sliding_window


@pytest.mark.parametrize("family", ["mistral", "mixtral"])
def test_fp8_under_dp_mp_equals_one_rank(family):
    """fp8 (current scaling) on every projection, the windowed attention in
    between: dp x mp equals one rank for the first steps (1e-5; the scales
    are global)."""
    import ernie.distributed as dist
    ids = np.random.default_rng(4).integers(0, 64, size=(4, 8))

    def losses(mesh=None, config=None):
        model = small(family)
        if config is not None:
            config["mp_config"] = {"parallelize_plan": model.parallelize_plan()}
        prog = ernie.compile(model, ernie.optimizer.AdamW(3e-3), [ids, ids], mesh=mesh,
                             config=config, fp8_config={"recipe": "current"})
        assert "ernie.scaled_matmul" in prog.mlir
        return [prog.step(ids, ids) for _ in range(3)]
    mesh = dist.ProcessMesh(np.arange(4).reshape(2, 2), ["dp", "mp"])
    np.testing.assert_allclose(losses(mesh, {"dp_config": {}}), losses(), rtol=1e-5)

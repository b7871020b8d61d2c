"""Qwen2 / Qwen2.5, Qwen3 and Qwen3-MoE (ernie.models.qwen2, qwen3,
qwen3_moe): Hugging Face's config fields and weight names, refusals of
what the families cannot express, training under plans equal to one rank,
and parity with `transformers` itself.

The parity tests need the reference environment (scripts/reference_env.sh:
torch and transformers in a virtual environment of their own, never
ernie's): its interpreter makes a tiny random model with transformers'
own code, saves it with transformers' save_pretrained, and reads back what
ernie writes (hf_reference.py, in a subprocess). Without that environment
they skip, saying how to make it; the other tests always run.
"""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy as safetensors_numpy

import ernie
import ernie.distributed as dist
from ernie.models import AutoConfig, AutoModelForCausalLM
from ernie.models.qwen2 import Qwen2Config, Qwen2ForCausalLM
from ernie.models.qwen3 import Qwen3Config, Qwen3ForCausalLM
from ernie.models.qwen3_moe import Qwen3MoeConfig, Qwen3MoeForCausalLM

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)


def write_config(folder, config):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


# ---------------------------------------------------------------------------
# config.json: the published configs, read field by field
# ---------------------------------------------------------------------------

# Qwen2.5-0.5B's config.json as published (transformers 4.x names).
QWEN2_5_0_5B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896,
    "initializer_range": 0.02, "intermediate_size": 4864, "max_position_embeddings": 32768,
    "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
    "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936}

# Qwen3-0.6B's: head_dim 128 x 16 heads over a hidden size of 1024.
QWEN3_0_6B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}

# Qwen3-30B-A3B's: 128 experts, 8 chosen, renormalised.
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
    "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
    "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}


def parameter_count(config):
    with ernie.nn.abstract():
        model = AutoModelForCausalLM.model_class(config)(AutoConfig.from_pretrained(config))
    return model, sum(int(np.prod(p.shape)) for p in model.parameters())


def test_published_configs_read_field_by_field(tmp_path):
    cfg = AutoConfig.from_pretrained(write_config(tmp_path / "qwen2", QWEN2_5_0_5B))
    assert type(cfg) is Qwen2Config
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
            cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size) == \
        (896, 14, 2, 64, 4864, 24, 151936)
    assert (cfg.rope_theta, cfg.rms_norm_eps, cfg.tie_word_embeddings, cfg.qkv_bias,
            cfg.qk_norm, cfg.dtype) == (1e6, 1e-6, True, True, False, "bf16")

    cfg = AutoConfig.from_pretrained(write_config(tmp_path / "qwen3", QWEN3_0_6B))
    assert type(cfg) is Qwen3Config
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
            cfg.intermediate_size, cfg.num_hidden_layers) == (1024, 16, 8, 128, 3072, 28)
    assert (cfg.qkv_bias, cfg.qk_norm, cfg.tie_word_embeddings, cfg.rope_theta) == \
        (False, True, True, 1000000)
    # Without head_dim in config.json Qwen3's is Hugging Face's default, 128.
    no_head_dim = {k: v for k, v in QWEN3_0_6B.items() if k != "head_dim"}
    assert AutoConfig.from_pretrained(write_config(tmp_path / "q3", no_head_dim)).head_dim == 128

    cfg = AutoConfig.from_pretrained(write_config(tmp_path / "moe", QWEN3_30B_A3B))
    assert type(cfg) is Qwen3MoeConfig
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size,
            cfg.norm_topk_prob, cfg.decoder_sparse_step, cfg.mlp_only_layers,
            cfg.output_router_logits, cfg.router_aux_loss_coef, cfg.head_dim) == \
        (128, 8, 768, True, 1, (), False, 0.001, 128)
    assert all(cfg.is_moe_layer(i) for i in range(48))
    sparse = Qwen3MoeConfig(**TINY, num_experts=4, decoder_sparse_step=2, mlp_only_layers=[3],
                            head_dim=8)
    assert [sparse.is_moe_layer(i) for i in range(2)] == [False, True]


def test_newer_transformers_config_names_are_read(tmp_path):
    """transformers 5 writes `dtype` for torch_dtype, the rope theta inside
    `rope_parameters`, `layer_types` and the expert count as
    `num_local_experts`."""
    v5 = {k: v for k, v in QWEN3_30B_A3B.items()
          if k not in ("torch_dtype", "rope_theta", "rope_scaling", "num_experts")}
    v5.update(dtype="float32", num_local_experts=16, layer_types=["full_attention"] * 48,
              rope_parameters={"rope_theta": 5e5, "rope_type": "default"})
    cfg = AutoConfig.from_pretrained(write_config(tmp_path / "v5", v5))
    assert (cfg.dtype, cfg.rope_theta, cfg.num_experts) == ("f32", 5e5, 16)


def test_published_sizes_have_their_parameter_counts(tmp_path):
    """Built abstractly (no values), the published sizes have the counts
    the formulas give, which are the counts their model cards state."""
    # Qwen2.5-0.5B: per layer q/k/v with biases, o, a SwiGLU, two norms.
    h, v, inter, kv = 896, 151936, 4864, 128
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * inter + 2 * h
    model, count = parameter_count(write_config(tmp_path / "qwen2", QWEN2_5_0_5B))
    assert count == 24 * layer + v * h + h == 494_032_768
    assert "qwen2.layers.0.self_attn.q_proj.bias" in dict(model.named_parameters())

    # Qwen3-0.6B: q 16 x 128 and k/v 8 x 128 over 1024, q/k norms of 128.
    h, d, inter = 1024, 128, 3072
    layer = h * 16 * d + 2 * h * 8 * d + 16 * d * h + 2 * d + 3 * h * inter + 2 * h
    _, count = parameter_count(write_config(tmp_path / "qwen3", QWEN3_0_6B))
    assert count == 28 * layer + v * h + h == 596_049_920

    # Qwen3-30B-A3B: 48 layers of 128 experts, an untied head: 30.5B.
    h, d, moe = 2048, 128, 768
    layer = h * 32 * d + 2 * h * 4 * d + 32 * d * h + 2 * d + 2 * h + h * 128 + \
        128 * 3 * h * moe
    _, count = parameter_count(write_config(tmp_path / "moe", QWEN3_30B_A3B))
    assert count == 48 * layer + 2 * v * h + h == 30_532_122_624


@pytest.mark.parametrize("family,change,field", [
    ("qwen2", {"use_sliding_window": True}, "use_sliding_window"),
    ("qwen2", {"rope_scaling": {"type": "yarn", "factor": 4.0}}, "rope_scaling"),
    ("qwen2", {"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, "rope_scaling"),
    ("qwen2", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}},
     "rope_parameters"),
    ("qwen2", {"layer_types": ["full_attention"] * 20 + ["sliding_attention"] * 4},
     "layer_types"),
    ("qwen2", {"hidden_act": "gelu"}, "hidden_act"),
    ("qwen2", {"attention_dropout": 0.1}, "attention_dropout"),
    ("qwen2", {"torch_dtype": "int8"}, "torch_dtype"),
    ("qwen3", {"attention_bias": True}, "attention_bias"),
    ("qwen3", {"use_sliding_window": True, "sliding_window": 4096}, "use_sliding_window"),
    ("qwen3", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_scaling"),
    ("qwen3", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
    ("qwen3", {"head_dim": 0}, "head_dim"),
    ("qwen3_moe", {"num_experts_per_tok": 129}, "num_experts_per_tok = 129"),
    ("qwen3_moe", {"mlp_only_layers": "all"}, "mlp_only_layers"),
    ("qwen3_moe", {"norm_topk_prob": "yes"}, "norm_topk_prob"),
    ("qwen3_moe", {"router_aux_loss_coef": -1.0}, "router_aux_loss_coef"),
    ("qwen3_moe", {"decoder_sparse_step": 0}, "decoder_sparse_step"),
])
def test_fields_a_family_cannot_express_are_refused_naming_them(tmp_path, family, change, field):
    config = {"qwen2": QWEN2_5_0_5B, "qwen3": QWEN3_0_6B, "qwen3_moe": QWEN3_30B_A3B}[family]
    folder = write_config(tmp_path, {**config, **change})
    with pytest.raises((ValueError, TypeError), match=field):
        AutoConfig.from_pretrained(folder)


def test_unknown_families_list_the_known_ones(tmp_path):
    folder = write_config(tmp_path, {**QWEN2_5_0_5B, "model_type": "qwen9",
                                     "architectures": ["Qwen9ForCausalLM"]})
    with pytest.raises(ValueError, match=r"'qwen9'.*it has deepseek_v3, ernie4_5, ernie4_5_moe, "
                                         r"llama, mistral, mixtral, qwen2, qwen3, qwen3_moe"):
        AutoModelForCausalLM.from_pretrained(folder)
    # No model_type: the architectures name the family.
    config = {k: v for k, v in QWEN3_0_6B.items() if k != "model_type"}
    assert AutoModelForCausalLM.model_class(write_config(tmp_path / "a", config)) is \
        Qwen3ForCausalLM
    with pytest.raises(TypeError, match="Qwen2ForCausalLM is built from a Qwen2Config"):
        Qwen2ForCausalLM(Qwen3Config(**TINY))


# ---------------------------------------------------------------------------
# Weight names both ways, against a numpy forward of Hugging Face's model
# ---------------------------------------------------------------------------

def hf_weights(family, cfg, rng):
    """Random weights under Hugging Face's names ([out, in] Linears)."""
    h, d, inter, v = cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"], \
        cfg["vocab_size"]
    hq, hkv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    w = {"model.embed_tokens.weight": rng.normal(size=(v, h)),
         "model.norm.weight": 1 + 0.1 * rng.normal(size=h)}
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = 0.2 * rng.normal(size=(v, h))
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w.update({p + "input_layernorm.weight": 1 + 0.1 * rng.normal(size=h),
                  p + "post_attention_layernorm.weight": 1 + 0.1 * rng.normal(size=h),
                  p + "self_attn.q_proj.weight": 0.3 * rng.normal(size=(hq, h)),
                  p + "self_attn.k_proj.weight": 0.3 * rng.normal(size=(hkv, h)),
                  p + "self_attn.v_proj.weight": 0.3 * rng.normal(size=(hkv, h)),
                  p + "self_attn.o_proj.weight": 0.3 * rng.normal(size=(h, hq))})
        if family == "qwen2":
            w.update({p + f"self_attn.{n}_proj.bias": 0.3 * rng.normal(size=width)
                      for n, width in (("q", hq), ("k", hkv), ("v", hkv))})
        else:
            w.update({p + f"self_attn.{n}_norm.weight": 1 + 0.1 * rng.normal(size=d)
                      for n in ("q", "k")})
        if family == "qwen3_moe" and i not in cfg["mlp_only_layers"]:
            e, moe = cfg["num_experts"], cfg["moe_intermediate_size"]
            w[p + "mlp.gate.weight"] = rng.normal(size=(e, h))
            for x in range(e):
                w.update({p + f"mlp.experts.{x}.gate_proj.weight": 0.3 * rng.normal(size=(moe, h)),
                          p + f"mlp.experts.{x}.up_proj.weight": 0.3 * rng.normal(size=(moe, h)),
                          p + f"mlp.experts.{x}.down_proj.weight":
                              0.3 * rng.normal(size=(h, moe))})
        else:
            w.update({p + "mlp.gate_proj.weight": 0.3 * rng.normal(size=(inter, h)),
                      p + "mlp.up_proj.weight": 0.3 * rng.normal(size=(inter, h)),
                      p + "mlp.down_proj.weight": 0.3 * rng.normal(size=(h, inter))})
    return w


def hf_numpy_forward(family, w, cfg, ids, labels):
    """Hugging Face's Qwen2 / Qwen3 / Qwen3-MoE forward in numpy (f64): the
    logits, and the loss transformers reports for `labels` (its own
    unshifted ones: position t predicts labels[t + 1]) with the
    load-balancing loss of load_balancing_loss_func."""
    h, heads, kvh, d = (cfg["hidden_size"], cfg["num_attention_heads"],
                        cfg["num_key_value_heads"], cfg["head_dim"])
    eps = cfg["rms_norm_eps"]

    def rms(x, g):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * g

    def rope(x):
        s = x.shape[1]
        inv = 1.0 / cfg["rope_theta"] ** (np.arange(0, d, 2) / d)
        emb = np.concatenate([np.outer(np.arange(s), inv)] * 2, -1)
        half = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1)
        return x * np.cos(emb)[None, :, None] + half * np.sin(emb)[None, :, None]

    def silu(x):
        return x / (1 + np.exp(-x))

    x = w["model.embed_tokens.weight"][ids]
    b, s, _ = x.shape
    routers = []
    for i in range(cfg["num_hidden_layers"]):
        p = lambda n: w[f"model.layers.{i}.{n}"]  # noqa: E731
        y = rms(x, p("input_layernorm.weight"))
        q, k, v = (y @ p(f"self_attn.{n}_proj.weight").T for n in "qkv")
        if family == "qwen2":
            q, k, v = (t + p(f"self_attn.{n}_proj.bias") for t, n in zip((q, k, v), "qkv"))
        q, k, v = q.reshape(b, s, heads, d), k.reshape(b, s, kvh, d), v.reshape(b, s, kvh, d)
        if family != "qwen2":
            q, k = rms(q, p("self_attn.q_norm.weight")), rms(k, p("self_attn.k_norm.weight"))
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, heads // kvh, 2), np.repeat(v, heads // kvh, 2)
        scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d)
        scores = np.where(np.tril(np.ones((s, s), bool)), scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        x = x + np.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, heads * d) @ \
            p("self_attn.o_proj.weight").T
        y = rms(x, p("post_attention_layernorm.weight"))
        if family == "qwen3_moe" and i not in cfg["mlp_only_layers"]:
            t = y.reshape(-1, h)
            logits = t @ p("mlp.gate.weight").T
            router = np.exp(logits - logits.max(-1, keepdims=True))
            router /= router.sum(-1, keepdims=True)
            routers.append(router)
            top = np.argsort(-router, -1)[:, :cfg["num_experts_per_tok"]]
            weights = np.take_along_axis(router, top, -1)
            if cfg["norm_topk_prob"]:
                weights /= weights.sum(-1, keepdims=True)
            out = np.zeros_like(t)
            for r in range(t.shape[0]):
                for e, wt in zip(top[r], weights[r]):
                    ex = lambda n: p(f"mlp.experts.{e}.{n}_proj.weight")  # noqa: E731,B023
                    out[r] += wt * ((silu(t[r] @ ex("gate").T) * (t[r] @ ex("up").T)) @
                                    ex("down").T)
            x = x + out.reshape(b, s, h)
        else:
            x = x + (silu(y @ p("mlp.gate_proj.weight").T) * (y @ p("mlp.up_proj.weight").T)) @ \
                p("mlp.down_proj.weight").T
    x = rms(x, w["model.norm.weight"])
    head = w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    logits = x @ head.T
    z = logits[:, :-1] - logits[:, :-1].max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    loss = -np.mean(np.take_along_axis(logp, labels[:, 1:, None], -1))
    if routers and cfg.get("output_router_logits"):
        e, k = cfg["num_experts"], cfg["num_experts_per_tok"]
        allp = np.concatenate(routers)
        chosen = np.argsort(-allp, -1)[:, :k]
        counts = np.bincount(chosen.ravel(), minlength=e) / allp.shape[0]
        loss += cfg["router_aux_loss_coef"] * e * np.sum(counts * allp.mean(0))
    return logits, loss


SMALL = {
    "qwen2": {**TINY, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
              "head_dim": 8, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
              "tie_word_embeddings": False, "torch_dtype": "float64",
              "use_sliding_window": False, "max_position_embeddings": 64},
    "qwen3": {**TINY, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
              "head_dim": 16, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
              "tie_word_embeddings": True, "torch_dtype": "float64", "attention_bias": False},
    "qwen3_moe": {**TINY, "num_hidden_layers": 3, "architectures": ["Qwen3MoeForCausalLM"],
                  "model_type": "qwen3_moe", "head_dim": 8, "rms_norm_eps": 1e-6,
                  "rope_theta": 1e4, "tie_word_embeddings": False, "torch_dtype": "float64",
                  "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
                  "norm_topk_prob": True, "mlp_only_layers": [1], "decoder_sparse_step": 1,
                  "output_router_logits": True, "router_aux_loss_coef": 0.05},
}
CLASSES = {"qwen2": Qwen2ForCausalLM, "qwen3": Qwen3ForCausalLM,
           "qwen3_moe": Qwen3MoeForCausalLM}


def write_hf(folder, config, weights):
    write_config(folder, config)
    safetensors_numpy.save_file({k: np.asarray(v) for k, v in weights.items()},
                                str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("family,change", [("qwen2", {}), ("qwen2", {"tie_word_embeddings": True}),
                                           ("qwen3", {}), ("qwen3_moe", {}),
                                           ("qwen3_moe", {"norm_topk_prob": False})])
def test_from_pretrained_matches_a_numpy_hugging_face_forward(tmp_path, family, change):
    """f64 weights under Hugging Face's names: ernie's logits and loss are
    the numpy forward's (Hugging Face's definitions) to rounding, the loss
    of Hugging Face's labels (labels = input_ids) included."""
    cfg = {**SMALL[family], **change}
    w = hf_weights(family, cfg, np.random.default_rng(3))
    model = AutoModelForCausalLM.from_pretrained(write_hf(tmp_path / "hf", cfg, w))
    assert type(model) is CLASSES[family] and model.config.dtype == "f64"
    ids = np.random.default_rng(4).integers(0, cfg["vocab_size"], size=(2, 7))
    want_logits, want_loss = hf_numpy_forward(family, w, cfg, ids, ids)
    logits = ernie.compile(model, None, [ids], differentiate=False).forward(ids)
    np.testing.assert_allclose(logits, want_logits, rtol=1e-10, atol=1e-10)
    loss = ernie.compile(model, None, [ids, ids], differentiate=False).eval(ids, ids)
    assert loss == pytest.approx(want_loss, rel=1e-10)


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "qwen3_moe"])
def test_save_pretrained_round_trips_every_tensor(tmp_path, family):
    """Hugging Face's names and layout out, the same state back in, bit for
    bit; the config fields come back too (those ernie does not compute
    unchanged)."""
    cfg = {**SMALL[family], "torch_dtype": "float32", "bos_token_id": 1, "my_field": [1, 2]}
    w = {k: v.astype(np.float32) for k, v in
         hf_weights(family, cfg, np.random.default_rng(5)).items()}
    model = CLASSES[family].from_pretrained(write_hf(tmp_path / "hf", cfg, w))
    model.save_pretrained(tmp_path / "out")
    back = safetensors_numpy.load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(back) == set(w)
    for name in w:
        np.testing.assert_array_equal(back[name], w[name], err_msg=name)
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert {k: saved[k] for k in cfg} == cfg
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert type(again) is CLASSES[family] and again.config == model.config
    ours = dict(model.named_parameters())
    for name, p in again.named_parameters():
        np.testing.assert_array_equal(p.value, ours[name].value, err_msg=name)


def test_ernie_names_of_each_family():
    names = lambda m: set(dict(m.named_parameters()))  # noqa: E731
    qwen2 = names(Qwen2ForCausalLM(Qwen2Config(**TINY)))
    assert {"qwen2.layers.1.self_attn.v_proj.bias", "qwen2.embed_tokens.weight",
            "lm_head.weight"} <= qwen2
    assert not any(n.endswith("o_proj.bias") or "mlp" in n and n.endswith("bias") for n in qwen2)
    qwen3 = names(Qwen3ForCausalLM(Qwen3Config(**TINY, head_dim=16)))
    assert {"qwen3.layers.0.self_attn.q_norm.weight", "qwen3.layers.0.self_attn.k_norm.weight"
            } <= qwen3 and not any(n.endswith("bias") for n in qwen3)
    moe = Qwen3MoeForCausalLM(Qwen3MoeConfig(**TINY, mlp_only_layers=[0]))
    shapes = {n: p.shape for n, p in moe.named_parameters()}
    assert shapes["qwen3_moe.layers.1.mlp.experts.gate_proj.weight"] == (4, 32, 32)
    assert shapes["qwen3_moe.layers.1.mlp.gate.weight"] == (32, 4)
    assert shapes["qwen3_moe.layers.0.mlp.gate_proj.weight"] == (32, 48)


def test_a_tensor_that_does_not_match_the_config_names_it_and_both_shapes(tmp_path):
    cfg = {**SMALL["qwen3"], "torch_dtype": "float32"}
    w = hf_weights("qwen3", cfg, np.random.default_rng(6))
    w["model.layers.1.self_attn.k_norm.weight"] = np.ones(8)
    with pytest.raises(ValueError, match=r"tensor 'model.layers.1.self_attn.k_norm.weight' has "
                                         r"shape \[8\], the config makes it \[16\]"):
        Qwen3ForCausalLM.from_pretrained(write_hf(tmp_path / "hf", cfg, w))
    w = hf_weights("qwen2", SMALL["qwen2"], np.random.default_rng(6))
    del w["model.layers.0.self_attn.k_proj.bias"]
    with pytest.raises(ValueError, match=r"no tensor 'model.layers.0.self_attn.k_proj.bias'"):
        Qwen2ForCausalLM.from_pretrained(write_hf(tmp_path / "q2", SMALL["qwen2"], w))


# ---------------------------------------------------------------------------
# Training under plans equals the single-rank run
# ---------------------------------------------------------------------------

def train(model, mesh_shape, names, config, steps=6):
    rng = np.random.default_rng(21)
    ids = rng.integers(0, model.config.vocab_size, size=(4, 8))
    labels = ids  # Hugging Face's labels: shifted in the model, under every plan
    opt = ernie.optimizer.AdamW(3e-3, weight_decay=0.01)
    mesh = None if mesh_shape is None else \
        dist.ProcessMesh(np.arange(int(np.prod(mesh_shape))).reshape(mesh_shape), names)
    prog = ernie.compile(model, opt, [ids, labels], mesh=mesh, config=config)
    return prog, [prog.step(ids, labels) for _ in range(steps)]


def plan_config(model, names, sp=False, zero=0, **pp):
    """The config of a plan on mesh axes `names`: dp (ZeRO level `zero`),
    mp (the model's plan, with sequence parallelism `sp`), pp on the
    family's split points (2 micro-batches; `pp` adds pp_config keys), ep."""
    config = {}
    if "dp" in names:
        config["dp_config"] = {"sharding_level": zero}
    if "mp" in names:
        config["mp_config"] = {"parallelize_plan": model.parallelize_plan(sp)}
    if "pp" in names:
        config["pp_config"] = {"split_spec": model.split_spec, "accumulate_steps": 2, **pp}
    if "ep" in names:
        config["ep_config"] = {"axis": "ep"}
    return config


FAMILY_MODELS = {
    "qwen2-tied": lambda: Qwen2ForCausalLM(Qwen2Config(**TINY, tie_word_embeddings=True, seed=3)),
    "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(**TINY, head_dim=16, seed=3)),
    "qwen3_moe": lambda: Qwen3MoeForCausalLM(Qwen3MoeConfig(
        **TINY, head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        norm_topk_prob=True, output_router_logits=True, router_aux_loss_coef=0.05, seed=3)),
}


@pytest.mark.parametrize("family,shape,names,sp", [
    ("qwen2-tied", [2, 2], ["dp", "mp"], False),
    ("qwen2-tied", [2], ["mp"], True),
    ("qwen3", [2, 2], ["dp", "mp"], False),
    ("qwen3", [2, 2], ["pp", "mp"], False),
    ("qwen3_moe", [2, 2], ["dp", "mp"], False),
    ("qwen3_moe", [2, 2], ["dp", "ep"], False),
])
def test_training_under_plans_matches_single_rank(family, shape, names, sp):
    """dp, mp (with sequence parallelism), pp on the family's split points
    (`<prefix>.layers`) and ep: the losses of one rank."""
    _, want = train(FAMILY_MODELS[family](), None, None, None)
    model = FAMILY_MODELS[family]()
    prog, got = train(model, shape, names, plan_config(model, names, sp))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert got[-1] < got[0]  # it learns
    if "mp" in names:
        assert any(k.endswith("[mp]") for k in prog.report()["collectives"])


def test_the_auxiliary_loss_is_a_metric_of_the_step_under_every_plan():
    """Qwen3-MoE with output_router_logits: each step reports lm_loss and
    aux_loss apart (loss = lm_loss + coef x aux_loss), the same on dp x ep
    as on one rank; a pipelined program reports none (per micro-batch
    metrics are not the step's) and still trains."""
    progs = {}
    for case, shape, names, config in [
            ("one", None, None, None),
            ("dp2xep2", [2, 2], ["dp", "ep"], {"dp_config": {}, "ep_config": {"axis": "ep"}})]:
        progs[case] = train(FAMILY_MODELS["qwen3_moe"](), shape, names, config, steps=2)
    (one, losses), (split, split_losses) = progs["one"], progs["dp2xep2"]
    coef = one.model.config.router_aux_loss_coef
    assert set(one.last_metrics) == {"lm_loss", "aux_loss"}
    assert one.last_metrics["lm_loss"] + coef * one.last_metrics["aux_loss"] == \
        pytest.approx(losses[-1], rel=1e-6)
    for name, value in one.last_metrics.items():
        assert split.last_metrics[name] == pytest.approx(value, rel=1e-5), name
    pipelined, piped = train(FAMILY_MODELS["qwen3_moe"](), [2], ["pp"], {
        "pp_config": {"split_spec": "qwen3_moe.layers", "accumulate_steps": 2}}, steps=2)
    assert pipelined.last_metrics == {}
    # Its loss is the micro-batches' mean, each with its own balancing loss.
    np.testing.assert_allclose(piped, losses, rtol=1e-3)


# ---------------------------------------------------------------------------
# Parity with transformers itself (the reference environment)
# ---------------------------------------------------------------------------

REFERENCE_VENV = Path(os.environ.get("ERNIE_REFERENCE_VENV", "/work/.refenv"))
REFERENCE_SCRIPT = Path(__file__).with_name("hf_reference.py")
_reference = {}


def reference_python():
    """The reference environment's interpreter, or a skip saying how to
    make one."""
    if "python" not in _reference:
        python = REFERENCE_VENV / "bin" / "python"
        ok = python.exists() and subprocess.run(
            [str(python), "-c", "import torch, transformers"], capture_output=True).returncode == 0
        _reference["python"] = str(python) if ok else None
    if _reference["python"] is None:
        pytest.skip(f"no reference environment at {REFERENCE_VENV} (torch and transformers): "
                    f"make it with scripts/reference_env.sh (ERNIE_REFERENCE_VENV to place it)")
    return _reference["python"]


def reference(*args):
    python = reference_python()
    done = subprocess.run([python, str(REFERENCE_SCRIPT), *map(str, args)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def hf_run(folder, ids, tmp_path, tag):
    np.savez(tmp_path / f"{tag}-in.npz", ids=ids, labels=ids)
    reference("run", folder, tmp_path / f"{tag}-in.npz", tmp_path / f"{tag}-out.npz")
    out = dict(np.load(tmp_path / f"{tag}-out.npz"))
    print(f"reference: {out['versions']}")  # the versions compared against
    return out


def assert_transformers_numbers(model, folder, ids, tmp_path, loss_rtol=1e-5):
    """ernie's logits (f32: <= 1e-5 relative in norm) and loss (labels =
    ids) of `model` are transformers' on `folder`; returns transformers'
    outputs (hf_run)."""
    theirs = hf_run(folder, ids, tmp_path, "made")
    logits = ernie.compile(model, None, [ids], differentiate=False).forward(ids)
    assert np.linalg.norm(logits - theirs["logits"]) <= 1e-5 * np.linalg.norm(theirs["logits"])
    loss = ernie.compile(model, None, [ids, ids], differentiate=False).eval(ids, ids)
    assert loss == pytest.approx(float(theirs["loss"]), rel=loss_rtol)
    return theirs


def unfused(state):
    """transformers 5 holds a layer's experts fused in memory
    (`mlp.experts.gate_up_proj` [E, 2 I, H], `mlp.experts.down_proj` [E, H,
    I]); the per-expert tensors it saves and ernie writes, from them."""
    out = {}
    for name, value in state.items():
        prefix, _, kind = name.rpartition("mlp.experts.")
        if kind == "gate_up_proj":
            half = value.shape[1] // 2
            for e, w in enumerate(value):
                out[f"{prefix}mlp.experts.{e}.gate_proj.weight"] = w[:half]
                out[f"{prefix}mlp.experts.{e}.up_proj.weight"] = w[half:]
        elif kind == "down_proj":
            for e, w in enumerate(value):
                out[f"{prefix}mlp.experts.{e}.down_proj.weight"] = w
        else:
            out[name] = value
    return out


PARITY = [("qwen2", [2, 2], ["dp", "mp"]), ("qwen2-tied", [2, 2], ["dp", "mp"]),
          ("qwen3", [2, 2], ["dp", "mp"]), ("qwen3_moe", [2, 2, 2], ["dp", "mp", "ep"]),
          ("llama-rope", [2, 2], ["dp", "mp"]),  # Llama 3.1's rope scaling
          ("qwen2-yarn", [2, 2], ["dp", "mp"])]  # YaRN


@pytest.mark.parametrize("family,shape,names", PARITY)
def test_transformers_parity_both_ways(tmp_path, family, shape, names):
    """A tiny random model made and saved by transformers: ernie's logits
    (f32, <= 1e-5 relative) and loss are transformers'; after 5 training
    steps on a dp x mp (x ep) mesh, the folder save_pretrained writes loads
    in transformers with every tensor equal to ernie's state, and
    transformers' loss on it equals ernie's eval loss."""
    reference("make", family, 7, tmp_path / "made")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "made")
    assert model.config.dtype == "f32"
    ids = np.random.default_rng(8).integers(0, model.config.vocab_size, size=(4, 8))
    labels = ids  # Hugging Face's labels, as transformers takes them (hf_run)
    assert_transformers_numbers(model, tmp_path / "made", ids, tmp_path)

    mesh = dist.ProcessMesh(np.arange(int(np.prod(shape))).reshape(shape), names)
    config = {"dp_config": {"sharding_level": 0},
              "mp_config": {"parallelize_plan": model.parallelize_plan()}}
    if "ep" in names:
        config["ep_config"] = {"axis": "ep"}
    prog = ernie.compile(model, ernie.optimizer.AdamW(1e-2), [ids, labels], mesh=mesh,
                         config=config)
    for _ in range(5):
        prog.step(ids, labels)
    state = prog.state_dict()
    model.save_pretrained(tmp_path / "trained", state=state)
    trained = hf_run(tmp_path / "trained", ids, tmp_path, "trained")
    from ernie.models.llama import hf_state_from_ernie
    ours = hf_state_from_ernie({n: state[n] for n, _ in model.named_parameters()}, model.config)
    hf_state = unfused({k[len("state/"):]: v for k, v in trained.items()
                        if k.startswith("state/")})
    if model.config.tie_word_embeddings:  # transformers lists the tied head under both names
        np.testing.assert_array_equal(hf_state.pop("lm_head.weight"),
                                      ours["model.embed_tokens.weight"])
    assert set(hf_state) == set(ours)
    for name, value in ours.items():
        np.testing.assert_array_equal(hf_state[name], value, err_msg=name)
    ours_loss = prog.eval(ids, labels)
    assert ours_loss == pytest.approx(float(trained["loss"]), rel=1e-5)


@pytest.mark.parametrize("family", ["qwen2-tied", "qwen3", "qwen3_moe"])
def test_fp8_under_dp_mp_equals_one_rank(family):
    """fp8 (current scaling) on every projection (Qwen2's biases, Qwen3's
    q/k norms and Qwen3-MoE's experts between them): dp x mp equals one
    rank for the first steps (1e-5; the scales are global)."""
    ids = np.random.default_rng(4).integers(0, 64, size=(4, 8))

    def losses(shape=None, names=None):
        model = FAMILY_MODELS[family]()
        mesh = None if shape is None else dist.ProcessMesh(np.arange(4).reshape(shape), names)
        prog = ernie.compile(model, ernie.optimizer.AdamW(3e-3), [ids, ids], mesh=mesh,
                             config=None if names is None else plan_config(model, names),
                             fp8_config={"recipe": "current"})
        assert "ernie.scaled_matmul" in prog.mlir
        return [prog.step(ids, ids) for _ in range(3)]
    np.testing.assert_allclose(losses([2, 2], ["dp", "mp"]), losses(), rtol=1e-5)

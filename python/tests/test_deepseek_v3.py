"""DeepSeek-V3 (ernie.models.deepseek_v3): multi-head latent attention,
sigmoid routing with group-limited top-k and the aux-free selection bias,
shared experts and the first dense layers; the published size's parameter
count, refusals, training under plans equal to one rank, and parity with
`transformers` both ways (the reference environment; skipped without it).
"""

import json
import subprocess

import numpy as np
import pytest

import ernie
import ernie.distributed as dist
from ernie.models import AutoConfig, AutoModelForCausalLM
from ernie.models.deepseek_v3 import DeepseekV3Config, DeepseekV3ForCausalLM
from ernie.weights import read_hf_folder

from test_qwen import (assert_transformers_numbers, hf_run, plan_config, reference, train,
                       unfused, write_config)

# DeepSeek-V3's published config.json.
DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
               "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
               "moe_intermediate_size": 2048, "num_hidden_layers": 61,
               "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
               "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512,
               "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128,
               "qk_nope_head_dim": 128, "topk_method": "noaux_tc", "n_group": 8,
               "topk_group": 4, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
               "norm_topk_prob": True, "scoring_func": "sigmoid", "hidden_act": "silu",
               "rms_norm_eps": 1e-6, "rope_theta": 10000, "tie_word_embeddings": False,
               "torch_dtype": "bfloat16", "num_nextn_predict_layers": 1,
               "attention_bias": False, "attention_dropout": 0.0,
               "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                "type": "yarn"}}

TINY = DeepseekV3Config(vocab_size=64, hidden_size=32, intermediate_size=48,
                        moe_intermediate_size=16, num_hidden_layers=3, num_attention_heads=4,
                        n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2,
                        first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=16,
                        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=12, seed=3)


def test_the_published_size_has_its_parameter_count(tmp_path):
    """671B without the multi-token-prediction module (DeepSeek's report:
    671B total, 37B activated, the MTP module's 14B on top), against a
    hand count."""
    cfg = AutoConfig.from_pretrained(write_config(tmp_path, DEEPSEEK_V3))
    assert type(cfg) is DeepseekV3Config and cfg.dtype == "bf16"
    with ernie.nn.abstract():
        model = DeepseekV3ForCausalLM(cfg)
    count = sum(int(np.prod(p.shape)) for p in model.parameters())
    h, heads = 7168, 128
    attn = (h * 1536 + 1536 + 1536 * heads * 192 + h * (512 + 64) + 512
            + 512 * heads * (128 + 128) + heads * 128 * h)
    dense = 3 * h * 18432
    moe = h * 256 + 256 * 3 * h * 2048 + 3 * h * 2048
    hand = 61 * (attn + 2 * h) + 3 * dense + 58 * moe + 2 * 129280 * h + h
    assert count == hand
    assert round(count / 1e9) == 671
    active = count - 58 * 248 * 3 * h * 2048  # 8 of 256 routed experts a token
    assert abs(active / 1e9 - 37) < 0.6  # the report's "37B", rounded (37.55B here)


@pytest.mark.parametrize("change,field", [
    ({"rope_scaling": {"type": "dynamic", "factor": 2}}, "rope_scaling"),
    ({"rope_scaling": {"type": "yarn", "factor": 40}}, "original_max_position_embeddings"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"attention_bias": True}, "attention_bias"),
    ({"n_group": 7}, "n_group"),
    ({"topk_group": 9}, "topk_group"),
    ({"num_experts_per_tok": 0}, "num_experts_per_tok"),
])
def test_fields_ernie_cannot_compute_are_refused_naming_them(tmp_path, change, field):
    with pytest.raises((ValueError, TypeError), match=field):
        AutoConfig.from_pretrained(write_config(tmp_path, {**DEEPSEEK_V3, **change}))


def test_names_and_a_round_trip(tmp_path):
    model = DeepseekV3ForCausalLM(TINY)
    shapes = {n: p.shape for n, p in model.named_parameters()}
    assert shapes["model.layers.0.self_attn.q_b_proj.weight"] == (16, 4 * 16)
    assert shapes["model.layers.0.self_attn.kv_b_proj.weight"] == (16, 4 * (8 + 12))
    assert shapes["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"] == (32, 16 + 8)
    assert shapes["model.layers.0.mlp.gate_proj.weight"] == (32, 48)  # dense
    assert shapes["model.layers.1.mlp.experts.down_proj.weight"] == (8, 16, 32)
    assert shapes["model.layers.1.mlp.shared_experts.up_proj.weight"] == (32, 16)
    model.model.layers[2].mlp.e_score_correction_bias = np.linspace(-1, 1, 8).astype(np.float32)
    model.save_pretrained(tmp_path / "out")
    config, weights, _ = read_hf_folder(tmp_path / "out")
    assert weights["model.layers.1.mlp.experts.7.down_proj.weight"].shape == (32, 16)
    np.testing.assert_array_equal(weights["model.layers.2.mlp.gate.e_score_correction_bias"],
                                  np.linspace(-1, 1, 8).astype(np.float32))
    assert config["model_type"] == "deepseek_v3" and config["v_head_dim"] == 12
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    for (name, p), (_, q) in zip(model.named_parameters(), again.named_parameters()):
        np.testing.assert_array_equal(p.value, q.value, err_msg=name)
    np.testing.assert_array_equal(again.model.layers[2].mlp.e_score_correction_bias,
                                  np.linspace(-1, 1, 8).astype(np.float32))
    weights["model.layers.1.self_attn.kv_b_proj.weight"] = np.zeros((80, 8), np.float32)
    from ernie.weights import write_hf_folder
    write_hf_folder(tmp_path / "bad", config, weights, "f32")
    with pytest.raises(ValueError, match=r"tensor 'model.layers.1.self_attn.kv_b_proj.weight' "
                                         r"has shape \[80, 8\], the config makes it \[80, 16\]"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "bad")


def small(**changes):
    cfg = DeepseekV3Config(**{**TINY.__dict__, **changes})
    return DeepseekV3ForCausalLM(cfg)


@pytest.mark.parametrize("shape,names,sp,zero", [
    ([2, 2], ["dp", "mp"], False, 0),
    ([2], ["mp"], True, 0),
    ([2, 2], ["dp", "ep"], False, 1),
    ([2, 2], ["ep", "mp"], False, 0),
    ([2, 2], ["pp", "mp"], False, 0),
])
def test_training_under_plans_matches_single_rank(shape, names, sp, zero):
    _, want = train(small(), None, None, None)
    model = small()
    # 3 layers on 2 pipeline stages: the dense layer alone, then the MoE two.
    config = plan_config(model, names, sp, zero, layers_per_stage=[1, 2])
    _, got = train(model, shape, names, config)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert got[-1] < got[0]


@pytest.mark.parametrize("family", ["deepseek_v3", "deepseek_v3-plain", "deepseek_v3-yarn"])
def test_transformers_parity_both_ways(tmp_path, build_dir, family):
    """A transformers-made folder (non-zero selection biases): ernie's
    logits (<= 1e-5 relative) and loss are transformers'; after 5 steps on
    dp x mp x ep, save_pretrained and ernie-ckpt export-hf of the training
    checkpoint reload in transformers with every tensor equal and the same
    loss."""
    reference("make", family, 7, tmp_path / "made")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "made")
    assert np.abs(model.model.layers[1].mlp.e_score_correction_bias).max() > 0
    ids = np.random.default_rng(8).integers(0, model.config.vocab_size, size=(4, 8))
    assert_transformers_numbers(model, tmp_path / "made", ids, tmp_path)

    mesh = dist.ProcessMesh(np.arange(8).reshape(2, 2, 2), ["dp", "mp", "ep"])
    prog = ernie.compile(model, ernie.optimizer.AdamW(1e-2), [ids, ids], mesh=mesh, config={
        "dp_config": {}, "mp_config": {"parallelize_plan": model.parallelize_plan()},
        "ep_config": {"axis": "ep"}})
    for _ in range(5):
        prog.step(ids, ids)
    model.save_pretrained(tmp_path / "trained", state=prog.state_dict())
    prog.save_checkpoint(tmp_path / "ckpt")
    done = subprocess.run([str(build_dir / "bin" / "ernie-ckpt"), "export-hf", tmp_path / "ckpt",
                           tmp_path / "exported", "--config", tmp_path / "made" / "config.json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    ours_loss = prog.eval(ids, ids)
    for folder in ("trained", "exported"):
        out = hf_run(tmp_path / folder, ids, tmp_path, folder)
        hf_state = unfused({k[len("state/"):]: v for k, v in out.items()
                            if k.startswith("state/")})
        _, ours, _ = read_hf_folder(tmp_path / folder)
        assert set(hf_state) == set(ours), folder
        for name, value in ours.items():
            np.testing.assert_array_equal(hf_state[name], np.asarray(value).reshape(
                hf_state[name].shape), err_msg=f"{folder}: {name}")
        assert ours_loss == pytest.approx(float(out["loss"]), rel=1e-5), folder
    assert json.loads((tmp_path / "exported" / "config.json").read_text())["v_head_dim"] == 12


def test_rank_by_rank_loading_and_fp8(tmp_path):
    """Built abstractly, from_pretrained reads headers only and the
    program on dp x mp loads each rank's pieces: the logits of the eager
    model. fp8 (current scaling) on dp x mp equals fp8 on one rank (1e-5,
    the first steps: scales are global)."""
    small().save_pretrained(tmp_path / "folder")
    eager = AutoModelForCausalLM.from_pretrained(tmp_path / "folder")
    ids = np.random.default_rng(2).integers(0, 64, size=(4, 8))
    want = ernie.compile(eager, None, [ids], differentiate=False).forward(ids)
    with ernie.nn.abstract():
        model = AutoModelForCausalLM.from_pretrained(tmp_path / "folder")
    mesh = dist.ProcessMesh(np.arange(4).reshape(2, 2), ["dp", "mp"])
    got = ernie.compile(model, None, [ids], differentiate=False, mesh=mesh, config={
        "dp_config": {}, "mp_config": {"parallelize_plan": model.parallelize_plan()}}
    ).forward(ids)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    def fp8_losses(mesh=None, config=None):
        model = small()
        opt = ernie.optimizer.AdamW(3e-3)
        prog = ernie.compile(model, opt, [ids, ids], mesh=mesh, config=config,
                             fp8_config={"recipe": "current"})
        assert "ernie.scaled_matmul" in prog.mlir
        return [prog.step(ids, ids) for _ in range(3)]
    model = small()
    np.testing.assert_allclose(
        fp8_losses(mesh, {"dp_config": {}, "mp_config": {
            "parallelize_plan": model.parallelize_plan()}}), fp8_losses(), rtol=1e-5)

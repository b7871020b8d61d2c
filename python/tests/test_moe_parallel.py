"""A toy ERNIE-4.5 MoE (4 layers, 8 experts, top-2, one shared expert,
capacity factor 1: tokens are dropped) trained 20 AdamW steps under expert
parallelism equals the single-rank run with the same token groups.

Tolerance 1e-5 relative on every step's loss: f32, the plans only sum in
another order (gradients reduced across ranks, partial sums under mp), and
the routing is the same: each group is routed whole on one rank, so the
plans drop what the single rank drops (test_moe.py counts drops exactly).
Communication: each MoE layer moves its capacity buffers with four
all-to-alls a step (dispatch and combine, forward and backward); a rank
sends (ep - 1) / ep of each, which gives the formula
2 * tokens * k * hidden * bytes * (ep - 1) / ep each way, forward and
backward, at capacity factor 1, tokens being the rank's share: under mp
each tensor-parallel rank dispatches 1 / mp of its shard's tokens.
"""

import re

import numpy as np
import pytest

import ernie
import ernie.distributed as dist
from ernie.models.ernie4_5 import Ernie4_5Config, Ernie4_5_MoeForCausalLM
from ernie.moe import set_token_groups

TOY = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
           num_attention_heads=4, num_key_value_heads=2, moe_num_experts=8, moe_k=2,
           moe_num_shared_experts=1, moe_intermediate_size=16, moe_layer_start_index=1,
           moe_capacity_factor=1.0, router_aux_loss_coef=0.01,
           router_orthogonal_loss_coef=0.01, router_z_loss_coef=0.001, seed=4)
# Steps compared with the single rank. Capacity drops make training chaotic:
# the plans sum gradients in another order (~1e-6 relative apart per step),
# and once a router score crosses a tie the same tokens are no longer
# dropped (dp2xep2 on OpenBLAS's Haswell kernels does at step 15): 12 steps
# stay well before that on every machine tried.
B, S, GROUPS, STEPS = 8, 16, 4, 12
RNG = np.random.default_rng(0)
IDS = RNG.integers(0, TOY["vocab_size"], (B, S)).astype(np.int64)
LABELS = IDS  # Hugging Face's labels: the model shifts them

EXPERT_MP = {
    r"model\.layers\.\d+\.mlp\.experts\.(gate|up)_proj\.weight": dist.ColWiseParallel(),
    r"model\.layers\.\d+\.mlp\.experts\.down_proj\.weight": dist.RowWiseParallel(),
    r"model\.layers\.\d+\.self_attn\.(q|k|v)_proj": dist.ColWiseParallel(),
    r"model\.layers\.\d+\.self_attn\.o_proj": dist.RowWiseParallel(),
}

# Sequence parallelism around the tensor-parallel attention and MoE MLP.
EXPERT_MP_SP = {
    **EXPERT_MP,
    r"model\.embed_tokens": [dist.ColWiseParallel(), dist.SequenceParallelBegin()],
    r"model\.layers\.\d+\.(input|post_attention)_layernorm": dist.SequenceParallelEnable(),
    r"model\.layers\.\d+\.self_attn": dist.SequenceParallelDisable(),
    r"model\.layers\.\d+\.mlp": dist.SequenceParallelDisable(),
    r"model\.norm": dist.SequenceParallelEnd(),
}

PLANS = {
    "ep4": ([4], ["ep"], {"ep_config": {"axis": "ep"}}),
    "dp2xep2": ([2, 2], ["dp", "ep"], {"dp_config": {}, "ep_config": {"axis": "ep"}}),
    "ep-on-dp-zero1": ([4], ["dp"], {"dp_config": {"sharding_level": 1},
                                     "ep_config": {"axis": "dp", "token_groups": 4}}),
    "ep-on-dp-zero2": ([4], ["dp"], {"dp_config": {"sharding_level": 2}, "ep_config": {"axis": "dp"}}),
    "ep-on-dp-zero3": ([4], ["dp"], {"dp_config": {"sharding_level": 3}, "ep_config": {"axis": "dp"}}),
    "ep2xmp2": ([2, 2], ["ep", "mp"], {"ep_config": {"axis": "ep", "token_groups": 4},
                                       "mp_config": {"parallelize_plan": EXPERT_MP}}),
    "ep2xmp2-sp": ([2, 2], ["ep", "mp"], {"ep_config": {"axis": "ep", "token_groups": 4},
                                          "mp_config": {"parallelize_plan": EXPERT_MP_SP}}),
    "pp2xep2": ([2, 2], ["pp", "ep"], {"ep_config": {"axis": "ep", "token_groups": 4},
                                       "pp_config": {"split_spec": "model.layers"}}),
}


def train(shape=None, names=None, config=None, fp8=None, steps=STEPS, groups=GROUPS,
          **overrides):
    """The toy (its config fields overridden) trained `steps` steps on the
    mesh `shape` x `names` with the plan `config`: (program, losses)."""
    model = Ernie4_5_MoeForCausalLM(Ernie4_5Config(**{**TOY, **overrides}))
    set_token_groups(model, groups)
    mesh = None
    if shape:
        mesh = dist.ProcessMesh(np.arange(int(np.prod(shape))).reshape(shape).tolist(), names)
    prog = ernie.compile(model, ernie.optimizer.AdamW(1e-2), [IDS, LABELS], mesh=mesh,
                         config=config, fp8_config=fp8)
    return prog, [prog.step(IDS, LABELS) for _ in range(steps)]


def dropped(prog):
    """{MoE layer: choices its last step dropped} from the program's state."""
    return {k: float(v) for k, v in prog.state_dict().items() if k.endswith(":dropped")}


@pytest.fixture(scope="module")
def single_rank():
    prog, losses = train()
    assert sum(dropped(prog).values()) > 0, "the toy is meant to drop tokens"
    return losses, dropped(prog)


@pytest.mark.parametrize("plan", sorted(PLANS))
def test_expert_parallel_training_matches_single_rank(single_rank, plan):
    shape, names, config = PLANS[plan]
    prog, losses = train(shape, names, config)
    want, want_dropped = single_rank
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    assert losses[-1] < losses[0]
    assert dropped(prog) == want_dropped  # the same choices dropped, per layer
    kinds = prog.report()["collectives"]
    assert any(k.startswith("all_to_all[") for k in kinds), kinds


def test_expert_parallel_fp8_matches_single_rank_fp8():
    """FP8 GEMMs on both sides, 7 steps: the plans' f32 sums differ in the
    last bit, and once such a bit flips an e4m3 rounding (a 2^-3 relative
    step) the runs part. When depends on every rounding before it (the GEMM
    kernels', the exponentials'): between steps 5 and 14 on the machines
    tried. So the first four steps agree to f32 rounding and the rest stay
    on the same course (2e-3)."""
    fp8 = {"recipe": "current"}
    want = train(fp8=fp8, steps=7)[1]
    prog, got = train([2], ["ep"], {"ep_config": {"axis": "ep", "token_groups": 4}}, fp8=fp8,
                      steps=7)
    np.testing.assert_allclose(got[:4], want[:4], rtol=1e-5)
    np.testing.assert_allclose(got, want, rtol=2e-3)
    # The expert weights (the 4 experts on this rank) are quantised to fp8
    # and their grouped GEMMs multiply the dequantised codes; the router
    # ([hidden, E] = [32, 8]) stays f32.
    assert re.search(r"ernie.cast .*tensor<4x32x16xf32> -> tensor<4x32x16xf8E4M3FN>", prog.mlir)
    assert re.search(r"ernie.cast .*tensor<4x32x16xf8E4M3FN> -> tensor<4x32x16xf32>", prog.mlir)
    assert re.search(r"ernie.expert_matmul .*tensor<4x32x16xf32>", prog.mlir)
    assert not re.search(r"tensor<32x8xf8", prog.mlir)


@pytest.mark.parametrize("ep", [2, 4])
def test_all_to_all_volume_is_the_formula(ep):
    prog, _ = train([ep], ["ep"], {"ep_config": {"axis": "ep", "token_groups": 4}})
    cfg = Ernie4_5Config(**TOY)
    moe_layers = sum(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
    tokens = B * S // ep  # per rank
    k, hidden, nbytes = cfg.moe_k, cfg.hidden_size, 4
    a2a = prog.report()["collectives"][f"all_to_all[ep]"]
    # Per layer the buffers go and come back, forward and backward; the
    # filled rows [E, groups] (i64) go once, forward.
    assert a2a["count"] == (4 + 1) * moe_layers
    rows = moe_layers * cfg.moe_num_experts * 4 * 8 / ep  # 4 token groups
    # The report gives each all-to-all's buffer; a rank sends (ep-1)/ep of it.
    sent = (a2a["bytes"] - rows) * (ep - 1) / ep
    formula = 2 * tokens * k * hidden * nbytes * (ep - 1) / ep  # each way, fwd + bwd
    assert sent == pytest.approx(moe_layers * 2 * formula)


@pytest.mark.parametrize("plan", ["ep2xmp2", "ep2xmp2-sp"])
def test_each_tensor_parallel_rank_dispatches_its_share_of_the_tokens(plan):
    """Under mp the tokens are split over mp before dispatch (the plans'
    losses equal one rank's: test_expert_parallel_training_matches_single_rank):
    the all-to-all moves tokens / (ep * mp) per rank, half what ep 2 alone
    moves per rank of its group."""
    shape, names, config = PLANS[plan]
    prog, _ = train(shape, names, config, steps=1)
    cfg = Ernie4_5Config(**TOY)
    moe_layers = sum(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
    ep, mp = 2, 2
    tokens = B * S // (ep * mp)
    a2a = prog.report()["collectives"]["all_to_all[ep]"]
    assert a2a["count"] == (4 + 1) * moe_layers  # the buffers, and their filled rows once
    rows = moe_layers * cfg.moe_num_experts * 4 * 8 / (ep * mp)  # [E, 4 groups] i64
    sent = (a2a["bytes"] - rows) * (ep - 1) / ep
    formula = 2 * tokens * cfg.moe_k * cfg.hidden_size * 4 * (ep - 1) / ep
    assert sent == pytest.approx(moe_layers * 2 * formula)
    alone, _ = train([ep], ["ep"], {"ep_config": {"axis": "ep", "token_groups": 4}}, steps=1)
    assert a2a["bytes"] * mp == alone.report()["collectives"]["all_to_all[ep]"]["bytes"]


def test_bad_expert_plans_name_the_layer():
    model = Ernie4_5_MoeForCausalLM(Ernie4_5Config(**TOY))
    mesh = dist.ProcessMesh([[0, 1, 2]], ["dp", "ep"])
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp: 8 experts do not split over ep = 3"):
        dist.parallelize(model, None, mesh, {"ep_config": {"axis": "ep"}})
    with pytest.raises(ValueError, match=r"the expert axis 'moe' of the MoE layers "
                                         r"\(model\.layers\.1\.mlp, .*\) is not a mesh dimension"):
        dist.parallelize(model, None, mesh, {"ep_config": {"axis": "moe"}})
    with pytest.raises(ValueError, match=r"moe_k = 9 must be in \[1, moe_num_experts = 8\]"):
        Ernie4_5Config(**{**TOY, "moe_k": 9})


def test_hugging_face_folder_round_trips_with_experts_unstacked(tmp_path):
    """save_pretrained writes Hugging Face's names and [out, in] layout, one
    tensor per expert and the [1, E] selection bias; from_pretrained reads
    them back into the stacked parameters exactly (f32)."""
    from ernie import weights
    from ernie.models.ernie4_5 import Ernie4_5_MoeForCausalLM as Moe
    cfg = Ernie4_5Config(**TOY)
    model = Moe(cfg)
    bias = np.linspace(-0.1, 0.1, cfg.moe_num_experts).astype(np.float32)
    model.model.layers[1].mlp.e_score_correction_bias = bias
    model.save_pretrained(tmp_path)
    _, tensors, _ = weights.read_hf_folder(tmp_path)
    moe = sum(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
    per_moe = 1 + 3 * cfg.moe_num_experts + 3 * (cfg.moe_num_shared_experts > 0) + 1
    dense = cfg.num_hidden_layers - moe
    assert len(tensors) == 2 + cfg.num_hidden_layers * 6 + dense * 3 + moe * per_moe
    stacked = dict(model.named_parameters())["model.layers.1.mlp.experts.gate_proj.weight"].value
    np.testing.assert_array_equal(tensors["model.layers.1.mlp.experts.3.gate_proj.weight"],
                                  stacked[3].T)
    assert tensors["model.layers.1.mlp.gate.weight"].shape == (cfg.moe_num_experts,
                                                               cfg.hidden_size)
    np.testing.assert_array_equal(
        tensors["model.layers.1.mlp.moe_statics.e_score_correction_bias"], bias[None])
    assert "model.layers.0.mlp.gate_proj.weight" in tensors  # layer 0 is dense
    again = Moe.from_pretrained(tmp_path)
    for (name, p), (_, q) in zip(model.named_parameters(), again.named_parameters()):
        np.testing.assert_array_equal(p.value, q.value, err_msg=name)
    np.testing.assert_array_equal(again.model.layers[1].mlp.e_score_correction_bias, bias)

    tensors["model.layers.1.mlp.experts.8.gate_proj.weight"] = tensors[
        "model.layers.1.mlp.experts.3.gate_proj.weight"]
    hf, _ = weights.hf_folder_index(tmp_path)
    weights.write_hf_folder(tmp_path / "extra", hf, tensors, "f32")
    with pytest.raises(ValueError, match=r"no place for: \['model\.layers\.1\.mlp\.experts\.8"):
        Moe.from_pretrained(tmp_path / "extra")


def test_moe_config_sets_every_layer_and_refuses_what_is_not_built():
    model = Ernie4_5_MoeForCausalLM(Ernie4_5Config(**TOY))
    mesh = dist.ProcessMesh([0, 1], ["ep"])
    dist.parallelize(model, None, mesh, {"moe_config": {"capacity_factor": 2.0,
                                                        "z_loss_coef": 0.5},
                                         "ep_config": {"axis": "ep", "degree": 2}})
    from ernie.moe import moe_layers
    cfgs = [m.cfg for _, m in moe_layers(model)]
    assert [(c.capacity_factor, c.z_loss_coef) for c in cfgs] == [(2.0, 0.5)] * 3
    with pytest.raises(ValueError, match=r"unknown moe_config keys \['capacity'\]"):
        dist.parallelize(model, None, mesh, {"moe_config": {"capacity": 2}})
    with pytest.raises(ValueError, match=r"ep_config.degree = 4, but the expert axes ep have 2"):
        dist.parallelize(model, None, mesh, {"ep_config": {"axis": "ep", "degree": 4}})


def test_hugging_face_folder_loads_rank_by_rank_under_expert_parallelism(tmp_path):
    """An abstract model from a Hugging Face folder, compiled on ep 2 x mp 2:
    each rank reads its experts' (and its mp columns') pieces of the
    per-expert [out, in] tensors, and the state equals the eager load."""
    from ernie import weights
    from ernie.models.ernie4_5 import Ernie4_5_MoeForCausalLM as Moe, parallelize_plan
    source = Moe(Ernie4_5Config(**TOY))
    source.model.layers[2].mlp.e_score_correction_bias = np.arange(8, dtype=np.float32) / 100
    source.save_pretrained(tmp_path, max_shard_bytes=60_000)  # several shards
    assert (tmp_path / "model.safetensors.index.json").exists()
    with ernie.nn.abstract():
        model = Moe.from_pretrained(tmp_path)
    np.testing.assert_array_equal(model.model.layers[2].mlp.e_score_correction_bias,
                                  source.model.layers[2].mlp.e_score_correction_bias)
    mesh = dist.ProcessMesh([[0, 1], [2, 3]], ["ep", "mp"])
    prog = ernie.compile(model, ernie.optimizer.AdamW(1e-2), [IDS, LABELS], mesh=mesh,
                         config={"ep_config": {"axis": "ep", "token_groups": 4},
                                 "mp_config": {"parallelize_plan": parallelize_plan()}})
    got = prog.state_dict()
    for name, p in source.named_parameters():
        np.testing.assert_array_equal(got[name], p.value, err_msg=name)
    # A tensor of the wrong shape is named before anything is read.
    _, tensors, _ = weights.read_hf_folder(tmp_path)
    tensors["model.layers.1.mlp.experts.5.up_proj.weight"] = np.zeros((3, 3), np.float32)
    hf, _ = weights.hf_folder_index(tmp_path)
    weights.write_hf_folder(tmp_path / "bad", hf, tensors, "f32")
    with ernie.nn.abstract(), pytest.raises(
            ValueError, match=r"'model\.layers\.1\.mlp\.experts\.5\.up_proj\.weight' has shape "
                              r"\[3, 3\], the config makes it \[16, 32\]"):
        Moe.from_pretrained(tmp_path / "bad")


def test_aux_free_balancing_under_expert_parallelism_matches_single_rank():
    """The bias's usage is the whole batch's, whichever ranks hold the
    tokens: dp 2 x ep 2 updates it as one rank does (exactly: counts are
    integers), and the losses follow (1e-5, as above)."""
    name = "model.layers.1.mlp.gate.weight:e_score_correction_bias"

    def run(shape=None, names=None, config=None):
        # One rank takes the rate from the model's config, the plan from
        # moe_config: the same setting either way.
        prog, losses = train(shape, names, config, steps=8,
                             moe_aux_free_rate=0.0 if config else 1e-3)
        return losses, prog.state_dict()[name]

    want, bias = run()
    assert np.any(bias != 0)
    got, got_bias = run([2, 2], ["dp", "ep"], {"dp_config": {"sharding_level": 1},
                                                "ep_config": {"axis": "ep"},
                                                "moe_config": {"aux_free_rate": 1e-3}})
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_array_equal(got_bias, bias)


PIPELINED = {  # plan: (mesh, names, config, micro-batches)
    "pp2": ([2], ["pp"], {}, 2),
    "pp2xep2": ([2, 2], ["pp", "ep"], {"ep_config": {"axis": "ep"}}, 2),
    # Interleaved: the router losses of chunk 1 reach the loss on chunk 3,
    # on the same stage, through chunk 2.
    "pp2-vpp2": ([2], ["pp"], {"pp_config": {"vpp_degree": 2, "schedule_mode": "VPP"}}, 4),
}


@pytest.mark.parametrize("plan", sorted(PIPELINED))
def test_aux_free_balancing_and_drops_under_pipeline_match_single_rank(plan, tmp_path):
    """A pipeline sees the batch one micro-batch at a time: each hands its
    count of choices per expert (and of dropped choices) to the update,
    which adds them up. Under pp 2 with m micro-batches, each routed in
    groups of two sequences as the single rank routes its batch, the bias
    moves and the drops are counted exactly as on one rank (counts are
    integers), and the losses follow (1e-5, as above). The aux loss is off:
    a pipeline computes it per micro-batch from that micro-batch's usage
    (as Megatron does), which is another number than the whole batch's.
    The pipeline's checkpoint loads into the single rank unchanged."""
    name = "model.layers.1.mlp.gate.weight:e_score_correction_bias"

    def run(shape=None, names=None, config=None, groups=GROUPS):
        return train(shape, names, config, steps=6, groups=groups,
                     router_aux_loss_coef=0.0, moe_aux_free_rate=1e-3)

    one, want = run()
    shape, names, config, m = PIPELINED[plan]
    pp = {"split_spec": "model.layers", "accumulate_steps": m, **config.get("pp_config", {})}
    prog, got = run(shape, names, {**config, "pp_config": pp}, groups=GROUPS // m)
    assert prog.pipeline["micro_batches"] == m
    assert "ernie.micro_batch_sum" in prog.mlir, "the counts are handed to the update"
    np.testing.assert_allclose(got, want, rtol=1e-5)
    bias = one.state_dict()[name]
    assert np.any(bias != 0)
    np.testing.assert_array_equal(prog.state_dict()[name], bias)
    assert sum(dropped(one).values()) > 0
    assert dropped(prog) == dropped(one)
    # Evaluation routes with the moved bias on the stage that holds it.
    assert prog.eval(IDS, LABELS) == pytest.approx(one.eval(IDS, LABELS), rel=1e-5)
    # The pipeline's checkpoint holds the same state, and the single rank
    # resumes from it.
    prog.save_checkpoint(tmp_path / "ckpt")
    one.load_checkpoint(tmp_path / "ckpt")
    mine, theirs = prog.state_dict(), one.state_dict()
    assert mine.keys() == theirs.keys()
    for k in mine:
        np.testing.assert_array_equal(mine[k], theirs[k], err_msg=k)


def test_checkpoint_from_ep2_resumes_on_ep4(tmp_path):
    """A checkpoint of an ep-2 program (experts split in halves, the drop
    counts and slots with it) loads onto ep 4 and the next step's loss is
    the one the ep-2 program computes (1e-5)."""
    prog, _ = train([2], ["ep"], {"ep_config": {"axis": "ep", "token_groups": 4}}, steps=3)
    prog.save_checkpoint(tmp_path / "ckpt")
    other, _ = train([4], ["ep"], {"ep_config": {"axis": "ep"}}, steps=0)
    other.load_checkpoint(tmp_path / "ckpt")
    mine, theirs = prog.state_dict(), other.state_dict()
    assert mine.keys() == theirs.keys()
    for k in mine:
        np.testing.assert_array_equal(mine[k], theirs[k], err_msg=k)
    assert other.step(IDS, LABELS) == pytest.approx(prog.step(IDS, LABELS), rel=1e-5)


def test_hugging_face_bf16_folder_reads_back_the_rounded_values(tmp_path):
    """save_pretrained in bf16 writes BF16 tensors (Hugging Face's
    torch_dtype "bfloat16"); from_pretrained reads them as a bf16 model
    whose values are the f32 originals rounded to nearest even."""
    from ernie import _ernie, weights
    from ernie.models.ernie4_5 import Ernie4_5_MoeForCausalLM as Moe
    source = Moe(Ernie4_5Config(**TOY))
    source.save_pretrained(tmp_path, dtype="bf16")
    assert set(weights.file_dtypes(tmp_path / "model.safetensors").values()) == {"bf16"}
    again = Moe.from_pretrained(tmp_path)
    assert again.config.dtype == "bf16"
    for (name, p), (_, q) in zip(source.named_parameters(), again.named_parameters()):
        x = np.ascontiguousarray(p.value, np.float32)
        rounded = _ernie.convert_float(_ernie.convert_float(x, "f32", "bf16"), "bf16", "f32")
        np.testing.assert_array_equal(q.value.astype(np.float32), rounded.reshape(x.shape),
                                      err_msg=name)

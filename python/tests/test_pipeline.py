"""Pipelined training on the thread backend equals the single-rank program.

Llama with tied embeddings (the embedding's weight is read on the first and
the last stage: one logical parameter with a replica on each) trains under
pp = 2 and 4 and dp x mp x pp = 2 x 2 x 2, with every schedule, and its
losses over 20 steps stay within 1e-5 (relative) of the single-rank run on
the same global batch: the single-rank loss is the mean over the whole
batch, the pipeline's the mean over its micro-batches of their means — the
same number when every micro-batch has as many tokens (no ignored labels).
The labels are random targets, one per position (`pre_shifted_labels`);
Hugging Face's labels = input_ids under pipelines is test_labels.py's.
The parameters at the end agree too, the shared weight included.
"""

import numpy as np
import pytest

import ernie
import ernie.distributed as dist
import ernie.functional as F
from ernie.distributed import LayerDesc, PipelineLayer, SharedLayerDesc
from ernie.models.llama import (LlamaConfig, LlamaForCausalLM, LlamaForCausalLMPipe,
                                parallelize_plan)
from ernie.nn import Linear, RMSNorm

STEPS = 20


def config(layers):
    return LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=24,
                       num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                       tie_word_embeddings=True, seed=7, pre_shifted_labels=True)


def data(b=8, s=8, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 32, size=(b, s)), rng.integers(0, 32, size=(b, s))]


def optimizer():
    return ernie.optimizer.AdamW(ernie.optimizer.LinearWarmupCosine(3e-3, 5, STEPS),
                                 weight_decay=0.01)


def train(model, mesh=None, config=None, steps=STEPS):
    batch = data()
    prog = ernie.compile(model, optimizer(), batch, mesh=mesh, config=config)
    return prog, [prog.step(*batch) for _ in range(steps)]


_reference = {}


def reference(layers):
    """(losses, final state) of the single-rank program."""
    if layers not in _reference:
        prog, losses = train(LlamaForCausalLM(config(layers)))
        _reference[layers] = losses, prog.state_dict()
    return _reference[layers]


def mesh_of(**axes):
    shape = list(axes.values())
    return dist.ProcessMesh(np.arange(int(np.prod(shape))).reshape(shape), list(axes))


def check(prog, losses, layers, state_rtol=1e-4):
    want, state = reference(layers)
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    assert losses[-1] < losses[0]
    got = prog.state_dict()
    assert set(got) == set(state)
    for name in state:  # parameters and AdamW's moments
        np.testing.assert_allclose(got[name], state[name], rtol=state_rtol, atol=1e-6, err_msg=name)


# (mesh axes, layers, accumulate_steps, schedule_mode, vpp_degree)
CASES = [
    (dict(pp=2), 4, 4, "FThenB", 1),
    (dict(pp=2), 4, 4, "1F1B", 1),
    (dict(pp=2), 4, 4, "VPP", 2),
    (dict(pp=4), 4, 4, "FThenB", 1),
    (dict(pp=4), 4, 8, "1F1B", 1),
    (dict(pp=4), 8, 4, "VPP", 2),
    (dict(dp=2, mp=2, pp=2), 4, 2, "FThenB", 1),
    (dict(dp=2, mp=2, pp=2), 4, 4, "1F1B", 1),
    (dict(dp=2, mp=2, pp=2), 4, 2, "VPP", 2),
]


@pytest.mark.parametrize("axes,layers,steps,schedule,vpp", CASES,
                         ids=[f"{'x'.join(f'{k}{v}' for k, v in a.items())}-{s}-m{m}-L{n}"
                              for a, n, m, s, v in CASES])
def test_llama_tied_pipeline_matches_single_rank(axes, layers, steps, schedule, vpp):
    model = LlamaForCausalLM(config(layers))
    cfg = {"pp_config": {"split_spec": "llama.layers", "accumulate_steps": steps,
                         "schedule_mode": schedule, "vpp_degree": vpp}}
    if "dp" in axes:
        cfg["dp_config"] = {"sharding_level": 0}
    if "mp" in axes:
        cfg["mp_config"] = {"parallelize_plan": parallelize_plan(tie_word_embeddings=True)}
    prog, losses = train(model, mesh_of(**axes), cfg)
    p = prog.pipeline
    assert (p["stages"], p["virtual_stages"], p["micro_batches"]) == (axes["pp"], vpp, steps)
    assert p["schedule"] == ernie.pipeline.schedule_name(schedule)
    assert p["state_stages"]["llama.embed_tokens.weight"] == [0, axes["pp"] - 1]
    assert [[tuple(s) for s in r] for r in p["steps"]] == \
        dist.pipeline_schedule(schedule, axes["pp"], vpp, steps)
    check(prog, losses, layers)


PP2 = {"split_spec": "llama.layers", "accumulate_steps": 2, "schedule_mode": "1F1B"}
COMBINED = {
    "zero1-dp2xpp2": (dict(dp=2, pp=2), {"dp_config": {"sharding_level": 1}}),
    "zero3-dp2xpp2": (dict(dp=2, pp=2), {"dp_config": {"sharding_level": 3}}),
    # ZeRO-3 with mp: partition gathers some parameters in the step itself,
    # ahead of the gradient's call; each is rebuilt in the chunks reading it.
    "zero3-sp-dp2xmp2xpp2": (dict(dp=2, pp=2, mp=2), {"dp_config": {"sharding_level": 3},
                                                       "mp_config": {"parallelize_plan": parallelize_plan(
                                                           sequence_parallel=True,
                                                           tie_word_embeddings=True)}}),
    # ZeRO-1 with sp: the norms' weight gradients, pending over dp and mp,
    # are made whole once per step in the update (reduce-scatter, all-reduce,
    # all-gather), the other gradients reduce-scattered there.
    "zero1-sp-dp2xmp2xpp2": (dict(dp=2, pp=2, mp=2), {"dp_config": {"sharding_level": 1},
                                                       "mp_config": {"parallelize_plan": parallelize_plan(
                                                           sequence_parallel=True,
                                                           tie_word_embeddings=True)}}),
    "sp-mp2xpp2": (dict(pp=2, mp=2), {"mp_config": {
        "parallelize_plan": parallelize_plan(sequence_parallel=True, tie_word_embeddings=True)}}),
    "sp-overlap-mp2xpp2": (dict(pp=2, mp=2), {"mp_config": {
        "parallelize_plan": parallelize_plan(sequence_parallel=True, tie_word_embeddings=True),
        "sequence_parallel_overlap": True}}),
}


@pytest.mark.parametrize("name", list(COMBINED))
def test_pipeline_with_zero_and_sequence_parallelism(name):
    """ZeRO (its reduce-scatters and gathers inside each stage; ZeRO-3's
    parameter gathers rebuilt in every stage function that reads them) and
    sequence parallelism (with the overlap pass's asynchronous transfers)
    keep working inside the stages: the single-rank numbers, 8 steps."""
    axes, cfg = COMBINED[name]
    prog, losses = train(LlamaForCausalLM(config(4)), mesh_of(**axes),
                         dict(cfg, pp_config=PP2), steps=8)
    np.testing.assert_allclose(losses, reference(4)[0][:8], rtol=1e-5)


def test_pipeline_report_shows_zero_levels():
    """Per stage, ZeRO's splits over dp = 2 show in the report: the
    optimizer state halves from level 1, gradients shrink from level 2,
    parameters halve at level 3 (the layout the training functions hold,
    which evaluation now shares)."""
    stages = {}
    for level in range(4):
        prog = ernie.compile(LlamaForCausalLM(config(4)), optimizer(), data(), mesh=mesh_of(dp=2, pp=2),
                             config={"pp_config": PP2, "dp_config": {"sharding_level": level}})
        stages[level] = prog.report()["stages"]
    for s in range(2):
        full = stages[0][s]
        assert stages[1][s]["optimizer_state_bytes"] * 2 == full["optimizer_state_bytes"]
        assert stages[1][s]["gradient_bytes"] == full["gradient_bytes"]
        assert stages[2][s]["gradient_bytes"] < full["gradient_bytes"]
        assert stages[2][s]["parameter_bytes"] == full["parameter_bytes"]
        assert stages[3][s]["parameter_bytes"] * 2 == full["parameter_bytes"]

def test_pipeline_with_fp8():
    """FP8 GEMMs under pp: each quantisation runs on its GEMM's stage, and
    the run follows the single-rank FP8 run (current scaling; the bound is
    an fp8 code flipping where gradients are summed in another order)."""
    batch = data()
    fp8 = {"recipe": "current"}
    ref = ernie.compile(LlamaForCausalLM(config(4)), optimizer(), batch, fp8_config=fp8)
    want = [ref.step(*batch) for _ in range(6)]
    prog = ernie.compile(LlamaForCausalLM(config(4)), optimizer(), batch, mesh=mesh_of(pp=2),
                         config={"pp_config": PP2}, fp8_config=fp8)
    got = [prog.step(*batch) for _ in range(6)]
    np.testing.assert_allclose(got, want, rtol=1e-3)
    assert "scaled_matmul" in prog.mlir


@pytest.mark.parametrize("axes", [dict(pp=2), dict(dp=2, pp=2)], ids=["pp2", "dp2xpp2"])
def test_pipeline_with_delayed_fp8_histories(axes):
    """Delayed scaling under pp: every micro-batch quantises with the scale
    of the history at the step's start, hands its amaxes to the update, and
    the update rolls each history once per step with their maximum — the
    single-rank step's amax over the whole batch. After one step the
    activation and weight histories equal the single-rank run's (the same
    values, whatever the order of the maximum); a gradient's is m times it,
    since a micro-batch's loss is a mean over m times fewer tokens (its
    gradient is divided by m in the update), up to e5m2's rounding (2^-3)
    of the quantised gradients that flow into it: the first step's empty
    history gives both runs scale 1, so m-times larger values round to
    other codes. The losses then follow the single-rank run."""
    batch = data()
    fp8 = {"recipe": "delayed", "history_length": 4}
    ref = ernie.compile(LlamaForCausalLM(config(4)), optimizer(), batch, fp8_config=fp8)
    cfg = {"pp_config": dict(PP2, accumulate_steps=4)}
    if "dp" in axes:
        cfg["dp_config"] = {"sharding_level": 0}
    prog = ernie.compile(LlamaForCausalLM(config(4)), optimizer(), batch,
                         mesh=mesh_of(**axes), config=cfg, fp8_config=fp8)
    want, got = [ref.step(*batch)], [prog.step(*batch)]
    single, piped = ref.state_dict(), prog.state_dict()
    histories = [k for k in single if ":fp8_amax." in k]
    assert histories and set(histories) <= set(piped)
    for name in histories:
        if name.endswith("output_grad"):
            np.testing.assert_allclose(piped[name], 4 * single[name], rtol=2**-3, err_msg=name)
        else:
            np.testing.assert_allclose(piped[name], single[name], rtol=1e-6, err_msg=name)
        assert np.count_nonzero(piped[name]) == 1  # rolled once, not per micro-batch
    want += [ref.step(*batch) for _ in range(5)]
    got += [prog.step(*batch) for _ in range(5)]
    np.testing.assert_allclose(got, want, rtol=1e-3)


@pytest.mark.parametrize("fusion", [True, False])
def test_bf16_gradients_accumulate_in_f32(fusion):
    """A bf16 model's gradients are summed over the micro-batches in f32
    (Megatron's main grads): each stage holds gradient buffers of twice its
    bf16 parameters' bytes, and the run follows the single-rank bf16 run
    with f32 master weights (bound: bf16's 2^-8 on losses summed per
    micro-batch instead of over the whole batch). With gradient
    accumulation fusion the weight-gradient GEMMs add into those sums,
    the tied embedding's two included; without, adds after them do."""
    import dataclasses
    cfg = dataclasses.replace(config(4), dtype="bf16")
    batch = data()

    def adamw():
        return ernie.optimizer.AdamW(1e-3, multi_precision=True)
    ref = ernie.compile(LlamaForCausalLM(cfg), adamw(), batch)
    prog = ernie.compile(LlamaForCausalLM(cfg), adamw(), batch, mesh=mesh_of(pp=2),
                         config={"pp_config": dict(PP2, accumulate_steps=8,
                                                   gradient_accumulation_fusion=fusion)})
    assert ("ernie.matmul_accumulate" in prog.mlir) == fusion
    for stage in prog.report()["stages"]:
        assert stage["gradient_bytes"] == 2 * stage["parameter_bytes"]
    want = [ref.step(*batch) for _ in range(10)]
    got = [prog.step(*batch) for _ in range(10)]
    np.testing.assert_allclose(got, want, rtol=1e-2)
    assert got[-1] < got[0]


def test_pipelined_program_api():
    """eval equals the single-rank eval; state_dict / load_state_dict act on
    global values (a shared weight's replicas all take a loaded value);
    forward and grad say they are not available."""
    batch = data()
    ref = ernie.compile(LlamaForCausalLM(config(4)), optimizer(), batch)
    prog = ernie.compile(LlamaForCausalLM(config(4)), optimizer(), batch, mesh=mesh_of(pp=2),
                         config={"pp_config": {"split_spec": "llama.layers",
                                               "accumulate_steps": 2}})
    assert prog.is_pipelined and not ref.is_pipelined
    assert prog.eval(*batch) == pytest.approx(ref.eval(*batch), rel=1e-6)
    start = prog.state_dict()
    assert list(start) == list(ref.state_dict())
    for _ in range(3):
        prog.step(*batch)
    moved = prog.state_dict()
    assert not np.array_equal(moved["llama.embed_tokens.weight"], start["llama.embed_tokens.weight"])
    prog.load_state_dict(start)
    for name, value in prog.state_dict().items():
        np.testing.assert_array_equal(value, start[name], err_msg=name)
    # The loaded state trains as at the start: both replicas of the tied
    # weight took it (the loss reads the embedding on stage 0 and the head
    # on stage 1).
    first = ref.step(*batch)
    assert prog.step(*batch) == pytest.approx(first, rel=1e-5)
    with pytest.raises(RuntimeError, match=r"forward\(\) is not available on a pipelined program"):
        prog.forward(*batch)
    with pytest.raises(RuntimeError, match=r"grad\(\) is not available on a pipelined program"):
        prog.grad(*batch)
    with pytest.raises(ValueError, match="has shape"):
        prog.step(batch[0][:4], batch[1][:4])
    report = prog.report()
    assert report["pipeline"]["stages"] == 2 and "train_update.1" in report["functions"]


@pytest.mark.parametrize("pp,vpp,m", [(2, 1, 2), (2, 2, 4), (4, 1, 4)])
def test_llama_pipe_matches_llama(pp, vpp, m):
    """LlamaForCausalLMPipe (a PipelineLayer; SharedLayerDesc ties the head
    to the embedding) has LlamaForCausalLM's values and trains as it does."""
    model = LlamaForCausalLMPipe(config(4), num_stages=pp, num_virtual_pipeline_stages=vpp)
    assert model.shared_layers["embed_tokens"].weight.pipeline_stages == [0, pp * vpp - 1]
    prog, losses = train(model, mesh_of(pp=pp), {"pp_config": {"accumulate_steps": m}})
    want, state = reference(4)
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    got = prog.state_dict()
    np.testing.assert_allclose(got["shared_layers.embed_tokens.weight"],
                               state["llama.embed_tokens.weight"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got["5.weight"], state["llama.norm.weight"], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("tie,sp,vpp", [(True, False, 1), (True, True, 1), (False, True, 1),
                                        (True, True, 2)])
def test_llama_pipe_with_tensor_parallelism(tie, sp, vpp):
    """LlamaForCausalLMPipe.parallelize_plan() names its own layers (the
    module-level plan names LlamaForCausalLM's): on mp x pp = 2 x 2 the
    projections and the embedding are split, sequence parallelism keeps
    the activations between layers split along the sequence, and the losses are the single-rank
    ones (f32 sums in another order: 1e-5)."""
    cfg = config(4)
    cfg.tie_word_embeddings = tie
    model = LlamaForCausalLMPipe(cfg, num_stages=2, num_virtual_pipeline_stages=vpp)
    prog, losses = train(model, mesh_of(pp=2, mp=2),
                         {"pp_config": {"accumulate_steps": 2},
                          "mp_config": {"parallelize_plan": model.parallelize_plan(sp)}}, steps=4)
    ref = ernie.compile(LlamaForCausalLM(cfg), optimizer(), data())
    np.testing.assert_allclose(losses, [ref.step(*data()) for _ in range(4)], rtol=1e-5)
    update = {a["name"]: a for a in prog._signatures["train_update.0"]["arguments"]}
    assert update["1.self_attn.q_proj.weight"]["local_shape"] == [16, 8]
    embedding = "shared_layers.embed_tokens.weight" if tie else "0.weight"
    assert update[embedding]["local_shape"] == [32, 8]
    # Sequence parallelism sends the activation between stages split along
    # the sequence (a micro-batch is 4 x 8 tokens of 16 features).
    assert ("to stage 1 channel 0 : tensor<4x4x16xf32>" in prog.mlir) == sp
    # Each transfer is one shard per micro-batch — an activation forward, a
    # gradient back — gathered where it is read, never the whole (that was
    # three times the bytes: the whole and the shard). With v chunks per
    # rank on two ranks, a rank makes 2v - 1 of the 2(2v - 1) transfers.
    shard = 4 * 8 * 16 // 2 * 4
    sends = (2 * vpp - 1) * 2
    for stage in prog.report()["stages"]:
        assert stage["collectives"]["send"] == {"count": sends, "bytes": sends * shard}


def _tail(linear, x):  # the later occurrence reads the weight only
    return F.matmul(x, linear.p("weight"), transpose_b=True)


def _shared_proj_model(stages, norms):
    """proj (weight and bias) first, `norms` RMSNorms, proj's weight again."""
    descs = ([SharedLayerDesc("proj", Linear, None, ["weight", "bias"], 8, 8)]
             + [LayerDesc(RMSNorm, 8) for _ in range(norms)]
             + [SharedLayerDesc("proj", Linear, _tail, "weight", 8, 8)])
    model = PipelineLayer(descs, num_stages=stages, loss_fn=lambda y, t: F.mean((y - t) * (y - t)))
    rng = np.random.default_rng(3)
    model.shared_layers["proj"].weight.value = rng.normal(size=(8, 8)).astype(np.float32)
    model.shared_layers["proj"].bias.value = rng.normal(size=8).astype(np.float32)
    return model


def _train_shared_proj(pp, norms, m=2, steps=10):
    rng = np.random.default_rng(4)
    x, t = rng.normal(size=(8, 8)).astype(np.float32), rng.normal(size=(8, 8)).astype(np.float32)
    ref = ernie.compile(_shared_proj_model(1, norms), ernie.optimizer.SGD(0.1), [x, t])
    want = [ref.step(x, t) for _ in range(steps)]
    prog = ernie.compile(_shared_proj_model(pp, norms), ernie.optimizer.SGD(0.1), [x, t],
                         mesh=mesh_of(pp=pp), config={"pp_config": {"accumulate_steps": m}})
    got = [prog.step(x, t) for _ in range(steps)]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for name, value in ref.state_dict().items():
        np.testing.assert_allclose(prog.state_dict()[name], value, rtol=1e-5, atol=1e-6)
    return prog


@pytest.mark.parametrize("pp,norms", [(2, 2), (4, 6)])
def test_shared_layer_with_weight_and_bias(pp, norms):
    """A layer shared with weight and bias on the first chunk and its weight
    alone on the last: the bias lives on stage 0 only, the weight on both
    ends, and the pipeline trains as the single-rank program."""
    prog = _train_shared_proj(pp, norms)
    assert prog.pipeline["state_stages"]["shared_layers.proj.weight"] == [0, pp - 1]
    assert prog.pipeline["state_stages"]["shared_layers.proj.bias"] == [0]


def test_chunk_without_residuals():
    _train_shared_proj(4, 2)


def test_pipeline_report_memory_follows_the_schedule():
    """The plan report per stage: GPipe keeps every micro-batch's residuals
    until the backward, 1F1B at most p - s of them on stage s; the chunk
    functions' collectives count once per micro-batch, the update's once."""
    batch = data()
    plan = parallelize_plan(tie_word_embeddings=True)
    reports = {}
    for mode in ("FThenB", "1F1B"):
        prog = ernie.compile(LlamaForCausalLM(config(4)), optimizer(), batch, mesh=mesh_of(pp=2, mp=2),
                             config={"pp_config": {"split_spec": "llama.layers", "accumulate_steps": 4,
                                                   "schedule_mode": mode},
                                     "mp_config": {"parallelize_plan": plan}})
        reports[mode] = prog.report()
    for s, (gpipe, one) in enumerate(zip(reports["FThenB"]["stages"], reports["1F1B"]["stages"])):
        per_mb = gpipe["residual_bytes_per_micro_batch"]
        assert per_mb > 0 and one["residual_bytes_per_micro_batch"] == per_mb
        assert gpipe["activation_bytes"] == 4 * per_mb
        assert one["activation_bytes"] == (2 - s) * per_mb
        assert one["parameter_bytes"] > 0 and one["gradient_bytes"] > 0
        # Megatron's two all-reduces per layer and pass, on this stage's two
        # layers, for each of the 4 micro-batches.
        assert one["collectives"]["all_reduce[mp]"]["count"] >= 4 * 2 * 2 * 2


@pytest.mark.parametrize("axes,layers,counts,schedule,vpp", [
    (dict(pp=2), 4, [1, 3], "1F1B", 1),
    (dict(pp=4), 6, [1, 2, 2, 1], "1F1B", 1),    # Megatron's lighter first and last stages
    (dict(pp=2), 6, [1, 2, 2, 1], "VPP", 2),     # chunks of unequal length, interleaved
    (dict(dp=2, pp=2), 4, [3, 1], "FThenB", 1),
])
def test_uneven_stages_match_single_rank(axes, layers, counts, schedule, vpp):
    """pp_config.layers_per_stage: stages of unequal layer counts train as
    the single rank does, and each stage holds its own layers' state."""
    steps = 4
    cfg = {"pp_config": {"split_spec": "llama.layers", "accumulate_steps": steps,
                         "schedule_mode": schedule, "vpp_degree": vpp,
                         "layers_per_stage": counts}}
    if "dp" in axes:
        cfg["dp_config"] = {}
    prog, losses = train(LlamaForCausalLM(config(layers)), mesh_of(**axes), cfg)
    check(prog, losses, layers)
    holders = prog.pipeline["state_stages"]
    chunk_of_layer = [c for c, n in enumerate(counts) for _ in range(n)]
    for i in range(layers):
        stage = chunk_of_layer[i] % axes["pp"]
        assert holders[f"llama.layers.{i}.mlp.down_proj.weight"] == [stage], i


def test_uneven_stage_counts_are_checked():
    model = LlamaForCausalLM(config(4))
    with pytest.raises(ValueError, match=r"layers_per_stage \[1, 2\] must give each of the 2 "
                                         r"stages .* 4 in all"):
        ernie.compile(model, optimizer(), data(), mesh=mesh_of(pp=2), config={"pp_config": {
            "split_spec": "llama.layers", "accumulate_steps": 2, "layers_per_stage": [1, 2]}})
    with pytest.raises(ValueError, match="layers_per_stage is a list of layer counts >= 1"):
        ernie.compile(model, optimizer(), data(), mesh=mesh_of(pp=2), config={"pp_config": {
            "split_spec": "llama.layers", "accumulate_steps": 2, "layers_per_stage": [0, 4]}})

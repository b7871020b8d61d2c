"""The plan search (ernie.autoplan, dist.auto_plan, parallelize(config=
"auto")): every plan it returns has the abstract compile's exact memory,
the table is ordered by the cost model's time, the depth extrapolation it
searches with is the full compile's, and a cluster on which nothing fits
says how much memory the closest plan needed."""

import dataclasses

import numpy as np
import pytest

import ernie
import ernie.distributed as dist
from ernie import autoplan, cost
from ernie.models.llama import LlamaConfig, LlamaForCausalLM

CFG = dict(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
           num_attention_heads=8, num_key_value_heads=4, dtype="bf16")
BATCH, SEQ = 8, 256


def model(**over):
    with ernie.nn.abstract():
        return LlamaForCausalLM(LlamaConfig(**{**CFG, **over}))


def cluster(gib=80, n=4):
    device = dict(cost.load_device("h100_sxm"), memory_bytes=int(gib * 2**30))
    return cost.make_cluster(device, devices_per_node=n)


def direct_report(m, plan):
    ids = np.zeros((BATCH, SEQ), np.int64)
    prog = ernie.compile(autoplan._shallow((type(m), m.config), m.config.num_hidden_layers),
                         ernie.optimizer.AdamW(1e-4), [ids, ids], mesh=plan.mesh,
                         config=plan.config or None, abstract=True)
    return prog.report(), prog.estimate(cluster())


def test_plans_are_ranked_and_their_memory_is_exact():
    m = model()
    plans = dist.auto_plan(m, [np.zeros((BATCH, SEQ), np.int64)] * 2, cluster=cluster(), top=3)
    assert 1 <= len(plans) <= 3
    times = [p.step_seconds for p in plans]
    assert times == sorted(times)
    for p in plans:
        assert p.candidate.dp * p.candidate.mp * p.candidate.pp == 4
        report, est = direct_report(m, p)
        assert p.exact and p.memory_bytes == report["peak_bytes_per_rank"]
        assert p.step_seconds == pytest.approx(est["step_seconds"], rel=1e-9)
    assert "dp" in autoplan.format_table(plans)
    assert "exposed communication" in autoplan.explain(plans[0]) or plans[0].candidate.dp == 1


@pytest.mark.parametrize("candidate", [
    autoplan.Candidate(dp=2, mp=2, pp=1),
    autoplan.Candidate(dp=1, mp=2, pp=2, micro_batch_size=2, micro_batches=4),
    autoplan.Candidate(dp=2, mp=1, pp=2, zero=1, recompute="full", micro_batch_size=1,
                       micro_batches=4),
])
def test_depth_extrapolation_is_the_full_compile(candidate):
    """What the search ranks by, one and two layers per chunk carried to
    the model's depth, against the full compile: memory to 2 %, the step to
    3 %. Memory is affine in the layers but for the arena's greedy packing
    (arguments are outside it, so intermediates alone decide it): a
    ZeRO-1 update's arena grows by 7.90 MB from one layer per chunk to two
    and by 8.10 MB per layer after. The search compiles its finalists in
    full, so the plans it returns carry exact memory."""
    m = model(num_hidden_layers=8)
    spec = cost.load_cluster(cluster())
    opt = ernie.optimizer.AdamW(1e-4)
    chunks = candidate.pp * candidate.vpp
    family = (type(m), m.config)
    one = autoplan._evaluate(family, candidate, chunks, BATCH, SEQ, spec, opt)
    two = autoplan._evaluate(family, candidate, 2 * chunks, BATCH, SEQ, spec, opt)
    full = autoplan._evaluate(family, candidate, 8, BATCH, SEQ, spec, opt)
    guess = autoplan._extrapolate(one, two, 8 // chunks)
    assert guess["memory_bytes"] == pytest.approx(full["memory_bytes"], rel=0.02)
    assert guess["comm_bytes"] == pytest.approx(full["comm_bytes"], rel=0.01)
    assert guess["step_seconds"] == pytest.approx(full["step_seconds"], rel=0.03)
    # MFU is a ratio of two affine quantities, not itself affine.
    assert guess["estimate"]["mfu"] == pytest.approx(full["estimate"]["mfu"], rel=0.03)


def test_partial_recomputation_recomputes_only_what_it_must():
    """Where keeping every activation does not fit and recomputing every
    layer does, the plan recomputes the fewest layers per stage that fit
    (Megatron's --recompute-num-layers): one layer fewer would not fit, and
    its step is faster than full recomputation's."""
    m = model(num_hidden_layers=8)
    spec = cost.load_cluster(cluster())
    opt = ernie.optimizer.AdamW(1e-4)
    family = (type(m), m.config)
    base = autoplan.Candidate(dp=1, mp=1, pp=2, micro_batches=BATCH)
    measure = lambda c: autoplan._evaluate(family, c, 8, BATCH, SEQ, spec, opt)
    kept, full = measure(base), measure(dataclasses.replace(base, recompute="full"))
    # Between 1 and 2 of each stage's 4 layers' savings: 2 must be recomputed.
    limit = kept["memory_bytes"] - 0.4 * (kept["memory_bytes"] - full["memory_bytes"])
    plans = dist.auto_plan(m, global_batch=BATCH, seq_len=SEQ, ranks=2, top=1,
                           cluster=cluster(gib=limit / 0.9 / 2**30), micro_batch_sizes=(1,),
                           choices={"pp": [2], "vpp": [1]}, workers=1)
    best = plans[0].candidate
    assert best.recompute == "full" and best.recompute_layers == 2, best.name
    assert f"rc-full:{best.recompute_layers}" in best.name
    report, est = direct_report(m, plans[0])
    assert plans[0].memory_bytes == report["peak_bytes_per_rank"] <= limit
    assert report["recompute"]["layers"] == \
        [f"llama.layers.{i}" for i in autoplan._recomputed_layers(best, 8)]
    fewer = measure(dataclasses.replace(best, recompute_layers=best.recompute_layers - 1)
                    if best.recompute_layers > 1 else base)
    assert fewer["memory_bytes"] > limit
    assert kept["step_seconds"] < plans[0].step_seconds < full["step_seconds"]


def test_partial_recomputation_takes_every_chunk_of_a_stage_in_turn():
    """k layers of each stage, round-robin over the stage's chunks (chunk v
    of stage s is v * pp + s), each chunk from its first layer on."""
    c = autoplan.Candidate(dp=1, mp=1, pp=2, vpp=2, recompute="full", recompute_layers=3)
    # 16 layers, 4 per chunk: stage 0 holds chunks 0 and 2, stage 1 chunks 1 and 3.
    assert autoplan._recomputed_layers(c, 16) == [0, 1, 4, 5, 8, 12]
    assert autoplan._recomputed_layers(dataclasses.replace(c, pp=1, vpp=1), 4) == [0, 1, 2]


def test_nothing_fits_says_the_smallest_memory_and_plan():
    with pytest.raises(autoplan.NothingFits,
                       match=r"nothing fits .* 0\.0 GiB .* the smallest plan, dp.* needs "
                             r"[0-9.]+ GiB per rank"):
        dist.auto_plan(model(), global_batch=BATCH, seq_len=SEQ, cluster=cluster(gib=0.001))


def test_auto_plan_needs_a_batch_and_a_family():
    with pytest.raises(ValueError, match="needs inputs, or global_batch and seq_len"):
        dist.auto_plan(model(), cluster=cluster())
    with pytest.raises(ValueError, match="16 ranks but the cluster has 4 devices"):
        dist.auto_plan(model(), global_batch=BATCH, seq_len=SEQ, cluster=cluster(), ranks=16)


def test_parallelize_auto_applies_the_best_plan():
    m = model()
    ids = np.zeros((BATCH, SEQ), np.int64)
    dist.parallelize(m, None, config="auto", cluster=cluster(), inputs=[ids, ids])
    best = m.auto_plan
    prog = ernie.compile(m, ernie.optimizer.AdamW(1e-4), [ids, ids], abstract=True)
    assert prog.num_ranks == 4
    assert prog.report()["peak_bytes_per_rank"] == best.memory_bytes


def test_command_line_prints_the_table(capsys):
    assert autoplan.main(["--cluster", "dgx_h100", "--ranks", "2", "--global-batch", "4",
                          "--seq", "128", "--top", "2", "--llama",
                          "hidden_size=128,num_hidden_layers=2,num_attention_heads=4,"
                          "num_key_value_heads=2,intermediate_size=256,vocab_size=512"]) == 0
    out = capsys.readouterr().out
    assert "MFU" in out and "per step" in out


def test_breakdown_adds_up_and_is_drawn(tmp_path):
    """The explanation's parts sum to the predicted step, for every plan
    returned; the command line writes them as a PNG (stacked bars)."""
    plans = dist.auto_plan(model(), global_batch=BATCH, seq_len=SEQ, cluster=cluster(), top=3)
    for p in plans:
        parts = autoplan.breakdown(p.estimate)
        assert all(s >= 0 for _, s in parts)
        assert sum(s for _, s in parts) == pytest.approx(p.step_seconds, rel=1e-9)
    png = tmp_path / "breakdown.png"
    autoplan.plot_breakdown(plans, png)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_breakdown_picture_without_matplotlib_says_what_to_install(tmp_path, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    plan = autoplan.Plan(autoplan.Candidate(1, 1, 1), 1.0, 0.5, 0, 0,
                         {"compute_seconds": 1.0, "recompute_seconds": 0.0,
                          "exposed_comm_seconds": {}, "bubble_seconds": 0.0,
                          "overhead_seconds": 0.0}, True)
    with pytest.raises(ImportError, match="pip install matplotlib"):
        autoplan.plot_breakdown([plan], tmp_path / "x.png")


def test_search_workers_never_rerun_the_users_script(tmp_path):
    """The search spreads compiles over spawned processes: a script that
    calls auto_plan at its top level (no `if __name__ == "__main__"`) must
    not be run again in them (it recursed: "An attempt has been made to
    start a new process before ... bootstrapping")."""
    import os
    import subprocess
    import sys
    script = tmp_path / "plan.py"
    script.write_text(
        "import ernie\n"
        "from ernie import autoplan\n"
        "from ernie.models.llama import LlamaConfig, LlamaForCausalLM\n"
        "with ernie.nn.abstract():\n"
        "    m = LlamaForCausalLM(LlamaConfig(vocab_size=512, hidden_size=128,\n"
        "        intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,\n"
        "        num_key_value_heads=2, dtype='bf16'))\n"
        "plans = autoplan.auto_plan(m, cluster='dgx_h100', global_batch=8, seq_len=128,\n"
        "                           ranks=4, top=2, workers=2)\n"
        "print('searched', len(plans))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "searched 2" in out.stdout


def test_a_subclass_keeps_its_familys_plan():
    class MyLlama(LlamaForCausalLM):
        pass
    with ernie.nn.abstract():
        m = MyLlama(LlamaConfig(**CFG))
    assert autoplan._tp_plan(m, True).keys() == autoplan._tp_plan(model(), True).keys()


def search_two_stages(monkeypatch, state, activation, compiled=None):
    """_search_structure on a model of memory state[zero] + activation[
    recompute] a layer and step 10 s + 0.5 s a ZeRO level + 1 s a
    recomputed layer, for a structure of two stages of four layers on a
    60-byte device; what it found. `compiled` collects each knob compiled."""

    def evaluate(family, c, layers, batch, seq, cluster, optimizer):
        if compiled is not None:
            compiled.append((c.zero, c.recompute))
        per_stage = layers // 2
        memory = state[c.zero] + activation[c.recompute] * per_stage
        seconds = 10 + 0.5 * c.zero + (per_stage if c.recompute == "full" else 0)
        return {"step_seconds": seconds, "memory_bytes": memory, "function_bytes": [[memory]] * 2,
                "stage_bytes": [memory] * 2, "state_bytes": [state[c.zero]] * 2,
                "kept_bytes": [activation[c.recompute] * per_stage] * 2, "comm_bytes": 0,
                "estimate": {"step_seconds": seconds, "model_flops": 1.0, "recompute_flops": 0.0,
                             "peak_flops": 1.0, "ranks": 1}}

    monkeypatch.setattr(autoplan, "_evaluate", evaluate)
    config = dataclasses.make_dataclass("Config", [("num_hidden_layers", int)])(8)
    base = autoplan.Candidate(dp=2, mp=1, pp=2, micro_batches=2)
    return autoplan._search_structure(
        autoplan._Job((object, config), base, 8, 16, None, None, 60, False))[0]


def test_full_recomputation_tries_every_zero_level(monkeypatch):
    """Full recomputation is partial (as few layers as memory needs), so a
    ZeRO level up that leaves room for one more layer's activations can be
    faster than the first ZeRO level that fits. A structure of two stages of
    four layers, a 60-byte device: ZeRO-0's state (40) fits with three
    layers recomputed (13 s), ZeRO-1's (30, its optimizer step 0.5 s
    slower) with two (12.5 s): the search takes ZeRO-1."""
    found = search_two_stages(monkeypatch, {0: 40, 1: 30},
                              {"none": 10, "selective": 10, "full": 1})
    seconds, chosen, guess = found
    assert (chosen.zero, chosen.recompute, chosen.recompute_layers) == (1, "full", 2)
    assert seconds == pytest.approx(12.5)
    assert guess["memory_bytes"] <= 60


def test_knobs_that_cannot_fit_are_not_compiled(monkeypatch):
    """Activations the fastest knobs keep that alone exceed the device: no
    ZeRO level without recomputation fits, so those are not compiled; the
    partial recomputation between keeping and recomputing everything at
    ZeRO-1 takes the end that keeps everything as the first knobs plus
    ZeRO-1's difference under full recomputation (their effects add up). On
    two stages of four layers and a 60-byte device: activations 20 a layer
    (80 kept), 1 recomputed; ZeRO-0 (state 40) needs all four layers
    recomputed (14 s), ZeRO-1 (state 30) three (10.5 + 3 = 13.5 s): the
    search takes ZeRO-1, as with every knob compiled."""
    compiled = []
    found = search_two_stages(monkeypatch, {0: 40, 1: 30},
                              {"none": 20, "selective": 20, "full": 1}, compiled)
    seconds, chosen, guess = found
    assert (chosen.zero, chosen.recompute, chosen.recompute_layers) == (1, "full", 3)
    assert seconds == pytest.approx(13.5)
    assert guess["memory_bytes"] <= 60
    assert (1, "none") not in compiled and (0, "none") in compiled


def test_the_command_line_runs_as_users_run_it():
    """`python -m ernie.autoplan` in its own process, as a user runs it: its
    worker processes import the module afresh (a machine with more than one
    core used to die here with BrokenProcessPool), the table ends with a
    legend of its abbreviations, and a plan prints as one line."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run(
        [sys.executable, "-m", "ernie.autoplan", "--global-batch", "16", "--seq", "128",
         "--ranks", "4", "--top", "3", "--llama",
         "num_hidden_layers=4,hidden_size=256,intermediate_size=688,num_attention_heads=8,"
         "num_key_value_heads=4,vocab_size=1024"],
        capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr
    assert "BrokenProcessPool" not in result.stderr
    table = result.stdout
    assert table.splitlines()[0].split()[:2] == ["#", "plan"]
    legend = " ".join(table.split())  # wrapped at 100 columns
    assert "mMxB: M micro-batches of B sequences" in legend and "rc-full[:L]" in legend


def test_a_plan_prints_as_one_readable_line():
    plans = dist.auto_plan(model(), global_batch=BATCH, seq_len=SEQ, cluster=cluster(), top=1)
    text = repr(plans[0])
    assert "\n" not in text and text.startswith(f"Plan({plans[0].name}: ")
    assert "s per step" in text and "GiB per rank" in text and "estimate" not in text


# -- mixture of experts ------------------------------------------------------

MOE = dict(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
           num_attention_heads=4, num_key_value_heads=2, moe_num_experts=8, moe_k=2,
           moe_num_shared_experts=1, moe_intermediate_size=64, moe_layer_start_index=1)


def moe_model(**over):
    from ernie.models.ernie4_5 import Ernie4_5Config, Ernie4_5_MoeForCausalLM
    with ernie.nn.abstract():
        return Ernie4_5_MoeForCausalLM(Ernie4_5Config(**{**MOE, **over}))


def test_expert_layouts_are_every_divisor_and_the_dp_axis():
    assert autoplan._expert_layouts(0, 8) == [(1, False)]
    assert autoplan._expert_layouts(8, 1) == [(1, False)]
    assert autoplan._expert_layouts(8, 8) == [(1, False), (2, False), (4, False), (8, True)]
    # 6 experts on 4 data ranks: ep 2 on its own axis; 4 does not divide 6.
    assert autoplan._expert_layouts(6, 4) == [(1, False), (2, False)]


def test_a_moe_model_is_searched_over_its_expert_layouts():
    """ERNIE 4.5 MoE on 8 ranks: the search tries no ep, ep on an axis of
    its own and ep on the dp axis; every returned plan's memory is the
    abstract compile's of its mesh and config (exact), ep plans split the
    experts as named, and explain() says why the chosen layout wins."""
    m = moe_model()
    spec = cluster(n=8)
    plans = dist.auto_plan(m, global_batch=16, seq_len=128, cluster=spec, ranks=8, top=4,
                           workers=1)
    ranked = autoplan.auto_plan.last_search["ranked"]
    layouts = {(c.ep, c.ep_on_dp) for c, _ in ranked}
    assert {(1, False), (2, False), (4, False), (8, True)} <= layouts
    assert any(p.candidate.ep > 1 for p in plans)
    ids = np.zeros((16, 128), np.int64)
    for p in plans:
        c = p.candidate
        width = c.dp * (c.ep if c.ep > 1 and not c.ep_on_dp else 1)
        assert width * c.mp * c.pp == 8
        if c.ep > 1:
            assert p.config["ep_config"]["axis"] == ("dp" if c.ep_on_dp else "ep")
            assert ("ep" in p.mesh.dim_names) == (not c.ep_on_dp)
        prog = ernie.compile(autoplan._shallow((type(m), m.config), 4),
                             ernie.optimizer.AdamW(1e-4), [ids, ids], mesh=p.mesh,
                             config=p.config or None, abstract=True, cluster=spec)
        assert p.memory_bytes == prog.report()["peak_bytes_per_rank"]
        assert p.step_seconds == pytest.approx(prog.estimate()["step_seconds"], rel=1e-9)
    text = autoplan.explain(plans[0])
    assert "why " in text and "expert layout" in text
    assert len(plans[0].alternatives) == len(layouts) - 1


def test_a_shallow_moe_copy_is_moe_in_every_layer():
    m = moe_model()
    one = autoplan._shallow((type(m), m.config), 1)
    assert one.config.is_moe_layer(0) and one.config.num_hidden_layers == 1
    full = autoplan._shallow((type(m), m.config), 4)
    assert not full.config.is_moe_layer(0)  # the model's own first dense layer


def test_qwen3_moe_of_only_sparse_layers_gets_tensor_parallel_plans():
    """Its own parallelize_plan knows it has no dense MLP (the module-level
    plan for a dense layer matches nothing there and used to drop every
    mp > 1 candidate)."""
    from ernie.models.qwen3_moe import Qwen3MoeConfig, Qwen3MoeForCausalLM
    with ernie.nn.abstract():
        m = Qwen3MoeForCausalLM(Qwen3MoeConfig(
            vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, num_experts=4,
            num_experts_per_tok=2, moe_intermediate_size=64))
    plans = dist.auto_plan(m, global_batch=8, seq_len=64, cluster=cluster(), ranks=4, top=2,
                           choices={"mp": [2]}, workers=1)
    assert plans and all(p.candidate.mp == 2 for p in plans)


def _autoplan_cli(*args):
    import os
    import subprocess
    import sys
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run([sys.executable, "-m", "ernie.autoplan", *args], capture_output=True,
                          text=True, timeout=600, env=env)


def test_the_command_line_takes_any_familys_config_json(tmp_path):
    import json
    hf = {"model_type": "ernie4_5_moe", "architectures": ["Ernie4_5_MoeForCausalLM"],
          **MOE, "moe_intermediate_size": 64, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    result = _autoplan_cli("--hf-config", str(tmp_path), "--global-batch", "16", "--seq", "128",
                           "--ranks", "4", "--top", "3")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "epN@dp: over the dp / ZeRO axis itself" in result.stdout
    assert "why " in result.stdout


@pytest.mark.parametrize("args, message", [
    (["--model", "gpt5"], "--model 'gpt5' is not a family ernie has"),
    (["--set", "hiden_size=128"], "has no field 'hiden_size'"),
    (["--ranks", "64"], "64 ranks but the cluster has 8 devices"),
])
def test_the_command_line_names_a_bad_model(args, message):
    result = _autoplan_cli(*args, "--global-batch", "4", "--seq", "16")
    assert result.returncode == 2 and message in result.stderr, result.stderr


# -- uneven pipeline stages ----------------------------------------------------

def compiled_for_cluster(m, plan):
    """The plan's program as the search compiles it (for its cluster)."""
    ids = np.zeros((BATCH, SEQ), np.int64)
    return ernie.compile(autoplan._shallow((type(m), m.config), m.config.num_hidden_layers),
                         ernie.optimizer.AdamW(1e-4), [ids, ids], mesh=plan.mesh,
                         config=plan.config or None, abstract=True, cluster=cluster())


def test_uneven_stages_give_the_end_stages_fewer_layers():
    assert autoplan.uneven_stages(126, 16) == (7,) + (8,) * 14 + (7,)  # Llama 3 405B
    assert autoplan.uneven_stages(61, 16) == (3,) + (4,) * 13 + (3, 3)  # DeepSeek-V3
    assert autoplan.uneven_stages(54, 12) == (4, 4, 4) + (5,) * 6 + (4, 4, 4)
    with pytest.raises(ValueError):
        autoplan.uneven_stages(3, 4)


def test_a_layer_count_the_stages_do_not_divide_is_searched_with_uneven_stages():
    """5 layers on pp 2 and pp 4, and interleaved on pp 2 x vpp 2 (the
    search used to skip them all): the plans' memory is the full compile's
    of their layers_per_stage (exact), and the stage with more layers holds
    more parameters."""
    m = model(num_hidden_layers=5)
    plans = dist.auto_plan(m, global_batch=BATCH, seq_len=SEQ, cluster=cluster(), top=8,
                           choices={"pp": [2, 4]}, workers=1)
    # Interleaved too: 5 layers in 2 x 2 chunks are [1, 2, 1, 1].
    assert any(c.vpp == 2 and c.layers_per_stage == (1, 2, 1, 1)
               for c, _ in autoplan.auto_plan.last_search["ranked"])
    assert plans
    for p in plans:
        c = p.candidate
        assert sum(c.layers_per_stage) == 5 and len(c.layers_per_stage) == c.pp * c.vpp
        assert p.config["pp_config"]["layers_per_stage"] == list(c.layers_per_stage)
        assert "L" in p.name
        report = compiled_for_cluster(m, p).report()
        assert p.memory_bytes == report["peak_bytes_per_rank"]
    two = next((p for p in plans if p.candidate.pp == 2 and p.candidate.vpp == 1), None)
    if two is not None:
        assert two.candidate.layers_per_stage == (3, 2)
        report = compiled_for_cluster(m, two).report()
        params = [st["parameter_bytes"] for st in report["stages"]]
        # Stage 0: 3 layers and the embedding; stage 1: 2 layers, the head.
        assert params[0] > params[1] or two.candidate.mp > 1


def test_the_bounded_search_returns_what_the_exhaustive_one_does():
    """Branch and bound: a structure is left out only when its fastest
    knobs' time (a lower bound: memory knobs never speed a step up) cannot
    reach the 2 x top best nor its expert layout's best. So the top plans,
    their order and each layout's best equal the exhaustive search's,
    with fewer compiles. Memory is tight (0.4 GiB for a model of hidden
    512) so that structures need their knobs searched; a MoE model, for
    the layouts."""
    m = moe_model(hidden_size=512, intermediate_size=1024, moe_intermediate_size=512,
                  vocab_size=8192)
    spec = cluster(gib=0.4, n=8)
    kw = dict(global_batch=16, seq_len=128, cluster=spec, ranks=8, top=2, workers=1)
    full = dist.auto_plan(m, exhaustive=True, **kw)
    full_search = dict(autoplan.auto_plan.last_search)
    bounded = dist.auto_plan(m, **kw)
    search = autoplan.auto_plan.last_search
    assert [p.name for p in bounded] == [p.name for p in full]
    assert [p.step_seconds for p in bounded] == [p.step_seconds for p in full]
    assert search["compiles"] < full_search["compiles"]
    assert len(search["ranked"]) < len(full_search["ranked"])
    # Each layout's fastest, as explain() compares them.
    names = lambda plan: sorted((a[0], a[1]) for a in plan.alternatives)
    assert names(bounded[0]) == names(full[0])
    best = lambda ranked: {(c.ep, c.ep_on_dp): c.name for c, _ in reversed(ranked)}
    assert best(search["ranked"]) == best(full_search["ranked"])

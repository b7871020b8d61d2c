"""The gradient norm a training step returns, and finding a NaN (issue 41).

`AdamW(..., report_grad_norm=True)` makes @train_step return the gradients'
global L2 norm before clipping (`Program.grad_norm`). The reference is
numpy: the f64 norm of the gradients `Program.grad()` returns at the same
parameters. Under dp x mp with sequence parallelism and ZeRO-1, ZeRO-3, a
pipeline with a tied head on two stages (counted once) and MoE under ep,
each step's norm equals the one-rank program's (rtol 1e-5: f32 partial
sums added in another order, over three steps).

check_finite: "results" stops at a NaN loss or norm; "tensors" names the
first instruction whose result is not finite, and a session reopened after
a NaN replays to the same instruction (the run is deterministic).
"""

import math
import re

import numpy as np
import pytest

import ernie
import ernie.distributed as dist
from ernie.models.llama import LlamaConfig, LlamaForCausalLM
from ernie.models.qwen3_moe import Qwen3MoeConfig, Qwen3MoeForCausalLM

TINY = dict(vocab_size=48, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)
IDS = np.random.default_rng(3).integers(0, TINY["vocab_size"], size=(4, 8))


def llama(**kw):
    return LlamaForCausalLM(LlamaConfig(**TINY, seed=2, **kw))


def moe():
    return Qwen3MoeForCausalLM(Qwen3MoeConfig(**TINY, num_experts=4, num_experts_per_tok=2,
                                              moe_intermediate_size=16, seed=2))


def mesh_of(**axes):
    shape = list(axes.values())
    return dist.ProcessMesh(np.arange(int(np.prod(shape))).reshape(shape), list(axes))


def numpy_norm(model):
    _, grads = ernie.compile(model, None, [IDS, IDS]).grad(IDS, IDS)
    return math.sqrt(sum(float(np.sum(np.asarray(g, np.float64) ** 2)) for g in grads.values()))


def norms(model, steps=3, grad_clip=None, **kwargs):
    program = ernie.compile(model, ernie.optimizer.AdamW(1e-2, grad_clip=grad_clip,
                                                         report_grad_norm=True),
                            [IDS, IDS], **kwargs)
    out = []
    for _ in range(steps):
        program.step(IDS, IDS)
        out.append(program.grad_norm)
    return out


@pytest.mark.parametrize("tied", [False, True])
def test_the_norm_is_numpys_norm_of_the_gradients(tied):
    want = numpy_norm(llama(tie_word_embeddings=tied))
    assert norms(llama(tie_word_embeddings=tied), steps=1)[0] == pytest.approx(want, rel=1e-5)


def test_the_norm_is_the_one_before_clipping():
    want = numpy_norm(llama())
    got = norms(llama(), steps=1, grad_clip=want / 4)[0]
    assert got == pytest.approx(want, rel=1e-5)


def test_no_norm_unless_asked():
    program = ernie.compile(llama(), ernie.optimizer.AdamW(1e-2, grad_clip=1.0), [IDS, IDS])
    program.step(IDS, IDS)
    assert program.grad_norm is None and program.last_metrics == {}


def _plans():
    sp = llama().parallelize_plan(sequence_parallel=True)
    tied = llama(tie_word_embeddings=True)
    return {
        "dp2xmp2-sp-zero1": (llama, dict(mesh=mesh_of(dp=2, mp=2), config={
            "dp_config": {"sharding_level": 1}, "mp_config": {"parallelize_plan": sp}})),
        "zero3": (llama, dict(mesh=mesh_of(dp=2), config={"dp_config": {"sharding_level": 3}})),
        "pp2xmp2-tied": (lambda: llama(tie_word_embeddings=True), dict(
            mesh=mesh_of(pp=2, mp=2), config={
                "pp_config": {"split_spec": tied.split_spec, "accumulate_steps": 2},
                "mp_config": {"parallelize_plan": tied.parallelize_plan()}})),
        "moe-dp2xep2": (moe, dict(mesh=mesh_of(dp=2, ep=2), config={
            "dp_config": {}, "ep_config": {"axis": "ep"}})),
    }


@pytest.mark.parametrize("plan", list(_plans()))
def test_every_plan_reports_the_one_rank_norm(plan):
    build, kwargs = _plans()[plan]
    want = norms(build())
    got = norms(build(), **kwargs)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def _exploding():
    return ernie.optimizer.SGD(1e30, report_grad_norm=True)


def test_check_finite_results_stops_at_the_nan_loss():
    program = ernie.compile(llama(), _exploding(), [IDS, IDS], check_finite=True)
    program.step(IDS, IDS)
    with pytest.raises(RuntimeError, match=r"@train_step result \d+ \(the (loss|metric "
                                           r"'grad_norm')\) is not finite"):
        program.step(IDS, IDS)


def test_check_finite_tensors_names_the_first_instruction_and_a_replay_finds_it_again():
    program = ernie.compile(llama(), _exploding(), [IDS, IDS], check_finite="tensors")
    program.step(IDS, IDS)
    with pytest.raises(RuntimeError) as first:
        program.step(IDS, IDS)
    where = re.search(r"@train_step instruction #(\d+) '([\w.]+)'", str(first.value))
    assert where, str(first.value)
    assert "is the first tensor of the call that is not finite" in str(first.value)
    # The session stopped with the error; reopened, the run replays to the
    # same instruction.
    program.reopen(check_finite="results")
    assert program.step_count == 0
    program.step(IDS, IDS)
    program.set_check_finite("tensors")
    with pytest.raises(RuntimeError) as again:
        program.step(IDS, IDS)
    assert where.group(0) in str(again.value)
    with pytest.raises(ValueError, match="check_finite must be"):
        program.set_check_finite("always")

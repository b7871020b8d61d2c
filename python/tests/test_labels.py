"""Labels as Hugging Face users write them (issue 41, item 5).

ernie.models' causal LMs take `labels = input_ids` and shift them inside
the traced graph (position t against labels[t + 1], the last position
against nothing), `-100` ignored, the mean over the targets kept;
`pre_shifted_labels=True` takes labels the data already shifted (Paddle's,
Megatron's, the trainer's packed samples). Checked against a numpy
log-softmax cross-entropy of the model's own logits, and under dp x mp with
sequence parallelism and under pipeline stages against one rank.
"""

import json

import numpy as np
import pytest

import ernie
import ernie.distributed as dist
from ernie.models import AutoModelForCausalLM
from ernie.models.ernie4_5 import Ernie4_5Config, Ernie4_5ForCausalLM
from ernie.models.llama import LlamaConfig, LlamaForCausalLM, LlamaForCausalLMPipe
from ernie.models.qwen3_moe import Qwen3MoeConfig, Qwen3MoeForCausalLM
from ernie.train import Trainer, load

TINY = dict(vocab_size=48, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)
MODELS = {
    "llama": lambda **kw: LlamaForCausalLM(LlamaConfig(**TINY, seed=2, **kw)),
    "llama-tied": lambda **kw: LlamaForCausalLM(LlamaConfig(**TINY, tie_word_embeddings=True,
                                                            seed=2, **kw)),
    "qwen3_moe": lambda **kw: Qwen3MoeForCausalLM(Qwen3MoeConfig(
        **TINY, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, seed=2, **kw)),
    "ernie4_5": lambda **kw: Ernie4_5ForCausalLM(Ernie4_5Config(**TINY, seed=2, **kw)),
}


def numpy_loss(logits, targets):
    """Mean log-softmax cross-entropy over the targets that are not -100
    (targets[b, t] is position t's; computed here, not by ernie)."""
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    kept = targets != -100
    picked = np.take_along_axis(logp, np.where(kept, targets, 0)[..., None], -1)[..., 0]
    return -picked[kept].sum() / kept.sum()


def eval_loss(model, ids, labels):
    return ernie.compile(model, None, [ids, labels], differentiate=False).eval(ids, labels)


@pytest.mark.parametrize("family", sorted(MODELS))
def test_input_ids_as_labels_is_the_pre_shifted_loss(family):
    """labels = input_ids: the numpy loss of position t against ids[t + 1]
    (the last position has no target), and exactly the loss of the
    pre-shifted option on the same targets written out with -100 last."""
    ids = np.random.default_rng(3).integers(0, TINY["vocab_size"], size=(3, 9))
    shifted = np.concatenate([ids[:, 1:], np.full((3, 1), -100)], 1)  # no wrap-around
    model = MODELS[family](dtype="f64")
    logits = ernie.compile(model, None, [ids], differentiate=False).forward(ids)
    hf = eval_loss(model, ids, ids)
    assert hf == pytest.approx(numpy_loss(logits, shifted), rel=1e-12)
    pre = eval_loss(MODELS[family](dtype="f64", pre_shifted_labels=True), ids, shifted)
    assert hf == pre
    # Without the option pre-shifted labels are another (wrong) loss.
    assert abs(eval_loss(model, ids, shifted) - hf) > 1e-3


@pytest.mark.parametrize("family", ["llama", "ernie4_5"])
def test_minus_100_is_ignored(family):
    """-100 among Hugging Face's labels (a prompt masked out, padding): those
    targets take no part, the mean is over the rest."""
    rng = np.random.default_rng(4)
    ids = rng.integers(0, TINY["vocab_size"], size=(2, 8))
    labels = ids.copy()
    labels[0, :4] = -100  # position 0..2's targets masked, and labels[0, 0], never a target
    labels[1, 5] = -100
    model = MODELS[family](dtype="f64")
    logits = ernie.compile(model, None, [ids], differentiate=False).forward(ids)
    targets = np.concatenate([labels[:, 1:], np.full((2, 1), -100)], 1)
    assert (targets != -100).sum() == 2 * 7 - 3 - 1
    assert eval_loss(model, ids, labels) == pytest.approx(numpy_loss(logits, targets), rel=1e-12)
    # What labels[:, 0] holds does not matter: it is no position's target.
    other = labels.copy()
    other[1, 0] = (other[1, 0] + 1) % TINY["vocab_size"]
    assert eval_loss(model, ids, other) == eval_loss(model, ids, labels)


def mesh_of(**axes):
    shape = list(axes.values())
    return dist.ProcessMesh(np.arange(int(np.prod(shape))).reshape(shape), list(axes))


def train(model, ids, labels, mesh=None, config=None, steps=5):
    prog = ernie.compile(model, ernie.optimizer.AdamW(3e-3, weight_decay=0.01), [ids, labels],
                         mesh=mesh, config=config)
    return [prog.step(ids, labels) for _ in range(steps)]


def test_dp_mp_with_sequence_parallelism_matches_one_rank():
    """dp 2 x mp 2, sequence parallelism on (activations split along the
    sequence between layers), labels = input_ids with -100 in one dp half
    only: the losses of one rank (the mean is over the global kept targets)."""
    rng = np.random.default_rng(5)
    ids = rng.integers(0, TINY["vocab_size"], size=(4, 8))
    labels = ids.copy()
    labels[1, 2:5] = -100
    want = train(MODELS["llama"](), ids, labels)
    model = MODELS["llama"]()
    config = {"dp_config": {"sharding_level": 1},
              "mp_config": {"parallelize_plan": model.parallelize_plan(sequence_parallel=True)}}
    got = train(model, ids, labels, mesh_of(dp=2, mp=2), config)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert got[-1] < got[0]


@pytest.mark.parametrize("pipe", [False, True], ids=["split_spec", "LlamaForCausalLMPipe"])
def test_pipeline_matches_one_rank(pipe):
    """pp 2 (x mp 2), 2 micro-batches: the labels reach the last stage and are
    shifted there; the losses of one rank. (Micro-batch losses are averaged,
    so the rows here keep equal numbers of targets.)"""
    ids = np.random.default_rng(6).integers(0, TINY["vocab_size"], size=(4, 8))
    cfg = LlamaConfig(**TINY, tie_word_embeddings=True, seed=2)
    want = train(LlamaForCausalLM(cfg), ids, ids)
    if pipe:
        model = LlamaForCausalLMPipe(cfg, num_stages=2)
        config = {"pp_config": {"accumulate_steps": 2},
                  "mp_config": {"parallelize_plan": model.parallelize_plan()}}
    else:
        model = LlamaForCausalLM(cfg)
        config = {"pp_config": {"split_spec": model.split_spec, "accumulate_steps": 2},
                  "mp_config": {"parallelize_plan": model.parallelize_plan()}}
    got = train(model, ids, ids, mesh_of(pp=2, mp=2), config)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert got[-1] < got[0]


@pytest.mark.parametrize("family", ["llama", "ernie4_5"])
def test_the_option_is_not_in_config_json(tmp_path, family):
    """pre_shifted_labels says how labels are fed, not what the model is:
    save_pretrained leaves it out, a config.json naming it does not set it,
    from_pretrained takes it as an override."""
    model = MODELS[family](pre_shifted_labels=True)
    model.save_pretrained(tmp_path / "hf")
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert not any("label" in key for key in written)
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "hf").config.pre_shifted_labels is False
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", pre_shifted_labels=True)
    assert again.config.pre_shifted_labels is True
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**written,
                                                             "pre_shifted_labels": True}))
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "hf").config.pre_shifted_labels is False
    with pytest.raises(TypeError, match="pre_shifted_labels must be true or false"):
        MODELS[family](pre_shifted_labels="yes")


def test_the_trainer_builds_its_model_for_pre_shifted_labels(tmp_path):
    """ernie.train's packed samples come shifted (labels = tokens[:, 1:]): the
    model it builds, from a family or a Hugging Face folder, says so."""
    job = tmp_path / "job.toml"
    job.write_text('[model]\nfamily = "llama"\nconfig = { '
                   + ", ".join(f"{k} = {v}" for k, v in TINY.items()) + " }\n")
    assert Trainer(load(job))._model().config.pre_shifted_labels is True
    MODELS["llama"]().save_pretrained(tmp_path / "hf")
    job.write_text(f'[model]\npretrained = "{tmp_path / "hf"}"\n')
    assert Trainer(load(job))._model().config.pre_shifted_labels is True

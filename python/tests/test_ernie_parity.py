"""ERNIE 4.5 (dense and MoE) against `transformers` itself: a tiny random
model made and saved by transformers (hf_reference.py, in the reference
environment; skipped without it) loads in ernie with transformers' logits
(f32: <= 1e-5 relative) and loss. The MoE config as published has
`output_router_logits: false`: transformers then adds no auxiliary loss,
and neither may ernie (it did: 6.5e-4 relative off). With it true both add
router_aux_loss_coef times one load-balancing loss over every sparse
layer's routing together (`ernie.moe.load_balancing_loss`; the reference
script's "ernie4_5_moe-aux" family).
"""

import numpy as np
import pytest

import ernie
from ernie.models import AutoModelForCausalLM

from test_qwen import assert_transformers_numbers, hf_run, reference


@pytest.mark.parametrize("family", ["ernie4_5", "ernie4_5_moe", "ernie4_5_moe-aux"])
def test_a_transformers_folder_gives_transformers_numbers(tmp_path, family):
    reference("make", family, 11, tmp_path / "made")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "made")
    ids = np.random.default_rng(12).integers(0, model.config.vocab_size, size=(4, 8))
    assert_transformers_numbers(model, tmp_path / "made", ids, tmp_path, loss_rtol=1e-6)


def test_output_router_logits_decides_the_auxiliary_loss_and_round_trips(tmp_path):
    """Without transformers: the same MoE folder evaluates to the plain LM
    loss with output_router_logits false and adds router_aux_loss_coef x
    the balancing loss with it true; save_pretrained writes the field and
    the coefficient back as read."""
    import json
    from ernie.models.ernie4_5 import Ernie4_5Config, Ernie4_5_MoeForCausalLM
    cfg = Ernie4_5Config(vocab_size=64, hidden_size=32, intermediate_size=48,
                         num_hidden_layers=2, moe_num_experts=4, moe_k=2,
                         moe_intermediate_size=16, router_aux_loss_coef=0.5, seed=3)
    Ernie4_5_MoeForCausalLM(cfg).save_pretrained(tmp_path / "folder")
    config_path = tmp_path / "folder" / "config.json"
    ids = np.random.default_rng(0).integers(0, 64, size=(2, 8))
    losses = {}
    for flag in (False, True):
        hf = json.loads(config_path.read_text())
        hf["output_router_logits"] = flag
        config_path.write_text(json.dumps(hf))
        model = AutoModelForCausalLM.from_pretrained(tmp_path / "folder")
        assert model.config.output_router_logits is flag
        losses[flag] = ernie.compile(model, None, [ids, ids], differentiate=False).eval(ids, ids)
        model.save_pretrained(tmp_path / f"again-{flag}")
        again = json.loads((tmp_path / f"again-{flag}" / "config.json").read_text())
        assert (again["output_router_logits"], again["router_aux_loss_coef"]) == (flag, 0.5)
    assert losses[True] > losses[False]  # the balancing loss is positive


@pytest.mark.parametrize("family", ["ernie4_5_moe-aux"])
def test_the_auxiliary_loss_is_reported_apart_as_transformers_does(tmp_path, family):
    """With output_router_logits the loss is transformers' (LM loss plus
    router_aux_loss_coef x the balancing loss); the training program's
    eval reports the balancing loss as transformers' outputs.aux_loss and
    the LM loss apart (Program.eval_metrics)."""
    reference("make", family, 11, tmp_path / "made")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "made")
    ids = np.random.default_rng(12).integers(0, model.config.vocab_size, size=(4, 8))
    theirs = hf_run(tmp_path / "made", ids, tmp_path, "made")
    prog = ernie.compile(model, ernie.optimizer.AdamW(1e-3), [ids, ids])
    loss = prog.eval(ids, ids)
    assert loss == pytest.approx(float(theirs["loss"]), rel=1e-6)
    assert prog.eval_metrics["aux_loss"] == pytest.approx(float(theirs["aux_loss"]), rel=1e-5)
    assert prog.eval_metrics["lm_loss"] + model.config.router_aux_loss_coef * \
        prog.eval_metrics["aux_loss"] == pytest.approx(loss, rel=1e-6)

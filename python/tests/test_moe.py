"""The MoE layer (ernie.moe) against the independent numpy reference
(moe_reference.py): routing, capacity drops, combine weights and every
loss, forward and gradients, in f64.

The compiled layer's loss equals the reference's to 1e-12 relative (f64;
the sums run in another order), and its gradients equal central finite
differences of the reference to 1e-6 relative to each gradient's largest
entry (step 1e-6: truncation ~1e-12, rounding ~1e-10; routing does not
change under a step that small for these random draws).
"""

import numpy as np
import pytest

import ernie
from ernie import functional as F
from ernie.moe import MoEConfig, MoELayer, set_token_groups
from ernie.nn import Module, parameter

import moe_reference as ref

B, S, H, E, K, I = 2, 6, 8, 4, 2, 5


class Probe(Module):
    """One MoE layer on a trainable input x: loss = sum(out * r) + the
    layer's weighted losses, or (dropped=True) the dropped count."""

    def __init__(self, cfg, seed=3, dropped=False):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.x = parameter((B, S, H), "f64", lambda: rng.standard_normal((B, S, H)))
        self.mlp = MoELayer(H, cfg, dtype="f64", rng=rng, std=0.5)
        self.dropped = dropped

    def forward(self, r):
        out, losses = self.mlp(self.p("x"))
        loss = F.sum(out * r)
        if self.dropped:  # x still reaches the result, with weight 0
            return F.cast(self.mlp.last_dropped, "f64") + loss * 0.0
        return loss + losses if losses is not None else loss


def reference(model, state, r, cfg, groups):
    names = {"router": "gate", "gate": "experts.gate_proj", "up": "experts.up_proj",
             "down": "experts.down_proj", "shared_gate": "shared_experts.gate_proj",
             "shared_up": "shared_experts.up_proj", "shared_down": "shared_experts.down_proj"}
    params = {k: state.get(f"mlp.{v}.weight") for k, v in names.items()}
    o = ref.moe_layer(state["x"].reshape(-1, H), params, k=cfg.k, groups=groups,
                      capacity_factor=cfg.capacity_factor, norm_min=cfg.norm_min,
                      bias=model.mlp.e_score_correction_bias)
    loss = (np.sum(o["out"] * r.reshape(-1, H)) + cfg.aux_loss_coef * o["aux"]
            + cfg.orthogonal_loss_coef * o["orth"] + cfg.z_loss_coef * o["z"])
    return float(loss), o


CASES = {
    "dropless": dict(capacity_factor=None, num_shared_experts=0, groups=1),
    "drops-two-groups": dict(capacity_factor=1.0, num_shared_experts=1, groups=2),
    "drops-four-groups-biased": dict(capacity_factor=1.5, num_shared_experts=2, groups=4,
                                     bias=[0.0, 0.05, -0.02, 0.01]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_moe_layer_matches_reference(case):
    spec = dict(CASES[case])
    groups, bias = spec.pop("groups"), spec.pop("bias", None)
    cfg = MoEConfig(num_experts=E, k=K, intermediate_size=I, aux_loss_coef=0.3,
                    orthogonal_loss_coef=0.2, z_loss_coef=0.1, **spec)
    model = Probe(cfg)
    set_token_groups(model, groups)
    if bias is not None:
        model.mlp.e_score_correction_bias = np.array(bias)
    r = np.random.default_rng(5).standard_normal((B, S, H))
    loss, grads = ernie.compile(model, None, [r]).grad(r)
    state = {n: p.value for n, p in model.named_parameters()}
    want, o = reference(model, state, r, cfg, groups)
    assert loss == pytest.approx(want, rel=1e-12)
    if cfg.capacity_factor is not None:
        assert o["dropped"] > 0, "the case is meant to drop tokens"

    # The dropped count, as the program computes it.
    probe = Probe(cfg, dropped=True)
    set_token_groups(probe, groups)
    probe.mlp.e_score_correction_bias = model.mlp.e_score_correction_bias
    assert ernie.compile(probe, None, [r]).grad(r)[0] == o["dropped"]

    for name, g in grads.items():
        fd = np.zeros_like(state[name])
        for idx in np.ndindex(fd.shape):
            moved = {k: v.copy() for k, v in state.items()}
            moved[name][idx] += 1e-6
            up = reference(model, moved, r, cfg, groups)[0]
            moved[name][idx] -= 2e-6
            fd[idx] = (up - reference(model, moved, r, cfg, groups)[0]) / 2e-6
        np.testing.assert_allclose(g, fd, rtol=0, atol=1e-6 * np.max(np.abs(fd)),
                                   err_msg=name)


def test_capacity_that_drops_everything_names_the_layer():
    cfg = MoEConfig(num_experts=E, k=1, intermediate_size=I, capacity_factor=0.1)
    model = Probe(cfg)
    r = np.zeros((B, S, H))
    with pytest.raises(ValueError, match="MoE layer: capacity_factor 0.1 .* capacity of 0"):
        ernie.compile(model, None, [r])


def test_topk_above_the_expert_count_is_refused():
    with pytest.raises(ValueError, match=r"moe_k = 5 must be in \[1, moe_num_experts = 4\]"):
        MoEConfig(num_experts=4, k=5, intermediate_size=8)


def test_aux_free_balancing_moves_the_bias_as_the_reference():
    """With aux_free_rate the selection bias is training state: after each
    step bias += rate * sign(mean(usage) - usage), usage the step's choices
    per expert. A zero learning rate keeps the weights, so only the bias
    changes the routing from step to step; the reference replays it."""
    rate = 0.01
    cfg = MoEConfig(num_experts=E, k=K, intermediate_size=I, capacity_factor=1.0,
                    aux_free_rate=rate)
    model = Probe(cfg)
    set_token_groups(model, 2)
    r = np.random.default_rng(5).standard_normal((B, S, H))
    prog = ernie.compile(model, ernie.optimizer.SGD(0.0), [r])
    name = "mlp.gate.weight:e_score_correction_bias"
    state = {n: p.value for n, p in model.named_parameters()}
    params = {"router": state["mlp.gate.weight"], "gate": state["mlp.experts.gate_proj.weight"],
              "up": state["mlp.experts.up_proj.weight"],
              "down": state["mlp.experts.down_proj.weight"]}
    bias, usages = np.zeros(E), set()
    for _ in range(4):
        prog.step(r)
        o = ref.moe_layer(state["x"].reshape(-1, H), params, k=K, groups=2,
                          capacity_factor=1.0, norm_min=cfg.norm_min, bias=bias)
        usage = np.bincount(o["experts"].reshape(-1), minlength=E)
        usages.add(tuple(usage))
        bias = ref.aux_free_bias_update(bias, usage, rate)
        np.testing.assert_array_equal(prog.state_dict()[name], bias)
    assert len(usages) > 1, "the bias is meant to change the routing"
    # Evaluating and the forward alone leave the bias as it is.
    prog.eval(r)
    np.testing.assert_array_equal(prog.state_dict()[name], bias)

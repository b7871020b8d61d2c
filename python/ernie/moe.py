"""Mixture of experts: ERNIE 4.5's top-k routed layer.

A token's router logits are an f32 `Linear(hidden, E, bias=False)`; the
softmax over experts plus a selection-only bias (`e_score_correction_bias`,
Paddle's aux-free balancing) chooses k experts; the chosen probabilities,
renormalised (the sum clamped below at `norm_min`), weight the experts'
SwiGLU outputs. Shared experts (one SwiGLU of width `intermediate *
num_shared_experts`) see every token.

Tokens are routed in groups (`ernie.moe_route`): `[groups, tokens, ...]`,
each group with `capacity = int(capacity_factor * tokens_per_group * k /
E)` slots per expert (dropless when `capacity_factor` is None: a slot for
every token). A group is by default one data-parallel rank's tokens, the
capacity Paddle computes per rank; `set_token_groups` fixes the count so
that one program and another (a single rank and a plan) drop the same
tokens. Expert weights are stacked, `[E, in, out]`, so that an `ep`
placement splits dimension 0 and the buffers' move from groups to experts
is the all-to-all of expert parallelism. The experts' GEMMs
(`ernie.expert_matmul`, a grouped GEMM) compute only the slots routing
filled: a dropless layer's buffers hold E / k times the rows it routes,
and only those rows cost FLOPs.

Losses, each with its coefficient in `MoEConfig` (0 leaves it out): the
load-balancing loss `E * sum_e mean_t(p_te) * count_e / T` (counts of the
choices made, not differentiated), the orthogonal loss on the router's
normalised expert vectors `||Wn^T Wn - I||_F^2 / E^2`, and the router
z-loss `mean_t logsumexp(logits_t)^2`. `MoELayer.forward` returns the
output and the weighted sum of its losses; the model adds them to its loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import functional as F
from .nn import Module, parameter
from .tensor import ERNIE_TO_NUMPY

_NUMPY = {"f32": np.float32, "f64": np.float64}
# As strong as the plan's placements (0, the strongest level): at
# sequence parallelism's weaker 1, propagation reached the buffers first
# from the expert-split weights and gathered the tokens of the whole step
# (docs/architecture.md, departure r).
_EP_PRIORITY = 0


@dataclass
class MoEConfig:
    num_experts: int
    k: int
    intermediate_size: int
    num_shared_experts: int = 0
    capacity_factor: float | None = None  # None: dropless
    norm_min: float = 1e-12
    aux_loss_coef: float = 0.0
    orthogonal_loss_coef: float = 0.0
    z_loss_coef: float = 0.0
    # Aux-loss-free balancing: after each step the selection bias moves by
    # rate * sign(mean usage - usage) (0: the bias is a constant).
    aux_free_rate: float = 0.0
    # Renormalise the k chosen probabilities to sum to 1 (Hugging Face's
    # norm_topk_prob; False: the softmax's own values weight the experts).
    norm_topk_prob: bool = True
    # DeepSeek-V3's router: "sigmoid" scores instead of a softmax; the
    # experts in `num_groups` groups of which each token keeps the
    # `topk_groups` whose two best scores (bias included) sum highest, and
    # chooses its k among theirs; the weights times `scaling_factor`.
    scoring: str = "softmax"
    num_groups: int = 1
    topk_groups: int = 1
    scaling_factor: float = 1.0

    def __post_init__(self):
        for name in ("capacity_factor", "norm_min", "aux_loss_coef", "orthogonal_loss_coef",
                     "z_loss_coef", "aux_free_rate"):
            value = getattr(self, name)
            if value is None and name == "capacity_factor":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"MoEConfig.{name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"MoEConfig.{name} must be finite and >= 0, got {value!r}")
        if self.k < 1 or self.k > self.num_experts:
            raise ValueError(f"moe_k = {self.k} must be in [1, moe_num_experts = "
                             f"{self.num_experts}]")
        if self.capacity_factor is not None and self.capacity_factor <= 0:
            raise ValueError(f"capacity_factor must be positive, got {self.capacity_factor}")
        if self.scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"MoEConfig.scoring is softmax or sigmoid, not {self.scoring!r}")
        if (self.num_groups < 1 or self.num_experts % self.num_groups
                or not 1 <= self.topk_groups <= self.num_groups
                or (self.num_groups > 1 and self.num_experts // self.num_groups < 2)):
            raise ValueError(f"{self.num_experts} experts do not form {self.num_groups} groups "
                             f"of at least 2 with {self.topk_groups} kept (n_group, topk_group)")
        if not math.isfinite(self.scaling_factor) or self.scaling_factor <= 0:
            raise ValueError(f"MoEConfig.scaling_factor must be positive, got "
                             f"{self.scaling_factor!r}")


def capacity(cfg: MoEConfig, tokens_per_group: int, where: str = "MoE layer") -> int:
    """Slots per expert and group."""
    if cfg.capacity_factor is None:
        return tokens_per_group
    c = int(cfg.capacity_factor * tokens_per_group * cfg.k / cfg.num_experts)
    if c < 1:
        raise ValueError(f"{where}: capacity_factor {cfg.capacity_factor} x {tokens_per_group} "
                         f"tokens x k = {cfg.k} / {cfg.num_experts} experts gives a capacity of "
                         f"0: every token would be dropped")
    return min(c, tokens_per_group)


def _normal(rng, shape, std, dtype):
    return lambda: rng.normal(0, std, size=shape).astype(ERNIE_TO_NUMPY.get(dtype, "float32"))


class _Stack(Module):
    """`gate_proj`, `up_proj`, `down_proj` of E experts, stacked: weights
    [E, in, out]."""

    def __init__(self, experts, hidden, inter, dtype, rng, std):
        super().__init__()
        self.gate_proj = _Weight((experts, hidden, inter), dtype, rng, std)
        self.up_proj = _Weight((experts, hidden, inter), dtype, rng, std)
        self.down_proj = _Weight((experts, inter, hidden), dtype, rng, std)


class _Weight(Module):
    def __init__(self, shape, dtype, rng, std):
        super().__init__()
        self.weight = parameter(shape, dtype, _normal(rng, shape, std, dtype))


class SwiGLU(Module):
    """down(silu(x @ gate) * (x @ up)), weights [in, out]."""

    def __init__(self, hidden, inter, dtype, rng, std):
        super().__init__()
        self.gate_proj = _Weight((hidden, inter), dtype, rng, std)
        self.up_proj = _Weight((hidden, inter), dtype, rng, std)
        self.down_proj = _Weight((inter, hidden), dtype, rng, std)

    def forward(self, x):
        gate = F.matmul(x, self.gate_proj.p("weight"))
        up = F.matmul(x, self.up_proj.p("weight"))
        return F.matmul(F.silu(gate) * up, self.down_proj.p("weight"))


class MoELayer(Module):
    """ERNIE 4.5's MoE MLP. Parameters (Hugging Face's names where they
    exist): `gate.weight` [hidden, E] (f32, the router),
    `experts.{gate,up,down}_proj.weight` [E, in, out] (Hugging Face keeps
    one tensor per expert, `experts.<e>.gate_proj.weight` [out, in]),
    `shared_experts.{gate,up,down}_proj.weight`. The selection bias
    `moe_statics.e_score_correction_bias` is not trained: it is
    `self.e_score_correction_bias` (numpy [E]) and enters the program as a
    constant."""

    def __init__(self, hidden, cfg: MoEConfig, dtype="f32", rng=None, std=0.02, name="MoE layer"):
        super().__init__()
        rng = rng or np.random.default_rng(0)
        self.cfg, self.dtype, self.where = cfg, dtype, name
        e, inter = cfg.num_experts, cfg.intermediate_size
        # The router computes in f32 (f64 in an f64 model) whatever the
        # model's dtype, as ERNIE's and Hugging Face's do.
        self.router_dtype = "f64" if dtype == "f64" else "f32"
        self.gate = _Weight((hidden, e), self.router_dtype, rng, std)
        self.experts = _Stack(e, hidden, inter, dtype, rng, std)
        if cfg.num_shared_experts:
            self.shared_experts = SwiGLU(hidden, inter * cfg.num_shared_experts, dtype, rng, std)
        self.e_score_correction_bias = np.zeros(e, np.float32)
        self.token_groups = 1
        # Set by ep_config: the mesh axes the experts split over, and the
        # other axes that split the tokens (the buffers' groups). Under
        # tensor parallelism the tokens reach the layer whole on every mp
        # rank: `route_axes` (the mp axis) splits them for routing and
        # dispatch, so each mp rank sends only its share (Megatron's token
        # split), gathered back over mp for experts that mp splits
        # (`experts_split_over_route_axes`) and after the combine.
        self.expert_axes, self.group_axes = [], []
        self.route_axes, self.experts_split_over_route_axes = [], False
        self.token_shards = 1  # the ranks of the token axes (route axes aside)
        # The last trace's count of dropped choices (a traced i64 scalar);
        # a training program also keeps each step's in its state.
        self.last_dropped = None
        self.last_probs = self.last_usage = None

    def forward(self, x):
        """x [..., hidden] -> (output like x, weighted losses: an f32 scalar
        or None)."""
        cfg, shape = self.cfg, x.shape
        hidden, tokens = shape[-1], int(np.prod(shape[:-1]))
        g = self.token_groups
        if tokens % g:
            raise ValueError(f"{self.where}: {tokens} tokens do not split into {g} groups")
        tg, e, k = tokens // g, cfg.num_experts, cfg.k
        c = capacity(cfg, tg, self.where)
        whole = x.reshape(g, tg, hidden)
        h = self._for_routing(whole)

        rd = self.router_dtype
        logits = F.matmul(h.astype(rd) if h.dtype != rd else h, self.gate.p("weight"))
        probs = F.softmax(logits, -1) if cfg.scoring == "softmax" else F.sigmoid(logits)
        initial = np.asarray(self.e_score_correction_bias, _NUMPY[rd]).reshape(e)
        # The bias is state even where it does not move: checkpoints hold it
        # (ernie-ckpt export-hf writes it) and a program loading one reads it.
        balancing = cfg.aux_free_rate and h.trace.updates_state
        bias = h.trace.state(self.bias_name(), initial)
        scores = F.stop_gradient(probs) + F.broadcast_to(bias, probs.shape)
        if cfg.num_groups > 1:
            scores = self._best_groups(scores, g, tg)
        _, experts = F.topk(scores, k)  # [g, tg, k]
        chosen = F.compare(F.broadcast_to(experts.reshape(g, tg, k, 1), [g, tg, k, e]),
                           F.iota([g, tg, k, e], 3), "eq")  # one-hot of each choice
        zeros = F.full([g, tg, k, e], 0.0, rd)
        weights = F.sum(F.where(chosen, F.broadcast_to(probs.reshape(g, tg, 1, e),
                                                       [g, tg, k, e]), zeros), axis=3)
        if cfg.norm_topk_prob:
            norm = F.maximum(F.sum(weights, axis=2, keepdim=True), cfg.norm_min)
            weights = weights / norm
        if cfg.scaling_factor != 1.0:
            weights = weights * cfg.scaling_factor

        # Choices per group and expert [g, E] (the experts' filled rows
        # below), and per expert.
        chosen_per_group = _count(chosen, axis=(1, 2), dtype=rd)
        usage = F.sum(chosen_per_group, axis=0)
        # The trace's router probabilities [groups, tokens, E] and choices
        # per expert [E], for a loss a model forms over several layers
        # (Hugging Face's load-balancing loss of Qwen3-MoE and Mixtral).
        self.last_probs, self.last_usage = probs, usage
        if balancing:
            self._update_bias(h.trace, bias, usage)
        slots = F.moe_route(experts, e, c)
        self.last_dropped = _count(F.compare(slots, -1, "eq"), dtype="i64")
        if cfg.capacity_factor is not None and h.trace.updates_state:
            # The step's dropped choices, observable as state
            # (`<layer>.mlp.gate.weight:dropped`, in state_dict(); in a
            # pipelined program the micro-batches' sum).
            name = self.bias_name().rsplit(":", 1)[0] + ":dropped"
            h.trace.state(name, np.zeros((), np.float32))
            h.trace.update_state(name, F.cast(self.last_dropped, "f32"))
        ones = F.full([g, tg, k], 1.0, h.dtype)
        buf = self._to_experts(F.moe_dispatch(h, experts, slots, ones, e, c))
        # Each expert's slots of a group fill from 0 (moe_route): its GEMMs
        # compute the first min(choices, capacity) rows and nothing of the
        # empty slots (a dropless layer has E / k times the rows it uses).
        rows = F.cast(F.transpose(F.minimum(chosen_per_group, float(c)), (1, 0)), "i64")
        rows = self._to_experts(rows)
        fill = min(1.0, tg * k / (e * c))
        w = self.experts
        gate = F.expert_matmul(buf, w.gate_proj.p("weight"), rows, fill=fill)
        up = F.expert_matmul(buf, w.up_proj.p("weight"), rows, fill=fill)
        y = F.expert_matmul(F.silu(gate) * up, w.down_proj.p("weight"), rows, fill=fill)
        y = self._to_tokens(y)
        out = F.moe_combine(y, experts, slots,
                            weights.astype(h.dtype) if h.dtype != rd else weights)
        if cfg.num_shared_experts:
            out = out + self.shared_experts(whole)
        return out.reshape(*shape), self._losses(logits, probs, usage, tokens * 1.0)

    def _best_groups(self, scores, g, tg):
        """`scores` [g, tg, E] with every expert outside the token's
        `topk_groups` best groups at -inf: a group's score is the sum of
        its two best experts' (DeepSeek-V3's group-limited routing)."""
        cfg = self.cfg
        n, size = cfg.num_groups, cfg.num_experts // cfg.num_groups
        grouped = scores.reshape(g, tg, n, size)
        best, _ = F.topk(grouped, 2)  # [g, tg, n, 2]
        _, kept = F.topk(F.sum(best, axis=3), cfg.topk_groups)  # [g, tg, topk_groups]
        picked = F.compare(F.broadcast_to(kept.reshape(g, tg, cfg.topk_groups, 1),
                                          [g, tg, cfg.topk_groups, n]),
                           F.iota([g, tg, cfg.topk_groups, n], 3), "eq")
        keep = _count(picked, axis=(2,), dtype=scores.dtype)  # [g, tg, n]: 1 kept, 0 not
        keep = F.broadcast_to(keep.reshape(g, tg, n, 1), [g, tg, n, size]).reshape(
            g, tg, n * size)
        return F.where(F.compare(keep, 0.0, "gt"), scores,
                       F.full([g, tg, n * size], -np.inf, scores.dtype))

    def bias_name(self) -> str:
        """The selection bias's state name, a slot of the router's weight:
        `<layer>.mlp.gate.weight:e_score_correction_bias` (Hugging Face's
        `<layer>.mlp.moe_statics.e_score_correction_bias`)."""
        return (self.gate._parameters["weight"].name or "gate.weight") + \
            ":e_score_correction_bias"

    def _update_bias(self, trace, bias, usage):
        """bias += rate * sign(mean(usage) - usage), usage the step's count
        of choices per expert — over the whole global batch, so over every
        rank that routes to the same experts."""
        below = F.mean(usage) - usage  # positive for an under-used expert
        step = F.where(F.compare(below, 0.0, "gt"), F.full(below.shape, 1.0, bias.dtype),
                       F.where(F.compare(below, 0.0, "lt"), F.full(below.shape, -1.0, bias.dtype),
                               F.full(below.shape, 0.0, bias.dtype)))
        trace.update_state(self.bias_name(), bias + step * self.cfg.aux_free_rate)

    # Expert parallelism: the buffers [E, groups, capacity, hidden] leave
    # dispatch split by groups over every token axis, as the tokens are, and
    # the experts compute on them split by experts (and by groups over the
    # token axes that are not expert axes). Pinning both sides makes the
    # reshard between them the all-to-all, and keeps propagation from
    # gathering the tokens instead.

    #
    # Under mp the groups split over the token axes and, within each token
    # shard, over mp (`route_axes`): the buffers are viewed as [E, shards,
    # groups per shard, capacity, hidden], so the all-to-all moves the token
    # axes between the first two dimensions and leaves each mp rank's share
    # where it is (the bytes fall by mp); experts that mp splits gather the
    # shares after it (Megatron's expert tensor parallelism), others keep
    # them split.

    def _batch_axes(self):
        return self.group_axes + [a for a in self.expert_axes if a not in self.group_axes]

    def _for_routing(self, h):
        """The tokens [groups, tokens, hidden] split by groups over every
        axis that routes them (the tensor-parallel one too)."""
        if not self.route_axes:
            return h
        return F.sharding_constraint(h, ("mesh", [self._batch_axes() + self.route_axes, [], []],
                                         []), _EP_PRIORITY)

    def _to_experts(self, buffers):
        """Dispatch's buffers [E, groups, capacity, hidden], from split by
        groups to split by experts."""
        return self._reshard(buffers, to_experts=True)

    def _to_tokens(self, buffers):
        """The experts' results [E, groups, capacity, hidden] back to split
        by groups, for the combine."""
        return self._reshard(buffers, to_experts=False)

    def _reshard(self, buffers, to_experts):
        """`buffers` [E, groups, ...] (the expert buffers, or their filled
        rows [E, groups]) pinned by tokens then by experts (or the reverse):
        the all-to-all between the two layouts comes out of partition. Under
        mp they are viewed as [E, token shards, groups per shard, ...]."""
        if not self.expert_axes:
            return buffers
        e, g, *rest = buffers.shape
        trailing = [[] for _ in rest]
        if self.route_axes:
            keep = [] if self.experts_split_over_route_axes else self.route_axes
            view = buffers.reshape(e, self.token_shards, g // self.token_shards, *rest)
            by_tokens = [[], self._batch_axes(), self.route_axes, *trailing]
            by_experts = [self.expert_axes, self.group_axes, keep, *trailing]
        else:
            view = buffers
            by_tokens = [[], self._batch_axes(), *trailing]
            by_experts = [self.expert_axes, self.group_axes, *trailing]
        first, then = (by_tokens, by_experts) if to_experts else (by_experts, by_tokens)
        out = self._pin(self._pin(view, first), then)
        return out.reshape(e, g, *rest) if self.route_axes else out

    @staticmethod
    def _pin(buffers, dims):
        return F.sharding_constraint(buffers, ("mesh", [list(d) for d in dims], []),
                                     _EP_PRIORITY)

    def _losses(self, logits, probs, usage, tokens):
        cfg, e, rd = self.cfg, self.cfg.num_experts, self.router_dtype
        terms = []
        if cfg.aux_loss_coef:
            mean_p = F.mean(probs, axis=(0, 1))
            terms.append(F.sum(mean_p * usage) * (cfg.aux_loss_coef * e / tokens))
        if cfg.orthogonal_loss_coef:
            w = self.gate.p("weight")  # [hidden, E]: one column per expert
            norms = F.maximum(F.sqrt(F.sum(w * w, axis=0, keepdim=True)), 1e-12)
            wn = w / norms
            d = F.matmul(wn, wn, transpose_a=True) - F.constant(np.eye(e, dtype=_NUMPY[rd]))
            terms.append(F.sum(d * d) * (cfg.orthogonal_loss_coef / (e * e)))
        if cfg.z_loss_coef:
            top = F.stop_gradient(F.max(logits, axis=-1, keepdim=True))
            lse = F.log(F.sum(F.exp(logits - top), axis=-1)) + top.reshape(*top.shape[:-1])
            terms.append(F.mean(lse * lse) * cfg.z_loss_coef)
        if not terms:
            return None
        total = terms[0]
        for t in terms[1:]:
            total = total + t
        return total


def _count(mask, axis=None, dtype="f32"):
    """How many entries of the i1 `mask` are set (along `axis`), as `dtype`."""
    ones, zeros = (F.full(mask.shape, v, dtype) for v in (1, 0))
    return F.sum(F.where(mask, ones, zeros), axis=axis)


def load_balancing_loss(layers, num_experts: int, k: int):
    """Hugging Face's load_balancing_loss_func (Mixtral, Qwen3-MoE, ERNIE
    4.5 MoE) over `layers`, the MoE layers of the trace just made, all at
    once: E * sum_e (U_e / R) * (P_e / R), with P_e the router
    probabilities summed over every layer's tokens, U_e the top-k choices
    of those probabilities (no selection bias: transformers recomputes
    them) and R the rows (tokens times layers). None without a layer."""
    layers = list(layers)
    if not layers:
        return None
    if any(m.last_probs is None for m in layers):
        raise RuntimeError("load_balancing_loss: a MoE layer has not been traced")
    probs = usage = None
    rows = 0
    for m in layers:
        p = m.last_probs  # [groups, tokens, E]
        _, chosen = F.topk(F.stop_gradient(p), k)
        g, t = p.shape[0], p.shape[1]
        onehot = F.compare(F.broadcast_to(chosen.reshape(g, t, k, 1), [g, t, k, num_experts]),
                           F.iota([g, t, k, num_experts], 3), "eq")
        layer_usage = _count(onehot, axis=(0, 1, 2), dtype=p.dtype)
        layer_probs = F.sum(p, axis=(0, 1))
        probs = layer_probs if probs is None else probs + layer_probs
        usage = layer_usage if usage is None else usage + layer_usage
        rows += g * t
    return F.sum(probs * usage) * (num_experts / float(rows) ** 2)


def moe_layers(model: Module):
    """Every MoELayer of `model`, with its qualified name."""
    return [(name, m) for name, m in model.named_sublayers() if isinstance(m, MoELayer)]


def set_token_groups(model: Module, groups: int):
    """Routes every MoE layer's tokens in `groups` groups (each with its own
    capacity): a plan whose data-parallel ranks hold `groups` shards of the
    batch drops what a single rank with the same groups drops. A pipelined
    program is traced on one micro-batch, so there each micro-batch is
    routed in `groups` groups: with m micro-batches, a single rank's G
    groups over the batch are G / m groups per micro-batch."""
    if int(groups) < 1:
        raise ValueError(f"token groups must be positive, got {groups}")
    for _, layer in moe_layers(model):
        layer.token_groups = int(groups)

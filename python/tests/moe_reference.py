"""An independent float64 numpy reference of one ERNIE-4.5-style MoE layer.

This is a test oracle for the compiler's MoE lowering, written from the spec
below and not from the compiler's code (it imports nothing from ``ernie``).
Everything is computed in float64.

Spec (what the compiler implements)
-----------------------------------
* Input ``h`` is ``[T, H]``: tokens, batch-major.  ``groups`` = G divides T and
  Tg = T // G; group g is the tokens ``[g*Tg, (g+1)*Tg)``.
* Router weight ``Wg`` is ``[H, E]`` (ernie's ``[in, out]`` layout; Hugging
  Face stores ``mlp.gate.weight`` as ``[E, H]``, i.e. ``Wg.T``).
  ``logits = h @ Wg``; ``probs = softmax(logits, -1)``.
* Selection: top-k of ``probs + bias`` per token (``bias`` is ``[E]``,
  Hugging Face's ``moe_statics.e_score_correction_bias`` squeezed from
  ``[1, E]``), choices sorted by descending score, ties broken by the lower
  expert index.  Combine weights are the *unbiased* probabilities:
  ``w[t, j] = probs[t, e_tj]``, then ``w /= max(sum_j w[t, j], norm_min)``.
* Capacity per group: ``C = int(capacity_factor * Tg * k / E)`` when
  ``capacity_factor`` is not None, else ``C = Tg`` (dropless).  ``C == 0`` is an
  error (ValueError).
* Slots, per group: for j = 0..k-1 (choice rank first), then tokens in order
  within the group, ``slot`` = number of earlier assignments (in that order) to
  the same expert in the same group; kept if ``slot < C``, else dropped
  (``slot = -1``).  Dropped choices are not renormalised away.
* Experts are SwiGLU: ``f_e(x) = (silu(x @ gate[e]) * (x @ up[e])) @ down[e]``
  with ``gate[e], up[e]: [H, I]`` and ``down[e]: [I, H]``.
* ``out[t] = sum_{kept j} w[t, j] * f_{e_tj}(h[t]) + shared(h[t])`` where
  ``shared`` is one SwiGLU MLP (``shared_gate [H, Is]``, ``shared_up [H, Is]``,
  ``shared_down [Is, H]``) or absent.
* Losses, returned separately:
  - ``aux = E * sum_e mean_t(probs[t, e]) * (count_e / T)``, ``count_e`` = number
    of (t, j) with ``e_tj == e`` over all T tokens, before capacity drops;
  - ``orth = || Wn^T Wn - I ||_F^2 / E^2``, ``Wn`` = ``Wg`` with each column (one
    expert's router vector) L2-normalised;
  - ``z = mean_t (logsumexp_e logits[t, e])^2``.

Where Hugging Face / Paddle differ from this spec, see
``docs/ernie4_5_notes.md`` (notably: HF is dropless and ungrouped, and the
reference aux loss counts top-k of the *unbiased* probabilities).
"""

import numpy as np

__all__ = [
    "softmax",
    "logsumexp",
    "silu",
    "swiglu",
    "topk_lower_index_ties",
    "capacity",
    "assign_slots",
    "moe_layer",
    "aux_loss",
    "orthogonal_loss",
    "z_loss",
    "aux_free_bias_update",
    "is_moe_layer",
    "moe_layer_indices",
]


# --------------------------------------------------------------------------
# Elementwise helpers.
# --------------------------------------------------------------------------


def softmax(x, axis=-1):
    """Numerically stable softmax in float64."""
    x = np.asarray(x, dtype=np.float64)
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def logsumexp(x, axis=-1):
    """Numerically stable log(sum(exp(x))) along ``axis`` (reduced away)."""
    x = np.asarray(x, dtype=np.float64)
    m = np.max(x, axis=axis, keepdims=True)
    return np.squeeze(m, axis=axis) + np.log(np.sum(np.exp(x - m), axis=axis))


def silu(x):
    """x * sigmoid(x), written to avoid overflow for large negative x."""
    x = np.asarray(x, dtype=np.float64)
    return x * (0.5 * (1.0 + np.tanh(0.5 * x)))


def swiglu(x, gate, up, down):
    """SwiGLU MLP: ``(silu(x @ gate) * (x @ up)) @ down``.

    x: [N, H]; gate, up: [H, I]; down: [I, H]. Returns [N, H].
    """
    x = np.asarray(x, dtype=np.float64)
    return (silu(x @ gate) * (x @ up)) @ down


# --------------------------------------------------------------------------
# Routing.
# --------------------------------------------------------------------------


def topk_lower_index_ties(scores, k):
    """Indices of the k largest entries of each row, in descending score order.

    Equal scores are ordered by the lower index first (a stable sort of the
    negated scores). scores: [T, E] -> int64 [T, k].
    """
    scores = np.asarray(scores, dtype=np.float64)
    if not 1 <= k <= scores.shape[-1]:
        raise ValueError(f"k={k} must be in [1, E={scores.shape[-1]}]")
    order = np.argsort(-scores, axis=-1, kind="stable")
    return order[:, :k].astype(np.int64)


def capacity(tokens_per_group, k, num_experts, capacity_factor):
    """Per-group expert capacity.

    ``int(capacity_factor * Tg * k / E)`` (evaluated left to right, in Python
    floats), or ``Tg`` when ``capacity_factor`` is None (dropless: an expert can
    get at most one choice per token, so at most Tg per group). Raises
    ValueError when the capacity is 0.
    """
    if capacity_factor is None:
        c = int(tokens_per_group)
    else:
        c = int(capacity_factor * tokens_per_group * k / num_experts)
    if c <= 0:
        raise ValueError(
            f"expert capacity is {c} (capacity_factor={capacity_factor}, "
            f"Tg={tokens_per_group}, k={k}, E={num_experts})"
        )
    return c


def assign_slots(experts, groups, num_experts, cap):
    """Capacity slots for each (token, choice).

    experts: int [T, k] expert ids. Per group, visits choices rank-first
    (j = 0..k-1), then tokens in order; the slot of an assignment is the number
    of earlier assignments to the same expert in that group. Slots >= cap are
    dropped and returned as -1. Returns int64 [T, k].
    """
    experts = np.asarray(experts)
    t_total, k = experts.shape
    tg = t_total // groups
    slots = np.full((t_total, k), -1, dtype=np.int64)
    for g in range(groups):
        seen = np.zeros(num_experts, dtype=np.int64)
        for j in range(k):
            for t in range(g * tg, (g + 1) * tg):
                e = experts[t, j]
                s = seen[e]
                seen[e] += 1
                if s < cap:
                    slots[t, j] = s
    return slots


# --------------------------------------------------------------------------
# Losses.
# --------------------------------------------------------------------------


def aux_loss(probs, experts, num_experts):
    """Switch/GShard load-balancing loss, unscaled by any coefficient.

    ``E * sum_e mean_t(probs[t, e]) * count_e / T`` with ``count_e`` the number of
    (t, j) choosing e over all tokens (before capacity drops). For uniform
    routing it equals k.
    """
    probs = np.asarray(probs, dtype=np.float64)
    t_total = probs.shape[0]
    counts = np.bincount(np.asarray(experts).reshape(-1), minlength=num_experts)
    return float(num_experts * np.sum(probs.mean(axis=0) * counts / t_total))


def orthogonal_loss(router_weight, eps=1e-12):
    """Router orthogonality loss ``||Wn^T Wn - I||_F^2 / E^2``.

    router_weight: [H, E]; each column is L2-normalised (the norm clamped
    below at ``eps`` as Paddle does, which only matters for a zero column).
    """
    w = np.asarray(router_weight, dtype=np.float64)
    norms = np.maximum(np.linalg.norm(w, axis=0, keepdims=True), eps)
    wn = w / norms
    e = w.shape[1]
    d = wn.T @ wn - np.eye(e)
    return float(np.sum(d * d) / (e * e))


def z_loss(logits):
    """Router z-loss: mean over tokens of logsumexp(logits)^2."""
    return float(np.mean(logsumexp(logits, axis=-1) ** 2))


def aux_free_bias_update(bias, usage, rate):
    """Aux-loss-free balancing step: ``bias + rate * sign(mean(usage) - usage)``.

    Under-used experts (usage below the mean) get their selection bias raised,
    over-used ones lowered; an expert exactly at the mean is unchanged.
    """
    bias = np.asarray(bias, dtype=np.float64)
    usage = np.asarray(usage, dtype=np.float64)
    return bias + rate * np.sign(np.mean(usage) - usage)


# --------------------------------------------------------------------------
# The layer.
# --------------------------------------------------------------------------


def moe_layer(h, params, *, k, groups, capacity_factor, norm_min, bias):
    """One MoE layer in float64, following the module docstring's spec.

    Args:
      h: [T, H] tokens (batch-major).
      params: dict with
        ``router`` [H, E]; ``gate`` [E, H, I]; ``up`` [E, H, I]; ``down`` [E, I, H];
        optionally ``shared_gate`` [H, Is], ``shared_up`` [H, Is],
        ``shared_down`` [Is, H] (all three, or none / None).
      k: experts per token.
      groups: number of token groups G (must divide T).
      capacity_factor: float, or None for dropless (C = Tg).
      norm_min: lower clamp of the combine-weight normaliser.
      bias: [E] selection bias (or None for zeros); affects selection only.

    Returns a dict:
      ``out`` [T, H]; ``dropped`` int (count of (t, j) with slot -1);
      ``slots`` int64 [T, k]; ``experts`` int64 [T, k]; ``weights`` [T, k];
      ``aux``, ``orth``, ``z`` (floats); and, for debugging, ``logits`` [T, E],
      ``probs`` [T, E], ``capacity`` int.
    """
    h = np.asarray(h, dtype=np.float64)
    if h.ndim != 2:
        raise ValueError(f"h must be [T, H], got shape {h.shape}")
    t_total, hidden = h.shape
    wg = np.asarray(params["router"], dtype=np.float64)
    if wg.shape[0] != hidden:
        raise ValueError(f"router must be [H={hidden}, E], got {wg.shape}")
    num_experts = wg.shape[1]
    gate = np.asarray(params["gate"], dtype=np.float64)
    up = np.asarray(params["up"], dtype=np.float64)
    down = np.asarray(params["down"], dtype=np.float64)
    if gate.shape[0] != num_experts or up.shape != gate.shape:
        raise ValueError("gate/up must be [E, H, I] with E matching the router")
    if down.shape != (num_experts, gate.shape[2], hidden):
        raise ValueError(f"down must be [E, I, H], got {down.shape}")
    if groups < 1 or t_total % groups:
        raise ValueError(f"groups={groups} must divide T={t_total}")
    tg = t_total // groups

    if bias is None:
        bias = np.zeros(num_experts)
    bias = np.asarray(bias, dtype=np.float64).reshape(-1)
    if bias.shape != (num_experts,):
        raise ValueError(f"bias must have E={num_experts} entries, got {bias.size}")

    logits = h @ wg
    probs = softmax(logits, axis=-1)

    experts = topk_lower_index_ties(probs + bias[None, :], k)
    weights = np.take_along_axis(probs, experts, axis=-1)
    denom = np.maximum(weights.sum(axis=-1, keepdims=True), norm_min)
    weights = weights / denom

    cap = capacity(tg, k, num_experts, capacity_factor)
    slots = assign_slots(experts, groups, num_experts, cap)
    kept = slots >= 0

    out = np.zeros_like(h)
    for e in range(num_experts):
        rows, cols = np.nonzero((experts == e) & kept)
        if rows.size == 0:
            continue
        y = swiglu(h[rows], gate[e], up[e], down[e])
        np.add.at(out, rows, weights[rows, cols][:, None] * y)

    shared = [params.get(n) for n in ("shared_gate", "shared_up", "shared_down")]
    if any(s is not None for s in shared):
        if any(s is None for s in shared):
            raise ValueError("shared_gate, shared_up and shared_down go together")
        out = out + swiglu(h, *shared)

    return {
        "out": out,
        "dropped": int(np.count_nonzero(~kept)),
        "slots": slots,
        "experts": experts,
        "weights": weights,
        "aux": aux_loss(probs, experts, num_experts),
        "orth": orthogonal_loss(wg),
        "z": z_loss(logits),
        "logits": logits,
        "probs": probs,
        "capacity": cap,
    }


# --------------------------------------------------------------------------
# Which decoder layers are MoE (Hugging Face's rule).
# --------------------------------------------------------------------------


def is_moe_layer(layer_idx, num_layers, start, end, interval):
    """Hugging Face ``Ernie4_5_MoeDecoderLayer`` rule (0-based layer_idx).

    MoE iff ``(layer_idx + 1) % interval == 0 and start <= layer_idx <= end``,
    where ``end == -1`` means ``num_layers - 1``.
    """
    if end == -1:
        end = num_layers - 1
    return (layer_idx + 1) % interval == 0 and start <= layer_idx <= end


def moe_layer_indices(num_layers, start, end, interval):
    """All MoE layer indices under :func:`is_moe_layer`."""
    return [i for i in range(num_layers) if is_moe_layer(i, num_layers, start, end, interval)]


# --------------------------------------------------------------------------
# Self-check.
# --------------------------------------------------------------------------


def _random_params(rng, hidden, experts, inter, shared_inter=None):
    p = {
        "router": rng.standard_normal((hidden, experts)),
        "gate": rng.standard_normal((experts, hidden, inter)) / np.sqrt(hidden),
        "up": rng.standard_normal((experts, hidden, inter)) / np.sqrt(hidden),
        "down": rng.standard_normal((experts, inter, hidden)) / np.sqrt(inter),
    }
    if shared_inter:
        p["shared_gate"] = rng.standard_normal((hidden, shared_inter)) / np.sqrt(hidden)
        p["shared_up"] = rng.standard_normal((hidden, shared_inter)) / np.sqrt(hidden)
        p["shared_down"] = rng.standard_normal((shared_inter, hidden)) / np.sqrt(shared_inter)
    return p


def _dense_oracle(h, p, weights_full, keep_full):
    """Every expert on every token, masked: an independent way to get ``out``."""
    out = np.zeros_like(h)
    for e in range(p["router"].shape[1]):
        y = swiglu(h, p["gate"][e], p["up"][e], p["down"][e])
        out += (weights_full[:, e] * keep_full[:, e])[:, None] * y
    if p.get("shared_gate") is not None:
        out += swiglu(h, p["shared_gate"], p["shared_up"], p["shared_down"])
    return out


def _self_check():
    rng = np.random.default_rng(0)
    T, H, E, I, k, G = 24, 8, 6, 5, 2, 3
    p = _random_params(rng, H, E, I, shared_inter=2 * I)
    h = rng.standard_normal((T, H))
    bias = 0.1 * rng.standard_normal(E)

    # 1. Dropless: nothing dropped, weights sum to 1, matches a dense oracle.
    r = moe_layer(h, p, k=k, groups=G, capacity_factor=None, norm_min=1e-12, bias=bias)
    assert r["dropped"] == 0 and r["capacity"] == T // G
    assert np.all(r["slots"] >= 0)
    assert np.allclose(r["weights"].sum(-1), 1.0, atol=1e-12)
    wf = np.zeros((T, E))
    np.put_along_axis(wf, r["experts"], r["weights"], axis=-1)
    assert np.allclose(r["out"], _dense_oracle(h, p, wf, np.ones((T, E))), atol=1e-12)
    # distinct experts per token, sorted by descending biased score
    assert all(len(set(row)) == k for row in r["experts"].tolist())
    sc = np.take_along_axis(r["probs"] + bias, r["experts"], axis=-1)
    assert np.all(np.diff(sc, axis=-1) <= 0)

    # 2. The bias changes selection only; weights are the unbiased probs.
    big = np.zeros(E)
    big[E - 1] = 10.0
    r2 = moe_layer(h, p, k=k, groups=G, capacity_factor=None, norm_min=1e-12, bias=big)
    assert np.all(r2["experts"][:, 0] == E - 1)
    raw = np.take_along_axis(r2["probs"], r2["experts"], axis=-1)
    assert np.allclose(r2["weights"], raw / raw.sum(-1, keepdims=True))

    # 3. norm_min clamps the normaliser.
    r3 = moe_layer(h, p, k=k, groups=G, capacity_factor=None, norm_min=10.0, bias=bias)
    raw3 = np.take_along_axis(r3["probs"], r3["experts"], axis=-1)
    assert np.allclose(r3["weights"], raw3 / 10.0)

    # 4. Capacity: per group and expert at most C kept; slots agree with a
    #    brute-force count in rank-first order; out matches the masked oracle.
    cf = 1.0
    r4 = moe_layer(h, p, k=k, groups=G, capacity_factor=cf, norm_min=1e-12, bias=bias)
    tg = T // G
    C = int(cf * tg * k / E)
    assert r4["capacity"] == C
    order = [(t, j) for j in range(k) for t in range(tg)]
    dropped = 0
    keep_full = np.zeros((T, E))
    for g in range(G):
        for idx, (t, j) in enumerate(order):
            tt = g * tg + t
            e = r4["experts"][tt, j]
            earlier = sum(1 for (u, i) in order[:idx] if r4["experts"][g * tg + u, i] == e)
            want = earlier if earlier < C else -1
            assert r4["slots"][tt, j] == want
            dropped += want < 0
            keep_full[tt, e] = want >= 0
        kept_counts = np.bincount(
            r4["experts"][g * tg:(g + 1) * tg][r4["slots"][g * tg:(g + 1) * tg] >= 0], minlength=E
        )
        assert np.all(kept_counts <= C)
    assert r4["dropped"] == dropped
    wf4 = np.zeros((T, E))
    np.put_along_axis(wf4, r4["experts"], r4["weights"], axis=-1)
    assert np.allclose(r4["out"], _dense_oracle(h, p, wf4, keep_full), atol=1e-12)
    # drops happen here (uneven routing with C = Tg*k/E), and a huge factor
    # means none.
    r5 = moe_layer(h, p, k=k, groups=G, capacity_factor=float(E), norm_min=1e-12, bias=bias)
    assert r5["dropped"] == 0 and np.allclose(r5["out"], r["out"])

    # 5. Capacity 0 is an error.
    try:
        moe_layer(h, p, k=1, groups=T, capacity_factor=1.0, norm_min=1e-12, bias=None)
    except ValueError:
        pass
    else:
        raise AssertionError("capacity 0 must raise ValueError")

    # 6. Ties go to the lower expert index; uniform routing gives aux == k,
    #    z == (log E)^2; orthonormal router columns give orth == 0.
    pz = dict(p, router=np.zeros((H, E)))
    r6 = moe_layer(h, pz, k=3, groups=1, capacity_factor=None, norm_min=1e-12, bias=None)
    assert np.all(r6["experts"] == np.arange(3))
    assert np.isclose(r6["aux"], 3.0) and np.isclose(r6["z"], np.log(E) ** 2)
    q, _ = np.linalg.qr(rng.standard_normal((H, E)))
    assert np.isclose(orthogonal_loss(3.0 * q), 0.0, atol=1e-24)
    # orth of identical columns: every off-diagonal of Wn^T Wn is 1.
    same = np.repeat(rng.standard_normal((H, 1)), E, axis=1)
    assert np.isclose(orthogonal_loss(same), (E * E - E) / (E * E))

    # 7. aux by its definition, from r.
    cnt = np.bincount(r["experts"].ravel(), minlength=E)
    assert np.isclose(r["aux"], E * np.sum(r["probs"].mean(0) * cnt / T))

    # 8. Bias update.
    b = aux_free_bias_update(np.zeros(4), np.array([1.0, 2.0, 3.0, 2.0]), 0.5)
    assert np.allclose(b, [0.5, 0.0, -0.5, 0.0])

    # 9. MoE-layer rule for the published configs.
    assert moe_layer_indices(28, 1, 27, 1) == list(range(1, 28))  # 21B-A3B
    assert moe_layer_indices(54, 3, 53, 1) == list(range(3, 54))  # 300B-A47B
    assert moe_layer_indices(6, 0, -1, 2) == [1, 3, 5]

    print("moe_reference self-check passed "
          f"(capacity run: C={C}, dropped={r4['dropped']}/{T * k}; "
          f"aux={r['aux']:.4f} orth={r['orth']:.4f} z={r['z']:.4f})")


if __name__ == "__main__":
    _self_check()

"""The Python frontend: tracing, Paddle's distributed API, Llama, compile/run.

The Llama model's logits and every parameter gradient are checked against
a numpy implementation of the same architecture written here (f64, ≤ 1e-6
relative; gradients by central differences along random directions, whose
truncation error is ~1e-10). Training under meshes [1], dp=2, mp=2 and
2x2 gives the single-rank losses step for step (f32, ≤ 1e-5 relative: only
the order of sums differs).
"""

import numpy as np
import pytest

import ernie
import ernie.distributed as dist
from ernie.models.llama import LlamaConfig, LlamaForCausalLM, parallelize_plan
from megatron_model import MEGATRON_SP, MEGATRON_TP, MegatronModel

TINY = dict(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)


# ---------------------------------------------------------------------------
# A numpy Llama (Hugging Face semantics), f64.
# ---------------------------------------------------------------------------

def np_rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def np_rope(x, theta):
    s, d = x.shape[1], x.shape[-1]
    inv = theta ** (-np.arange(0, d, 2) / d)
    ang = np.arange(s)[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, -1)[None, :, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, -1)[None, :, None, :]
    rot = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1)
    return x * cos + rot * sin


def np_projections(p, cfg):
    """A layer's q, k, v, gate and up weights [in, out], fused or not."""
    hq, hkv, d, inter = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size
    if cfg.fuse_attention_qkv:
        qkv = p("self_attn.qkv_proj.weight")
        attn = qkv[:, :hq * d], qkv[:, hq * d:(hq + hkv) * d], qkv[:, (hq + hkv) * d:]
    else:
        attn = tuple(p(f"self_attn.{n}_proj.weight") for n in "qkv")
    if cfg.fuse_attention_ffn:
        gu = p("mlp.gate_up_proj.weight")
        return attn + (gu[:, :inter], gu[:, inter:])
    return attn + (p("mlp.gate_proj.weight"), p("mlp.up_proj.weight"))


def np_llama(params, ids, labels, cfg):
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    x = params["llama.embed_tokens.weight"][ids]
    b, s, _ = x.shape
    for i in range(cfg.num_hidden_layers):
        p = lambda n: params[f"llama.layers.{i}.{n}"]
        h = np_rms(x, p("input_layernorm.weight"), cfg.rms_norm_eps)
        wq, wk, wv, wgate, wup = np_projections(lambda n: params[f"llama.layers.{i}.{n}"], cfg)
        q = np_rope((h @ wq).reshape(b, s, hq, d), cfg.rope_theta)
        k = np_rope((h @ wk).reshape(b, s, hkv, d), cfg.rope_theta)
        v = (h @ wv).reshape(b, s, hkv, d)
        k, v = np.repeat(k, hq // hkv, axis=2), np.repeat(v, hq // hkv, axis=2)
        scores = np.einsum("bshd,bthd->bhst", q, k) / np.sqrt(d)
        scores = np.where(np.tril(np.ones((s, s), bool)), scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        att = np.einsum("bhst,bthd->bshd", probs, v).reshape(b, s, hq * d)
        x = x + att @ p("self_attn.o_proj.weight")
        h = np_rms(x, p("post_attention_layernorm.weight"), cfg.rms_norm_eps)
        gate, up = h @ wgate, h @ wup
        x = x + (gate / (1 + np.exp(-gate)) * up) @ p("mlp.down_proj.weight")
    x = np_rms(x, params["llama.norm.weight"], cfg.rms_norm_eps)
    head = (params["llama.embed_tokens.weight"].T if cfg.tie_word_embeddings
            else params["lm_head.weight"])
    logits = x @ head
    # Hugging Face's loss: position t against labels[t + 1], the last none.
    z = logits[:, :-1] - logits[:, :-1].max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    loss = -np.take_along_axis(logp, labels[:, 1:, None], -1).mean()
    return logits, loss


def batch(cfg, b=2, s=8, seed=1):
    rng = np.random.default_rng(seed)
    return rng.integers(0, cfg.vocab_size, size=(b, s)), rng.integers(0, cfg.vocab_size, size=(b, s))


@pytest.mark.parametrize("tied,fused", [(False, False), (True, False), (False, True)])
def test_llama_logits_and_gradients_match_numpy(tied, fused):
    cfg = LlamaConfig(**TINY, dtype="f64", tie_word_embeddings=tied, seed=3,
                      fuse_attention_qkv=fused, fuse_attention_ffn=fused)
    model = LlamaForCausalLM(cfg)
    ids, labels = batch(cfg)
    params = {n: p.value.astype(np.float64) for n, p in model.named_parameters()}

    # Logits: the model without labels, not differentiated.
    logits_prog = ernie.compile(model, None, [ids], differentiate=False)
    want_logits, want_loss = np_llama(params, ids, labels, cfg)
    np.testing.assert_allclose(logits_prog.forward(ids), want_logits, rtol=1e-6, atol=1e-9)

    prog = ernie.compile(model, None, [ids, labels])
    loss, grads = prog.grad(ids, labels)
    assert abs(loss - want_loss) <= 1e-9 * abs(want_loss)
    assert set(grads) == set(params)
    rng = np.random.default_rng(0)
    eps = 1e-5
    for name, g in grads.items():
        for _ in range(2):
            v = rng.normal(size=g.shape)
            plus = dict(params, **{name: params[name] + eps * v})
            minus = dict(params, **{name: params[name] - eps * v})
            fd = (np_llama(plus, ids, labels, cfg)[1] - np_llama(minus, ids, labels, cfg)[1]) / (2 * eps)
            got = float(np.sum(g * v))
            assert abs(got - fd) <= 1e-6 * max(abs(fd), np.linalg.norm(g) * np.linalg.norm(v)), name


# ---------------------------------------------------------------------------
# Training under plans equals the single-rank run.
# ---------------------------------------------------------------------------

LLAMA_PLAN = parallelize_plan()


def train(mesh_shape, names, steps=20, sequence_parallel=False):
    cfg = LlamaConfig(**TINY, seed=7)
    model = LlamaForCausalLM(cfg)
    opt = ernie.optimizer.AdamW(ernie.optimizer.LinearWarmupCosine(3e-3, 5, steps), weight_decay=0.01)
    ids, labels = batch(cfg, b=4)
    if mesh_shape is None:
        prog = ernie.compile(model, opt, [ids, labels])
    else:
        mesh = dist.ProcessMesh(np.arange(int(np.prod(mesh_shape))).reshape(mesh_shape), names)
        config = {}
        if "dp" in names:
            config["dp_config"] = {"sharding_level": 0}
        if "mp" in names:
            config["mp_config"] = {"parallelize_plan": parallelize_plan(sequence_parallel)}
        prog = ernie.compile(model, opt, [ids, labels], mesh=mesh, config=config)
    return prog, [prog.step(ids, labels) for _ in range(steps)]


@pytest.fixture(scope="module")
def single_rank_losses():
    return train(None, None)[1]


@pytest.mark.parametrize("shape,names,sp", [([2], ["dp"], False), ([2], ["mp"], False),
                                             ([2, 2], ["dp", "mp"], False), ([2], ["mp"], True),
                                             ([2, 2], ["dp", "mp"], True)])
def test_training_under_plans_matches_single_rank(single_rank_losses, shape, names, sp):
    prog, losses = train(shape, names, sequence_parallel=sp)
    np.testing.assert_allclose(losses, single_rank_losses, rtol=1e-5)
    assert losses[-1] < losses[0]  # it learns
    if "mp" in names:
        kinds = prog.report()["collectives"]
        assert any(k.endswith("[mp]") for k in kinds), kinds
        if sp:  # activations leave the row-parallel matmuls split along the sequence
            assert "reduce_scatter[mp]" in kinds, kinds


def test_report_names_the_gemm_kernels():
    """The report says which GEMM library and kernel family run, so that a
    step time can be read; the kernels are the CPU's own family, not a
    generic fallback (the warning is empty)."""
    prog, _ = train(None, None, steps=5)
    gemm = prog.report()["gemm"]
    assert gemm["library"].startswith("OpenBLAS"), gemm
    assert gemm["kernels"] and gemm["kernels"] != "unknown", gemm
    assert gemm["warning"] == "", gemm


def test_state_dict_is_global_and_round_trips():
    cfg = LlamaConfig(**TINY, seed=2)
    model = LlamaForCausalLM(cfg)
    ids, labels = batch(cfg)
    mesh = dist.ProcessMesh([0, 1], ["mp"])
    prog = ernie.compile(model, ernie.optimizer.SGD(0.1), [ids, labels], mesh=mesh,
                         config={"mp_config": {"parallelize_plan": LLAMA_PLAN}})
    state = prog.state_dict()
    for name, p in model.named_parameters():
        np.testing.assert_array_equal(state[name], p.value)  # global, not a shard
    prog.step(ids, labels)
    moved = prog.state_dict()
    assert any(not np.array_equal(moved[n], state[n]) for n in state
               if n != ernie.Program.STEP_KEY)
    prog.load_state_dict(state)
    np.testing.assert_array_equal(prog.state_dict()["lm_head.weight"], state["lm_head.weight"])



def test_training_resumes_from_a_state_dict_on_another_mesh():
    """A state dict carries the step count with parameters and slots, so a
    fresh program — here pipelined with ZeRO-2 on dp x pp = 2 x 2 — that
    loads one continues as the saving program does: AdamW's bias correction
    and the warm-up schedule read the step (f32 sums in another order:
    1e-5 relative)."""
    cfg = LlamaConfig(**TINY, seed=2)
    ids, labels = batch(cfg, b=4)

    def adamw():
        return ernie.optimizer.AdamW(ernie.optimizer.LinearWarmupCosine(1e-2, 4, 10))
    first = ernie.compile(LlamaForCausalLM(cfg), adamw(), [ids, labels])
    for _ in range(3):
        first.step(ids, labels)
    saved = first.state_dict()
    assert int(saved[ernie.Program.STEP_KEY]) == 3
    mesh = dist.ProcessMesh(np.arange(4).reshape(2, 2), ["dp", "pp"])
    resumed = ernie.compile(LlamaForCausalLM(LlamaConfig(**TINY, seed=5)), adamw(), [ids, labels],
                            mesh=mesh, config={"dp_config": {"sharding_level": 2},
                                               "pp_config": {"split_spec": "llama.layers",
                                                             "accumulate_steps": 2}})
    resumed.load_state_dict(saved)
    assert resumed.step_count == 3
    want = [first.step(ids, labels) for _ in range(3)]
    got = [resumed.step(ids, labels) for _ in range(3)]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    with pytest.raises(ValueError, match="non-negative integer scalar"):
        resumed.load_state_dict({ernie.Program.STEP_KEY: np.array(1.5)})
    # A program without an optimizer (inference) takes the parameters of a
    # training state; it has no step to set.
    plain = ernie.compile(LlamaForCausalLM(cfg), None, [ids, labels])
    plain.load_state_dict({k: v for k, v in saved.items() if ":" not in k})
    assert ernie.Program.STEP_KEY not in plain.state_dict()

# ---------------------------------------------------------------------------
# Paddle semantics.
# ---------------------------------------------------------------------------

def test_placements_and_dims_mapping():
    assert dist.placements_to_dims_mapping([dist.Shard(1), dist.Replicate()], 2) == ([-1, 0], [])
    assert dist.placements_to_dims_mapping([dist.Partial(), dist.Shard(0)], 3) == ([1, -1, -1], [0])
    back = dist.dims_mapping_to_placements([1, -1], 2, [0])
    assert back == [dist.Partial(), dist.Shard(0)]
    mesh = dist.ProcessMesh([[0, 1], [2, 3]], ["dp", "mp"])
    assert dist.placements_to_sharding(mesh, [dist.Shard(0), dist.Shard(0)], (8, 4)) == \
        ("mesh", [["dp", "mp"], []], [])


@pytest.mark.parametrize("op,inputs,mappings,attrs,want_out", [
    ("matmul", [((8, 4), "f32"), ((4, 6), "f32")], [[0, 1], [1, -1]], {}, ([0, -1], [1])),
    ("add", [((8, 4), "f32"), ((8, 4), "f32")], [[0, -1], [-1, -1]], {}, ([0, -1], [])),
    ("softmax", [((8, 4), "f32")], [[0, 1]], {"axis": 1}, ([0, -1], [])),
    ("embedding", [((2, 8), "i64"), ((16, 4), "f32")], [[-1, -1], [1, -1]], {}, ([-1, -1, -1], [1])),
])
def test_infer_spmd(op, inputs, mappings, attrs, want_out):
    mesh = dist.ProcessMesh([[0, 1], [2, 3]], ["x", "y"])
    _, outs = dist.infer_spmd(op, inputs, mappings, mesh, **attrs)
    assert tuple(map(list, outs[0])) == (want_out[0], want_out[1])


def test_plan_regexes_match_full_names():
    cfg = LlamaConfig(**TINY)
    model = LlamaForCausalLM(cfg)
    mesh = dist.ProcessMesh([0, 1], ["mp"])
    dist.parallelize(model, None, mesh, {"mp_config": {"parallelize_plan": {
        "llama.layers.*.mlp.down_proj": dist.RowWiseParallel(),
        "llama.layers.1.self_attn.q_proj.weight": dist.ColWiseParallel()}}})
    placed = {n: p.placements for n, p in model.named_parameters() if p.placements}
    assert set(placed) == {"llama.layers.0.mlp.down_proj.weight", "llama.layers.1.mlp.down_proj.weight",
                           "llama.layers.1.self_attn.q_proj.weight"}
    assert placed["llama.layers.0.mlp.down_proj.weight"] == [dist.Shard(0)]
    assert placed["llama.layers.1.self_attn.q_proj.weight"] == [dist.Shard(1)]


def test_reshard_partial_to_replicate():
    """A value held as a pending sum over mp, resharded to Replicate, is
    the global value on every rank (the partitioner's all-reduce)."""
    mesh = dist.ProcessMesh([0, 1], ["mp"])

    class Identity(ernie.nn.Module):
        def forward(self, x):
            y = dist.reshard(x, mesh, [dist.Replicate()])
            return ernie.functional.sum(y * y)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    prog = ernie.compile(Identity(), None, [dist.shard_tensor(x, mesh, [dist.Partial()])], mesh=mesh)
    assert "all_reduce" in prog.mlir
    np.testing.assert_allclose(prog.eval(x), float(np.sum(x * x)), rtol=1e-6)


def test_traced_module_names_parameters():
    model = LlamaForCausalLM(LlamaConfig(**dict(TINY, num_hidden_layers=1)))
    ids, labels = batch(model.config)
    text = ernie.trace_model(model, [ids, labels], None)
    assert 'ernie.param = "llama.layers.0.self_attn.q_proj.weight"' in text
    assert "ernie.cross_entropy" in text


# ---------------------------------------------------------------------------
# Bad input: clear Python exceptions.
# ---------------------------------------------------------------------------

def test_bad_input_is_a_clear_error():
    cfg = LlamaConfig(**TINY)
    model = LlamaForCausalLM(cfg)
    mesh = dist.ProcessMesh([0, 1], ["mp"])
    with pytest.raises(ValueError, match="matches no sub-layer or parameter"):
        dist.parallelize(model, None, mesh, {"mp_config": {"parallelize_plan": {"nothing.*": dist.ColWiseParallel()}}})
    with pytest.raises(ValueError, match="unknown parallelize config keys"):
        dist.parallelize(model, None, mesh, {"zp_config": {}})
    # A dimension the mesh does not divide is split unevenly (padded; see
    # test_uneven.py, which also tests config={"even_splits": True}).
    assert isinstance(dist.shard_tensor(np.zeros((3, 4)), mesh, [dist.Shard(0)]), dist.DistTensor)
    with pytest.raises(ValueError, match="out of range"):
        dist.shard_tensor(np.zeros((4, 4)), mesh, [dist.Shard(2)])
    with pytest.raises(ValueError, match="placements for a 1-dimensional mesh"):
        dist.shard_tensor(np.zeros((4, 4)), mesh, [dist.Shard(0), dist.Replicate()])
    ids, labels = batch(cfg)
    prog = ernie.compile(LlamaForCausalLM(cfg), ernie.optimizer.SGD(0.1), [ids, labels])
    with pytest.raises(ValueError, match="has shape"):
        prog.step(ids[:, :4], labels)
    with pytest.raises(TypeError, match="dtype"):
        prog.step(ids.astype(np.int32), labels)
    # A shape error while tracing names the op and the user's line.
    class Bad(ernie.nn.Module):
        def forward(self, x):
            return ernie.functional.matmul(x, x)
    with pytest.raises(ValueError, match=r"'ernie.matmul': .*test_frontend.py:\d+.*contraction sizes differ"):
        ernie.compile(Bad(), None, [np.zeros((3, 4), np.float32)])


def test_llama_matches_hugging_face():
    """Optional: with `transformers` and `torch` installed, Hugging Face's own
    LlamaForCausalLM with the same weights (mapped through state_dict names:
    HF's q/k/v and gate/up are separate [out, in] Linears) gives the same
    logits (f64, 1e-6 relative)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = LlamaConfig(**TINY, dtype="f64", seed=5)
    model = LlamaForCausalLM(cfg)
    ids, _ = batch(cfg)
    ours = ernie.compile(model, None, [ids], differentiate=False).forward(ids)
    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
        rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False)
    hf = transformers.LlamaForCausalLM(hf_cfg).double().eval()
    p = {n: torch.tensor(v.value) for n, v in model.named_parameters()}
    state = {"model.embed_tokens.weight": p["llama.embed_tokens.weight"],
             "model.norm.weight": p["llama.norm.weight"], "lm_head.weight": p["lm_head.weight"].T}
    for i in range(cfg.num_hidden_layers):
        src, dst = f"llama.layers.{i}.", f"model.layers.{i}."
        wq, wk, wv, wgate, wup = np_projections(lambda n: p[src + n], cfg)
        state.update({
            dst + "input_layernorm.weight": p[src + "input_layernorm.weight"],
            dst + "post_attention_layernorm.weight": p[src + "post_attention_layernorm.weight"],
            dst + "self_attn.q_proj.weight": wq.T,
            dst + "self_attn.k_proj.weight": wk.T,
            dst + "self_attn.v_proj.weight": wv.T,
            dst + "self_attn.o_proj.weight": p[src + "self_attn.o_proj.weight"].T,
            dst + "mlp.gate_proj.weight": wgate.T,
            dst + "mlp.up_proj.weight": wup.T,
            dst + "mlp.down_proj.weight": p[src + "mlp.down_proj.weight"].T})
    hf.load_state_dict({k: v.contiguous() for k, v in state.items()}, strict=False)
    with torch.no_grad():
        want = hf(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(ours, want, rtol=1e-6, atol=1e-9)


# ---------------------------------------------------------------------------
# ZeRO.
# ---------------------------------------------------------------------------

def zero_run(level, mesh_shape, names, steps=5, stage_api=False):
    cfg = LlamaConfig(**TINY, seed=11)
    ids, labels = batch(cfg, b=4)
    mesh = dist.ProcessMesh(np.arange(int(np.prod(mesh_shape))).reshape(mesh_shape), names)
    opt = ernie.optimizer.AdamW(2e-3, weight_decay=0.01)
    config = {"dp_config": {"sharding_level": 0 if stage_api else level}}
    if "mp" in names:
        config["mp_config"] = {"parallelize_plan": LLAMA_PLAN}
    if stage_api and level:
        opt = dist.shard_optimizer(opt, [None, dist.ShardingStage1, dist.ShardingStage2,
                                         dist.ShardingStage3][level]("dp"))
    prog = ernie.compile(LlamaForCausalLM(cfg), opt, [ids, labels], mesh=mesh, config=config)
    losses = [prog.step(ids, labels) for _ in range(steps)]
    return prog, losses, prog.state_dict()


@pytest.mark.parametrize("shape,names", [([2], ["dp"]), ([2, 2], ["dp", "mp"])])
def test_zero_levels_match_unsharded(shape, names):
    """ZeRO 1-3 change where state lives, not the numbers (losses ≤ 1e-6,
    f32 sums in another order; a weight to 2e-6 of the tensor's scale: AdamW
    turns a gradient near 0 into a full-size step, so its last-bit
    differences reach the weights whole).
    An evaluation takes the parameters as the step keeps them (split at
    level 3, gathered inside eval_step), so it does not gather the model
    into every rank's state."""
    unsharded, want_losses, want_state = zero_run(0, shape, names)
    ids, labels = batch(LlamaConfig(**TINY, seed=4), b=4)
    want_eval = unsharded.eval(ids, labels)
    for level in (1, 2, 3):
        prog, losses, state = zero_run(level, shape, names, stage_api=(level == 2))
        np.testing.assert_allclose(losses, want_losses, rtol=1e-6, err_msg=f"level {level}")
        for name in want_state:
            scale = float(np.max(np.abs(want_state[name]))) or 1.0
            np.testing.assert_allclose(state[name], want_state[name], rtol=1e-6, atol=2e-6 * scale,
                                       err_msg=f"level {level} {name}")
        sig = {a["name"]: a for a in prog._session.signature("train_step")["arguments"]}
        moment = sig["llama.layers.0.mlp.down_proj.weight:moment1"]
        assert any("dp" in axes for axes in moment["sharding"]), moment  # slots split over dp
        param = sig["llama.layers.0.mlp.down_proj.weight"]
        assert any("dp" in axes for axes in param["sharding"]) == (level == 3), param
        evaluated = {a["name"]: a for a in prog._session.signature("eval_step")["arguments"]}
        assert evaluated[param["name"]]["sharding"] == param["sharding"]
        assert prog.eval(ids, labels) == pytest.approx(want_eval, rel=1e-6)


class GPTBlock(ernie.nn.Module):
    """GPT-2 style: 12 h^2 weights (qkv 3h^2, out h^2, MLP 8h^2)."""

    def __init__(self, h, heads, dtype):
        super().__init__()
        self.ln1 = ernie.nn.LayerNorm(h, dtype=dtype)
        self.qkv = ernie.nn.Linear(h, 3 * h, bias=False, dtype=dtype)
        self.out = ernie.nn.Linear(h, h, bias=False, dtype=dtype)
        self.ln2 = ernie.nn.LayerNorm(h, dtype=dtype)
        self.up = ernie.nn.Linear(h, 4 * h, bias=False, dtype=dtype)
        self.down = ernie.nn.Linear(4 * h, h, bias=False, dtype=dtype)
        self.heads = heads

    def forward(self, x):
        F = ernie.functional
        b, s, h = x.shape
        q, k, v = F.split(self.qkv(self.ln1(x)), [h, h, h], axis=2)
        shape = (b, s, self.heads, h // self.heads)
        att = F.attention(q.reshape(shape), k.reshape(shape), v.reshape(shape), causal=True)
        x = x + self.out(att.reshape(b, s, h))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class GPT(ernie.nn.Module):
    def __init__(self, vocab, h, layers, heads, dtype="bf16"):
        super().__init__()
        self.embed = ernie.nn.Embedding(vocab, h, dtype=dtype)
        self.blocks = ernie.nn.LayerList(GPTBlock(h, heads, dtype) for _ in range(layers))
        self.ln = ernie.nn.LayerNorm(h, dtype=dtype)

    def forward(self, ids, labels):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        logits = ernie.functional.matmul(self.ln(x), self.embed.p("weight"), transpose_b=True)
        return ernie.functional.cross_entropy(logits, labels)


def test_zero_memory_matches_the_paper():
    """Rajbhandari et al., 7.5 B parameters, mixed-precision AdamW (2 + 2 +
    12 bytes per parameter), dp = 64: model-state memory per rank of
    120 / 31.4 / 16.6 / 1.9 GB for ZeRO levels 0-3 (printed rounded), within
    1%, read from the compiled program's per-rank arguments and gradients.
    Compiled abstractly: no tensor of the model is ever allocated."""
    with ernie.nn.abstract():
        model = GPT(vocab=61440, h=4096, layers=36, heads=32)
    params = sum(int(np.prod(p.shape)) for p in model.parameters())
    assert abs(params / 7.5e9 - 1) < 0.001, params
    mesh = dist.ProcessMesh(list(range(64)), ["dp"])
    ids = np.zeros((64, 16), np.int64)
    # The paper's figures unrounded: 16 P, (4 + 12/64) P, (2 + 14/64) P, 16 P / 64.
    want = {0: 120, 1: 31.40625, 2: 16.640625, 3: 1.875}
    for level, gb in want.items():
        prog = ernie.compile(model, ernie.optimizer.AdamW(1e-4, multi_precision=True), [ids, ids],
                             mesh=mesh, config={"dp_config": {"sharding_level": level}}, abstract=True)
        got = prog.report()["model_state_bytes"] / 1e9
        assert abs(got / gb - 1) < 0.01, (level, got, gb)
        with pytest.raises(RuntimeError, match="abstract"):
            prog.step(ids, ids)


def test_trace_timeline(tmp_path):
    import json
    cfg = LlamaConfig(**TINY)
    ids, labels = batch(cfg)
    mesh = dist.ProcessMesh([0, 1], ["dp"])
    prog = ernie.compile(LlamaForCausalLM(cfg), ernie.optimizer.SGD(0.1), [ids, labels], mesh=mesh,
                         trace=True)
    prog.step(ids, labels)
    prog.write_trace(tmp_path / "t.json")
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1}
    assert any(e["name"] == "ernie.all_reduce" and e["tid"] == 1 for e in spans)
    assert any(e["name"] == "ernie.matmul" and e["tid"] == 0 for e in spans)


# ---------------------------------------------------------------------------
# Sequence parallelism.
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("t", [2, 4])
def test_sequence_parallel_replaces_all_reduces(t):
    """Korthikanti et al.: per layer, tensor parallelism all-reduces b*s*h
    elements twice in the forward; sequence parallelism replaces each by an
    all-gather plus a reduce-scatter of the same volume. Losses equal the
    tensor-parallel and single-rank runs (f32, 1e-5)."""
    b, s, h, layers, vocab = 2, 8, 16, 2, 32
    rng = np.random.default_rng(0)
    ids, labels = rng.integers(0, vocab, (b, s)), rng.integers(0, vocab, (b, s))
    runs = {}
    for name, plan in (("single", None), ("tp", MEGATRON_TP), ("sp", MEGATRON_SP)):
        model = MegatronModel(vocab, h, 4, layers)
        for i, (_, p) in enumerate(model.named_parameters()):  # same weights in every run
            p.value = np.random.default_rng(i).normal(0, 0.1, p.shape).astype(np.float32)
        if plan is None:
            prog = ernie.compile(model, ernie.optimizer.SGD(0.1), [ids, labels])
        else:
            mesh = dist.ProcessMesh(list(range(t)), ["mp"])
            prog = ernie.compile(model, ernie.optimizer.SGD(0.1), [ids, labels], mesh=mesh,
                                 config={"mp_config": {"parallelize_plan": plan}})
        runs[name] = (prog, [prog.step(ids, labels) for _ in range(3)])
    np.testing.assert_allclose(runs["tp"][1], runs["single"][1], rtol=1e-5)
    np.testing.assert_allclose(runs["sp"][1], runs["single"][1], rtol=1e-5)
    act = b * s * h * 4  # one activation, f32
    tp = ernie.collectives_of(runs["tp"][0].mlir, "forward")
    assert tp["all_reduce[mp]"] == {"count": 2 * layers, "bytes": 2 * layers * act}, tp
    sp = ernie.collectives_of(runs["sp"][0].mlir, "forward")
    assert "all_reduce[mp]" not in sp, sp
    # Each all-gather takes a 1/t piece and makes the whole activation; one
    # more gathers the last layer's output where the region ends (the head).
    assert sp["reduce_scatter[mp]"] == {"count": 2 * layers, "bytes": 2 * layers * act}, sp
    assert sp["all_gather[mp]"] == {"count": 2 * layers + 1, "bytes": (2 * layers + 1) * act // t}, sp


def test_bf16_results_come_back_as_values():
    """The runtime hands narrow floats over as raw bits; the Program API
    returns their values: a bf16 model's loss and logits equal the f32
    model's to bf16 rounding (its weights are the f32 ones rounded)."""
    results = {}
    for dtype in ("f32", "bf16"):
        cfg = LlamaConfig(**TINY, dtype=dtype, seed=0)
        model = LlamaForCausalLM(cfg)
        ids, labels = batch(cfg)
        loss = ernie.compile(model, None, [ids, labels], differentiate=False).forward(ids, labels)
        logits = ernie.compile(model, None, [ids], differentiate=False).forward(ids)
        results[dtype] = (float(loss), np.asarray(logits))
    assert results["bf16"][1].dtype == np.float32
    assert abs(results["bf16"][0] / results["f32"][0] - 1) < 2e-2
    np.testing.assert_allclose(results["bf16"][1], results["f32"][1], atol=2e-2)


def test_an_idle_mesh_axis_is_an_error_and_dp_splits_the_batch_by_default():
    """A mesh axis nothing in the plan uses would make its ranks repeat one
    another's work: an error naming it and the config that would use it.
    An axis named dp splits the batch even when the plan does not mention it."""
    from ernie.models.llama import LlamaConfig, LlamaForCausalLM, parallelize_plan
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2)
    ids = np.zeros((4, 8), np.int64)
    mesh = dist.ProcessMesh([[0, 1], [2, 3]], ["dp", "mp"])
    with pytest.raises(ValueError, match=r"mesh axis 'mp' \(2 ranks\) is used by nothing in the "
                                         r"plan.*mp_config"):
        ernie.compile(LlamaForCausalLM(cfg), ernie.optimizer.SGD(0.1), [ids, ids], mesh=mesh,
                      config={"dp_config": {}})
    with pytest.raises(ValueError, match=r"mesh axis 'extra' \(2 ranks\).*shard_tensor"):
        ernie.compile(LlamaForCausalLM(cfg), ernie.optimizer.SGD(0.1), [ids, ids],
                      mesh=dist.ProcessMesh([[0, 1], [2, 3]], ["dp", "extra"]))
    # dp without dp_config, mp with its plan: the batch is split over dp.
    prog = ernie.compile(LlamaForCausalLM(cfg), ernie.optimizer.SGD(0.1), [ids, ids], mesh=mesh,
                         config={"mp_config": {"parallelize_plan": parallelize_plan()}},
                         abstract=True)
    assert "all_reduce[dp]" in prog.report()["collectives"]

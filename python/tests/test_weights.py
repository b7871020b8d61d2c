"""Weight files: safetensors through the runtime's C++ reader and writer,
checked against the `safetensors` package (an independent implementation),
and Hugging Face Llama folders in and out.

A Llama folder written in Hugging Face's layout by the `safetensors` package
loads into `LlamaForCausalLM.from_pretrained` and gives the logits of an
independent numpy forward written over Hugging Face's own names and [out, in]
Linears (f64: 1e-10 relative; f32: 1e-5, sums in another order);
`save_pretrained` round-trips the tensors bit for bit, f32 and bf16.
"""

import json

import numpy as np
import pytest

import ernie
from ernie import weights
from ernie.models.llama import LlamaConfig, LlamaForCausalLM

safetensors_numpy = pytest.importorskip("safetensors.numpy")


# ---------------------------------------------------------------------------
# safetensors files
# ---------------------------------------------------------------------------

def test_files_written_by_the_package_read_back(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"a": rng.normal(size=(3, 4)).astype(np.float32),
               "b": rng.normal(size=(5,)),
               "h": rng.normal(size=(2, 2)).astype(np.float16),
               "ids": rng.integers(-5, 5, size=(7,)),
               "mask": rng.normal(size=(4,)) > 0, "scalar": np.array(3.5, np.float32)}
    safetensors_numpy.save_file(tensors, str(tmp_path / "x.safetensors"), metadata={"k": "v"})
    got, metadata = weights.load_file(tmp_path / "x.safetensors")
    assert metadata == {"k": "v"}
    assert set(got) == set(tensors)
    for name, want in tensors.items():
        assert got[name].dtype == want.dtype, name
        np.testing.assert_array_equal(got[name], want, err_msg=name)


def test_files_ernie_writes_the_package_reads(tmp_path):
    rng = np.random.default_rng(1)
    tensors = {"w": rng.normal(size=(4, 3)).astype(np.float32), "ids": np.arange(6),
               "d": rng.normal(size=(2,))}
    weights.save_file(tensors, tmp_path / "y.safetensors", metadata={"format": "pt"})
    got = safetensors_numpy.load_file(str(tmp_path / "y.safetensors"))
    for name, want in tensors.items():
        np.testing.assert_array_equal(got[name], want, err_msg=name)


def test_bf16_and_fp8_are_rounded_exactly_and_stored_as_bits(tmp_path):
    x = np.array([1.0, 1.00390625, 1.005859375, -3.1e-3, 448.0], np.float32)
    weights.save_file({"x": x}, tmp_path / "b.safetensors", dtype="bf16")
    raw, _ = weights.load_file(tmp_path / "b.safetensors", raw=True)
    # bf16 is f32's upper 16 bits, rounded to nearest even.
    bits = x.view(np.uint32)
    want = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    np.testing.assert_array_equal(raw["x"], want)
    back, _ = weights.load_file(tmp_path / "b.safetensors")
    np.testing.assert_array_equal(back["x"], (want.astype(np.uint32) << 16).view(np.float32))
    assert weights.file_dtypes(tmp_path / "b.safetensors") == {"x": "bf16"}
    # The header says BF16, as the format's readers expect.
    header = (tmp_path / "b.safetensors").read_bytes()
    n = int.from_bytes(header[:8], "little")
    assert json.loads(header[8:8 + n])["x"]["dtype"] == "BF16"
    weights.save_file({"x": x}, tmp_path / "f8.safetensors", dtype="f8E4M3FN")
    assert weights.file_dtypes(tmp_path / "f8.safetensors") == {"x": "f8E4M3FN"}
    # e4m3fn codes worked out by hand: 1.0 = 0x38 (the two values just above
    # it round down to it), -3.1e-3 = -2 x 2^-9 (subnormal) = 0x82,
    # 448 (the largest finite) = 0x7e.
    codes, _ = weights.load_file(tmp_path / "f8.safetensors", raw=True)
    np.testing.assert_array_equal(codes["x"], np.array([0x38, 0x38, 0x38, 0x82, 0x7E], np.uint8))


@pytest.mark.parametrize("damage,message", [
    (lambda b: b[:-3], "outside the"),
    (lambda b: b + b"xyz", "bytes after the last tensor"),
    (lambda b: b"\xff" * 8 + b[8:], "does not fit the file"),
    (lambda b: b[:8] + b[8:12].replace(b"{", b"[") + b[12:], "the header: not valid JSON"),
])
def test_damaged_files_are_value_errors_naming_the_file(tmp_path, damage, message):
    path = tmp_path / "d.safetensors"
    safetensors_numpy.save_file({"w": np.ones((4, 4), np.float32)}, str(path))
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ValueError, match=message) as info:
        weights.load_file(path)
    assert str(path) in str(info.value)


# ---------------------------------------------------------------------------
# Hugging Face Llama folders
# ---------------------------------------------------------------------------

HF_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 40,
             "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
             "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu",
             "torch_dtype": "float32", "max_position_embeddings": 64}


def hf_weights(cfg, rng, dtype=np.float32):
    """Random weights under Hugging Face's names, Linears [out, in]."""
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * d
    w = {"model.embed_tokens.weight": rng.normal(size=(v, h)), "model.norm.weight": 1 + 0.1 * rng.normal(size=h)}
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = rng.normal(size=(v, h)) * 0.2
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w.update({p + "input_layernorm.weight": 1 + 0.1 * rng.normal(size=h),
                  p + "post_attention_layernorm.weight": 1 + 0.1 * rng.normal(size=h),
                  p + "self_attn.q_proj.weight": rng.normal(size=(h, h)) * 0.3,
                  p + "self_attn.k_proj.weight": rng.normal(size=(kv, h)) * 0.3,
                  p + "self_attn.v_proj.weight": rng.normal(size=(kv, h)) * 0.3,
                  p + "self_attn.o_proj.weight": rng.normal(size=(h, h)) * 0.3,
                  p + "mlp.gate_proj.weight": rng.normal(size=(inter, h)) * 0.3,
                  p + "mlp.up_proj.weight": rng.normal(size=(inter, h)) * 0.3,
                  p + "mlp.down_proj.weight": rng.normal(size=(h, inter)) * 0.3})
    return {k: np.asarray(a, dtype) for k, a in w.items()}


def hf_numpy_logits(w, cfg, ids):
    """Hugging Face's LlamaForCausalLM forward, in numpy, over its own names:
    x @ W.T for every Linear, rotate-half rope, grouped-query causal
    attention, SwiGLU."""
    h, heads, kvh = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d, eps = h // heads, cfg["rms_norm_eps"]

    def rms(x, g):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * g

    def rope(x):
        s = x.shape[1]
        inv = 1.0 / cfg["rope_theta"] ** (np.arange(0, d, 2) / d)
        freqs = np.outer(np.arange(s), inv)
        emb = np.concatenate([freqs, freqs], -1)
        cos, sin = np.cos(emb)[None, :, None], np.sin(emb)[None, :, None]
        half = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1)
        return x * cos + half * sin

    x = w["model.embed_tokens.weight"][ids]
    b, s, _ = x.shape
    for i in range(cfg["num_hidden_layers"]):
        p = lambda n: w[f"model.layers.{i}.{n}"]  # noqa: E731
        y = rms(x, p("input_layernorm.weight"))
        q = rope((y @ p("self_attn.q_proj.weight").T).reshape(b, s, heads, d))
        k = rope((y @ p("self_attn.k_proj.weight").T).reshape(b, s, kvh, d))
        v = (y @ p("self_attn.v_proj.weight").T).reshape(b, s, kvh, d)
        k, v = np.repeat(k, heads // kvh, 2), np.repeat(v, heads // kvh, 2)
        scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d)
        scores = np.where(np.tril(np.ones((s, s), bool)), scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        att = np.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, h)
        x = x + att @ p("self_attn.o_proj.weight").T
        y = rms(x, p("post_attention_layernorm.weight"))
        gate, up = y @ p("mlp.gate_proj.weight").T, y @ p("mlp.up_proj.weight").T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ p("mlp.down_proj.weight").T
    x = rms(x, w["model.norm.weight"])
    head = w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    return x @ head.T


def write_hf(folder, cfg, w):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    safetensors_numpy.save_file(w, str(folder / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("tied,fused", [(False, False), (True, False), (False, True)])
def test_from_pretrained_matches_a_numpy_hugging_face_forward(tmp_path, tied, fused):
    cfg = {**HF_CONFIG, "tie_word_embeddings": tied, "torch_dtype": "float64"}
    w = hf_weights(cfg, np.random.default_rng(3), np.float64)
    write_hf(tmp_path / "hf", cfg, w)
    model = LlamaForCausalLM.from_pretrained(tmp_path / "hf", fuse_attention_qkv=fused,
                                             fuse_attention_ffn=fused)
    assert model.config.dtype == "f64" and model.config.tie_word_embeddings == tied
    ids = np.random.default_rng(4).integers(0, cfg["vocab_size"], size=(2, 7))
    logits = ernie.compile(model, None, [ids], differentiate=False).forward(ids)
    want = hf_numpy_logits(w, cfg, ids)
    np.testing.assert_allclose(logits, want, rtol=1e-10, atol=1e-10)
    # Hugging Face's loss: labels = input_ids, position t against ids[t + 1].
    z = want[:, :-1] - want[:, :-1].max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    want_loss = -np.mean(np.take_along_axis(logp, ids[:, 1:, None], -1))
    loss = ernie.compile(model, None, [ids, ids], differentiate=False).eval(ids, ids)
    assert loss == pytest.approx(want_loss, rel=1e-10)


def test_save_pretrained_round_trips_bit_for_bit(tmp_path):
    w = hf_weights(HF_CONFIG, np.random.default_rng(5))
    write_hf(tmp_path / "hf", HF_CONFIG, w)
    model = LlamaForCausalLM.from_pretrained(tmp_path / "hf")
    model.save_pretrained(tmp_path / "out")
    back = safetensors_numpy.load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(back) == set(w)
    for name in w:
        assert back[name].dtype == np.float32
        np.testing.assert_array_equal(back[name], w[name], err_msg=name)
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    for key in ("vocab_size", "hidden_size", "num_key_value_heads", "rms_norm_eps", "torch_dtype"):
        assert saved[key] == HF_CONFIG[key], key
    # And loading what was saved gives the same model.
    again = LlamaForCausalLM.from_pretrained(tmp_path / "out")
    for (n, a), (_, b) in zip(model.named_parameters(), again.named_parameters()):
        np.testing.assert_array_equal(a.value, b.value, err_msg=n)


def test_bf16_folder_sharded_with_an_index_round_trips(tmp_path):
    """A bf16 model saved in shards (an index listing them), loaded back:
    every tensor's bits equal, and the f32 logits of an f32 load equal
    the numpy forward of the bf16-rounded weights."""
    w = hf_weights(HF_CONFIG, np.random.default_rng(6))
    write_hf(tmp_path / "hf", HF_CONFIG, w)
    model = LlamaForCausalLM.from_pretrained(tmp_path / "hf", dtype="bf16")
    model.save_pretrained(tmp_path / "bf16", max_shard_bytes=4000)
    index = json.loads((tmp_path / "bf16" / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and all(f.startswith("model-") for f in files)
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    reloaded = LlamaForCausalLM.from_pretrained(tmp_path / "bf16")
    assert reloaded.config.dtype == "bf16"
    for (n, a), (_, b) in zip(model.named_parameters(), reloaded.named_parameters()):
        np.testing.assert_array_equal(a.value, b.value, err_msg=n)
    reloaded.save_pretrained(tmp_path / "again", max_shard_bytes=4000)
    for f in files:
        first, _ = weights.load_file(tmp_path / "bf16" / f, raw=True)
        second, _ = weights.load_file(tmp_path / "again" / f, raw=True)
        for name in first:
            np.testing.assert_array_equal(first[name], second[name], err_msg=name)
    as_f32 = LlamaForCausalLM.from_pretrained(tmp_path / "bf16", dtype="f32")
    rounded = {n: v.astype(np.float64) for n, v in weights.read_hf_folder(tmp_path / "bf16")[1].items()}
    ids = np.random.default_rng(7).integers(0, HF_CONFIG["vocab_size"], size=(2, 5))
    logits = ernie.compile(as_f32, None, [ids], differentiate=False).forward(ids)
    np.testing.assert_allclose(logits, hf_numpy_logits(rounded, HF_CONFIG, ids), rtol=1e-4, atol=1e-4)


def test_bad_folders_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        LlamaForCausalLM.from_pretrained(tmp_path)
    w = hf_weights(HF_CONFIG, np.random.default_rng(8))
    missing = dict(w)
    del missing["model.layers.1.mlp.up_proj.weight"]
    write_hf(tmp_path / "missing", HF_CONFIG, missing)
    with pytest.raises(ValueError, match="missing: no tensor 'model.layers.1.mlp.up_proj.weight'"):
        LlamaForCausalLM.from_pretrained(tmp_path / "missing")
    write_hf(tmp_path / "extra", HF_CONFIG, {**w, "model.layers.0.self_attn.q_proj.bias": np.zeros(16, np.float32)})
    with pytest.raises(ValueError, match="no place for.*q_proj.bias"):
        LlamaForCausalLM.from_pretrained(tmp_path / "extra")
    write_hf(tmp_path / "scaled", {**HF_CONFIG, "rope_scaling": {"type": "yarn", "factor": 2.0}}, w)
    with pytest.raises(ValueError, match="rope_scaling"):
        LlamaForCausalLM.from_pretrained(tmp_path / "scaled")
    wrong = {**w, "model.norm.weight": np.ones(17, np.float32)}
    write_hf(tmp_path / "shape", HF_CONFIG, wrong)
    with pytest.raises(ValueError, match="tensor 'model.norm.weight' has shape \\[17\\], the "
                                         "config makes it \\[16\\]"):
        LlamaForCausalLM.from_pretrained(tmp_path / "shape")


# ---------------------------------------------------------------------------
# Loading a folder into a distributed program, rank by rank
# ---------------------------------------------------------------------------

def pretrained_program(folder, mesh_shape, names, abstract, zero=0, pp=False, **overrides):
    """A training program of the folder's Llama on a mesh: from the model
    read whole (eager), or from headers alone, each rank reading its own
    pieces (abstract)."""
    import contextlib
    import ernie.distributed as dist
    from ernie.models.llama import parallelize_plan
    with ernie.nn.abstract() if abstract else contextlib.nullcontext():
        model = LlamaForCausalLM.from_pretrained(folder, **overrides)
    assert (getattr(model, "pretrained_weights", None) is not None) == abstract
    mesh = dist.ProcessMesh(np.arange(int(np.prod(mesh_shape))).reshape(mesh_shape), names)
    config = {"mp_config": {"parallelize_plan": parallelize_plan(
        tie_word_embeddings=model.config.tie_word_embeddings)}}
    if "dp" in names:
        config["dp_config"] = {"sharding_level": zero}
    if pp:
        config["pp_config"] = {"split_spec": "llama.layers", "accumulate_steps": 2}
    ids = np.zeros((4, 6), np.int64)
    opt = ernie.optimizer.AdamW(1e-3, multi_precision=model.config.dtype == "bf16")
    return ernie.compile(model, opt, [ids, ids], mesh=mesh, config=config)


@pytest.mark.parametrize("mesh_shape,names,zero,pp,fused", [
    ([2], ["mp"], 0, False, False),
    ([2, 2], ["dp", "mp"], 3, False, True),
    ([2, 2], ["pp", "mp"], 0, True, False),
])
def test_a_folder_loads_rank_by_rank_as_the_whole_model_does(tmp_path, mesh_shape, names,
                                                             zero, pp, fused):
    """Every rank reading only its pieces (fused projections assembled from
    column blocks, Linears transposed on the way) gives the state, bit for
    bit, and so the losses of the program built from the model read whole;
    each rank read less than the whole folder."""
    cfg = {**HF_CONFIG, "tie_word_embeddings": fused}
    w = hf_weights(cfg, np.random.default_rng(11))
    write_hf(tmp_path / "hf", cfg, w)
    whole = pretrained_program(tmp_path / "hf", mesh_shape, names, False, zero, pp,
                               fuse_attention_qkv=fused, fuse_attention_ffn=fused)
    ranked = pretrained_program(tmp_path / "hf", mesh_shape, names, True, zero, pp,
                                fuse_attention_qkv=fused, fuse_attention_ffn=fused)
    want, got = whole.state_dict(), ranked.state_dict()
    assert set(want) == set(got)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    folder_bytes = sum(a.nbytes for a in w.values())
    ranks = int(np.prod(mesh_shape))
    # Every rank reads its pieces: more than one copy of the folder in all
    # (replicated norms, dp replicas), never the folder on every rank.
    assert folder_bytes < ranked.last_io["bytes"] < ranks * folder_bytes
    rng = np.random.default_rng(12)
    for _ in range(3):
        ids = rng.integers(0, cfg["vocab_size"], size=(4, 6))
        assert ranked.step(ids, ids) == whole.step(ids, ids)


def test_a_bf16_folder_loads_into_an_f32_program_and_master_weights(tmp_path):
    """bf16 tensors into f32 parameters: exact (bf16 values are f32 values).
    A bf16 program with f32 master weights gets its masters from the same
    pieces."""
    w = hf_weights(HF_CONFIG, np.random.default_rng(13))
    bf16 = {k: _bf16(v) for k, v in w.items()}
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**HF_CONFIG, "torch_dtype": "bfloat16"}))
    weights.save_file(w, tmp_path / "hf" / "model.safetensors", dtype="bf16")
    f32 = pretrained_program(tmp_path / "hf", [2], ["mp"], True, dtype="f32")
    state = f32.state_dict()
    mixed = pretrained_program(tmp_path / "hf", [2], ["mp"], True)
    mixed_state = mixed.state_dict()
    from ernie.models.llama import hf_state_from_ernie
    cfg = f32.model.config
    # state_dict gives bf16 parameters as their bits.
    params = {n: (v.astype(np.uint32) << 16).view(np.float32) if v.dtype == np.uint16 else v
              for n, v in mixed_state.items() if ":" not in n}
    assert any(v.dtype == np.uint16 for v in mixed_state.values())
    for source in (state, params):
        back = hf_state_from_ernie(source, cfg)
        for name in w:
            np.testing.assert_array_equal(np.asarray(back[name], np.float32), bf16[name],
                                          err_msg=name)
    masters = {n[:-len(":master")]: v for n, v in mixed_state.items() if n.endswith(":master")}
    assert masters and all(v.dtype == np.float32 for v in masters.values())
    for name, value in masters.items():
        np.testing.assert_array_equal(value, state[name], err_msg=name)


def _bf16(a):
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32)
    return (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def test_loading_weights_errors_name_the_file_and_tensor_and_change_nothing(tmp_path):
    w = hf_weights(HF_CONFIG, np.random.default_rng(14))
    write_hf(tmp_path / "hf", HF_CONFIG, w)
    prog = pretrained_program(tmp_path / "hf", [2], ["mp"], True)
    before = prog.state_dict()
    # Another model's folder.
    write_hf(tmp_path / "wider", {**HF_CONFIG, "intermediate_size": 32},
             hf_weights({**HF_CONFIG, "intermediate_size": 32}, np.random.default_rng(1)))
    with pytest.raises(ValueError, match="wider: config.json is another model: "
                                         "intermediate_size 32 \\(this model: 24\\)"):
        prog.load_pretrained(tmp_path / "wider")
    path = str(tmp_path / "hf" / "model.safetensors")
    name = "model.layers.0.self_attn.k_proj.weight"
    target = "llama.layers.0.self_attn.k_proj.weight"
    cases = [
        ({target: [(path, "nope", [0, 0], True)]}, "nope"),
        ({target: [(path, name, [0, 0], False)]}, name),      # [out, in] read as [in, out]
        ({target: [(path, name, [0, 0], True)] * 2}, "at the place of another"),
        ({target: [(path, name, [0, 4], True)]}, name),       # past the parameter's end
        ({"llama.no_such.weight": [(path, name, [0, 0], True)]}, "no state 'llama.no_such.weight'"),
        ({target: [(str(tmp_path / "absent.safetensors"), name, [0, 0], True)]}, "absent.safetensors"),
    ]
    # Pieces of the right total size that overlap (and leave a gap).
    parts = str(tmp_path / "parts.safetensors")
    safetensors_numpy.save_file({"a": np.ones(12, np.float32), "b": np.ones(4, np.float32)}, parts)
    cases.append(({"llama.layers.0.input_layernorm.weight": [(parts, "a", [0], False),
                                                            (parts, "b", [2], False)]},
                  "overlap or leave gaps"))
    good = {"llama.norm.weight": [(path, "model.norm.weight", [0], False)]}
    for bad, message in cases:
        with pytest.raises((ValueError, OSError), match=message):
            prog.load_weights({**good, **bad})
        after = prog.state_dict()
        for n in before:  # nothing loaded half-way: not even the good entry
            np.testing.assert_array_equal(after[n], before[n], err_msg=n)
    # A parameter left without a value is an error, not a silent draw.
    with ernie.nn.abstract():
        model = LlamaForCausalLM(LlamaConfig(**{k: HF_CONFIG[k] for k in (
            "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads")}))
    ids = np.zeros((2, 4), np.int64)
    with pytest.raises(ValueError, match="have no values.*abstract=True"):
        ernie.compile(model, None, [ids], differentiate=False)


def test_transformers_reads_what_save_pretrained_writes(tmp_path):
    """Optional: with `transformers` and `torch` installed, Hugging Face's
    own from_pretrained reads a folder save_pretrained wrote (sharded, with
    an index) and gives the logits of ernie's model (f64, 1e-6 relative)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=24,
                                         num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, dtype="f64", seed=9))
    model.save_pretrained(tmp_path / "hf", max_shard_bytes=8000)
    ids = np.random.default_rng(15).integers(0, 40, size=(2, 7))
    ours = ernie.compile(model, None, [ids], differentiate=False).forward(ids)
    hf = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path / "hf")).double().eval()
    with torch.no_grad():
        want = hf(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(ours, want, rtol=1e-6, atol=1e-9)


def test_save_pretrained_writes_back_every_config_field_it_read(tmp_path):
    """Fields ernie does not compute (the context length, the token ids, a
    field it has never heard of) come back unchanged, for both families."""
    from ernie.models.ernie4_5 import Ernie4_5Config, Ernie4_5_MoeForCausalLM
    extra = {"max_position_embeddings": 4096, "bos_token_id": 1, "eos_token_id": [2, 7],
             "pad_token_id": 0, "transformers_version": "4.57.0", "my_field": {"a": [1, 2]}}
    w = hf_weights(HF_CONFIG, np.random.default_rng(6))
    write_hf(tmp_path / "hf", {**HF_CONFIG, **extra}, w)
    LlamaForCausalLM.from_pretrained(tmp_path / "hf").save_pretrained(tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert {k: saved[k] for k in extra} == extra
    assert saved["vocab_size"] == HF_CONFIG["vocab_size"]

    moe = Ernie4_5_MoeForCausalLM(Ernie4_5Config(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, moe_num_experts=4, moe_k=2,
        moe_intermediate_size=8, moe_layer_start_index=1))
    moe.save_pretrained(tmp_path / "moe")
    config = json.loads((tmp_path / "moe" / "config.json").read_text())
    (tmp_path / "moe" / "config.json").write_text(json.dumps({**config, **extra}))
    Ernie4_5_MoeForCausalLM.from_pretrained(tmp_path / "moe").save_pretrained(tmp_path / "moe2")
    again = json.loads((tmp_path / "moe2" / "config.json").read_text())
    assert {k: again[k] for k in extra} == extra
    assert again["moe_num_experts"] == 4


def test_auto_classes_pick_the_family_from_config_json(tmp_path):
    """As transformers does: by model_type, else by architectures; an
    unknown type is an error listing the families ernie has."""
    from ernie.models import AutoConfig, AutoModelForCausalLM
    from ernie.models.ernie4_5 import (Ernie4_5Config, Ernie4_5ForCausalLM,
                                       Ernie4_5_MoeForCausalLM)
    w = hf_weights(HF_CONFIG, np.random.default_rng(7))
    write_hf(tmp_path / "llama", HF_CONFIG, w)
    llama = AutoModelForCausalLM.from_pretrained(tmp_path / "llama")
    assert type(llama) is LlamaForCausalLM and llama.config.vocab_size == HF_CONFIG["vocab_size"]
    assert isinstance(AutoConfig.from_pretrained(tmp_path / "llama"), LlamaConfig)

    small = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1)
    Ernie4_5ForCausalLM(Ernie4_5Config(**small)).save_pretrained(tmp_path / "dense")
    Ernie4_5_MoeForCausalLM(Ernie4_5Config(**small, moe_num_experts=4, moe_k=2,
                                           moe_intermediate_size=8, moe_layer_start_index=1)
                            ).save_pretrained(tmp_path / "moe")
    assert type(AutoModelForCausalLM.from_pretrained(tmp_path / "dense")) is Ernie4_5ForCausalLM
    moe = AutoModelForCausalLM.from_pretrained(tmp_path / "moe")
    assert type(moe) is Ernie4_5_MoeForCausalLM and moe.config.moe_num_experts == 4

    # No model_type: the architectures name the family.
    config = json.loads((tmp_path / "llama" / "config.json").read_text())
    del config["model_type"]
    (tmp_path / "llama" / "config.json").write_text(json.dumps(config))
    assert type(AutoModelForCausalLM.from_pretrained(tmp_path / "llama")) is LlamaForCausalLM

    config.update(model_type="qwen9", architectures=["Qwen9ForCausalLM"])
    (tmp_path / "llama" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"model_type 'qwen9'.*not a family ernie has; it has "
                                         r"deepseek_v3, ernie4_5, ernie4_5_moe, llama"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "llama")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        AutoConfig.from_pretrained(tmp_path / "nowhere")

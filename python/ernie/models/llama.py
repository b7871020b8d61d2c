"""Llama (the Hugging Face architecture), named for Paddle's Llama plan.

RMSNorm, rotary position embedding, grouped-query causal attention, a
SwiGLU MLP, an optional LM head tied to the embedding. Parameter names:
`llama.embed_tokens.weight`, `llama.layers.{i}.input_layernorm.weight`,
`llama.layers.{i}.self_attn.{q,k,v,o}_proj.weight`,
`llama.layers.{i}.post_attention_layernorm.weight`,
`llama.layers.{i}.mlp.{gate,up,down}_proj.weight`, `llama.norm.weight`,
`lm_head.weight`. Linear weights are [in, out] (Paddle's layout).

PaddleNLP's `fuse_attention_qkv` / `fuse_attention_ffn` fuse the
projections into `self_attn.qkv_proj` ([hidden, (heads + 2 * kv_heads) *
head_dim]) and `mlp.gate_up_proj` ([hidden, 2 * intermediate]): one GEMM
instead of three or two, but a column split over mp then cuts across the
q/k/v (gate/up) boundaries and the plan must reshard around the split
(Megatron lays fused weights out per rank instead). Separate projections
are the default, as in Paddle and Hugging Face.

Hugging Face folders: `LlamaForCausalLM.from_pretrained(folder)` reads
config.json and model.safetensors (or the shards an index lists) through the
runtime's safetensors reader, Hugging Face's [out, in] Linears transposed
to ernie's [in, out]; `save_pretrained(folder)` writes the same layout back
(`ernie.weights`). One table, `hf_layout`, says where each Hugging Face
tensor goes; built under `ernie.nn.abstract()`, `from_pretrained` reads
headers only and the compiled program loads the folder rank by rank
(`hf_weight_map`, `Program.load_weights`).

`LlamaForCausalLM(input_ids, labels)` returns the mean cross-entropy of the
logits against `labels`, which the data pipeline has already shifted by one
(Paddle's pretraining criterion); without labels it returns the logits.

Pipeline parallelism: `pp_config = {"split_spec": "llama.layers"}` divides
the decoder layers evenly among the pp * vpp_degree chunks (the embedding
goes with the first, the final norm, LM head and loss with the last; a tied
LM head reads the embedding's weight on the last stage, and the compiler
keeps one replica per stage). `LlamaForCausalLMPipe` is the same model as
a `PipelineLayer` (PaddleNLP's LlamaForCausalLMPipe): built with the same
seed it has the same values, under names `shared_layers.embed_tokens.weight`
(tied; else `0.weight` and the head's `<L + 2>.weight`), `<i + 1>.*` for
decoder layer i and `<L + 1>.weight` for the final norm.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _ernie
from .. import distributed as dist
from .. import functional as F
from ..nn import Embedding, LayerList, Linear, Module, RMSNorm
from ..pipeline import LayerDesc, PipelineLayer, SharedLayerDesc
from ..weights import TORCH_DTYPES, hf_folder_index, read_hf_folder, write_hf_folder
from .config_checks import check_counts, check_finite, check_size


@dataclass
class LlamaConfig:
    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    fuse_attention_qkv: bool = False
    fuse_attention_ffn: bool = False
    initializer_range: float = 0.02
    dtype: str = "f32"
    seed: int = 0

    @property
    def head_dim(self):
        return self.hidden_size // self.num_attention_heads

    def __post_init__(self):
        check_counts(self, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "num_key_value_heads"))
        check_finite(self, ("rms_norm_eps", "rope_theta"), positive=True)
        check_finite(self, ("initializer_range",), minimum=0.0)
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        h, d = self.hidden_size, self.head_dim
        attention = h * (self.num_attention_heads + 2 * self.num_key_value_heads) * d + \
            self.num_attention_heads * d * h
        layer = attention + 3 * h * self.intermediate_size + 2 * h
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        check_size(self, self.num_hidden_layers, self.num_hidden_layers * layer + embeddings + h)


def _linear(cfg, rng, n_in, n_out):
    layer = Linear(n_in, n_out, bias=False, dtype=cfg.dtype, rng=rng)
    if layer.weight.value is not None:  # abstract models have no values
        layer.weight.value = rng.normal(0, cfg.initializer_range, size=(n_in, n_out)).astype(
            layer.weight.value.dtype)
    return layer


class LlamaAttention(Module):
    def __init__(self, cfg: LlamaConfig, rng):
        super().__init__()
        self.cfg = cfg
        hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        if cfg.fuse_attention_qkv:
            self.qkv_proj = _linear(cfg, rng, cfg.hidden_size, (hq + 2 * hkv) * d)
        else:
            self.q_proj = _linear(cfg, rng, cfg.hidden_size, hq * d)
            self.k_proj = _linear(cfg, rng, cfg.hidden_size, hkv * d)
            self.v_proj = _linear(cfg, rng, cfg.hidden_size, hkv * d)
        self.o_proj = _linear(cfg, rng, hq * d, cfg.hidden_size)

    def forward(self, x, positions):
        cfg = self.cfg
        b, s, _ = x.shape
        hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        if cfg.fuse_attention_qkv:
            q, k, v = F.split(self.qkv_proj(x), [hq * d, hkv * d, hkv * d], axis=2)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = F.rope(q.reshape(b, s, hq, d), positions, cfg.rope_theta)
        k = F.rope(k.reshape(b, s, hkv, d), positions, cfg.rope_theta)
        out = F.attention(q, k, v.reshape(b, s, hkv, d), causal=True)
        return self.o_proj(out.reshape(b, s, hq * d))


class LlamaMLP(Module):
    def __init__(self, cfg: LlamaConfig, rng):
        super().__init__()
        self.fused = cfg.fuse_attention_ffn
        if self.fused:
            self.gate_up_proj = _linear(cfg, rng, cfg.hidden_size, 2 * cfg.intermediate_size)
        else:
            self.gate_proj = _linear(cfg, rng, cfg.hidden_size, cfg.intermediate_size)
            self.up_proj = _linear(cfg, rng, cfg.hidden_size, cfg.intermediate_size)
        self.down_proj = _linear(cfg, rng, cfg.intermediate_size, cfg.hidden_size)
        self.intermediate = cfg.intermediate_size

    def forward(self, x):
        if self.fused:
            gate, up = F.split(self.gate_up_proj(x), [self.intermediate, self.intermediate], axis=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)


class LlamaDecoderLayer(Module):
    def __init__(self, cfg: LlamaConfig, rng):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype)
        self.self_attn = LlamaAttention(cfg, rng)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype)
        self.mlp = LlamaMLP(cfg, rng)

    def forward(self, x, positions):
        x = x + self.self_attn(self.input_layernorm(x), positions)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(Module):
    def __init__(self, cfg: LlamaConfig, rng):
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, cfg.dtype, rng,
                                      std=cfg.initializer_range)
        self.layers = LayerList(LlamaDecoderLayer(cfg, rng) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        positions = F.iota([input_ids.shape[1]], 0, "i64")
        for layer in self.layers:
            x = layer(x, positions)
        return self.norm(x)


class LlamaForCausalLM(Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        rng = np.random.default_rng(cfg.seed)
        self.config = cfg
        self.llama = LlamaModel(cfg, rng)
        if not cfg.tie_word_embeddings:
            self.lm_head = _linear(cfg, rng, cfg.hidden_size, cfg.vocab_size)

    @classmethod
    def from_pretrained(cls, folder, dtype=None, **overrides):
        """The model of a Hugging Face folder (config.json and
        model.safetensors, or shards with model.safetensors.index.json):
        Hugging Face's names and [out, in] Linears mapped onto ernie's
        [in, out] ones (hf_layout; fused projections where the config asks
        for them). `dtype` ("f32", "bf16", ...) defaults to the file's
        torch_dtype; narrow floats are read exactly. `overrides` set other
        LlamaConfig fields (fuse_attention_qkv, ...).

        Built under `ernie.nn.abstract()` nothing is read but the headers:
        the model remembers the folder (`pretrained_weights`) and
        `ernie.compile` loads it into the program, each rank reading only
        its own pieces of each tensor."""
        hf, _ = hf_folder_index(folder)
        cfg = LlamaConfig(**{**config_from_hf(hf, dtype), **overrides})
        model = cls(cfg)
        # Every field read, for save_pretrained to write back (what ernie
        # does not compute: max_position_embeddings, token ids, ...).
        object.__setattr__(model, "hf_config", dict(hf))
        params = dict(model.named_parameters())
        if all(p.value is None for p in params.values()):  # abstract
            object.__setattr__(model, "pretrained_weights", hf_weight_map(folder, cfg))
            return model
        _, weights, _ = read_hf_folder(folder)
        state = ernie_state_from_hf(weights, cfg, where=folder)
        for name, p in params.items():
            p.value = _rounded(state[name], cfg.dtype).astype(p.value.dtype)
        return model

    def hf_weight_map(self, folder):
        """The weight map (Program.load_weights) of a Hugging Face folder for
        this model, whose config must be the folder's (dtype and fusion
        aside)."""
        hf, _ = hf_folder_index(folder)
        theirs = config_from_hf(hf, self.config.dtype)
        differ = {k: (getattr(self.config, k), v) for k, v in theirs.items()
                  if k != "dtype" and getattr(self.config, k) != v}
        if differ:
            raise ValueError(f"{folder}: config.json is another model: " + ", ".join(
                f"{k} {theirs_v!r} (this model: {ours!r})"
                for k, (ours, theirs_v) in sorted(differ.items())))
        return hf_weight_map(folder, self.config)

    def save_pretrained(self, folder, dtype=None, max_shard_bytes=None, state=None):
        """Writes the model as a Hugging Face folder (config.json,
        model.safetensors or shards past `max_shard_bytes`) in `dtype`
        (default: the model's). `state` (a program's state_dict()) writes
        trained values instead of the model's initial ones. A model read by
        from_pretrained writes back every config field it read (those ernie
        does not use unchanged)."""
        cfg = self.config
        dtype = dtype or cfg.dtype
        values = {n: p.value for n, p in self.named_parameters()}
        if state is not None:
            values.update({n: state[n] for n in values if n in state})
        config = {**getattr(self, "hf_config", {}), **config_to_hf(cfg, dtype)}
        write_hf_folder(folder, config, hf_state_from_ernie(values, cfg), dtype, max_shard_bytes)

    def forward(self, input_ids, labels=None):
        h = self.llama(input_ids)
        if self.config.tie_word_embeddings:
            logits = _tied_head(self.llama.embed_tokens, h)
        else:
            logits = self.lm_head(h)
        if labels is None:
            return logits
        return F.cross_entropy(logits, labels)


# ---------------------------------------------------------------------------
# Hugging Face's LlamaForCausalLM: config.json and weight names.
# ---------------------------------------------------------------------------

_HF_CONFIG_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                   "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_theta",
                   "tie_word_embeddings")


def _rounded(value, dtype):
    """`value` rounded to `dtype` when that is a narrow float (the values a
    bf16 parameter holds are bf16 numbers, kept in f32 arrays)."""
    if dtype not in ("bf16", "f8E4M3FN", "f8E5M2"):
        return value
    x = np.ascontiguousarray(value, dtype=np.float32)
    return _ernie.convert_float(_ernie.convert_float(x, "f32", dtype), dtype, "f32").reshape(x.shape)


def config_from_hf(hf: dict, dtype=None) -> dict:
    """LlamaConfig fields from a Hugging Face config.json; what ernie's Llama
    does not compute (biases, rope scaling, another activation or head
    size) is a ValueError rather than a silently different model."""
    arch = hf.get("architectures") or ["LlamaForCausalLM"]
    if "LlamaForCausalLM" not in arch and hf.get("model_type") != "llama":
        raise ValueError(f"config.json describes {arch}, not LlamaForCausalLM")
    for key, want in (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False),
                      ("rope_scaling", None)):
        if hf.get(key, want) != want:
            raise ValueError(f"config.json: {key} = {hf[key]!r} is not supported (ernie's "
                             f"Llama has {want!r})")
    fields = {k: hf[k] for k in _HF_CONFIG_KEYS if k in hf}
    fields.setdefault("num_key_value_heads", hf.get("num_attention_heads"))
    heads = fields.get("num_attention_heads")
    if "head_dim" in hf and heads and hf["head_dim"] * heads != fields.get("hidden_size"):
        raise ValueError(f"config.json: head_dim {hf['head_dim']} x {heads} heads is not "
                         f"hidden_size {fields.get('hidden_size')}")
    if dtype is None:
        torch_dtype = hf.get("torch_dtype", "float32")
        if torch_dtype not in TORCH_DTYPES:
            raise ValueError(f"config.json: torch_dtype {torch_dtype!r} is not one of "
                             f"{sorted(TORCH_DTYPES)}")
        dtype = TORCH_DTYPES[torch_dtype]
    fields["dtype"] = dtype
    return fields


def config_to_hf(cfg: LlamaConfig, dtype: str) -> dict:
    torch_dtype = {v: k for k, v in TORCH_DTYPES.items()}[dtype]
    out = {k: getattr(cfg, k) for k in _HF_CONFIG_KEYS}
    out.update(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
               attention_bias=False, mlp_bias=False, head_dim=cfg.head_dim,
               torch_dtype=torch_dtype, rope_scaling=None)
    return out


def hf_layout(cfg: LlamaConfig) -> list:
    """Where each of Hugging Face's tensors goes, in Hugging Face's order:
    (ernie parameter, Hugging Face name, offsets in the parameter, the
    block's shape in the parameter, transposed). Linears are Hugging Face's
    [out, in], ernie's [in, out] (transposed); fused q/k/v and gate/up are
    blocks at column offsets of one parameter; a tied LM head has no
    tensor of its own. The one mapping the readers, the writer and the
    distributed loader (hf_weight_map) share."""
    h, hq, hkv, d, inter = (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                            cfg.head_dim, cfg.intermediate_size)
    out = [("llama.embed_tokens.weight", "model.embed_tokens.weight", (0, 0),
            (cfg.vocab_size, h), False)]

    def linears(dst, fused, parts):
        # parts: (Hugging Face name, out features); fused: one parameter.
        column = 0
        for hf, n_out in parts:
            name = dst + (fused if fused else hf.rsplit(".", 1)[-1]) + ".weight"
            out.append((name, hf + ".weight", (0, column if fused else 0), (h, n_out), True))
            column += n_out if fused else 0

    for i in range(cfg.num_hidden_layers):
        src, dst = f"model.layers.{i}.", f"llama.layers.{i}."
        out.append((dst + "input_layernorm.weight", src + "input_layernorm.weight", (0,), (h,),
                    False))
        linears(dst + "self_attn.", "qkv_proj" if cfg.fuse_attention_qkv else None,
                [(src + f"self_attn.{n}_proj", width) for n, width in
                 (("q", hq * d), ("k", hkv * d), ("v", hkv * d))])
        out.append((dst + "self_attn.o_proj.weight", src + "self_attn.o_proj.weight", (0, 0),
                    (hq * d, h), True))
        linears(dst + "mlp.", "gate_up_proj" if cfg.fuse_attention_ffn else None,
                [(src + f"mlp.{n}_proj", inter) for n in ("gate", "up")])
        out.append((dst + "mlp.down_proj.weight", src + "mlp.down_proj.weight", (0, 0),
                    (inter, h), True))
        out.append((dst + "post_attention_layernorm.weight",
                    src + "post_attention_layernorm.weight", (0,), (h,), False))
    out.append(("llama.norm.weight", "model.norm.weight", (0,), (h,), False))
    if not cfg.tie_word_embeddings:
        out.append(("lm_head.weight", "lm_head.weight", (0, 0), (h, cfg.vocab_size), True))
    return out


def _hf_leftovers(names, cfg: LlamaConfig, where):
    """Raises for Hugging Face tensors ernie's Llama has no place for
    (besides rotary caches, recomputed, and a tied head's copy)."""
    placed = {hf for _, hf, _, _, _ in hf_layout(cfg)}
    leftover = sorted(n for n in names if n not in placed
                      and not n.endswith("rotary_emb.inv_freq")
                      and not (cfg.tie_word_embeddings and n == "lm_head.weight"))
    if leftover:
        raise ValueError(f"{where}: weights ernie's Llama has no place for: {leftover[:5]}")


def _check_block_shape(where, hf, shape, block, transposed):
    want = tuple(reversed(block)) if transposed else tuple(block)
    if tuple(shape) != want:
        raise ValueError(f"{where}: tensor '{hf}' has shape {list(shape)}, the config makes "
                         f"it {list(want)}")


def ernie_state_from_hf(weights: dict, cfg: LlamaConfig, where="weights") -> dict:
    """ernie's parameters from Hugging Face's tensors (hf_layout)."""
    _hf_leftovers(weights, cfg, where)
    out = {}
    for name, hf, offsets, block, transposed in hf_layout(cfg):
        if hf not in weights:
            raise ValueError(f"{where}: no tensor '{hf}' (for ernie's '{name}')")
        value = np.asarray(weights[hf])
        _check_block_shape(where, hf, value.shape, block, transposed)
        out.setdefault(name, []).append((offsets, value.T if transposed else value))
    for name, blocks in out.items():
        if len(blocks) == 1:
            out[name] = blocks[0][1]
            continue
        shape = tuple(max(off[k] + v.shape[k] for off, v in blocks)
                      for k in range(blocks[0][1].ndim))
        whole = np.empty(shape, dtype=blocks[0][1].dtype)
        for off, v in blocks:
            whole[tuple(slice(o, o + n) for o, n in zip(off, v.shape))] = v
        out[name] = whole
    return out


def hf_state_from_ernie(values: dict, cfg: LlamaConfig) -> dict:
    """The inverse of ernie_state_from_hf, in Hugging Face's order."""
    out = {}
    for name, hf, offsets, block, transposed in hf_layout(cfg):
        value = np.asarray(values[name])[tuple(slice(o, o + n) for o, n in zip(offsets, block))]
        out[hf] = np.ascontiguousarray(value.T if transposed else value)
    return out


def hf_weight_map(folder, cfg: LlamaConfig) -> dict:
    """{ernie parameter: [(file, tensor, offsets, transposed)]} of a Hugging
    Face folder, from its index and headers alone (Program.load_weights
    reads each rank's pieces). Shapes are checked against `cfg`."""
    _, index = hf_folder_index(folder)
    _hf_leftovers(index, cfg, folder)
    out = {}
    for name, hf, offsets, block, transposed in hf_layout(cfg):
        if hf not in index:
            raise ValueError(f"{folder}: no tensor '{hf}' (for ernie's '{name}')")
        path, _, shape = index[hf]
        _check_block_shape(path, hf, shape, block, transposed)
        out.setdefault(name, []).append((path, hf, offsets, transposed))
    return out


class LlamaDecoderLayerPipe(LlamaDecoderLayer):
    """A decoder layer on the hidden states alone (a PipelineLayer entry):
    the rotary positions are rebuilt from the sequence length."""

    def forward(self, x):
        return super().forward(x, F.iota([x.shape[1]], 0, "i64"))


def _tied_head(embedding, h):
    return F.matmul(h, embedding.p("weight"), transpose_b=True)


def _causal_lm_loss(logits, labels):
    return F.cross_entropy(logits, labels)


class LlamaForCausalLMPipe(PipelineLayer):
    """LlamaForCausalLM as a PipelineLayer: embedding, decoder layers, norm,
    LM head (with tie_word_embeddings a SharedLayerDesc of the embedding),
    the loss. forward(input_ids, labels) returns the loss. Segmented by
    decoder layers (seg_method "layer:LlamaDecoderLayer"): each chunk has
    the same number of them."""

    def __init__(self, cfg: LlamaConfig, num_stages=None, num_virtual_pipeline_stages=1,
                 seg_method="layer:LlamaDecoderLayer"):
        rng = np.random.default_rng(cfg.seed)  # the same draws, in the same order
        embed = (cfg.vocab_size, cfg.hidden_size, cfg.dtype, rng)
        if cfg.tie_word_embeddings:
            descs = [SharedLayerDesc("embed_tokens", Embedding, None, "weight", *embed,
                                     std=cfg.initializer_range)]
        else:
            descs = [LayerDesc(Embedding, *embed, std=cfg.initializer_range)]
        descs += [LayerDesc(LlamaDecoderLayerPipe, cfg, rng) for _ in range(cfg.num_hidden_layers)]
        descs.append(LayerDesc(RMSNorm, cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype))
        if cfg.tie_word_embeddings:
            descs.append(SharedLayerDesc("embed_tokens", Embedding, _tied_head, "weight", *embed))
        else:
            descs.append(LayerDesc(_linear, cfg, rng, cfg.hidden_size, cfg.vocab_size))
        super().__init__(descs, num_stages, loss_fn=_causal_lm_loss, seg_method=seg_method,
                         num_virtual_pipeline_stages=num_virtual_pipeline_stages)
        self.config = cfg

    def parallelize_plan(self, sequence_parallel: bool = False) -> dict:
        """The module-level parallelize_plan() over this model's names: the
        embedding is layer 0 (tied: the shared layer "embed_tokens"), the
        decoder layers 1..L, the norm L + 1 and an untied head L + 2."""
        n = self.config.num_hidden_layers
        tied = self.config.tie_word_embeddings
        return _plan("shared_layers.embed_tokens" if tied else "0", "[1-9][0-9]*", str(n + 1),
                     None if tied else str(n + 2), sequence_parallel)


def parallelize_plan(sequence_parallel: bool = False, tie_word_embeddings: bool = False) -> dict:
    """Paddle's tensor-parallel plan for Llama (`mp_config.parallelize_plan`):
    Megatron's column/row pairs for attention and MLP, the embedding and LM
    head split on the hidden/vocabulary dimension; with sequence_parallel,
    activations between layers (the residual stream and the norms) stay
    split along the sequence. With tie_word_embeddings there is no lm_head:
    the head reads the embedding's (hidden-split) weight. For
    LlamaForCausalLMPipe's layer names use its own parallelize_plan()."""
    return _plan("llama.embed_tokens", "llama.layers.*", "llama.norm",
                 None if tie_word_embeddings else "lm_head", sequence_parallel)


def _plan(embed: str, layers: str, norm: str, head: str | None,
          sequence_parallel: bool) -> dict:
    """The Llama plan over the given sub-layer names (regexes; `layers`
    matches every decoder layer)."""
    plan = {
        embed: dist.ColWiseParallel(),
        f"{layers}.self_attn.(q|k|v|qkv)_proj": dist.ColWiseParallel(),
        f"{layers}.self_attn.o_proj": dist.RowWiseParallel(),
        f"{layers}.mlp.(gate|up|gate_up)_proj": dist.ColWiseParallel(),
        f"{layers}.mlp.down_proj": dist.RowWiseParallel(),
    }
    if head is not None:
        plan[head] = dist.ColWiseParallel()
    if sequence_parallel:
        plan.update({
            embed: [dist.ColWiseParallel(), dist.SequenceParallelBegin()],
            f"{layers}.(input|post_attention)_layernorm": dist.SequenceParallelEnable(),
            f"{layers}.self_attn": dist.SequenceParallelDisable(),
            f"{layers}.mlp": dist.SequenceParallelDisable(),
            norm: dist.SequenceParallelEnd(),
        })
    return plan

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

from .. import functional as F
from ..nn import Embedding, LayerList, Linear, Module, RMSNorm
from ..pipeline import LayerDesc, PipelineLayer, SharedLayerDesc


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
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")


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

    def forward(self, input_ids, labels=None):
        h = self.llama(input_ids)
        if self.config.tie_word_embeddings:
            logits = F.matmul(h, self.llama.embed_tokens.p("weight"), transpose_b=True)
        else:
            logits = self.lm_head(h)
        if labels is None:
            return logits
        return F.cross_entropy(logits, labels)


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
    from .. import distributed as dist
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

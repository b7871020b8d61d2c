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
logits against `labels`; without labels it returns the logits. Labels are
Hugging Face's: `labels = input_ids`, shifted inside the model (position t
is scored against labels[t + 1], the last position against nothing), `-100`
ignored, the mean taken over the targets not ignored. Labels the data
pipeline already shifted (Paddle's and Megatron's pretraining criterion:
`labels[t]` is position t's target) need `pre_shifted_labels=True` in the
config; without it they would give a plausible but wrong loss.

Pipeline parallelism: `pp_config = {"split_spec": "llama.layers"}` divides
the decoder layers evenly among the pp * vpp_degree chunks (the embedding
goes with the first, the final norm, LM head and loss with the last; a tied
LM head reads the embedding's weight on the last stage, and the compiler
keeps one replica per stage). `LlamaForCausalLMPipe` is the same model as
a `PipelineLayer` (PaddleNLP's LlamaForCausalLMPipe): built with the same
seed it has the same values, under names `shared_layers.embed_tokens.weight`
(tied; else `0.weight` and the head's `<L + 2>.weight`), `<i + 1>.*` for
decoder layer i and `<L + 1>.weight` for the final norm.

The same code is the Qwen2 and Qwen3 families (ernie.models.qwen2,
ernie.models.qwen3): a family is a LlamaConfig subclass (its defaults, its
Hugging Face names, `base_model_prefix` for its parameter names) and a
LlamaForCausalLM subclass naming it. The config's flags are the
differences: `qkv_bias` (Qwen2), `qk_norm` and an explicit `head_dim`
(Qwen3).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .. import _ernie
from .. import distributed as dist
from .. import functional as F
from ..moe import MoELayer
from ..nn import Embedding, LayerList, Linear, Module, RMSNorm, abstract
from ..pipeline import LayerDesc, PipelineLayer, SharedLayerDesc
from ..weights import (TORCH_DTYPES, folder_weight_map, fused_folder_states, hf_folder_index,
                       is_fused, read_hf_folder, write_hf_folder)
from ..weights import hf_layout as weights_layout
from . import rope_scaling
from .config_checks import check_counts, check_finite, check_size


@dataclass
class LlamaConfig:
    """The decoder the Llama-shaped families share (Llama, Qwen2, Qwen3).

    The families differ by flags of one mechanism: `qkv_bias` (biases on
    the q/k/v projections, Qwen2's), `qk_norm` (an RMSNorm over head_dim of
    each query and key head before rope, Qwen3's) and an explicit
    `head_dim` (None: hidden_size // num_attention_heads). A family is a
    subclass with its own defaults and the class-level names below."""

    # The family: Hugging Face's model_type and class, ernie's name for it
    # in messages and the prefix of its parameter names (Paddle's:
    # `llama.layers.0.self_attn.q_proj.weight`).
    model_type: ClassVar[str] = "llama"
    architecture: ClassVar[str] = "LlamaForCausalLM"
    family: ClassVar[str] = "Llama"
    base_model_prefix: ClassVar[str] = "llama"
    # config.json fields that would make another model: (field, the value
    # ernie's family computes); anything else is refused naming the field.
    hf_fixed: ClassVar[tuple] = (("hidden_act", "silu"), ("attention_bias", False),
                                 ("mlp_bias", False))
    # config.json fields Hugging Face defaults otherwise than this class.
    hf_defaults: ClassVar[dict] = {}
    # The family's config.json fields beyond Llama's (read and written
    # under the same names), and other names Hugging Face writes them as.
    hf_keys: ClassVar[tuple] = ()
    hf_aliases: ClassVar[dict] = {}
    # Flags of the shared decoder the family fixes (Qwen2: q/k/v biases,
    # Qwen3: q/k norms; only Mistral's families have a sliding window).
    family_flags: ClassVar[dict] = {"sliding_window": None}

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
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    qkv_bias: bool = False
    qk_norm: bool = False
    # Hugging Face's rotary scaling ({"rope_type": "llama3" or "linear",
    # ...}, models.rope_scaling); None: the default rotary embedding.
    rope_scaling: dict | None = None
    # Sliding-window attention (Mistral's): each query sees the last
    # `sliding_window` keys, itself included; None: every earlier key.
    sliding_window: int | None = None
    # How the loss reads its labels, not a property of the weights (never
    # in config.json): False, Hugging Face's labels = input_ids shifted in
    # the model; True, labels already shifted by the data (Paddle's).
    pre_shifted_labels: bool = False

    def __post_init__(self):
        check_counts(self, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "num_key_value_heads"))
        check_finite(self, ("rms_norm_eps", "rope_theta"), positive=True)
        check_finite(self, ("initializer_range",), minimum=0.0)
        for name in ("qkv_bias", "qk_norm", "pre_shifted_labels"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{type(self).__name__}.{name} must be true or false, got "
                                f"{getattr(self, name)!r}")
        for name, want in self.family_flags.items():
            if getattr(self, name) != want:
                raise ValueError(f"{type(self).__name__}: {self.family} has {name} = {want!r}, "
                                 f"not {getattr(self, name)!r}")
        if self.sliding_window is not None:
            check_counts(self, ("sliding_window",))
        if self.rope_scaling is not None:
            self.rope_scaling = rope_scaling.checked(dict(self.rope_scaling),
                                                     f"{type(self).__name__}.rope_scaling")
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError("hidden_size must be a multiple of num_attention_heads "
                                 "(or give head_dim)")
            self.head_dim = self.hidden_size // self.num_attention_heads
        check_counts(self, ("head_dim",))
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        h, d = self.hidden_size, self.head_dim
        qkv = (self.num_attention_heads + 2 * self.num_key_value_heads) * d
        attention = h * qkv + self.num_attention_heads * d * h + \
            (qkv if self.qkv_bias else 0) + (2 * d if self.qk_norm else 0)
        layer = attention + 3 * h * self.intermediate_size + 2 * h
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        check_size(self, self.num_hidden_layers, self.num_hidden_layers * layer + embeddings + h)

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer `index` (from 0) has a mixture of experts
        for its MLP (never in the dense families)."""
        return False

    @classmethod
    def fields_from_hf(cls, hf: dict, dtype=None) -> dict:
        """This family's fields from a Hugging Face config.json (a dict);
        `dtype` None: its torch_dtype. See the module's fields_from_hf."""
        return fields_from_hf(cls, hf, dtype)

    def to_hf(self, dtype: str) -> dict:
        """config.json's fields for this config, in Hugging Face's names."""
        torch_dtype = {v: k for k, v in TORCH_DTYPES.items()}[dtype]
        out = {k: getattr(self, k) for k in _HF_CONFIG_KEYS + self.hf_keys}
        out.update(architectures=[self.architecture], model_type=self.model_type,
                   **dict(self.hf_fixed), head_dim=self.head_dim, torch_dtype=torch_dtype,
                   rope_scaling=self.rope_scaling)
        return out


def _linear(cfg, rng, n_in, n_out, bias=False):
    """A Linear [in, out] drawn from N(0, initializer_range) (a bias starts
    at zero, as Hugging Face's does)."""
    layer = Linear(n_in, n_out, bias=bias, dtype=cfg.dtype, rng=rng)
    if layer.weight.value is not None:  # abstract models have no values
        layer.weight.value = rng.normal(0, cfg.initializer_range, size=(n_in, n_out)).astype(
            layer.weight.value.dtype)
    return layer


class LlamaAttention(Module):
    def __init__(self, cfg: LlamaConfig, rng):
        super().__init__()
        self.cfg = cfg
        hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        bias = cfg.qkv_bias
        if cfg.fuse_attention_qkv:
            self.qkv_proj = _linear(cfg, rng, cfg.hidden_size, (hq + 2 * hkv) * d, bias)
        else:
            self.q_proj = _linear(cfg, rng, cfg.hidden_size, hq * d, bias)
            self.k_proj = _linear(cfg, rng, cfg.hidden_size, hkv * d, bias)
            self.v_proj = _linear(cfg, rng, cfg.hidden_size, hkv * d, bias)
        self.o_proj = _linear(cfg, rng, hq * d, cfg.hidden_size)
        if cfg.qk_norm:  # over each head's head_dim, before rope (Qwen3)
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps, cfg.dtype)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps, cfg.dtype)

    def forward(self, x, positions):
        cfg = self.cfg
        b, s, _ = x.shape
        hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        if cfg.fuse_attention_qkv:
            q, k, v = F.split(self.qkv_proj(x), [hq * d, hkv * d, hkv * d], axis=2)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q, k = q.reshape(b, s, hq, d), k.reshape(b, s, hkv, d)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = rope_scaling.rope(q, positions, cfg.rope_theta, cfg.rope_scaling)
        k = rope_scaling.rope(k, positions, cfg.rope_theta, cfg.rope_scaling)
        out = F.attention(q, k, v.reshape(b, s, hkv, d), causal=True, window=cfg.sliding_window)
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
    """Layer `index` of the decoder: its MLP is an `ernie.moe.MoELayer`
    where the config makes that layer sparse (`is_moe_layer`, Qwen3-MoE),
    Llama's SwiGLU elsewhere."""

    def __init__(self, cfg: LlamaConfig, rng, index: int = 0):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype)
        self.self_attn = LlamaAttention(cfg, rng)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype)
        self.is_moe = cfg.is_moe_layer(index)
        if self.is_moe:
            self.mlp = MoELayer(cfg.hidden_size, cfg.moe_config(), cfg.dtype, rng,
                                cfg.initializer_range,
                                name=f"{cfg.base_model_prefix}.layers.{index}.mlp")
        else:
            self.mlp = LlamaMLP(cfg, rng)

    def forward(self, x, positions):
        x = x + self.self_attn(self.input_layernorm(x), positions)
        h = self.post_attention_layernorm(x)
        if self.is_moe:  # its routing statistics stay on the layer (last_probs, ...)
            return x + self.mlp(h)[0]
        return x + self.mlp(h)


class LlamaModel(Module):
    def __init__(self, cfg: LlamaConfig, rng):
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, cfg.dtype, rng,
                                      std=cfg.initializer_range)
        self.layers = LayerList(LlamaDecoderLayer(cfg, rng, i)
                                for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        positions = F.iota([input_ids.shape[1]], 0, "i64")
        for layer in self.layers:
            x = layer(x, positions)
        return self.norm(x)


class LlamaForCausalLM(Module):
    """The causal LM of a Llama-shaped family; a family's model is this
    class with its config class (Qwen2ForCausalLM: Qwen2Config), the
    decoder under the config's `base_model_prefix` (`llama`, `qwen2`,
    ...)."""

    config_class = LlamaConfig

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        if not isinstance(cfg, self.config_class) or \
                cfg.model_type != self.config_class.model_type:
            raise TypeError(f"{type(self).__name__} is built from a "
                            f"{self.config_class.__name__}, not a {type(cfg).__name__}")
        rng = np.random.default_rng(cfg.seed)
        self.config = cfg
        setattr(self, cfg.base_model_prefix, LlamaModel(cfg, rng))
        if not cfg.tie_word_embeddings:
            self.lm_head = _linear(cfg, rng, cfg.hidden_size, cfg.vocab_size)

    @property
    def base_model(self) -> "LlamaModel":
        """The decoder (`self.llama`, `self.qwen2`, ...)."""
        return self._modules[self.config.base_model_prefix]

    def parallelize_plan(self, sequence_parallel: bool = False) -> dict:
        """Paddle's tensor-parallel plan (see the module's parallelize_plan)
        over this model's names."""
        return parallelize_plan(sequence_parallel, self.config.tie_word_embeddings,
                                self.config.base_model_prefix)

    @property
    def split_spec(self) -> str:
        """pp_config's split_spec: a stage boundary between decoder layers."""
        return f"{self.config.base_model_prefix}.layers"

    @classmethod
    def from_pretrained(cls, folder, dtype=None, **overrides):
        """The model of a Hugging Face folder (config.json and
        model.safetensors, or shards with model.safetensors.index.json):
        Hugging Face's names and [out, in] Linears mapped onto ernie's
        [in, out] ones (hf_layout; fused projections where the config asks
        for them). `dtype` ("f32", "bf16", ...) defaults to the file's
        torch_dtype; narrow floats are read exactly. `overrides` set other
        config fields (fuse_attention_qkv, ...).

        Built under `ernie.nn.abstract()` nothing is read but the headers:
        the model remembers the folder (`pretrained_weights`) and
        `ernie.compile` loads it into the program, each rank reading only
        its own pieces of each tensor."""
        hf, index = hf_folder_index(folder)
        config_class = cls.config_class
        cfg = config_class(**{**config_class.fields_from_hf(hf, dtype), **overrides})
        model = cls(cfg)
        # Every field read, for save_pretrained to write back (what ernie
        # does not compute: max_position_embeddings, token ids, ...).
        object.__setattr__(model, "hf_config", dict(hf))
        params = dict(model.named_parameters())
        if is_fused(index):  # transformers' own layout
            return load_fused_folder(model, folder, index)
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
        theirs = type(self.config).fields_from_hf(hf, self.config.dtype)
        same = lambda a, b: (tuple(a) == tuple(b) if isinstance(a, (list, tuple))  # noqa: E731
                             and isinstance(b, (list, tuple)) else a == b)
        differ = {k: (getattr(self.config, k), v) for k, v in theirs.items()
                  if k != "dtype" and not same(getattr(self.config, k), v)}
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
        config = {**getattr(self, "hf_config", {}), **cfg.to_hf(dtype)}
        if "dtype" in config:  # newer transformers' name for torch_dtype
            config["dtype"] = config["torch_dtype"]
        write_hf_folder(folder, config, hf_state_from_ernie(values, cfg), dtype, max_shard_bytes)

    def forward(self, input_ids, labels=None):
        logits = self.logits(self.base_model(input_ids))
        if labels is None:
            return logits
        return causal_lm_loss(logits, labels, self.config.pre_shifted_labels)

    def logits(self, h):
        """The LM head over the final hidden states (the tied embedding's
        weight, or lm_head)."""
        if self.config.tie_word_embeddings:
            return _tied_head(self.base_model.embed_tokens, h)
        return self.lm_head(h)


# ---------------------------------------------------------------------------
# Hugging Face's LlamaForCausalLM: config.json and weight names.
# ---------------------------------------------------------------------------

_HF_CONFIG_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                   "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_theta",
                   "tie_word_embeddings")


def load_fused_folder(model, folder, index):
    """`model` with its parameters, and its MoE layers' selection biases,
    from a folder in transformers' fused layout (weights.fused_folder_states:
    the runtime's rules in their reading direction)."""
    params = dict(model.named_parameters())
    state = fused_folder_states(folder, index, params)
    for name, p in params.items():
        p.value = _rounded(state[name], p.dtype).astype(p.value.dtype)
    model._name_parameters()
    for _, layer in model.named_sublayers():
        if isinstance(layer, MoELayer) and layer.bias_name() in state:
            layer.e_score_correction_bias = state[layer.bias_name()]
    return model


def _rounded(value, dtype):
    """`value` rounded to `dtype` when that is a narrow float (the values a
    bf16 parameter holds are bf16 numbers, kept in f32 arrays)."""
    if dtype not in ("bf16", "f8E4M3FN", "f8E5M2"):
        return value
    x = np.ascontiguousarray(value, dtype=np.float32)
    return _ernie.convert_float(_ernie.convert_float(x, "f32", dtype), dtype, "f32").reshape(x.shape)


def config_from_hf(hf: dict, dtype=None) -> dict:
    """LlamaConfig fields from a Hugging Face config.json (see
    fields_from_hf)."""
    return fields_from_hf(LlamaConfig, hf, dtype)


def config_to_hf(cfg: LlamaConfig, dtype: str) -> dict:
    return cfg.to_hf(dtype)


def fields_from_hf(config_class, hf: dict, dtype=None) -> dict:
    """The fields of `config_class` (LlamaConfig or a family's subclass)
    from a Hugging Face config.json. What the family does not compute is a
    ValueError naming the field, rather than a silently different model:
    a field of `hf_fixed` with another value (another activation, biases
    the family lacks, sliding-window attention, attention dropout), a rope
    scaling other than the default (`rope_scaling`, or newer transformers'
    `rope_parameters`), a layer type other than full attention
    (`layer_types`), an unknown torch_dtype."""
    name = config_class.family
    arch = hf.get("architectures") or [config_class.architecture]
    if config_class.architecture not in arch and hf.get("model_type") != config_class.model_type:
        raise ValueError(f"config.json describes {arch}, not {config_class.architecture}")
    for key, want in config_class.hf_fixed:
        if hf.get(key, want) != want:
            raise ValueError(f"config.json: {key} = {str(hf[key])[:80]} is not supported "
                             f"(ernie's {name} has {want!r})")
    rope_theta, scaling = rope_scaling.from_hf(hf, name)
    layer_types = hf.get("layer_types")
    if layer_types is not None and (not isinstance(layer_types, list) or any(
            t != "full_attention" for t in layer_types)):
        raise ValueError(f"config.json: layer_types = {str(layer_types)[:80]} is not supported "
                         f"(ernie's {name} has full attention in every layer; sliding-window "
                         f"attention is not an attention ernie has)")
    keys = _HF_CONFIG_KEYS + ("head_dim",) + config_class.hf_keys
    hf = {**{ours: hf[theirs] for theirs, ours in config_class.hf_aliases.items()
             if theirs in hf and ours not in hf}, **hf}
    fields = {**config_class.hf_defaults, **{k: hf[k] for k in keys if k in hf}}
    if rope_theta is not None:
        fields["rope_theta"] = rope_theta
    fields["rope_scaling"] = scaling
    fields.setdefault("num_key_value_heads", hf.get("num_attention_heads"))
    if fields.get("head_dim") is None:
        fields.pop("head_dim", None)  # hidden_size // num_attention_heads
    if dtype is None:
        dtype = _dtype_from_hf(hf)
    fields["dtype"] = dtype
    return fields


def _dtype_from_hf(hf: dict) -> str:
    """ernie's dtype of config.json's torch_dtype (newer transformers:
    `dtype`); float32 where it names none."""
    key = "torch_dtype" if "torch_dtype" in hf else "dtype"
    torch_dtype = hf.get(key) or "float32"
    if torch_dtype not in TORCH_DTYPES:
        raise ValueError(f"config.json: {key} {str(torch_dtype)[:40]!r} is not one of "
                         f"{sorted(TORCH_DTYPES)}")
    return TORCH_DTYPES[torch_dtype]


def hf_layout(cfg: LlamaConfig) -> list:
    """Where each of Hugging Face's tensors goes, in the parameters' order:
    (ernie parameter, Hugging Face name, offsets in the parameter, the
    block's shape in the parameter, transposed). The runtime's rule table
    (weights.hf_layout, which `ernie-ckpt export-hf` uses too) over the
    parameters of the model `cfg` builds: Linears are Hugging Face's
    [out, in], ernie's [in, out] (transposed); fused q/k/v and gate/up are
    blocks at column offsets of one parameter; stacked experts [E, in, out]
    hold one tensor per expert at [e]; a tied LM head has no tensor of its
    own. The one mapping the readers, the writer and the distributed loader
    (hf_weight_map) share."""
    return [(t.state, t.name, t.offsets,
             tuple(reversed(t.shape)) if t.transposed else t.shape, t.transposed)
            for t in _hf_tensors(cfg)]


def _hf_tensors(cfg: LlamaConfig) -> list:
    """weights.hf_layout of the parameters of the model `cfg` builds."""
    with abstract():
        model = _model_class(cfg)(cfg)
    states = [(name, p.shape) for name, p in model.named_parameters()]
    return weights_layout(cfg.to_hf(cfg.dtype), states)


def _model_class(cfg: LlamaConfig):
    """The model class of `cfg`'s family (LlamaForCausalLM or the
    subclass whose config_class it is)."""
    classes = [LlamaForCausalLM]
    while classes:
        cls = classes.pop()
        if cls.config_class is type(cfg):
            return cls
        classes += cls.__subclasses__()
    raise TypeError(f"no model class is built from a {type(cfg).__name__}")


def _hf_leftovers(names, cfg: LlamaConfig, where):
    """Raises for Hugging Face tensors the family has no place for
    (besides rotary caches, recomputed, and a tied head's copy)."""
    placed = {hf for _, hf, _, _, _ in hf_layout(cfg)}
    leftover = sorted(n for n in names if n not in placed
                      and not n.endswith("rotary_emb.inv_freq")
                      and not (cfg.tie_word_embeddings and n == "lm_head.weight"))
    if leftover:
        raise ValueError(f"{where}: weights ernie's {cfg.family} has no place for: "
                         f"{leftover[:5]}")


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
        if len(blocks) == 1 and len(blocks[0][0]) == blocks[0][1].ndim:
            out[name] = blocks[0][1]
            continue
        # Offsets past the block's rank index the leading dimensions
        # (stacked experts: [e] of [E, in, out]).
        lead = len(blocks[0][0]) - blocks[0][1].ndim
        shape = tuple(max(off[k] + 1 for off, _ in blocks) for k in range(lead)) + tuple(
            max(off[lead + k] + v.shape[k] for off, v in blocks)
            for k in range(blocks[0][1].ndim))
        whole = np.empty(shape, dtype=blocks[0][1].dtype)
        for off, v in blocks:
            whole[_block(off, v.shape)] = v
        out[name] = whole
    return out


def _block(offsets, shape):
    """The index of a block of `shape` at `offsets` (leading offsets past
    the block's rank pick one entry of those dimensions)."""
    lead = len(offsets) - len(shape)
    return tuple(offsets[:lead]) + tuple(slice(o, o + n) for o, n in zip(offsets[lead:], shape))


def hf_state_from_ernie(values: dict, cfg: LlamaConfig) -> dict:
    """The inverse of ernie_state_from_hf, in Hugging Face's order."""
    out = {}
    for name, hf, offsets, block, transposed in hf_layout(cfg):
        value = np.asarray(values[name])[_block(offsets, block)]
        out[hf] = np.ascontiguousarray(value.T if transposed else value)
    return out


def hf_weight_map(folder, cfg: LlamaConfig) -> dict:
    """{ernie parameter: [(file, tensor, offsets, transposed)]} of a Hugging
    Face folder, from its index and headers alone (Program.load_weights
    reads each rank's pieces). Shapes are checked against `cfg`."""
    _, index = hf_folder_index(folder)
    _hf_leftovers(index, cfg, folder)
    return folder_weight_map(folder, index, _hf_tensors(cfg))


class LlamaDecoderLayerPipe(LlamaDecoderLayer):
    """A decoder layer on the hidden states alone (a PipelineLayer entry):
    the rotary positions are rebuilt from the sequence length."""

    def forward(self, x):
        return super().forward(x, F.iota([x.shape[1]], 0, "i64"))


def _tied_head(embedding, h):
    return F.matmul(h, embedding.p("weight"), transpose_b=True)


def shift_labels(labels):
    """Hugging Face's labels (labels = input_ids) as each position's target:
    labels[:, 1:] followed by -100, so position t is scored against
    labels[t + 1] and the last position, which has no next token, against
    nothing.

    The shift is of the labels (integers, [B, S]) rather than the logits
    ([B, S, vocab]): no copy of the logits, and the plan still decides
    where the logits live. Slicing along the sequence keeps that dimension
    whole (ernie.slice's sharding rule): labels a plan split along the
    sequence would be gathered first, a few bytes per token. Sequence
    parallelism as parallelize_plan writes it splits only the activations
    between layers, so the labels stay whole there (split along the batch
    by dp) and the shift is local, no collective added. The pipeline split
    places these ops, which read only the labels, on the last stage, where
    the loss reads them."""
    b, s = labels.shape[0], labels.shape[1]
    last = F.full([b, 1, *labels.shape[2:]], -100, labels.dtype)
    if s == 1:
        return last
    rest = F.slice(labels, [0, 1] + [0] * (labels.ndim - 2), list(labels.shape))
    return F.concat([rest, last], axis=1)


def causal_lm_loss(logits, labels, pre_shifted_labels: bool = False):
    """The mean cross-entropy of the logits against the labels, over the
    targets not -100: Hugging Face's labels (shifted here, shift_labels),
    or with `pre_shifted_labels` labels already shifted (labels[t] is
    position t's target)."""
    if not pre_shifted_labels:
        labels = shift_labels(labels)
    return F.cross_entropy(logits, labels)


class LlamaForCausalLMPipe(PipelineLayer):
    """LlamaForCausalLM as a PipelineLayer: embedding, decoder layers, norm,
    LM head (with tie_word_embeddings a SharedLayerDesc of the embedding),
    the loss. forward(input_ids, labels) returns the loss (labels as
    LlamaForCausalLM takes them: causal_lm_loss). Segmented by
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
        loss_fn = functools.partial(causal_lm_loss, pre_shifted_labels=cfg.pre_shifted_labels)
        super().__init__(descs, num_stages, loss_fn=loss_fn, seg_method=seg_method,
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


def parallelize_plan(sequence_parallel: bool = False, tie_word_embeddings: bool = False,
                     prefix: str = "llama") -> dict:
    """Paddle's tensor-parallel plan for Llama (`mp_config.parallelize_plan`):
    Megatron's column/row pairs for attention and MLP, the embedding and LM
    head split on the hidden/vocabulary dimension; with sequence_parallel,
    activations between layers (the residual stream and the norms) stay
    split along the sequence. With tie_word_embeddings there is no lm_head:
    the head reads the embedding's (hidden-split) weight. `prefix` is the
    family's base_model_prefix (`qwen2`, ...): q/k/v biases split with their
    columns, Qwen3's per-head q/k norms stay replicated (each rank norms its
    own heads). For LlamaForCausalLMPipe's layer names use its own
    parallelize_plan()."""
    return _plan(f"{prefix}.embed_tokens", f"{prefix}.layers.*", f"{prefix}.norm",
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

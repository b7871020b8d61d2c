"""DeepSeek-V3 (Hugging Face's `deepseek_v3` model type).

Multi-head latent attention (MLA): queries through a low-rank bottleneck
(`q_a_proj` [hidden -> q_lora_rank], `q_a_layernorm`, `q_b_proj` -> heads x
(qk_nope + qk_rope); `q_proj` alone when `q_lora_rank` is null), keys and
values from one compressed latent (`kv_a_proj_with_mqa` [hidden ->
kv_lora_rank + qk_rope], `kv_a_layernorm` over the latent, `kv_b_proj` ->
heads x (qk_nope + v_head_dim)); the decoupled rope part of the key is one
head shared by all (`qk_rope_head_dim` wide, broadcast), queries and keys
are `qk_nope + qk_rope` wide and values `v_head_dim` (ernie.attention takes
a value head size of its own), scaled by 1/sqrt(qk_nope + qk_rope). With
`rope_interleave` (the published configs) rope turns adjacent pairs
(ernie.rope's interleaved form; transformers de-interleaves the same pairs
for q and k, which leaves q.k unchanged).

The first `first_k_dense_replace` layers have a SwiGLU MLP of
`intermediate_size`; the others are `ernie.moe.MoELayer`s with DeepSeek's
router: sigmoid scores, the aux-loss-free selection bias
(`mlp.gate.e_score_correction_bias`, ERNIE's mechanism: state, moved by
`aux_free_rate` when training asks), group-limited top-k (`n_group`
groups, the `topk_group` whose two best biased scores sum highest), the k
chosen sigmoid scores renormalised (`norm_topk_prob`) and scaled by
`routed_scaling_factor`, plus `n_shared_experts` shared experts. The loss is
transformers' (cross-entropy of labels = input_ids shifted in the model; no
auxiliary loss). The multi-token-prediction module
(`num_nextn_predict_layers`) is not built, as transformers does not build
it: its tensors in a folder are skipped.

Parameter names are Hugging Face's (`model.layers.{i}.self_attn.kv_b_proj.
weight`, ...), Linears [in, out] and experts stacked [E, in, out]; folders
are read and written through the runtime's rule table
(`ernie.weights.hf_layout`). The published V3's yarn rope scaling is
computed as transformers does (models.rope_scaling: the scaled
frequencies, cos/sin scaled by its attention factor, and the softmax scale
by mscale(factor, mscale_all_dim)^2).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np

from .. import distributed as dist
from .. import functional as F
from ..moe import MoEConfig
from ..nn import Embedding, LayerList, Module, RMSNorm, abstract
from ..weights import (TORCH_DTYPES, folder_weight_map, hf_folder_index, is_fused,
                       read_hf_folder, read_tensors, write_hf_folder)
from ..weights import hf_layout as weights_layout
from .config_checks import check_counts, check_finite
from .ernie4_5 import Ernie4_5DecoderLayer
from . import rope_scaling
from .llama import (_block, _dtype_from_hf, _linear, _rounded, _tied_head,
                    causal_lm_loss, load_fused_folder)

# config.json fields that would make another model: (field, what ernie computes).
_FIXED = (("hidden_act", "silu"), ("attention_bias", False), ("attention_dropout", 0.0),
          ("scoring_func", "sigmoid"), ("topk_method", "noaux_tc"))
# Fields that are not config.json's (ernie's own).
_OURS = ("dtype", "seed", "initializer_range", "pre_shifted_labels", "moe_capacity_factor",
         "aux_free_rate")
_BIAS_SLOT = ":e_score_correction_bias"


@dataclass
class DeepseekV3Config:
    model_type: ClassVar[str] = "deepseek_v3"
    architecture: ClassVar[str] = "DeepseekV3ForCausalLM"
    family: ClassVar[str] = "DeepSeek-V3"
    base_model_prefix: ClassVar[str] = "model"

    vocab_size: int = 129280
    hidden_size: int = 7168
    intermediate_size: int = 18432
    moe_intermediate_size: int = 2048
    num_hidden_layers: int = 61
    num_attention_heads: int = 128
    n_shared_experts: int = 1
    n_routed_experts: int = 256
    routed_scaling_factor: float = 2.5
    kv_lora_rank: int = 512
    q_lora_rank: int | None = 1536
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    qk_nope_head_dim: int = 128
    n_group: int = 8
    topk_group: int = 4
    num_experts_per_tok: int = 8
    first_k_dense_replace: int = 3
    norm_topk_prob: bool = True
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_interleave: bool = True
    # Hugging Face's rope scaling (the published V3: yarn, factor 40), or
    # None (models.rope_scaling).
    rope_scaling: dict | None = None
    tie_word_embeddings: bool = False
    num_nextn_predict_layers: int = 0
    initializer_range: float = 0.02
    dtype: str = "f32"
    seed: int = 0
    moe_capacity_factor: float | None = None  # None: dropless, as transformers
    aux_free_rate: float = 0.0  # the selection bias's step per training step
    pre_shifted_labels: bool = False

    def __post_init__(self):
        check_counts(self, ("vocab_size", "hidden_size", "intermediate_size",
                            "moe_intermediate_size", "num_hidden_layers", "num_attention_heads",
                            "n_routed_experts", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim",
                            "qk_nope_head_dim", "n_group", "topk_group", "num_experts_per_tok"))
        check_counts(self, ("n_shared_experts", "first_k_dense_replace",
                            "num_nextn_predict_layers"), minimum=0)
        if self.q_lora_rank is not None:
            check_counts(self, ("q_lora_rank",))
        check_finite(self, ("rms_norm_eps", "rope_theta", "routed_scaling_factor"),
                     positive=True)
        check_finite(self, ("initializer_range", "aux_free_rate"), minimum=0.0)
        for name in ("norm_topk_prob", "rope_interleave", "tie_word_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"DeepseekV3Config.{name} must be true or false, got "
                                f"{getattr(self, name)!r}")
        self.moe_config()  # the router's fields, checked
        if self.rope_scaling is not None:
            self.rope_scaling = rope_scaling.checked(dict(self.rope_scaling),
                                                     "DeepseekV3Config.rope_scaling")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def is_moe_layer(self, index: int) -> bool:
        return index >= self.first_k_dense_replace

    def moe_config(self) -> MoEConfig:
        return MoEConfig(num_experts=self.n_routed_experts, k=self.num_experts_per_tok,
                         intermediate_size=self.moe_intermediate_size,
                         num_shared_experts=self.n_shared_experts,
                         capacity_factor=self.moe_capacity_factor,
                         norm_topk_prob=self.norm_topk_prob, scoring="sigmoid",
                         num_groups=self.n_group, topk_groups=self.topk_group,
                         scaling_factor=self.routed_scaling_factor,
                         aux_free_rate=self.aux_free_rate)

    @classmethod
    def from_hf(cls, hf: dict, dtype=None, **overrides) -> "DeepseekV3Config":
        """The config of a Hugging Face config.json (a dict); what ernie
        does not compute is a ValueError naming the field."""
        for key, want in _FIXED:
            if hf.get(key, want) != want:
                raise ValueError(f"config.json: {key} = {str(hf[key])[:80]} is not supported "
                                 f"(ernie's DeepSeek-V3 has {want!r})")
        names = {f.name for f in fields(cls)} - set(_OURS)
        out = {k: v for k, v in hf.items() if k in names}
        theta, scaling = rope_scaling.from_hf(hf, cls.family)
        out["rope_scaling"] = scaling
        if theta is not None:
            out["rope_theta"] = theta
        out["dtype"] = dtype or _dtype_from_hf(hf)
        return cls(**{**out, **overrides})

    def to_hf(self, dtype: str) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _OURS}
        out.update(dict(_FIXED), architectures=[self.architecture], model_type=self.model_type,
                   torch_dtype={v: k for k, v in TORCH_DTYPES.items()}[dtype])
        return out


class DeepseekV3Attention(Module):
    """Multi-head latent attention (the module docstring)."""

    def __init__(self, cfg: DeepseekV3Config, rng):
        super().__init__()
        self.cfg = cfg
        h, heads = cfg.hidden_size, cfg.num_attention_heads
        if cfg.q_lora_rank is None:
            self.q_proj = _linear(cfg, rng, h, heads * cfg.qk_head_dim)
        else:
            self.q_a_proj = _linear(cfg, rng, h, cfg.q_lora_rank)
            # transformers' latent norms keep their own epsilon, 1e-6.
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, 1e-6, cfg.dtype)
            self.q_b_proj = _linear(cfg, rng, cfg.q_lora_rank, heads * cfg.qk_head_dim)
        self.kv_a_proj_with_mqa = _linear(cfg, rng, h, cfg.kv_lora_rank + cfg.qk_rope_head_dim)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, 1e-6, cfg.dtype)
        self.kv_b_proj = _linear(cfg, rng, cfg.kv_lora_rank,
                                 heads * (cfg.qk_nope_head_dim + cfg.v_head_dim))
        self.o_proj = _linear(cfg, rng, heads * cfg.v_head_dim, h)

    def forward(self, x, positions):
        cfg = self.cfg
        b, s, _ = x.shape
        heads, nope, rot, dv = (cfg.num_attention_heads, cfg.qk_nope_head_dim,
                                cfg.qk_rope_head_dim, cfg.v_head_dim)
        if cfg.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q_pass, q_rot = F.split(q.reshape(b, s, heads, nope + rot), [nope, rot], axis=3)
        latent, k_rot = F.split(self.kv_a_proj_with_mqa(x), [cfg.kv_lora_rank, rot], axis=2)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).reshape(b, s, heads, nope + dv)
        k_pass, v = F.split(kv, [nope, dv], axis=3)
        q_rot = rope_scaling.rope(q_rot, positions, cfg.rope_theta, cfg.rope_scaling,
                                  cfg.rope_interleave)
        k_rot = rope_scaling.rope(k_rot.reshape(b, s, 1, rot), positions, cfg.rope_theta,
                                  cfg.rope_scaling, cfg.rope_interleave)
        k_rot = F.broadcast_to(k_rot, [b, s, heads, rot])  # one rope key for every head
        q = F.concat([q_pass, q_rot], axis=3)
        k = F.concat([k_pass, k_rot], axis=3)
        out = F.attention(q, k, v, causal=True, scale=cfg.qk_head_dim ** -0.5 *
                          rope_scaling.softmax_scale(cfg.rope_scaling))
        return self.o_proj(out.reshape(b, s, heads * dv))


class DeepseekV3DecoderLayer(Ernie4_5DecoderLayer):
    """ERNIE 4.5's layer (a dense SwiGLU, or the MoE layer) around MLA."""

    attention_class = DeepseekV3Attention


class DeepseekV3Model(Module):
    def __init__(self, cfg: DeepseekV3Config, rng):
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, cfg.dtype, rng,
                                      cfg.initializer_range)
        self.layers = LayerList([DeepseekV3DecoderLayer(cfg, i, rng)
                                 for i in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        positions = F.iota([input_ids.shape[1]], 0)
        for layer in self.layers:
            x, _ = layer(x, positions)  # no weighted MoE losses: DeepSeek has none
        return self.norm(x)


class DeepseekV3ForCausalLM(Module):
    """Hugging Face's DeepseekV3ForCausalLM."""

    config_class = DeepseekV3Config

    def __init__(self, cfg: DeepseekV3Config):
        super().__init__()
        if not isinstance(cfg, DeepseekV3Config):
            raise TypeError(f"DeepseekV3ForCausalLM is built from a DeepseekV3Config, not a "
                            f"{type(cfg).__name__}")
        rng = np.random.default_rng(cfg.seed)
        self.config = cfg
        self.model = DeepseekV3Model(cfg, rng)
        if not cfg.tie_word_embeddings:
            self.lm_head = _linear(cfg, rng, cfg.hidden_size, cfg.vocab_size)

    def forward(self, input_ids, labels=None):
        h = self.model(input_ids)
        if self.config.tie_word_embeddings:
            logits = _tied_head(self.model.embed_tokens, h)
        else:
            logits = self.lm_head(h)
        if labels is None:
            return logits
        return causal_lm_loss(logits, labels, self.config.pre_shifted_labels)

    def parallelize_plan(self, sequence_parallel: bool = False) -> dict:
        return parallelize_plan(self.config.tie_word_embeddings, sequence_parallel)

    @property
    def split_spec(self) -> str:
        return "model.layers"

    # -- Hugging Face folders ----------------------------------------------

    def _hf_tensors(self) -> list:
        """Hugging Face's tensors of this model's parameters and selection
        biases (weights.hf_layout)."""
        self._name_parameters()
        states = [(name, p.shape) for name, p in self.named_parameters()]
        return weights_layout(self.config.to_hf(self.config.dtype), states)

    def _check_folder(self, names, where):
        """Raises for a tensor the model has no place for (the skipped MTP
        layers and rotary caches aside)."""
        cfg = self.config
        known = {t.name for t in self._hf_tensors()}
        mtp = tuple(f"model.layers.{cfg.num_hidden_layers + i}."
                    for i in range(cfg.num_nextn_predict_layers))
        leftover = sorted(n for n in names if n not in known and not n.endswith("inv_freq")
                          and not (mtp and n.startswith(mtp))
                          and not (cfg.tie_word_embeddings and n == "lm_head.weight"))
        if leftover:
            raise ValueError(f"{where}: weights ernie's DeepSeek-V3 has no place for: "
                             f"{leftover[:5]}")

    @classmethod
    def from_pretrained(cls, folder, dtype=None, **overrides):
        """The model of a Hugging Face folder; built under
        `ernie.nn.abstract()` only the headers are read and ernie.compile
        loads each rank's pieces. A tensor whose shape the config does not
        make names both shapes."""
        hf, index = hf_folder_index(folder)
        model = cls(DeepseekV3Config.from_hf(hf, dtype, **overrides))
        object.__setattr__(model, "hf_config", dict(hf))
        if is_fused(index):  # transformers' own layout
            return load_fused_folder(model, folder, index)
        model._check_folder(index, folder)
        # A folder without selection biases leaves them zero.
        tensors = [t for t in model._hf_tensors()
                   if t.name in index or not t.state.endswith(_BIAS_SLOT)]
        weight_map = folder_weight_map(folder, index, tensors)
        for layer in model.model.layers:
            if layer.is_moe and layer.mlp.bias_name() in weight_map:
                (path, name, _, _), = weight_map.pop(layer.mlp.bias_name())
                layer.mlp.e_score_correction_bias = np.asarray(
                    read_tensors(path, [name])[name], np.float32).reshape(-1)
        params = dict(model.named_parameters())
        if all(p.value is None for p in params.values()):  # abstract
            object.__setattr__(model, "pretrained_weights", weight_map)
            return model
        _, weights, _ = read_hf_folder(folder)
        for t in tensors:
            if t.state in params:
                value = np.asarray(weights[t.name])
                p = params[t.state]
                p.value[_block(t.offsets, t.shape[::-1] if t.transposed else t.shape)] = \
                    _rounded(value.T if t.transposed else value, p.dtype)
        return model

    def hf_weight_map(self, folder):
        """{parameter: [(file, tensor, offsets, transposed)]} of a folder of
        this model's config (Program.load_pretrained)."""
        _, index = hf_folder_index(folder)
        self._check_folder(index, folder)
        params = dict(self.named_parameters())
        return folder_weight_map(folder, index,
                                 [t for t in self._hf_tensors() if t.state in params])

    def save_pretrained(self, folder, dtype=None, max_shard_bytes=None, state=None):
        """Writes a Hugging Face folder (config.json with every field read,
        the tensors in Hugging Face's names and layout, experts one tensor
        each, the selection biases); `state`: a program's state_dict()."""
        cfg = self.config
        dtype = dtype or cfg.dtype
        values = {n: p.value for n, p in self.named_parameters()}
        self._name_parameters()
        for layer in self.model.layers:
            if layer.is_moe:
                values[layer.mlp.bias_name()] = layer.mlp.e_score_correction_bias
        if state is not None:
            values.update({n: state[n] for n in values if n in state})
        out = {}
        for t in self._hf_tensors():
            value = np.asarray(values[t.state])
            block = value[_block(t.offsets, t.shape[::-1] if t.transposed else t.shape)] \
                if not t.state.endswith(_BIAS_SLOT) else value
            out[t.name] = np.ascontiguousarray(block.T if t.transposed else block).reshape(t.shape)
        config = {**getattr(self, "hf_config", {}), **cfg.to_hf(dtype)}
        if "dtype" in config:
            config["dtype"] = config["torch_dtype"]
        write_hf_folder(folder, config, out, dtype, max_shard_bytes)


def parallelize_plan(tie_word_embeddings: bool = False, sequence_parallel: bool = False) -> dict:
    """Megatron's plan for MLA and the MLPs: the per-head projections
    (q_b_proj or q_proj, kv_b_proj) split by columns, o_proj by rows; the
    latent projections and norms replicated (each rank computes the small
    latents whole); the dense MLPs, the shared experts and each routed
    expert's projections column/row (the experts' dimension is
    ep_config's); the embedding and an untied LM head on the vocabulary.
    With sequence_parallel, the residual stream and its norms stay split
    along the sequence between the blocks (Llama's markers)."""
    layer = r"model\.layers\.\d+\."
    mlp = layer + r"mlp\.(?:shared_experts\.|experts\.)?"
    plan = {
        r"model\.embed_tokens": dist.ColWiseParallel(),
        layer + r"self_attn\.(q|q_b|kv_b)_proj": dist.ColWiseParallel(),
        layer + r"self_attn\.o_proj": dist.RowWiseParallel(),
        mlp + r"(gate|up)_proj\.weight": dist.ColWiseParallel(),
        mlp + r"down_proj\.weight": dist.RowWiseParallel(),
    }
    if not tie_word_embeddings:
        plan["lm_head"] = dist.ColWiseParallel()
    if sequence_parallel:
        layers = "model.layers.*"
        plan.update({
            r"model\.embed_tokens": [dist.ColWiseParallel(), dist.SequenceParallelBegin()],
            f"{layers}.(input|post_attention)_layernorm": dist.SequenceParallelEnable(),
            f"{layers}.self_attn": dist.SequenceParallelDisable(),
            f"{layers}.mlp": dist.SequenceParallelDisable(),
            "model.norm": dist.SequenceParallelEnd(),
        })
    return plan

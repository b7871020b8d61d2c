"""ERNIE 4.5 (Hugging Face's Ernie4_5 and Ernie4_5_Moe architectures).

A Llama-shaped decoder — RMSNorm, grouped-query causal attention, SwiGLU,
no biases — with ERNIE's interleaved rotary pairs (2i, 2i + 1) and, in
`Ernie4_5_MoeForCausalLM`, mixture-of-experts MLPs (`ernie.moe.MoELayer`)
on the layers Hugging Face makes MoE: layer i (from 0) when `(i + 1) %
moe_layer_interval == 0` and `moe_layer_start_index <= i <=
moe_layer_end_index` (-1: the last layer); a dense SwiGLU of
`intermediate_size` elsewhere.

Parameter names are Hugging Face's (`model.embed_tokens.weight`,
`model.layers.N.self_attn.{q,k,v,o}_proj.weight`,
`model.layers.N.mlp.gate.weight`, `model.layers.N.mlp.shared_experts.*`,
`model.norm.weight`, `lm_head.weight`), with ernie's [in, out] Linears
and the experts stacked: `model.layers.N.mlp.experts.gate_proj.weight` is
[E, hidden, moe_intermediate_size], Hugging Face's
`mlp.experts.<e>.gate_proj.weight` [moe_intermediate_size, hidden]
transposed, for each e.

The logits are cast to f32 before the loss (as Hugging Face and Megatron
compute a bf16 model's cross-entropy); the router and its softmax run in
f32. The model returns the mean cross-entropy of `labels` plus, with
`output_router_logits`, `router_aux_loss_coef` times Hugging Face's
load-balancing loss over every sparse layer at once
(`ernie.moe.load_balancing_loss`), and the MoE layers' own weighted
orthogonal and z losses (ERNIE's; zero unless configured). Labels are Hugging Face's (`labels =
input_ids`, shifted in the model, `-100` ignored); labels the data already
shifted (Paddle's pretraining criterion) need `pre_shifted_labels=True`
(`ernie.models.llama.causal_lm_loss`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from .. import functional as F
from ..distributed import ColWiseParallel, RowWiseParallel
from ..moe import MoEConfig, MoELayer, SwiGLU, load_balancing_loss
from ..nn import Embedding, LayerList, Module, RMSNorm, abstract
from ..weights import (TORCH_DTYPES, folder_weight_map, hf_folder_index, is_fused,
                       read_hf_folder, read_json, read_tensors, write_hf_folder)
from ..weights import hf_layout as weights_layout
from .config_checks import check_counts, check_finite, check_size
from .llama import (_dtype_from_hf, _linear, _rounded, _tied_head, causal_lm_loss,
                    load_fused_folder)

# Config fields save_pretrained leaves out of config.json (dtype goes as
# torch_dtype). pre_shifted_labels says how the loss reads its labels, not
# what the model is: from_json does not read it from a config.json either.
_NOT_HF_FIELDS = ("dtype", "seed", "initializer_range", "pre_shifted_labels")


@dataclass
class Ernie4_5Config:
    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int | None = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    tie_word_embeddings: bool = True
    # Mixture of experts (moe_num_experts = 0: the dense Ernie4_5).
    moe_num_experts: int = 0
    moe_k: int = 2
    moe_num_shared_experts: int = 0
    moe_intermediate_size: int = 64
    moe_layer_start_index: int = 1
    moe_layer_end_index: int = -1
    moe_layer_interval: int = 1
    moe_norm_min: float = 1e-12
    moe_capacity_factor: float | None = None  # None: dropless (Hugging Face's)
    router_aux_loss_coef: float = 0.0
    # Whether the auxiliary load-balancing loss joins the loss, as in
    # transformers (where it is false by default and in the published
    # configs); ernie's own configs default to true.
    output_router_logits: bool = True
    router_orthogonal_loss_coef: float = 0.0
    router_z_loss_coef: float = 0.0
    moe_aux_free_rate: float = 0.0  # aux-loss-free balancing's bias step (0: off)
    initializer_range: float = 0.02
    dtype: str = "f32"
    seed: int = 0
    # False: Hugging Face's labels = input_ids, shifted in the model; True:
    # labels already shifted by the data (Paddle's). Not in config.json.
    pre_shifted_labels: bool = False

    def __post_init__(self):
        check_counts(self, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "num_key_value_heads",
                            "moe_intermediate_size", "moe_layer_interval"))
        if not isinstance(self.pre_shifted_labels, bool):
            raise TypeError(f"Ernie4_5Config.pre_shifted_labels must be true or false, got "
                            f"{self.pre_shifted_labels!r}")
        check_counts(self, ("moe_num_experts", "moe_k", "moe_num_shared_experts",
                            "moe_layer_start_index"), minimum=0)
        check_counts(self, ("moe_layer_end_index",), minimum=-1)
        if self.head_dim is not None:
            check_counts(self, ("head_dim",))
        check_finite(self, ("rms_norm_eps", "rope_theta"), positive=True)
        check_finite(self, ("initializer_range", "moe_norm_min", "router_aux_loss_coef",
                            "router_orthogonal_loss_coef", "router_z_loss_coef",
                            "moe_aux_free_rate"), minimum=0.0)
        check_finite(self, ("moe_capacity_factor",), positive=True,
                     optional=("moe_capacity_factor",))
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError("hidden_size must be a multiple of num_attention_heads "
                                 "(or give head_dim)")
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.moe_num_experts:
            self.moe_config()  # checks k against the experts
        h, d = self.hidden_size, self.head_dim
        attention = h * (self.num_attention_heads + 2 * self.num_key_value_heads) * d + \
            self.num_attention_heads * d * h
        experts = (self.moe_num_experts + self.moe_num_shared_experts) * 3 * h * \
            self.moe_intermediate_size + self.moe_num_experts * h
        layer = attention + 2 * h + max(3 * h * self.intermediate_size, experts)
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        check_size(self, self.num_hidden_layers, self.num_hidden_layers * layer + embeddings + h)

    def moe_config(self) -> MoEConfig:
        return MoEConfig(num_experts=self.moe_num_experts, k=self.moe_k,
                         intermediate_size=self.moe_intermediate_size,
                         num_shared_experts=self.moe_num_shared_experts,
                         capacity_factor=self.moe_capacity_factor, norm_min=self.moe_norm_min,
                         # The load-balancing loss is the model's, over every
                         # layer at once (Ernie4_5ForCausalLM.forward).
                         aux_loss_coef=0.0,
                         orthogonal_loss_coef=self.router_orthogonal_loss_coef,
                         z_loss_coef=self.router_z_loss_coef,
                         aux_free_rate=self.moe_aux_free_rate)

    def is_moe_layer(self, i: int) -> bool:
        end = self.moe_layer_end_index
        end = self.num_hidden_layers - 1 if end == -1 else end
        return (self.moe_num_experts > 0 and (i + 1) % self.moe_layer_interval == 0
                and self.moe_layer_start_index <= i <= end)

    @classmethod
    def from_json(cls, path_or_dict, **overrides):
        """The fields of a Hugging Face config.json (a path or a dict) this
        model computes; `torch_dtype` (or transformers 5's `dtype`) becomes
        `dtype`, float32 where none is named. A field that would
        make another model (biases, another activation) is a ValueError."""
        hf = path_or_dict
        if not isinstance(hf, dict):
            hf = read_json(path_or_dict)
        if not isinstance(hf, dict):
            raise TypeError(f"config.json: a JSON object is needed, not {type(hf).__name__}")
        for key, want in (("hidden_act", "silu"), ("use_bias", False), ("rope_scaling", None)):
            if hf.get(key, want) != want:
                raise ValueError(f"config.json: {key} = {str(hf[key])[:80]} is not supported "
                                 f"(ernie's Ernie4_5 has {want!r})")
        names = {f.name for f in fields(cls)} - {"pre_shifted_labels"}
        out = {k: v for k, v in hf.items() if k in names}
        # transformers adds the auxiliary loss only with output_router_logits,
        # false in the published configs (and by default).
        out["output_router_logits"] = bool(hf.get("output_router_logits", False))
        # transformers 5 writes torch_dtype as `dtype`, in torch's names.
        out["dtype"] = _dtype_from_hf(hf)
        out.update(overrides)
        return cls(**out)


class Ernie4_5Attention(Module):
    def __init__(self, cfg: Ernie4_5Config, rng):
        super().__init__()
        self.cfg = cfg
        hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = _linear(cfg, rng, cfg.hidden_size, hq * d)
        self.k_proj = _linear(cfg, rng, cfg.hidden_size, hkv * d)
        self.v_proj = _linear(cfg, rng, cfg.hidden_size, hkv * d)
        self.o_proj = _linear(cfg, rng, hq * d, cfg.hidden_size)

    def forward(self, x, positions):
        cfg = self.cfg
        b, s, _ = x.shape
        hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        q = F.rope(self.q_proj(x).reshape(b, s, hq, d), positions, cfg.rope_theta,
                   interleaved=True)
        k = F.rope(self.k_proj(x).reshape(b, s, hkv, d), positions, cfg.rope_theta,
                   interleaved=True)
        out = F.attention(q, k, self.v_proj(x).reshape(b, s, hkv, d), causal=True)
        return self.o_proj(out.reshape(b, s, hq * d))


class Ernie4_5DecoderLayer(Module):
    """Attention, then a SwiGLU or (on the config's MoE layers) an
    `ernie.moe.MoELayer`, each behind an RMSNorm with a residual."""

    attention_class = Ernie4_5Attention

    def __init__(self, cfg: Ernie4_5Config, index: int, rng):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype)
        self.self_attn = self.attention_class(cfg, rng)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype)
        self.is_moe = cfg.is_moe_layer(index)
        if self.is_moe:
            self.mlp = MoELayer(cfg.hidden_size, cfg.moe_config(), cfg.dtype, rng,
                                cfg.initializer_range, name=f"model.layers.{index}.mlp")
        else:
            self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, cfg.dtype, rng,
                              cfg.initializer_range)

    def forward(self, x, positions):
        """(x, the MoE layer's weighted losses or None)."""
        x = x + self.self_attn(self.input_layernorm(x), positions)
        h = self.post_attention_layernorm(x)
        if not self.is_moe:
            return x + self.mlp(h), None
        out, losses = self.mlp(h)
        return x + out, losses


class Ernie4_5Model(Module):
    def __init__(self, cfg: Ernie4_5Config, rng):
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, cfg.dtype, rng,
                                      std=cfg.initializer_range)
        self.layers = LayerList(Ernie4_5DecoderLayer(cfg, i, rng)
                                for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype)

    def forward(self, input_ids):
        """(hidden states, the sum of the MoE layers' losses or None)."""
        x = self.embed_tokens(input_ids)
        positions = F.iota([input_ids.shape[1]], 0, "i64")
        aux = None
        for layer in self.layers:
            x, losses = layer(x, positions)
            if losses is not None:
                aux = losses if aux is None else aux + losses
        return self.norm(x), aux


class Ernie4_5ForCausalLM(Module):
    """The dense model, and (with moe_num_experts > 0) the MoE one."""

    def __init__(self, cfg: Ernie4_5Config):
        super().__init__()
        rng = np.random.default_rng(cfg.seed)
        self.config = cfg
        self.model = Ernie4_5Model(cfg, rng)
        if not cfg.tie_word_embeddings:
            self.lm_head = _linear(cfg, rng, cfg.hidden_size, cfg.vocab_size)

    def parallelize_plan(self, sequence_parallel: bool = False) -> dict:
        """The module's parallelize_plan over this model (sequence
        parallelism is not part of ERNIE 4.5's plan)."""
        if sequence_parallel:
            raise ValueError("ERNIE 4.5's tensor-parallel plan has no sequence-parallel form")
        return parallelize_plan(self.config.tie_word_embeddings)

    @property
    def split_spec(self) -> str:
        """pp_config's split_spec: a stage boundary between decoder layers."""
        return "model.layers"

    def forward(self, input_ids, labels=None):
        h, aux = self.model(input_ids)
        if self.config.tie_word_embeddings:
            logits = _tied_head(self.model.embed_tokens, h)
        else:
            logits = self.lm_head(h)
        if labels is None:
            return logits
        if logits.dtype != "f32" and logits.dtype != "f64":
            logits = logits.astype("f32")
        cfg = self.config
        loss = causal_lm_loss(logits, labels, cfg.pre_shifted_labels)
        if cfg.output_router_logits and cfg.router_aux_loss_coef:
            balance = load_balancing_loss((layer.mlp for layer in self.model.layers
                                           if layer.is_moe), cfg.moe_num_experts, cfg.moe_k)
            if balance is not None:
                F.report_metric("aux_loss", balance)  # transformers' outputs.aux_loss
                balance = balance * cfg.router_aux_loss_coef
                aux = balance if aux is None else aux + balance
        if aux is not None:
            F.report_metric("lm_loss", loss)
            loss = loss + (aux.astype(loss.dtype) if aux.dtype != loss.dtype else aux)
        return loss


    # -- Hugging Face folders (eager: every tensor read on the host) --------

    @classmethod
    def from_pretrained(cls, folder, dtype=None, **overrides):
        """The model of a Hugging Face folder (config.json and
        model.safetensors or its shards): Hugging Face's [out, in] Linears
        transposed to ernie's [in, out], each expert's projections stacked
        into [E, in, out], `moe_statics.e_score_correction_bias` [1, E] into
        the layers' selection bias. `dtype` defaults to the file's
        torch_dtype; `overrides` set other config fields (the capacity
        factor, loss coefficients). A tensor the model has no place for, or
        one it lacks, is a ValueError naming it."""
        hf, index = hf_folder_index(folder)
        if dtype is not None:
            overrides["dtype"] = dtype
        cfg = Ernie4_5Config.from_json(hf, **overrides)
        model = cls(cfg)
        object.__setattr__(model, "hf_config", dict(hf))  # written back by save_pretrained
        if is_fused(index):  # transformers' own layout
            return load_fused_folder(model, folder, index)
        if all(p.value is None for p in model.parameters()):  # built abstract
            object.__setattr__(model, "pretrained_weights", model.hf_weight_map(folder))
            model.load_selection_biases(folder)
            return model
        _, weights, _ = read_hf_folder(folder)
        state, biases = ernie_state_from_hf(weights, cfg, where=str(folder))
        for name, p in model.named_parameters():
            p.value = _rounded(state[name], p.dtype).astype(p.value.dtype)
        for i, layer in enumerate(model.model.layers):
            if layer.is_moe:
                layer.mlp.e_score_correction_bias = biases[i]
        return model

    def hf_weight_map(self, folder):
        """{parameter: [(file, tensor, offsets, transposed)]} of a Hugging
        Face folder, from its index and headers alone: Program.load_weights
        (and ernie.compile of a model built under ernie.nn.abstract()) reads
        each rank's pieces — a rank holding experts 8-15 reads only theirs.
        The selection biases are not parameters: set them with
        `load_selection_biases(folder)`."""
        _, index = hf_folder_index(folder)
        _check_leftovers(index, self.config, folder)
        return folder_weight_map(folder, index, _hf_tensors(self.config))

    def load_selection_biases(self, folder):
        """Each MoE layer's `e_score_correction_bias` from a Hugging Face
        folder (only those tensors' bytes are read); zeros where the folder
        has none."""
        _, index = hf_folder_index(folder)
        for name, i in _bias_names(self.config).items():
            if name in index:
                value = read_tensors(index[name][0], [name])[name]
                self.model.layers[i].mlp.e_score_correction_bias = np.asarray(
                    value, np.float32).reshape(-1)

    def save_pretrained(self, folder, dtype=None, max_shard_bytes=None, state=None):
        """Writes the model as a Hugging Face folder in Hugging Face's names
        and layout (experts unstacked), `dtype` defaulting to the model's;
        `state` (a program's state_dict()) writes trained values. A model
        read by from_pretrained writes back every config field it read."""
        cfg = self.config
        dtype = dtype or cfg.dtype
        values = {n: p.value for n, p in self.named_parameters()}
        if state is not None:
            values.update({n: state[n] for n in values if n in state})
        # A trained program's state holds the balanced biases (aux-free).
        self._name_parameters()
        biases = {i: (state or {}).get(l.mlp.bias_name(), l.mlp.e_score_correction_bias)
                  for i, l in enumerate(self.model.layers) if l.is_moe}
        # Every field read, ernie's over them.
        config = {**getattr(self, "hf_config", {}), **_hf_config(cfg, dtype)}
        write_hf_folder(folder, config, hf_state_from_ernie(values, biases, cfg), dtype,
                        max_shard_bytes)


_HF_ARCH = {False: "Ernie4_5ForCausalLM", True: "Ernie4_5_MoeForCausalLM"}
_BIAS_SLOT = ":e_score_correction_bias"


def _hf_config(cfg: Ernie4_5Config, dtype: str) -> dict:
    """config.json's fields for `cfg`, Hugging Face's names and dtype."""
    config = {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name not in _NOT_HF_FIELDS}
    config.update(architectures=[_HF_ARCH[bool(cfg.moe_num_experts)]],
                  model_type="ernie4_5_moe" if cfg.moe_num_experts else "ernie4_5",
                  hidden_act="silu", use_bias=False,
                  torch_dtype={v: k for k, v in TORCH_DTYPES.items()}[dtype])
    return config


def _hf_tensors(cfg: Ernie4_5Config, biases: bool = False) -> list:
    """Hugging Face's tensors of the model `cfg` builds (weights.hf_layout,
    the runtime's rule table): Linears transposed, experts slices [e] of
    the stacked parameters; with `biases` also each MoE layer's selection
    bias (`moe_statics.e_score_correction_bias` [1, E] of the state [E])."""
    with abstract():
        model = (Ernie4_5_MoeForCausalLM if cfg.moe_num_experts else Ernie4_5ForCausalLM)(cfg)
    model._name_parameters()
    states = [(name, p.shape) for name, p in model.named_parameters()]
    return [t for t in weights_layout(_hf_config(cfg, cfg.dtype), states)
            if biases or not t.state.endswith(_BIAS_SLOT)]


def _bias_names(cfg):
    """{Hugging Face's selection-bias tensor: its layer index}."""
    return {t.name: int(t.state.split(".")[2]) for t in _hf_tensors(cfg, biases=True)
            if t.state.endswith(_BIAS_SLOT)}


def _check_leftovers(names, cfg, where):
    """Raises for Hugging Face tensors the model has no place for (besides
    rotary caches and a tied head's copy)."""
    known = {t.name for t in _hf_tensors(cfg, biases=True)}
    leftover = sorted(n for n in names if n not in known and not n.endswith("inv_freq")
                      and not (cfg.tie_word_embeddings and n == "lm_head.weight"))
    if leftover:
        raise ValueError(f"{where}: weights ernie's Ernie4_5 has no place for: {leftover[:5]}")


def _expert(t):
    """The expert index of a tensor of stacked experts, else None."""
    return t.offsets[0] if len(t.offsets) > len(t.shape) else None


def ernie_state_from_hf(weights: dict, cfg: Ernie4_5Config, where="weights"):
    """(ernie parameters, {MoE layer index: selection bias [E]}) from
    Hugging Face's tensors."""
    _check_leftovers(weights, cfg, where)
    state, stacks = {}, {}
    for t in _hf_tensors(cfg):
        if t.name not in weights:
            raise ValueError(f"{where}: no tensor '{t.name}' (for ernie's '{t.state}')")
        value = np.asarray(weights[t.name])
        value = value.T if t.transposed else value
        if _expert(t) is None:
            state[t.state] = value
        else:
            stacks.setdefault(t.state, {})[_expert(t)] = value
    for name, by_expert in stacks.items():
        state[name] = np.stack([by_expert[e] for e in range(cfg.moe_num_experts)])
    biases = {i: np.asarray(weights.get(n, np.zeros(cfg.moe_num_experts)),
                            np.float32).reshape(-1)
              for n, i in _bias_names(cfg).items()}
    return state, biases


def hf_state_from_ernie(values: dict, biases: dict, cfg: Ernie4_5Config) -> dict:
    """The inverse of ernie_state_from_hf, in Hugging Face's order."""
    out = {}
    for t in _hf_tensors(cfg):
        value = np.asarray(values[t.state])
        value = value[_expert(t)] if _expert(t) is not None else value
        out[t.name] = np.ascontiguousarray(value.T if t.transposed else value)
    for name, i in _bias_names(cfg).items():
        out[name] = np.asarray(biases[i], np.float32).reshape(1, -1)
    return out


class Ernie4_5_MoeForCausalLM(Ernie4_5ForCausalLM):
    """Hugging Face's name for the MoE model (moe_num_experts > 0)."""

    def __init__(self, cfg: Ernie4_5Config):
        if not cfg.moe_num_experts:
            raise ValueError("Ernie4_5_MoeForCausalLM needs moe_num_experts > 0")
        super().__init__(cfg)


def parallelize_plan(tie_word_embeddings: bool = True):
    """Paddle's tensor-parallel plan for ERNIE 4.5 (mp_config): the
    embedding split on hidden, q/k/v and gate/up column-parallel, o and
    down row-parallel — in attention, the dense MLPs, the shared experts
    and, within each expert, the stacked experts (their expert dimension is
    ep_config's) — and an untied LM head column-parallel (vocab-parallel
    logits)."""
    layer = r"model\.layers\.\d+\."
    mlp = layer + r"mlp\.(?:shared_experts\.|experts\.)?"
    head = {} if tie_word_embeddings else {"lm_head": ColWiseParallel()}
    return {**head,
        r"model\.embed_tokens": ColWiseParallel(),
        layer + r"self_attn\.(q|k|v)_proj": ColWiseParallel(),
        layer + r"self_attn\.o_proj": RowWiseParallel(),
        mlp + r"(gate|up)_proj\.weight": ColWiseParallel(),
        mlp + r"down_proj\.weight": RowWiseParallel(),
    }

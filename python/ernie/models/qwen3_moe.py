"""Qwen3-MoE (Hugging Face's `qwen3_moe` model type).

Qwen3's decoder (ernie.models.qwen3: q/k norms per head, no biases) whose
MLP is a mixture of experts on the layers Hugging Face makes sparse:
layer i (from 0) when `num_experts > 0`, `(i + 1) % decoder_sparse_step ==
0` and i is not in `mlp_only_layers`; a dense SwiGLU of
`intermediate_size` elsewhere. The MoE layer is ERNIE 4.5's
(`ernie.moe.MoELayer`): an f32 router `Linear(hidden, num_experts)`, a
softmax over the experts, the `num_experts_per_tok` most probable chosen
and their probabilities renormalised to sum to 1 when `norm_topk_prob`
(else weighting the experts as they are), SwiGLU experts of
`moe_intermediate_size` stacked [E, in, out], no shared experts, dropless
(`moe_capacity_factor` None) unless asked.

The loss is Hugging Face's: the mean cross-entropy of `labels` (Hugging
Face's labels = input_ids, shifted in the model; pre-shifted ones with
`pre_shifted_labels`, as for Llama), plus, when `output_router_logits`,
`router_aux_loss_coef` times the load-balancing loss Hugging Face forms
over every sparse layer at once (`load_balancing_loss_func`): with L
sparse layers of T tokens, U_e the choices of expert e and P_e the sum of
its router probabilities over all of them,
`E * sum_e (U_e / (L T)) * (P_e / (L T))` — not the sum of per-layer
losses. With `output_router_logits` false (the published configs'
setting) there is none, as in Hugging Face.

Parameter names: `qwen3_moe.layers.{i}.mlp.gate.weight` [hidden, E],
`qwen3_moe.layers.{i}.mlp.experts.{gate,up,down}_proj.weight` [E, in,
out] beside Qwen3's; Hugging Face's `model.layers.{i}.mlp.gate.weight`
[E, hidden] and `mlp.experts.{e}.{gate,up,down}_proj.weight` [out, in]
(the layout transformers 5 still saves) through the Llama family's
`from_pretrained` / `save_pretrained`. Newer transformers write the
expert count as `num_local_experts`; both names are read.

Parallelism: `model.parallelize_plan()` is Qwen3's Megatron plan with the
experts' projections split within each expert (column / row); expert
parallelism is `ep_config` as for ERNIE 4.5 (the experts' dimension 0).
The load-balancing loss reads every sparse layer's routing at once
(ernie.moe.load_balancing_loss); under pp_config each stage's per-expert
sums travel to the last stage with the activations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .. import distributed as dist
from .. import functional as F
from ..moe import MoEConfig, load_balancing_loss
from .config_checks import check_counts, check_finite, check_size
from .llama import LlamaForCausalLM, causal_lm_loss
from .llama import parallelize_plan as _llama_plan
from .qwen3 import Qwen3Config

_MOE_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
             "decoder_sparse_step", "mlp_only_layers", "norm_topk_prob", "output_router_logits",
             "router_aux_loss_coef")


@dataclass
class Qwen3MoeConfig(Qwen3Config):
    model_type: ClassVar[str] = "qwen3_moe"
    architecture: ClassVar[str] = "Qwen3MoeForCausalLM"
    family: ClassVar[str] = "Qwen3-MoE"
    base_model_prefix: ClassVar[str] = "qwen3_moe"
    # transformers 5's Qwen3MoeConfig has no head_dim of its own:
    # hidden_size // num_attention_heads where config.json names none.
    hf_defaults: ClassVar[dict] = {}
    hf_keys: ClassVar[tuple] = _MOE_KEYS
    hf_aliases: ClassVar[dict] = {"num_local_experts": "num_experts"}

    num_experts: int = 4
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 32
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple = ()
    # Hugging Face's defaults (the published configs set norm_topk_prob).
    norm_topk_prob: bool = False
    output_router_logits: bool = False
    router_aux_loss_coef: float = 0.001
    moe_capacity_factor: float | None = None  # None: dropless, as Hugging Face

    def __post_init__(self):
        if isinstance(self.mlp_only_layers, list):
            self.mlp_only_layers = tuple(self.mlp_only_layers)
        if not isinstance(self.mlp_only_layers, tuple) or any(
                isinstance(i, bool) or not isinstance(i, int) for i in self.mlp_only_layers):
            raise TypeError(f"Qwen3MoeConfig.mlp_only_layers must be a list of layer indices, "
                            f"got {self.mlp_only_layers!r}")
        check_counts(self, ("num_experts",), minimum=0)
        check_counts(self, ("num_experts_per_tok", "moe_intermediate_size",
                            "decoder_sparse_step"))
        check_finite(self, ("router_aux_loss_coef",), minimum=0.0)
        check_finite(self, ("moe_capacity_factor",), positive=True,
                     optional=("moe_capacity_factor",))
        for name in ("norm_topk_prob", "output_router_logits"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"Qwen3MoeConfig.{name} must be true or false, got "
                                f"{getattr(self, name)!r}")
        super().__post_init__()
        if self.num_experts and self.num_experts_per_tok > self.num_experts:
            raise ValueError(f"Qwen3MoeConfig.num_experts_per_tok = {self.num_experts_per_tok} "
                             f"is more than num_experts = {self.num_experts}")
        h = self.hidden_size
        sparse = sum(map(self.is_moe_layer, range(self.num_hidden_layers)))
        experts = self.num_experts * (3 * h * self.moe_intermediate_size + h)
        check_size(self, self.num_hidden_layers, sparse * experts + self.num_hidden_layers * (
            h * (self.num_attention_heads + 2 * self.num_key_value_heads) * self.head_dim * 2
            + 3 * h * self.intermediate_size) + 2 * self.vocab_size * h)

    def is_moe_layer(self, index: int) -> bool:
        return (self.num_experts > 0 and (index + 1) % self.decoder_sparse_step == 0
                and index not in self.mlp_only_layers)

    def moe_config(self) -> MoEConfig:
        return MoEConfig(num_experts=self.num_experts, k=self.num_experts_per_tok,
                         intermediate_size=self.moe_intermediate_size,
                         capacity_factor=self.moe_capacity_factor,
                         norm_topk_prob=self.norm_topk_prob)

    def to_hf(self, dtype: str) -> dict:
        out = super().to_hf(dtype)
        out["mlp_only_layers"] = list(self.mlp_only_layers)
        return out


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    """Hugging Face's Qwen3MoeForCausalLM."""

    config_class = Qwen3MoeConfig

    def forward(self, input_ids, labels=None):
        logits = self.logits(self.base_model(input_ids))
        if labels is None:
            return logits
        cfg = self.config
        loss = causal_lm_loss(logits, labels, cfg.pre_shifted_labels)
        if cfg.output_router_logits and cfg.router_aux_loss_coef:
            aux = self.load_balancing_loss()
            if aux is not None:
                # transformers' outputs.aux_loss (unweighted), apart.
                F.report_metric("lm_loss", loss)
                F.report_metric("aux_loss", aux)
                loss = loss + (aux.astype(loss.dtype) if aux.dtype != loss.dtype else aux) * \
                    cfg.router_aux_loss_coef
        return loss

    def load_balancing_loss(self):
        """Hugging Face's load_balancing_loss_func over the sparse layers of
        the trace just made (None without any): ernie.moe.load_balancing_loss."""
        cfg = self.config
        return load_balancing_loss((layer.mlp for layer in self.base_model.layers
                                    if layer.is_moe), cfg.num_experts, cfg.num_experts_per_tok)

    def parallelize_plan(self, sequence_parallel: bool = False) -> dict:
        cfg = self.config
        dense = not all(map(cfg.is_moe_layer, range(cfg.num_hidden_layers)))
        sparse = any(map(cfg.is_moe_layer, range(cfg.num_hidden_layers)))
        return parallelize_plan(sequence_parallel, cfg.tie_word_embeddings, dense, sparse,
                                cfg.base_model_prefix)


def parallelize_plan(sequence_parallel: bool = False, tie_word_embeddings: bool = False,
                     dense_layers: bool = True, sparse_layers: bool = True,
                     prefix: str = Qwen3MoeConfig.base_model_prefix) -> dict:
    """Qwen3's Megatron plan (ernie.models.llama.parallelize_plan) over
    Qwen3-MoE's names, the stacked experts' gate/up split by columns and
    down by rows within each expert (their expert dimension is
    ep_config's); the router stays replicated. Without dense layers
    (every layer sparse, the published sizes) the dense MLP's entries are
    left out, without sparse ones the experts'."""
    plan = _llama_plan(sequence_parallel, tie_word_embeddings, prefix)
    if not dense_layers:
        del plan[f"{prefix}.layers.*.mlp.(gate|up|gate_up)_proj"]
        del plan[f"{prefix}.layers.*.mlp.down_proj"]
    if sparse_layers:
        experts = prefix + r"\.layers\.\d+\.mlp\.experts\."
        plan.update({experts + r"(gate|up)_proj\.weight": dist.ColWiseParallel(),
                     experts + r"down_proj\.weight": dist.RowWiseParallel()})
    return plan

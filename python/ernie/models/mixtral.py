"""Mixtral (Hugging Face's `mixtral` model type).

Mistral's decoder (sliding-window attention when `sliding_window` is set;
ernie.models.mistral) whose every MLP is a mixture of
`num_local_experts` SwiGLU experts of `intermediate_size`, routed as
Qwen3-MoE routes (ernie.models.qwen3_moe, the same `ernie.moe.MoELayer`):
a softmax over the experts, the `num_experts_per_tok` most probable chosen
and their probabilities renormalised (Mixtral always does), dropless, no
shared experts; with `output_router_logits`, `router_aux_loss_coef` times
transformers' load-balancing loss over all layers at once.

Parameter names follow Qwen3-MoE's under `mixtral.` (`mixtral.layers.{i}.
mlp.gate.weight` [hidden, E], `mixtral.layers.{i}.mlp.experts.{gate,up,
down}_proj.weight` [E, in, out]); Hugging Face's saved names are
`model.layers.{i}.block_sparse_moe.gate.weight` and
`block_sparse_moe.experts.{e}.w1/w3/w2.weight` (gate, up, down), one rule
of the runtime's table (`HfLayout.h`). A router jitter is refused (ernie's
routing is deterministic).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .qwen3_moe import Qwen3MoeConfig, Qwen3MoeForCausalLM
from .llama import LlamaConfig


@dataclass
class MixtralConfig(Qwen3MoeConfig):
    model_type: ClassVar[str] = "mixtral"
    architecture: ClassVar[str] = "MixtralForCausalLM"
    family: ClassVar[str] = "Mixtral"
    base_model_prefix: ClassVar[str] = "mixtral"
    hf_fixed: ClassVar[tuple] = (("hidden_act", "silu"), ("attention_dropout", 0.0),
                                 ("router_jitter_noise", 0.0))
    hf_defaults: ClassVar[dict] = {"rope_theta": 1e6}
    hf_keys: ClassVar[tuple] = ("num_experts", "num_experts_per_tok", "output_router_logits",
                                "router_aux_loss_coef", "sliding_window")
    hf_aliases: ClassVar[dict] = {"num_local_experts": "num_experts"}
    family_flags: ClassVar[dict] = {"qkv_bias": False, "qk_norm": False, "norm_topk_prob": True,
                                    "decoder_sparse_step": 1, "mlp_only_layers": ()}

    qk_norm: bool = False
    num_experts: int = 8
    norm_topk_prob: bool = True
    rope_theta: float = 1e6
    moe_intermediate_size: int | None = None  # Mixtral's experts are intermediate_size wide

    def __post_init__(self):
        if self.moe_intermediate_size is None:
            self.moe_intermediate_size = self.intermediate_size
        if self.moe_intermediate_size != self.intermediate_size:
            raise ValueError(f"MixtralConfig: the experts are intermediate_size = "
                             f"{self.intermediate_size} wide, not {self.moe_intermediate_size}")
        super().__post_init__()
        if not self.num_experts:
            raise ValueError("MixtralConfig: num_local_experts must be >= 1")

    def to_hf(self, dtype: str) -> dict:
        out = LlamaConfig.to_hf(self, dtype)
        out["num_local_experts"] = out.pop("num_experts")  # Mixtral's name
        return out


class MixtralForCausalLM(Qwen3MoeForCausalLM):
    """Hugging Face's MixtralForCausalLM."""

    config_class = MixtralConfig

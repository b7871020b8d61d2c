"""Qwen3 (Hugging Face's `qwen3` model type): dense models.

The Llama decoder (ernie.models.llama) with an RMSNorm over head_dim on
each query and key head, applied after the projection and before rope
(Hugging Face's Qwen3Attention: `q_norm`, `k_norm`, weights [head_dim]),
no biases, and an explicit `head_dim` that need not be hidden_size /
num_attention_heads (Qwen3-0.6B: 16 heads of 128 over a hidden size of
1024; Hugging Face's default, when config.json names none, is 128).
Parameter names: `qwen3.layers.{i}.self_attn.{q,k}_norm.weight` beside
Llama's, under the `qwen3.` prefix; Hugging Face folders in Hugging Face's
names through the Llama family's `from_pretrained` / `save_pretrained`.

`attention_bias: true`, sliding-window attention and rope scaling other
than the default are refused naming the field.

Tensor parallelism: `model.parallelize_plan()`: Llama's Megatron pairs;
q_norm and k_norm stay replicated (each rank norms whole heads of its
own). Pipeline: `pp_config = {"split_spec": "qwen3.layers"}`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .llama import LlamaConfig, LlamaForCausalLM
from .llama import parallelize_plan as _llama_plan


@dataclass
class Qwen3Config(LlamaConfig):
    model_type: ClassVar[str] = "qwen3"
    architecture: ClassVar[str] = "Qwen3ForCausalLM"
    family: ClassVar[str] = "Qwen3"
    base_model_prefix: ClassVar[str] = "qwen3"
    hf_fixed: ClassVar[tuple] = (("hidden_act", "silu"), ("attention_bias", False),
                                 ("use_sliding_window", False), ("attention_dropout", 0.0))
    hf_defaults: ClassVar[dict] = {"head_dim": 128}

    family_flags: ClassVar[dict] = {"qkv_bias": False, "qk_norm": True, "sliding_window": None}

    qk_norm: bool = True


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Hugging Face's Qwen3ForCausalLM (the dense Qwen3 sizes)."""

    config_class = Qwen3Config


def parallelize_plan(sequence_parallel: bool = False, tie_word_embeddings: bool = False) -> dict:
    """The Llama plan (ernie.models.llama.parallelize_plan) over Qwen3's
    names."""
    return _llama_plan(sequence_parallel, tie_word_embeddings, Qwen3Config.base_model_prefix)

"""Mistral (Hugging Face's `mistral` model type).

The Llama decoder (ernie.models.llama) with sliding-window attention:
with `sliding_window` set, each query attends to the last
`sliding_window` keys, itself included (transformers' mask: key j is
seen by query i when i - sliding_window < j <= i), computed by
`ernie.attention`'s `window` on the CPU and in the CUDA kernels, with its
gradient and sharding rules; `sliding_window` null (Mistral v0.2 onward)
is full causal attention. No biases, an untied head by default, the
config's rope theta. Parameter names are under `mistral.`
(`mistral.layers.{i}.self_attn.q_proj.weight`, ...); Hugging Face folders
are read and written in Hugging Face's names and [out, in] layout (the
runtime's rule table, `ernie.weights.hf_layout`).

Tensor parallelism: `model.parallelize_plan()` (Llama's Megatron pairs);
the window splits nothing (heads and batch split as before; the sequence
is never split inside attention). Pipeline: `pp_config = {"split_spec":
"mistral.layers"}`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .llama import LlamaConfig, LlamaForCausalLM
from .llama import parallelize_plan as _llama_plan


@dataclass
class MistralConfig(LlamaConfig):
    model_type: ClassVar[str] = "mistral"
    architecture: ClassVar[str] = "MistralForCausalLM"
    family: ClassVar[str] = "Mistral"
    base_model_prefix: ClassVar[str] = "mistral"
    hf_fixed: ClassVar[tuple] = (("hidden_act", "silu"), ("attention_dropout", 0.0))
    hf_keys: ClassVar[tuple] = ("sliding_window",)
    family_flags: ClassVar[dict] = {"qkv_bias": False, "qk_norm": False}


class MistralForCausalLM(LlamaForCausalLM):
    """Hugging Face's MistralForCausalLM."""

    config_class = MistralConfig


def parallelize_plan(sequence_parallel: bool = False, tie_word_embeddings: bool = False) -> dict:
    """The Llama plan over Mistral's names."""
    return _llama_plan(sequence_parallel, tie_word_embeddings, MistralConfig.base_model_prefix)

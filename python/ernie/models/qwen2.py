"""Qwen2 and Qwen2.5 (Hugging Face's `qwen2` model type).

The Llama decoder (ernie.models.llama) with biases on the q, k and v
projections (none on o_proj or the MLP), an LM head tied to the embedding
or not (`tie_word_embeddings`: Qwen2.5's small sizes tie it), and a rope
theta of the config's (1e6 in Qwen2.5's published configs). Parameter
names are Paddle's Qwen2 (`qwen2.embed_tokens.weight`,
`qwen2.layers.{i}.self_attn.{q,k,v}_proj.{weight,bias}`, ...,
`qwen2.norm.weight`, `lm_head.weight`), Linears [in, out]; Hugging Face
folders are read and written in Hugging Face's names and [out, in]
layout by the Llama family's `from_pretrained` / `save_pretrained` (one
table, `llama.hf_layout`).

Sliding-window attention (`use_sliding_window: true`, or `layer_types`
naming `sliding_attention`) and rope scaling other than the default are
refused naming the field: ernie's attention has neither. Published Qwen2
and Qwen2.5 configs leave the window off.

Tensor parallelism: `model.parallelize_plan()` (or `parallelize_plan(...,
prefix="qwen2")`): Llama's Megatron pairs, the biases split with their
q/k/v columns. Pipeline: `pp_config = {"split_spec": "qwen2.layers"}`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .llama import LlamaConfig, LlamaForCausalLM
from .llama import parallelize_plan as _llama_plan


@dataclass
class Qwen2Config(LlamaConfig):
    model_type: ClassVar[str] = "qwen2"
    architecture: ClassVar[str] = "Qwen2ForCausalLM"
    family: ClassVar[str] = "Qwen2"
    base_model_prefix: ClassVar[str] = "qwen2"
    hf_fixed: ClassVar[tuple] = (("hidden_act", "silu"), ("use_sliding_window", False),
                                 ("attention_dropout", 0.0))

    family_flags: ClassVar[dict] = {"qkv_bias": True, "qk_norm": False, "sliding_window": None}

    qkv_bias: bool = True


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Hugging Face's Qwen2ForCausalLM (Qwen2, Qwen2.5)."""

    config_class = Qwen2Config


def parallelize_plan(sequence_parallel: bool = False, tie_word_embeddings: bool = False) -> dict:
    """The Llama plan (ernie.models.llama.parallelize_plan) over Qwen2's
    names."""
    return _llama_plan(sequence_parallel, tie_word_embeddings, Qwen2Config.base_model_prefix)

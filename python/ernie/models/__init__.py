"""Model families with Hugging Face's config fields and weight names (Llama,
Qwen2 / Qwen2.5, Qwen3, Qwen3-MoE, ERNIE 4.5 dense and MoE), and the
classes that pick one from a folder's config.json as `transformers` does."""

from .auto import AutoConfig, AutoModelForCausalLM  # noqa: F401

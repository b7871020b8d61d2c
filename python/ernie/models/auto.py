"""AutoConfig and AutoModelForCausalLM: the family from config.json.

As `transformers` picks a class: by `model_type`, else by the first of
`architectures` ernie knows. A type ernie has no family for is an error
listing the ones it has.

    model = ernie.models.AutoModelForCausalLM.from_pretrained("path/to/folder")
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..weights import read_json
from .ernie4_5 import Ernie4_5Config, Ernie4_5ForCausalLM, Ernie4_5_MoeForCausalLM
from .llama import LlamaForCausalLM
from .qwen2 import Qwen2ForCausalLM
from .qwen3 import Qwen3ForCausalLM
from .qwen3_moe import Qwen3MoeForCausalLM
from .mistral import MistralForCausalLM
from .mixtral import MixtralForCausalLM
from .deepseek_v3 import DeepseekV3Config, DeepseekV3ForCausalLM


def _llama_family(model_class):
    """(config.json -> config, model class) of a Llama-shaped family."""
    config_class = model_class.config_class
    return (lambda hf: config_class(**config_class.fields_from_hf(hf)), model_class)


# model_type -> (how its config.json becomes a config, the model class).
FAMILIES = {
    "llama": _llama_family(LlamaForCausalLM),
    "qwen2": _llama_family(Qwen2ForCausalLM),
    "qwen3": _llama_family(Qwen3ForCausalLM),
    "qwen3_moe": _llama_family(Qwen3MoeForCausalLM),
    "mistral": _llama_family(MistralForCausalLM),
    "mixtral": _llama_family(MixtralForCausalLM),
    "deepseek_v3": (DeepseekV3Config.from_hf, DeepseekV3ForCausalLM),
    "ernie4_5": (Ernie4_5Config.from_json, Ernie4_5ForCausalLM),
    "ernie4_5_moe": (Ernie4_5Config.from_json, Ernie4_5_MoeForCausalLM),
}
# Hugging Face's class names -> model_type.
ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
                 "Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3_moe",
                 "Ernie4_5ForCausalLM": "ernie4_5", "Ernie4_5_MoeForCausalLM": "ernie4_5_moe",
                 "MistralForCausalLM": "mistral", "MixtralForCausalLM": "mixtral",
                 "DeepseekV3ForCausalLM": "deepseek_v3"}


def _config_json(folder) -> dict:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: no config.json (not a Hugging Face model folder)")
    hf = read_json(path)
    if not isinstance(hf, dict):
        raise ValueError(f"{path}: not a JSON object")
    return hf


def family_of(hf: dict, where="config.json") -> str:
    """The model_type of the family `hf` (a config.json) describes."""
    model_type = hf.get("model_type")
    if model_type in FAMILIES:
        return model_type
    architectures = hf.get("architectures") or []
    if not isinstance(architectures, list):
        raise ValueError(f"{where}: architectures is a list of class names, "
                         f"not {architectures!r}")
    for name in architectures:
        if name in ARCHITECTURES:
            return ARCHITECTURES[name]
    raise ValueError(f"{where}: model_type {model_type!r} (architectures {architectures}) is "
                     f"not a family ernie has; it has {', '.join(sorted(FAMILIES))} "
                     f"({', '.join(sorted(ARCHITECTURES))})")


class AutoConfig:
    """The config of a Hugging Face folder's family."""

    @staticmethod
    def from_pretrained(folder):
        hf = _config_json(folder)
        make_config, _ = FAMILIES[family_of(hf, Path(folder) / "config.json")]
        return make_config(hf)


class AutoModelForCausalLM:
    """The causal language model of a Hugging Face folder's family."""

    @staticmethod
    def model_class(folder):
        hf = _config_json(folder)
        return FAMILIES[family_of(hf, Path(folder) / "config.json")][1]

    @staticmethod
    def from_pretrained(folder, dtype=None, **overrides):
        """The family's from_pretrained (its weights, its config; under
        ernie.nn.abstract() only headers are read)."""
        return AutoModelForCausalLM.model_class(folder).from_pretrained(folder, dtype, **overrides)

    @staticmethod
    def from_config(hf: dict, seed: int = 0, where="the config", **overrides):
        """A new model of the family `hf` names (a config.json's fields,
        model_type among them), its weights drawn from `seed`; `overrides`
        set other config fields (pre_shifted_labels, ...)."""
        make_config, model_class = FAMILIES[family_of(hf, where)]
        return model_class(dataclasses.replace(make_config(hf), seed=seed, **overrides))

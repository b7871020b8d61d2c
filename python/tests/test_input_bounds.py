"""Hostile inputs to the Python API end in errors of the documented kinds
(ValueError, TypeError, OSError, RuntimeError) naming the argument, field or
file: Hugging Face config and index files nested deeply or holding NaN,
configs implying absurd sizes (refused before a layer is built), fields a
model cannot express, NaN where a finite number is meant, damaged
safetensors headers (docs/integrity.md).
"""

import json
import math
import os
import time

import numpy as np
import pytest

import ernie
import ernie.distributed as dist
import ernie.weights as weights
from ernie.models.ernie4_5 import Ernie4_5Config, Ernie4_5ForCausalLM
from ernie.models.llama import LlamaConfig, LlamaForCausalLM
from ernie.moe import MoEConfig

HF_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 40,
            "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu",
            "torch_dtype": "float32"}


def folder(tmp_path, config_text, name="m"):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(config_text)
    weights.save_file({"w": np.zeros(2, np.float32)}, d / "model.safetensors")
    return d


def test_config_files_are_read_within_bounds(tmp_path):
    deep = '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(ValueError, match="config.json: JSON nested deeper than 64"):
        LlamaForCausalLM.from_pretrained(folder(tmp_path, deep, "deep"))
    with pytest.raises(ValueError, match="config.json: not valid JSON: NaN is not a JSON number"):
        LlamaForCausalLM.from_pretrained(folder(tmp_path, json.dumps(
            {**HF_LLAMA, "rms_norm_eps": math.nan}), "nan"))
    with pytest.raises(ValueError, match="config.json: not valid JSON"):
        weights.hf_folder_index(folder(tmp_path, "{\"a\": [1,", "cut"))
    d = folder(tmp_path, json.dumps(HF_LLAMA), "index")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": 7}}))
    with pytest.raises(ValueError, match="tensor 'w' names no file"):
        weights.hf_folder_index(d)
    (d / "model.safetensors.index.json").unlink()
    os.mkfifo(d / "model.safetensors.index.json")
    with pytest.raises(OSError, match="not a regular file"):
        weights.hf_folder_index(d)


def test_config_sizes_are_bounded_before_any_layer_is_built(tmp_path):
    start = time.monotonic()
    with pytest.raises(ValueError, match="num_hidden_layers = 1099511627776 is over the limit"):
        LlamaForCausalLM.from_pretrained(folder(tmp_path, json.dumps(
            {**HF_LLAMA, "num_hidden_layers": 2 ** 40})))
    with pytest.raises(ValueError, match="implies .* parameters, over the limit"):
        LlamaConfig(hidden_size=2 ** 24, num_attention_heads=1, num_key_value_heads=1,
                    intermediate_size=2 ** 24, vocab_size=2 ** 20)
    with pytest.raises(ValueError, match="num_hidden_layers = 1099511627776"):
        Ernie4_5Config(num_hidden_layers=2 ** 40)
    assert time.monotonic() - start < 5
    for bad, kind, message in [
        ({"num_hidden_layers": -1}, ValueError, "num_hidden_layers must be >= 1"),
        ({"hidden_size": 16.5}, TypeError, "hidden_size must be an integer"),
        ({"vocab_size": True}, TypeError, "vocab_size must be an integer"),
        ({"rope_theta": math.inf}, ValueError, "rope_theta must be finite"),
        ({"rms_norm_eps": math.nan}, ValueError, "rms_norm_eps must be finite"),
    ]:
        with pytest.raises(kind, match=message):
            LlamaConfig(**bad)
        with pytest.raises(kind, match=message):
            Ernie4_5Config(**bad)


def test_fields_a_model_cannot_express_are_refused_naming_them():
    base = {"hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2}
    with pytest.raises(ValueError, match="rope_scaling"):
        Ernie4_5Config.from_json({**base, "rope_scaling": {"type": "yarn", "factor": 4.0}})
    with pytest.raises(ValueError, match="torch_dtype 'int8' is not one of"):
        Ernie4_5Config.from_json({**base, "torch_dtype": "int8"})
    with pytest.raises(ValueError, match="torch_dtype 'int8' is not one of"):
        LlamaForCausalLM.from_pretrained  # noqa: B018 (the Llama path: config_from_hf)
        from ernie.models.llama import config_from_hf
        config_from_hf({**HF_LLAMA, "torch_dtype": "int8"})
    assert Ernie4_5Config.from_json({**base, "rope_scaling": None}).hidden_size == 16


@pytest.mark.parametrize("field", ["aux_loss_coef", "z_loss_coef", "orthogonal_loss_coef",
                                   "norm_min", "aux_free_rate", "capacity_factor"])
def test_moe_coefficients_are_finite(field):
    with pytest.raises(ValueError, match=f"MoEConfig.{field} must be finite"):
        MoEConfig(num_experts=4, k=2, intermediate_size=8, **{field: math.nan})
    with pytest.raises(ValueError, match=f"{field}"):
        Ernie4_5Config(moe_num_experts=4, **{{"aux_loss_coef": "router_aux_loss_coef",
                                              "z_loss_coef": "router_z_loss_coef",
                                              "orthogonal_loss_coef": "router_orthogonal_loss_coef",
                                              "norm_min": "moe_norm_min",
                                              "aux_free_rate": "moe_aux_free_rate",
                                              "capacity_factor": "moe_capacity_factor"}[field]:
                                             math.inf})


def tiny():
    return LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=8,
                                        num_hidden_layers=1, num_attention_heads=2,
                                        num_key_value_heads=2))


def test_nan_timeouts_and_bucket_sizes_are_refused():
    ids = np.zeros((2, 4), np.int64)
    for timeout in (math.nan, math.inf, -1.0, 0.0):
        with pytest.raises(ValueError, match="timeout must be a finite number of seconds"):
            ernie.compile(tiny(), ernie.optimizer.SGD(0.1), [ids, ids], timeout=timeout)
    mesh = dist.ProcessMesh([0, 1], dim_names=["dp"])
    for bucket in (math.nan, math.inf):
        with pytest.raises(ValueError, match="bucket_mb is a size in MiB"):
            ernie.compile(tiny(), ernie.optimizer.SGD(0.1), [ids, ids], mesh=mesh,
                          config={"dp_config": {"bucket_mb": bucket}})


@pytest.mark.parametrize("damage,message", [
    (lambda b: b[:5], "too short"),
    (lambda b: (10 ** 12).to_bytes(8, "little") + b[8:], "does not fit the file"),
    (lambda b: b[:8] + b"[" * (len(b) - 8), "JSON nested deeper than 3|not valid JSON"),
    (lambda b: b.replace(b'"F32"', b'"Q32"'), "tensor 'w' has dtype 'Q32'"),
    (lambda b: b.replace(b'"shape":[2]', b'"shape":[9]'), "tensor 'w' has data_offsets"),
])
def test_read_tensors_damage_is_a_value_error(tmp_path, damage, message):
    path = tmp_path / "d.safetensors"
    weights.save_file({"w": np.ones(2, np.float32)}, path)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ValueError, match=message):
        weights.read_tensors(path, ["w"])


def test_the_writer_is_linear_in_the_number_of_tensors(tmp_path):
    """10^4 and 10^5 tiny tensors: ten times the tensors, about ten times
    the time (quadratic would be a hundred)."""
    def seconds(n):
        tensors = {f"t{i}": np.zeros(1, np.float32) for i in range(n)}
        start = time.perf_counter()
        weights.save_file(tensors, tmp_path / f"{n}.safetensors")
        return time.perf_counter() - start
    small, large = seconds(10_000), seconds(100_000)
    assert large < 30 * max(small, 1e-3), (small, large)
    assert len(weights.file_dtypes(tmp_path / "100000.safetensors")) == 100_000

"""Compile configurations that between them reach every option of the
training pipeline: single device, dp, dp x mp with sequence parallelism and
overlap, ZeRO 1-3, FP8's three recipes, recomputation, pipelines (1F1B,
FThenB, interleaved, without gradient accumulation fusion), gradient buckets,
a cluster, MoE under ep, gradients only and the forward alone. Each is
compiled abstractly (no values), so the whole list takes seconds.

CONFIGS maps a name to a function returning the arguments of
`ernie.compile`: (model, optimizer, example inputs, keyword arguments)."""

import numpy as np

import ernie
import ernie.distributed as dist
from ernie.models.ernie4_5 import Ernie4_5Config, Ernie4_5_MoeForCausalLM
from ernie.models.llama import LlamaConfig, LlamaForCausalLM, parallelize_plan

LLAMA = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2)
MOE = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
           num_attention_heads=4, num_key_value_heads=2, moe_num_experts=8, moe_k=2,
           moe_num_shared_experts=1, moe_intermediate_size=16, moe_layer_start_index=1)
IDS = np.zeros((8, 16), np.int64)


def _mesh(shape, names):
    return dist.ProcessMesh(np.arange(int(np.prod(shape))).reshape(shape), names)


def _llama(optimizer=None, **kwargs):
    def build():
        with ernie.nn.abstract():
            model = LlamaForCausalLM(LlamaConfig(**LLAMA))
        opt = optimizer() if optimizer else ernie.optimizer.AdamW(1e-3, grad_clip=1.0)
        return model, opt, [IDS, IDS], dict(kwargs)
    return build


def _on(shape, names, config=None, **kwargs):
    return _llama(mesh_shape=(shape, names), config=config, **kwargs)


def _moe(shape, names, config):
    def build():
        with ernie.nn.abstract():
            model = Ernie4_5_MoeForCausalLM(Ernie4_5Config(**MOE))
        return model, ernie.optimizer.AdamW(1e-3), [IDS, IDS], \
            dict(mesh_shape=(shape, names), config=config)
    return build


def _tp(sequence_parallel=False, overlap=False):
    return {"parallelize_plan": parallelize_plan(sequence_parallel=sequence_parallel),
            "sequence_parallel_overlap": overlap}


CONFIGS = {
    "one-device": _llama(),
    "sgd-momentum": _llama(lambda: ernie.optimizer.SGD(0.1, momentum=0.9, weight_decay=0.01)),
    "adamw-multi-precision": _llama(lambda: ernie.optimizer.AdamW(1e-3, multi_precision=True)),
    "dp2": _on([2], ["dp"], {"dp_config": {}}),
    "dp2-no-buckets": _on([2], ["dp"], {"dp_config": {"bucket_mb": 0}}),
    "dp2-native-reduce": _on([2], ["dp"], {"dp_config": {"grad_reduce_dtype": "native",
                                                         "bucket_mb": 1}}),
    "dp2xmp2-sp-overlap": _on([2, 2], ["dp", "mp"], {"dp_config": {},
                                                     "mp_config": _tp(True, True)}),
    "mp2": _on([2], ["mp"], {"mp_config": _tp()}),
    "zero1": _on([2], ["dp"], {"dp_config": {"sharding_level": 1}}),
    "zero2": _on([2], ["dp"], {"dp_config": {"sharding_level": 2}}),
    "zero3": _on([2], ["dp"], {"dp_config": {"sharding_level": 3}}),
    "fp8-current": _on([2], ["dp"], {"dp_config": {}, "fp8_config": {"recipe": "current"}}),
    "fp8-delayed": _on([2], ["dp"], {"dp_config": {}, "fp8_config": {
        "recipe": "delayed", "history_length": 4, "margin": 1, "amax_compute": "most_recent",
        "exclude": "lm_head"}}),
    "fp8-blockwise": _on([2], ["mp"], {"mp_config": _tp(), "fp8_config": {
        "recipe": "blockwise", "block_size": 16, "pow2_scale": True}}),
    "recompute-selective": _llama(config={"recompute": "selective"}),
    "recompute-layers": _on([2], ["dp"], {"dp_config": {}, "recompute": {
        "granularity": "full", "layers": ["llama.layers.[02]"]}}),
    "pp2-1f1b": _on([2], ["pp"], {"pp_config": {"split_spec": "llama.layers",
                                               "accumulate_steps": 2}}),
    "pp2-fthenb-no-fusion": _on([2], ["pp"], {"pp_config": {
        "split_spec": "llama.layers", "accumulate_steps": 4, "schedule_mode": "FThenB",
        "gradient_accumulation_fusion": False}}),
    "dp2xpp2-vpp": _on([2, 2], ["dp", "pp"], {"dp_config": {}, "pp_config": {
        "split_spec": "llama.layers", "accumulate_steps": 2, "schedule_mode": "VPP",
        "vpp_degree": 2}}),
    "cluster": _on([2, 2], ["dp", "mp"], {"dp_config": {}, "mp_config": _tp()},
                   cluster="dgx_h100"),
    "moe-dp2xep2": _moe([2, 2], ["dp", "ep"], {"dp_config": {}, "ep_config": {"axis": "ep"}}),
    "moe-pp2xep2": _moe([2, 2], ["pp", "ep"], {"ep_config": {"axis": "ep", "token_groups": 4},
                                               "pp_config": {"split_spec": "model.layers"}}),
    "gradients-only": _llama(lambda: None),
    "no-fusion": _on([2], ["dp"], {"dp_config": {}}, fuse=False),
}


def compile_config(name, **overrides):
    """The configuration `name`, compiled abstractly (keyword arguments of
    ernie.compile overridden by `overrides`)."""
    model, optimizer, inputs, kwargs = CONFIGS[name]()
    shape = kwargs.pop("mesh_shape", None)
    if shape is not None:
        kwargs["mesh"] = _mesh(*shape)
    kwargs = {**kwargs, **overrides}
    return ernie.compile(model, optimizer, inputs, abstract=True, **kwargs)

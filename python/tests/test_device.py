"""ernie.compile(..., device=...): where every rank computes. "cpu" is the
default and the reference; "cuda" runs the same program file on one GPU
(ranks as threads sharing it). Without a GPU the CUDA path must say why at
load, and the GPU comparison skips with that reason. The CUDA backend has
not yet run on a GPU in this project's CI (docs/architecture.md)."""

import re

import numpy as np
import pytest

import ernie
import ernie.distributed as dist
from ernie.models.llama import LlamaConfig, LlamaForCausalLM, parallelize_plan

CFG = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, seed=3)
NO_GPU = re.compile(r"no CUDA device visible|built without CUDA|CUDA driver")


def data():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, CFG["vocab_size"], (4, 16))
    return [ids, ids]  # Hugging Face's labels: the model shifts them


def compile_on(device, mesh=None, config=None):
    return ernie.compile(LlamaForCausalLM(LlamaConfig(**CFG)), ernie.optimizer.AdamW(1e-3),
                         data(), mesh=mesh, config=config, device=device)


def cuda_or_reason():
    """A CUDA program, or why there is none here."""
    try:
        return compile_on("cuda"), None
    except RuntimeError as e:
        return None, str(e)


def test_cpu_is_the_default_device():
    prog = ernie.compile(LlamaForCausalLM(LlamaConfig(**CFG)), ernie.optimizer.AdamW(1e-3),
                         data())
    assert prog.device == "cpu"


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:x", "CPU", 0, None])
def test_a_device_that_is_not_one_is_refused(device):
    with pytest.raises(ValueError, match="expected 'cpu', 'cuda' or 'cuda:N'"):
        compile_on(device)


def test_cuda_without_a_gpu_says_why():
    prog, reason = cuda_or_reason()
    if prog is not None:
        pytest.skip(f"a GPU is visible here ({prog.device})")
    assert NO_GPU.search(reason), reason


@pytest.mark.parametrize("mesh_axes", [None, ("dp", "mp")], ids=["1 rank", "dp2 x mp2"])
def test_cuda_trains_as_the_cpu_does(mesh_axes):
    """On a GPU: the same losses as the CPU run in f32 (1e-4 relative: the
    GEMMs sum in cuBLAS's order)."""
    prog, reason = cuda_or_reason()
    if prog is None:
        pytest.skip(reason.splitlines()[0])
    mesh = config = None
    if mesh_axes:
        mesh = dist.ProcessMesh([[0, 1], [2, 3]], list(mesh_axes))
        config = {"dp_config": {}, "mp_config": {"parallelize_plan": parallelize_plan()}}
    cpu = compile_on("cpu", mesh, config)
    gpu = compile_on("cuda", mesh, config)
    want = [cpu.step(*data()) for _ in range(10)]
    got = [gpu.step(*data()) for _ in range(10)]
    np.testing.assert_allclose(got, want, rtol=1e-4)

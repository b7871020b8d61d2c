"""ernie: an auto-parallel training compiler.

    import ernie
    from ernie.models.llama import LlamaConfig, LlamaForCausalLM
    model = LlamaForCausalLM(LlamaConfig())
    program = ernie.compile(model, ernie.optimizer.AdamW(1e-3), [ids, labels],
                            mesh=ernie.distributed.ProcessMesh([[0, 1], [2, 3]], ["dp", "mp"]))
    loss = program.step(ids, labels)

From a build tree: `export PYTHONPATH=$PWD/build/python`. Installed:
`pip install .` from the repository.
"""

import os as _os


def _preferred_gemm_kernels() -> str:
    """The OpenBLAS kernel family for this CPU by its features, the rule of
    the runtime's preferredGemmKernels() (Kernel.h; a test keeps the two
    equal): Cooperlake with AVX-512 BF16, SkylakeX with AVX-512, Haswell
    with AVX2 and FMA, "" elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    except OSError:
        return ""
    flags = set(flags)
    if {"avx512f", "avx512vl", "avx512bw", "avx512dq"} <= flags:
        return "Cooperlake" if "avx512_bf16" in flags else "SkylakeX"
    return "Haswell" if {"avx2", "fma"} <= flags else ""


# OpenBLAS picks its kernels from the CPU model once, as it loads (with the
# runtime's extension, below), and falls back to Haswell's or SSE3 kernels on
# models it does not know: 1.5-8x slower GEMMs. Unless the user chose, ernie
# chooses by the CPU's features, as ernie-run does.
if "OPENBLAS_CORETYPE" not in _os.environ:
    _kernels = _preferred_gemm_kernels()
    if _kernels:
        _os.environ["OPENBLAS_CORETYPE"] = _kernels

# The package is built in floors, each module importing only from its own
# floor or those below (docs/architecture.md §4.6; tests/test_layers.py
# checks it): files and numbers, datasets, tracing, config, parallel, models,
# compiler, planning. This file, on top, loads them all.
from . import (autoplan, cost, data, distributed, fp8, functional, nn,  # noqa: E402
               optimizer, pipeline)
from .compiler import Program, collectives_of, compile, trace_model  # noqa: A004,E402
from .strategy import (FP8, DataParallel, ExpertParallel, MoE, PipelineParallel,  # noqa: E402
                       Recompute, Strategy, TensorParallel)
from .tensor import Tensor  # noqa: E402

# dist.auto_plan and parallelize(config="auto") run the plan search, which
# compiles and so sits floors above ernie.distributed: handed down here.
distributed._use_plan_search(autoplan.auto_plan)

__all__ = ["FP8", "DataParallel", "ExpertParallel", "MoE", "PipelineParallel", "Program",
           "Recompute", "Strategy", "Tensor", "TensorParallel", "collectives_of", "compile", "cost",
           "data", "distributed", "fp8", "functional", "nn", "optimizer", "pipeline", "trace_model"]

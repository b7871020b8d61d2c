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

from . import distributed, fp8, functional, nn, optimizer, pipeline
from .compiler import Program, collectives_of, compile, trace_model  # noqa: A004
from .tensor import Tensor

__all__ = ["Program", "Tensor", "collectives_of", "compile", "distributed", "fp8", "functional",
           "nn", "optimizer", "pipeline", "trace_model"]

"""Compile time and per-rank model state of full-size models, compiled
abstractly (no tensor allocated): Llama-70B on dp x mp = 8 x 8 and a
7.5 B-parameter GPT on dp = 64, each at ZeRO levels 0-3.

    PYTHONPATH=build/python .venv/bin/python bench/abstract_compile.py

The 7.5 B rows are checked against Rajbhandari et al. (120 / 31.4 / 16.6 /
1.9 GB at dp = 64) by python/tests/test_frontend.py; this prints them beside
the compile time.
"""

import sys
import time
from pathlib import Path

import numpy as np

import ernie
import ernie.distributed as dist
from ernie.models.llama import LlamaConfig, LlamaForCausalLM, parallelize_plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python" / "tests"))
from test_frontend import GPT  # noqa: E402  (the GPT-style model of the ZeRO test)

PAPER = {0: 120, 1: 31.4, 2: 16.6, 3: 1.9}


def row(name, build, mesh, config_for, inputs, paper=None):
    with ernie.nn.abstract():
        model = build()
    params = sum(int(np.prod(p.shape)) for p in model.parameters())
    for level in range(4):
        t = time.time()
        prog = ernie.compile(model, ernie.optimizer.AdamW(1e-4, multi_precision=True), inputs,
                             mesh=mesh, config=config_for(level), abstract=True)
        seconds = time.time() - t
        r = prog.report()
        ref = f"{paper[level]:8.1f}" if paper else " " * 8
        print(f"{name:28s} {params / 1e9:6.2f}B  ZeRO-{level}  {seconds:6.1f} s  "
              f"{r['model_state_bytes'] / 1e9:9.2f} GB {ref}")


def main():
    print(f"{'model, mesh':28s} {'params':>7s}  {'level':6s} {'compile':>8s}  "
          f"{'state/rank':>12s} {'paper':>8s}")
    ids = np.zeros((64, 16), np.int64)
    row("GPT 7.5B, dp=64", lambda: GPT(vocab=61440, h=4096, layers=36, heads=32),
        dist.ProcessMesh(list(range(64)), ["dp"]),
        lambda level: {"dp_config": {"sharding_level": level}}, [ids, ids], PAPER)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=8192, intermediate_size=28672,
                      num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                      dtype="bf16")
    ids = np.zeros((8, 16), np.int64)
    row("Llama-70B, dp=8 x mp=8", lambda: LlamaForCausalLM(cfg),
        dist.ProcessMesh(np.arange(64).reshape(8, 8), ["dp", "mp"]),
        lambda level: {"dp_config": {"sharding_level": level},
                       "mp_config": {"parallelize_plan": parallelize_plan()}}, [ids, ids])


if __name__ == "__main__":
    main()

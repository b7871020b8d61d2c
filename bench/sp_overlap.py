#!/usr/bin/env python3
"""Step time of sequence parallelism with and without the overlap pass.

The demo's Llama (examples/train_llama.py: 4 layers, hidden 128, 8 query /
4 key-value heads, MLP 384, vocabulary 256; AdamW; batch 8 x 64 tokens) on
the thread backend, one BLAS thread per rank, three plans on the same mesh:

  tp        Megatron tensor parallelism (two all-reduces per layer and pass)
  sp        + sequence parallelism (all-gather / reduce-scatter instead)
  sp+ovl    + --ernie-sequence-parallel-overlap (each all-gather and
            reduce-scatter around a matmul split into t - 1 asynchronous
            transfers run on the communication thread under the GEMMs)

Each time is the median of --steps steps after --warmup, best of --repeat
runs. Columns: ms per step, and sp+ovl / sp (below 1: the overlap helps).
Also checks that sp and sp+ovl give the same losses bit for bit.

Read the numbers against the machine: ranks are threads sharing its cores,
so with more ranks than cores a transfer "overlapped" with a GEMM competes
with another rank's GEMM for a core, and the gain the pass is for (copy
engines and links working while the SMs compute) cannot show. The ratio is
meaningful on a machine with a core per rank and more per communication
thread; the table says how many cores this one has.
"""

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "build" / "python"))

import ernie  # noqa: E402
import ernie.distributed as dist  # noqa: E402
from ernie.models.llama import LlamaConfig, LlamaForCausalLM, parallelize_plan  # noqa: E402


def step_times(mesh_shape, names, plan, batch, seq, args):
    cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=4, seed=0)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg.vocab_size, (batch, seq))
    labels = ids  # Hugging Face's labels: the model shifts them
    mesh = dist.ProcessMesh(np.arange(int(np.prod(mesh_shape))).reshape(mesh_shape), names)
    config = {"mp_config": {"parallelize_plan": parallelize_plan(plan != "tp"),
                            "sequence_parallel_overlap": plan == "sp+ovl"}}
    if "dp" in names:
        config["dp_config"] = {"sharding_level": 0}
    best, losses = None, None
    for _ in range(args.repeat):
        prog = ernie.compile(LlamaForCausalLM(cfg), ernie.optimizer.AdamW(1e-3), [ids, labels],
                             mesh=mesh, config=config)
        run_losses, times = [], []
        for i in range(args.warmup + args.steps):
            t = time.perf_counter()
            run_losses.append(prog.step(ids, labels))
            if i >= args.warmup:
                times.append(time.perf_counter() - t)
        median = float(np.median(times))
        best = median if best is None else min(best, median)
        losses = run_losses
    return 1000 * best, losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    batch, seq = 8, 64
    print(f"demo Llama, batch {batch} x {seq}, thread backend, {os.cpu_count()} cores; "
          f"median ms/step of {args.steps}, best of {args.repeat}\n")
    print(f"{'mesh':>10} | {'tp':>8} {'sp':>8} {'sp+ovl':>8} | {'sp+ovl/sp':>9} {'bitwise':>8}")
    print("-" * 62)
    for shape, names in (([2], ["mp"]), ([4], ["mp"]), ([2, 4], ["dp", "mp"])):
        row = {plan: step_times(shape, names, plan, batch, seq, args) for plan in ("tp", "sp", "sp+ovl")}
        same = row["sp"][1] == row["sp+ovl"][1]
        label = "x".join(f"{n}{s}" for n, s in zip(names, shape))
        print(f"{label:>10} | {row['tp'][0]:8.1f} {row['sp'][0]:8.1f} {row['sp+ovl'][0]:8.1f} | "
              f"{row['sp+ovl'][0] / row['sp'][0]:9.2f} {'yes' if same else 'NO':>8}")


if __name__ == "__main__":
    main()

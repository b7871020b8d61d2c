#!/usr/bin/env python3
"""Pipeline bubbles: the runtime's schedule simulation against the theory.

For each schedule ernie compiles (FThenB, 1F1B, interleaved 1F1B), the
schedule library (runtime/src/PipelineSchedule.cpp — the code that orders
every rank's steps in a program file and rejects deadlocks) times the
schedule with equal stage costs (a chunk's forward 1/v, its backward 2/v;
transfers free) and reports the bubble: the share of every rank's time
spent idle. The limit beside it is Narayanan et al. (2021): for 1F1B and
GPipe (p - 1) / (m + p - 1) of the total; interleaving with v chunks per
rank divides the bubble time by v. `ratio` is ours over the limit (1.000:
the schedule achieves it exactly).

A second table runs the demo-sized Llama with tied embeddings under pp on
the thread backend and prints the step time per schedule beside the
single-rank step (ranks are threads sharing this machine's cores, so this
is a functional check with timings, not a speed-up measurement).
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "build" / "python"))

import ernie  # noqa: E402
import ernie.distributed as dist  # noqa: E402


def theory(p, v, m):
    """Bubble share of the total time for per-chunk costs 1/v and 2/v."""
    ideal = m * 3.0
    bubble = (p - 1) * 3.0 / v
    return bubble / (ideal + bubble)


def simulated_table():
    rows = []
    for p, m in [(2, 4), (4, 4), (4, 8), (4, 16), (8, 16), (8, 32)]:
        for kind, v in [("FThenB", 1), ("1F1B", 1), ("interleaved", 2), ("interleaved", 4)]:
            if kind == "interleaved" and m % p:
                continue
            sim = dist.simulate_pipeline(kind, p, v, m, forward_cost=1.0 / v,
                                         backward_cost=2.0 / v)
            limit = theory(p, v, m)
            rows.append((p, m, f"{kind}" + (f" v={v}" if v > 1 else ""),
                         sim["bubble_fraction"], limit))
    print("| p | m | schedule | simulated bubble | limit | ratio |")
    print("|---|---|----------|------------------|-------|-------|")
    for p, m, name, got, limit in rows:
        print(f"| {p} | {m} | {name} | {got:.4f} | {limit:.4f} | {got / limit:.3f} |")


def measured_table(steps):
    from ernie.models.llama import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                      tie_word_embeddings=True)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg.vocab_size, size=(8, 32))
    labels = rng.integers(0, cfg.vocab_size, size=(8, 32))

    def run(mesh, config):
        model = LlamaForCausalLM(cfg)
        program = ernie.compile(model, ernie.optimizer.AdamW(learning_rate=1e-3), [ids, labels],
                                mesh=mesh, config=config)
        program.step(ids, labels)  # warm-up
        start = time.perf_counter()
        losses = [program.step(ids, labels) for _ in range(steps)]
        return (time.perf_counter() - start) / steps * 1e3, losses[-1]

    base_ms, base_loss = run(None, None)
    print("| plan | ms / step | vs 1 rank | last loss | rel. diff |")
    print("|------|-----------|-----------|-----------|-----------|")
    print(f"| 1 rank | {base_ms:.1f} | 1.00 | {base_loss:.6f} | - |")
    for pp, mode, vpp in [(2, "FThenB", 1), (2, "1F1B", 1), (2, "VPP", 2), (4, "1F1B", 1)]:
        mesh = dist.ProcessMesh(list(range(pp)), dim_names=["pp"])
        config = {"pp_config": {"split_spec": "llama.layers", "accumulate_steps": 4,
                                "schedule_mode": mode, "vpp_degree": vpp}}
        ms, loss = run(mesh, config)
        print(f"| pp {pp} {mode}" + (f" v={vpp}" if vpp > 1 else "") +
              f" | {ms:.1f} | {ms / base_ms:.2f} | {loss:.6f} | {abs(loss - base_loss) / abs(base_loss):.1e} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--no-run", action="store_true", help="only the simulation table")
    args = parser.parse_args()
    simulated_table()
    if not args.no_run:
        print()
        measured_table(args.steps)


if __name__ == "__main__":
    main()

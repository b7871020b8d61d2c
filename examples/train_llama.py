"""Train a small Llama on 8 thread ranks with a dp x mp x pp plan.

    PYTHONPATH=build/python python examples/train_llama.py [--steps 300] [--report FILE]

The corpus is generated on first run (build/demo/corpus.txt): sentences of
small-number arithmetic in words ("seven plus five is twelve."), which a
byte-level model learns quickly, so the loss visibly falls. The model is
the Hugging Face Llama architecture (ernie.models.llama) with tied input
and output embeddings, on a 2 x 2 x 2 mesh: the batch split over dp,
Paddle's tensor-parallel plan over mp, and the layers in two pipeline
stages (pp_config: split_spec "llama.layers", 4 micro-batches, 1F1B) — the
tied embedding has a replica on each end of the pipeline, summed and
updated as one. The first steps are also run on a single rank, and the two
loss columns are printed side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

import ernie
import ernie.distributed as dist
from ernie.models.llama import LlamaConfig, LlamaForCausalLM, parallelize_plan

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
         "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
         "eighteen", "nineteen", "twenty"]



def corpus(path: Path, sentences=20000, seed=0) -> bytes:
    if not path.exists():
        rng = np.random.default_rng(seed)
        lines = []
        for _ in range(sentences):
            a, b = rng.integers(0, 11, size=2)
            if rng.random() < 0.5:
                lines.append(f"{WORDS[a]} plus {WORDS[b]} is {WORDS[a + b]}.")
            else:
                a, b = max(a, b), min(a, b)
                lines.append(f"{WORDS[a]} minus {WORDS[b]} is {WORDS[a - b]}.")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(" ".join(lines))
    return path.read_bytes()


def batches(data: bytes, batch, seq, seed=1):
    tokens = np.frombuffer(data, dtype=np.uint8).astype(np.int64)
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(tokens) - seq - 1, size=batch)
        window = np.stack([tokens[s:s + seq + 1] for s in starts])
        yield window[:, :-1].copy(), window[:, 1:].copy()


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def print_plan(report, single):
    """The plan report as tables: memory per rank of each pipeline stage
    beside the single-rank program's, and each stage's collectives in one
    training step."""
    one = single["functions"]["train_step"]
    stages = report["stages"]
    header = "".join(f"{'stage ' + str(s):>10}" for s in range(len(stages)))
    print(f"\n{'memory per rank':32s}{header} {'1 rank':>10}")
    rows = [("parameters", "parameter_bytes", one["parameter_bytes"]),
            ("gradients", "gradient_bytes", single["gradient_bytes"]),
            ("optimizer state", "optimizer_state_bytes", one["optimizer_state_bytes"]),
            ("activations kept for backward", "activation_bytes", single["activation_bytes"]),
            ("largest arena (planned peak)", "arena_bytes", one["arena_bytes"])]
    for name, key, ref in rows:
        cells = "".join(f"{human(stage[key]):>10}" for stage in stages)
        print(f"  {name:30s}{cells} {human(ref):>10}")
    p = report["pipeline"]
    print(f"  (pipeline: {p['stages']} stages, {p['micro_batches']} micro-batches, {p['schedule']}; "
          f"activations: the residuals of the micro-batches in flight)")
    print(f"\n{'collectives per step, per rank':32s}{header}")
    kinds = sorted({k for stage in stages for k in stage["collectives"]})
    for kind in kinds:
        cells = "".join(f"{stage['collectives'].get(kind, {'count': 0})['count']:>10}" for stage in stages)
        print(f"  {kind:30s}{cells}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--compare-steps", type=int, default=5)
    parser.add_argument("--work", default=os.environ.get("ERNIE_DEMO_DIR", "build/demo"))
    parser.add_argument("--report", default=None)
    args = parser.parse_args()
    work = Path(args.work)
    data = corpus(work / "corpus.txt")

    cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=4, tie_word_embeddings=True,
                      seed=0, pre_shifted_labels=True)  # batches() yields shifted labels
    batch, seq = 8, 64
    params = sum(p.value.size for p in LlamaForCausalLM(cfg).parameters())
    print(f"Llama: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
          f"{params / 1e6:.2f} M parameters; batch {batch} x {seq} tokens; corpus {len(data)} bytes")

    mesh = dist.ProcessMesh(np.arange(8).reshape(2, 2, 2), ["dp", "pp", "mp"])
    schedule = ernie.optimizer.LinearWarmupCosine(3e-3, warmup_steps=20, total_steps=args.steps,
                                                  min_lr=3e-4)
    config = {"dp_config": {"sharding_level": 0},
              "mp_config": {"parallelize_plan": parallelize_plan(tie_word_embeddings=True)},
              "pp_config": {"split_spec": "llama.layers", "accumulate_steps": 4,
                            "schedule_mode": "1F1B"}}
    example = next(batches(data, batch, seq))

    t0 = time.time()
    program = ernie.compile(LlamaForCausalLM(cfg), ernie.optimizer.AdamW(schedule, weight_decay=0.01),
                            list(example), mesh=mesh, config=config)
    single = ernie.compile(LlamaForCausalLM(cfg), ernie.optimizer.AdamW(schedule, weight_decay=0.01),
                           list(example))
    print(f"compiled for mesh dp=2 x pp=2 x mp=2 and for 1 rank in {time.time() - t0:.1f} s")

    report = program.report()
    print_plan(report, single.report())

    print(f"\n{'step':>5} {'loss (8 ranks)':>15} {'loss (1 rank)':>14} {'ms/step':>8}")
    losses, times = [], []
    stream = batches(data, batch, seq)
    for step in range(1, args.steps + 1):
        ids, labels = next(stream)
        t = time.time()
        loss = program.step(ids, labels)
        times.append(time.time() - t)
        losses.append(loss)
        ref = single.step(ids, labels) if step <= args.compare_steps else None
        if step <= args.compare_steps or step % max(1, args.steps // 15) == 0 or step == args.steps:
            ref_text = f"{ref:14.6f}" if ref is not None else " " * 14
            print(f"{step:5d} {loss:15.6f} {ref_text} {1000 * times[-1]:8.1f}")
    first, last = np.mean(losses[:10]), np.mean(losses[-10:])
    print(f"\nmean loss over the first 10 steps {first:.4f}, over the last 10 {last:.4f}; "
          f"{1000 * np.mean(times[1:]):.1f} ms per step")
    report_path = Path(args.report or work / "train_llama_report.json")
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps({
        "model": {"layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "parameters": int(params)},
        "mesh": {"dp": 2, "pp": 2, "mp": 2}, "steps": args.steps, "losses": losses,
        "mean_step_ms": 1000 * float(np.mean(times[1:])), "report": report}, indent=1))
    print(f"report written to {report_path}")
    if not last < first:
        raise SystemExit("the loss did not fall")


if __name__ == "__main__":
    main()

"""What `ernie.train` costs beside a bare `program.step` loop on the same program.

    python3 bench/trainer_overhead.py [--steps 40] [--repeats 3]

A Llama (4 layers, hidden 256, vocabulary 1024) on dp 2 (two thread ranks,
one process), global batch 16 x 128, from a random token dataset written
here. The trainer runs with its data loader (prefetch thread, per-process
rows), metrics every step (JSONL), no checkpoints or evaluation; the bare
loop steps the same compiled program on batches read into memory before
timing (and, to price the gradient norm the trainer logs, the same loop on
a step compiled without it). Each takes the steps after the first two
(compile, warm-up); the
runs alternate and the best of `--repeats` counts (the machine is noisy).
Goal: overhead <= 2 %.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(os.environ.get("ERNIE_BUILD_DIR", ROOT / "build")) / "python"))

import ernie  # noqa: E402
from ernie.data import DataLoader, IndexedDatasetBuilder, PackedSamples  # noqa: E402
from ernie.train import Trainer  # noqa: E402
from ernie.train.config import from_dict  # noqa: E402

MODEL = {"vocab_size": 1024, "hidden_size": 256, "intermediate_size": 688,
         "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4}
B, S = 16, 128


def dataset(path):
    rng = np.random.default_rng(0)
    with IndexedDatasetBuilder(path, np.uint16) as b:
        for _ in range(400):
            b.add_document(rng.integers(0, 1024, int(rng.integers(50, 600))).astype(np.uint16))


def job(tmp, steps):
    return from_dict({"model": {"family": "llama", "config": MODEL},
                      "data": {"path": str(tmp / "corpus")},
                      "training": {"global_batch": B, "seq_len": S, "steps": steps},
                      "parallel": {"dp": 2}, "metrics": {"jsonl": str(tmp / "m.jsonl")}})


class Quiet:
    def write(self, _):
        pass

    def flush(self):
        pass


def trainer_seconds(tmp, steps):
    """Seconds of steps 3..N of a Trainer run, from its JSONL timestamps."""
    (tmp / "m.jsonl").unlink(missing_ok=True)
    Trainer(job(tmp, steps), stream=Quiet()).run()
    times = [json.loads(line)["time"] for line in (tmp / "m.jsonl").read_text().splitlines()]
    return times[-1] - times[1]


def bare_seconds(tmp, steps, grad_norm=True):
    """The same program stepped in a plain loop on batches in memory
    (without `grad_norm`: the step does not compute the gradient norm the
    trainer logs)."""
    cfg = job(tmp, steps)
    trainer = Trainer(cfg, stream=Quiet())
    model = trainer._model()
    mesh, _ = trainer._mesh()
    optimizer = trainer._optimizer()
    optimizer.report_grad_norm = grad_norm
    program = ernie.compile(model, optimizer, [np.zeros((B, S), np.int64)] * 2, mesh,
                            strategy=trainer._strategy(model), seed=0, check_finite=True)
    samples = PackedSamples(tmp / "corpus", S, seed=0)
    with DataLoader(samples, B, steps=steps) as loader:
        batches = [(b.inputs.copy(), b.labels.copy()) for b in loader]
    stamps = []
    for ids, labels in batches:
        program.step(ids, labels)
        stamps.append(time.time())
    return stamps[-1] - stamps[1]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        dataset(tmp / "corpus")
        trained, bare, no_norm = [], [], []
        for _ in range(args.repeats):
            bare.append(bare_seconds(tmp, args.steps))
            no_norm.append(bare_seconds(tmp, args.steps, grad_norm=False))
            trained.append(trainer_seconds(tmp, args.steps))
    n = args.steps - 2
    t, b, u = min(trained), min(bare), min(no_norm)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), "unknown CPU")
    print(f"## Trainer overhead ({cpu}, {os.cpu_count()} cores; best of {args.repeats})\n")
    print("| loop | ms per step | tokens/s | overhead |")
    print("|---|---|---|---|")
    print(f"| bare `program.step`, no gradient norm | {u / n * 1e3:.1f} | {B * S * n / u:.0f} | "
          f"{(u / b - 1) * 100:+.1f} % |")
    print(f"| bare `program.step` | {b / n * 1e3:.1f} | {B * S * n / b:.0f} | - |")
    print(f"| `ernie.train` | {t / n * 1e3:.1f} | {B * S * n / t:.0f} | "
          f"{(t / b - 1) * 100:+.1f} % (goal <= 2 %) |")


if __name__ == "__main__":
    main()

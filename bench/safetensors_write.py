"""Safetensors writing and header reading against the number of tensors.

    python3 bench/safetensors_write.py [--counts 1000,10000,100000,200000]

Writes `n` one-element f32 tensors with ernie.weights.save_file (the
runtime's writer) and reads the header back (file_dtypes: the runtime's
bounded reader), best of 3 each. Both are linear in the number of tensors:
the time per tensor stays flat as n grows. (The writer built its header as
an ordered JSON object, whose lookups are linear, and the reader parsed
through a callback whose bookkeeping is linear per member: both were
quadratic, minutes at 200 000 tensors.)
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(os.environ.get("ERNIE_BUILD_DIR", ROOT / "build")) / "python"))

import ernie.weights as weights  # noqa: E402


def best(fn, repeat=3):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--counts", default="1000,10000,100000,200000")
    args = ap.parse_args()
    print(f"{'tensors':>8} | {'write s':>8} | {'us/tensor':>9} | {'read header s':>13} | {'us/tensor':>9}")
    print("-" * 60)
    with tempfile.TemporaryDirectory() as d:
        for n in map(int, args.counts.split(",")):
            tensors = {f"model.layers.{i}.weight": np.zeros(1, np.float32) for i in range(n)}
            path = Path(d) / f"{n}.safetensors"
            write = best(lambda: weights.save_file(tensors, path))
            read = best(lambda: weights.file_dtypes(path))
            print(f"{n:8d} | {write:8.3f} | {write / n * 1e6:9.2f} | {read:13.3f} | "
                  f"{read / n * 1e6:9.2f}")


if __name__ == "__main__":
    main()

"""Multi-process jobs on one host, over loopback: what a process boundary costs.

    python3 bench/multiprocess.py [--sizes-mib 1,4,16,64] [--steps 8]
        [--torch PYTHON]

1. All-reduce bandwidth (f32 sum over every rank, median of 5 after 2
   warm-ups) for each size: the thread engine within one process (1 x 2 and
   1 x 4 processes x ranks), Gloo across 2 processes (2 x 1) and the mixed
   engine (2 x 2: threads inside a process, Gloo across), each beside a
   memcpy of the same bytes; and PyTorch's Gloo `all_reduce` on 2 processes
   (`--torch`: a Python with torch, default this one; skipped without).
   Bus bandwidth = algorithm bandwidth x 2(n - 1)/n (NCCL's convention).
2. A dp-4 training step of a small Llama (4 layers, hidden 256, batch 16 x
   64) as 1 x 4, 2 x 2 and 4 x 1 processes x ranks: the median step time
   and, from the trace, the time per step rank 0 spends in collectives.

Every job starts with `python -m ernie.distributed.launch`. Prints markdown
tables (bench/README.md has the last run's).
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = Path(os.environ.get("ERNIE_BUILD_DIR", ROOT / "build"))

TORCH_ALLREDUCE = """
import os, sys, time, statistics, torch, torch.distributed as dist
dist.init_process_group("gloo")
n = dist.get_world_size()
for mib in [int(s) for s in sys.argv[1].split(",")]:
    x = torch.ones(mib << 18, dtype=torch.float32)
    times = []
    for k in range(7):
        dist.barrier()
        t = time.perf_counter(); dist.all_reduce(x); times.append(time.perf_counter() - t)
    if dist.get_rank() == 0:
        t = statistics.median(times[2:]); algbw = (mib << 20) / t / 1e9
        print(f"torch {n}x1 {mib} MiB: {t * 1e3:.3f} ms, algbw {algbw:.2f} GB/s, "
              f"busbw {algbw * 2 * (n - 1) / n:.2f} GB/s", flush=True)
dist.destroy_process_group()
"""

STEP = """
import json, sys, time, statistics, numpy as np, ernie, ernie.distributed as dist
from ernie.models.llama import LlamaConfig, LlamaForCausalLM
rpp, steps, trace, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
env = dist.init_parallel_env(ranks_per_process=rpp)
model = LlamaForCausalLM(LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=688,
                                     num_hidden_layers=4, num_attention_heads=8,
                                     num_key_value_heads=4))
ids = np.random.default_rng(0).integers(0, 1024, (16, 64)); labels = ids
mesh = dist.ProcessMesh([0, 1, 2, 3], dim_names=["dp"])
program = ernie.compile(model, ernie.optimizer.AdamW(1e-3), [ids, labels], mesh, trace=True,
                        strategy=ernie.Strategy(dp=ernie.DataParallel()))
rows = dist.local_batch(program)
times = []
for _ in range(steps):
    t = time.perf_counter()
    program.step(ids[rows], labels[rows], rows=rows)
    times.append(time.perf_counter() - t)
program.write_trace(trace)
if env.rank == 0:
    json.dump(times, open(out, "w"))
"""


def launch(nproc, *command, env=None):
    result = subprocess.run([sys.executable, "-m", "ernie.distributed.launch",
                             "--nproc-per-node", str(nproc), *map(str, command)],
                            capture_output=True, text=True, timeout=900,
                            env=env or dict(os.environ, PYTHONPATH=str(BUILD / "python")))
    if result.returncode != 0:
        raise SystemExit(f"{command}: {result.stderr[-2000:]}")
    return re.sub(r"^\[rank \d+\] ", "", result.stdout, flags=re.M)


def parse(lines):
    """{(engine, layout, MiB): (ms, algbw, busbw, memcpy or None)}"""
    out = {}
    for m in re.finditer(r"(\w+) (\d+x\d+) (\d+) MiB: ([\d.]+) ms, algbw ([\d.]+) GB/s, "
                         r"busbw ([\d.]+) GB/s(?:, memcpy ([\d.]+) GB/s)?", lines):
        out[(m[1], m[2], int(m[3]))] = (float(m[4]), float(m[5]), float(m[6]),
                                       float(m[7]) if m[7] else None)
    return out


def collective_ms_per_step(trace, steps):
    events = json.load(open(trace))["traceEvents"]
    comm = sum(e["dur"] for e in events if e.get("ph") == "X" and e["pid"] == 0
               and e.get("cat") == "collective")
    return comm / 1e3 / steps


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes-mib", default="1,4,16,64")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--torch", default=sys.executable)
    args = p.parse_args()
    bench = BUILD / "bin" / "ernie-comm-bench"
    sizes = [int(s) for s in args.sizes_mib.split(",")]
    rows = {}
    for nproc, rpp in ((1, 2), (1, 4), (2, 1), (2, 2)):
        rows.update(parse(launch(nproc, bench, "--ranks-per-process", rpp,
                                 "--sizes-mib", args.sizes_mib)))
    has_torch = subprocess.run([args.torch, "-c", "import torch"],
                               capture_output=True).returncode == 0
    if has_torch:
        with tempfile.TemporaryDirectory() as tmp:
            script = Path(tmp) / "torch_allreduce.py"
            script.write_text(TORCH_ALLREDUCE)
            version = subprocess.run([args.torch, "-c", "import torch; print(torch.__version__)"],
                                     capture_output=True, text=True).stdout.strip()
            out = subprocess.run([sys.executable, "-m", "ernie.distributed.launch",
                                  "--nproc-per-node", "2", args.torch, "-u", script,
                                  args.sizes_mib], capture_output=True, text=True, timeout=900,
                                 env=dict(os.environ, PYTHONPATH=str(BUILD / "python")))
            rows.update(parse(re.sub(r"^\[rank \d+\] ", "", out.stdout, flags=re.M)))
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), "unknown CPU")
    print(f"## All-reduce bandwidth, f32 sum ({cpu}, {os.cpu_count()} cores, loopback)\n")
    layouts = [("threads", "1x2"), ("gloo", "2x1"), ("torch", "2x1"), ("threads", "1x4"),
               ("mixed", "2x2")]
    print("| MiB | " + " | ".join(f"{e} {l} busbw GB/s" for e, l in layouts) + " | memcpy GB/s |")
    print("|" + "---|" * (len(layouts) + 2))
    for mib in sizes:
        cells = [f"{rows[(e, l, mib)][2]:.2f} ({rows[(e, l, mib)][0]:.1f} ms)"
                 if (e, l, mib) in rows else "n/a" for e, l in layouts]
        memcpy = rows.get(("threads", "1x2", mib), (0, 0, 0, None))[3]
        print(f"| {mib} | " + " | ".join(cells) + f" | {memcpy:.1f} |")
    if has_torch:
        print(f"\ntorch {version}, Gloo backend, 2 processes.")
    else:
        print("\ntorch: not installed for --torch; its column is n/a.")

    print(f"\n## dp-4 training step, Llama 4 x 256, batch 16 x 64 ({cpu})\n")
    print("| processes x ranks | step ms (median) | collectives ms/step, rank 0 |")
    print("|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "step.py"
        script.write_text(STEP)
        for nproc, rpp in ((1, 4), (2, 2), (4, 1)):
            trace, out = Path(tmp) / f"t{nproc}.json", Path(tmp) / f"s{nproc}.json"
            launch(nproc, script, rpp, args.steps, trace, out)
            times = json.load(open(out))[2:]
            print(f"| {nproc} x {rpp} | {statistics.median(times) * 1e3:.1f} | "
                  f"{collective_ms_per_step(trace, args.steps):.1f} |")


if __name__ == "__main__":
    main()

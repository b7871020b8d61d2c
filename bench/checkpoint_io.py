"""Checkpoint save and load speed beside the disk's own rate.

    python3 bench/checkpoint_io.py [--hidden 512] [--layers 8] [--ranks 2]

A Llama (AdamW, so parameters and two moments) on `--ranks` tensor-parallel
ranks is saved as a distributed checkpoint and loaded back into a fresh
program on another mesh (one rank fewer dp: mp // 2 x dp 2 where possible),
best of 3. Beside it: `dd` writing and reading a file of the same size
(with conv=fsync, and after dropping the page cache where the OS lets us;
otherwise the read is from the cache, as the checkpoint's is). The load's
peak extra memory (RSS growth of the loading process) is printed beside the
state's size: loading reads only each rank's pieces plus one row at a time.
A third row loads the parameters from a Hugging Face folder of bf16 shards
(save_pretrained) into the f32 program rank by rank (Program.load_pretrained;
its MB/s counts the f32 bytes placed, as the runtime's meter does).

The checksums' cost: every load verifies the XXH3 of every 1 MiB block it
reads (docs/integrity.md) and times it; the load's progress line says how
long its ranks spent on checksums, printed here per rank beside the load's
time (best load of --repeat). Beside it, `ernie-ckpt verify` (one thread
reading every byte and checking every checksum) against `cat` reading the
same files, both from the page cache.
"""

import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(os.environ.get("ERNIE_BUILD_DIR", ROOT / "build")) / "python"))

import ernie  # noqa: E402
import ernie.distributed as dist  # noqa: E402
from ernie.models.llama import LlamaConfig, LlamaForCausalLM, parallelize_plan  # noqa: E402


def build(cfg, mesh_shape, names):
    ids = np.zeros((2, 16), np.int64)
    mesh = dist.ProcessMesh(np.arange(int(np.prod(mesh_shape))).reshape(mesh_shape), names)
    config = {"mp_config": {"parallelize_plan": parallelize_plan()}}
    if "dp" in names:
        config["dp_config"] = {"sharding_level": 1}
    return ernie.compile(LlamaForCausalLM(cfg), ernie.optimizer.AdamW(1e-3), [ids, ids],
                         mesh=mesh, config=config)


def dd(path, nbytes):
    mb = max(1, nbytes // (1 << 20))
    t = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={mb}", "conv=fsync"],
                   check=True, capture_output=True)
    write = mb / (time.perf_counter() - t)
    subprocess.run(["sh", "-c", "sync; echo 1 > /proc/sys/vm/drop_caches"], capture_output=True)
    t = time.perf_counter()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=1M"], check=True, capture_output=True)
    read = mb / (time.perf_counter() - t)
    os.remove(path)
    return write, read


def progress_line(call):
    """The last line the runtime writes on stderr during `call()`."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 2)
        try:
            call()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        lines = f.read().decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else ""


def read_and_verify(ckpt, repeat):
    """(seconds to read the checkpoint's files, seconds to verify them): the
    best of `repeat`, the files cached by a first read."""
    tool = Path(os.environ.get("ERNIE_BUILD_DIR", ROOT / "build")) / "bin" / "ernie-ckpt"
    files = sorted(str(p) for p in Path(ckpt).glob("step-*/*.safetensors"))
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)
    read, verify = [], []
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)
        read.append(time.perf_counter() - t)
        t = time.perf_counter()
        subprocess.run([str(tool), "verify", str(ckpt)], stdout=subprocess.DEVNULL, check=True)
        verify.append(time.perf_counter() - t)
    return min(read), min(verify)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    cfg = LlamaConfig(vocab_size=8192, hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4,
                      num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=8)
    saver = build(cfg, [args.ranks], ["mp"])
    state = saver.state_dict()
    nbytes = sum(v.nbytes for k, v in state.items() if k != ernie.Program.STEP_KEY)
    work = Path(tempfile.mkdtemp(prefix="ernie-ckpt-bench-"))
    target = ([2, args.ranks // 2], ["dp", "mp"]) if args.ranks >= 2 else ([1], ["mp"])
    loader = build(cfg, *target)
    save_s, load_s, sum_s = [], [], []
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(args.repeat):
        shutil.rmtree(work / "ckpt", ignore_errors=True)
        t = time.perf_counter()
        saver.save_checkpoint(work / "ckpt")
        save_s.append(time.perf_counter() - t)
        subprocess.run(["sh", "-c", "sync; echo 1 > /proc/sys/vm/drop_caches"], capture_output=True)
        t = time.perf_counter()
        line = progress_line(lambda: loader.load_checkpoint(work / "ckpt", progress=True))
        load_s.append(time.perf_counter() - t)
        sums = re.search(r"checksums ([0-9.]+) s over the ranks", line)
        sum_s.append(float(sums.group(1)) if sums else 0.0)
    rss = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) * 1024
    read_s, verify_s = read_and_verify(work / "ckpt", max(args.repeat, 5))
    # A Hugging Face folder (bf16, sharded) into the f32 program, rank by
    # rank: the bytes each rank's pieces take in the program.
    saver.model.save_pretrained(work / "hf", dtype="bf16", max_shard_bytes=64 << 20,
                                state=state)
    hf_s, hf_bytes = [], 0
    for _ in range(args.repeat):
        subprocess.run(["sh", "-c", "sync; echo 1 > /proc/sys/vm/drop_caches"], capture_output=True)
        loader.load_pretrained(work / "hf")
        hf_s.append(loader.last_io["seconds"])
        hf_bytes = loader.last_io["bytes"]
    dd_write, dd_read = dd(work / "dd.bin", nbytes)
    shutil.rmtree(work)
    mb = nbytes / (1 << 20)
    print(f"state {mb:.0f} MB (parameters and AdamW moments), saved on mp {args.ranks}, "
          f"loaded on {' x '.join(f'{n} {s}' for n, s in zip(target[1], target[0]))}")
    print(f"{'':14} | {'ernie MB/s':>10} | {'dd MB/s':>8} | ernie/dd")
    print("-" * 48)
    print(f"{'save (fsync)':14} | {mb / min(save_s):10.0f} | {dd_write:8.0f} | {mb / min(save_s) / dd_write:8.2f}")
    print(f"{'load':14} | {mb / min(load_s):10.0f} | {dd_read:8.0f} | {mb / min(load_s) / dd_read:8.2f}")
    hf_mb = hf_bytes / (1 << 20)
    print(f"{'HF folder':14} | {hf_mb / min(hf_s):10.0f} | {dd_read:8.0f} | "
          f"{hf_mb / min(hf_s) / dd_read:8.2f}   (bf16 files, {hf_mb:.0f} MB of f32 pieces)")
    best = load_s.index(min(load_s))
    ranks = int(np.prod(target[0]))
    per_rank = sum_s[best] / ranks
    print(f"checksums in the load: {sum_s[best] * 1e3:.0f} ms over {ranks} ranks, "
          f"{per_rank * 1e3:.0f} ms per rank = {100 * per_rank / load_s[best]:.1f} % of the "
          f"load's {load_s[best] * 1e3:.0f} ms")
    print(f"every byte: cat {mb / read_s:.0f} MB/s, ernie-ckpt verify (read and check) "
          f"{mb / verify_s:.0f} MB/s")
    print(f"peak RSS growth over the loads: {rss / (1 << 20):.0f} MB "
          f"(the state itself: {mb:.0f} MB over all ranks)")


if __name__ == "__main__":
    main()

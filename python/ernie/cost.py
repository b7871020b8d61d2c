"""The cost model from Python: devices and clusters as data, step estimates,
and this machine's CPU measured into a device description.

Devices and clusters are JSON (docs/architecture.md "The cost model" lists
the fields); the ones ernie ships live in `ernie/hardware/{devices,clusters}`
and are named without their suffix (`load_cluster("dgx_h100")`). The C++
cost model (`--ernie-step-cost`, lib/Cost) reads them and checks every
field. Finding the files, building clusters from parts and the estimate
are `ernie.cost_model`'s, on the compiler's floor (compile reads a cluster);
this module re-exports them and measures the CPU, which compiles and runs
a small Llama's step, so it sits on the planning floor, above the compiler
and the models.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np

from . import _ernie, compiler, optimizer
from .cost_model import (CLUSTERS_DIR, DEVICES_DIR, HARDWARE_DIR, _read,  # noqa: F401
                         clusters, devices, estimate, load_cluster, load_device, make_cluster)
from .models.llama import LlamaConfig, LlamaForCausalLM


#===------------------------------------------------------------------------===#
# This machine's CPU, measured.
#===------------------------------------------------------------------------===#


def _session(text: str):
    program, _ = _ernie.write_program(_ernie.parse_module(text))
    return _ernie.Session(program)


def _best_time(fn, repeats: int) -> float:
    fn()  # warm: first-touch pages, BLAS buffers
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _chain(op: str, n: int, count: int, dtype: str = "f32") -> str:
    """`count` dependent elementwise ops on a tensor of n elements."""
    t = f"tensor<{n}x{dtype}>"
    lines = [f"func.func @f(%x: {t}) -> {t} {{"]
    prev = "%x"
    for i in range(count):
        lines.append(f"  %v{i} = ernie.{op} {prev}, %x : {t}")
        prev = f"%v{i}"
    lines += [f"  return {prev} : {t}", "}"]
    return "\n".join(lines)


def _gemm(n: int, dtype: str, count: int) -> str:
    """`count` dependent n^3 GEMMs on operands cast from f32 to `dtype`."""
    f, t = f"tensor<{n}x{n}xf32>", f"tensor<{n}x{n}x{dtype}>"
    lines = [f"func.func @f(%a: {f}, %b: {f}) -> {t} {{",
             f"  %a0 = ernie.cast %a : {f} -> {t}", f"  %b0 = ernie.cast %b : {f} -> {t}"]
    prev = "%a0"
    for i in range(count):
        lines.append(f"  %c{i} = ernie.matmul {prev}, %b0 : {t}, {t} -> {t}")
        prev = f"%c{i}"
    lines += [f"  return {prev} : {t}", "}"]
    return "\n".join(lines)


def _all_reduce(ranks: int, n: int, count: int) -> str:
    t = f"tensor<{n}xf32>"
    lines = [f"ernie.mesh @mesh(dp = {ranks})", f"func.func @f(%x: {t}) -> {t} {{"]
    prev = "%x"
    for i in range(count):
        lines.append(f"  %r{i} = ernie.all_reduce {prev} over @mesh[dp] sum : {t}")
        prev = f"%r{i}"
    lines += [f"  return {prev} : {t}", "}"]
    return "\n".join(lines)


def _per_op(text: str, inputs, count: int, repeats: int, base: float = 0.0) -> float:
    s = _session(text)
    return max((_best_time(lambda: s.call("f", inputs), repeats) - base) / count, 1e-12)


def calibrate_cpu(ranks: int = 8, repeats: int = 5, profile: bool = True) -> dict:
    """Measures this machine with tiny ernie programs and returns a cluster
    of `ranks` CPU thread ranks (one device per rank, sharing the machine's
    cores): per-instruction dispatch from a chain of tiny adds, elementwise
    FLOP/s from adds on tensors in cache, memory
    bandwidth from large adds, GEMM peaks (f32, bf16) from 512^3 matmuls,
    and the thread engine's all-reduce latency and bandwidth from a ring
    model fitted to a small and a large all-reduce on `ranks` ranks. With
    `profile`, a small Llama's traced step on one rank then scales each op
    kind's roofline to what it measured (`op_scale`) and gives the step's
    host time (`step_overhead`)."""
    rng = np.random.default_rng(0)
    # The fixed cost of a call (Python, argument copies, rank threads).
    small = rng.random(16, dtype=np.float32)
    one = _session(_chain("add", 16, 1))
    call = _best_time(lambda: one.call("f", [small]), repeats)
    chain = 400
    launch = _per_op(_chain("add", 16, chain), [small], chain, repeats, base=call)

    # Elementwise arithmetic in cache (256 KiB tensors), one FLOP a value.
    warm = rng.random(1 << 16, dtype=np.float32)
    vector = (1 << 16) / max(_per_op(_chain("add", 1 << 16, 64), [warm], 64, repeats,
                                     base=call) - launch, 1e-12)

    n = 1 << 22  # 16 MiB per f32 tensor: far beyond the caches
    big = rng.random(n, dtype=np.float32)
    add = _per_op(_chain("add", n, 8), [big], 8, repeats)
    bandwidth = 3 * 4 * n / max(add - launch, 1e-9)  # two reads, one write

    peaks = {}
    g, count = 512, 4
    a = rng.random((g, g), dtype=np.float32) / g
    for dtype in ("f32", "bf16"):
        # The casts' time cancels against a run of one GEMM.
        s1, sn = _session(_gemm(g, dtype, 1)), _session(_gemm(g, dtype, count + 1))
        t1 = _best_time(lambda: s1.call("f", [a, a]), repeats)
        tn = _best_time(lambda: sn.call("f", [a, a]), repeats)
        peaks[dtype] = 2 * g ** 3 / max((tn - t1) / count - launch, 1e-9)

    device = {
        "name": f"this machine's CPU ({os.cpu_count()} cores, one per rank at a time)",
        "source": "ernie.cost.calibrate_cpu(): measured with ernie programs",
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "memory_bandwidth": bandwidth,
        "peak_flops": peaks,
        "vector_flops": vector,
        "launch_overhead": launch,
        "calibrated": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }

    # The ring model 2(r-1) alpha + 2(r-1)/r B / beta fitted at two sizes.
    latency, link = 1e-6, bandwidth
    if ranks > 1:
        hops = 2 * (ranks - 1)
        times = []
        for elems in (16, 1 << 20):
            x = rng.random(elems, dtype=np.float32)
            times.append(_per_op(_all_reduce(ranks, elems, 4), [x], 4, repeats))
        latency = max(times[0] / hops, 1e-9)
        volume = hops / ranks * 4 * (1 << 20)
        link = volume / max(times[1] - hops * latency, 1e-9)
    cluster = {"name": f"{ranks} CPU thread ranks on this machine", "device": device,
               "nodes": 1, "devices_per_node": max(ranks, 1),
               "intra_node": {"bandwidth": link, "latency": latency},
               "shared_processors": os.cpu_count() or 1}
    if profile:
        device["op_scale"], device["step_overhead"], efficiency = _profile(cluster, ranks,
                                                                         repeats)
        cluster["sharing_efficiency"] = efficiency
    return cluster


def _profile(cluster: dict, ranks: int, repeats: int) -> tuple[dict, float, float]:
    """A small Llama's training step on one rank, traced: per op kind, the
    measured time over the roofline's (the kernels' efficiency, which one
    peak per class cannot say: AdamW's square roots, small GEMMs), and the
    step's host time outside the instructions. Then the same step on
    `ranks` ranks at once (each its own copy, nothing communicated): the
    share of the ideal processor sharing they reach."""
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=176,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         seed=0)
    ids = np.random.default_rng(1).integers(0, config.vocab_size, (4, 32))
    batch = (ids, ids)  # Hugging Face's labels: the model shifts them
    program = compiler.compile(LlamaForCausalLM(config), optimizer.AdamW(1e-3), list(batch),
                               trace=True)
    steps = 1 + repeats
    walls = []
    for _ in range(steps):
        t = time.perf_counter()
        program.step(*batch)
        walls.append(time.perf_counter() - t)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        program._session.write_trace(path)
        events = [e for e in _read(Path(path))["traceEvents"] if e.get("ph") == "X"]
    events.sort(key=lambda e: e["ts"])
    per_step = len(events) // steps
    per_step_times: dict[str, list[float]] = {}
    spans = []
    for k in range(1, steps):  # the first step warms up
        chunk = events[k * per_step:(k + 1) * per_step]
        spans.append((chunk[-1]["ts"] + chunk[-1]["dur"] - chunk[0]["ts"]) * 1e-6)
        this_step: dict[str, float] = {}
        for e in chunk:
            this_step[e["name"]] = this_step.get(e["name"], 0.0) + e["dur"] * 1e-6
        for name, seconds in this_step.items():
            per_step_times.setdefault(name, []).append(seconds)
    # Per op kind, its median step: a step the machine stalled in (this
    # 2-core VM drifts by tens of percent) does not scale every later
    # prediction.
    measured = {name: float(np.median(times)) for name, times in per_step_times.items()}
    predicted = program.estimate(cluster)["compute_by_op"]
    total = sum(measured.values())
    scales = {}
    for name, seconds in measured.items():
        if predicted.get(name, 0) > 0 and seconds >= 0.01 * total:
            scales[name] = min(max(seconds / predicted[name], 0.1), 10.0)
    overhead = max(min(walls[1:]) - min(spans), 0.0)

    cores = cluster["shared_processors"]
    efficiency = 1.0
    if ranks > cores:
        # The one-rank step's module on a mesh of `ranks`: every rank runs
        # it on the same (replicated) state.
        text = program.mlir.replace("module {", f"module {{\n  ernie.mesh @shared(r = {ranks})", 1)
        module = _ernie.parse_module(text)
        file, report = _ernie.write_program(module)
        copies = compiler.Program(program.model, program.optimizer, program.traced_module, module,
                                  file, None, list(batch), plan_report=report)

        def best(p):
            return _best_time(lambda: p.step(*batch), repeats)
        one, many = best(program), best(copies)
        efficiency = min(max(ranks * one / (cores * many), 0.1), 1.0)
    return scales, overhead, efficiency

#!/usr/bin/env python3
"""Compile time of sharding propagation + SPMD partition, ernie vs upstream.

Generates a stack of N Llama-style transformer layers (hidden 8192, 64 query
heads and 8 key/value heads of 128, MLP 28672; Megatron placement: attention
heads and MLP columns over mp = 8, batch over dp where the mesh has one) in
two forms:

  * ernie IR, run through `ernie-opt --ernie-sharding-propagation
    --ernie-spmd-partition`;
  * the same computation in linalg + upstream `shard`, run through
    `mlir-opt --pass-pipeline='builtin.module(func.func(sharding-propagation,
    shard-partition))'` (LLVM 22). Upstream has no sharding rule for
    reshapes or softmax, so its form keeps heads in a leading batch
    dimension and writes softmax as exp / sum / div.

Reported time is the passes alone, from each tool's --mlir-timing report
(parsing and printing excluded), best of --repeat.
Prints a table with the ratio upstream / ernie, the per-layer time (which
must stay flat as N grows: linear scaling), and ernie on mesh [8] against
mesh [64, 8, 16] (which must be equal: the program never enumerates ranks).
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

H, NH, NKV, HD, FFN = 8192, 64, 8, 128, 28672
BATCH, SEQ = 64, 64          # 4096 tokens
TOKENS = BATCH * SEQ


def ernie_module(layers: int, mesh: str) -> str:
    """mesh: '8' (mp) or '64x8x16' (dp, mp, sp)."""
    if mesh == "8":
        head = "ernie.mesh @mesh(mp = 8)"
        act = "#ernie.sharding<@mesh, [{}, {}, {}]>"
    else:
        head = "ernie.mesh @mesh(dp = 64, mp = 8, sp = 16)"
        act = "#ernie.sharding<@mesh, [{dp}, {}, {}]>"
    col = "#ernie.sharding<@mesh, [{}, {mp}]>"
    row = "#ernie.sharding<@mesh, [{mp}, {}]>"
    x = f"tensor<{BATCH}x{SEQ}x{H}xf32>"
    args = [f"%h: {x} {{ernie.sharding = {act}}}"]
    body = [f"  %pos = ernie.iota dim = 0 : tensor<{SEQ}xi64>"]
    cur = "%h"
    for l in range(layers):
        p = f"l{l}_"
        args += [f"%{p}ln1: tensor<{H}xf32>", f"%{p}ln2: tensor<{H}xf32>",
                 f"%{p}wq: tensor<{H}x{NH*HD}xf32> {{ernie.sharding = {col}}}",
                 f"%{p}wk: tensor<{H}x{NKV*HD}xf32> {{ernie.sharding = {col}}}",
                 f"%{p}wv: tensor<{H}x{NKV*HD}xf32> {{ernie.sharding = {col}}}",
                 f"%{p}wo: tensor<{NH*HD}x{H}xf32> {{ernie.sharding = {row}}}",
                 f"%{p}wg: tensor<{H}x{FFN}xf32> {{ernie.sharding = {col}}}",
                 f"%{p}wu: tensor<{H}x{FFN}xf32> {{ernie.sharding = {col}}}",
                 f"%{p}wd: tensor<{FFN}x{H}xf32> {{ernie.sharding = {row}}}"]
        q3 = f"tensor<{BATCH}x{SEQ}x{NH*HD}xf32>"
        kv3 = f"tensor<{BATCH}x{SEQ}x{NKV*HD}xf32>"
        q4 = f"tensor<{BATCH}x{SEQ}x{NH}x{HD}xf32>"
        kv4 = f"tensor<{BATCH}x{SEQ}x{NKV}x{HD}xf32>"
        f3 = f"tensor<{BATCH}x{SEQ}x{FFN}xf32>"
        pos = f"tensor<{SEQ}xi64>"
        body += [
            f"  %{p}n1 = ernie.rms_norm {cur}, %{p}ln1, epsilon = 1.0e-5 : {x}, tensor<{H}xf32>",
            f"  %{p}q = ernie.matmul %{p}n1, %{p}wq : {x}, tensor<{H}x{NH*HD}xf32> -> {q3}",
            f"  %{p}k = ernie.matmul %{p}n1, %{p}wk : {x}, tensor<{H}x{NKV*HD}xf32> -> {kv3}",
            f"  %{p}v = ernie.matmul %{p}n1, %{p}wv : {x}, tensor<{H}x{NKV*HD}xf32> -> {kv3}",
            f"  %{p}q4 = ernie.reshape %{p}q : {q3} -> {q4}",
            f"  %{p}k4 = ernie.reshape %{p}k : {kv3} -> {kv4}",
            f"  %{p}v4 = ernie.reshape %{p}v : {kv3} -> {kv4}",
            f"  %{p}qr = ernie.rope %{p}q4, %pos, theta = 500000.0 : {q4}, {pos}",
            f"  %{p}kr = ernie.rope %{p}k4, %pos, theta = 500000.0 : {kv4}, {pos}",
            f"  %{p}a = ernie.attention %{p}qr, %{p}kr, %{p}v4 {{causal}} : {q4}, {kv4}, {kv4} -> {q4}",
            f"  %{p}a3 = ernie.reshape %{p}a : {q4} -> {q3}",
            f"  %{p}o = ernie.matmul %{p}a3, %{p}wo : {q3}, tensor<{NH*HD}x{H}xf32> -> {x}",
            f"  %{p}h1 = ernie.add {cur}, %{p}o : {x}",
            f"  %{p}n2 = ernie.rms_norm %{p}h1, %{p}ln2, epsilon = 1.0e-5 : {x}, tensor<{H}xf32>",
            f"  %{p}g = ernie.matmul %{p}n2, %{p}wg : {x}, tensor<{H}x{FFN}xf32> -> {f3}",
            f"  %{p}u = ernie.matmul %{p}n2, %{p}wu : {x}, tensor<{H}x{FFN}xf32> -> {f3}",
            f"  %{p}s = ernie.silu %{p}g : {f3}",
            f"  %{p}m = ernie.mul %{p}s, %{p}u : {f3}",
            f"  %{p}d = ernie.matmul %{p}m, %{p}wd : {f3}, tensor<{FFN}x{H}xf32> -> {x}",
            f"  %{p}h2 = ernie.add %{p}h1, %{p}d : {x}",
        ]
        cur = f"%{p}h2"
    body.append(f"  return {cur} : {x}")
    sig = ",\n    ".join(args)
    return f"{head}\nfunc.func @stack(\n    {sig}) -> {x} {{\n" + "\n".join(body) + "\n}\n"


def upstream_module(layers: int, mesh: str) -> str:
    """The same stack in linalg + shard. Heads live in a leading batch dim."""
    if mesh == "8":
        head, mp, act = "shard.grid @mesh(shape = 8)", 0, "[[]]"
    else:
        head, mp, act = "shard.grid @mesh(shape = 64x8x16)", 1, "[[0]]"
    T, F = TOKENS, FFN
    x = f"tensor<{T}x{H}xf32>"
    lines = [head, f"func.func @stack(%h: {x}"]
    body = []
    n = [0]

    def fresh(prefix="t"):
        n[0] += 1
        return f"%{prefix}{n[0]}"

    def empty(ty):
        v = fresh("e")
        body.append(f"  {v} = tensor.empty() : {ty}")
        return v

    def zeros(ty):
        e = empty(ty)
        v = fresh("z")
        body.append(f"  {v} = linalg.fill ins(%zero : f32) outs({e} : {ty}) -> {ty}")
        return v

    def shard_arg(name, ty, axes):
        s, v = fresh("s"), fresh("w")
        body.append(f"  {s} = shard.sharding @mesh split_axes = {axes} : !shard.sharding")
        body.append(f"  {v} = shard.shard %{name} to {s} annotate_for_users : {ty}")
        return v

    def binary(op, a, b, ty):
        v = fresh()
        body.append(f"  {v} = linalg.{op} ins({a}, {b} : {ty}, {ty}) outs({empty(ty)} : {ty}) -> {ty}")
        return v

    def unary(op, a, ty):
        v = fresh()
        body.append(f"  {v} = linalg.{op} ins({a} : {ty}) outs({empty(ty)} : {ty}) -> {ty}")
        return v

    def bmm(a, ta, b, tb, tr, named="batch_matmul"):
        v = fresh()
        body.append(f"  {v} = linalg.{named} ins({a}, {b} : {ta}, {tb}) outs({zeros(tr)} : {tr}) -> {tr}")
        return v

    def broadcast(a, ta, tr, dims):
        v = fresh()
        body.append(f"  {v} = linalg.broadcast ins({a} : {ta}) outs({empty(tr)} : {tr}) dimensions = {dims}")
        return v

    def reduce_sum(a, ta, tr, dim):
        v = fresh()
        body.append(f"  {v} = linalg.reduce ins({a} : {ta}) outs({zeros(tr)} : {tr}) dimensions = [{dim}]\n"
                    f"    (%in: f32, %acc: f32) {{\n      %r = arith.addf %in, %acc : f32\n      linalg.yield %r : f32\n    }}")
        return v

    def norm(cur, ln):
        lnb = broadcast(f"%{ln}", f"tensor<{H}xf32>", x, "[0]")
        return binary("mul", cur, lnb, x)

    args = []
    body.append("  %zero = arith.constant 0.0 : f32")
    sa = fresh("s")
    body.append(f"  {sa} = shard.sharding @mesh split_axes = {act} : !shard.sharding")
    cur = fresh("h")
    body.append(f"  {cur} = shard.shard %h to {sa} annotate_for_users : {x}")
    heads = f"[[{mp}]]"
    col = f"[[], [{mp}]]"
    row = f"[[{mp}]]"
    for l in range(layers):
        p = f"l{l}_"
        tq = f"tensor<{NH}x{H}x{HD}xf32>"
        to = f"tensor<{NH}x{HD}x{H}xf32>"
        args += [f"%{p}ln1: tensor<{H}xf32>", f"%{p}ln2: tensor<{H}xf32>",
                 f"%{p}wq: {tq}", f"%{p}wk: {tq}", f"%{p}wv: {tq}", f"%{p}wo: {to}",
                 f"%{p}wg: tensor<{H}x{F}xf32>", f"%{p}wu: tensor<{H}x{F}xf32>",
                 f"%{p}wd: tensor<{F}x{H}xf32>"]
        wq, wk, wv = (shard_arg(f"{p}w{c}", tq, heads) for c in "qkv")
        wo = shard_arg(f"{p}wo", to, heads)
        wg = shard_arg(f"{p}wg", f"tensor<{H}x{F}xf32>", col)
        wu = shard_arg(f"{p}wu", f"tensor<{H}x{F}xf32>", col)
        wd = shard_arg(f"{p}wd", f"tensor<{F}x{H}xf32>", row)
        n1 = norm(cur, f"{p}ln1")
        xb_t = f"tensor<{NH}x{T}x{H}xf32>"
        qt = f"tensor<{NH}x{T}x{HD}xf32>"
        st = f"tensor<{NH}x{T}x{T}xf32>"
        nb = broadcast(n1, x, xb_t, "[0]")
        q = bmm(nb, xb_t, wq, tq, qt)
        k = bmm(nb, xb_t, wk, tq, qt)
        v = bmm(nb, xb_t, wv, tq, qt)
        kt_t = f"tensor<{NH}x{HD}x{T}xf32>"
        kt = fresh()
        body.append(f"  {kt} = linalg.transpose ins({k} : {qt}) outs({empty(kt_t)} : {kt_t}) permutation = [0, 2, 1]")
        s = bmm(q, qt, kt, kt_t, st)
        e = unary("exp", s, st)
        den = reduce_sum(e, st, f"tensor<{NH}x{T}xf32>", 2)
        denb = broadcast(den, f"tensor<{NH}x{T}xf32>", st, "[2]")
        pr = binary("div", e, denb, st)
        c = bmm(pr, st, v, qt, qt)
        o3 = bmm(c, qt, wo, to, xb_t)
        o = reduce_sum(o3, xb_t, x, 0)
        h1 = binary("add", cur, o, x)
        n2 = norm(h1, f"{p}ln2")
        ft = f"tensor<{T}x{F}xf32>"
        g = bmm(n2, x, wg, f"tensor<{H}x{F}xf32>", ft, "matmul")
        u = bmm(n2, x, wu, f"tensor<{H}x{F}xf32>", ft, "matmul")
        a = unary("exp", g, ft)
        m = binary("mul", a, u, ft)
        d = bmm(m, ft, wd, f"tensor<{F}x{H}xf32>", x, "matmul")
        cur = binary("add", h1, d, x)
    body.append(f"  return {cur} : {x}")
    return (head + f"\nfunc.func @stack(%h: {x},\n    " + ",\n    ".join(args) +
            f") -> {x} {{\n" + "\n".join(body) + "\n}\n")


def pass_time(cmd, names, repeat):
    """Best wall time of the passes in `names`, from --mlir-timing."""
    best = float("inf")
    for _ in range(repeat):
        result = subprocess.run(cmd + ["--mlir-timing", "--mlir-timing-display=list"],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:2])} failed:\n{result.stderr[-2000:]}")
        total = 0.0
        for line in result.stderr.splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[-1] in names:
                total += float(parts[0])
        best = min(best, total)
    return max(best, 1e-6)


def count_ops(text):
    return sum(1 for line in text.splitlines() if " = " in line and not line.lstrip().startswith("//"))


def main():
    root = Path(__file__).resolve().parents[1]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ernie-opt", default=str(root / "build" / "bin" / "ernie-opt"))
    parser.add_argument("--mlir-opt", default="/usr/lib/llvm-22/bin/mlir-opt")
    parser.add_argument("--layers", default="1,8,80")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    layers = [int(n) for n in args.layers.split(",")]
    upstream_pipeline = "--pass-pipeline=builtin.module(func.func(sharding-propagation,shard-partition))"
    ours = ["--ernie-sharding-propagation", "--ernie-spmd-partition"]

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in layers:
            for mesh in ("8", "64x8x16"):
                e_path = Path(tmp, f"ernie_{n}_{mesh}.mlir")
                e_path.write_text(ernie_module(n, mesh))
                e_time = pass_time([args.ernie_opt, str(e_path), *ours, "-o", os.devnull],
                                   {"ShardingPropagationPass", "SpmdPartitionPass"}, args.repeat)
                u_path = Path(tmp, f"up_{n}_{mesh}.mlir")
                u_path.write_text(upstream_module(n, mesh))
                u_time = pass_time([args.mlir_opt, str(u_path), upstream_pipeline, "-o", os.devnull],
                                   {"ShardingPropagation", "Partition"}, args.repeat)
                rows.append((n, mesh, count_ops(e_path.read_text()), e_time,
                             count_ops(u_path.read_text()), u_time))

    print(f"{'layers':>6} {'mesh':>8} | {'ernie ops':>9} {'ernie s':>8} {'ms/layer':>8} | "
          f"{'upstream ops':>12} {'upstream s':>10} {'ms/layer':>8} | {'upstream/ernie':>14}")
    print("-" * 100)
    for n, mesh, eo, et, uo, ut in rows:
        print(f"{n:>6} {mesh:>8} | {eo:>9} {et:>8.3f} {1000*et/n:>8.2f} | "
              f"{uo:>12} {ut:>10.3f} {1000*ut/n:>8.2f} | {ut/et:>14.2f}")
    print()
    by = {(n, mesh): et for n, mesh, _, et, _, _ in rows}
    print("ernie: mesh [64, 8, 16] time / mesh [8] time (1.0 = independent of rank count)")
    for n in layers:
        print(f"  {n:>3} layers: {by[(n, '64x8x16')] / by[(n, '8')]:.2f}")
    if len(layers) > 1:
        lo, hi = layers[0], layers[-1]
        print(f"ernie: time per layer at {hi} layers / at {lo} layer(s) (1.0 = linear): "
              f"{(by[(hi, '8')] / hi) / (by[(lo, '8')] / lo):.2f}")


if __name__ == "__main__":
    sys.exit(main())

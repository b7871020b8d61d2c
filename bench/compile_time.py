#!/usr/bin/env python3
"""Compile time against depth: ernie beside JAX/XLA compiling a scan.

The model is Llama-70B's layer (hidden 8192, 64 q / 8 kv heads, MLP 28672,
vocabulary 128256, bf16) at 8 to 80 layers, trained with AdamW on a
dp 8 x mp 8 mesh of 64 ranks (ZeRO-1, Paddle's tensor-parallel plan), global
batch 8 x 4096. ernie compiles abstractly (traced, differentiated, ZeRO,
propagated, partitioned, fused, memory-planned, written as a program file;
nothing allocated); the report() column is the plan report after it.

The peer is JAX/XLA's jit of the same training step (loss, gradients, AdamW)
with the layers stacked and run by `lax.scan` (compiled once, whatever the
depth), sharded over 64 host devices the same way (Megatron's column/row
split of the projections over mp, the batch over dp), lowered and compiled
from shapes alone (`jit(...).lower(ShapeDtypeStructs).compile()`). It runs
in the bench's own environment (build-bench/jax, see
bench/requirements-jax.txt) and is skipped with a note when absent.

Issue 20's targets: ernie's time linear in depth, and at most half of
XLA's scan compile.

    PYTHONPATH=build/python .venv/bin/python bench/compile_time.py [--layers 8 16 40 80]
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "build" / "python"))

MODEL = dict(vocab_size=128256, hidden_size=8192, intermediate_size=28672,
             num_attention_heads=64, num_key_value_heads=8)
DP, MP, BATCH, SEQ = 8, 8, 8, 4096


def ernie_compile(layers, repeat):
    import numpy as np
    import ernie
    import ernie.distributed as dist
    from ernie.models.llama import LlamaConfig, LlamaForCausalLM, parallelize_plan
    best, report = float("inf"), float("inf")
    for _ in range(repeat):
        with ernie.nn.abstract():
            model = LlamaForCausalLM(LlamaConfig(dtype="bf16", num_hidden_layers=layers, **MODEL))
        mesh = dist.ProcessMesh(np.arange(DP * MP).reshape(DP, MP), ["dp", "mp"])
        ids = np.zeros((BATCH, SEQ), np.int64)
        t = time.perf_counter()
        program = ernie.compile(model, ernie.optimizer.AdamW(1e-4), [ids, ids], mesh=mesh,
                                abstract=True,
                                config={"dp_config": {"sharding_level": 1},
                                        "mp_config": {"parallelize_plan": parallelize_plan()}})
        best = min(best, time.perf_counter() - t)
        t = time.perf_counter()
        program.report()
        report = min(report, time.perf_counter() - t)
    return best, report


JAX_WORKER = r"""
import json, sys, time
import jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
spec = json.loads(sys.argv[1])
L, H, F, V = spec["layers"], spec["hidden"], spec["ffn"], spec["vocab"]
NH, KV = spec["heads"], spec["kv_heads"]; D = H // NH
B, S = spec["batch"], spec["seq"]
import numpy as np
mesh = Mesh(np.array(jax.devices()).reshape(spec["dp"], spec["mp"]), ("dp", "mp"))
bf = jnp.bfloat16
shapes = {"embed": ((V, H), P(None, "mp")), "head": ((H, V), P(None, "mp")),
          "norm": ((H,), P()),
          "ln1": ((L, H), P()), "ln2": ((L, H), P()),
          "wq": ((L, H, NH * D), P(None, None, "mp")), "wk": ((L, H, KV * D), P(None, None, "mp")),
          "wv": ((L, H, KV * D), P(None, None, "mp")), "wo": ((L, NH * D, H), P(None, "mp", None)),
          "wg": ((L, H, F), P(None, None, "mp")), "wu": ((L, H, F), P(None, None, "mp")),
          "wd": ((L, F, H), P(None, "mp", None))}
sh = lambda p: NamedSharding(mesh, p)
params = {k: jax.ShapeDtypeStruct(s, bf, sharding=sh(p)) for k, (s, p) in shapes.items()}
state = {k: jax.ShapeDtypeStruct(s, jnp.float32, sharding=sh(p)) for k, (s, p) in shapes.items()}
ids = jax.ShapeDtypeStruct((B, S), jnp.int32, sharding=sh(P("dp", None)))

def rms(x, w):
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6)).astype(bf) * w

def rope(x):
    pos = jnp.arange(S)[:, None] / (10000.0 ** (jnp.arange(0, D, 2) / D))[None, :]
    c, s = jnp.cos(pos).astype(bf)[None, :, None, :], jnp.sin(pos).astype(bf)[None, :, None, :]
    a, b = x[..., ::2], x[..., 1::2]
    return jnp.concatenate([a * c - b * s, a * s + b * c], -1)

def layer(h, l):
    n = rms(h, l["ln1"])
    q = rope((n @ l["wq"]).reshape(B, S, NH, D))
    k = rope((n @ l["wk"]).reshape(B, S, KV, D))
    v = (n @ l["wv"]).reshape(B, S, KV, D)
    k, v = jnp.repeat(k, NH // KV, 2), jnp.repeat(v, NH // KV, 2)
    att = jnp.einsum("bqhd,bkhd->bhqk", q, k) * D ** -0.5
    att = jnp.where(jnp.tril(jnp.ones((S, S), bool)), att, -1e9)
    o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(att.astype(jnp.float32), -1).astype(bf), v)
    h = h + o.reshape(B, S, H) @ l["wo"]
    n = rms(h, l["ln2"])
    return h + (jax.nn.silu(n @ l["wg"]) * (n @ l["wu"])) @ l["wd"], None

def loss_fn(p, ids):
    h = p["embed"][ids]
    layers = {k: p[k] for k in ("ln1", "ln2", "wq", "wk", "wv", "wo", "wg", "wu", "wd")}
    h, _ = jax.lax.scan(layer, h, layers)
    logits = (rms(h, p["norm"]) @ p["head"]).astype(jnp.float32)
    logits, labels = logits[:, :-1], ids[:, 1:]  # Hugging Face's shift, as ernie's model
    picked = jnp.take_along_axis(logits, labels[..., None], -1)[..., 0]
    return jnp.mean(jax.nn.logsumexp(logits, -1) - picked)

def step(p, m, v, ids):
    loss, g = jax.value_and_grad(loss_fn)(p, ids)
    m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g.astype(jnp.float32), m, g)
    v = jax.tree_util.tree_map(lambda v, g: 0.999 * v + 0.001 * jnp.square(g.astype(jnp.float32)), v, g)
    p = jax.tree_util.tree_map(lambda p, m, v: (p.astype(jnp.float32) - 1e-4 * (m / (jnp.sqrt(v) + 1e-8) + 0.01 * p.astype(jnp.float32))).astype(bf), p, m, v)
    return p, m, v, loss

jax.jit(lambda x: x + 1).lower(ids).compile()  # XLA's own start-up, not the model's
best = float("inf")
for _ in range(spec["repeat"]):
    jax.clear_caches()
    t = time.perf_counter()
    jax.jit(step, donate_argnums=(0, 1, 2)).lower(params, state, state, ids).compile()
    best = min(best, time.perf_counter() - t)
print(json.dumps({"seconds": best, "version": jax.__version__}))
"""


def jax_python():
    exe = ROOT / "build-bench" / "jax" / "bin" / "python"
    candidates = [str(exe)] if exe.exists() else []
    candidates.append(sys.executable)
    for python in candidates:
        if subprocess.run([python, "-c", "import jax"], capture_output=True).returncode == 0:
            return python
    return None


def xla_scan_compile(python, layers, repeat):
    spec = dict(layers=layers, hidden=MODEL["hidden_size"], ffn=MODEL["intermediate_size"],
                vocab=MODEL["vocab_size"], heads=MODEL["num_attention_heads"],
                kv_heads=MODEL["num_key_value_heads"], batch=BATCH, seq=SEQ, dp=DP, mp=MP,
                repeat=repeat)
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={DP * MP}",
               JAX_PLATFORMS="cpu")
    out = subprocess.run([python, "-c", JAX_WORKER, json.dumps(spec)], capture_output=True,
                         text=True, env=env)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[8, 16, 40, 80])
    ap.add_argument("--repeat", type=int, default=2, help="best of this many compiles")
    a = ap.parse_args()
    python = jax_python()
    if python is None:
        print("note: no jax (python3 -m venv build-bench/jax && build-bench/jax/bin/pip install "
              "-r bench/requirements-jax.txt); the XLA column is skipped")
    print(f"Llama-70B layers, AdamW, dp {DP} x mp {MP} = {DP * MP} ranks, batch {BATCH} x {SEQ}\n")
    print(f"{'layers':>6} {'ernie s':>8} {'ms/layer':>9} {'report s':>9} {'XLA scan s':>11} "
          f"{'ernie/XLA':>10}")
    version = None
    for layers in a.layers:
        seconds, report = ernie_compile(layers, a.repeat)
        xla = ""
        ratio = ""
        if python:
            r = xla_scan_compile(python, layers, a.repeat)
            version = r["version"]
            xla = f"{r['seconds']:11.2f}"
            ratio = f"{seconds / r['seconds']:10.2f}"
        print(f"{layers:>6} {seconds:8.2f} {seconds / layers * 1e3:9.1f} {report:9.2f} "
              f"{xla:>11} {ratio:>10}")
    if version:
        print(f"\nJAX {version} (jit of the scanned step, lowered and compiled on {DP * MP} "
              f"host devices)")


if __name__ == "__main__":
    main()

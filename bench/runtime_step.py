#!/usr/bin/env python3
"""Training step time of a small Llama-style model: ernie-run vs PyTorch eager.

Generates N Llama-style layers plus embedding, final norm, LM head and
cross-entropy (f32; RMSNorm, separate q/k/v projections, rotary embedding,
grouped-query causal attention, SwiGLU MLP) as ernie IR, compiles the SGD
training step with

    ernie-opt --ernie-autodiff=optimizer=sgd
              --ernie-auto-parallel-pipeline=cluster=<this machine>
              --ernie-bucket-gradients --ernie-fuse      (--no-fuse: without)
    ernie-translate --ernie-to-program

where <this machine> is ernie.cost.calibrate_cpu(ranks=2) measured at the
start (--cluster none: by bytes, as before 2026-12-06's fifth session), so
that propagation weighs work every mp rank would repeat (plain mp's
replicated LM head) against the collectives that divide it.

and times `ernie-run --steps K` (its printed mean step time, first step
excluded) on 1 rank, and on 2 ranks of the thread engine: data parallel
(`dp`: batch over dp = 2) and Megatron tensor parallel (`mp`: heads and MLP
columns over mp = 2; `mpv` also splits the LM head over the vocabulary).
Each ernie rank is one thread with one BLAS thread.

The peer is PyTorch eager on the CPU doing the same model (same shapes,
forward + backward + torch.optim.SGD, momentum 0) on as many cores: one
thread for 1 rank; for 2 ranks, the fastest of the ways torch can use 2
threads (torch.set_num_threads only sets OpenMP's threads; GEMM runs in
OpenBLAS's own, so both counts are set, and every setting tried is printed).
It runs in a subprocess of an interpreter that has torch (this one, or
/usr/bin/python3 for Debian's python3-torch); without one the torch column
is skipped with a note.

Both get the same batch: token ids and labels drawn uniformly from the
vocabulary (seeded; written as .npy for `ernie-run --inputs`), so the
attention scores and their gradients differ per token and the printed losses
exercise the whole step.

The second peer is JAX/XLA: the same model, loss, gradients and SGD update
in one jitted function, on as many cores (pinned), from the bench's own environment (build-bench/jax, see
bench/requirements-jax.txt); without jax the column is skipped with a note.

Every time is the best of --repeat runs of K steps. Prints a table with the
ratios ernie / torch and ernie / jax (below 1: ernie is faster).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class Config:
    def __init__(self, a):
        self.layers, self.batch, self.seq = a.layers, a.batch, a.seq
        self.hidden, self.heads, self.kv_heads = a.hidden, a.heads, a.kv_heads
        self.ffn, self.vocab = a.ffn, a.vocab
        self.head_dim = self.hidden // self.heads

    def as_dict(self):
        return {k: getattr(self, k) for k in
                ("layers", "batch", "seq", "hidden", "heads", "kv_heads", "ffn", "vocab")}

    def describe(self):
        return (f"{self.layers} layer(s), batch {self.batch} x seq {self.seq}, hidden "
                f"{self.hidden}, {self.heads} q / {self.kv_heads} kv heads of {self.head_dim}, "
                f"MLP {self.ffn}, vocabulary {self.vocab}, f32")

    def matmul_gflop(self):
        """Forward + backward GEMM work of one step (3x the forward)."""
        t, h, d = self.batch * self.seq, self.hidden, self.head_dim
        kv = self.kv_heads * d
        per_layer = 2 * t * h * (h + 2 * kv + h) + 2 * t * h * 3 * self.ffn
        attn = 2 * 2 * self.batch * self.heads * self.seq * self.seq * d
        head = 2 * t * h * self.vocab
        return 3 * (self.layers * (per_layer + attn) + head) / 1e9


def ernie_module(c: Config, mode: str) -> str:
    """mode: 'single'; 'dp' (batch over dp = 2); 'mp' (Megatron over mp = 2:
    q/k/v, gate and up split by columns, o and down by rows; embedding and LM
    head replicated); 'mpv' (mp, and the LM head split over the vocabulary:
    vocab-parallel cross-entropy)."""
    B, S, H, NH, NKV, D, F, V = (c.batch, c.seq, c.hidden, c.heads, c.kv_heads,
                                 c.head_dim, c.ffn, c.vocab)
    KV = NKV * D
    x = f"tensor<{B}x{S}x{H}xf32>"
    ids_t = f"tensor<{B}x{S}xi64>"
    head = ""
    batch_attr = ""
    col = row = ""
    if mode == "dp":
        head = "ernie.mesh @mesh(dp = 2)\n"
        batch_attr = " {ernie.sharding = #ernie.sharding<@mesh, [{dp}, {}]>}"
    elif mode in ("mp", "mpv"):
        head = "ernie.mesh @mesh(mp = 2)\n"
        col = ", ernie.sharding = #ernie.sharding<@mesh, [{}, {mp}]>"
        row = ", ernie.sharding = #ernie.sharding<@mesh, [{mp}, {}]>"
    head_col = col if mode == "mpv" else ""

    def param(name, ty, extra=""):
        return f"%{name.replace('.', '_')}: {ty} {{ernie.param = \"{name}\"{extra}}}"

    args = [f"%ids: {ids_t}{batch_attr}", f"%labels: {ids_t}{batch_attr}",
            param("embed", f"tensor<{V}x{H}xf32>")]
    body = [f"  %h0 = ernie.embedding %ids, %embed : {ids_t}, tensor<{V}x{H}xf32> -> {x}",
            f"  %pos = ernie.iota dim = 0 : tensor<{S}xi64>"]
    q3, kv3 = f"tensor<{B}x{S}x{H}xf32>", f"tensor<{B}x{S}x{KV}xf32>"
    q4, kv4 = f"tensor<{B}x{S}x{NH}x{D}xf32>", f"tensor<{B}x{S}x{NKV}x{D}xf32>"
    f3, pos = f"tensor<{B}x{S}x{F}xf32>", f"tensor<{S}xi64>"
    cur = "%h0"
    for l in range(c.layers):
        p = f"l{l}_"
        args += [param(f"l{l}.ln1", f"tensor<{H}xf32>"),
                 param(f"l{l}.wq", f"tensor<{H}x{H}xf32>", col),
                 param(f"l{l}.wk", f"tensor<{H}x{KV}xf32>", col),
                 param(f"l{l}.wv", f"tensor<{H}x{KV}xf32>", col),
                 param(f"l{l}.wo", f"tensor<{H}x{H}xf32>", row),
                 param(f"l{l}.ln2", f"tensor<{H}xf32>"),
                 param(f"l{l}.wg", f"tensor<{H}x{F}xf32>", col),
                 param(f"l{l}.wu", f"tensor<{H}x{F}xf32>", col),
                 param(f"l{l}.wd", f"tensor<{F}x{H}xf32>", row)]
        w = f"%l{l}_"
        body += [
            f"  %{p}n1 = ernie.rms_norm {cur}, {w}ln1, epsilon = 1.0e-6 : {x}, tensor<{H}xf32>",
            f"  %{p}q = ernie.matmul %{p}n1, {w}wq : {x}, tensor<{H}x{H}xf32> -> {q3}",
            f"  %{p}k = ernie.matmul %{p}n1, {w}wk : {x}, tensor<{H}x{KV}xf32> -> {kv3}",
            f"  %{p}v = ernie.matmul %{p}n1, {w}wv : {x}, tensor<{H}x{KV}xf32> -> {kv3}",
            f"  %{p}q4 = ernie.reshape %{p}q : {q3} -> {q4}",
            f"  %{p}k4 = ernie.reshape %{p}k : {kv3} -> {kv4}",
            f"  %{p}v4 = ernie.reshape %{p}v : {kv3} -> {kv4}",
            f"  %{p}qr = ernie.rope %{p}q4, %pos, theta = 10000.0 : {q4}, {pos}",
            f"  %{p}kr = ernie.rope %{p}k4, %pos, theta = 10000.0 : {kv4}, {pos}",
            f"  %{p}a = ernie.attention %{p}qr, %{p}kr, %{p}v4 {{causal}} : {q4}, {kv4}, {kv4} -> {q4}",
            f"  %{p}a3 = ernie.reshape %{p}a : {q4} -> {q3}",
            f"  %{p}o = ernie.matmul %{p}a3, {w}wo : {q3}, tensor<{H}x{H}xf32> -> {x}",
            f"  %{p}h1 = ernie.add {cur}, %{p}o : {x}",
            f"  %{p}n2 = ernie.rms_norm %{p}h1, {w}ln2, epsilon = 1.0e-6 : {x}, tensor<{H}xf32>",
            f"  %{p}g = ernie.matmul %{p}n2, {w}wg : {x}, tensor<{H}x{F}xf32> -> {f3}",
            f"  %{p}u = ernie.matmul %{p}n2, {w}wu : {x}, tensor<{H}x{F}xf32> -> {f3}",
            f"  %{p}s = ernie.silu %{p}g : {f3}",
            f"  %{p}m = ernie.mul %{p}s, %{p}u : {f3}",
            f"  %{p}d = ernie.matmul %{p}m, {w}wd : {f3}, tensor<{F}x{H}xf32> -> {x}",
            f"  %{p}h2 = ernie.add %{p}h1, %{p}d : {x}",
        ]
        cur = f"%{p}h2"
    logits = f"tensor<{B}x{S}x{V}xf32>"
    args += [param("lnf", f"tensor<{H}xf32>"), param("whead", f"tensor<{H}x{V}xf32>", head_col)]
    body += [
        f"  %z = ernie.rms_norm {cur}, %lnf, epsilon = 1.0e-6 : {x}, tensor<{H}xf32>",
        f"  %logits = ernie.matmul %z, %whead : {x}, tensor<{H}x{V}xf32> -> {logits}",
        f"  %loss = ernie.cross_entropy %logits, %labels : {logits}, {ids_t} -> tensor<f32>",
        "  return %loss : tensor<f32>",
    ]
    sig = ",\n    ".join(args)
    return f"{head}func.func @forward(\n    {sig}) -> tensor<f32> {{\n" + "\n".join(body) + "\n}\n"


def run(cmd, env=None):
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed:\n{result.stderr[-3000:]}")
    return result.stdout


def compile_program(c, mode, tmp, tools, fuse=True, cluster=None):
    src = Path(tmp, f"{mode}.mlir")
    src.write_text(ernie_module(c, mode))
    part = Path(tmp, f"{mode}.part.mlir")
    prog = Path(tmp, f"{mode}.ernie")
    pipeline = "--ernie-auto-parallel-pipeline" + (f"=cluster={cluster}" if cluster else "")
    run([tools["opt"], str(src), "--ernie-autodiff=optimizer=sgd",
         pipeline, "--ernie-bucket-gradients",
         *(["--ernie-fuse"] if fuse else []),
         "-o", str(part)])
    run([tools["translate"], "--ernie-to-program", str(part), "-o", str(prog)])
    text = part.read_text()
    grad = text.split("func.func @forward_grad", 1)[-1].split("func.func @", 1)[0]
    collectives = len(re.findall(
        r"ernie\.(all_reduce|all_gather|reduce_scatter|all_to_all)(_start)?\b", grad))
    return prog, collectives


def host_cluster(choice, ranks, directory):
    """The cluster the programs are compiled for (None: by bytes). The
    default measures this machine as `ranks` CPU thread ranks with
    ernie.cost.calibrate_cpu (a couple of seconds, in the build's own
    environment), so propagation weighs compute against the thread
    engine's collectives as the runtime will run them."""
    if choice == "none":
        return None
    if choice != "calibrate":
        return choice
    path = Path(directory, "cluster.json")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "build" / "python"))
    python = ROOT / ".venv" / "bin" / "python"
    try:
        run([str(python if python.exists() else sys.executable), "-c",
             "import json, sys; from ernie import cost; "
             f"json.dump(cost.calibrate_cpu(ranks={ranks}, profile=False), "
             "open(sys.argv[1], 'w'))", str(path)], env=env)
    except RuntimeError as e:
        lines = [l for l in str(e).splitlines() if l.strip()]
        print(f"note: calibrating this machine failed ({lines[-1] if lines else e}); "
              "compiling by bytes")
        return None
    return str(path)


def describe_cluster(path):
    spec = json.loads(Path(path).read_text())
    d, link = spec["device"], spec["intra_node"]
    return (f"compiled for: {spec['name']} (f32 GEMM {d['peak_flops']['f32'] / 1e9:.0f} GFLOP/s, "
            f"memory {d['memory_bandwidth'] / 1e9:.1f} GB/s; all-reduce link "
            f"{link['bandwidth'] / 1e9:.1f} GB/s, {link['latency'] * 1e6:.0f} us per hop)")


def write_batch(c, directory):
    """Token ids and labels, uniform over the vocabulary: input0.npy and
    input1.npy (ernie-run's names for the first and second batch input)."""
    import numpy as np
    rng = np.random.default_rng(1234)
    for k in range(2):
        np.save(Path(directory, f"input{k}.npy"),
                rng.integers(0, c.vocab, size=(c.batch, c.seq), dtype=np.int64))
    return directory


def ernie_step_ms(prog, ranks, steps, repeat, tools, batch_dir):
    best, losses = float("inf"), None
    for _ in range(repeat):
        out = run([tools["run"], str(prog), "--ranks", str(ranks), "--backend", "threads",
                   "--steps", str(steps), "--lr", "0.01", "--inputs", str(batch_dir)])
        m = re.search(r"mean step time ([0-9.]+) ms", out)
        if not m:
            raise RuntimeError(f"no mean step time in ernie-run's output:\n{out}")
        best = min(best, float(m.group(1)))
        losses = [float(v) for v in re.findall(r"loss ([-0-9.eE+naninf]+)", out)]
    return best, losses


# ---------------------------------------------------------------------------
# The PyTorch peer (runs in a subprocess: `--torch-worker JSON`).

def torch_worker(spec):
    import torch
    import torch.nn.functional as Fn

    torch.set_num_threads(spec["threads"])
    c = spec["config"]
    B, S, H, NH, NKV, F, V = (c["batch"], c["seq"], c["hidden"], c["heads"],
                              c["kv_heads"], c["ffn"], c["vocab"])
    D, KV = H // NH, (H // NH) * NKV
    torch.manual_seed(0)

    def matrix(rows, cols):  # uniform in +-1/sqrt(fan-in), like ernie-run's default
        bound = rows ** -0.5
        return ((torch.rand(rows, cols) * 2 - 1) * bound).requires_grad_()

    def vector(n):
        return torch.ones(n, requires_grad=True)

    embed = matrix(V, H)
    layers = []
    for _ in range(c["layers"]):
        layers.append(dict(ln1=vector(H), wq=matrix(H, H), wk=matrix(H, KV), wv=matrix(H, KV),
                           wo=matrix(H, H), ln2=vector(H), wg=matrix(H, F), wu=matrix(H, F),
                           wd=matrix(F, H)))
    lnf, whead = vector(H), matrix(H, V)
    params = [embed, lnf, whead] + [p for l in layers for p in l.values()]
    opt = torch.optim.SGD(params, lr=0.01, momentum=0.0)

    import numpy as np
    ids = torch.from_numpy(np.load(Path(spec["batch"], "input0.npy")))
    labels = torch.from_numpy(np.load(Path(spec["batch"], "input1.npy")))
    inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    ang = torch.outer(torch.arange(S, dtype=torch.float32), inv)
    cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :]
    mask = torch.full((S, S), float("-inf")).triu(1)

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def rope(x):
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def step():
        h = Fn.embedding(ids, embed)
        for l in layers:
            n1 = rms(h, l["ln1"])
            q = rope((n1 @ l["wq"]).view(B, S, NH, D)).transpose(1, 2)
            k = rope((n1 @ l["wk"]).view(B, S, NKV, D)).transpose(1, 2)
            v = (n1 @ l["wv"]).view(B, S, NKV, D).transpose(1, 2)
            rep = NH // NKV
            k = k[:, :, None].expand(B, NKV, rep, S, D).reshape(B, NH, S, D)
            v = v[:, :, None].expand(B, NKV, rep, S, D).reshape(B, NH, S, D)
            p = torch.softmax(q @ k.transpose(-1, -2) * D ** -0.5 + mask, -1)
            a = (p @ v).transpose(1, 2).reshape(B, S, H)
            h = h + a @ l["wo"]
            n2 = rms(h, l["ln2"])
            h = h + (Fn.silu(n2 @ l["wg"]) * (n2 @ l["wu"])) @ l["wd"]
        logits = rms(h, lnf) @ whead
        loss = Fn.cross_entropy(logits.view(-1, V), labels.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()

    best, losses = float("inf"), []
    for r in range(spec["repeat"]):
        # Training continues across repeats; the losses shown are the first run's.
        run_losses = [step()]  # like ernie-run, the first step is not timed
        total = 0.0
        cpu = time.process_time()
        for _ in range(spec["steps"]):
            start = time.perf_counter()
            run_losses.append(step())
            total += time.perf_counter() - start
        losses = losses or run_losses
        cpu = time.process_time() - cpu
        if 1000 * total / spec["steps"] < best:
            best, util = 1000 * total / spec["steps"], cpu / total
    print(json.dumps({"ms": best, "losses": losses, "version": torch.__version__,
                      "threads": torch.get_num_threads(), "cpu_util": util}))


def jax_worker(spec):
    """The same model, step and shapes as JAX/XLA compiles them: loss,
    gradients and the SGD update in one jitted function, on `threads` cores
    (the process is pinned to them; with one, XLA's Eigen pool is off)."""
    os.sched_setaffinity(0, set(range(spec["threads"])))
    import jax
    import jax.numpy as jnp
    import numpy as np

    c = spec["config"]
    B, S, H, NH, NKV, F, V = (c["batch"], c["seq"], c["hidden"], c["heads"],
                              c["kv_heads"], c["ffn"], c["vocab"])
    D, KV = H // NH, (H // NH) * NKV
    rng = np.random.default_rng(0)

    def matrix(rows, cols):  # uniform in +-1/sqrt(fan-in), like ernie-run's default
        return jnp.asarray((rng.random((rows, cols), dtype=np.float32) * 2 - 1) * rows ** -0.5)

    params = {"embed": matrix(V, H), "lnf": jnp.ones(H), "whead": matrix(H, V), "layers": [
        dict(ln1=jnp.ones(H), wq=matrix(H, H), wk=matrix(H, KV), wv=matrix(H, KV),
             wo=matrix(H, H), ln2=jnp.ones(H), wg=matrix(H, F), wu=matrix(H, F),
             wd=matrix(F, H)) for _ in range(c["layers"])]}
    ids = jnp.asarray(np.load(Path(spec["batch"], "input0.npy")))
    labels = jnp.asarray(np.load(Path(spec["batch"], "input1.npy")))
    inv = 1.0 / (10000.0 ** (jnp.arange(0, D, 2, dtype=jnp.float32) / D))
    ang = jnp.outer(jnp.arange(S, dtype=jnp.float32), inv)
    cos = jnp.concatenate([jnp.cos(ang)] * 2, -1)[None, :, None, :]
    sin = jnp.concatenate([jnp.sin(ang)] * 2, -1)[None, :, None, :]
    mask = jnp.triu(jnp.full((S, S), -jnp.inf), 1)

    def rms(x, w):
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * w

    def rope(x):
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return x * cos + jnp.concatenate([-x2, x1], -1) * sin

    def loss_fn(p):
        h = p["embed"][ids]
        for l in p["layers"]:
            n1 = rms(h, l["ln1"])
            q = rope((n1 @ l["wq"]).reshape(B, S, NH, D)).transpose(0, 2, 1, 3)
            k = rope((n1 @ l["wk"]).reshape(B, S, NKV, D)).transpose(0, 2, 1, 3)
            v = (n1 @ l["wv"]).reshape(B, S, NKV, D).transpose(0, 2, 1, 3)
            k, v = jnp.repeat(k, NH // NKV, 1), jnp.repeat(v, NH // NKV, 1)
            att = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) * D ** -0.5 + mask, -1)
            h = h + (att @ v).transpose(0, 2, 1, 3).reshape(B, S, H) @ l["wo"]
            n2 = rms(h, l["ln2"])
            h = h + (jax.nn.silu(n2 @ l["wg"]) * (n2 @ l["wu"])) @ l["wd"]
        logits = (rms(h, p["lnf"]) @ p["whead"]).reshape(-1, V)
        picked = jnp.take_along_axis(logits, labels.reshape(-1, 1), 1)[:, 0]
        return jnp.mean(jax.nn.logsumexp(logits, -1) - picked)

    @jax.jit
    def step(p):
        loss, grads = jax.value_and_grad(loss_fn)(p)
        return jax.tree_util.tree_map(lambda w, g: w - 0.01 * g, p, grads), loss

    compile_start = time.perf_counter()
    params, loss = step(params)  # compiles; like ernie-run, not timed
    jax.block_until_ready(params)
    compile_s = time.perf_counter() - compile_start
    best, losses = float("inf"), [float(loss)]
    for _ in range(spec["repeat"]):
        total = 0.0
        for _ in range(spec["steps"]):
            start = time.perf_counter()
            params, loss = step(params)
            jax.block_until_ready(params)
            total += time.perf_counter() - start
            if len(losses) <= spec["steps"]:
                losses.append(float(loss))
        best = min(best, 1000 * total / spec["steps"])
    print(json.dumps({"ms": best, "losses": losses, "version": jax.__version__,
                      "compile_s": compile_s}))


def find_jax_python(explicit):
    """An interpreter with jax: --jax-python, the bench's own environment
    (build-bench/jax, see bench/requirements-jax.txt), or this one."""
    candidates = [explicit] if explicit else [str(ROOT / "build-bench" / "jax" / "bin" / "python"),
                                              sys.executable]
    for py in candidates:
        if py and Path(py).exists() and subprocess.run(
                [py, "-c", "import jax"], capture_output=True).returncode == 0:
            return py
    return None


def jax_peer(py, c, threads, steps, repeat, batch_dir):
    spec = {"config": c.as_dict(), "threads": threads, "steps": steps, "repeat": repeat,
            "batch": str(batch_dir)}
    # One core: XLA's Eigen thread pool off; more: pinned to them (above).
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    if threads == 1:
        env["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false"
    out = run([py, __file__, "--jax-worker", json.dumps(spec)], env=env)
    return json.loads(out.strip().splitlines()[-1])


def find_torch_python(explicit):
    candidates = [explicit] if explicit else [sys.executable, "/usr/bin/python3"]
    for py in candidates:
        if py and Path(py).exists() and subprocess.run(
                [py, "-c", "import torch"], capture_output=True).returncode == 0:
            return py
    return None


def torch_step_ms(py, c, threads, steps, repeat, omp, blas, batch_dir):
    """Torch with `omp` OpenMP threads (torch.set_num_threads) and `blas`
    OpenBLAS threads. torch.set_num_threads does not reach the OpenBLAS
    Debian's torch calls for GEMM, which by default takes every core."""
    spec = {"config": c.as_dict(), "threads": omp, "steps": steps, "repeat": repeat,
            "batch": str(batch_dir)}
    env = dict(os.environ, OMP_NUM_THREADS=str(omp), OPENBLAS_NUM_THREADS=str(blas))
    out = run([py, __file__, "--torch-worker", json.dumps(spec)], env=env)
    result = json.loads(out.strip().splitlines()[-1])
    result["setting"] = f"omp {omp}, openblas {blas}"
    return result


def torch_peer(py, c, threads, steps, repeat, batch_dir):
    """The fastest way for torch to use `threads` cores, and every setting tried:
    with 1 thread, one OpenMP and one OpenBLAS thread; with n, n OpenMP
    threads and 1 OpenBLAS thread, or 1 and n, and (torch's default when
    set_num_threads(n) is all one does) n and n, whose threads compete for
    the n cores."""
    settings = [(1, 1)] if threads == 1 else [(threads, 1), (1, threads), (threads, threads)]
    tried = [torch_step_ms(py, c, threads, steps, repeat, omp, blas, batch_dir)
             for omp, blas in settings]
    best = min(tried, key=lambda t: t["ms"])
    return dict(best, tried=tried)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ernie-opt", default=str(ROOT / "build" / "bin" / "ernie-opt"))
    parser.add_argument("--ernie-translate", default=str(ROOT / "build" / "bin" / "ernie-translate"))
    parser.add_argument("--ernie-run", default=str(ROOT / "build" / "bin" / "ernie-run"))
    parser.add_argument("--torch-python", default=None,
                        help="a python with torch (default: this one, else /usr/bin/python3)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--ffn", type=int, default=704)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--modes", default="single,dp,mp",
                        help="comma-separated: single, dp, mp, mpv (see ernie_module)")
    parser.add_argument("--no-fuse", action="store_true",
                        help="compile without --ernie-fuse (each elementwise op its own loop)")
    parser.add_argument("--cluster", default="calibrate",
                        help="what the programs are compiled for: 'calibrate' (this machine, "
                             "measured: the default), 'none' (by bytes: no compute is "
                             "weighed against collectives) or a cluster file")
    parser.add_argument("--jax-python", default=None,
                        help="an interpreter with jax (default: build-bench/jax, then this one)")
    parser.add_argument("--torch-worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--jax-worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.torch_worker:
        return torch_worker(json.loads(args.torch_worker))
    if args.jax_worker:
        return jax_worker(json.loads(args.jax_worker))

    c = Config(args)
    tools = {"opt": args.ernie_opt, "translate": args.ernie_translate, "run": args.ernie_run}
    torch_py = find_torch_python(args.torch_python)
    print(f"model: {c.describe()}; SGD; {c.matmul_gflop():.2f} GFLOP of GEMM per step")
    print(f"best of {args.repeat} runs of {args.steps} timed steps; "
          f"CPU: {os.cpu_count()} cores; load average before: "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    if torch_py is None:
        tried = args.torch_python or f"{sys.executable} or /usr/bin/python3"
        print(f"note: torch is not importable by {tried}: the torch column is "
              "skipped (Debian: apt-get install python3-torch, for /usr/bin/python3)")
    jax_py = find_jax_python(args.jax_python)
    if jax_py is None:
        print("note: jax is not importable (build-bench/jax or this interpreter): the jax "
              "column is skipped (python3 -m venv build-bench/jax && build-bench/jax/bin/pip "
              "install -r bench/requirements-jax.txt)")

    labels = {"single": "ernie 1 rank", "dp": "ernie 2 ranks dp", "mp": "ernie 2 ranks mp",
              "mpv": "ernie 2 ranks mp+v"}
    rows, failures = [], []
    torch_cache, jax_cache = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        batch_dir = write_batch(c, tmp)
        cluster = host_cluster(args.cluster, 2, tmp)
        print(describe_cluster(cluster) if cluster else "compiled by bytes (--cluster none)")
        for mode in args.modes.split(","):
            ranks = 1 if mode == "single" else 2
            try:
                prog, collectives = compile_program(c, mode, tmp, tools, not args.no_fuse,
                                                    cluster)
                ms, losses = ernie_step_ms(prog, ranks, args.steps + 1, args.repeat, tools,
                                           batch_dir)
            except RuntimeError as e:
                lines = [l for l in str(e).splitlines() if l.strip()]
                failures.append((mode, lines[-1] if lines else str(e)))
                continue
            t = None
            if torch_py is not None:
                if ranks not in torch_cache:
                    torch_cache[ranks] = torch_peer(torch_py, c, ranks, args.steps, args.repeat,
                                                    batch_dir)
                t = torch_cache[ranks]
            if jax_py is not None and ranks not in jax_cache:
                jax_cache[ranks] = jax_peer(jax_py, c, ranks, args.steps, args.repeat, batch_dir)
            rows.append((mode, ranks, collectives, ms, losses, t))

    print()
    print(f"{'config':<18} {'threads':>7} {'colls':>5} | {'ernie ms':>9} {'GFLOP/s':>8} | "
          f"{'torch ms':>9} {'ernie/torch':>11} | {'jax ms':>9} {'ernie/jax':>9}")
    print("-" * 98)
    gf = c.matmul_gflop()
    for mode, ranks, coll, ms, _, t in rows:
        line = f"{labels[mode]:<18} {ranks:>7} {coll:>5} | {ms:>9.1f} {gf / ms * 1e3:>8.1f} | "
        line += (f"{'-':>9} {'-':>11}" if t is None
                 else f"{t['ms']:>9.1f} {ms / t['ms']:>11.2f}")
        j = jax_cache.get(ranks)
        line += " | " + (f"{'-':>9} {'-':>9}" if j is None
                         else f"{j['ms']:>9.1f} {ms / j['ms']:>9.2f}")
        print(line)
    print("(colls: collectives per forward+backward in the partitioned program, a gradient "
          "bucket counted once; GFLOP/s: GEMM work only; ernie/peer below 1: ernie is faster)")
    for mode, error in failures:
        print(f"{labels[mode]:<18} FAILED: {error}")
    single = {m: ms for m, _, _, ms, _, _ in rows}
    if "single" in single:
        for mode in ("dp", "mp", "mpv"):
            if mode in single:
                print(f"ernie speed-up, 2 ranks {mode} over 1 rank: {single['single'] / single[mode]:.2f}")
        if 1 in torch_cache and 2 in torch_cache:
            print(f"torch speed-up, 2 threads over 1: {torch_cache[1]['ms'] / torch_cache[2]['ms']:.2f}")
    for mode, _, _, _, losses, _ in rows:
        if losses:
            print(f"{labels[mode]} losses (first, last): {losses[0]:.4f}, {losses[-1]:.4f}")
    for ranks, t in sorted(torch_cache.items()):
        print(f"torch {t['version']}, {ranks} core(s), {t['setting']} losses (first, last): "
              f"{t['losses'][0]:.4f}, {t['losses'][-1]:.4f}")
    for ranks, j in sorted(jax_cache.items()):
        print(f"jax {j['version']}, {ranks} core(s) losses (first, last): "
              f"{j['losses'][0]:.4f}, {j['losses'][-1]:.4f}; jit compile {j['compile_s']:.1f} s")
    if torch_cache:
        print("\ntorch settings tried (the fastest per core count is the peer above):")
        for ranks, t in sorted(torch_cache.items()):
            for tried in t["tried"]:
                print(f"  {ranks} core(s), {tried['setting']:<20} {tried['ms']:>9.1f} ms  "
                      f"CPU use {tried['cpu_util']:.2f} cores")
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    sys.exit(main())

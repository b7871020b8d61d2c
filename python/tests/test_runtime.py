"""Programs compiled by ernie-opt, written by ernie-translate and run by
ernie-run equal the single-rank run.

The example Llama layer trains for three SGD-with-momentum steps under plans on meshes
[1], [2], [4], [2,2] and [2,4]; every step's loss and every final parameter
and optimizer slot equal the single-rank run's to 1e-5 relative (f32: only
the order of the sums differs between plans; relative to the tensor's
largest entry for entries that are sums cancelling to near zero). The single-rank run itself is
checked against the numpy reference interpreter, and a Gloo run (one process
per rank) equals the thread run bit for bit. The exhaustive resharding table
(every pair of shardings of a 2-D tensor on meshes [4] and [2,2]) runs
numerically: each reshard gives back exactly the global input.
"""

import itertools
import subprocess

import numpy as np
import pytest

from conftest import REPO
from ernie_reference import Interpreter

RTOL = 1e-5


def assert_close(got, want, what):
    """Elementwise within RTOL of each value, or of the tensor's largest
    entry: an element that is a sum cancelling to near zero (a gradient
    entry 1e-3 of its terms) carries the terms' rounding, not its own."""
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * scale, err_msg=what)
STEPS = 3
LR = 0.1


def compile_program(ernie_opt, ernie_translate, source, flags, path):
    opt = subprocess.run([str(ernie_opt), "-", *flags, "--mlir-print-op-generic"], input=source,
                         capture_output=True, text=True, timeout=300)
    assert opt.returncode == 0, opt.stderr
    out = subprocess.run([str(ernie_translate), "--ernie-to-program", "-", "-o", str(path)],
                         input=opt.stdout, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return opt.stdout


def run_program(ernie_run, program, tmp, inputs, *flags):
    """Runs `program` with global `inputs` ({file stem: array}); returns the
    outputs directory's arrays by stem."""
    in_dir, out_dir = tmp / "in", tmp / "out"
    in_dir.mkdir(exist_ok=True)
    for stem, value in inputs.items():
        np.save(in_dir / f"{stem}.npy", value)
    result = subprocess.run([str(ernie_run), str(program), "--inputs", str(in_dir),
                             "--outputs", str(out_dir), "--quiet", *flags],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return {p.stem: np.load(p) for p in out_dir.glob("*.npy")}


# ---------------------------------------------------------------------------
# The Llama layer under every plan.
# ---------------------------------------------------------------------------

LLAMA = (REPO / "examples" / "llama_block.mlir").read_text()
PARAMS = ["llama.embed_tokens.weight", "llama.layers.0.input_layernorm.weight",
          "llama.layers.0.self_attn.qkv_proj.weight", "llama.layers.0.self_attn.o_proj.weight",
          "llama.layers.0.post_attention_layernorm.weight", "llama.layers.0.mlp.gate_up_proj.weight",
          "llama.layers.0.mlp.down_proj.weight", "llama.norm.weight", "lm_head.weight"]

# mesh axes, and which of them split the batch (dp) and the projections (mp).
PLANS = {
    "1": ({}, None, None),
    "2-dp": ({"dp": 2}, "dp", None),
    "2-mp": ({"mp": 2}, None, "mp"),
    "4-mp": ({"mp": 4}, None, "mp"),
    "2x2": ({"dp": 2, "mp": 2}, "dp", "mp"),
    "2x4": ({"dp": 2, "mp": 4}, "dp", "mp"),
}


def llama_with_plan(plan):
    axes, dp, mp = PLANS[plan]
    source = LLAMA
    if not axes:
        return source
    batch = f"[{{{dp}}}, {{}}]" if dp else "[{}, {}]"
    col = f"[{{}}, {{{mp}}}]" if mp else "[{}, {}]"
    row = f"[{{{mp}}}, {{}}]" if mp else "[{}, {}]"
    for arg in ("%ids: tensor<2x16xi64>", "%labels: tensor<2x16xi64>"):
        source = source.replace(arg, f"{arg} {{ernie.sharding = #ernie.sharding<@mesh, {batch}>}}")
    for name, s in (("qkv_proj", col), ("o_proj", row), ("gate_up_proj", col), ("down_proj", row)):
        source = source.replace(f'{name}.weight"}}', f'{name}.weight", ernie.sharding = #ernie.sharding<@mesh, {s}>}}')
    mesh = ", ".join(f"{a} = {n}" for a, n in axes.items())
    return f"ernie.mesh @mesh({mesh})\n" + source


def llama_inputs():
    rng = np.random.default_rng(5)
    shapes = {"llama.embed_tokens.weight": (256, 64), "llama.layers.0.self_attn.qkv_proj.weight": (64, 128),
              "llama.layers.0.self_attn.o_proj.weight": (64, 64),
              "llama.layers.0.mlp.gate_up_proj.weight": (64, 256),
              "llama.layers.0.mlp.down_proj.weight": (128, 64), "lm_head.weight": (64, 256)}
    inputs = {"input0": rng.integers(0, 256, size=(2, 16)), "input1": rng.integers(0, 256, size=(2, 16))}
    for name in PARAMS:
        if name in shapes:
            inputs[name] = (rng.normal(size=shapes[name]) * 0.1).astype(np.float32)
        else:
            inputs[name] = (1 + 0.1 * rng.normal(size=64)).astype(np.float32)
    return inputs


# SGD with momentum: AdamW's first steps divide by sqrt(v) + 1e-8, which
# turns f32 rounding in a near-zero gradient into an O(lr) difference, so
# comparing its parameters across summation orders says nothing.
STEP_FLAGS = ["--ernie-autodiff=optimizer=sgd momentum=0.9 weight-decay=0.01"]


@pytest.fixture(scope="module")
def single_rank(ernie_opt, ernie_translate, ernie_run, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("single")
    module = compile_program(ernie_opt, ernie_translate, LLAMA, STEP_FLAGS, tmp / "prog.ernie")
    outputs = run_program(ernie_run, tmp / "prog.ernie", tmp, llama_inputs(), "--steps", str(STEPS),
                          "--lr", str(LR))
    return module, outputs


def test_single_rank_matches_reference_interpreter(single_rank):
    """The runtime's kernels against numpy, through three optimizer steps."""
    module, outputs = single_rank
    interp = Interpreter(module)
    inputs = llama_inputs()
    params = [inputs[n] for n in PARAMS]
    slots = [np.zeros_like(p) for p in params]
    losses = []
    for step in range(1, STEPS + 1):
        outs = interp.run("train_step", *params, *slots, inputs["input0"], inputs["input1"],
                          np.float32(LR), np.int64(step))
        losses.append(float(outs[0]))
        params, slots = outs[1:1 + len(PARAMS)], outs[1 + len(PARAMS):]
    np.testing.assert_allclose(outputs["losses"], losses, rtol=1e-4)
    for name, want in zip(PARAMS, params):
        np.testing.assert_allclose(outputs[name], want, rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("plan", [p for p in PLANS if p != "1"])
def test_plans_match_single_rank(ernie_opt, ernie_translate, ernie_run, tmp_path, single_rank, plan):
    _, want = single_rank
    compile_program(ernie_opt, ernie_translate, llama_with_plan(plan),
                    STEP_FLAGS + ["--ernie-auto-parallel-pipeline"], tmp_path / "prog.ernie")
    got = run_program(ernie_run, tmp_path / "prog.ernie", tmp_path, llama_inputs(),
                      "--steps", str(STEPS), "--lr", str(LR))
    assert set(got) == set(want)
    for stem in sorted(want):
        assert_close(got[stem], want[stem], stem)


def test_gloo_equals_threads_bitwise(ernie_opt, ernie_translate, ernie_run, tmp_path):
    compile_program(ernie_opt, ernie_translate, llama_with_plan("2x2"),
                    STEP_FLAGS + ["--ernie-auto-parallel-pipeline"], tmp_path / "prog.ernie")
    (tmp_path / "t").mkdir()
    (tmp_path / "g").mkdir()
    threads = run_program(ernie_run, tmp_path / "prog.ernie", tmp_path / "t", llama_inputs(), "--steps", "2")
    gloo = run_program(ernie_run, tmp_path / "prog.ernie", tmp_path / "g", llama_inputs(), "--steps", "2",
                       "--backend", "gloo")
    assert set(threads) == set(gloo)
    for stem in threads:
        assert threads[stem].tobytes() == gloo[stem].tobytes(), stem


# ---------------------------------------------------------------------------
# The resharding table, executed.
# ---------------------------------------------------------------------------

def all_shardings(axes):
    """Every sharding of a 2-D tensor: each axis unused, on dim 0, on dim 1
    or a pending sum, and both orders when two axes share a dimension."""
    out = []
    for places in itertools.product(["-", 0, 1, "p"], repeat=len(axes)):
        dims_options = [[]]
        for d in (0, 1):
            on = [a for a, p in zip(axes, places) if p == d]
            orders = list(itertools.permutations(on)) if on else [()]
            dims_options = [prev + [list(o)] for prev in dims_options for o in orders]
        partial = [a for a, p in zip(axes, places) if p == "p"]
        for dims in dims_options:
            text = ", ".join("{" + ", ".join(d) + "}" for d in dims)
            extra = (", partial = {" + ", ".join(f"{a} = sum" for a in partial) + "}") if partial else ""
            out.append(f"#ernie.sharding<@mesh, [{text}]{extra}>")
    return out


def run_resharding_table(ernie_opt, ernie_translate, ernie_run, tmp_path, mesh, shape):
    """Every sharding of an i64 tensor of `shape` resharded to every other
    on `mesh`, run through ernie-run: each result is exactly the input."""
    shardings = all_shardings(list(mesh))
    assert len(shardings) == {1: 4, 2: 18}[len(mesh)]
    t = f"tensor<{shape[0]}x{shape[1]}xi64>"
    funcs = []
    for i, src in enumerate(shardings):
        results = ", ".join(f"{t} {{ernie.sharding = {dst}}}" for dst in shardings)
        body = "\n".join(f"  %r{j} = ernie.reshard %x {dst[len('#ernie.sharding'):]} : {t}"
                         for j, dst in enumerate(shardings))
        returns = ", ".join(f"%r{j}" for j in range(len(shardings)))
        funcs.append(f"func.func @from{i}(%x: {t} {{ernie.sharding = {src}}}) -> ({results}) {{\n"
                     f"{body}\n  return {returns} : {', '.join([t] * len(shardings))}\n}}")
    axes = ", ".join(f"{a} = {n}" for a, n in mesh.items())
    source = f"ernie.mesh @mesh({axes})\n" + "\n".join(funcs)
    compile_program(ernie_opt, ernie_translate, source, ["--ernie-auto-parallel-pipeline"],
                    tmp_path / "prog.ernie")
    x = np.arange(shape[0] * shape[1], dtype=np.int64).reshape(shape) * 7 - 100
    for i in range(len(shardings)):
        out = run_program(ernie_run, tmp_path / "prog.ernie", tmp_path, {"input0": x},
                          "--function", f"from{i}")
        for j in range(len(shardings)):
            np.testing.assert_array_equal(out[f"result{j}"], x,
                                          err_msg=f"{shardings[i]} -> {shardings[j]}")


@pytest.mark.parametrize("mesh", [{"a": 4}, {"x": 2, "y": 2}])
def test_resharding_table_runs_exactly(ernie_opt, ernie_translate, ernie_run, tmp_path, mesh):
    run_resharding_table(ernie_opt, ernie_translate, ernie_run, tmp_path, mesh, (8, 8))

"""Uneven (padded) sharding: a dimension its mesh axes do not divide is split
with every piece ceil(size / parts) long and the last ones padded (GSPMD's
convention). Each op class runs on meshes of 3 and 2 x 3 with dimensions
that do not divide, and its results equal the single-device program's on the
same inputs (the same module compiled on a mesh whose axes are all 1). f32
sums taken in another order: 1e-5 relative (of the tensor's largest entry
for sums that cancel); data movement: exact.
"""

import numpy as np
import pytest

from test_runtime import assert_close, compile_program, run_program

PIPELINE = ["--ernie-auto-parallel-pipeline"]

MESHES = {"3": {"x": 3}, "2x3": {"x": 2, "y": 3}}


def sharded(shape, dims, element="f32"):
    """`tensor<...>` with an ernie.sharding splitting dims as `dims` (one
    axis name or None per dimension)."""
    t = f"tensor<{'x'.join(map(str, shape))}x{element}>"
    spec = ", ".join("{" + (a or "") + "}" for a in dims)
    return f"{t} {{ernie.sharding = #ernie.sharding<@mesh, [{spec}]>}}"


def tensor(shape, element="f32"):
    return f"tensor<{'x'.join(map(str, shape))}x{element}>" if shape else f"tensor<{element}>"


def run_both(ernie_opt, ernie_translate, ernie_run, tmp_path, mesh, body, inputs, flags=()):
    """Runs `body` (functions naming @mesh) on `mesh` and on a mesh of the same
    axes of size 1; returns (distributed, single) outputs."""
    outs, modules = [], []
    for name, axes in (("dist", mesh), ("single", {a: 1 for a in mesh})):
        decl = ", ".join(f"{a} = {n}" for a, n in axes.items())
        d = tmp_path / name
        d.mkdir()
        modules.append(compile_program(ernie_opt, ernie_translate,
                                       f"ernie.mesh @mesh({decl})\n{body}", [*flags, *PIPELINE],
                                       d / "prog.ernie"))
        outs.append(run_program(ernie_run, d / "prog.ernie", d, inputs))
    return modules[0], outs[0], outs[1]


def check(ernie_opt, ernie_translate, ernie_run, tmp_path, mesh, body, inputs, flags=(), exact=False):
    module, got, want = run_both(ernie_opt, ernie_translate, ernie_run, tmp_path, mesh, body,
                                 inputs, flags)
    assert set(got) == set(want) and want
    for stem in sorted(want):
        if exact:
            np.testing.assert_array_equal(got[stem], want[stem], err_msg=stem)
        else:
            assert_close(got[stem], want[stem], stem)
    return module


def train_both(ernie_opt, ernie_translate, ernie_run, tmp_path, axis, body, inputs, flags):
    """Three training steps of `body` on a mesh of 3 along `axis` and on one
    rank; every output equal (1e-5). Returns the distributed module."""
    outs, modules = [], []
    for name, n in (("dist", 3), ("single", 1)):
        d = tmp_path / name
        d.mkdir()
        modules.append(compile_program(ernie_opt, ernie_translate,
                                       f"ernie.mesh @mesh({axis} = {n})\n{body}",
                                       [*flags, *PIPELINE], d / "prog.ernie"))
        outs.append(run_program(ernie_run, d / "prog.ernie", d, inputs, "--steps", "3",
                                "--lr", "0.1"))
    got, want = outs
    assert set(got) == set(want)
    for stem in sorted(want):
        assert_close(got[stem], want[stem], stem)
    return modules[0]


def rng_inputs(*shapes, seed=0):
    rng = np.random.default_rng(seed)
    return {f"input{i}": rng.normal(size=s).astype(np.float32) for i, s in enumerate(shapes)}


# A: the mesh axis of mesh "3", or the "y" axis (3) of "2x3"; B: "x" (2) of
# "2x3" or nothing. Sizes 7, 5, 10, 11 divide by neither 2 nor 3.
def axes_of(mesh):
    return ("x", None) if len(mesh) == 1 else ("y", "x")


@pytest.mark.parametrize("mesh", MESHES)
def test_elementwise_and_reshards_exact(ernie_opt, ernie_translate, ernie_run, tmp_path, mesh):
    a, b = axes_of(MESHES[mesh])
    x, y = sharded([7, 5], [a, b]), sharded([7, 5], [b, a])
    # Elementwise on padded pieces, then every way back to the global value.
    body = f"""
func.func @f(%x: {x}, %y: {y}) -> ({sharded([7, 5], [None, a])}, {tensor([7, 5])}, {sharded([7, 5], [b, None])}) {{
  %s = ernie.add %x, %y : {tensor([7, 5])}
  %e = ernie.exp %s : {tensor([7, 5])}
  return %s, %e, %x : {tensor([7, 5])}, {tensor([7, 5])}, {tensor([7, 5])}
}}"""
    check(ernie_opt, ernie_translate, ernie_run, tmp_path, MESHES[mesh], body,
          rng_inputs((7, 5), (7, 5)))


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("split", ["m", "n", "k"])
def test_matmul_on_each_dim(ernie_opt, ernie_translate, ernie_run, tmp_path, mesh, split):
    a, b = axes_of(MESHES[mesh])
    lhs = {"m": [a, None], "n": [b, None], "k": [b, a]}[split]
    rhs = {"m": [None, b], "n": [None, a], "k": [a, None]}[split]
    body = f"""
func.func @f(%x: {sharded([7, 10], lhs)}, %w: {sharded([10, 11], rhs)}) -> {tensor([7, 11])} {{
  %y = ernie.matmul %x, %w : {tensor([7, 10])}, {tensor([10, 11])} -> {tensor([7, 11])}
  return %y : {tensor([7, 11])}
}}"""
    module = check(ernie_opt, ernie_translate, ernie_run, tmp_path, MESHES[mesh], body,
                   rng_inputs((7, 10), (10, 11)))
    if split == "k":
        # The contraction's padding is masked to zero in both operands.
        assert module.count('"ernie.select"') >= 2


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("op", ["reduce_sum", "reduce_max", "reduce_mean"])
def test_reductions_over_padded_dims(ernie_opt, ernie_translate, ernie_run, tmp_path, mesh, op):
    a, b = axes_of(MESHES[mesh])
    body = f"""
func.func @f(%x: {sharded([7, 5], [b, a])}) -> ({tensor([5])}, {tensor([7, 1])}, {tensor([])}) {{
  %r0 = ernie.{op} %x axes = [0] : {tensor([7, 5])} -> {tensor([5])}
  %r1 = ernie.{op} %x axes = [1] keepdim : {tensor([7, 5])} -> {tensor([7, 1])}
  %r2 = ernie.{op} %x axes = [0, 1] : {tensor([7, 5])} -> {tensor([])}
  return %r0, %r1, %r2 : {tensor([5])}, {tensor([7, 1])}, {tensor([])}
}}"""
    # Negative entries: a max over zero padding would be wrong.
    inputs = {"input0": -np.abs(rng_inputs((7, 5))["input0"]) - 1}
    check(ernie_opt, ernie_translate, ernie_run, tmp_path, MESHES[mesh], body, inputs)


@pytest.mark.parametrize("mesh", MESHES)
def test_softmax_and_norms(ernie_opt, ernie_translate, ernie_run, tmp_path, mesh):
    a, b = axes_of(MESHES[mesh])
    x = sharded([7, 5, 11], [b, None, a])
    body = f"""
func.func @f(%x: {x}, %w: {sharded([11], [a])}, %bias: {tensor([11])}) -> ({tensor([7, 5, 11])}, {tensor([7, 5, 11])}, {tensor([7, 5, 11])}, {tensor([7, 5, 11])}) {{
  %s = ernie.softmax %x, axis = 2 : {tensor([7, 5, 11])}
  %t = ernie.softmax %x, axis = 0 : {tensor([7, 5, 11])}
  %r = ernie.rms_norm %x, %w, epsilon = 1.0e-6 : {tensor([7, 5, 11])}, {tensor([11])}
  %l = ernie.layer_norm %x, %w, %bias, epsilon = 1.0e-5 : {tensor([7, 5, 11])}, {tensor([11])}
  return %s, %t, %r, %l : {tensor([7, 5, 11])}, {tensor([7, 5, 11])}, {tensor([7, 5, 11])}, {tensor([7, 5, 11])}
}}"""
    check(ernie_opt, ernie_translate, ernie_run, tmp_path, MESHES[mesh], body,
          rng_inputs((7, 5, 11), (11,), (11,)))


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_vocab_parallel_embedding_and_cross_entropy(ernie_opt, ernie_translate, ernie_run,
                                                    tmp_path, mesh, reduction):
    a, b = axes_of(MESHES[mesh])
    vocab, hidden = 10, 4
    loss = tensor([3, 5]) if reduction == "none" else tensor([])
    body = f"""
func.func @f(%ids: {sharded([3, 5], [b, None], "i64")}, %table: {sharded([vocab, hidden], [a, None])},
             %head: {sharded([hidden, vocab], [None, a])}, %labels: {sharded([3, 5], [b, None], "i64")}) -> ({tensor([3, 5, hidden])}, {loss}, {tensor([3, 5, vocab])}) {{
  %h = ernie.embedding %ids, %table : {tensor([3, 5], "i64")}, {tensor([vocab, hidden])} -> {tensor([3, 5, hidden])}
  %logits = ernie.matmul %h, %head : {tensor([3, 5, hidden])}, {tensor([hidden, vocab])} -> {tensor([3, 5, vocab])}
  %loss = ernie.cross_entropy %logits, %labels {{reduction = #ernie<loss_reduction {reduction}>}} : {tensor([3, 5, vocab])}, {tensor([3, 5], "i64")} -> {loss}
  %one = ernie.full 1.0 : {loss}
  %g = ernie.cross_entropy_grad %logits, %labels, %one {{reduction = #ernie<loss_reduction {reduction}>}} : {tensor([3, 5, vocab])}, {tensor([3, 5], "i64")}, {loss} -> {tensor([3, 5, vocab])}
  return %h, %loss, %g : {tensor([3, 5, hidden])}, {loss}, {tensor([3, 5, vocab])}
}}"""
    rng = np.random.default_rng(3)
    labels = rng.integers(0, vocab, size=(3, 5))
    labels[0, 1] = -100  # ignored
    inputs = {"input0": rng.integers(0, vocab, size=(3, 5)),
              "input1": rng.normal(size=(vocab, hidden)).astype(np.float32),
              "input2": rng.normal(size=(hidden, vocab)).astype(np.float32),
              "input3": labels}
    check(ernie_opt, ernie_translate, ernie_run, tmp_path, MESHES[mesh], body, inputs)


@pytest.mark.parametrize("mesh", MESHES)
def test_attention_heads(ernie_opt, ernie_translate, ernie_run, tmp_path, mesh):
    a, b = axes_of(MESHES[mesh])
    q = [3, 6, 5, 4]  # batch 3, sequence 6, 5 heads (over 3: 2 + 2 + 1), head_dim 4
    spec = [b, None, a, None]
    body = f"""
func.func @f(%q: {sharded(q, spec)}, %k: {sharded(q, spec)}, %v: {sharded(q, spec)}) -> {tensor(q)} {{
  %o = ernie.attention %q, %k, %v {{causal}} : {tensor(q)}, {tensor(q)}, {tensor(q)} -> {tensor(q)}
  return %o : {tensor(q)}
}}"""
    module = check(ernie_opt, ernie_translate, ernie_run, tmp_path, MESHES[mesh], body,
                   rng_inputs(q, q, q))
    # Heads stay split: each rank attends over its ceil(5/3) = 2 heads.
    assert "tensor<3x6x2x4xf32>" in module or "tensor<2x6x2x4xf32>" in module


def test_training_step_uneven_matches_single_device(ernie_opt, ernie_translate, ernie_run, tmp_path):
    """Gradients and an optimizer step through uneven splits (masked
    contractions in the backward, padded parameters updated in place)."""
    body = f"""
func.func @forward(%w1: {sharded([10, 11], [None, "x"])} {{ernie.param = "w1"}},
                %w2: {sharded([11, 10], ["x", None])} {{ernie.param = "w2"}},
                %x: {tensor([5, 10])}, %labels: {tensor([5], "i64")}) -> {tensor([])} {{
  %h = ernie.matmul %x, %w1 : {tensor([5, 10])}, {tensor([10, 11])} -> {tensor([5, 11])}
  %a = ernie.tanh %h : {tensor([5, 11])}
  %y = ernie.matmul %a, %w2 : {tensor([5, 11])}, {tensor([11, 10])} -> {tensor([5, 10])}
  %l = ernie.cross_entropy %y, %labels : {tensor([5, 10])}, {tensor([5], "i64")} -> {tensor([])}
  return %l : {tensor([])}
}}""".replace('} {ernie.param = "w1"}', ', ernie.param = "w1"}').replace(
        '} {ernie.param = "w2"}', ', ernie.param = "w2"}')
    rng = np.random.default_rng(7)
    inputs = {"w1": (rng.normal(size=(10, 11)) * 0.3).astype(np.float32),
              "w2": (rng.normal(size=(11, 10)) * 0.3).astype(np.float32),
              "input0": rng.normal(size=(5, 10)).astype(np.float32),
              "input1": rng.integers(0, 10, size=(5,))}
    train_both(ernie_opt, ernie_translate, ernie_run, tmp_path, "x", body, inputs,
               ["--ernie-autodiff=optimizer=sgd momentum=0.9"])


def test_even_splits_mesh_rejects_uneven(ernie_opt, ernie_translate, tmp_path):
    import subprocess
    body = f"""ernie.mesh @mesh(x = 3) {{ernie.even_splits}}
func.func @f(%x: {sharded([7, 5], ["x", None])}) -> {tensor([7, 5])} {{
  return %x : {tensor([7, 5])}
}}"""
    out = subprocess.run([str(ernie_opt), "-", *PIPELINE], input=body, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0
    assert "dimension 0 of size 7 does not divide over mesh axes {x} of 3 ranks" in out.stderr


# ---------------------------------------------------------------------------
# A Llama whose vocabulary (1001) and heads do not divide over mp.
# ---------------------------------------------------------------------------

def _llama_losses(mesh_shape, names, config, vocab=1001, heads=6, steps=4, b=3):
    import ernie
    import ernie.distributed as dist
    from ernie.models.llama import LlamaConfig, LlamaForCausalLM, parallelize_plan
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=48, intermediate_size=72, num_hidden_layers=1,
                      num_attention_heads=heads, num_key_value_heads=heads, seed=11)
    rng = np.random.default_rng(2)
    ids = rng.integers(0, vocab, size=(b, 8))
    labels = ids  # Hugging Face's labels: the model shifts them
    opt = ernie.optimizer.SGD(0.5)
    if mesh_shape is None:
        prog = ernie.compile(LlamaForCausalLM(cfg), opt, [ids, labels])
    else:
        mesh = dist.ProcessMesh(np.arange(int(np.prod(mesh_shape))).reshape(mesh_shape), names)
        config = dict(config)
        if "mp" in names:
            config["mp_config"] = {"parallelize_plan": parallelize_plan()}
        if "dp" in names:
            config["dp_config"] = {"sharding_level": 0}
        prog = ernie.compile(LlamaForCausalLM(cfg), opt, [ids, labels], mesh=mesh, config=config)
    return prog, [prog.step(ids, labels) for _ in range(steps)]


@pytest.mark.parametrize("shape,names", [([4], ["mp"]), ([2, 3], ["dp", "mp"])])
def test_llama_vocab_1001_matches_single_device(shape, names):
    _, want = _llama_losses(None, None, {})
    prog, got = _llama_losses(shape, names, {})
    # f32 sums in another order over a few SGD steps.
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # The vocabulary stays split (vocab-parallel loss), padded to 4 x 251 (or 3 x 334).
    state = prog.state_dict()
    assert state["lm_head.weight"].shape[-1] == 1001
    report = prog.report()
    assert report["padding_bytes"] > 0, report
    assert any(k.endswith("[mp]") for k in report["collectives"])


def test_llama_even_splits_rejects_vocab_1001():
    with pytest.raises(ValueError, match="does not divide over mesh axes {mp} of 4 ranks"):
        _llama_losses([4], ["mp"], {"even_splits": True}, steps=0)


@pytest.mark.parametrize("level", [1, 2, 3])
def test_zero_over_3_ranks_splits_unevenly(ernie_opt, ernie_translate, ernie_run, tmp_path, level):
    """ZeRO over dp = 3 of weights no dimension of which divides by 3: the
    largest dimension is split unevenly (it stayed replicated before), and
    three SGD-with-momentum steps equal the single-device run."""
    body = f"""
func.func @forward(%w1: tensor<10x11xf32> {{ernie.param = "w1"}}, %w2: tensor<11x5xf32> {{ernie.param = "w2"}},
                   %x: {sharded([6, 10], ["dp", None])}) -> {tensor([])} {{
  %h = ernie.matmul %x, %w1 : {tensor([6, 10])}, {tensor([10, 11])} -> {tensor([6, 11])}
  %a = ernie.tanh %h : {tensor([6, 11])}
  %y = ernie.matmul %a, %w2 : {tensor([6, 11])}, {tensor([11, 5])} -> {tensor([6, 5])}
  %sq = ernie.mul %y, %y : {tensor([6, 5])}
  %l = ernie.reduce_mean %sq axes = [0, 1] : {tensor([6, 5])} -> {tensor([])}
  return %l : {tensor([])}
}}"""
    rng = np.random.default_rng(9)
    inputs = {"w1": (rng.normal(size=(10, 11)) * 0.3).astype(np.float32),
              "w2": (rng.normal(size=(11, 5)) * 0.3).astype(np.float32),
              "input0": rng.normal(size=(6, 10)).astype(np.float32)}
    module = train_both(ernie_opt, ernie_translate, ernie_run, tmp_path, "dp", body, inputs,
                        ["--ernie-autodiff=optimizer=sgd momentum=0.9",
                         f"--ernie-zero-sharding=level={level}"])
    assert "tensor<10x4xf32>" in module  # the momentum of w1 [10, 11]: 11 -> 4 + 4 + 3


@pytest.mark.parametrize("mesh", [{"a": 3}, {"x": 2, "y": 3}])
def test_uneven_resharding_table_runs_exactly(ernie_opt, ernie_translate, ernie_run, tmp_path, mesh):
    """Every pair of shardings of a 7x5 tensor (neither dimension divides by
    2 or 3): each reshard gives back exactly the global value, including a
    dimension split over both axes of 2 x 3 (pieces of 2, 4 or 3: only
    moved through gathers and slices over both axes at once)."""
    from test_runtime import run_resharding_table
    run_resharding_table(ernie_opt, ernie_translate, ernie_run, tmp_path, mesh, (7, 5))

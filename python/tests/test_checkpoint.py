"""Distributed checkpoints: per-rank safetensors files and a manifest,
atomic, resharded on load.

A Llama trained 10 steps on dp 2 x mp 2 x pp 2 with ZeRO-2 is saved; loaded
on the same mesh its next steps' losses equal the uninterrupted run's bit
for bit, and loaded on mp 4, on one rank and on dp 4 with ZeRO-3 they equal
them within 1e-5 (f32 sums in another order). Files are read with the
`safetensors` package as the independent reader.
"""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import ernie
import ernie.distributed as dist
from ernie.models.llama import LlamaConfig, LlamaForCausalLM, parallelize_plan

safetensors_numpy = pytest.importorskip("safetensors.numpy")

TINY = dict(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, seed=3)


def batch(step, b=8, s=8):
    rng = np.random.default_rng(100 + step)
    ids = rng.integers(0, TINY["vocab_size"], size=(b, s))
    return ids, ids  # Hugging Face's labels: the model shifts them


def program(mesh_shape=None, names=None, zero=0, pp=False):
    cfg = LlamaConfig(**TINY)
    opt = ernie.optimizer.AdamW(ernie.optimizer.LinearWarmupCosine(3e-3, 3, 40), weight_decay=0.01)
    ids, labels = batch(0)
    if mesh_shape is None:
        return ernie.compile(LlamaForCausalLM(cfg), opt, [ids, labels])
    mesh = dist.ProcessMesh(np.arange(int(np.prod(mesh_shape))).reshape(mesh_shape), names)
    config = {}
    if "dp" in names:
        config["dp_config"] = {"sharding_level": zero}
    if "mp" in names:
        config["mp_config"] = {"parallelize_plan": parallelize_plan()}
    if pp:
        config["pp_config"] = {"split_spec": "llama.layers", "accumulate_steps": 2}
    return ernie.compile(LlamaForCausalLM(cfg), opt, [ids, labels], mesh=mesh, config=config)


def train(prog, first, last):
    return [prog.step(*batch(k)) for k in range(first, last)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Ten steps on dp 2 x mp 2 x pp 2 with ZeRO-2, a checkpoint, and the
    next ten steps of the uninterrupted run."""
    root = tmp_path_factory.mktemp("ckpt")
    prog = program([2, 2, 2], ["dp", "pp", "mp"], zero=2, pp=True)
    train(prog, 0, 10)
    where = prog.save_checkpoint(root, keep=2, data_position={"epoch": 1, "sample": 80})
    state = prog.state_dict()
    return root, where, train(prog, 10, 20), state


def test_layout_and_manifest(saved):
    root, where, _, state = saved
    assert os.path.basename(where) == "step-00000010"
    manifest = json.loads(open(os.path.join(where, "manifest.json")).read())
    assert manifest["step"] == 10 and manifest["mesh"]["sizes"] == [2, 2, 2]
    assert manifest["metadata"]["data_position"] == {"epoch": 1, "sample": 80}
    assert manifest["metadata"]["optimizer"]["type"] == "AdamW"
    tensors = manifest["tensors"]
    assert set(tensors) == {n for n in state if n != ernie.Program.STEP_KEY}
    files = sorted(f for f in os.listdir(where) if f.endswith(".safetensors"))
    # Every piece written once: the pieces' volumes add up to the tensor's.
    for name, t in tensors.items():
        assert sum(int(np.prod(p["shape"])) for p in t["pieces"]) == int(np.prod(t["global_shape"]))
    # The independent reader sees the pieces, and they are the global values.
    pieces = {f: safetensors_numpy.load_file(os.path.join(where, f)) for f in files}
    for name, t in tensors.items():
        whole = np.zeros(t["global_shape"], state[name].dtype)
        for p in t["pieces"]:
            box = tuple(slice(o, o + n) for o, n in zip(p["offsets"], p["shape"]))
            whole[box] = pieces[p["file"]][name]
        np.testing.assert_array_equal(whole, state[name], err_msg=name)
    assert "verified" in ernie._ernie.verify_checkpoint(str(root))


@pytest.mark.parametrize("target", ["same", "mp4", "single", "dp4-zero3"])
def test_resume_on_another_mesh_continues_the_run(saved, target):
    root, _, want, _ = saved
    prog = {"same": lambda: program([2, 2, 2], ["dp", "pp", "mp"], zero=2, pp=True),
            "mp4": lambda: program([4], ["mp"]),
            "single": lambda: program(),
            "dp4-zero3": lambda: program([4], ["dp"], zero=3)}[target]()
    meta = prog.load_checkpoint(root)  # the newest complete checkpoint under root
    assert meta["data_position"] == {"epoch": 1, "sample": 80}
    assert prog.step_count == 10
    got = train(prog, 10, 20)
    if target == "same":
        assert got == want  # bit for bit
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5)


def test_keep_prunes_and_a_resave_replaces(tmp_path):
    prog = program([2], ["mp"])
    for k in range(4):
        train(prog, k, k + 1)
        prog.save_checkpoint(tmp_path, keep=2)
    assert sorted(os.listdir(tmp_path)) == ["step-00000003", "step-00000004"]
    prog.save_checkpoint(tmp_path, keep=2)  # the same step again
    assert sorted(os.listdir(tmp_path)) == ["step-00000003", "step-00000004"]


def test_damaged_checkpoints_are_named_errors_and_load_nothing(saved, tmp_path):
    import shutil
    root, where, _, _ = saved
    prog = program([4], ["mp"])
    before = prog.state_dict()

    def damaged(edit):
        target = tmp_path / f"case{len(os.listdir(tmp_path))}" / "step-00000010"
        shutil.copytree(where, target)
        edit(target)
        return target

    def rank_file(d):
        return sorted(p for p in d.iterdir() if p.suffix == ".safetensors")[0]

    cases = [
        (lambda d: rank_file(d).write_bytes(rank_file(d).read_bytes()[:-5]), r"rank-\d+\.safetensors"),
        (lambda d: rank_file(d).unlink(), r"rank-\d+\.safetensors: cannot open"),
        (lambda d: (d / "rank-99999.safetensors").write_bytes(b""), None),
        (lambda d: (d / "manifest.json").write_text("{}"), "not an ernie checkpoint manifest"),
    ]
    for edit, message in cases:
        d = damaged(edit)
        if message is None:  # an extra file: loading ignores it, verify names it
            with pytest.raises(ValueError, match="rank-99999.safetensors"):
                ernie._ernie.verify_checkpoint(str(d))
            continue
        with pytest.raises(ValueError, match=message):
            prog.load_checkpoint(d)
        after = prog.state_dict()
        for n in before:
            np.testing.assert_array_equal(after[n], before[n], err_msg=n)
    # A bit flip changes no structure: verify's checksums find it.
    d = damaged(lambda d: None)
    f = rank_file(d)
    data = bytearray(f.read_bytes())
    data[-3] ^= 0x10
    f.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="fail their checksum"):
        ernie._ernie.verify_checkpoint(str(d))
    # A checkpoint of another model.
    other = ernie.compile(LlamaForCausalLM(LlamaConfig(**{**TINY, "hidden_size": 8, "intermediate_size": 12})),
                          ernie.optimizer.SGD(0.1), list(batch(0)))
    with pytest.raises(ValueError, match="tensor 'llama.embed_tokens.weight' is f32\\[32, 16\\] in the checkpoint"):
        other.load_checkpoint(root)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no complete checkpoint"):
        prog.load_checkpoint(tmp_path / "empty")


KILL_SCRIPT = textwrap.dedent("""
    import sys, numpy as np, ernie
    from ernie.models.llama import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, seed=1)
    ids = np.random.default_rng(0).integers(0, 64, size=(2, 8))
    prog = ernie.compile(LlamaForCausalLM(cfg), ernie.optimizer.SGD(0.1), [ids, ids])
    for k in range(1000):
        prog.step(ids, ids)
        prog.save_checkpoint(sys.argv[1], keep=2)
        print(k, flush=True)
""")


def test_killed_saves_leave_a_loadable_checkpoint(tmp_path):
    """kill -9 at random points of a save loop, 50 times: afterwards the
    newest complete checkpoint loads and verifies, and nothing named step-*
    is incomplete."""
    script = tmp_path / "saver.py"
    script.write_text(KILL_SCRIPT)
    root = tmp_path / "ckpts"
    rng = np.random.default_rng(11)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    loader = None
    for trial in range(50):
        proc = subprocess.Popen([sys.executable, str(script), str(root)], stdout=subprocess.PIPE,
                                env=env, text=True)
        # Once the save loop runs (a first save done), kill at a random
        # moment of it: saves (fsyncs, renames, pruning) take most of its time.
        proc.stdout.readline()
        time.sleep(float(rng.uniform(0, 0.05)))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        for d in root.iterdir():
            if d.name.startswith("step-"):
                assert (d / "manifest.json").exists(), d
        summary = ernie._ernie.verify_checkpoint(str(root))
        assert "verified" in summary
        if loader is None:
            cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
            ids = np.zeros((2, 8), np.int64)
            loader = ernie.compile(LlamaForCausalLM(cfg), ernie.optimizer.SGD(0.1), [ids, ids])
        loader.load_checkpoint(root)
        # What a killed save leaves (its temporary directory, a checkpoint
        # being pruned) is removed by the next save: only the last killed
        # process's leftovers remain.
        leftovers = {d.name.rsplit("-", 1)[1] for d in root.iterdir() if d.name.startswith(".tmp-")}
        assert leftovers <= {str(proc.pid)}, leftovers


def test_ernie_ckpt_info_verify_consolidate_import(saved, build_dir, tmp_path):
    root, where, want, state = saved
    tool = str(build_dir / "bin" / "ernie-ckpt")
    run = lambda *a: subprocess.run([tool, *map(str, a)], capture_output=True, text=True, timeout=120)  # noqa: E731
    info = run("info", root)
    assert info.returncode == 0, info.stderr
    assert "step 10, saved on mesh dp=2 x pp=2 x mp=2" in info.stdout
    assert "llama.embed_tokens.weight  F32[32, 16]  2048 bytes" in info.stdout
    assert run("verify", where).returncode == 0
    out = run("consolidate", root, tmp_path / "all.safetensors")
    assert out.returncode == 0, out.stderr
    whole = safetensors_numpy.load_file(str(tmp_path / "all.safetensors"))
    assert set(whole) == {n for n in state if n != ernie.Program.STEP_KEY}
    for name, value in whole.items():
        np.testing.assert_array_equal(value, state[name], err_msg=name)
    # Back into a checkpoint, which a program on two ranks resumes from.
    imported = run("import", tmp_path / "all.safetensors", tmp_path / "imported", 10)
    assert imported.returncode == 0, imported.stderr
    prog = program([2], ["mp"])
    prog.load_checkpoint(tmp_path / "imported")
    np.testing.assert_allclose(train(prog, 10, 20), want, rtol=1e-5)
    # A sharded folder in Hugging Face's layout (an index, files of at most
    # 4000 bytes; the 2048-byte embedding fills one alone), read by the
    # independent reader, and imported back.
    out = run("consolidate", root, tmp_path / "sharded", "--max-shard-bytes", 4000)
    assert out.returncode == 0, out.stderr
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in whole.values())
    for f in files:
        assert (tmp_path / "sharded" / f).stat().st_size <= 4000 + 2048 + 1024  # + header
        part = safetensors_numpy.load_file(str(tmp_path / "sharded" / f))
        assert {n for n, g in index["weight_map"].items() if g == f} == set(part)
        for name, value in part.items():
            np.testing.assert_array_equal(value, whole[name], err_msg=name)
    assert not [p for p in (tmp_path / "sharded").iterdir() if p.name.endswith(".tmp")]
    back = run("import", tmp_path / "sharded", tmp_path / "from-folder", 10)
    assert back.returncode == 0, back.stderr
    prog = program([2], ["mp"])
    prog.load_checkpoint(tmp_path / "from-folder")
    np.testing.assert_allclose(train(prog, 10, 20), want, rtol=1e-5)
    index["weight_map"]["llama.norm.weight"] = files[0] if index["weight_map"][
        "llama.norm.weight"] != files[0] else files[1]
    (tmp_path / "sharded" / "model.safetensors.index.json").write_text(json.dumps(index))
    mislisted = run("import", tmp_path / "sharded", tmp_path / "bad-folder", 10)
    assert mislisted.returncode == 1 and "'llama.norm.weight' is listed for another file" in \
        mislisted.stderr
    assert run("consolidate", root, tmp_path / "one.safetensors", "--max-shard-bytes",
               "0").returncode == 2
    bad = run("verify", tmp_path / "nothing")
    assert bad.returncode == 1 and "no such checkpoint directory" in bad.stderr
    assert run("frobnicate", root).returncode == 2


# ---------------------------------------------------------------------------
# ernie-run --save-every / --resume
# ---------------------------------------------------------------------------

def ernie_run_losses(tool, program_file, out, *args):
    proc = subprocess.run([str(tool), str(program_file), "--outputs", str(out), *map(str, args)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return np.load(out / "losses.npy"), proc


@pytest.mark.parametrize("backend,mesh", [
    ("threads", ([2, 2, 2], ["dp", "pp", "mp"], 2, True)),
    ("gloo", ([2, 2], ["dp", "mp"], 2, False)),
])
def test_ernie_run_saves_and_resumes_bit_for_bit(ernie_run, tmp_path, backend, mesh):
    """Ten steps saving every 5, against 5 resumed from the step-5
    checkpoint: the same losses and final state, bit for bit (the same
    program, the same inputs, the same order of sums). The Gloo checkpoint
    also resumes on another mesh (mp 4, threads) within 1e-5."""
    shape, names, zero, pp = mesh
    program(shape, names, zero=zero, pp=pp).save(tmp_path / "p.ernie")
    ids, labels = batch(0)
    (tmp_path / "in").mkdir()
    np.save(tmp_path / "in" / "input0.npy", ids)
    np.save(tmp_path / "in" / "input1.npy", labels)
    common = ["--backend", backend, "--inputs", tmp_path / "in", "--steps", 10, "--lr", 3e-3]
    full, proc = ernie_run_losses(ernie_run, tmp_path / "p.ernie", tmp_path / "full", *common,
                                  "--save", tmp_path / "ck", "--save-every", 5, "--keep", 2)
    assert len(full) == 10
    assert sorted(os.listdir(tmp_path / "ck")) == ["step-00000005", "step-00000010"]
    assert re.search(r"saving step 5 to .*: [0-9.]+ [kM]?B in [0-9.]+ s \([0-9.]+ MB/s\)",
                     proc.stderr), proc.stderr
    assert "verified" in ernie._ernie.verify_checkpoint(str(tmp_path / "ck"))
    resumed, proc = ernie_run_losses(ernie_run, tmp_path / "p.ernie", tmp_path / "resumed",
                                     *common, "--resume", tmp_path / "ck" / "step-00000005")
    assert "loading " in proc.stderr and "MB/s" in proc.stderr
    np.testing.assert_array_equal(resumed, full[5:])
    for f in os.listdir(tmp_path / "full"):
        if f.startswith("llama") or f.startswith("lm_head"):
            np.testing.assert_array_equal(np.load(tmp_path / "resumed" / f),
                                          np.load(tmp_path / "full" / f), err_msg=f)
    if backend == "gloo":
        program([4], ["mp"]).save(tmp_path / "mp4.ernie")
        other, _ = ernie_run_losses(ernie_run, tmp_path / "mp4.ernie", tmp_path / "mp4",
                                    *common[2:], "--resume", tmp_path / "ck" / "step-00000005")
        np.testing.assert_allclose(other, full[5:], rtol=1e-5)
    # Nothing left to run, and flags that need each other, are clear errors.
    done = subprocess.run([str(ernie_run), str(tmp_path / "p.ernie"), *map(str, common),
                           "--resume", str(tmp_path / "ck")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and "at step 10" in done.stderr and "nothing to run" in done.stderr
    lone = subprocess.run([str(ernie_run), str(tmp_path / "p.ernie"), "--save-every", "2"],
                          capture_output=True, text=True, timeout=60)
    assert lone.returncode == 2 and "--save DIR and --save-every K go together" in lone.stderr
    missing = subprocess.run([str(ernie_run), str(tmp_path / "p.ernie"), *map(str, common),
                              "--resume", str(tmp_path / "nowhere")], capture_output=True,
                             text=True, timeout=120)
    assert missing.returncode == 1 and "nowhere" in missing.stderr

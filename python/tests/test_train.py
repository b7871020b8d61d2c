"""`python -m ernie.train`: a training job from a TOML config.

- The config: every key checked, a misspelling named with the nearest key,
  overrides from the command line.
- A job on 2 processes x 1 rank (dp 2, Gloo over loopback) trains a small
  Llama on a token dataset to a falling validation loss and writes JSONL,
  TensorBoard events (read back with TensorBoard's own reader) and
  checkpoints.
- SIGKILL mid-run, then resume: every later step's loss, learning rate and
  sample ids equal the uninterrupted run's, bit for bit on the same mesh;
  on half the dp degree, on dp 1 x mp 2 or with ZeRO-1 the same sample ids
  in the same order and the losses within f32 reduction-order noise (rtol
  1e-5: the gradients' and partial sums' order changes).
- SIGTERM saves a checkpoint and exits 0; a NaN loss stops the run naming
  the step, and a replay from the last good checkpoint names the first
  non-finite tensor; bad data and configs fail before any compute.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ernie.data import IndexedDatasetBuilder
from ernie.train.config import ConfigError, load

from conftest import REPO

VOCAB = 128


def corpus(path: Path, documents=120, vocab=VOCAB, seed=0):
    """A token dataset of `documents` random documents (a repeating
    pattern with noise, so a model can learn it)."""
    rng = np.random.default_rng(seed)
    with IndexedDatasetBuilder(path, np.uint16) as b:
        for _ in range(documents):
            n = int(rng.integers(20, 200))
            base = np.arange(n) % 17 + int(rng.integers(0, vocab - 20))
            noise = rng.random(n) < 0.1
            b.add_document(np.where(noise, rng.integers(2, vocab, n), base).astype(np.uint16))
    return path


def config(tmp_path, **sections):
    """A small job's TOML, sections updated by `sections`."""
    base = {
        "model": {"family": "llama",
                  "config": {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64,
                             "num_hidden_layers": 2, "num_attention_heads": 4,
                             "num_key_value_heads": 2}},
        "data": {"path": str(tmp_path / "corpus"), "valid_fraction": 0.1},
        "optimizer": {"lr": 1e-2},
        "lr_schedule": {"warmup_steps": 2},
        "training": {"global_batch": 8, "seq_len": 32, "steps": 12, "seed": 1},
        "parallel": {"dp": 2},
        "checkpoint": {"dir": str(tmp_path / "ckpt"), "every": 1, "keep": 3},
        "eval": {"every": 4, "batches": 2},
        "metrics": {"jsonl": str(tmp_path / "metrics.jsonl"), "sample_ids": True},
    }
    for name, values in sections.items():  # a value of None removes the key
        base[name] = {k: v for k, v in {**base.get(name, {}), **values}.items() if v is not None}
    lines = []
    for name, values in base.items():
        lines.append(f"[{name}]")
        for k, v in values.items():
            if isinstance(v, dict):
                v = "{ " + ", ".join(f"{a} = {json.dumps(b)}" for a, b in v.items()) + " }"
            else:
                v = json.dumps(v)
            lines.append(f"{k} = {v}")
    path = tmp_path / "job.toml"
    path.write_text("\n".join(lines) + "\n")
    if not (tmp_path / "corpus.bin").exists():
        corpus(tmp_path / "corpus")
    return path


def env():
    e = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
        e.pop(name, None)
    return e


def train(job, *args, nproc=None, timeout=300, popen=False, grace=2):
    command = [sys.executable, "-m", "ernie.train", "--config", job, *map(str, args)]
    if nproc:
        command = [sys.executable, "-m", "ernie.distributed.launch", "--nproc-per-node",
                   str(nproc), "--grace", str(grace), *command[1:]]
    if popen:
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env(), start_new_session=True)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env())


def records(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


# -- the config -----------------------------------------------------------

def test_every_key_is_checked_and_misspellings_are_named(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text("[training]\nglobal_bacth = 8\n")
    with pytest.raises(ConfigError, match=r"unknown key training.global_bacth "
                                          r"\(did you mean 'global_batch'\?\)"):
        load(path)
    path.write_text("[trainig]\nsteps = 8\n")
    with pytest.raises(ConfigError, match=r"unknown section \[trainig\] \(did you mean 'training'"):
        load(path)
    path.write_text("[training]\nsteps = \"ten\"\n")
    with pytest.raises(ConfigError, match="training.steps must be int, not str 'ten'"):
        load(path)
    path.write_text("[training]\nsteps = 0\n")
    with pytest.raises(ConfigError, match="training.steps = 0 must be >= 1"):
        load(path)
    path.write_text("[lr_schedule]\nkind = \"cosin\"\n")
    with pytest.raises(ConfigError, match="not one of cosine, linear, constant "
                                          r"\(did you mean 'cosine'\?\)"):
        load(path)
    path.write_text("[optimizer]\nlr = nan\n")
    with pytest.raises(ConfigError, match="optimizer.lr must be finite"):
        load(path)
    path.write_text("[training]\nsteps = 5\n")
    job = load(path, [("training.steps", "7"), ("optimizer.lr", "1e-2"),
                      ("model.config.hidden_size", "64"), ("checkpoint.dir", "out/ckpt")])
    assert (job.training.steps, job.optimizer.lr, job.model.config, job.checkpoint.dir) == \
        (7, 1e-2, {"hidden_size": 64}, "out/ckpt")
    with pytest.raises(ConfigError, match="training.steps must be int, not float 2.5"):
        load(path, [("training.steps", "2.5")])


def test_bad_command_lines_and_configs_exit_2(tmp_path):
    job = config(tmp_path)
    result = train(job, "--training.stepz", "3")
    assert result.returncode == 2
    assert "unknown key training.stepz (did you mean 'steps'?)" in result.stderr
    result = train(job, "--parallel.zero", "1", "--parallel.dp", "1")
    assert result.returncode == 2 and "parallel.zero shards over dp" in result.stderr
    result = train(tmp_path / "missing.toml")
    assert result.returncode == 2 and "no such config file" in result.stderr


def test_bad_data_fails_before_any_compute(tmp_path):
    job = config(tmp_path)
    # Tokens beyond the model's vocabulary.
    big = corpus(tmp_path / "big", vocab=1000)
    result = train(job, "--data.path", big, "--parallel.dp", "1")
    assert result.returncode == 1
    assert "vocab" in result.stderr and "big" in result.stderr, result.stderr
    assert "compile" not in result.stdout
    # A truncated .bin.
    cut = tmp_path / "cut"
    corpus(cut)
    data = (tmp_path / "cut.bin").read_bytes()
    (tmp_path / "cut.bin").write_bytes(data[: len(data) // 2])
    result = train(job, "--data.path", cut, "--parallel.dp", "1")
    assert result.returncode == 1 and "cut.bin" in result.stderr, result.stderr
    # An .idx from another file.
    other = corpus(tmp_path / "other", documents=50, seed=3)
    (tmp_path / "cut.idx").write_bytes((tmp_path / "other.idx").read_bytes())
    corpus(tmp_path / "cut2")
    (tmp_path / "cut2.idx").write_bytes((tmp_path / "other.idx").read_bytes())
    result = train(job, "--data.path", tmp_path / "cut2", "--parallel.dp", "1")
    assert result.returncode == 1 and "cut2" in result.stderr, result.stderr
    assert other  # (kept for the reader)
    # No dataset at all.
    result = train(job, "--data.path", tmp_path / "nothing", "--parallel.dp", "1")
    assert result.returncode == 1 and "nothing" in result.stderr


# -- a job ------------------------------------------------------------------

@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """The uninterrupted job, 2 processes x 1 rank: (directory, JSONL records)."""
    tmp = tmp_path_factory.mktemp("finished")
    tb = tmp / "tb"
    result = train(config(tmp, metrics={"tensorboard": str(tb)}), nproc=2)
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp, records(tmp / "metrics.jsonl"), result


def test_a_job_trains_to_a_falling_validation_loss(finished):
    tmp, rows, result = finished
    assert [r["step"] for r in rows] == list(range(1, 13))
    evals = [r["eval_loss"] for r in rows if "eval_loss" in r]
    assert len(evals) == 3 and evals[-1] < evals[0]
    assert rows[-1]["loss"] < rows[0]["loss"]
    for key in ("lr", "grad_norm", "tokens_per_s", "tokens_per_s_per_rank", "step_s",
                "data_wait_s", "mfu"):
        assert all(key in r for r in rows), key
    assert all(0 < r["grad_norm"] < 1e3 for r in rows)
    assert rows[1]["lr"] == pytest.approx(1e-2)  # the end of the 2-step warm-up
    assert "MFU = model FLOPs per step" in result.stdout
    assert "tokens per step: 256 (8 x 32)" in result.stdout
    assert sorted(int(p.name[5:]) for p in (tmp / "ckpt").glob("step-*")) == [10, 11, 12]


def test_tensorboard_reads_the_events(finished):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    tmp, rows, _ = finished
    acc = EventAccumulator(str(tmp / "tb"))
    acc.Reload()
    loss = [(e.step, e.value) for e in acc.Scalars("loss")]
    assert [s for s, _ in loss] == list(range(1, 13))
    assert np.allclose([v for _, v in loss], [r["loss"] for r in rows], rtol=1e-6)
    assert len(acc.Scalars("eval_loss")) == 3


def kill_after(job, tmp_path, steps):
    """Runs `job` on 2 processes and SIGKILLs the launcher's whole session
    (every process) once `steps` steps are logged."""
    proc = train(job, nproc=2, popen=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if (tmp_path / "metrics.jsonl").exists() and \
                len((tmp_path / "metrics.jsonl").read_text().splitlines()) >= steps:
            break
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert len(records(tmp_path / "metrics.jsonl")) < 12


def test_a_killed_job_resumes_to_the_same_run(finished, tmp_path):
    _, whole, _ = finished
    job = config(tmp_path)
    kill_after(job, tmp_path, 5)
    result = train(job, nproc=2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resumed from" in result.stdout
    rows = records(tmp_path / "metrics.jsonl")
    resumed = {r["step"]: r for r in rows}  # a re-run step overwrites its first record
    for step in range(1, 13):
        for key in ("loss", "lr", "samples"):
            assert resumed[step][key] == whole[step - 1][key], (step, key)


@pytest.mark.parametrize("plan", [("--parallel.dp", "1"),
                                  ("--parallel.dp", "1", "--parallel.mp", "2"),
                                  ("--parallel.zero", "1")],
                         ids=["half-dp", "mp", "zero1"])
def test_resuming_on_another_plan_sees_the_same_samples(plan, finished, tmp_path):
    """Killed on dp 2, resumed on dp 1, on dp 1 x mp 2, or with ZeRO-1."""
    _, whole, _ = finished
    job = config(tmp_path)
    kill_after(job, tmp_path, 6)
    result = train(job, *plan, nproc=2 if "--parallel.zero" in plan else None)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {r["step"]: r for r in records(tmp_path / "metrics.jsonl")}
    assert [rows[s]["samples"] for s in range(1, 13)] == [r["samples"] for r in whole]
    seen = [i for s in range(1, 13) for i in rows[s]["samples"]]
    assert len(seen) == len(set(seen))  # none repeated within the epoch
    assert np.allclose([rows[s]["loss"] for s in range(1, 13)], [r["loss"] for r in whole],
                       rtol=1e-5, atol=0)


def test_sigterm_saves_a_checkpoint_and_exits_0(tmp_path):
    job = config(tmp_path, training={"steps": 400}, checkpoint={"every": 0})
    proc = train(job, nproc=2, popen=True, grace=60)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if (tmp_path / "metrics.jsonl").exists() and \
                len((tmp_path / "metrics.jsonl").read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)  # the launcher forwards it
    out, err = proc.communicate(timeout=120)
    assert time.monotonic() - sent < 60
    assert proc.returncode == 0, err[-3000:]
    assert "stopped at step" in out
    saved = sorted((tmp_path / "ckpt").glob("step-*"))
    assert len(saved) == 1
    step = int(saved[0].name[5:])
    result = train(job, "--training.steps", str(step + 2), nproc=2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"at step {step}" in result.stdout


def test_a_nan_loss_stops_the_run_naming_the_step_and_the_tensor(tmp_path):
    job = config(tmp_path, optimizer={"lr": 1e30}, lr_schedule={"warmup_steps": 0},
                 parallel={"dp": 1})
    result = train(job)
    assert result.returncode == 1
    assert "ernie.train: stopped: step" in result.stderr
    assert "is not finite" in result.stderr
    # The replay from the last good checkpoint names the first tensor that
    # went non-finite: an instruction of the step, not the loss.
    assert "replayed from step" in result.stderr, result.stderr[-2000:]
    assert "is the first tensor of the call that is not finite" in result.stderr
    assert "instruction #" in result.stderr
    assert "at llama.py:" in result.stderr  # the model's line that made it
    # The checkpoints written before the NaN are kept (none of a NaN step).
    saved = sorted(int(p.name[5:]) for p in (tmp_path / "ckpt").glob("step-*"))
    stopped = int(result.stderr.split("stopped: step ")[1].split(":")[0])
    assert saved and max(saved) < stopped


def test_check_finite_tensors_in_the_config_names_the_tensor_without_a_replay(tmp_path):
    job = config(tmp_path, optimizer={"lr": 1e30}, lr_schedule={"warmup_steps": 0},
                 parallel={"dp": 1}, training={"check_finite": "tensors"})
    result = train(job)
    assert result.returncode == 1
    assert "is the first tensor of the call that is not finite" in result.stderr
    assert "replayed" not in result.stderr
    result = train(job, "--training.check_finite", "sometimes")
    assert result.returncode == 2  # a config error: before any compute
    assert "training.check_finite" in result.stderr and "tensors" in result.stderr


@pytest.mark.parametrize("name", ["ernie45_0p3b", "ernie45_21b_a3b"])
def test_published_layouts_dry_run(name):
    result = train(REPO / "examples" / "train" / f"{name}.toml", "--dry-run", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "memory per rank" in result.stdout and "plan: mesh" in result.stdout


def test_the_plan_search_chooses_the_plan(tmp_path):
    job = config(tmp_path, parallel={"dp": None, "plan": "auto", "ranks": 2},
                 training={"steps": 3}, eval={"every": 0})
    result = train(job)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "plan search: Plan(" in result.stdout
    assert len(records(tmp_path / "metrics.jsonl")) == 3
    result = train(job, "--parallel.dp", "2")
    assert result.returncode == 2
    assert 'parallel.plan = "auto" chooses dp itself' in result.stderr


def test_export_and_plot_at_the_end(tmp_path):
    """export.hf writes a Hugging Face folder of the trained state (read back
    by from_pretrained with the checkpoint's values); --plot a PNG."""
    pytest.importorskip("matplotlib")
    from ernie.data import IndexedDataset  # noqa: F401  (the corpus exists)
    from ernie.models import AutoModelForCausalLM
    job = config(tmp_path, training={"steps": 3}, eval={"every": 0}, parallel={"dp": 1},
                 export={"hf": str(tmp_path / "hf")})
    result = train(job, "--plot", tmp_path / "run.png")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    import ernie
    ids = np.zeros((8, 32), np.int64)
    prog = ernie.compile(model, ernie.optimizer.AdamW(1e-2), [ids, ids])
    prog.load_checkpoint(tmp_path / "ckpt")
    state = prog.state_dict()
    for name, p in model.named_parameters():
        np.testing.assert_array_equal(p.value, state[name], err_msg=name)


def test_a_second_sigint_stops_at_once(tmp_path):
    job = config(tmp_path, training={"steps": 100000}, checkpoint={"every": 0},
                 parallel={"dp": 1}, eval={"every": 0})
    proc = train(job, popen=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (
            (tmp_path / "metrics.jsonl").exists() and
            len((tmp_path / "metrics.jsonl").read_text().splitlines()) >= 2):
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    # Either the second signal came before a step boundary (stopped at once,
    # no checkpoint) or after (the first had saved and exited 0).
    if proc.returncode == 130:
        assert "interrupted: SIGINT again" in err
        assert not list((tmp_path / "ckpt").glob("step-*"))
    else:
        assert proc.returncode == 0 and "stopped at step" in out, err[-2000:]

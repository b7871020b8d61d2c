"""Programs compiled from Python, run as multi-process jobs (multi-controller
SPMD): every process runs multiprocess_job.py, compiles the same program
and runs only its own block of ranks; groups inside a process meet in the
thread engine, groups across processes over Gloo (loopback only).

What must hold, against the single-process run of the same script with
every rank a thread: the losses and every tensor of the final checkpoint
are *identical* (exact equality, not a tolerance: both engines reduce in
group order, so the bits cannot differ unless the plan or the data did),
for the README's Llama (dp x mp, ZeRO-1) and a pipelined ERNIE 4.5 MoE
(pp x dp with experts on dp), as 2 processes x 2 ranks and 4 x 1, with the
global batch or each process's own rows. A process killed with SIGKILL is
named by the others, which all exit within the timeout; with a restart
the job continues from its newest checkpoint to the same result. Bad
launches end in errors naming the cause. Every run is bounded in time.
"""

import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ernie import _ernie
from ernie.distributed.launch import _free_port

from conftest import taken_port

JOB = Path(__file__).with_name("multiprocess_job.py")
# A killed process's peers must stop within the job's timeout; they are
# given this one (plus start-up and the ~3 s a diagnosis waits).
TIMEOUT = 20
TRIALS = 10 if os.environ.get("ERNIE_SLOW_TESTS") else 2


def clean_env(**extra):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), **extra)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID",
                 "OMPI_COMM_WORLD_RANK", "ERNIE_RESTART_COUNT"):
        if name not in extra:
            env.pop(name, None)
    return env


def run_alone(model, out, *args):
    """The job as one process with every rank a thread."""
    result = subprocess.run([sys.executable, JOB, model, out, "--ranks-per-process", "4", *args],
                            capture_output=True, text=True, timeout=300, env=clean_env())
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def launch(nproc, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", "ernie.distributed.launch",
                           "--nproc-per-node", str(nproc), "--grace", "2", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=clean_env())


def start_by_hand(nproc, rpp, out, *args, port=None, only=None):
    """The job's processes started as a launcher would, each with torchrun's
    variables, without a launcher to stop them: what they do on their own."""
    port = port or _free_port()
    procs = {}
    for rank in (only if only is not None else range(nproc)):
        env = clean_env(RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank),
                        LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(port))
        procs[rank] = subprocess.Popen(
            [sys.executable, JOB, "llama", out, "--ranks-per-process", str(rpp),
             "--timeout", str(TIMEOUT), *map(str, args)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return procs


def final_state(out, build_dir):
    """Every tensor of the newest checkpoint, consolidated: {name: bytes}."""
    ckpt = sorted((out / "ckpt").glob("step-*"), key=lambda p: int(p.name[5:]))[-1]
    whole = out / "final.safetensors"
    subprocess.run([build_dir / "bin" / "ernie-ckpt", "consolidate", ckpt, whole], check=True,
                   capture_output=True, timeout=120)
    tensors, _ = _ernie.read_safetensors(str(whole))
    return ckpt.name, {k: (dtype, np.ascontiguousarray(v).tobytes())
                       for k, (dtype, v) in tensors.items()}


@pytest.fixture(scope="module")
def alone(tmp_path_factory, build_dir):
    """Per model: (losses, final checkpoint) of the single-process run."""
    runs = {}

    def get(model):
        if model not in runs:
            out = tmp_path_factory.mktemp(f"alone-{model}")
            run_alone(model, out)
            runs[model] = (json.loads((out / "losses.json").read_text()),
                           final_state(out, build_dir), dict(np.load(out / "state.npz")))
        return runs[model]
    return get


@pytest.mark.parametrize("model,rpp,rows", [
    ("llama", 2, "local"), ("llama", 1, "global"), ("moe", 2, "global"), ("moe", 1, "local")])
def test_a_job_trains_as_one_process_does(model, rpp, rows, alone, tmp_path, build_dir):
    losses, (step, state), state_dict = alone(model)
    args = [JOB, model, tmp_path, "--ranks-per-process", rpp]
    result = launch(4 // rpp, *args, *(["--local-rows"] if rows == "local" else []))
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "losses.json").read_text()) == losses
    got_step, got = final_state(tmp_path, build_dir)
    assert got_step == step and got.keys() == state.keys()
    assert [k for k in state if got[k] != state[k]] == []
    # state_dict() in a job: gathered from the other processes (pipelines:
    # from the stage holding each state), the same arrays.
    theirs = dict(np.load(tmp_path / "state.npz"))
    assert theirs.keys() == state_dict.keys()
    for k, v in state_dict.items():
        np.testing.assert_array_equal(theirs[k], v, err_msg=k)
    # Each process read its own rows: dp 2 splits the 8 rows in halves.
    printed = re.findall(r"process (\d): done, \d+ losses, rows (\[.*\])", result.stdout)
    assert len(printed) == 4 // rpp


def test_local_rows_are_each_process_s_share(tmp_path):
    """Under dp x mp (dp the outer axis), 2 processes x 2 ranks: process p
    holds dp index p, so it reads rows 4p..4p+3; 4 x 1: processes 2p and
    2p+1 (mp 0 and 1 of dp p) read the same rows."""
    result = launch(2, JOB, "llama", tmp_path, "--ranks-per-process", 2, "--steps", 1)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = dict(re.findall(r"process (\d): done, \d+ losses, rows (\[.*\])", result.stdout))
    assert rows == {"0": "[0, 1, 2, 3]", "1": "[4, 5, 6, 7]"}


@pytest.mark.parametrize("trial", range(TRIALS))
def test_a_killed_process_is_named_and_nothing_hangs(trial, tmp_path):
    rng = random.Random(trial)
    victim, step = rng.randrange(2), rng.randrange(1, 4)
    start = time.monotonic()
    procs = start_by_hand(2, 2, tmp_path, "--steps", 5, "--kill-at", f"{step}:{victim}")
    outputs = {r: p.communicate(timeout=TIMEOUT + 60) for r, p in procs.items()}
    elapsed = time.monotonic() - start
    assert procs[victim].returncode == -9
    survivor = 1 - victim
    assert procs[survivor].returncode not in (0, None)
    err = outputs[survivor][1]
    name = "process 1 \\(mesh ranks 2..3\\)" if victim == 1 else "process 0 \\(mesh ranks 0..1\\)"
    assert re.search(name + " has stopped", err), err[-3000:]
    assert elapsed < TIMEOUT + 45, elapsed
    assert all(p.poll() is not None for p in procs.values())


def test_a_frozen_process_is_named_after_the_timeout(tmp_path):
    """SIGSTOP: the process keeps its connections but never answers; the
    others' collectives time out and the heartbeat names it."""
    start = time.monotonic()
    procs = start_by_hand(2, 2, tmp_path, "--steps", 4, "--kill-at", "2:1", "--freeze")
    try:
        _, err = procs[0].communicate(timeout=TIMEOUT + 60)
        elapsed = time.monotonic() - start
    finally:
        procs[1].kill()
        procs[1].communicate()
    assert procs[0].returncode not in (0, None)
    assert re.search(r"process 1 \(mesh ranks 2..3\) has stopped: no heartbeat", err), err[-3000:]
    assert TIMEOUT - 5 < elapsed < TIMEOUT + 45, elapsed


@pytest.mark.parametrize("trial", range(max(1, TRIALS // 2)))
def test_a_restarted_job_continues_to_the_same_result(trial, alone, tmp_path, build_dir):
    losses, (step, state), _ = alone("llama")
    rng = random.Random(100 + trial)
    kill = f"{rng.randrange(1, 4)}:{rng.randrange(4)}"
    result = launch(4, "--max-restarts", 1, JOB, "llama", tmp_path, "--kill-at", kill,
                    "--timeout", TIMEOUT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"rank \d was killed by SIGKILL", result.stderr)
    assert "restarting the job (1 of 1 restarts)" in result.stderr
    assert json.loads((tmp_path / "losses.json").read_text()) == losses
    assert final_state(tmp_path, build_dir) == (step, state)


def test_a_process_count_the_mesh_does_not_have_is_refused(tmp_path):
    result = launch(3, JOB, "llama", tmp_path, "--timeout", TIMEOUT, timeout=120)
    assert result.returncode == 1
    assert re.search(r"mesh \[dp=2, mp=2\] has 4 ranks, but the job is 3 processes x 1 ranks",
                     result.stderr), result.stderr[-3000:]


def test_a_process_that_never_joins_is_named(tmp_path):
    start = time.monotonic()
    (proc,) = start_by_hand(2, 2, tmp_path, only=[0]).values()
    _, err = proc.communicate(timeout=TIMEOUT + 60)
    assert proc.returncode != 0
    assert re.search(r"did not all join within 20(\.0+)? s: process 1 \(mesh ranks 2..3\) never "
                     r"did", err), err[-3000:]
    assert time.monotonic() - start < TIMEOUT + 40


def test_a_process_compiling_another_program_is_refused(tmp_path):
    result = launch(2, JOB, "llama", tmp_path, "--ranks-per-process", 2, "--differ-on", 1,
                    "--timeout", TIMEOUT, timeout=120)
    assert result.returncode == 1
    assert re.search(r"process 1 \(mesh ranks 2..3\) runs a different job than process 0: "
                     r"program hash=\w+ vs program hash=\w+", result.stderr), result.stderr[-3000:]


def test_a_store_port_in_use_is_named(tmp_path):
    with taken_port() as port:
        start = time.monotonic()
        procs = start_by_hand(2, 2, tmp_path, port=port)
        outputs = {r: p.communicate(timeout=TIMEOUT + 60) for r, p in procs.items()}
    assert all(p.returncode != 0 for p in procs.values())
    assert re.search(rf"process 0 \(mesh ranks 0..1\): the job's store at 127.0.0.1:{port}.*"
                     r"another job using the port", outputs[0][1]), outputs[0][1][-3000:]
    assert time.monotonic() - start < TIMEOUT + 40


ROWS_OF_ANOTHER = """
import numpy as np, ernie, ernie.distributed as dist
env = dist.init_parallel_env(ranks_per_process=2)
model = ernie.nn.Linear(4, 2)
mesh = dist.ProcessMesh([0, 1, 2, 3], dim_names=["dp"])
x = np.ones((8, 4), np.float32)
prog = ernie.compile(model, None, [x], mesh, differentiate=False, timeout=%d)
rows = dist.local_batch(prog)
print("rows", env.rank, rows.tolist(), flush=True)
if env.rank == 1:
    rows = np.arange(4)  # process 0's
prog.forward(x[rows], rows=rows)
"""


def test_rows_of_another_process_are_refused_and_stop_the_job(tmp_path):
    script = tmp_path / "rows.py"
    script.write_text(ROWS_OF_ANOTHER % TIMEOUT)
    start = time.monotonic()
    result = launch(2, script, timeout=120)
    assert result.returncode == 1
    assert "[rank 0] rows 0 [0, 1, 2, 3]" in result.stdout
    assert "[rank 1] rows 1 [4, 5, 6, 7]" in result.stdout
    assert re.search(r"rows \[0, 1, 2, 3\] are not the rows this process's ranks read "
                     r"\(\[4, 5, 6, 7\]; process 1 of 2, mesh ranks 2..3\)", result.stderr), \
        result.stderr[-3000:]
    assert time.monotonic() - start < TIMEOUT + 40


def test_a_job_s_trace_holds_every_rank(tmp_path):
    """write_trace in a job: every process gathers, process 0 writes one
    file with every rank's compute and collectives."""
    trace = tmp_path / "trace.json"
    result = launch(2, JOB, "llama", tmp_path, "--ranks-per-process", 2, "--steps", 2,
                    "--trace", trace)
    assert result.returncode == 0, result.stderr[-3000:]
    events = json.loads(trace.read_text())["traceEvents"]
    ranks = {e["pid"] for e in events if e.get("ph") == "X"}
    assert ranks == {0, 1, 2, 3}
    assert all(any(e.get("cat") == "collective" and e["pid"] == r for e in events)
               for r in ranks)

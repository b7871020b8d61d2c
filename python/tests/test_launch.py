"""The launcher (`python -m ernie.distributed.launch`) and the launch
environment (`ernie.distributed.init_parallel_env`): the variables each
process gets and how every launcher's are read; output by rank; a process
that fails or is killed stops the others and is named, never a hang;
restarts; forwarded signals; bad launches; and a real multi-process run
(ernie-run over Gloo, 2 processes) equal to the single-process run. All on
127.0.0.1, each bounded in time."""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from ernie.distributed import LaunchError, init_parallel_env
from ernie.distributed.env import first_slurm_host

from conftest import REPO, taken_port

DP2 = REPO / "test" / "Tools" / "Inputs" / "repro" / "llama-dp2.ernie"


def launch(*args, timeout=120, **kwargs):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "ernie.distributed.launch", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env, **kwargs)


def script(tmp_path, body, name="job.py"):
    path = tmp_path / name
    path.write_text("import os, sys, time, signal\n" + textwrap.dedent(body))
    return path


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_each_process_gets_its_place_and_output_is_prefixed(tmp_path):
    job = script(tmp_path, """
        from ernie.distributed import init_parallel_env
        env = init_parallel_env()
        print(env.rank, env.world_size, env.local_rank, env.local_world_size,
              env.master_addr, env.master_port, env.source, os.environ["ERNIE_RESTART_COUNT"])
    """)
    result = launch("--nproc-per-node", 3, job)
    assert result.returncode == 0, result.stderr
    lines = sorted(re.findall(r"^\[rank (\d)\] (.*)$", result.stdout, re.M))
    assert [r for r, _ in lines] == ["0", "1", "2"]
    ports = set()
    for rank, line in lines:
        r, world, local, local_world, addr, port, *source, restart = line.split()
        assert (r, world, local, local_world, addr, restart) == (rank, "3", rank, "3",
                                                                "127.0.0.1", "0")
        assert " ".join(source) == "ernie's launcher"
        ports.add(port)
    assert len(ports) == 1


def test_a_failing_process_stops_the_others_and_is_named(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    job = script(tmp_path, f"""
        rank = int(os.environ["RANK"])
        open(os.path.join({str(pids)!r}, str(rank)), "w").write(str(os.getpid()))
        if rank == 1:
            time.sleep(0.5)
            print("rank one gives up", flush=True)
            sys.exit(3)
        time.sleep(120)
    """)
    start = time.monotonic()
    result = launch("--nproc-per-node", 3, "--grace", 2, job)
    assert time.monotonic() - start < 30
    assert result.returncode == 1
    assert "rank 1 exited with code 3" in result.stderr
    assert "rank one gives up" in result.stderr  # the last lines of its output
    for f in pids.iterdir():
        assert not alive(int(f.read_text())), f"rank {f.name} is still running"


def test_a_killed_process_is_named_with_its_signal(tmp_path):
    job = script(tmp_path, """
        if os.environ["RANK"] == "0":
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)
    """)
    result = launch("--nproc-per-node", 2, "--grace", 1, job, timeout=60)
    assert result.returncode == 1
    assert "rank 0 was killed by SIGKILL" in result.stderr


def test_the_job_restarts_and_finishes(tmp_path):
    job = script(tmp_path, """
        attempt = int(os.environ["ERNIE_RESTART_COUNT"])
        if attempt == 0 and os.environ["RANK"] == "1":
            sys.exit(7)
        print("finished on attempt", attempt)
    """)
    result = launch("--nproc-per-node", 2, "--max-restarts", 1, "--grace", 1, job)
    assert result.returncode == 0, result.stderr
    assert "rank 1 exited with code 7" in result.stderr
    assert "restarting the job (1 of 1 restarts)" in result.stderr
    assert result.stdout.count("finished on attempt 1") == 2
    # Without a restart left, the same failure ends the job.
    assert launch("--nproc-per-node", 2, "--grace", 1, job).returncode == 1


def test_logs_per_rank(tmp_path):
    job = script(tmp_path, 'print("hello from", os.environ["RANK"])\n')
    logs = tmp_path / "logs"
    result = launch("--nproc-per-node", 2, "--log-dir", logs, job)
    assert result.returncode == 0, result.stderr
    assert "hello" not in result.stdout
    for rank in (0, 1):
        assert f"hello from {rank}" in (logs / f"rank-{rank}.log").read_text()


def sigterm_when_ready(job):
    """Launches `job` on 2 processes, sends the launcher SIGTERM once both
    printed "ready"; returns (exit status, stderr)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-m", "ernie.distributed.launch",
                             "--nproc-per-node", "2", "--grace", "5", str(job)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 60
    ready = 0
    while ready < 2 and time.monotonic() < deadline:
        ready += "ready" in proc.stdout.readline()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    return proc.returncode, err


def test_sigterm_reaches_every_process(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    job = script(tmp_path, f"""
        def stop(signum, frame):
            open(os.path.join({str(marks)!r}, os.environ["RANK"]), "w").write("stopped")
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        print("ready", flush=True)
        time.sleep(120)
    """)
    code, err = sigterm_when_ready(job)
    # Every process acted on it and exited 0: so does the launcher.
    assert code == 0, err
    assert "SIGTERM: every process stopped cleanly" in err
    assert sorted(p.name for p in marks.iterdir()) == ["0", "1"]


def test_sigterm_that_kills_a_process_is_the_launcher_s_status(tmp_path):
    code, err = sigterm_when_ready(script(tmp_path, """
        print("ready", flush=True)
        time.sleep(120)
    """))
    assert code == 128 + signal.SIGTERM, err
    assert "SIGTERM: stopped every process" in err


@pytest.mark.parametrize("args, message", [
    (["--nproc-per-node", "0", "x.py"], "--nproc-per-node must be >= 1"),
    (["--nnodes", "2", "x.py"], "every host needs the same --master"),
    (["--nnodes", "2", "--node-rank", "2", "--master", "127.0.0.1:29500", "x.py"],
     "--node-rank 2 is not in 0..1"),
    (["--master", "127.0.0.1", "x.py"], "expected HOST:PORT"),
    ([], "no script to run"),
    (["/no/such/program"], "cannot start rank 0"),
])
def test_bad_launches_are_clear_errors(args, message):
    result = launch(*args, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr


def test_a_script_that_never_starts_is_named(tmp_path):
    result = launch("--nproc-per-node", 2, tmp_path / "missing.py", timeout=60)
    assert result.returncode == 1
    assert re.search(r"rank \d exited with code 2", result.stderr)


def test_gloo_processes_train_as_the_threads_do(build_dir):
    """ernie-run over Gloo, one process per rank under the launcher: the
    losses are the single-process thread run's, digit for digit."""
    run = [build_dir / "bin" / "ernie-run", DP2, "--steps", "3"]
    threads = subprocess.run(list(map(str, run)), capture_output=True, text=True, timeout=120)
    assert threads.returncode == 0, threads.stderr
    gloo = launch("--nproc-per-node", 2, *run, "--backend", "gloo", timeout=180)
    assert gloo.returncode == 0, gloo.stderr
    losses = lambda text: re.findall(r"step \d/3  loss (\S+)", text)
    assert losses(gloo.stdout) == losses(threads.stdout) and len(losses(threads.stdout)) == 3


# The launch environment, read from each launcher's variables.

@pytest.mark.parametrize("environ, expected", [
    ({}, (0, 1, 0, 1, "127.0.0.1", 29500, "single process")),
    ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
      "MASTER_ADDR": "node0", "MASTER_PORT": "1234"},
     (3, 4, 1, 2, "node0", 1234, "torchrun's variables")),
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
      "SLURM_NTASKS_PER_NODE": "4(x2)", "SLURM_JOB_NODELIST": "gpu[012-013],cpu1"},
     (5, 8, 1, 4, "gpu012", 29500, "Slurm's variables")),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
      "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
      "MASTER_ADDR": "10.0.0.1"}, (1, 2, 1, 2, "10.0.0.1", 29500, "Open MPI's variables")),
])
def test_every_launcher_is_read(environ, expected):
    env = init_parallel_env(environ=environ)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size, env.master_addr,
            env.master_port, env.source) == expected


def test_process_blocks_of_mesh_ranks_and_explicit_arguments():
    env = init_parallel_env(rank=1, world_size=2, master_addr="127.0.0.1", master_port=4000,
                            local_world_size=2, local_rank=1, ranks_per_process=2, environ={})
    assert list(env.mesh_ranks) == [2, 3] and env.store_address == "127.0.0.1:4000"
    assert env.source == "arguments"
    over = init_parallel_env(rank=0, environ={"RANK": "1", "WORLD_SIZE": "2",
                                              "MASTER_ADDR": "h"})
    assert over.rank == 0 and over.source == "arguments over torchrun's variables"


@pytest.mark.parametrize("environ, message", [
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, r"RANK=2 must be >= 0 and < 2"),
    ({"RANK": "0"}, "WORLD_SIZE missing"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, r"RANK='x' is not a non-negative integer"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, "needs MASTER_ADDR"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"},
     r"MASTER_PORT=70000 must be >= 1 and < 65536"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}, "set MASTER_ADDR"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "a[b]"},
     "is not a Slurm node list"),
])
def test_bad_launch_environments_name_the_variable(environ, message):
    with pytest.raises(LaunchError, match=message):
        init_parallel_env(environ=environ)


def test_slurm_node_lists():
    assert first_slurm_host("node7") == "node7"
    assert first_slurm_host("gpu[003-005,007]") == "gpu003"
    assert first_slurm_host("a1,b[2-3]") == "a1"
    assert first_slurm_host("rack[10-11]-n") == "rack10-n"


def test_a_world_size_the_program_does_not_have_is_refused(build_dir):
    result = launch("--nproc-per-node", 3, "--grace", 1, build_dir / "bin" / "ernie-run", DP2,
                    "--steps", 1, "--backend", "gloo", timeout=120)
    assert result.returncode == 1
    assert "WORLD_SIZE is 3 but the program's mesh" in result.stderr


def test_a_store_port_in_use_is_a_clear_error(build_dir):
    with taken_port() as port:
        start = time.monotonic()
        result = launch("--nproc-per-node", 2, "--master", f"127.0.0.1:{port}", "--grace", 1,
                        build_dir / "bin" / "ernie-run", DP2, "--steps", 1, "--backend", "gloo",
                        "--timeout", 10, timeout=120)
    assert result.returncode == 1
    assert time.monotonic() - start < 60
    assert re.search(r"rank \d exited with code", result.stderr)
    assert re.search(rf"{port}.*(in use|bind)|(in use|bind).*{port}", result.stderr), result.stderr

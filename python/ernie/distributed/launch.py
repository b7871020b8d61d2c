"""python -m ernie.distributed.launch: start a job's processes on this host.

    python -m ernie.distributed.launch --nproc-per-node N \\
        [--nnodes M --node-rank R --master ADDR:PORT] [--max-restarts K] \\
        [--log-dir DIR] script.py args...

Paddle's `paddle.distributed.launch` and `torchrun`, with their flags: on
each of M hosts it starts N processes of the script, each with the
variables `init_parallel_env()` (and `ernie-run`) read — RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT — and
ERNIE_RESTART_COUNT. The script is a Python file, `-m module`, or any
executable (`ernie-run prog.ernie --backend gloo`).

- Output: each line of a process's output prefixed with its rank, or with
  `--log-dir` a file per rank (`rank-<r>.log`, appended on restarts).
- Signals: SIGINT and SIGTERM are forwarded to every process, which get
  `--grace` seconds to act on them (a trainer saves a checkpoint); when all
  exit 0 the launcher exits 0, else 128 + the signal.
- Failure: when a process exits non-zero or is killed, the others get
  SIGTERM (then SIGKILL after `--grace` seconds), and the launcher names
  the rank, its exit code or signal and the last lines of its output. With
  `--max-restarts K` it then starts the whole group again (the script's
  `load_checkpoint` of the newest complete checkpoint continues the run),
  at most K times; otherwise it exits 1.
- Under `srun` it takes the node count, node rank and first host from
  Slurm (one launcher per node: `srun --ntasks-per-node=1`); run by
  `torchrun` (its variables already set) it runs the script as is.

One host: `--master` defaults to 127.0.0.1 and a free port. Several hosts:
give every launcher the same `--master` (process 0's host) and `--nnodes`,
and each its own `--node-rank`.
"""

from __future__ import annotations

import argparse
import collections
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

from .env import DEFAULT_PORT, LaunchError, first_slurm_host

_TAIL = 20  # lines of a failed process's output the report repeats


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _parse_master(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise LaunchError(f"--master {text!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def _command(script: list[str]) -> list[str]:
    """The command that runs `script` (a .py file, -m module, or a program)."""
    first = script[0]
    if first == "-m" or first.endswith(".py"):
        return [sys.executable, "-u", *script]
    return script


class _Process:
    """One local process: its pipe readers, its tail, its fate."""

    def __init__(self, rank: int, popen: subprocess.Popen, sink):
        self.rank, self.popen = rank, popen
        self.tail = collections.deque(maxlen=_TAIL)
        self.readers = []
        for stream, out in ((popen.stdout, sys.stdout), (popen.stderr, sys.stderr)):
            t = threading.Thread(target=self._read, args=(stream, out, sink), daemon=True)
            t.start()
            self.readers.append(t)

    def _read(self, stream, out, sink):
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.tail.append(line)
            sink(self.rank, line, out)
        stream.close()

    def fate(self) -> str:
        code = self.popen.returncode
        if code is not None and code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with code {code}"


class Launcher:
    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.logs = {}
        self.stopping = None  # the signal that asked the job to stop
        self.clean = False    # every process exited 0 after it

    def _sink(self, rank, line, out):
        with self.lock:
            if self.args.log_dir:
                f = self.logs[rank]
                f.write(line + "\n")
                f.flush()
            else:
                out.write(f"[rank {rank}] {line}\n")
                out.flush()

    def _start(self, attempt: int) -> list[_Process]:
        a = self.args
        world = a.nnodes * a.nproc_per_node
        procs = []
        for local in range(a.nproc_per_node):
            rank = a.node_rank * a.nproc_per_node + local
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world),
                       LOCAL_RANK=str(local), LOCAL_WORLD_SIZE=str(a.nproc_per_node),
                       GROUP_RANK=str(a.node_rank), MASTER_ADDR=a.master_host,
                       MASTER_PORT=str(a.master_port), ERNIE_LAUNCHER="1",
                       ERNIE_RESTART_COUNT=str(attempt), PYTHONUNBUFFERED="1")
            if a.log_dir:
                f = open(os.path.join(a.log_dir, f"rank-{rank}.log"), "a", encoding="utf-8")
                f.write(f"== attempt {attempt}: {shlex.join(a.command)}\n")
                self.logs[rank] = f
            try:
                popen = subprocess.Popen(a.command, env=env, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
            except OSError as e:
                self._stop(procs, signal.SIGKILL)
                raise LaunchError(f"cannot start rank {rank} ({shlex.join(a.command)}): "
                                  f"{e.strerror or e}") from None
            procs.append(_Process(rank, popen, self._sink))
        return procs

    def _signal(self, procs, sig):
        for p in procs:
            if p.popen.poll() is None:
                try:
                    os.killpg(p.popen.pid, sig)
                except ProcessLookupError:
                    pass

    def _stop(self, procs, sig=signal.SIGTERM):
        """Asks every live process to stop; kills what is left after the grace."""
        self._signal(procs, sig)
        deadline = time.monotonic() + self.args.grace
        while time.monotonic() < deadline and any(p.popen.poll() is None for p in procs):
            time.sleep(0.05)
        self._signal(procs, signal.SIGKILL)
        for p in procs:
            p.popen.wait()
            for t in p.readers:
                t.join(timeout=5)

    def _run_once(self, attempt: int) -> _Process | None:
        """Runs the group to the end; the first process that failed, or None."""
        procs = self._start(attempt)
        failed = None
        while True:
            if self.stopping is not None:
                # Forwarded already: each process gets the grace to act on it
                # (a trainer saves a checkpoint) and exit on its own.
                self._stop(procs, self.stopping)
                self.clean = all(p.popen.returncode == 0 for p in procs)
                return None
            for p in procs:
                code = p.popen.poll()
                if code is not None and code != 0 and failed is None:
                    failed = p
            if failed is not None:
                self._stop(procs)
                return failed
            if all(p.popen.poll() == 0 for p in procs):
                for p in procs:
                    for t in p.readers:
                        t.join(timeout=5)
                return None
            time.sleep(0.05)

    def _report(self, failed: _Process):
        tail = "\n".join(f"    {line}" for line in failed.tail) or "    (no output)"
        where = (f" (log: {os.path.join(self.args.log_dir, f'rank-{failed.rank}.log')})"
                 if self.args.log_dir else "")
        print(f"ernie.distributed.launch: rank {failed.rank} {failed.fate()}; the other "
              f"processes were stopped{where}. Its last lines:\n{tail}", file=sys.stderr,
              flush=True)

    def run(self) -> int:
        def forward(signum, _frame):
            self.stopping = signum
        previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            for attempt in range(self.args.max_restarts + 1):
                failed = self._run_once(attempt)
                if self.stopping is not None:
                    name = signal.Signals(self.stopping).name
                    if self.clean:  # each process acted on it and exited 0 (a checkpoint)
                        print(f"ernie.distributed.launch: {name}: every process stopped "
                              f"cleanly", file=sys.stderr, flush=True)
                        return 0
                    print(f"ernie.distributed.launch: {name}: stopped every process",
                          file=sys.stderr, flush=True)
                    return 128 + self.stopping
                if failed is None:
                    return 0
                self._report(failed)
                if attempt < self.args.max_restarts:
                    print(f"ernie.distributed.launch: restarting the job "
                          f"({attempt + 1} of {self.args.max_restarts} restarts)",
                          file=sys.stderr, flush=True)
            return 1
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            for f in self.logs.values():
                f.close()


def _parser():
    ap = argparse.ArgumentParser(
        prog="python -m ernie.distributed.launch",
        description="Start a job's processes on this host (torchrun's and Paddle's flags).",
        epilog="Example: python -m ernie.distributed.launch --nproc-per-node 2 train.py")
    ap.add_argument("--nproc-per-node", "--nproc_per_node", type=int,
                    help="processes on this host (default 1)")
    ap.add_argument("--nnodes", type=int, help="hosts in the job (default 1, or Slurm's)")
    ap.add_argument("--node-rank", "--node_rank", type=int,
                    help="this host's index (default 0, or Slurm's)")
    ap.add_argument("--master", help="HOST:PORT of the rendezvous store (process 0's host); "
                                     "one host: 127.0.0.1 and a free port")
    ap.add_argument("--max-restarts", "--max_restarts", "--max_restart", type=int, default=0,
                    help="start the job again this many times after a failure")
    ap.add_argument("--log-dir", "--log_dir", help="write each rank's output to "
                                                   "DIR/rank-<r>.log instead of the terminal")
    ap.add_argument("--grace", type=float, default=30.0,
                    help="seconds between SIGTERM and SIGKILL when stopping (default 30: "
                         "time for a trainer to save a checkpoint)")
    ap.add_argument("-m", "--module", action="store_true",
                    help="the script is a module to run as `python -m` (torchrun's -m)")
    ap.add_argument("script", nargs=argparse.REMAINDER,
                    help="a .py file, -m module, or a program, with its arguments")
    return ap


def _configure(a, env) -> None:
    """Fills what the flags leave open from Slurm, checks every value."""
    if not a.script:
        raise LaunchError("no script to run")
    if a.script[0] == "--":
        a.script = a.script[1:]
    if a.module:
        a.script = ["-m", *a.script]
    slurm = "SLURM_PROCID" in env and "RANK" not in env
    if a.nnodes is None:
        a.nnodes = int(env.get("SLURM_NNODES", "1")) if slurm else 1
    if a.node_rank is None:
        a.node_rank = int(env.get("SLURM_NODEID", "0")) if slurm else 0
    if a.nproc_per_node is None:
        a.nproc_per_node = 1
    for name, value, least in (("--nproc-per-node", a.nproc_per_node, 1),
                               ("--nnodes", a.nnodes, 1), ("--max-restarts", a.max_restarts, 0)):
        if value < least:
            raise LaunchError(f"{name} must be >= {least}, not {value}")
    if not 0 <= a.node_rank < a.nnodes:
        raise LaunchError(f"--node-rank {a.node_rank} is not in 0..{a.nnodes - 1} "
                          f"(--nnodes {a.nnodes})")
    if not a.grace >= 0:
        raise LaunchError(f"--grace must be a number of seconds >= 0, not {a.grace}")
    if a.master:
        a.master_host, a.master_port = _parse_master(a.master)
    elif slurm and a.nnodes > 1:
        a.master_host = first_slurm_host(env.get("SLURM_JOB_NODELIST", ""))
        a.master_port = int(env.get("MASTER_PORT", DEFAULT_PORT))
    elif a.nnodes > 1:
        raise LaunchError(f"--nnodes {a.nnodes}: every host needs the same --master HOST:PORT "
                          f"(process 0's host)")
    else:
        a.master_host, a.master_port = "127.0.0.1", _free_port()
    if a.log_dir:
        os.makedirs(a.log_dir, exist_ok=True)
    a.command = _command(a.script)


def main(argv=None) -> int:
    env = os.environ
    a = _parser().parse_args(argv)
    try:
        if "RANK" in env and "WORLD_SIZE" in env and "LOCAL_RANK" in env \
                and "ERNIE_LAUNCHER" not in env and a.script:
            # Started by torchrun (or a launcher like it): its variables stand.
            script = a.script[1:] if a.script[0] == "--" else a.script
            script = ["-m", *script] if a.module else script
            os.execvp(_command(script)[0], _command(script))
        _configure(a, env)
        return Launcher(a).run()
    except LaunchError as e:
        print(f"ernie.distributed.launch: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

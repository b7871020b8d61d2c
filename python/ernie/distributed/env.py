"""Where this process stands in a job: `init_parallel_env()`.

Every process of a multi-process job runs the same script (multi-controller
SPMD, as `torchrun`, `jax.distributed.initialize()` and Paddle's
`init_parallel_env()` have it); this module reads which process it is from
the launch environment, in this order:

- explicit arguments to `init_parallel_env(rank=..., world_size=..., ...)`;
- ernie's launcher and `torchrun`: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
  `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`;
- Slurm (`srun`): `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`,
  `SLURM_NTASKS_PER_NODE`, the first host of `SLURM_JOB_NODELIST`;
- Open MPI (`mpirun`): `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`,
  `OMPI_COMM_WORLD_LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_SIZE`, with
  `MASTER_ADDR`.

Without any of them the job is this one process (what ernie has always
done). Each process owns a contiguous block of the mesh's ranks:
`ranks_per_process` of them (its GPUs, or CPU thread ranks), process `p`
the ranks `[p * ranks_per_process, (p + 1) * ranks_per_process)`. The
rendezvous is the runtime's TCP store at `MASTER_ADDR:MASTER_PORT`, served
by process 0; each process's Gloo connections listen on `ERNIE_HOSTNAME`
(default: loopback when process 0 is on loopback, else this host's name).
Bad values are errors naming the variable.

Only the standard library: the launcher imports this module too.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
from dataclasses import dataclass

DEFAULT_PORT = 29500  # torchrun's


class LaunchError(ValueError):
    """The launch environment is inconsistent or malformed (names the variable)."""


@dataclass(frozen=True)
class ParallelEnv:
    """This process's place in the job."""

    rank: int = 0                # this process, 0 .. world_size - 1
    world_size: int = 1          # processes in the job
    local_rank: int = 0          # this process on its host
    local_world_size: int = 1    # processes on this host
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_PORT
    ranks_per_process: int = 1   # mesh ranks each process owns
    source: str = "single process"  # where the values came from
    # The address this process's Gloo connections listen on: ERNIE_HOSTNAME,
    # else loopback when process 0 is on loopback, else this host's name.
    hostname: str = "127.0.0.1"

    @property
    def is_multi_process(self) -> bool:
        return self.world_size > 1

    @property
    def mesh_ranks(self) -> range:
        """The mesh ranks this process owns."""
        first = self.rank * self.ranks_per_process
        return range(first, first + self.ranks_per_process)

    @property
    def store_address(self) -> str:
        """Where the rendezvous store listens: "host:port"."""
        host = f"[{self.master_addr}]" if ":" in self.master_addr else self.master_addr
        return f"{host}:{self.master_port}"

    def __str__(self):
        return (f"process {self.rank} of {self.world_size} (local {self.local_rank} of "
                f"{self.local_world_size}), mesh ranks {self.mesh_ranks.start}.."
                f"{self.mesh_ranks.stop - 1}, store {self.store_address} ({self.source})")


def _integer(name: str, text, least: int, below: int | None = None) -> int:
    if isinstance(text, bool):
        raise LaunchError(f"{name} must be an integer, not {text!r}")
    if isinstance(text, int):
        value = text
    else:
        if not re.fullmatch(r"\s*[+]?\d+\s*", str(text)):
            raise LaunchError(f"{name}={text!r} is not a non-negative integer")
        value = int(str(text))
    if value < least or (below is not None and value >= below):
        bound = f">= {least}" + (f" and < {below}" if below is not None else "")
        raise LaunchError(f"{name}={value} must be {bound}")
    return value


def first_slurm_host(nodelist: str) -> str:
    """The first host of a Slurm node list ("gpu[003-005,007],cpu1" ->
    "gpu003"), as `scontrol show hostnames` would list it first."""
    nodelist = nodelist.strip()
    if not nodelist:
        raise LaunchError("SLURM_JOB_NODELIST is empty")
    depth, end = 0, len(nodelist)
    for i, c in enumerate(nodelist):  # the first top-level entry
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        elif c == "," and depth == 0:
            end = i
            break
    entry = nodelist[:end]
    m = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\](.*)", entry)
    if not m:
        if "[" in entry or "]" in entry:
            raise LaunchError(f"SLURM_JOB_NODELIST={nodelist!r} is not a Slurm node list")
        return entry
    prefix, ranges, suffix = m.groups()
    first = ranges.split(",")[0].split("-")[0]
    if not first.isdigit():
        raise LaunchError(f"SLURM_JOB_NODELIST={nodelist!r} is not a Slurm node list")
    return f"{prefix}{first}{suffix}"


def _port(name: str, text) -> int:
    return _integer(name, text, 1, 65536)


def _from_environment(env) -> tuple[dict, str] | None:
    """The launch variables of the first launcher whose variables are set."""
    if "RANK" in env or "WORLD_SIZE" in env:
        missing = [v for v in ("RANK", "WORLD_SIZE") if v not in env]
        if missing:
            raise LaunchError(f"{' and '.join(missing)} missing: a torchrun-style launch "
                              f"sets RANK and WORLD_SIZE together")
        world = _integer("WORLD_SIZE", env["WORLD_SIZE"], 1)
        values = {"rank": _integer("RANK", env["RANK"], 0, world), "world_size": world,
                  "local_rank": _integer("LOCAL_RANK", env.get("LOCAL_RANK", env["RANK"]), 0),
                  "local_world_size": _integer("LOCAL_WORLD_SIZE",
                                               env.get("LOCAL_WORLD_SIZE", world), 1)}
        source = "ernie's launcher" if env.get("ERNIE_LAUNCHER") else "torchrun's variables"
    elif "SLURM_PROCID" in env:
        world = _integer("SLURM_NTASKS", env.get("SLURM_NTASKS", "1"), 1)
        per_node = env.get("SLURM_NTASKS_PER_NODE", str(world)).split("(")[0].split(",")[0]
        values = {"rank": _integer("SLURM_PROCID", env["SLURM_PROCID"], 0, world),
                  "world_size": world,
                  "local_rank": _integer("SLURM_LOCALID", env.get("SLURM_LOCALID", "0"), 0),
                  "local_world_size": _integer("SLURM_NTASKS_PER_NODE", per_node, 1)}
        if "MASTER_ADDR" not in env and "SLURM_JOB_NODELIST" in env:
            values["master_addr"] = first_slurm_host(env["SLURM_JOB_NODELIST"])
        source = "Slurm's variables"
    elif "OMPI_COMM_WORLD_RANK" in env:
        world = _integer("OMPI_COMM_WORLD_SIZE", env.get("OMPI_COMM_WORLD_SIZE", "1"), 1)
        values = {"rank": _integer("OMPI_COMM_WORLD_RANK", env["OMPI_COMM_WORLD_RANK"], 0, world),
                  "world_size": world,
                  "local_rank": _integer("OMPI_COMM_WORLD_LOCAL_RANK",
                                         env.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"), 0),
                  "local_world_size": _integer("OMPI_COMM_WORLD_LOCAL_SIZE",
                                               env.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1"), 1)}
        if world > 1 and "MASTER_ADDR" not in env:
            raise LaunchError("Open MPI gives no rendezvous host: set MASTER_ADDR (and "
                              "MASTER_PORT) to process 0's host")
        source = "Open MPI's variables"
    else:
        return None
    if "MASTER_ADDR" in env:
        if not env["MASTER_ADDR"].strip():
            raise LaunchError("MASTER_ADDR is empty")
        values["master_addr"] = env["MASTER_ADDR"].strip()
    if "MASTER_PORT" in env:
        values["master_port"] = _port("MASTER_PORT", env["MASTER_PORT"])
    if values["world_size"] > 1 and "master_addr" not in values:
        raise LaunchError(f"{source}: a job of {values['world_size']} processes needs "
                          f"MASTER_ADDR (process 0's host)")
    return values, source


_CURRENT: ParallelEnv | None = None


def init_parallel_env(rank=None, world_size=None, local_rank=None, local_world_size=None,
                      master_addr=None, master_port=None, ranks_per_process=1,
                      environ=None) -> ParallelEnv:
    """Reads this process's place in the job (see the module's docstring)
    and makes it the current one (`parallel_env()`). Explicit arguments win
    over the environment; `environ` (default `os.environ`) is for tests.
    Returns the ParallelEnv."""
    global _CURRENT
    env = os.environ if environ is None else environ
    found = _from_environment(env)
    values, source = found if found else ({}, "single process")
    explicit = {k: v for k, v in (("rank", rank), ("world_size", world_size),
                                  ("local_rank", local_rank),
                                  ("local_world_size", local_world_size),
                                  ("master_addr", master_addr), ("master_port", master_port))
                if v is not None}
    if explicit:
        source = "arguments" if not found else f"arguments over {source}"
        values.update(explicit)
    world = _integer("world_size", values.get("world_size", 1), 1)
    result = ParallelEnv(
        rank=_integer("rank", values.get("rank", 0), 0, world), world_size=world,
        local_rank=_integer("local_rank", values.get("local_rank", 0), 0),
        local_world_size=_integer("local_world_size", values.get("local_world_size", 1), 1),
        master_addr=str(values.get("master_addr", "127.0.0.1")),
        master_port=_port("master_port", values.get("master_port", DEFAULT_PORT)),
        ranks_per_process=_integer("ranks_per_process", ranks_per_process, 1),
        source=source)
    hostname = env.get("ERNIE_HOSTNAME", "").strip()
    if not hostname:
        loopback = result.master_addr in ("localhost", "::1") or \
            result.master_addr.startswith("127.")
        hostname = "127.0.0.1" if loopback or not result.is_multi_process else socket.gethostname()
    result = dataclasses.replace(result, hostname=hostname)
    if result.local_rank >= result.local_world_size:
        raise LaunchError(f"local rank {result.local_rank} is not below the "
                          f"{result.local_world_size} processes of this host ({source})")
    _CURRENT = result
    return result


initialize = init_parallel_env  # jax.distributed's name


def parallel_env() -> ParallelEnv:
    """The current ParallelEnv: init_parallel_env()'s, or this one process."""
    return _CURRENT if _CURRENT is not None else ParallelEnv()

"""The cost model's inputs and answer: devices and clusters as data, and the
step estimate of a compiled module.

Devices and clusters are JSON (docs/architecture.md "The cost model" lists
the fields); the ones ernie ships live in `ernie/hardware/{devices,clusters}`
and are named without their suffix (`load_cluster("dgx_h100")`). The C++
cost model (`--ernie-step-cost`, lib/Cost) reads them and checks every
field; this module only finds the files and builds clusters from parts.

It sits on the compiler's floor (ernie.compile reads a cluster, a
Program estimates itself); `ernie.cost`, on the planning floor, is its
public face and adds the CPU calibration, which compiles programs.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import _ernie

HARDWARE_DIR = Path(__file__).parent / "hardware"
DEVICES_DIR = HARDWARE_DIR / "devices"
CLUSTERS_DIR = HARDWARE_DIR / "clusters"


def devices() -> list[str]:
    """The device descriptions ernie ships."""
    return sorted(p.stem for p in DEVICES_DIR.glob("*.json"))


def clusters() -> list[str]:
    """The cluster descriptions ernie ships."""
    return sorted(p.stem for p in CLUSTERS_DIR.glob("*.json"))


def _read(path: Path) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON: {e}") from None


def _resolve(name_or_path, directory: Path) -> Path:
    p = Path(name_or_path)
    if p.suffix == ".json" or p.exists():
        return p
    shipped = directory / f"{name_or_path}.json"
    if not shipped.exists():
        known = sorted(q.stem for q in directory.glob("*.json"))
        raise ValueError(f"no {directory.name[:-1]} '{name_or_path}' (ernie ships {known}; "
                         f"or give a path to a .json file)")
    return shipped


def load_device(name_or_path) -> dict:
    """A device description: a shipped name ("h100_sxm") or a JSON file."""
    return _read(_resolve(name_or_path, DEVICES_DIR))


def load_cluster(cluster) -> dict:
    """A cluster description with its device inlined: a shipped name
    ("dgx_h100"), a JSON file, or a dict (whose "device" may be a dict, a
    shipped device name or a device file)."""
    if isinstance(cluster, dict):
        spec, base = dict(cluster), Path.cwd()
    else:
        path = _resolve(cluster, CLUSTERS_DIR)
        spec, base = _read(path), path.parent
    device = spec.get("device")
    if isinstance(device, str):
        file = base / device
        spec["device"] = _read(file) if file.suffix == ".json" and file.exists() \
            else load_device(device)
    return spec


def make_cluster(device, nodes: int = 1, devices_per_node: int = 8,
                 intra_node: tuple[float, float] = (450e9, 3e-6),
                 inter_node: tuple[float, float] | None = None, name: str = "",
                 shared_processors: int = 0) -> dict:
    """A cluster from parts: a device (name, file or dict), the node count,
    and each link's (bandwidth in bytes/s each way, latency in s)."""
    spec = {"name": name or f"{nodes} x {devices_per_node}",
            "device": device if isinstance(device, dict) else load_device(device),
            "nodes": nodes, "devices_per_node": devices_per_node,
            "intra_node": {"bandwidth": intra_node[0], "latency": intra_node[1]}}
    if inter_node is not None:
        spec["inter_node"] = {"bandwidth": inter_node[0], "latency": inter_node[1]}
    if shared_processors:
        spec["shared_processors"] = shared_processors
    return spec


def estimate(module, cluster) -> dict:
    """The cost model's estimate of one step of a compiled module (a
    Program's `module`, or module text): step_seconds, compute_seconds, recompute_seconds,
    bubble_seconds, contention_seconds, comm_seconds and
    exposed_comm_seconds per group ("dp", "mp", "dp,mp", "pp"), model_flops
    (every rank's, recomputation excluded), peak_flops, ranks and mfu."""
    spec = load_cluster(cluster)
    where = spec.get("name") or "cluster"
    if not isinstance(module, _ernie.Module):
        module = _ernie.parse_module(module)
    return json.loads(_ernie.estimate_step(module, json.dumps(spec), where, "."))

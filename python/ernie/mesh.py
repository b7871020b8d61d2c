"""Meshes and placements, Paddle's names: `ProcessMesh`, per mesh dimension
`Shard(dim)`, `Replicate()` or `Partial(reduce_type)`, the global mesh
(`set_mesh` / `get_mesh`), and their translation into an `#ernie.sharding`
(tensor dimension d is split by the mesh dimensions that `Shard(d)`, in mesh
order) or Paddle's dims_mapping.

The ground the parallel floor stands on: `ernie.pipeline` reads the global
mesh, `ernie.distributed` plans over meshes and re-exports every name here
(users find them as `ernie.distributed.ProcessMesh`, ...).
"""

from __future__ import annotations

import numpy as np


class ProcessMesh:
    """`ProcessMesh(mesh, dim_names)`: `mesh` is a (nested) list of process
    ids whose shape is the mesh shape."""

    # The compiler's bound on a mesh's rank count (MeshOp::kMaxRanks; the
    # runtime checks the same), so a mesh built here compiles and runs.
    MAX_RANKS = 1 << 20

    def __init__(self, mesh, dim_names=None):
        try:
            ids = np.asarray(mesh)
        except ValueError as e:  # ragged nesting
            raise ValueError(f"ProcessMesh needs a rectangular (nested) list of ids: {e}") from None
        if ids.ndim == 0:
            raise ValueError("ProcessMesh needs at least one dimension")
        if ids.size == 0:
            raise ValueError(f"ProcessMesh dimensions must have at least one process, got shape {list(ids.shape)}")
        if ids.dtype.kind not in "iu":
            raise ValueError(f"ProcessMesh process ids must be integers, got {ids.dtype}")
        if ids.size > self.MAX_RANKS:
            raise ValueError(f"ProcessMesh has {ids.size} processes; at most {self.MAX_RANKS} are supported")
        self.shape = list(ids.shape)
        self.process_ids = [int(i) for i in ids.reshape(-1)]
        if sorted(self.process_ids) != list(range(ids.size)):
            raise ValueError("ProcessMesh process ids must be 0..n-1, each once")
        self.dim_names = list(dim_names) if dim_names else [f"d{i}" for i in range(ids.ndim)]
        if len(self.dim_names) != ids.ndim:
            raise ValueError(f"ProcessMesh has {ids.ndim} dimensions but {len(self.dim_names)} names")
        if not all(isinstance(n, str) and n for n in self.dim_names):
            raise ValueError(f"ProcessMesh dimension names must be non-empty strings, got {self.dim_names}")
        if len(set(self.dim_names)) != len(self.dim_names):
            raise ValueError("ProcessMesh dimension names must differ")

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape))

    def get_dim_size(self, name):
        return self.shape[self.dim_names.index(name)]

    def __repr__(self):
        return f"ProcessMesh(shape={self.shape}, dim_names={self.dim_names})"


_global_mesh = None


def set_mesh(mesh: ProcessMesh):
    global _global_mesh
    _global_mesh = mesh


def get_mesh() -> ProcessMesh | None:
    return _global_mesh


class Placement:
    def is_shard(self, dim=None):
        return False

    def is_replicated(self):
        return False

    def is_partial(self):
        return False


class Shard(Placement):
    def __init__(self, dim: int):
        self.dim = dim

    def is_shard(self, dim=None):
        return dim is None or dim == self.dim

    def get_dim(self):
        return self.dim

    def __eq__(self, other):
        return isinstance(other, Shard) and other.dim == self.dim

    def __repr__(self):
        return f"Shard(dim={self.dim})"


class Replicate(Placement):
    def is_replicated(self):
        return True

    def __eq__(self, other):
        return isinstance(other, Replicate)

    def __repr__(self):
        return "Replicate()"


class ReduceType:
    kRedSum, kRedAvg, kRedMax, kRedMin = "sum", "avg", "max", "min"


class Partial(Placement):
    def __init__(self, reduce_type: str = ReduceType.kRedSum):
        if reduce_type not in ("sum", "avg", "max", "min"):
            raise ValueError(f"Partial reduce_type must be sum, avg, max or min, not {reduce_type!r}")
        self.reduce_type = reduce_type

    def is_partial(self):
        return True

    def __eq__(self, other):
        return isinstance(other, Partial) and other.reduce_type == self.reduce_type

    def __repr__(self):
        return f"Partial({self.reduce_type})"


def _check_placements(mesh: ProcessMesh, placements, shape):
    if len(placements) > mesh.ndim:
        raise ValueError(f"{len(placements)} placements for a {mesh.ndim}-dimensional mesh "
                         f"{mesh.dim_names}")
    placements = list(placements) + [Replicate()] * (mesh.ndim - len(placements))
    for i, p in enumerate(placements):
        if not isinstance(p, Placement):
            raise TypeError(f"placement {i} is {p!r}, not Shard/Replicate/Partial")
        if isinstance(p, Shard):
            if not -len(shape) <= p.dim < len(shape):
                raise ValueError(f"Shard({p.dim}) is out of range for a tensor of rank {len(shape)}")
    # A dimension the mesh does not divide is split unevenly (the last
    # pieces padded, as GSPMD does); config={"even_splits": True} makes the
    # compiler reject it instead.
    return placements


def placements_to_sharding(mesh: ProcessMesh, placements, shape):
    """(mesh name, per-dim axes, partials) for the tracer."""
    placements = _check_placements(mesh, placements, shape)
    dims = [[] for _ in shape]
    partials = []
    for i, p in enumerate(placements):
        if isinstance(p, Shard):
            dims[p.dim % len(shape)].append(mesh.dim_names[i])
        elif isinstance(p, Partial):
            partials.append((mesh.dim_names[i], p.reduce_type))
    return ("mesh", dims, partials)


def placements_to_dims_mapping(placements, ndim):
    """Paddle's (dims_mapping, partial_dims): for each tensor dim the mesh dim
    sharding it or -1, and the mesh dims holding a pending reduction."""
    mapping = [-1] * ndim
    partial = []
    for i, p in enumerate(placements):
        if isinstance(p, Shard):
            d = p.dim % ndim
            if mapping[d] != -1:
                raise ValueError("dims_mapping holds one mesh dim per tensor dim")
            mapping[d] = i
        elif isinstance(p, Partial):
            partial.append(i)
    return mapping, partial


def dims_mapping_to_placements(dims_mapping, mesh_ndim, partial_dims=(), reduce_type="sum"):
    placements = [Replicate() for _ in range(mesh_ndim)]
    for d, m in enumerate(dims_mapping):
        if m >= 0:
            if m >= mesh_ndim:
                raise ValueError(f"dims_mapping names mesh dim {m} of a {mesh_ndim}-d mesh")
            placements[m] = Shard(d)
    for m in partial_dims:
        placements[m] = Partial(reduce_type)
    return placements

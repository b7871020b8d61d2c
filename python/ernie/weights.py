"""Weight files: safetensors (through the runtime's C++ reader and writer)
and Hugging Face model folders.

A Hugging Face folder holds `config.json` and either `model.safetensors` or
several files listed by `model.safetensors.index.json` ({"weight_map":
{name: file}}). Narrow floats are converted exactly (the runtime's
conversions, round to nearest even): `load_file` gives float32 arrays for
BF16/F16/F8 tensors, `save_file` rounds float arrays to the dtype asked.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from collections import namedtuple
from pathlib import Path

import numpy as np

from . import _ernie

# ernie element type <-> safetensors dtype.
SAFETENSORS_DTYPES = {"f64": "F64", "f32": "F32", "f16": "F16", "bf16": "BF16",
                      "f8E4M3FN": "F8_E4M3", "f8E5M2": "F8_E5M2", "i64": "I64", "i32": "I32",
                      "i1": "BOOL"}
_ERNIE_OF = {v: k for k, v in SAFETENSORS_DTYPES.items()}
# Hugging Face's torch_dtype names.
TORCH_DTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "float64": "f64"}
_NARROW = ("bf16", "f8E4M3FN", "f8E5M2")
_NUMPY = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
          "I32": np.int32, "BOOL": np.bool_}


# What a JSON file of a model folder (config.json, an index) may be: its size,
# and how deep its values nest.
MAX_JSON_BYTES = 64 << 20
MAX_JSON_DEPTH = 64
# A safetensors header's size (as the format's reference reader).
MAX_HEADER_BYTES = 100_000_000


def _regular_file(path):
    """Raises OSError naming `path` unless it is a regular file: a FIFO or a
    device would block or never end."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise OSError(f"{path}: cannot open: {e.strerror}") from None
    if not stat.S_ISREG(mode):
        raise OSError(f"{path}: not a regular file")


def _refuse_constant(name):
    raise ValueError(f"{name} is not a JSON number")


def _depth(value, limit, where):
    """Raises ValueError when `value` nests deeper than `limit`."""
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            if d > limit:
                raise ValueError(f"{where}: JSON nested deeper than {limit} levels")
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))


def parse_json(text, where, max_depth=MAX_JSON_DEPTH):
    """The JSON value of `text` (str or bytes); ValueError naming `where` when
    it is not JSON, holds NaN or Infinity, or nests deeper than `max_depth`."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError(f"{where}: JSON nested deeper than {max_depth} levels") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{where}: not valid JSON: {e}") from None
    _depth(value, max_depth, where)
    return value


def read_json(path, max_bytes=MAX_JSON_BYTES):
    """The JSON value of file `path`, within the limits above (parse_json);
    OSError for a missing or non-regular file."""
    _regular_file(path)
    size = os.path.getsize(path)
    if size > max_bytes:
        raise ValueError(f"{path}: {size} bytes, over the limit of {max_bytes} for a JSON file")
    with open(path, "rb") as f:
        return parse_json(f.read(max_bytes + 1), str(path))


def load_file(path, raw=False):
    """{name: array} of a safetensors file, and its metadata. BF16 and F8
    tensors come as float32 (exact), or as raw bits with raw=True. A damaged
    file is a ValueError naming the file and the tensor."""
    tensors, metadata = _ernie.read_safetensors(str(path))
    out = {}
    for name, (dtype, array) in tensors.items():
        kind = _ERNIE_OF[dtype]
        if kind in _NARROW and not raw:
            array = _ernie.convert_float(array, kind, "f32").reshape(array.shape)
        out[name] = array
    return out, metadata


def read_tensors(path, names):
    """{name: array} of the named tensors of a safetensors file, reading
    their bytes only (the format's JSON header gives each one's offsets):
    for small tensors in a large file. Narrow floats come as float32. A
    damaged file is a ValueError naming the file and the tensor."""
    _regular_file(path)
    out = {}
    file_size = os.path.getsize(path)
    with open(path, "rb") as f:
        if file_size < 8:
            raise ValueError(f"{path}: too short for a safetensors header ({file_size} bytes)")
        size = int.from_bytes(f.read(8), "little")
        if size > min(MAX_HEADER_BYTES, file_size - 8):
            raise ValueError(f"{path}: header length {size} does not fit the file of "
                             f"{file_size} bytes")
        header = parse_json(f.read(size), f"{path}: the header", max_depth=3)
        if not isinstance(header, dict):
            raise ValueError(f"{path}: the header is not a JSON object")
        data_bytes = file_size - 8 - size
        for name in names:
            entry = header.get(name)
            if entry is None or name == "__metadata__":
                raise ValueError(f"{path}: no tensor '{name}'")
            kind, shape, start, end = _header_entry(path, name, entry, data_bytes)
            f.seek(8 + size + start)
            bits = np.uint16 if kind == "bf16" else np.uint8
            raw = np.frombuffer(f.read(end - start), _NUMPY.get(entry["dtype"], bits)).copy()
            if kind in _NARROW:
                raw = _ernie.convert_float(raw, kind, "f32")
            out[name] = raw.reshape(shape)
    return out


def _header_entry(path, name, entry, data_bytes):
    """(ernie type, shape, begin, end) of a safetensors header entry, each
    checked against the data region; ValueError naming the tensor."""
    where = f"{path}: tensor '{name}'"
    if not isinstance(entry, dict):
        raise ValueError(f"{where} is not a dtype, shape and data_offsets")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in _ERNIE_OF:
        raise ValueError(f"{where} has dtype {str(dtype)[:40]!r}, which ernie does not read")
    if (not isinstance(shape, list) or len(shape) > 64
            or not all(type(d) is int and d >= 0 for d in shape)):
        raise ValueError(f"{where} has a shape that is not a list of sizes")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(type(o) is int and o >= 0 for o in offsets)):
        raise ValueError(f"{where} has data_offsets that are not [begin, end)")
    begin, end = offsets
    itemsize = 1 if dtype in ("BOOL", "F8_E4M3", "F8_E5M2") else (
        2 if dtype in ("F16", "BF16") else 8 if dtype in ("F64", "I64") else 4)
    if not begin <= end <= data_bytes or end - begin != math.prod(shape) * itemsize:
        raise ValueError(f"{where} has data_offsets [{begin}, {end}) that do not hold its "
                         f"shape {shape} within the {data_bytes} data bytes")
    return _ERNIE_OF[dtype], shape, begin, end


def file_dtypes(path):
    """{name: ernie element type} of a safetensors file."""
    tensors, _ = _ernie.safetensors_header(str(path))
    return {name: _ERNIE_OF[dtype] for name, (dtype, _) in tensors.items()}


def save_file(tensors: dict, path, metadata=None, dtype=None):
    """Writes {name: array} in order. Float arrays are written as `dtype`
    (an ernie element type; default: each array's own), rounded exactly;
    integer and bool arrays as they are."""
    items = []
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        kind = {np.float64: "f64", np.float32: "f32", np.float16: "f16", np.int64: "i64",
                np.int32: "i32", np.bool_: "i1"}.get(array.dtype.type)
        if kind is None:
            raise TypeError(f"'{name}': cannot write a {array.dtype} array")
        if dtype is not None and array.dtype.kind == "f":
            kind = dtype
        if kind in _NARROW:
            bits = _ernie.convert_float(np.ascontiguousarray(array, dtype=np.float32), "f32", kind)
            array = bits.reshape(array.shape)
        elif array.dtype != _NUMPY[SAFETENSORS_DTYPES[kind]]:
            array = array.astype(_NUMPY[SAFETENSORS_DTYPES[kind]])
        items.append((name, SAFETENSORS_DTYPES[kind], array))
    _ernie.write_safetensors(str(path), items, {k: str(v) for k, v in (metadata or {}).items()})


HfTensor = namedtuple("HfTensor", "name shape state offsets transposed")
HfTensor.__doc__ = """A tensor of a Hugging Face folder (`name`, `shape`) and where it lies in
an ernie state: the block at `offsets` (past the tensor's rank they pick
an expert of a stack), with its last two dimensions swapped when
`transposed` ([out, in] Linears)."""


def hf_layout(hf_config: dict, states) -> list:
    """The Hugging Face tensors (HfTensor) of ernie states [(name, shape)]
    of the model `hf_config` (a config.json) describes: the runtime's rule
    table (runtime/include/ernie/runtime/HfLayout.h), the one
    `ernie-ckpt export-hf` and `import-hf` use. Slots other than the
    aux-free selection bias are skipped; a state the family has no tensor
    for is a ValueError naming it."""
    return [HfTensor(name, tuple(shape), state, tuple(offsets), transposed)
            for name, shape, state, offsets, transposed in _ernie.hf_layout(
                json.dumps(hf_config), [(n, list(s)) for n, s in states])]


def folder_weight_map(folder, index, tensors) -> dict:
    """{state: [(file, tensor, offsets, transposed)]} (Program.load_weights'
    weight map) of Hugging Face tensors `tensors` (HfTensor) in a folder's
    index (hf_folder_index's): a tensor the folder lacks, or holds in
    another shape, is a ValueError naming it (and both shapes)."""
    out = {}
    for t in tensors:
        if t.name not in index:
            raise ValueError(f"{folder}: no tensor '{t.name}' (for ernie's '{t.state}')")
        path, _, shape = index[t.name]
        if tuple(shape) != t.shape:
            raise ValueError(f"{path}: tensor '{t.name}' has shape {list(shape)}, the config "
                             f"makes it {list(t.shape)}")
        out.setdefault(t.state, []).append((path, t.name, list(t.offsets), t.transposed))
    return out


def is_fused(index) -> str | None:
    """The first tensor of a folder index (hf_folder_index's) in
    transformers' fused expert layout (`save_original_format=False`:
    `experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I]), or
    None."""
    return next((n for n, (_, _, shape) in index.items() if len(shape) == 3 and
                 n.endswith((".experts.gate_up_proj", ".experts.down_proj"))), None)


def hf_folder_states(folder) -> dict:
    """{ernie state: float32 array} of a Hugging Face folder, by the
    runtime's rule table in its reading direction (the one `ernie-ckpt
    import-hf` uses): any layout it reads, transformers' fused experts
    included. Each tensor's bytes are read once per block it fills."""
    config, index = hf_folder_index(folder)
    states, placed = _ernie.hf_states(json.dumps(config), [(n, list(shape))
                                                          for n, (_, _, shape) in index.items()])
    out = {name: np.zeros(shape, np.float32) for name, shape in states}
    for name, shape, state, offsets, transposed, source, source_shape in placed:
        value = read_tensors(index[name][0], [name])[name]
        if source_shape:
            value = value[tuple(slice(o, o + n) for o, n in zip(source, source_shape))]
        if transposed:
            value = np.swapaxes(value, -1, -2)
        target = out[state]
        if value.size == target.size and value.ndim != target.ndim:  # [1, E] of [E]
            target[...] = value.reshape(target.shape)
            continue
        lead = len(offsets) - value.ndim
        where = tuple(offsets[:lead]) + tuple(slice(o, o + n)
                                              for o, n in zip(offsets[lead:], value.shape))
        target[where] = value
    return out


def fused_folder_states(folder, index, params) -> dict:
    """hf_folder_states of a folder in transformers' fused layout, each of
    `params` ({name: Parameter}) checked against its shape. A model built
    under ernie.nn.abstract() reads per-expert tensors rank by rank, which
    this layout lacks: refused, naming the ways that work."""
    fused = is_fused(index)
    if all(p.value is None for p in params.values()):
        raise ValueError(f"{folder}: tensor '{fused}' holds its experts fused (transformers' "
                         f"save_original_format=False), which ernie reads whole, not rank by "
                         f"rank: load it outside ernie.nn.abstract(), or make a checkpoint of "
                         f"it with `ernie-ckpt import-hf` and Program.load_checkpoint it")
    states = hf_folder_states(folder)
    for name, p in params.items():
        if name not in states:
            raise ValueError(f"{folder}: no tensor for ernie's '{name}'")
        if states[name].shape != tuple(p.shape):
            raise ValueError(f"{folder}: ernie's '{name}' is {list(states[name].shape)} in the "
                             f"folder, the config makes it {list(p.shape)}")
    return states


def hf_folder_index(folder):
    """(config dict, {tensor name: (file path, ernie element type, shape)})
    of a Hugging Face model folder, from config.json, the index and the
    files' headers; no tensor data is read."""
    folder = Path(folder)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{folder}: no config.json (not a Hugging Face model folder)")
    config = read_json(config_path)
    if not isinstance(config, dict):
        raise ValueError(f"{config_path}: not a JSON object")
    index = folder / "model.safetensors.index.json"
    if index.exists():
        listed = read_json(index)
        weight_map = listed.get("weight_map") if isinstance(listed, dict) else None
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index}: no weight_map")
        bad = [n for n, f in weight_map.items() if not isinstance(f, str) or not f]
        if bad:
            raise ValueError(f"{index}: tensor '{bad[0]}' names no file")
        files = sorted(set(weight_map.values()))
    elif (folder / "model.safetensors").is_file():
        weight_map, files = None, ["model.safetensors"]
    else:
        raise FileNotFoundError(f"{folder}: neither model.safetensors nor "
                                f"model.safetensors.index.json")
    tensors = {}
    for file in files:
        path = folder / file
        if Path(file).is_absolute() or ".." in Path(file).parts:
            raise ValueError(f"{index}: weight file {file!r} is outside the folder")
        header, _ = _ernie.safetensors_header(str(path))
        for name, (dtype, shape) in header.items():
            if weight_map is not None and weight_map.get(name) != file:
                raise ValueError(f"{path}: tensor '{name}' is not listed for this file in "
                                 f"{index.name}")
            if name in tensors:
                raise ValueError(f"{path}: tensor '{name}' appears in two files")
            tensors[name] = (str(path), _ERNIE_OF[dtype], tuple(shape))
    if weight_map is not None:
        missing = sorted(set(weight_map) - set(tensors))
        if missing:
            raise ValueError(f"{index}: tensors listed but in no file: {missing[:5]}")
    return config, tensors


def read_hf_folder(folder):
    """(config dict, {name: float array or int array}, {name: file dtype}) of
    a Hugging Face model folder (hf_folder_index, then every file's data)."""
    config, index = hf_folder_index(folder)
    weights = {}
    for path in sorted({path for path, _, _ in index.values()}):
        weights.update(load_file(path)[0])
    return config, weights, {name: dtype for name, (_, dtype, _) in index.items()}


def write_hf_folder(folder, config: dict, weights: dict, dtype: str, max_shard_bytes=None):
    """Writes `config.json` and the weights as `model.safetensors`, or, past
    `max_shard_bytes` per file, as numbered shards with an index, Hugging
    Face's layout. Files are written under temporary names and renamed, so a
    folder is never left with a half-written weight file under its final name."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    itemsize = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2}[dtype]
    shards, current, size = [], {}, 0
    for name, value in weights.items():
        nbytes = int(np.prod(value.shape)) * (itemsize if value.dtype.kind == "f" else value.itemsize)
        if current and max_shard_bytes is not None and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = value
        size += nbytes
    shards.append(current)
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    for name, shard in zip(names, shards):
        tmp = folder / (name + ".tmp")
        save_file(shard, tmp, metadata={"format": "pt"}, dtype=dtype)
        os.replace(tmp, folder / name)
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(
                     int(np.prod(v.shape)) * itemsize for s in shards for v in s.values())},
                 "weight_map": {n: f for f, s in zip(names, shards) for n in s}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

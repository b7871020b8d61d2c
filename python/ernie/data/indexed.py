"""ernie/data/indexed.py - Megatron-LM's indexed dataset (`.bin` / `.idx`):
a memory-mapped reader that validates before use, and a streaming writer.

The layout, as megatron/core/datasets/indexed_dataset.py writes it (all
little-endian):

    PREFIX.idx  b"MMIDIDX\\x00\\x00"            9 bytes, the magic
                version             <Q       always 1
                dtype code          <B       DTYPE_CODES below
                sequence count S    <Q
                document count D    <Q       entries of the document index (documents + 1)
                sequence lengths    S x <i4  tokens per sequence
                sequence pointers   S x <i8  byte offset of each sequence in .bin
                document index      D x <i8  0, then per document the sequence index after it
                (sequence modes     S x <i1  multimodal datasets only: refused here)
    PREFIX.bin  the tokens, sequence after sequence, in the dtype above

Megatron's preprocessing writes one sequence per document; a document is the
sequences document_index[d] .. document_index[d + 1]. Megatron's writer lays
the sequences out back to back, and this reader requires it: a pointer that
is not the previous one plus its length catches an `.idx` from another file.

The format records no token range, so `IndexedDataset.token_range` scans the
tokens once in chunks and caches (min, max) in PREFIX.tokens.json next to the
files (keyed by both files' sizes and modification times); ernie's writer
writes that file as it finishes.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np

from ..weights import read_json

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, document entries
DTYPE_CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64,
               6: np.float64, 7: np.float32, 8: np.uint16}
CODE_OF = {np.dtype(t): c for c, t in DTYPE_CODES.items()}
STATS_FORMAT = "ernie.data token range 1"
# Tokens per chunk when scanning .bin for its range (64 MB of int32).
SCAN_CHUNK = 1 << 24


def optimal_dtype(vocab_size: int):
    """The token dtype Megatron chooses for a vocabulary of `vocab_size`
    (DType.optimal_dtype): uint16 below 65500, else int32."""
    return np.uint16 if vocab_size < 65500 else np.int32


def paths(prefix) -> tuple:
    """(PREFIX.idx, PREFIX.bin, PREFIX.tokens.json) of a dataset prefix."""
    prefix = os.fspath(prefix)
    return prefix + ".idx", prefix + ".bin", prefix + ".tokens.json"


def _stamp(path) -> list:
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns]


class IndexedDataset:
    """The dataset PREFIX.idx / PREFIX.bin, memory-mapped (nothing read whole
    but the index's arrays, which numpy pages in as they are used).

    ds = IndexedDataset("corpus")
    len(ds)            # sequences;  ds[i]: the tokens of sequence i (a view)
    ds.documents       # documents;  ds.document(d): its tokens (a view)
    ds.doc_starts, ds.doc_ends   # each document's token range in ds.tokens

    Every inconsistency between the header, the arrays and the files' sizes
    is a ValueError naming the file and the field, raised here.
    """

    def __init__(self, prefix):
        self.prefix = os.fspath(prefix)
        self.idx_path, self.bin_path, self.stats_path = paths(prefix)
        for path in (self.idx_path, self.bin_path):
            if not os.path.isfile(path):
                raise ValueError(f"{path}: no such file (dataset prefix {self.prefix!r})")
        idx_size = os.path.getsize(self.idx_path)
        bin_size = os.path.getsize(self.bin_path)
        idx = self.idx_path
        if idx_size < HEADER.size:
            raise ValueError(f"{idx}: header: {idx_size} bytes, shorter than the "
                             f"{HEADER.size} of a Megatron index header")
        with open(idx, "rb") as f:
            magic, version, code, n_seq, n_doc = HEADER.unpack(f.read(HEADER.size))
        if magic != MAGIC:
            raise ValueError(f"{idx}: magic: {magic!r}, not Megatron's {MAGIC!r}")
        if version != VERSION:
            raise ValueError(f"{idx}: version: {version}, only version {VERSION} is known")
        if code not in DTYPE_CODES:
            raise ValueError(f"{idx}: dtype code: {code}, not one of "
                             f"{sorted(DTYPE_CODES)} (Megatron's DType)")
        self.dtype = np.dtype(DTYPE_CODES[code])
        if self.dtype.kind == "f":
            raise ValueError(f"{idx}: dtype code: {code} ({self.dtype}) holds no token ids")
        expected = HEADER.size + n_seq * (4 + 8) + n_doc * 8
        if idx_size == expected + n_seq and n_seq:
            raise ValueError(f"{idx}: sequence modes: a multimodal dataset (one mode byte per "
                             f"sequence after the document index); only token datasets are read")
        if idx_size != expected:
            raise ValueError(f"{idx}: sequence count {n_seq} and document count {n_doc} "
                             f"describe a {expected}-byte index; the file has {idx_size} bytes "
                             f"(truncated, or a corrupted header)")
        if n_doc < 1:
            raise ValueError(f"{idx}: document count: 0, the document index needs its leading 0")
        itemsize = self.dtype.itemsize
        mm = np.memmap(idx, dtype=np.uint8, mode="r")
        offset = HEADER.size
        self.sequence_lengths = mm[offset:offset + 4 * n_seq].view("<i4")
        offset += 4 * n_seq
        self.sequence_pointers = mm[offset:offset + 8 * n_seq].view("<i8")
        offset += 8 * n_seq
        self.document_index = mm[offset:offset + 8 * n_doc].view("<i8")

        lengths, pointers, docs = self.sequence_lengths, self.sequence_pointers, \
            self.document_index
        if n_seq and lengths.min() < 0:
            i = int(np.argmax(lengths < 0))
            raise ValueError(f"{idx}: sequence lengths: sequence {i} has length {lengths[i]}")
        # Megatron's writer: each pointer is the previous one plus its length.
        starts = np.zeros(n_seq, np.int64)
        np.cumsum(lengths[:-1], dtype=np.int64, out=starts[1:])
        starts *= itemsize
        if n_seq and not np.array_equal(pointers, starts):
            i = int(np.argmax(pointers != starts))
            raise ValueError(f"{idx}: sequence pointers: sequence {i} starts at byte "
                             f"{pointers[i]}, not {starts[i]} where the one before it ends "
                             f"(an index written for another .bin, or corrupted)")
        n_tokens = int(starts[-1] // itemsize + lengths[-1]) if n_seq else 0
        if bin_size != n_tokens * itemsize:
            what = "empty (0 bytes)" if bin_size == 0 else f"{bin_size} bytes"
            raise ValueError(f"{self.bin_path}: {what}, but {idx} (sequence lengths) describes "
                             f"{n_tokens} tokens of {self.dtype} = {n_tokens * itemsize} bytes "
                             f"(truncated, or an index from another file)")
        if docs[0] != 0:
            raise ValueError(f"{idx}: document index: starts at {docs[0]}, not 0")
        if docs[-1] != n_seq:
            raise ValueError(f"{idx}: document index: ends at {docs[-1]}, not at the "
                             f"sequence count {n_seq}")
        steps = np.diff(docs)
        if steps.size and steps.min() < 0:
            d = int(np.argmax(steps < 0))
            raise ValueError(f"{idx}: document index: not monotone, entry {d + 1} "
                             f"({docs[d + 1]}) is below entry {d} ({docs[d]})")

        self.documents = n_doc - 1
        self.n_tokens = n_tokens
        self.tokens = (np.memmap(self.bin_path, dtype=self.dtype, mode="r") if n_tokens
                       else np.zeros(0, self.dtype))
        # Token offsets: sequence i is tokens[seq_starts[i]:seq_starts[i] + lengths[i]].
        self.seq_starts = starts // itemsize
        seq_bounds = np.append(self.seq_starts, n_tokens)
        self.doc_starts = seq_bounds[docs[:-1]]
        self.doc_ends = seq_bounds[docs[1:]]

    def __len__(self) -> int:
        return len(self.sequence_lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        start = self.seq_starts[i]
        return self.tokens[start:start + self.sequence_lengths[i]]

    def document(self, d: int) -> np.ndarray:
        if not 0 <= d < self.documents:
            raise IndexError(f"{self.prefix}: document {d} of {self.documents}")
        return self.tokens[self.doc_starts[d]:self.doc_ends[d]]

    def token_range(self) -> tuple:
        """(smallest, largest) token id, or (0, -1) for no tokens: from
        PREFIX.tokens.json when it describes these files, else by one scan in
        chunks of SCAN_CHUNK tokens, cached there (when the folder is writable)."""
        stamp = {"idx": _stamp(self.idx_path), "bin": _stamp(self.bin_path)}
        if os.path.isfile(self.stats_path):
            try:
                stats = read_json(self.stats_path)
            except (OSError, ValueError):
                stats = None
            if (isinstance(stats, dict) and stats.get("format") == STATS_FORMAT
                    and stats.get("files") == stamp):
                return int(stats["min_token"]), int(stats["max_token"])
        lo, hi = 0, -1
        for start in range(0, self.n_tokens, SCAN_CHUNK):
            chunk = self.tokens[start:start + SCAN_CHUNK]
            lo = int(chunk.min()) if start == 0 else min(lo, int(chunk.min()))
            hi = max(hi, int(chunk.max()))
        write_stats(self.prefix, lo, hi)
        return lo, hi

    def check_vocab(self, vocab_size: int) -> None:
        """ValueError naming the file unless every token id is in [0, vocab_size)."""
        lo, hi = self.token_range()
        if hi >= vocab_size:
            raise ValueError(f"{self.bin_path}: token id {hi} is outside the model's vocabulary "
                             f"of {vocab_size} (a dataset tokenized for another vocabulary?)")
        if lo < 0:
            raise ValueError(f"{self.bin_path}: token id {lo} is negative")


def write_stats(prefix, lo: int, hi: int) -> None:
    """Records the token range of the dataset `prefix` in PREFIX.tokens.json;
    a folder that cannot be written is no error (the next reader scans)."""
    idx_path, bin_path, stats_path = paths(prefix)
    stats = {"format": STATS_FORMAT, "min_token": lo, "max_token": hi,
             "files": {"idx": _stamp(idx_path), "bin": _stamp(bin_path)}}
    try:
        with open(stats_path + ".partial", "w") as f:
            json.dump(stats, f)
        os.replace(stats_path + ".partial", stats_path)
    except OSError:
        pass


class IndexedDatasetBuilder:
    """Writes PREFIX.bin / PREFIX.idx as Megatron does, streaming: tokens go
    to disk as documents arrive; only one length per document stays in
    memory. The files appear under their names at `finalize` (written as
    PREFIX.bin.partial / .idx.partial until then).

    with IndexedDatasetBuilder("corpus", np.uint16) as b:
        b.add_document(tokens)
    """

    def __init__(self, prefix, dtype):
        self.prefix = os.fspath(prefix)
        self.dtype = np.dtype(dtype)
        if self.dtype not in CODE_OF or self.dtype.kind == "f":
            names = ", ".join(str(t) for t in CODE_OF if t.kind != "f")
            raise ValueError(f"{self.prefix}: dtype {self.dtype} is not an integer dtype of "
                             f"Megatron's format ({names})")
        self.idx_path, self.bin_path, self.stats_path = paths(prefix)
        self._info = np.iinfo(self.dtype)
        self._lengths = []
        self._bin = open(self.bin_path + ".partial", "wb")
        self.n_tokens = 0
        self.min_token, self.max_token = 0, -1

    def add_document(self, tokens) -> None:
        """Appends one document as one sequence; ValueError when a token does
        not fit the dtype (nothing would wrap silently)."""
        tokens = np.asarray(tokens)
        if tokens.ndim != 1 or (tokens.size and tokens.dtype.kind not in "iu"):
            raise ValueError(f"{self.prefix}: a document is a 1-D array of integer token ids, "
                             f"not {tokens.dtype} of shape {tokens.shape}")
        if tokens.size:
            lo, hi = int(tokens.min()), int(tokens.max())
            if lo < self._info.min or hi > self._info.max:
                bad = lo if lo < self._info.min else hi
                raise ValueError(f"{self.prefix}: token id {bad} does not fit {self.dtype}")
            first = self.n_tokens == 0
            self.min_token = lo if first else min(self.min_token, lo)
            self.max_token = max(self.max_token, hi)
        if len(tokens) > np.iinfo(np.int32).max:
            raise ValueError(f"{self.prefix}: a document of {len(tokens)} tokens exceeds "
                             f"the format's int32 sequence length")
        self._bin.write(tokens.astype(self.dtype.newbyteorder("<"), copy=False).tobytes())
        self._lengths.append(len(tokens))
        self.n_tokens += len(tokens)

    def finalize(self) -> None:
        """Writes the index and moves both files to their names."""
        self._bin.close()
        lengths = np.asarray(self._lengths, dtype="<i4")
        pointers = np.zeros(len(lengths), "<i8")
        np.cumsum(lengths[:-1], dtype=np.int64, out=pointers[1:])
        pointers *= self.dtype.itemsize
        documents = np.arange(len(lengths) + 1, dtype="<i8")  # one sequence per document
        with open(self.idx_path + ".partial", "wb") as f:
            f.write(HEADER.pack(MAGIC, VERSION, CODE_OF[self.dtype], len(lengths),
                                len(documents)))
            f.write(lengths.tobytes())
            f.write(pointers.tobytes())
            f.write(documents.tobytes())
        os.replace(self.bin_path + ".partial", self.bin_path)
        os.replace(self.idx_path + ".partial", self.idx_path)
        write_stats(self.prefix, self.min_token, self.max_token)

    def abort(self) -> None:
        """Drops what was written."""
        self._bin.close()
        for path in (self.bin_path + ".partial", self.idx_path + ".partial"):
            if os.path.exists(path):
                os.remove(path)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.finalize()
        else:
            self.abort()

"""ernie/data/sampler.py - documents packed into fixed-length samples, one
global order of them, and a prefetching loader of a data-parallel rank's rows.

The order is a function of the dataset, the split, the seed and seq_len,
nothing else: global sample g belongs to epoch e = g // samples_per_epoch;
epoch e lays the split's documents end to end in an order shuffled by (seed,
e) (an EOS after each document that does not end with one, when eos_id is
given), cuts that stream into samples of seq_len + 1 tokens overlapping by
one (sample k is stream[k*seq_len : (k+1)*seq_len + 1], so inputs and labels
are one shift apart, as Megatron's GPTDataset), and visits them in an order
shuffled by (seed, e). Step s of global batch B consumes samples
[s*B, (s+1)*B); data-parallel rank r of `world` takes the r-th contiguous
block of B / world of them - the block ernie's dp split of the batch gives
that rank - so any dp degree sees the same samples in the same order.
"""

from __future__ import annotations

import queue
import threading
from collections import OrderedDict

import numpy as np

from .indexed import IndexedDataset

SPLITS = ("train", "valid")
POSITION_KEYS = ("epoch", "step", "sample", "global_batch", "seed", "seq_len", "split")


class PackedSamples:
    """The samples of one split of `dataset` (an IndexedDataset or a prefix).

    split / valid_fraction: documents go to "valid" or "train" by a
        permutation under `seed` (round(valid_fraction * documents) of them,
        at least one each when 0 < valid_fraction < 1); empty documents to
        neither.
    eos_id: appended after each document that does not end with it (None:
        documents are concatenated as they are).
    vocab_size: every token id and eos_id must be below it, checked here
        (IndexedDataset.check_vocab: one cached scan of the tokens).
    """

    def __init__(self, dataset, seq_len: int, *, split: str = "train",
                 valid_fraction: float = 0.0, seed: int = 0, eos_id: int | None = None,
                 vocab_size: int | None = None, dtype=np.int64):
        if not isinstance(dataset, IndexedDataset):
            dataset = IndexedDataset(dataset)
        self.dataset = dataset
        where = dataset.prefix
        if split not in SPLITS:
            raise ValueError(f"{where}: split {split!r} is not one of {SPLITS}")
        if not 0.0 <= valid_fraction < 1.0:
            raise ValueError(f"{where}: valid_fraction {valid_fraction} is not in [0, 1)")
        if not isinstance(seq_len, (int, np.integer)) or seq_len < 1:
            raise ValueError(f"{where}: seq_len {seq_len!r} is not a positive integer")
        if vocab_size is not None:
            dataset.check_vocab(vocab_size)
            if eos_id is not None and not 0 <= eos_id < vocab_size:
                raise ValueError(f"{where}: eos_id {eos_id} is outside the vocabulary "
                                 f"of {vocab_size}")
        self.seq_len, self.seed, self.split = int(seq_len), int(seed), split
        self.valid_fraction, self.eos_id, self.dtype = valid_fraction, eos_id, np.dtype(dtype)

        starts, ends = dataset.doc_starts, dataset.doc_ends
        nonempty = np.flatnonzero(ends > starts)
        order = np.random.default_rng([self.seed, 0]).permutation(nonempty)
        n_valid = 0
        if valid_fraction > 0:
            if len(order) < 2:
                raise ValueError(f"{where}: {len(order)} non-empty document(s), too few to "
                                 f"split into train and valid")
            n_valid = min(max(1, round(valid_fraction * len(order))), len(order) - 1)
        mine = order[:n_valid] if split == "valid" else order[n_valid:]
        #: The documents of this split, by index in the dataset.
        self.documents = np.sort(mine)
        self._starts = starts[self.documents]
        self._lengths = ends[self.documents] - self._starts
        if eos_id is None:
            self._eos = np.zeros(len(self.documents), np.int64)
        else:
            last = dataset.tokens[ends[self.documents] - 1] if len(self.documents) else []
            self._eos = (np.asarray(last) != eos_id).astype(np.int64)
        stream = int(self._lengths.sum() + self._eos.sum())
        self.tokens_per_epoch = stream
        self.samples_per_epoch = max(stream - 1, 0) // self.seq_len
        if self.samples_per_epoch == 0:
            raise ValueError(f"{where}: the {split} split holds {stream} tokens in "
                             f"{len(self.documents)} documents, not one sample of "
                             f"seq_len + 1 = {self.seq_len + 1}")
        self._epochs = OrderedDict()  # epoch -> (document order, stream offsets, sample order)
        self._lock = threading.Lock()

    def _epoch(self, e: int):
        with self._lock:
            if e in self._epochs:
                self._epochs.move_to_end(e)
                return self._epochs[e]
            docs = np.random.default_rng([self.seed, 1, e]).permutation(len(self.documents))
            offsets = np.zeros(len(docs) + 1, np.int64)
            np.cumsum(self._lengths[docs] + self._eos[docs], out=offsets[1:])
            samples = np.random.default_rng([self.seed, 2, e]).permutation(
                self.samples_per_epoch)
            self._epochs[e] = (docs, offsets, samples)
            while len(self._epochs) > 2:
                self._epochs.popitem(last=False)
            return self._epochs[e]

    def sample_id(self, g: int) -> int:
        """The identity of global sample g's content: e * samples_per_epoch + k,
        k its packed index in epoch e's stream (what a log of samples shows)."""
        e, i = divmod(int(g), self.samples_per_epoch)
        return e * self.samples_per_epoch + int(self._epoch(e)[2][i])

    def sample(self, g: int) -> np.ndarray:
        """Global sample g: seq_len + 1 tokens."""
        if g < 0:
            raise IndexError(f"{self.dataset.prefix}: sample {g}")
        e, i = divmod(int(g), self.samples_per_epoch)
        docs, offsets, samples = self._epoch(e)
        begin = int(samples[i]) * self.seq_len
        end = begin + self.seq_len + 1
        out = np.empty(self.seq_len + 1, self.dtype)
        j = int(np.searchsorted(offsets, begin, side="right")) - 1
        filled, tokens = 0, self.dataset.tokens
        while filled < len(out):
            d = docs[j]
            at = begin + filled - int(offsets[j])  # offset inside document j's stream
            length = int(self._lengths[d])
            if at < length:
                n = min(length - at, len(out) - filled)
                start = int(self._starts[d]) + at
                out[filled:filled + n] = tokens[start:start + n]
                filled += n
            else:  # the EOS after the document
                out[filled] = self.eos_id
                filled += 1
            if begin + filled >= offsets[j + 1]:
                j += 1
        return out

    def rows_for(self, step: int, global_batch: int, rank: int = 0, world: int = 1) -> np.ndarray:
        """The global sample indices data-parallel rank `rank` of `world`
        consumes at `step`: its contiguous block of [step*B, (step+1)*B)."""
        if global_batch < 1 or world < 1 or global_batch % world:
            raise ValueError(f"global batch {global_batch} does not divide among {world} "
                             f"data-parallel ranks")
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not one of the {world} data-parallel ranks")
        per = global_batch // world
        first = step * global_batch + rank * per
        return np.arange(first, first + per, dtype=np.int64)

    def batch(self, rows) -> np.ndarray:
        """The samples of global indices `rows`: (len(rows), seq_len + 1)."""
        return np.stack([self.sample(g) for g in rows]) if len(rows) else \
            np.zeros((0, self.seq_len + 1), self.dtype)


class Batch:
    """One step's rows of one process: `tokens` (rows, seq_len + 1), their
    global sample indices `rows`; `inputs` and `labels` are one shift apart
    (labels pre-shifted: a model of ernie.models takes them with
    `pre_shifted_labels=True`)."""

    __slots__ = ("step", "rows", "tokens")

    def __init__(self, step, rows, tokens):
        self.step, self.rows, self.tokens = step, rows, tokens

    @property
    def inputs(self) -> np.ndarray:
        return self.tokens[:, :-1]

    @property
    def labels(self) -> np.ndarray:
        return self.tokens[:, 1:]


class DataLoader:
    """Iterates the batches of the data-parallel ranks `ranks` of `world`
    (rows in rank order), from step `start_step`, with a background thread
    preparing up to `prefetch` batches ahead.

    loader = DataLoader(samples, global_batch=32, ranks=[2, 3], world=8)
    for batch in loader: ...                # batch.inputs, batch.labels
    state = loader.position()               # JSON: in the checkpoint
    loader = DataLoader.from_position(samples, state, world=4, ranks=[1])
    loader = DataLoader(samples, 32, positions=local_batch(program))  # a job's process

    `position()` is where the next batch starts; a loader made from it on
    any dp degree yields the batches the first would have yielded next.
    """

    def __init__(self, samples: PackedSamples, global_batch: int, *, ranks=(0,), world: int = 1,
                 start_step: int = 0, prefetch: int = 2, steps: int | None = None,
                 positions=None):
        self.samples, self.global_batch, self.world = samples, int(global_batch), int(world)
        self.ranks = [int(r) for r in ranks]
        for r in self.ranks:
            samples.rows_for(0, self.global_batch, r, self.world)  # validates
        # The rows of each global batch this process reads, by position in
        # the batch (ernie.distributed.local_batch(program)); None: those
        # of `ranks`.
        self.positions = None
        if positions is not None:
            self.positions = np.asarray(positions, dtype=np.int64)
            if self.positions.ndim != 1 or (self.positions.size and (
                    self.positions.min() < 0 or self.positions.max() >= self.global_batch)):
                raise ValueError(f"positions must list rows of the global batch of "
                                 f"{self.global_batch}, not {self.positions.tolist()[:8]}")
        self.next_step = int(start_step)
        self._end = None if steps is None else self.next_step + int(steps)
        self._queue = queue.Queue(maxsize=max(1, int(prefetch)))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, args=(self.next_step,),
                                        name="ernie.data prefetch", daemon=True)
        self._thread.start()

    def rows(self, step: int) -> np.ndarray:
        """The global sample indices this loader reads at `step`."""
        if self.positions is not None:
            return step * self.global_batch + self.positions
        return np.concatenate([self.samples.rows_for(step, self.global_batch, r, self.world)
                               for r in self.ranks])

    def _produce(self, step):
        try:
            while not self._stop.is_set() and (self._end is None or step < self._end):
                rows = self.rows(step)
                item = Batch(step, rows, self.samples.batch(rows))
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                step += 1
            self._queue.put(StopIteration())
        except BaseException as e:  # handed to the consumer, raised there
            self._queue.put(e)

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        item = self._queue.get()
        if isinstance(item, StopIteration):
            self._queue.put(item)
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        self.next_step = item.step + 1
        return item

    def position(self) -> dict:
        """Where the next batch starts (JSON-serialisable)."""
        s = self.samples
        sample = self.next_step * self.global_batch
        return {"epoch": sample // s.samples_per_epoch, "step": self.next_step,
                "sample": sample, "global_batch": self.global_batch, "seed": s.seed,
                "seq_len": s.seq_len, "split": s.split}

    @classmethod
    def from_position(cls, samples: PackedSamples, position: dict, *, ranks=(0,),
                      world: int = 1, prefetch: int = 2, steps: int | None = None,
                      positions=None):
        """The loader that continues `position` (from `position()`) on
        `world` data-parallel ranks. A position of another seed, seq_len,
        split or global batch would give other samples: a ValueError naming
        the key."""
        if not isinstance(position, dict):
            raise ValueError(f"data position: a JSON object, not {type(position).__name__}")
        missing = [k for k in POSITION_KEYS if k not in position]
        if missing:
            raise ValueError(f"data position: missing {', '.join(missing)}")
        unknown = sorted(set(position) - set(POSITION_KEYS))
        if unknown:
            raise ValueError(f"data position: unknown key {unknown[0]!r}")
        for key in ("seed", "seq_len", "split"):
            if position[key] != getattr(samples, key):
                raise ValueError(f"data position: {key} {position[key]!r} differs from the "
                                 f"dataset's {getattr(samples, key)!r}: the samples would differ")
        if position["sample"] != position["step"] * position["global_batch"]:
            raise ValueError("data position: sample is not step * global_batch")
        return cls(samples, position["global_batch"], ranks=ranks, world=world,
                   start_step=position["step"], prefetch=prefetch, steps=steps,
                   positions=positions)

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get_nowait()
            except queue.Empty:
                pass
            self._thread.join(timeout=0.05)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        stop = getattr(self, "_stop", None)  # None: __init__ refused its arguments
        if stop is not None:
            stop.set()

"""ernie/data/preprocess.py - text files to a Megatron-format token dataset,
tokenized with a Hugging Face tokenizer.json in parallel worker processes.

Inputs: *.jsonl (one JSON object per line, the document's text under
`json_key`; blank lines skipped) and *.txt (one document per file, or one per
non-blank line with `txt_lines`). The work is cut into slices - byte ranges
of about SLICE_BYTES, cut at line starts, for .jsonl and line-wise .txt; a
whole file for a .txt document - and each worker process reads and tokenizes
its own slices; the parent writes the results in input order, so the output
does not depend on the number of workers. Documents that tokenize to nothing
are skipped. Special tokens are added as the tokenizer's post-processor says
(a Llama tokenizer's BOS, say); `append_eos` adds the EOS token after each
document.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

import numpy as np

from .indexed import IndexedDatasetBuilder, optimal_dtype

SLICE_BYTES = 4 << 20
# EOS tokens looked for, in this order, when append_eos names none.
EOS_NAMES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|eos|>", "[SEP]")

_tokenizer = None  # each worker's, loaded once


def load_tokenizer(path):
    """The tokenizers.Tokenizer of a tokenizer.json; ValueError naming the
    file when it does not load."""
    import tokenizers  # optional: only tokenizing needs it
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such tokenizer file")
    try:
        return tokenizers.Tokenizer.from_file(os.fspath(path))
    except Exception as e:  # tokenizers raises a bare Exception
        raise ValueError(f"{path}: not a tokenizer.json that `tokenizers` loads: {e}") from None


def _line_number(path, offset):
    """1-based line number of the line starting at byte `offset` (error path only)."""
    with open(path, "rb") as f:
        return f.read(offset).count(b"\n") + 1


def slices(inputs, txt_lines=False):
    """(path, kind, start, end) work items: byte ranges cut at line starts,
    or a whole .txt file as one document."""
    out = []
    for path in inputs:
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise ValueError(f"{path}: no such input file")
        suffix = Path(path).suffix
        if suffix not in (".jsonl", ".txt"):
            raise ValueError(f"{path}: input is neither .jsonl nor .txt")
        size = os.path.getsize(path)
        if suffix == ".txt" and not txt_lines:
            out.append((path, "document", 0, size))
            continue
        kind = "jsonl" if suffix == ".jsonl" else "line"
        with open(path, "rb") as f:
            start = 0
            while start < size:
                f.seek(min(start + SLICE_BYTES, size))
                f.readline()  # to the next line start
                end = min(f.tell(), size) if start + SLICE_BYTES < size else size
                out.append((path, kind, start, end))
                start = end
    return out


def _texts(path, kind, start, end, json_key):
    """The documents' texts of one slice."""
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    if kind == "document":
        try:
            return [data.decode("utf-8")]
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 text (byte {e.start})") from None
    texts, offset = [], start
    for raw in data.splitlines(keepends=True):
        line_at, offset = offset, offset + len(raw)
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8")
            if kind == "line":
                texts.append(line.rstrip("\r\n"))
                continue
            obj = json.loads(line)
        except (UnicodeDecodeError, ValueError) as e:
            what = "not UTF-8" if isinstance(e, UnicodeDecodeError) else f"not JSON ({e})"
            raise ValueError(f"{path}:{_line_number(path, line_at)}: {what}") from None
        if not isinstance(obj, dict) or json_key not in obj:
            raise ValueError(f"{path}:{_line_number(path, line_at)}: no key {json_key!r} "
                             f"(--json-key) in this line's JSON object")
        if not isinstance(obj[json_key], str):
            raise ValueError(f"{path}:{_line_number(path, line_at)}: {json_key!r} is "
                             f"{type(obj[json_key]).__name__}, not text")
        texts.append(obj[json_key])
    return texts


def _init_worker(tokenizer_path):
    global _tokenizer
    # One process per core already: the tokenizer's own threads would oversubscribe.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _tokenizer = load_tokenizer(tokenizer_path)


def tokenize_slice(item, json_key="text", eos_id=None):
    """(token ids of the slice's documents concatenated, their lengths, text bytes)."""
    path, kind, start, end = item
    texts = [t for t in _texts(path, kind, start, end, json_key) if t]
    encodings = _tokenizer.encode_batch(texts) if texts else []
    docs = [e.ids + [eos_id] if eos_id is not None else e.ids for e in encodings]
    lengths = np.array([len(d) for d in docs], np.int64)
    ids = np.concatenate([np.array(d, np.int64) for d in docs]) if docs else \
        np.zeros(0, np.int64)
    return ids, lengths, end - start


def _tokenize(args):
    return tokenize_slice(*args)


def find_eos(tokenizer, name=None, where=""):
    """The id of the EOS token `name`, or of the first of EOS_NAMES the
    vocabulary holds; ValueError naming the tokenizer file otherwise."""
    for candidate in ([name] if name else EOS_NAMES):
        token_id = tokenizer.token_to_id(candidate)
        if token_id is not None:
            return token_id
    raise ValueError(f"{where}: " + (f"no token {name!r} (--eos-token) in the vocabulary" if name
                     else f"none of {', '.join(EOS_NAMES)} in the vocabulary: "
                          f"name the EOS token with --eos-token"))


def prepare(tokenizer_path, inputs, output, *, workers=None, append_eos=False,
            eos_token=None, json_key="text", txt_lines=False, log=sys.stdout):
    """Tokenizes `inputs` into OUTPUT.bin / OUTPUT.idx; returns a summary
    {documents, tokens, text_bytes, seconds, dtype, eos_id}."""
    global _tokenizer
    tokenizer = load_tokenizer(tokenizer_path)
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    eos_id = find_eos(tokenizer, eos_token, tokenizer_path) if append_eos else None
    items = slices(inputs, txt_lines)
    workers = max(1, min(int(workers or os.cpu_count() or 1), len(items) or 1))
    dtype = optimal_dtype(vocab)
    started = time.perf_counter()
    documents = tokens = text_bytes = 0
    tasks = [(item, json_key, eos_id) for item in items]
    with IndexedDatasetBuilder(output, dtype) as builder:
        if workers == 1:
            _tokenizer = tokenizer
            results = map(_tokenize, tasks)
            pool = None
        else:
            pool = multiprocessing.get_context("spawn").Pool(
                workers, initializer=_init_worker, initargs=(os.fspath(tokenizer_path),))
            results = pool.imap(_tokenize, tasks)
        try:
            for ids, lengths, nbytes in results:
                at = 0
                for n in lengths:
                    if n:
                        builder.add_document(ids[at:at + n])
                        documents += 1
                    at += n
                tokens += len(ids)
                text_bytes += nbytes
        finally:
            if pool is not None:
                pool.terminate()
                pool.join()
    seconds = time.perf_counter() - started
    summary = {"documents": documents, "tokens": tokens, "text_bytes": text_bytes,
               "seconds": seconds, "dtype": np.dtype(dtype).name, "eos_id": eos_id,
               "vocab_size": vocab, "workers": workers}
    if log is not None:
        rate = text_bytes / 1e6 / seconds if seconds > 0 else float("inf")
        print(f"{output}.bin/.idx: {documents} documents, {tokens} tokens ({summary['dtype']}, "
              f"vocabulary {vocab}{'' if eos_id is None else f', EOS {eos_id} appended'}); "
              f"{text_bytes / 1e6:.1f} MB of text in {seconds:.2f} s = {rate:.1f} MB/s "
              f"on {workers} worker(s)", file=log)
    return summary

"""The token data loader's tokens/s and `prepare`'s MB/s of text.

    python3 bench/data_loader.py [--tokens 100e6] [--seq-len 2048] [--batch 16]
        [--text-mb 32] [--workers 1,N] [--train-tokens-per-s 7770]

Loader: a corpus of `--tokens` random uint16 tokens in documents of
log-normal lengths (median ~400 tokens) is written with ernie's writer
(IndexedDatasetBuilder; its MB/s is printed too), then read by a
DataLoader (packing with an EOS between documents, shuffled samples of
seq_len + 1 tokens, prefetch thread) for about a third of an epoch, as one
process holding all of a global batch's rows and as one of two dp ranks. The
files were just written, so they are read from the page cache, as a corpus
on a warm node is. The goal beside it: 20x what training consumes, by
default runtime_step.py's recorded 2-rank dp Llama step (1024 tokens in
131.8 ms, bench/README.md).

prepare: `--text-mb` of JSON lines of pseudo-English (words drawn from a
Zipf law over a generated lexicon) tokenized with a byte-level BPE of 8192
tokens trained here, by `prepare` with each worker count of `--workers`.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(os.environ.get("ERNIE_BUILD_DIR", ROOT / "build")) / "python"))

from ernie.data import DataLoader, IndexedDataset, IndexedDatasetBuilder, PackedSamples  # noqa: E402
from ernie.data import preprocess  # noqa: E402


def write_corpus(prefix, n_tokens, seed=0):
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    written = 0
    with IndexedDatasetBuilder(prefix, np.uint16) as builder:
        while written < n_tokens:
            lengths = np.maximum(1, rng.lognormal(6.0, 1.0, 4096).astype(np.int64))
            tokens = rng.integers(1, 50000, int(lengths.sum()), dtype=np.uint16)
            at = 0
            for n in lengths:
                builder.add_document(tokens[at:at + n])
                at += n
            written += at
    seconds = time.perf_counter() - start
    return written, seconds


def loader_rate(samples, batch, ranks, world, steps):
    with DataLoader(samples, batch, ranks=ranks, world=world, steps=steps, prefetch=4) as loader:
        start = time.perf_counter()
        rows = sum(len(b.rows) for b in loader)
        seconds = time.perf_counter() - start
    return rows * samples.seq_len / seconds


def write_text(path, megabytes, seed=0):
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlucmfwypvbgkjqxz"))
    lexicon = ["".join(rng.choice(letters, rng.integers(1, 10))) for _ in range(20000)]
    target, size = megabytes * 1e6, 0
    with open(path, "w") as f:
        while size < target:
            words = rng.zipf(1.2, 2000) % len(lexicon)
            text = " ".join(lexicon[w] for w in words) + "."
            line = json.dumps({"text": text}) + "\n"
            f.write(line)
            size += len(line)
    return lexicon


def train_tokenizer(path, lexicon):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=["<unk>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([" ".join(lexicon[i:i + 100]) for i in range(0, len(lexicon), 100)],
                            trainer)
    tok.save(str(path))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=float, default=100e6)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--text-mb", type=float, default=32)
    parser.add_argument("--workers", default=f"1,{os.cpu_count()}")
    parser.add_argument("--train-tokens-per-s", type=float, default=1024 / 0.1318)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        prefix = Path(tmp) / "corpus"
        n, seconds = write_corpus(prefix, int(args.tokens))
        mb = 2 * n / 1e6
        print(f"corpus: {n / 1e6:.1f} M uint16 tokens = {mb:.0f} MB, written by "
              f"IndexedDatasetBuilder at {mb / seconds:.0f} MB/s")
        os.remove(f"{prefix}.tokens.json")  # the writer's record: scan once, uncached
        start = time.perf_counter()
        samples = PackedSamples(IndexedDataset(prefix), args.seq_len, eos_id=0, seed=1,
                                vocab_size=50000)
        seconds = time.perf_counter() - start
        start = time.perf_counter()
        PackedSamples(IndexedDataset(prefix), args.seq_len, eos_id=0, seed=1, vocab_size=50000)
        print(f"open, validate, check the vocabulary: {seconds:.2f} s scanning the tokens, "
              f"{time.perf_counter() - start:.2f} s with the scan's record")
        steps = max(1, samples.samples_per_epoch // 3 // args.batch)
        goal = 20 * args.train_tokens_per_s
        print(f"\n{'loader':32} | {'tokens/s':>12} | {'x training':>10} | goal 20x")
        print("-" * 72)
        for name, ranks, world in (("1 process, all rows", [0], 1),
                                   ("dp rank 0 of 2", [0], 2)):
            rate = loader_rate(samples, args.batch, ranks, world, steps)
            print(f"{name:32} | {rate:12.3e} | {rate / args.train_tokens_per_s:10.0f} | "
                  f"{'met' if rate >= goal else 'MISSED'}")
        print(f"({steps} steps of {args.batch} x {args.seq_len + 1} tokens; training: "
              f"{args.train_tokens_per_s:.0f} tokens/s)")

        try:
            import tokenizers  # noqa: F401
        except ImportError:
            print("\nprepare: skipped (no `tokenizers`)")
            return
        text = Path(tmp) / "text.jsonl"
        lexicon = write_text(text, args.text_mb)
        train_tokenizer(Path(tmp) / "tokenizer.json", lexicon)
        print(f"\n{'prepare':32} | {'MB/s text':>12} | {'tokens/s':>10} | documents")
        print("-" * 72)
        for workers in [int(w) for w in args.workers.split(",")]:
            s = preprocess.prepare(Path(tmp) / "tokenizer.json", [text], Path(tmp) / "out",
                                   workers=workers, append_eos=True, log=None)
            print(f"{f'{workers} worker(s)':32} | {s['text_bytes'] / 1e6 / s['seconds']:12.2f} | "
                  f"{s['tokens'] / s['seconds']:10.3e} | {s['documents']}")
        print(f"({s['text_bytes'] / 1e6:.1f} MB of JSON lines, BPE vocabulary {s['vocab_size']}, "
              f"{s['tokens'] / s['documents']:.0f} tokens per document)")


if __name__ == "__main__":
    main()

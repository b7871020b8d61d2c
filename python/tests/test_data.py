"""ernie.data: Megatron's indexed format against an independent writer and
reader, `python -m ernie.data prepare` with a BPE trained here, the sampler's
one global order on any dp degree and its resume, and every bad input as a
ValueError naming the file and the field."""

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from ernie.data import DataLoader, IndexedDataset, IndexedDatasetBuilder, PackedSamples
from ernie.data import preprocess as prepare_module

# --- an independent writer and reader, from the layout Megatron documents ----------------------

CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5, np.uint16: 8}


def megatron_write(prefix, documents, dtype, modes=False):
    """documents: a list of documents, each a list of sequences (token lists)."""
    lengths, pointers, doc_index, at = [], [], [0], 0
    with open(f"{prefix}.bin", "wb") as f:
        for doc in documents:
            for seq in doc:
                data = np.asarray(seq, dtype=dtype).tobytes()
                f.write(data)
                lengths.append(len(seq))
                pointers.append(at)
                at += len(data)
            doc_index.append(len(lengths))
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", CODES[dtype]))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(doc_index)))
        f.write(np.array(lengths, "<i4").tobytes())
        f.write(np.array(pointers, "<i8").tobytes())
        f.write(np.array(doc_index, "<i8").tobytes())
        if modes:
            f.write(np.zeros(len(lengths), "<i1").tobytes())


def megatron_read(prefix):
    """(dtype, [sequence token arrays], document index)."""
    with open(f"{prefix}.idx", "rb") as f:
        idx = f.read()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    version, code, n_seq, n_doc = struct.unpack_from("<QBQQ", idx, 9)
    assert version == 1
    dtype = {v: k for k, v in CODES.items()}[code]
    lengths = np.frombuffer(idx, "<i4", n_seq, 34)
    pointers = np.frombuffer(idx, "<i8", n_seq, 34 + 4 * n_seq)
    docs = np.frombuffer(idx, "<i8", n_doc, 34 + 12 * n_seq)
    with open(f"{prefix}.bin", "rb") as f:
        data = f.read()
    seqs = [np.frombuffer(data, dtype, n, p) for n, p in zip(lengths, pointers)]
    return dtype, seqs, docs


def random_documents(rng, n, vocab, max_seqs=1, max_len=40):
    return [[rng.integers(0, vocab, rng.integers(0 if s else 1, max_len)).tolist()
             for s in range(rng.integers(1, max_seqs + 1))] for _ in range(n)]


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.uint8, np.int64])
def test_reads_megatron_files_identically(tmp_path, dtype):
    rng = np.random.default_rng(1)
    vocab = min(np.iinfo(dtype).max, 70000)
    documents = random_documents(rng, 60, vocab, max_seqs=3)
    megatron_write(tmp_path / "m", documents, dtype)
    ds = IndexedDataset(tmp_path / "m")
    assert ds.dtype == np.dtype(dtype)
    assert ds.documents == len(documents)
    flat = [seq for doc in documents for seq in doc]
    assert len(ds) == len(flat)
    for i, seq in enumerate(flat):
        assert ds[i].tolist() == seq
    for d, doc in enumerate(documents):
        assert ds.document(d).tolist() == [t for seq in doc for t in seq]
    assert ds.token_range() == (min(t for s in flat for t in s), max(t for s in flat for t in s))


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_writes_what_megatrons_layout_reads(tmp_path, dtype):
    rng = np.random.default_rng(2)
    documents = [doc[0] for doc in random_documents(rng, 50, 60000)] + [[]]
    with IndexedDatasetBuilder(tmp_path / "e", dtype) as builder:
        for doc in documents:
            builder.add_document(doc)
    read_dtype, seqs, doc_index = megatron_read(tmp_path / "e")
    assert read_dtype is dtype
    assert [s.tolist() for s in seqs] == documents
    assert doc_index.tolist() == list(range(len(documents) + 1))
    # And byte for byte what the independent writer makes of the same documents.
    megatron_write(tmp_path / "m", [[d] for d in documents], dtype)
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"e{ext}").read_bytes() == (tmp_path / f"m{ext}").read_bytes()
    assert not list(tmp_path.glob("*.partial"))


def test_reader_maps_and_does_not_load(tmp_path):
    megatron_write(tmp_path / "m", [[list(range(1000))]], np.int32)
    ds = IndexedDataset(tmp_path / "m")
    assert isinstance(ds.tokens, np.memmap)
    assert not ds[0].flags.writeable


# --- prepare: a BPE trained here, the command line in its own process -------------------------

TEXTS = ["The quick brown fox jumps over the lazy dog.",
         "Pack my box with five dozen liquor jugs!",
         "Sphinx of black quartz, judge my vow.\nA second line, ünïcödé too.",
         "How vexingly quick daft zebras jump; 12345 and 67890."]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers
    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXTS * 20, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def run_cli(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run([sys.executable, "-m", "ernie.data", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=300)


def write_inputs(folder):
    jsonl = folder / "a.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(TEXTS))
                     + "\n")
    txt = folder / "b.txt"
    txt.write_text(TEXTS[2])
    return jsonl, txt


def test_prepare_command_round_trips_text(tmp_path, tokenizer_file):
    import tokenizers
    jsonl, txt = write_inputs(tmp_path)
    out = run_cli("prepare", "--tokenizer", tokenizer_file, "--input", jsonl, txt,
                  "--output", tmp_path / "corpus", "--workers", "2", "--append-eos")
    assert out.returncode == 0, out.stderr
    assert "5 documents" in out.stdout and "MB/s" in out.stdout
    tok = tokenizers.Tokenizer.from_file(str(tokenizer_file))
    eos = tok.token_to_id("</s>")
    ds = IndexedDataset(tmp_path / "corpus")
    assert ds.dtype == np.uint16  # a vocabulary below 65500
    assert ds.documents == 5
    for d, text in enumerate(TEXTS + [TEXTS[2]]):
        ids = ds.document(d).tolist()
        assert ids[-1] == eos and eos not in ids[:-1]
        assert tok.decode(ids[:-1]) == text
    # One document per line of a .txt with --txt-lines; no EOS without --append-eos.
    out = run_cli("prepare", "--tokenizer", tokenizer_file, "--input", txt, "--txt-lines",
                  "--output", tmp_path / "lines", "--workers", "1")
    assert out.returncode == 0, out.stderr
    ds = IndexedDataset(tmp_path / "lines")
    assert [tok.decode(ds.document(d).tolist()) for d in range(ds.documents)] == \
        TEXTS[2].split("\n")
    out = run_cli("info", tmp_path / "lines", "--vocab-size", 400)
    assert out.returncode == 0 and f"{ds.documents} documents" in out.stdout


def test_prepare_output_is_independent_of_workers(tmp_path, tokenizer_file, monkeypatch):
    pytest.importorskip("tokenizers")
    monkeypatch.setattr(prepare_module, "SLICE_BYTES", 100)  # several slices per file
    jsonl, txt = write_inputs(tmp_path)
    assert len(prepare_module.slices([jsonl])) > 1
    for workers in (1, 3):
        summary = prepare_module.prepare(tokenizer_file, [jsonl, txt], tmp_path / f"w{workers}",
                                         workers=workers, log=None)
        assert summary["documents"] == 5
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"w1{ext}").read_bytes() == (tmp_path / f"w3{ext}").read_bytes()


# --- the sampler -------------------------------------------------------------------------------

EOS = 0


def constant_documents(tmp_path, n=40, seed=0, eos_ended=False):
    """Document d is the token d + 1 repeated (1..30 times): each sample's
    tokens say which documents it holds."""
    rng = np.random.default_rng(seed)
    docs = [[d + 1] * int(rng.integers(1, 30)) + ([EOS] if eos_ended else []) for d in range(n)]
    with IndexedDatasetBuilder(tmp_path / "c", np.int32) as builder:
        for doc in docs:
            builder.add_document(doc)
    return IndexedDataset(tmp_path / "c"), docs


def test_one_global_order_for_any_dp_degree(tmp_path):
    ds, _ = constant_documents(tmp_path)
    samples = PackedSamples(ds, seq_len=8, seed=5, eos_id=EOS)
    batch, steps = 8, 3 * samples.samples_per_epoch // 8 + 2  # across epochs
    single = [samples.rows_for(s, batch) for s in range(steps)]
    for world in (1, 2, 4):
        for s in range(steps):
            parts = [samples.rows_for(s, batch, r, world) for r in range(world)]
            assert np.array_equal(np.concatenate(parts), single[s])
        with DataLoader(samples, batch, ranks=range(world), world=world, steps=steps) as loader:
            got = list(loader)
        assert [b.rows.tolist() for b in got] == [r.tolist() for r in single]
        assert all(np.array_equal(b.tokens, samples.batch(single[b.step])) for b in got)
        assert all(np.array_equal(b.labels, b.tokens[:, 1:]) and
                   np.array_equal(b.inputs, b.tokens[:, :-1]) for b in got)
    # A process holding only rank 1 of 4 reads only that block.
    with DataLoader(samples, batch, ranks=[1], world=4, steps=2) as loader:
        assert [b.rows.tolist() for b in loader] == [single[s][2:4].tolist() for s in (0, 1)]
    # Each epoch visits each packed sample once.
    n = samples.samples_per_epoch
    for e in range(2):
        ids = [samples.sample_id(g) for g in range(e * n, (e + 1) * n)]
        assert sorted(ids) == list(range(e * n, (e + 1) * n))
    assert [samples.sample_id(g) for g in range(n)] != [samples.sample_id(g) - n
                                                       for g in range(n, 2 * n)]


def test_a_process_reads_the_positions_it_is_given(tmp_path):
    """positions (local_batch's rows of each global batch, any set of them)
    pick those rows of every step's batch, resumed ones too."""
    ds, _ = constant_documents(tmp_path)
    samples = PackedSamples(ds, seq_len=8, seed=5, eos_id=EOS)
    mine = np.array([1, 4, 5])
    with DataLoader(samples, 8, positions=mine, steps=3) as loader:
        got = list(loader)
    assert [b.rows.tolist() for b in got] == [(s * 8 + mine).tolist() for s in range(3)]
    assert all(np.array_equal(b.tokens, samples.batch(b.rows)) for b in got)
    position = {"epoch": 0, "step": 2, "sample": 16, "global_batch": 8, "seed": 5,
                "seq_len": 8, "split": "train"}
    with DataLoader.from_position(samples, position, positions=mine, steps=1) as loader:
        assert next(loader).rows.tolist() == (16 + mine).tolist()
    for bad in ([8], [-1], [[0, 1]]):
        with pytest.raises(ValueError, match="positions must list rows of the global batch"):
            DataLoader(samples, 8, positions=bad)


def test_resume_gives_the_same_later_samples_on_another_dp_degree(tmp_path):
    ds, _ = constant_documents(tmp_path)
    samples = PackedSamples(ds, seq_len=8, seed=7, eos_id=EOS)
    with DataLoader(samples, 8, ranks=[0, 1], world=2, steps=12) as loader:
        whole = [(b.rows.tolist(), b.tokens.tolist()) for b in loader]
    loader = DataLoader(samples, 8, ranks=[0, 1], world=2)
    for _ in range(5):
        next(loader)
    position = json.loads(json.dumps(loader.position()))
    loader.close()
    assert position["step"] == 5 and position["sample"] == 40
    for world in (1, 4):
        with DataLoader.from_position(samples, position, ranks=range(world), world=world,
                                      steps=7) as resumed:
            assert [(b.rows.tolist(), b.tokens.tolist()) for b in resumed] == whole[5:]
    with pytest.raises(ValueError, match="seed"):
        DataLoader.from_position(PackedSamples(ds, seq_len=8, seed=8), position)
    with pytest.raises(ValueError, match="missing step"):
        DataLoader.from_position(samples, {k: v for k, v in position.items() if k != "step"})


def stream_of_epoch(samples, epoch):
    """The epoch's packed stream, rebuilt from its samples in packed order."""
    n = samples.samples_per_epoch
    by_k = {samples.sample_id(g) - epoch * n: samples.sample(g) for g in range(epoch * n,
                                                                               (epoch + 1) * n)}
    return np.concatenate([by_k[k][:-1] for k in range(n)] + [by_k[n - 1][-1:]])


def runs(stream):
    """[(token, run length)] of a stream."""
    cuts = np.flatnonzero(np.diff(stream)) + 1
    return [(int(p[0]), len(p)) for p in np.split(stream, cuts)]


@pytest.mark.parametrize("eos_ended", [False, True])
def test_packing_puts_one_eos_between_documents(tmp_path, eos_ended):
    ds, docs = constant_documents(tmp_path, eos_ended=eos_ended)
    samples = PackedSamples(ds, seq_len=16, seed=3, eos_id=EOS)
    length = {d + 1: len(doc) - eos_ended for d, doc in enumerate(docs)}
    stream = stream_of_epoch(samples, 0)
    pieces = runs(stream)
    assert len(stream) == samples.samples_per_epoch * 16 + 1
    # document, EOS, document, EOS, ...: whole documents (the last may be cut), single EOSes.
    assert [t == EOS for t, _ in pieces] == [i % 2 == 1 for i in range(len(pieces))]
    assert all(n == 1 for t, n in pieces if t == EOS)
    assert all(n == length[t] for t, n in pieces[:-1] if t != EOS)
    seen = [t for t, _ in pieces if t != EOS]
    assert len(set(seen)) == len(seen)
    # Without eos_id, documents are laid end to end as they are.
    plain = PackedSamples(ds, seq_len=16, seed=3)
    assert (EOS in stream_of_epoch(plain, 0)) == eos_ended


def test_split_by_document(tmp_path):
    ds, _ = constant_documents(tmp_path, n=50)
    train = PackedSamples(ds, seq_len=8, split="train", valid_fraction=0.2, seed=11, eos_id=EOS)
    valid = PackedSamples(ds, seq_len=8, split="valid", valid_fraction=0.2, seed=11, eos_id=EOS)
    assert len(valid.documents) == 10 and len(train.documents) == 40
    assert not set(train.documents) & set(valid.documents)
    assert sorted(set(train.documents) | set(valid.documents)) == list(range(50))
    tokens = set(np.concatenate([valid.sample(g) for g in range(valid.samples_per_epoch)]))
    assert tokens - {EOS} <= {d + 1 for d in valid.documents}
    again = PackedSamples(ds, seq_len=8, split="valid", valid_fraction=0.2, seed=11)
    other = PackedSamples(ds, seq_len=8, split="valid", valid_fraction=0.2, seed=12)
    assert np.array_equal(again.documents, valid.documents)
    assert not np.array_equal(other.documents, valid.documents)


# --- bad input: a ValueError naming the file and the field -------------------------------------

def good_files(tmp_path, name="m", docs=((1, 2, 3), (4, 5), (6,))):
    megatron_write(tmp_path / name, [[list(d)] for d in docs], np.uint16)
    return tmp_path / name


def patch(path, offset, data):
    raw = bytearray(path.read_bytes())
    raw[offset:offset + len(data)] = data
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("damage, field", [
    (lambda p: patch(p.with_suffix(".idx"), 0, b"NOTMEGA"), "magic"),
    (lambda p: patch(p.with_suffix(".idx"), 9, struct.pack("<Q", 2)), "version"),
    (lambda p: patch(p.with_suffix(".idx"), 17, b"\x09"), "dtype code"),
    (lambda p: patch(p.with_suffix(".idx"), 17, b"\x07"), "dtype code"),
    (lambda p: patch(p.with_suffix(".idx"), 18, struct.pack("<Q", 4)), "sequence count"),
    (lambda p: patch(p.with_suffix(".idx"), 26, struct.pack("<Q", 9)), "document count"),
    (lambda p: p.with_suffix(".idx").write_bytes(p.with_suffix(".idx").read_bytes()[:20]),
     "header"),
    (lambda p: p.with_suffix(".idx").write_bytes(p.with_suffix(".idx").read_bytes()[:-8]),
     "truncated"),
    (lambda p: patch(p.with_suffix(".idx"), 34, struct.pack("<i", -1)), "sequence lengths"),
    (lambda p: patch(p.with_suffix(".idx"), 34 + 12 + 8, struct.pack("<q", 2)),
     "sequence pointers"),
    (lambda p: patch(p.with_suffix(".idx"), 34 + 36, struct.pack("<q", 1)), "document index"),
    (lambda p: patch(p.with_suffix(".idx"), 34 + 36 + 8, struct.pack("<q", 3)),
     "document index"),
    (lambda p: patch(p.with_suffix(".idx"), 34 + 36 + 24, struct.pack("<q", 2)),
     "document index"),
    (lambda p: p.with_suffix(".bin").write_bytes(b""), "empty"),
    (lambda p: p.with_suffix(".bin").write_bytes(p.with_suffix(".bin").read_bytes()[:-2]),
     "truncated"),
    (lambda p: p.with_suffix(".bin").unlink(), "no such file"),
])
def test_damaged_files_are_named(tmp_path, damage, field):
    prefix = good_files(tmp_path)
    damage(prefix)
    with pytest.raises(ValueError, match=field) as e:
        IndexedDataset(prefix)
    assert str(prefix) in str(e.value)


def test_index_from_another_file(tmp_path):
    a = good_files(tmp_path, "a")
    c = good_files(tmp_path, "c", docs=((1, 2, 3, 4), (5,), (6,), (7,)))
    a.with_suffix(".idx").write_bytes(c.with_suffix(".idx").read_bytes())
    with pytest.raises(ValueError, match=r"a\.bin.*another file"):
        IndexedDataset(a)


def test_multimodal_is_refused(tmp_path):
    megatron_write(tmp_path / "mm", [[[1, 2]], [[3]]], np.uint16, modes=True)
    with pytest.raises(ValueError, match="multimodal"):
        IndexedDataset(tmp_path / "mm")


def test_vocabulary_overflow_is_named_before_training(tmp_path):
    prefix = good_files(tmp_path, docs=((1, 2, 3), (4, 500), (6,)))
    with pytest.raises(ValueError, match=r"m\.bin: token id 500 .* vocabulary of 100"):
        PackedSamples(prefix, seq_len=2, vocab_size=100)
    stats = json.loads(prefix.with_suffix(".tokens.json").read_text())
    assert (stats["min_token"], stats["max_token"]) == (1, 500)
    assert PackedSamples(prefix, seq_len=2, vocab_size=501).samples_per_epoch == 2
    # A dataset rewritten under the same name is scanned again.
    good_files(tmp_path, docs=((1, 2, 3), (4, 5), (6, 7000)))
    assert IndexedDataset(prefix).token_range() == (1, 7000)
    with pytest.raises(ValueError, match="eos_id 9000"):
        PackedSamples(prefix, seq_len=2, vocab_size=7001, eos_id=9000)


def test_writer_refuses_what_does_not_fit(tmp_path):
    with IndexedDatasetBuilder(tmp_path / "w", np.uint16) as builder:
        with pytest.raises(ValueError, match="70000 does not fit uint16"):
            builder.add_document([1, 70000])
        with pytest.raises(ValueError, match="1-D array of integer"):
            builder.add_document([0.5])
    with pytest.raises(ValueError, match="float32 is not an integer dtype"):
        IndexedDatasetBuilder(tmp_path / "f", np.float32)


def test_samples_need_enough_tokens(tmp_path):
    prefix = good_files(tmp_path)
    with pytest.raises(ValueError, match="not one sample"):
        PackedSamples(prefix, seq_len=64)
    with pytest.raises(ValueError, match="valid_fraction"):
        PackedSamples(prefix, seq_len=2, valid_fraction=1.5)


def test_prepare_errors_name_the_file_and_line(tmp_path, tokenizer_file):
    pytest.importorskip("tokenizers")
    jsonl, txt = write_inputs(tmp_path)
    broken = tmp_path / "broken.json"
    broken.write_text('{"model": 1}')
    with pytest.raises(ValueError, match=r"broken\.json: not a tokenizer\.json"):
        prepare_module.prepare(broken, [jsonl], tmp_path / "o", log=None)
    with pytest.raises(ValueError, match=r"nope\.json: no such tokenizer"):
        prepare_module.prepare(tmp_path / "nope.json", [jsonl], tmp_path / "o", log=None)
    with pytest.raises(ValueError, match=r"missing\.jsonl: no such input"):
        prepare_module.prepare(tokenizer_file, [tmp_path / "missing.jsonl"], tmp_path / "o",
                               log=None)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\n\n{"body": "b"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:3: no key 'text'"):
        prepare_module.prepare(tokenizer_file, [bad], tmp_path / "o", workers=1, log=None)
    bad.write_text('{"text": "a"}\n{"text": "a"\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: not JSON"):
        prepare_module.prepare(tokenizer_file, [bad], tmp_path / "o", workers=2, log=None)
    with pytest.raises(ValueError, match="--eos-token"):
        prepare_module.prepare(tokenizer_file, [jsonl], tmp_path / "o", append_eos=True,
                               eos_token="<nope>", log=None)
    assert not (tmp_path / "o.bin").exists() and not list(tmp_path.glob("o.*.partial"))
    out = run_cli("prepare", "--tokenizer", broken, "--input", jsonl, "--output", tmp_path / "o")
    assert out.returncode == 1 and "broken.json: not a tokenizer.json" in out.stderr
    assert "Traceback" not in out.stderr

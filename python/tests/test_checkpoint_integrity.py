"""Checkpoints that never lie (docs/integrity.md): every load verifies the
checksum of every byte it reads and fails naming the file, the tensor and
the byte range before any state changes; retention never deletes the
checkpoint just written; a directory's newest checkpoint that verifies is
the one loaded; a failed save or import leaves no temporary folder.
"""

import json
import os
import re
import shutil
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

import ernie
import ernie.distributed as dist
import ernie.weights
from ernie.models.llama import LlamaConfig, LlamaForCausalLM

TINY = dict(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, seed=5)
IDS = np.random.default_rng(0).integers(0, 32, size=(4, 8))
LABELS = IDS  # Hugging Face's labels: the model shifts them


def program(dp=2):
    mesh = dist.ProcessMesh(list(range(dp)), dim_names=["dp"])
    return ernie.compile(LlamaForCausalLM(LlamaConfig(**TINY)), ernie.optimizer.AdamW(1e-3),
                         [IDS, LABELS], mesh=mesh, config={"dp_config": {}})


def assert_same_state(before, after):
    assert before.keys() == after.keys()
    for name in before:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)


def no_temporaries(root):
    return not [p for p in os.listdir(root) if p.startswith(".tmp-")]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("integrity")
    prog = program()
    prog.step(IDS, LABELS)
    where = prog.save_checkpoint(root)
    return where


def header_end(path):
    return 8 + int.from_bytes(open(path, "rb").read(8), "little")


def flipped_copy(where, tmp_path, offset_of):
    """A copy of checkpoint `where` with one bit of its first rank file
    flipped at offset_of(path)."""
    target = tmp_path / "flipped" / os.path.basename(where)
    shutil.copytree(where, target)
    rank = sorted(target.glob("rank-*.safetensors"))[0]
    data = bytearray(rank.read_bytes())
    data[offset_of(rank)] ^= 0x04
    rank.write_bytes(bytes(data))
    return target, rank


@pytest.mark.parametrize("where_flipped", ["first-data", "last-data", "header"])
def test_a_bit_flip_is_refused_naming_file_tensor_and_range(saved, tmp_path, build_dir,
                                                            where_flipped):
    offset_of = {"first-data": header_end, "last-data": lambda p: p.stat().st_size - 1,
                 # inside the JSON, not the length field: a flipped digit of
                 # an offset or a letter of a name still parses
                 "header": lambda p: header_end(p) - 20}[where_flipped]
    target, rank = flipped_copy(saved, tmp_path, offset_of)
    prog = program()
    prog.step(IDS, LABELS)
    before = prog.state_dict()
    want = (rf"{rank.name}: the header \(bytes \[0, \d+\)\) fails its checksum"
            if where_flipped == "header" else
            rf"{rank.name}: tensor '[^']+': bytes \[\d+, \d+\) fail their checksum")
    # A flip in the header may also break the header's structure first.
    if where_flipped == "header":
        want = f"{rank.name}"
    with pytest.raises(ValueError, match=want):
        prog.load_checkpoint(target)
    assert_same_state(before, prog.state_dict())
    with pytest.raises(ValueError, match=want):
        ernie._ernie.verify_checkpoint(str(target))
    tool = str(build_dir / "bin" / "ernie-ckpt")
    out = subprocess.run([tool, "consolidate", str(target), str(tmp_path / "all.safetensors")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and rank.name in out.stderr, out.stderr
    assert not (tmp_path / "all.safetensors").exists()
    assert not (tmp_path / "all.safetensors.tmp").exists()


def test_a_data_flip_names_the_tensor_and_its_block(saved, tmp_path):
    target, rank = flipped_copy(saved, tmp_path, header_end)
    header = json.loads(open(rank, "rb").read()[8:header_end(rank)])
    first = min((v["data_offsets"][0], k) for k, v in header.items() if k != "__metadata__")[1]
    with pytest.raises(ValueError, match=rf"tensor '{first}': bytes \[0, \d+\) fail their "
                                         r"checksum \(xxh3 0x[0-9a-f]{16} recorded"):
        program(dp=1).load_checkpoint(target)


def test_the_manifest_records_xxh3_as_hex_text(saved):
    """Version 3: XXH3 of every 1 MiB block and of each rank file's header,
    as 16 hex digits (a JSON number above 2^53 loses digits in jq 1.6)."""
    manifest = json.loads(open(os.path.join(saved, "manifest.json")).read())
    assert manifest["version"] == 3
    assert manifest["checksum"] == {"algorithm": "xxh3", "block_bytes": 1 << 20}
    hex16 = re.compile(r"[0-9a-f]{16}")
    for f in manifest["files"].values():
        assert hex16.fullmatch(f["header_xxh3"]), f
    for t in manifest["tensors"].values():
        for p in t["pieces"]:
            nbytes = int(np.prod(p["shape"])) * {"F32": 4, "BF16": 2, "I64": 8}[t["dtype"]]
            blocks = -(-nbytes // (1 << 20))
            assert len(p["xxh3"]) == blocks and all(hex16.fullmatch(s) for s in p["xxh3"]), p


def edited_manifest(where, tmp_path, edit):
    target = tmp_path / "edited" / os.path.basename(where)
    shutil.copytree(where, target)
    manifest = json.loads((target / "manifest.json").read_text())
    edit(manifest)
    (target / "manifest.json").write_text(json.dumps(manifest))
    return target


def test_a_version_2_manifest_is_refused_naming_the_version(saved, tmp_path):
    """Version 2 (CRC-32C) was written only by development builds."""
    def to_version_2(m):
        m["version"] = 2
        m["checksum"]["algorithm"] = "crc32c"
    target = edited_manifest(saved, tmp_path, to_version_2)
    want = r"manifest\.json: checkpoint manifest version 2 \(CRC-32C .*\) is no longer read"
    with pytest.raises(ValueError, match=want):
        program().load_checkpoint(target)
    with pytest.raises(ValueError, match=want):
        ernie._ernie.verify_checkpoint(str(target))


def test_a_version_1_manifest_still_loads(saved, tmp_path):
    """Version 1: one zlib CRC-32 over each whole piece, no file list."""
    def piece_bytes(file, name):
        path = Path(saved) / file
        data, start = path.read_bytes(), header_end(path)
        begin, end = json.loads(data[8:start])[name]["data_offsets"]
        return data[start + begin:start + end]

    def to_version_1(m):
        m["version"] = 1
        del m["checksum"], m["files"]
        for name, t in m["tensors"].items():
            for p in t["pieces"]:
                del p["xxh3"]
                p["crc32"] = zlib.crc32(piece_bytes(p["file"], name))
    target = edited_manifest(saved, tmp_path, to_version_1)
    want = program()
    want.load_checkpoint(saved)
    got = program()
    got.load_checkpoint(target)
    assert_same_state(want.state_dict(), got.state_dict())
    assert "verified" in ernie._ernie.verify_checkpoint(str(target))
    rank = sorted(target.glob("rank-*.safetensors"))[0]
    data = bytearray(rank.read_bytes())
    data[-1] ^= 0x04
    rank.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"fail their checksum \(crc32 0x[0-9a-f]{8} recorded"):
        program().load_checkpoint(target)


@pytest.mark.parametrize("bad", [12345, "0x0123456789abcdef", "0123456789ABCDEF", "0123"])
def test_a_checksum_not_16_hex_digits_is_refused(saved, tmp_path, bad):
    def damage(m):
        piece = next(iter(m["tensors"].values()))["pieces"][0]
        piece["xxh3"][0] = bad
    target = edited_manifest(saved, tmp_path, damage)
    with pytest.raises(ValueError, match=r"has checksum .* not 16 lowercase hex digits"):
        program().load_checkpoint(target)


def test_ernie_run_resume_refuses_a_flip(saved, tmp_path, build_dir):
    target, rank = flipped_copy(saved, tmp_path, lambda p: p.stat().st_size - 1)
    prog_file = tmp_path / "p.ernie"
    program().save(str(prog_file))
    out = subprocess.run([str(build_dir / "bin" / "ernie-run"), str(prog_file), "--steps", "1",
                          "--resume", str(target), "--quiet"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "fail their checksum" in out.stderr, out.stderr


def test_saving_beside_a_higher_step_loses_nothing(tmp_path):
    """A stray step-00000100 (a manifest only) and another run's complete
    step-00000050: five saves with keep=2 keep this run's newest two and
    touch neither; loading the directory picks the newest that verifies."""
    other = program()
    for _ in range(3):
        other.step(IDS, LABELS)
    old = other.save_checkpoint(tmp_path)
    os.rename(old, tmp_path / "step-00000050")
    manifest = json.loads((tmp_path / "step-00000050" / "manifest.json").read_text())
    manifest["step"] = 50
    (tmp_path / "step-00000050" / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "step-00000100").mkdir()
    (tmp_path / "step-00000100" / "manifest.json").write_text(json.dumps(manifest))

    prog = program()
    paths = []
    for _ in range(5):
        prog.step(IDS, LABELS)
        paths.append(prog.save_checkpoint(tmp_path, keep=2))
        assert os.path.exists(paths[-1])
    assert sorted(os.listdir(tmp_path)) == ["step-00000004", "step-00000005",
                                            "step-00000050", "step-00000100"]
    state = prog.state_dict()
    # step-100 lacks its files; step-50 verifies and is newest.
    fresh = program()
    fresh.load_checkpoint(tmp_path)
    assert fresh.step_count == 50
    shutil.rmtree(tmp_path / "step-00000050")
    fresh.load_checkpoint(tmp_path)
    assert fresh.step_count == 5
    assert_same_state(state, fresh.state_dict())
    # A newest one with a file cut short is skipped as well.
    rank = sorted((tmp_path / "step-00000005").glob("rank-*.safetensors"))[0]
    rank.write_bytes(rank.read_bytes()[:-1])
    fresh.load_checkpoint(tmp_path)
    assert fresh.step_count == 4
    shutil.rmtree(tmp_path / "step-00000004")
    with pytest.raises(ValueError, match=r"(?s)no complete checkpoint.*step-00000005.*"
                                         r"rank-\d+\.safetensors: \d+ bytes, the manifest records"):
        fresh.load_checkpoint(tmp_path)


def test_failed_saves_and_imports_leave_no_temporary_folder(tmp_path, build_dir):
    prog = program()
    deep = {}
    for _ in range(100):
        deep = {"d": deep}
    with pytest.raises(ValueError, match="metadata.*nested deeper than 32"):
        prog.save_checkpoint(tmp_path, data_position=deep)
    assert os.listdir(tmp_path) == []
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes((16).to_bytes(8, "little") + b'{"a": {"dtype": ')
    tool = str(build_dir / "bin" / "ernie-ckpt")
    out = subprocess.run([tool, "import", str(bad), str(tmp_path / "root")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 1 and "bad.safetensors" in out.stderr and "wrote" not in out.stdout
    assert no_temporaries(tmp_path / "root")


def test_fifos_are_refused_up_front(saved, tmp_path, build_dir):
    target = tmp_path / "fifo" / os.path.basename(saved)
    shutil.copytree(saved, target)
    rank = sorted(target.glob("rank-*.safetensors"))[0]
    rank.unlink()
    os.mkfifo(rank)
    with pytest.raises(ValueError, match=f"{rank.name}: is a FIFO, not a regular file"):
        program().load_checkpoint(target)
    with pytest.raises(ValueError, match="is a FIFO"):
        ernie._ernie.verify_checkpoint(str(target))
    with pytest.raises(ValueError, match="not a regular file"):
        ernie.weights.load_file(rank)
    with pytest.raises(OSError, match="not a regular file"):
        ernie.weights.read_tensors(rank, ["x"])
    out = subprocess.run([str(build_dir / "bin" / "ernie-run"), str(rank), "--steps", "1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "is a FIFO" in out.stderr, out.stderr

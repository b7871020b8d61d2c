"""Training checkpoints to and from Hugging Face folders without Python:
`ernie-ckpt export-hf CKPT OUT --config config.json` and
`ernie-ckpt import-hf FOLDER ROOT`, through the runtime's rule table
(HfLayout.h) that the Python models' save_pretrained and from_pretrained
use too.

Without transformers: export-hf of a checkpoint trained on a mesh writes
exactly the tensors save_pretrained writes for the same state (fused
q/k/v split back, stacked experts split, a tied head once, the aux-free
selection biases, no optimizer state); import-hf gives a weights-only
checkpoint that a program on another mesh loads to the same parameters,
its optimizer state starting afresh. With the reference environment
(scripts/reference_env.sh; skipped without it): transformers loads the
exported folder with every tensor equal to ernie's state and its loss
equal to ernie's eval loss.
"""

import json
import subprocess

import numpy as np
import pytest

import ernie
import ernie.distributed as dist
from ernie.models import AutoModelForCausalLM
from ernie.models.ernie4_5 import Ernie4_5Config, Ernie4_5_MoeForCausalLM
from ernie.models.llama import LlamaConfig, LlamaForCausalLM
from ernie.weights import read_hf_folder

from test_mistral import saved_names
from test_qwen import hf_run, reference, unfused


@pytest.fixture
def ckpt(build_dir):
    tool = str(build_dir / "bin" / "ernie-ckpt")
    return lambda *a: subprocess.run([tool, *map(str, a)], capture_output=True, text=True,
                                     timeout=300)


def trained(model, shape, names, config, steps=3, seed=0):
    """(program, ids) after `steps` AdamW steps on a `shape` mesh."""
    ids = np.random.default_rng(seed).integers(0, model.config.vocab_size, size=(4, 8))
    mesh = dist.ProcessMesh(np.arange(int(np.prod(shape))).reshape(shape), names)
    prog = ernie.compile(model, ernie.optimizer.AdamW(1e-2), [ids, ids], mesh=mesh,
                         config=config)
    for _ in range(steps):
        prog.step(ids, ids)
    return prog, ids


def assert_same_folder(a, b):
    _, ours, dtypes_a = read_hf_folder(a)
    _, theirs, dtypes_b = read_hf_folder(b)
    assert set(ours) == set(theirs)
    assert dtypes_a == dtypes_b
    for name, value in ours.items():
        np.testing.assert_array_equal(theirs[name], value, err_msg=name)


LLAMA = LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, qkv_bias=True,
                    fuse_attention_qkv=True, fuse_attention_ffn=True)
ERNIE_MOE = Ernie4_5Config(vocab_size=64, hidden_size=32, intermediate_size=48,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           moe_num_experts=4, moe_k=2, moe_intermediate_size=16,
                           moe_num_shared_experts=1, moe_layer_start_index=1,
                           moe_aux_free_rate=0.01, seed=3)


@pytest.mark.parametrize("case", ["llama-fused-dp2xmp2", "llama-tied-pp2xmp2", "ernie_moe-dp2xep2"])
def test_export_hf_writes_what_save_pretrained_writes(tmp_path, ckpt, case):
    if case == "llama-tied-pp2xmp2":  # a pipelined checkpoint: the tied embedding's replicas
        model = LlamaForCausalLM(LlamaConfig(**{**LLAMA.__dict__, "tie_word_embeddings": True}))
        prog, _ = trained(model, [2, 2], ["pp", "mp"], {
            "mp_config": {"parallelize_plan": model.parallelize_plan()},
            "pp_config": {"split_spec": model.split_spec, "accumulate_steps": 2}})
    elif case.startswith("llama"):
        model = LlamaForCausalLM(LLAMA)
        prog, _ = trained(model, [2, 2], ["dp", "mp"],
                          {"mp_config": {"parallelize_plan": model.parallelize_plan()}})
    else:
        model = Ernie4_5_MoeForCausalLM(ERNIE_MOE)
        prog, _ = trained(model, [2, 2], ["dp", "ep"], {"dp_config": {}, "ep_config": {"axis": "ep"}})
    state = prog.state_dict()
    if case.startswith("ernie"):  # the aux-free biases moved: they are written too
        assert any(n.endswith(":e_score_correction_bias") and np.abs(v).max() > 0
                   for n, v in state.items())
    model.save_pretrained(tmp_path / "python", state=state)
    where = prog.save_checkpoint(tmp_path / "ckpt")
    done = ckpt("export-hf", tmp_path / "ckpt", tmp_path / "exported",
                "--config", tmp_path / "python" / "config.json")
    assert done.returncode == 0, done.stderr
    assert_same_folder(tmp_path / "python", tmp_path / "exported")
    exported = json.loads((tmp_path / "exported" / "config.json").read_text())
    assert exported == json.loads((tmp_path / "python" / "config.json").read_text())
    # bf16, sharded with an index past a size limit.
    done = ckpt("export-hf", where, tmp_path / "bf16", "--config",
                tmp_path / "python" / "config.json", "--dtype", "bfloat16",
                "--max-shard-bytes", 4096)
    assert done.returncode == 0, done.stderr
    index = json.loads((tmp_path / "bf16" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    model.save_pretrained(tmp_path / "python-bf16", state=state, dtype="bf16")
    _, ours, dtypes = read_hf_folder(tmp_path / "bf16")
    _, theirs, python_dtypes = read_hf_folder(tmp_path / "python-bf16")
    assert dtypes == python_dtypes and set(dtypes.values()) == {"bf16"}
    for name, value in ours.items():
        np.testing.assert_array_equal(value, theirs[name], err_msg=name)
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == \
        "bfloat16"


def test_import_hf_loads_on_any_mesh_with_fresh_optimizer_state(tmp_path, ckpt):
    """A folder -> weights-only checkpoint -> a program on another mesh: its
    parameters are the folder's (bf16 file, f32 program: converted), the
    step count 0 and the optimizer's moments zero; training goes on equal to
    a program given the same weights by from_pretrained."""
    model = Ernie4_5_MoeForCausalLM(ERNIE_MOE)
    model.save_pretrained(tmp_path / "folder", dtype="bf16")
    done = ckpt("import-hf", tmp_path / "folder", tmp_path / "root")
    assert done.returncode == 0, done.stderr
    info = ckpt("info", tmp_path / "root")
    assert '"weights_only":true' in info.stdout
    assert "model.layers.1.mlp.experts.gate_proj.weight  BF16[4, 32, 16]" in info.stdout

    reference = AutoModelForCausalLM.from_pretrained(tmp_path / "folder", dtype="f32")
    want, ids = trained(reference, [2], ["ep"], {"ep_config": {"axis": "ep"}}, steps=0)
    fresh = Ernie4_5_MoeForCausalLM(ERNIE_MOE.__class__(**{**ERNIE_MOE.__dict__, "seed": 9}))
    prog, _ = trained(fresh, [2, 2], ["dp", "ep"], {"dp_config": {}, "ep_config": {"axis": "ep"}},
                      steps=0)
    metadata = prog.load_checkpoint(tmp_path / "root")
    assert metadata["weights_only"] is True and prog.step_count == 0
    state, ref = prog.state_dict(), want.state_dict()
    for name, value in ref.items():
        np.testing.assert_array_equal(state[name], value, err_msg=name)
    losses = [prog.step(ids, ids) for _ in range(3)]
    np.testing.assert_allclose(losses, [want.step(ids, ids) for _ in range(3)], rtol=1e-5)


def test_bad_input_is_named(tmp_path, ckpt):
    model = LlamaForCausalLM(LLAMA)
    prog, _ = trained(model, [2], ["dp"], {}, steps=1)
    prog.save_checkpoint(tmp_path / "ckpt")
    model.save_pretrained(tmp_path / "folder")
    config = json.loads((tmp_path / "folder" / "config.json").read_text())

    def export(**changes):
        path = tmp_path / "other.json"
        path.write_text(json.dumps({**config, **changes}))
        return ckpt("export-hf", tmp_path / "ckpt", tmp_path / "out", "--config", path)

    done = export(hidden_size=64)
    assert done.returncode == 1
    assert "'llama.embed_tokens.weight' is [48, 32]; config.json's vocab_size and " \
           "hidden_size make it [48, 64]" in done.stderr
    done = export(num_hidden_layers=3)
    assert done.returncode == 1 and "num_hidden_layers is 3" in done.stderr
    done = export(num_key_value_heads=4)  # the fused q/k/v no longer adds up
    assert done.returncode == 1 and "qkv_proj.bias' is [64]; config.json makes its last " \
        "dimension 96" in done.stderr
    done = export(tie_word_embeddings=True)
    assert done.returncode == 1 and "ties the head" in done.stderr
    done = export(model_type="gpt2", architectures=["GPT2LMHeadModel"])
    assert done.returncode == 1 and "model_type 'gpt2'" in done.stderr and "qwen3_moe" in \
        done.stderr
    assert not (tmp_path / "out" / "config.json").exists()  # nothing written on an error
    for args in (["export-hf", tmp_path / "ckpt", tmp_path / "out"],
                 ["export-hf", tmp_path / "ckpt", tmp_path / "out", "--config",
                  tmp_path / "folder" / "config.json", "--dtype", "int8"],
                 ["export-hf", tmp_path / "ckpt", tmp_path / "out", "--frobnicate", "1"],
                 ["import-hf", tmp_path / "folder", tmp_path / "root", "minus-one"]):
        done = ckpt(*args)
        assert done.returncode == 2, (args, done.stderr)

    # A folder whose experts have a gap, and one of another family's tensors.
    moe = Ernie4_5_MoeForCausalLM(ERNIE_MOE)
    moe.save_pretrained(tmp_path / "moe")
    from ernie.weights import load_file, save_file
    weights, _ = load_file(tmp_path / "moe" / "model.safetensors")
    gap = {k: v for k, v in weights.items() if ".experts.2." not in k}
    save_file(gap, tmp_path / "moe" / "model.safetensors")
    done = ckpt("import-hf", tmp_path / "moe", tmp_path / "root-gap")
    assert done.returncode == 1 and "a gap in the experts" in done.stderr
    assert not (tmp_path / "root-gap").exists() or not list((tmp_path / "root-gap").iterdir())
    save_file({**weights, "transformer.h.0.attn.weight": np.zeros((2, 2), np.float32)},
              tmp_path / "moe" / "model.safetensors")
    done = ckpt("import-hf", tmp_path / "moe", tmp_path / "root-other")
    assert done.returncode == 1 and "'transformer.h.0.attn.weight' is not a weight" in done.stderr
    done = ckpt("import-hf", tmp_path / "nothing", tmp_path / "root-none")
    assert done.returncode == 1 and "no config.json" in done.stderr

    # A weights-only checkpoint lacking a parameter the program has: a tied
    # folder into an untied program.
    plain = LlamaConfig(**{**LLAMA.__dict__, "fuse_attention_qkv": False,
                           "fuse_attention_ffn": False})
    LlamaForCausalLM(LlamaConfig(**{**plain.__dict__, "tie_word_embeddings": True})) \
        .save_pretrained(tmp_path / "tied")
    assert ckpt("import-hf", tmp_path / "tied", tmp_path / "root-tied").returncode == 0
    untied = LlamaForCausalLM(plain)
    prog, _ = trained(untied, [2], ["mp"],
                      {"mp_config": {"parallelize_plan": untied.parallelize_plan()}}, steps=0)
    with pytest.raises(ValueError, match="no tensor 'lm_head.weight' \\(it holds weights "
                                         "only, and this is a parameter\\)"):
        prog.load_checkpoint(tmp_path / "root-tied")


# ---------------------------------------------------------------------------
# transformers loads what export-hf writes (the reference environment)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("family,shape,names,config", [
    ("qwen2", [2, 2], ["dp", "mp"], {"fuse_attention_qkv": True}),
    ("qwen3_moe", [2, 2, 2], ["dp", "mp", "ep"], {}),
    ("ernie4_5_moe", [2, 2], ["dp", "ep"], {}),
    ("mixtral", [2, 2], ["dp", "ep"], {}),  # block_sparse_moe.experts.<e>.w1/w3/w2
])
def test_transformers_loads_an_exported_training_checkpoint(tmp_path, ckpt, family, shape,
                                                            names, config):
    """A transformers-made folder, trained 5 steps in ernie on a mesh and
    checkpointed: export-hf with the folder's own config.json gives a
    folder transformers loads with every tensor equal to ernie's state
    (read back by ernie's reader, which the Python-free tool shares nothing
    with but the rule table) and a loss equal to ernie's eval loss. Then
    import-hf of transformers' folder loads into a program on another mesh
    with transformers' logits."""
    reference("make", family, 5, tmp_path / "made")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "made", **config)
    plan = {"mp_config": {"parallelize_plan": model.parallelize_plan()}} if "mp" in names else {}
    if "ep" in names:
        plan["ep_config"] = {"axis": "ep"}
    if "dp" in names:
        plan["dp_config"] = {}
    prog, ids = trained(model, shape, names, plan, steps=5, seed=6)
    prog.save_checkpoint(tmp_path / "ckpt")
    done = ckpt("export-hf", tmp_path / "ckpt", tmp_path / "exported", "--config",
                tmp_path / "made" / "config.json")
    assert done.returncode == 0, done.stderr
    theirs = hf_run(tmp_path / "exported", ids, tmp_path, "exported")
    hf_state = {k[len("state/"):]: v for k, v in theirs.items() if k.startswith("state/")}
    hf_state = saved_names(hf_state) if family == "mixtral" else unfused(hf_state)
    _, ours, _ = read_hf_folder(tmp_path / "exported")
    ours = {k: v for k, v in ours.items() if not k.endswith("e_score_correction_bias")}
    hf_state = {k: v for k, v in hf_state.items() if not k.endswith("e_score_correction_bias")}
    if "lm_head.weight" not in ours:  # transformers lists a tied head under both names
        np.testing.assert_array_equal(hf_state.pop("lm_head.weight"),
                                      ours["model.embed_tokens.weight"])
    assert set(hf_state) == set(ours)
    for name, value in ours.items():
        np.testing.assert_array_equal(hf_state[name], value, err_msg=name)
    assert prog.eval(ids, ids) == pytest.approx(float(theirs["loss"]), rel=1e-5)

    done = ckpt("import-hf", tmp_path / "made", tmp_path / "root")
    assert done.returncode == 0, done.stderr
    made_config = json.loads((tmp_path / "made" / "config.json").read_text())
    fresh = AutoModelForCausalLM.from_config(made_config, seed=4)  # other weights
    mesh = dist.ProcessMesh(np.arange(2), ["mp"])
    other = ernie.compile(fresh, None, [ids], differentiate=False, mesh=mesh, config={
        "mp_config": {"parallelize_plan": fresh.parallelize_plan()}})
    other.load_checkpoint(tmp_path / "root")
    made = hf_run(tmp_path / "made", ids, tmp_path, "made")
    logits = other.forward(ids)
    assert np.linalg.norm(logits - made["logits"]) <= 1e-5 * np.linalg.norm(made["logits"])


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "ernie4_5_moe", "deepseek_v3"])
def test_transformers_fused_expert_layout_loads(tmp_path, ckpt, family):
    """A folder in transformers' own layout (save_original_format=False:
    experts fused into [E, 2I, H] and [E, H, I] tensors, transformers'
    in-memory names): from_pretrained gives transformers' logits on that
    folder, import-hf gives a checkpoint a program on a mesh loads to the
    same logits, and built abstractly (rank by rank) it is refused saying
    what works."""
    reference("make", family + "+fused", 5, tmp_path / "made")
    from ernie.weights import hf_folder_index, is_fused
    assert is_fused(hf_folder_index(tmp_path / "made")[1])
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "made")
    ids = np.random.default_rng(3).integers(0, model.config.vocab_size, size=(4, 8))
    theirs = hf_run(tmp_path / "made", ids, tmp_path, "made")
    logits = ernie.compile(model, None, [ids], differentiate=False).forward(ids)
    assert np.linalg.norm(logits - theirs["logits"]) <= 1e-5 * np.linalg.norm(theirs["logits"])

    done = ckpt("import-hf", tmp_path / "made", tmp_path / "root")
    assert done.returncode == 0, done.stderr
    fresh = AutoModelForCausalLM.from_config(
        json.loads((tmp_path / "made" / "config.json").read_text()), seed=4)
    mesh = dist.ProcessMesh(np.arange(4).reshape(2, 2), ["ep", "mp"])
    other = ernie.compile(fresh, None, [ids], differentiate=False, mesh=mesh, config={
        "mp_config": {"parallelize_plan": fresh.parallelize_plan()}, "ep_config": {"axis": "ep"}})
    other.load_checkpoint(tmp_path / "root")
    got = other.forward(ids)
    assert np.linalg.norm(got - theirs["logits"]) <= 1e-5 * np.linalg.norm(theirs["logits"])

    with ernie.nn.abstract():
        with pytest.raises(ValueError, match="holds its experts fused .* `ernie-ckpt import-hf`"):
            AutoModelForCausalLM.from_pretrained(tmp_path / "made")

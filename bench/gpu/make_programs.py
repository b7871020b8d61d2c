"""The program files scripts/gpu_check.sh trains on a GPU, and their batch.
Regenerate when the program format changes (needs the full build):

    PYTHONPATH=build/python python bench/gpu/make_programs.py [OUT_DIR]

Writes to OUT_DIR (default bench/gpu/programs):
  llama.ernie            the examples' Llama (examples/train_llama.py's config:
                         4 layers, hidden 128, tied embeddings), one rank;
  llama_dp2_mp2_pp2.ernie the same model on dp=2 x mp=2 x pp=2 (Paddle's
                         tensor-parallel plan, 2 stages, 4 micro-batches, 1F1B);
  inputs/input0.npy, input1.npy  one batch of token ids and labels (8 x 64),
                         the same for both, fed every step.
Both start from ernie's default parameters (a function of name, shape and
seed), so their losses must agree up to the order of the reductions.
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, "build/python")
import ernie  # noqa: E402
import ernie.distributed as dist  # noqa: E402
from ernie.models.llama import LlamaConfig, LlamaForCausalLM, parallelize_plan  # noqa: E402

out = Path(sys.argv[1] if len(sys.argv) > 1 else "bench/gpu/programs")
(out / "inputs").mkdir(parents=True, exist_ok=True)
cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=4, tie_word_embeddings=True, seed=0,
                  pre_shifted_labels=True)  # labels below are tokens[:, 1:]
rng = np.random.default_rng(0)
tokens = rng.integers(0, 256, size=(8, 65))
ids, labels = tokens[:, :-1].copy(), tokens[:, 1:].copy()
np.save(out / "inputs" / "input0.npy", ids)
np.save(out / "inputs" / "input1.npy", labels)

single = ernie.compile(LlamaForCausalLM(cfg), ernie.optimizer.AdamW(1e-3, weight_decay=0.01),
                       [ids, labels])
(out / "llama.ernie").write_bytes(single.program_file)

mesh = dist.ProcessMesh(np.arange(8).reshape(2, 2, 2), ["dp", "pp", "mp"])
config = {"dp_config": {"sharding_level": 0},
          "mp_config": {"parallelize_plan": parallelize_plan(tie_word_embeddings=True)},
          "pp_config": {"split_spec": "llama.layers", "accumulate_steps": 4,
                        "schedule_mode": "1F1B"}}
parallel = ernie.compile(LlamaForCausalLM(cfg), ernie.optimizer.AdamW(1e-3, weight_decay=0.01),
                         [ids, labels], mesh=mesh, config=config)
(out / "llama_dp2_mp2_pp2.ernie").write_bytes(parallel.program_file)
print(f"wrote {out}/llama.ernie, {out}/llama_dp2_mp2_pp2.ernie and {out}/inputs")

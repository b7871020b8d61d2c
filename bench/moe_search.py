"""The plan search on mixture-of-experts models: how long it takes and what
it returns.

Four searches (issue 44's): ERNIE-4.5-21B-A3B and -300B-A47B (bench/configs,
the published configs), and ERNIE 4.5 MoE models shaped as Mixtral-8x7B (8
experts, top-2, no shared expert) and as DeepSeek-V3's experts (256 routed
+ 1 shared, top-8, three dense layers first; GQA in place of MLA, which
ernie's ERNIE family does not build), in bf16 with AdamW, on Meta's H100
cluster description (`meta_llama3_h100`: 8 GPUs a node on NVLink, 50 GB/s
a GPU between nodes). Per search: wall time, candidates, abstract compiles,
the best plans (memory per rank from the abstract compile of the full
model, exact), and for the best plan its expert all-to-all bytes per step
beside the hand formula.

    PYTHONPATH=build/python .venv/bin/python bench/moe_search.py [--only NAME ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np

import ernie
from ernie import autoplan
from ernie.models.ernie4_5 import Ernie4_5Config, Ernie4_5_MoeForCausalLM

CONFIGS = Path(__file__).resolve().parent / "configs"

MIXTRAL = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
               moe_num_experts=8, moe_k=2, moe_num_shared_experts=0,
               moe_intermediate_size=14336, moe_layer_start_index=0, moe_layer_end_index=31,
               tie_word_embeddings=False)
DEEPSEEK = dict(hidden_size=7168, intermediate_size=18432, num_hidden_layers=61,
                num_attention_heads=128, num_key_value_heads=128, vocab_size=129280,
                moe_num_experts=256, moe_k=8, moe_num_shared_experts=1,
                moe_intermediate_size=2048, moe_layer_start_index=3, moe_layer_end_index=60,
                tie_word_embeddings=False)

# name: (config file, overrides, ranks, global batch, sequence)
SEARCHES = {
    "21b-a3b": ("ernie4_5_21b_a3b.json", {}, 64, 512, 4096),
    "300b-a47b": ("ernie4_5_300b_a47b.json", {}, 512, 1024, 4096),
    "mixtral-shaped": ("ernie4_5_21b_a3b.json", MIXTRAL, 64, 512, 4096),
    "deepseek-shaped": ("ernie4_5_21b_a3b.json", DEEPSEEK, 512, 1024, 4096),
}


def model_of(file, overrides):
    cfg = Ernie4_5Config.from_json(CONFIGS / file, dtype="bf16")
    cfg = dataclasses.replace(cfg, **overrides)
    with ernie.nn.abstract():
        return Ernie4_5_MoeForCausalLM(cfg)


def hand_all_to_all(cfg, c: autoplan.Candidate, batch, seq):
    """The expert all-to-alls' bytes a step, every stage's summed, as the
    report counts them (each all-to-all by its buffer on a rank): per MoE
    layer and micro-batch, four bf16 buffers [E, 1 group, C, hidden]
    (dispatch and combine, forward and backward: a data-parallel rank's
    tokens are one group, split over mp when mp > 1, and dropless C is the
    group's tokens) and the filled rows [E, 1] (i64) once; a recomputed
    layer's forward runs twice, its dispatch and combine (and rows) too."""
    layers = cfg.num_hidden_layers
    recomputed = set(autoplan._recomputed_layers(c, layers)) if c.recompute_layers else \
        set(range(layers)) if c.recompute == "full" else set()
    width = c.dp * (c.ep if c.ep > 1 and not c.ep_on_dp else 1)  # ranks splitting the batch
    per_micro = batch // width // c.micro_batches if c.pp > 1 else batch // width
    group = per_micro * seq // c.mp
    micro = c.micro_batches if c.pp > 1 else 1
    e = cfg.moe_num_experts
    buffer, rows = e * group * cfg.hidden_size * 2, e * 8
    return micro * sum((4 + 2 * (i in recomputed)) * buffer + (1 + (i in recomputed)) * rows
                       for i in range(layers) if cfg.is_moe_layer(i))


def run(name, workers):
    file, overrides, ranks, batch, seq = SEARCHES[name]
    model = model_of(file, overrides)
    cfg = model.config
    t = time.perf_counter()
    plans = autoplan.auto_plan(model, cluster="meta_llama3_h100", global_batch=batch,
                               seq_len=seq, ranks=ranks, top=5, workers=workers)
    wall = time.perf_counter() - t
    s = autoplan.auto_plan.last_search
    params = sum(int(np.prod(p.shape)) for p in model.parameters())
    print(f"\n## {name}: {params / 1e9:.1f}B parameters, {cfg.moe_num_experts} experts top-"
          f"{cfg.moe_k}, {ranks} H100s, batch {batch} x {seq}\n", flush=True)
    print(autoplan.format_table(plans, legend=False))
    print(f"\n{s['candidates']} candidates searched, {s['compiles']} abstract compiles, "
          f"{wall:.1f} s (goal <= 180 s: {'met' if wall <= 180 else 'NOT met'})", flush=True)
    # The best plan's expert all-to-alls, from its full-depth compile.
    best = plans[0]
    if best.candidate.ep > 1:
        ids = np.zeros((batch, seq), np.int64)
        prog = ernie.compile(model, ernie.optimizer.AdamW(1e-4), [ids, ids], mesh=best.mesh,
                             config=best.config, abstract=True)
        axis = "dp" if best.candidate.ep_on_dp else "ep"
        got = prog.report()["collectives"][f"all_to_all[{axis}]"]["bytes"]
        want = hand_all_to_all(cfg, best.candidate, batch, seq)
        print(f"best plan's expert all-to-alls: {got / 2**30:.3f} GiB a step, hand formula "
              f"{want / 2**30:.3f} GiB ({'equal' if got == want else f'ratio {got / want:.4f}'})")
    return wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=sorted(SEARCHES))
    ap.add_argument("--workers", type=int)
    a = ap.parse_args()
    for name in a.only or SEARCHES:
        run(name, a.workers)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Llama 3 405B at its real 126 layers on 16 pipeline stages: uneven stages.

Meta's plan (Llama 3 paper: tp 8, pp 16, the first and last stage a layer
fewer) as `pp_config.layers_per_stage = [7, 8 x 14, 7]`, compiled
abstractly on pp 16 x mp 8 = 128 ranks (sequence parallelism, AdamW with
f32 master weights, bf16, 16 micro-batches of 1 x 8192). Per stage: the
parameter bytes from the compiler's report beside a hand count (a layer is
q and o 16384^2, k and v 16384 x 1024, the MLP 3 x 16384 x 53248 and two
norms, split 8 ways but the norms; the embedding, split 8 ways, on the
first stage, the head and final norm on the last), and its optimizer
state and activations.

    PYTHONPATH=build/python .venv/bin/python bench/uneven_stages.py
"""

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "build" / "python"))

import ernie  # noqa: E402
import ernie.distributed as dist  # noqa: E402
from ernie.models.llama import LlamaConfig, LlamaForCausalLM, parallelize_plan  # noqa: E402

H, F, V, HEADS, KV, LAYERS, PP, MP = 16384, 53248, 128256, 128, 8, 126, 16, 8
COUNTS = [7] + [8] * 14 + [7]


def hand_parameter_bytes(stage):
    kv = H // HEADS * KV
    layer = (2 * H * H + 2 * H * kv + 3 * H * F) / MP + 2 * H
    total = COUNTS[stage] * layer
    if stage == 0:
        total += V * H / MP
    if stage == PP - 1:
        total += V * H / MP + H
    return 2 * total  # bf16


def main():
    with ernie.nn.abstract():
        model = LlamaForCausalLM(LlamaConfig(
            vocab_size=V, hidden_size=H, intermediate_size=F, num_hidden_layers=LAYERS,
            num_attention_heads=HEADS, num_key_value_heads=KV, dtype="bf16"))
    mesh = dist.ProcessMesh(np.arange(PP * MP).reshape(PP, MP), ["pp", "mp"])
    ids = np.zeros((16, 8192), np.int64)
    start = time.perf_counter()
    prog = ernie.compile(
        model, ernie.optimizer.AdamW(1e-4, multi_precision=True), [ids, ids], mesh=mesh,
        abstract=True, config={
            "mp_config": {"parallelize_plan": parallelize_plan(sequence_parallel=True)},
            "pp_config": {"split_spec": "llama.layers", "accumulate_steps": 16,
                          "layers_per_stage": COUNTS}})
    seconds = time.perf_counter() - start
    print(f"Llama 3 405B, {LAYERS} layers as {COUNTS[0]}, {COUNTS[1]} x 14, {COUNTS[-1]} on "
          f"pp {PP} x mp {MP}: compiled in {seconds:.1f} s\n")
    print(f"{'stage':>5} {'layers':>6} {'params GiB':>11} {'hand GiB':>9} "
          f"{'optimizer GiB':>14} {'activations GiB':>16}")
    for s, st in enumerate(prog.report()["stages"]):
        print(f"{s:>5} {COUNTS[s]:>6} {st['parameter_bytes'] / 2**30:11.3f} "
              f"{hand_parameter_bytes(s) / 2**30:9.3f} {st['optimizer_state_bytes'] / 2**30:14.2f} "
              f"{st['activation_bytes'] / 2**30:16.2f}")


if __name__ == "__main__":
    main()

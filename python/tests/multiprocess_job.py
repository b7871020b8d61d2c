"""A training job as a user writes one: every process runs this script (under
`python -m ernie.distributed.launch`, or alone as one process with every
rank), compiles the same program, trains on its own ranks and checkpoints
every step; a restarted job continues from the newest checkpoint.

    multiprocess_job.py MODEL OUT [--ranks-per-process R] [--steps N]
        [--local-rows] [--kill-at STEP:PROCESS] [--timeout S]
        [--differ-on PROCESS]

MODEL is "llama" (the README's example: dp x mp, ZeRO-1, 4 ranks) or "moe"
(a toy ERNIE 4.5 MoE pipelined on pp x dp with experts on dp: dp x pp x ep
on 4 ranks, 1F1B over 2 micro-batches). Process 0 writes OUT/losses.json,
OUT/state.npz (state_dict(), gathered from every process)
(one loss per step, carried through restarts in the checkpoints' data
position); OUT/ckpt holds the checkpoints. `--kill-at` SIGKILLs a process
at the start of a step in the job's first attempt (`--freeze`: SIGSTOPs
it, a process alive but stuck); `--differ-on` makes one
process compile a different model (a bug to catch). Used by
test_multiprocess.py and bench/multiprocess.py.
"""

import argparse
import json
import os
import signal
import sys
from pathlib import Path

import numpy as np

import ernie
import ernie.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("model", choices=["llama", "moe"])
p.add_argument("out", type=Path)
p.add_argument("--ranks-per-process", type=int, default=1)
p.add_argument("--steps", type=int, default=4)
p.add_argument("--local-rows", action="store_true")
p.add_argument("--kill-at", default=None)
p.add_argument("--freeze", action="store_true", help="--kill-at stops the process (SIGSTOP) instead")
p.add_argument("--timeout", type=float, default=60.0)
p.add_argument("--differ-on", type=int, default=None)
p.add_argument("--trace", default=None)
args = p.parse_args()

env = dist.init_parallel_env(ranks_per_process=args.ranks_per_process)
B, S = 8, 16


def batch(step):
    """Step `step`'s global batch: the same on every process."""
    rng = np.random.default_rng(1000 + step)
    ids = rng.integers(0, 128, (B, S)).astype(np.int64)
    return ids, ids  # Hugging Face's labels: the model shifts them


if args.model == "llama":
    from ernie.models.llama import LlamaConfig, LlamaForCausalLM, parallelize_plan
    layers = 2 if args.differ_on != env.rank else 3
    model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=layers, num_attention_heads=4,
                                         num_key_value_heads=2))
    mesh = dist.ProcessMesh([[0, 1], [2, 3]], dim_names=["dp", "mp"])
    strategy = ernie.Strategy(dp=ernie.DataParallel(sharding_level=1),
                              mp=ernie.TensorParallel(parallelize_plan=parallelize_plan()))
else:
    from ernie.models.ernie4_5 import Ernie4_5Config, Ernie4_5_MoeForCausalLM
    from ernie.moe import set_token_groups
    model = Ernie4_5_MoeForCausalLM(Ernie4_5Config(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, moe_num_experts=4, moe_k=2,
        moe_num_shared_experts=1, moe_intermediate_size=16, moe_layer_start_index=1,
        router_aux_loss_coef=0.01, seed=4))
    set_token_groups(model, 4)
    mesh = dist.ProcessMesh([[0, 1], [2, 3]], dim_names=["pp", "dp"])
    strategy = ernie.Strategy(
        dp=ernie.DataParallel(),
        ep=ernie.ExpertParallel(axis="dp"),
        pp=ernie.PipelineParallel(split_spec="model.layers", accumulate_steps=2))

ids, labels = batch(0)
program = ernie.compile(model, ernie.optimizer.AdamW(1e-2), [ids, labels], mesh,
                        strategy=strategy, timeout=args.timeout, trace=args.trace is not None)
ckpt = args.out / "ckpt"
losses, start = [], 0
if ckpt.exists() and any(ckpt.glob("step-*")):
    losses = program.load_checkpoint(ckpt)["data_position"]["losses"]
    start = program.step_count
restart = int(os.environ.get("ERNIE_RESTART_COUNT", "0"))
kill_step, kill_process = map(int, args.kill_at.split(":")) if args.kill_at else (None, None)
rows = dist.local_batch(program)
for step in range(start, args.steps):
    if step == kill_step and env.rank == kill_process and restart == 0:
        os.kill(os.getpid(), signal.SIGSTOP if args.freeze else signal.SIGKILL)
    ids, labels = batch(step)
    if args.local_rows:
        loss = program.step(ids[rows], labels[rows], rows=rows)
    else:
        loss = program.step(ids, labels)
    losses.append(loss)
    program.save_checkpoint(ckpt, keep=2, data_position={"losses": losses})
if args.trace:
    program.write_trace(args.trace)
state = program.state_dict()  # a collective: every process asks, each gets it all
if env.rank == 0:
    (args.out / "losses.json").write_text(json.dumps(losses))
    np.savez(args.out / "state.npz", **state)
print(f"process {env.rank}: done, {len(losses)} losses, rows {rows.tolist()}", flush=True)
sys.exit(0)

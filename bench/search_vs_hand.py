#!/usr/bin/env python3
"""The searched plan against the plan a Megatron user would write, both run.

On 8 CPU thread ranks (this machine, calibrated as cost_calibration.py
does), for cost_calibration.py's small Llama and small ERNIE 4.5 MoE:
`auto_plan` on the calibrated cluster gives ernie's plan; the hand plan is
what a Megatron user writes for one 8-GPU node (dense: tensor parallelism
4 with sequence parallelism, data parallelism 2; MoE: expert parallelism 8
over the data-parallel ranks, Megatron's --expert-model-parallel-size 8).
Both are compiled and measured (the best of --repeat rounds, each timing
every program in turn); the table gives the predicted and the measured
ratio hand / searched. Where the search predicts its plan is faster, the
measured ratio says whether the machine agrees.

    PYTHONPATH=build/python .venv/bin/python bench/search_vs_hand.py
"""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cost_calibration as cc  # noqa: E402

import ernie  # noqa: E402
from ernie import autoplan, cost  # noqa: E402
from ernie.models.ernie4_5 import Ernie4_5Config, Ernie4_5_MoeForCausalLM  # noqa: E402
from ernie.models.llama import LlamaConfig, LlamaForCausalLM  # noqa: E402

# family: (model class, config class, fields, the hand plan's name in cc.PLANS)
MODELS = {
    "dense": (LlamaForCausalLM, LlamaConfig, cc.MODEL, "dp2 mp4 sp"),
    "moe": (Ernie4_5_MoeForCausalLM, Ernie4_5Config, cc.MOE, "moe dp8 ep8@dp"),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--calibration-repeats", type=int, default=15)
    a = ap.parse_args()
    cluster = cost.calibrate_cpu(ranks=8, repeats=a.calibration_repeats)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cc.MODEL["vocab_size"], (cc.BATCH, cc.SEQ))
    batch = (ids, ids)
    print(f"{'model':6} {'plan':34} {'predicted ms':>12} {'measured ms':>12}")
    for family, (model_class, config_class, fields, hand) in MODELS.items():
        with ernie.nn.abstract():
            abstract_model = model_class(config_class(**fields))
        plans = autoplan.auto_plan(abstract_model, cluster=cluster, global_batch=cc.BATCH,
                                   seq_len=cc.SEQ, ranks=8, top=1)
        best = plans[0]
        searched = ernie.compile(model_class(config_class(**fields)),
                                 ernie.optimizer.AdamW(1e-3), list(batch), mesh=best.mesh,
                                 config=best.config or None)
        searched.step(*batch)
        programs = {best.name: searched, hand: cc.compile_plan(hand, batch)}
        measured = cc.measure_round_robin(programs, a.steps, a.repeat, batch)
        predicted = {name: prog.estimate(cluster)["step_seconds"]
                     for name, prog in programs.items()}
        for name in programs:
            print(f"{family:6} {name:34} {predicted[name] * 1e3:12.1f} "
                  f"{measured[name] * 1e3:12.1f}")
        p = predicted[hand] / predicted[best.name]
        m = measured[hand] / measured[best.name]
        verdict = ("agrees" if (p > 1) == (m > 1) else "disagrees") if p != 1 else "same plan"
        print(f"{family:6} hand / searched: predicted {p:.2f}x, measured {m:.2f}x ({verdict})\n",
              flush=True)


if __name__ == "__main__":
    main()

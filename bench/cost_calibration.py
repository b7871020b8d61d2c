#!/usr/bin/env python3
"""The cost model against measured step times on this machine.

Calibrates this CPU (ernie.cost.calibrate_cpu: dispatch, memory bandwidth,
GEMM peaks, the thread engine's all-reduce alpha/beta on 8 ranks), then for
each of 24 plans of a small Llama and 8 of a small ERNIE 4.5 MoE on 8 CPU
thread ranks (dp, mp, pp, ZeRO 1-3, sequence parallelism, recomputation,
micro-batches, buckets, mixed; no ep, ep on its own axis, ep on the ZeRO
axis, ep with mp and pp)
compiles the training step, predicts its time with the cost model
(Program.estimate) and measures it (the best of --repeat rounds, each
timing --steps steps of every plan in turn, after one warm-up step). Prints a table of
predicted against measured, the Spearman rank correlation and the median
relative error, for all the plans and for the MoE ones alone (targets: >=
0.9 and <= 20 %).

    PYTHONPATH=build/python .venv/bin/python bench/cost_calibration.py
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "build" / "python"))

import ernie  # noqa: E402
import ernie.distributed as dist  # noqa: E402
from ernie import cost  # noqa: E402
from ernie.models.llama import LlamaConfig, LlamaForCausalLM, parallelize_plan  # noqa: E402

MODEL = dict(vocab_size=512, hidden_size=128, intermediate_size=352, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=4, seed=0)
BATCH, SEQ = 16, 64
# The MoE plans' model: ERNIE 4.5 MoE, every layer but the first MoE, 8
# experts top-2, one shared expert, capacity factor 1.25.
MOE = dict(vocab_size=512, hidden_size=128, intermediate_size=352, num_hidden_layers=4,
           num_attention_heads=8, num_key_value_heads=4, moe_num_experts=8, moe_k=2,
           moe_num_shared_experts=1, moe_intermediate_size=96, moe_layer_start_index=1,
           moe_capacity_factor=1.25, seed=0)

TP = {"parallelize_plan": parallelize_plan()}
SP = {"parallelize_plan": parallelize_plan(sequence_parallel=True)}


def pp(m=2, **kw):
    return {"split_spec": "llama.layers", "accumulate_steps": m, **kw}


# name: (mesh shape, mesh axis names, parallelize config)
PLANS = {
    "dp8": ([8], ["dp"], {"dp_config": {}}),
    "dp8 zero1": ([8], ["dp"], {"dp_config": {"sharding_level": 1}}),
    "dp8 zero2": ([8], ["dp"], {"dp_config": {"sharding_level": 2}}),
    "dp8 zero3": ([8], ["dp"], {"dp_config": {"sharding_level": 3}}),
    "dp8 unbucketed": ([8], ["dp"], {"dp_config": {"bucket_mb": 0}}),
    "dp8 full recompute": ([8], ["dp"], {"dp_config": {}, "recompute": "full"}),
    "mp8": ([8], ["mp"], {"mp_config": TP}),
    "mp8 sp": ([8], ["mp"], {"mp_config": SP}),
    "mp8 selective": ([8], ["mp"], {"mp_config": TP, "recompute": "selective"}),
    "dp2 mp4": ([2, 4], ["dp", "mp"], {"dp_config": {}, "mp_config": TP}),
    "dp4 mp2": ([4, 2], ["dp", "mp"], {"dp_config": {}, "mp_config": TP}),
    "dp4 mp2 sp": ([4, 2], ["dp", "mp"], {"dp_config": {}, "mp_config": SP}),
    "dp2 mp4 sp": ([2, 4], ["dp", "mp"], {"dp_config": {}, "mp_config": SP}),
    "dp2 mp4 zero1": ([2, 4], ["dp", "mp"], {"dp_config": {"sharding_level": 1}, "mp_config": TP}),
    "dp4 mp2 full recompute": ([4, 2], ["dp", "mp"],
                               {"dp_config": {}, "mp_config": TP, "recompute": "full"}),
    "pp2 dp4": ([2, 4], ["pp", "dp"], {"dp_config": {}, "pp_config": pp(2)}),
    "pp2 dp4 m4": ([2, 4], ["pp", "dp"], {"dp_config": {}, "pp_config": pp(4)}),
    "pp4 dp2": ([4, 2], ["pp", "dp"], {"dp_config": {}, "pp_config": pp(4)}),
    "pp2 mp4": ([2, 4], ["pp", "mp"], {"mp_config": TP, "pp_config": pp(2)}),
    "pp4 mp2": ([4, 2], ["pp", "mp"], {"mp_config": TP, "pp_config": pp(4)}),
    "pp2 dp2 mp2": ([2, 2, 2], ["pp", "dp", "mp"],
                    {"dp_config": {}, "mp_config": TP, "pp_config": pp(2)}),
    "pp2 dp2 mp2 full recompute": ([2, 2, 2], ["pp", "dp", "mp"],
                                   {"dp_config": {}, "mp_config": TP, "pp_config": pp(2),
                                    "recompute": "full"}),
    "pp2 vpp2 dp4": ([2, 4], ["pp", "dp"],
                     {"dp_config": {}, "pp_config": pp(4, vpp_degree=2)}),
    "pp2 dp4 zero1": ([2, 4], ["pp", "dp"],
                      {"dp_config": {"sharding_level": 1}, "pp_config": pp(2)}),
    # MoE (the names say "moe"): ERNIE 4.5 MoE.
    "moe dp8": ([8], ["dp"], {"dp_config": {}}),
    "moe dp8 ep8@dp": ([8], ["dp"], {"dp_config": {}, "ep_config": {"axis": "dp"}}),
    "moe dp8 ep8@dp zero1": ([8], ["dp"], {"dp_config": {"sharding_level": 1},
                                           "ep_config": {"axis": "dp"}}),
    "moe dp4 ep2": ([4, 2], ["dp", "ep"], {"dp_config": {}, "ep_config": {"axis": "ep"}}),
    "moe dp2 ep4": ([2, 4], ["dp", "ep"], {"dp_config": {}, "ep_config": {"axis": "ep"}}),
    "moe ep8": ([8], ["ep"], {"ep_config": {"axis": "ep"}}),
    "moe dp4 mp2 ep4@dp": ([4, 2], ["dp", "mp"], {"dp_config": {}, "ep_config": {"axis": "dp"},
                                                  "mp_config": {"parallelize_plan": None}}),
    "moe pp2 dp4 ep4@dp": ([2, 4], ["pp", "dp"], {"dp_config": {}, "ep_config": {"axis": "dp"},
                                                  "pp_config": {"split_spec": "model.layers",
                                                                "accumulate_steps": 2}}),
}


def spearman(a, b):
    def ranks(x):
        order = np.argsort(x)
        r = np.empty(len(x))
        r[order] = np.arange(len(x))
        return r
    ra, rb = ranks(np.array(a)), ranks(np.array(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def compile_plan(name, batch):
    shape, names, config = PLANS[name]
    mesh = dist.ProcessMesh(np.arange(int(np.prod(shape))).reshape(shape), names)
    if name.startswith("moe"):
        from ernie.models.ernie4_5 import Ernie4_5Config, Ernie4_5_MoeForCausalLM
        model = Ernie4_5_MoeForCausalLM(Ernie4_5Config(**MOE))
        if "mp_config" in config:
            config = {**config, "mp_config": {"parallelize_plan": model.parallelize_plan()}}
    else:
        model = LlamaForCausalLM(LlamaConfig(**MODEL))
    prog = ernie.compile(model, ernie.optimizer.AdamW(1e-3), list(batch), mesh=mesh,
                         config=config)
    prog.step(*batch)  # warm: first-touch pages, BLAS buffers
    return prog


def measure_round_robin(programs, steps, repeats, batch):
    """The best step time of each program over `repeats` rounds, each round
    timing every program in turn: this machine drifts by tens of percent
    over minutes, and a drift should slow every plan alike, not the ones
    measured last."""
    best = {name: float("inf") for name in programs}
    for _ in range(repeats):
        for name, prog in programs.items():
            t = time.perf_counter()
            for _ in range(steps):
                prog.step(*batch)
            best[name] = min(best[name], (time.perf_counter() - t) / steps)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5, help="rounds over every plan")
    ap.add_argument("--calibration-repeats", type=int, default=15)
    ap.add_argument("--plans", nargs="*", default=None, help="a subset of the plans")
    a = ap.parse_args()

    cluster = cost.calibrate_cpu(ranks=8, repeats=a.calibration_repeats)
    d, link = cluster["device"], cluster["intra_node"]
    print(f"calibrated: GEMM f32 {d['peak_flops']['f32'] / 1e9:.1f} GFLOP/s, bf16 "
          f"{d['peak_flops']['bf16'] / 1e9:.1f}; elementwise {d['vector_flops'] / 1e9:.2f} "
          f"GFLOP/s; memory {d['memory_bandwidth'] / 1e9:.1f} GB/s; dispatch "
          f"{d['launch_overhead'] * 1e9:.0f} ns; thread all-reduce alpha "
          f"{link['latency'] * 1e6:.1f} us, beta {link['bandwidth'] / 1e9:.2f} GB/s; "
          f"{cluster['shared_processors']} cores shared by 8 ranks")
    print(f"model: Llama {MODEL}, batch {BATCH} x seq {SEQ}, AdamW, f32, 8 thread ranks\n")

    rng = np.random.default_rng(0)
    ids = rng.integers(0, MODEL["vocab_size"], (BATCH, SEQ))
    batch = (ids, ids)  # Hugging Face's labels: the model shifts them
    rows = []
    print(f"{'plan':28} {'predicted ms':>12} {'measured ms':>12} {'error':>7}  "
          f"{'compute':>8} {'comm':>8} {'bubble':>7} {'contention':>10}")
    programs = {name: compile_plan(name, batch) for name in a.plans or PLANS}
    measured_times = measure_round_robin(programs, a.steps, a.repeat, batch)
    for name, prog in programs.items():
        est, measured = prog.estimate(cluster), measured_times[name]
        p = est["step_seconds"]
        err = p / measured - 1
        rows.append((name, p, measured, err))
        print(f"{name:28} {p * 1e3:12.1f} {measured * 1e3:12.1f} {err * 100:+6.1f}%  "
              f"{est['compute_seconds'] * 1e3:8.1f} "
              f"{sum(est['exposed_comm_seconds'].values()) * 1e3:8.1f} "
              f"{est['bubble_seconds'] * 1e3:7.1f} {est['contention_seconds'] * 1e3:10.1f}",
              flush=True)
    for what, chosen in (("", rows), (" MoE", [r for r in rows if r[0].startswith("moe")])):
        if len(chosen) > 2:
            rho = spearman([r[1] for r in chosen], [r[2] for r in chosen])
            med = statistics.median(abs(r[3]) for r in chosen)
            print(f"\n{len(chosen)}{what} plans: Spearman rank correlation {rho:.3f} (target "
                  f">= 0.9), median |relative error| {med * 100:.1f} % (target <= 20 %)")


if __name__ == "__main__":
    main()

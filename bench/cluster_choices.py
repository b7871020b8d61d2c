#!/usr/bin/env python3
"""What choosing collectives by their time on a cluster changes.

Sharding propagation and partition pick layouts and resharding plans by a
cost per collective. Without a cluster it is the bytes one rank sends; with
`compile(cluster=...)` it is the cost model's time for that collective on
the cluster (a latency per ring or tree hop, the bytes over the bandwidth of
the links its group crosses). Each row compiles one plan both ways (a small
bf16 Llama, abstract: no values) and predicts both programs' steps with the
whole-step model on the same cluster, which also sees what the per-
collective cost cannot (overlap with compute, buckets, the pipeline).

Columns: collectives per step and bytes sent per rank, each way; the
predicted step of each program; time-chosen / byte-chosen (below 1: the
cluster's costs chose a faster program).

    python3 bench/cluster_choices.py [--cluster two_nodes|dgx_h100|FILE]
"""

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "build" / "python"))

import ernie  # noqa: E402
import ernie.distributed as dist  # noqa: E402
from ernie import cost  # noqa: E402
from ernie.models.llama import LlamaConfig, LlamaForCausalLM, parallelize_plan  # noqa: E402

MODEL = dict(vocab_size=1024, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
             num_attention_heads=8, num_key_value_heads=8, dtype="bf16")


def _tp(sp):
    return {"mp_config": {"parallelize_plan": parallelize_plan(sequence_parallel=sp)}}


PLANS = [
    ("dp 2 x mp 4", [2, 4], ["dp", "mp"], _tp(False)),
    ("dp 2 x mp 4, sp", [2, 4], ["dp", "mp"], _tp(True)),
    ("dp 2 x mp 4, sp, zero3", [2, 4], ["dp", "mp"], {**_tp(True), "dp_config": {"sharding_level": 3}}),
    ("dp 4 x mp 2, sp, zero1", [4, 2], ["dp", "mp"], {**_tp(True), "dp_config": {"sharding_level": 1}}),
    ("dp 8, zero3", [8], ["dp"], {"dp_config": {"sharding_level": 3}}),
    ("mp 2 x dp 4, sp (mp across nodes)", [2, 4], ["mp", "dp"], _tp(True)),
]


def _compile(shape, names, config, cluster):
    with ernie.nn.abstract():
        model = LlamaForCausalLM(LlamaConfig(**MODEL))
    mesh = dist.ProcessMesh(np.arange(int(np.prod(shape))).reshape(shape).tolist(), names)
    ids = np.zeros((8, 64), np.int64)
    return ernie.compile(model, ernie.optimizer.AdamW(1e-3), [ids, ids], mesh=mesh,
                         config=config, abstract=True, cluster=cluster)


def _collectives(program):
    report = program.report()["collectives"]
    return sum(v["count"] for v in report.values()), sum(v["bytes"] for v in report.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", default="two_nodes",
                    help="two_nodes (2 x 4 H100s, 50 GB/s and 10 us between nodes), "
                         "a shipped cluster or a JSON file")
    a = ap.parse_args()
    cluster = cost.make_cluster("h100_sxm", nodes=2, devices_per_node=4,
                                intra_node=(450e9, 3e-6), inter_node=(50e9, 1e-5),
                                name="2 x 4 H100") if a.cluster == "two_nodes" else a.cluster
    name = cost.load_cluster(cluster).get("name", a.cluster)
    print(f"cluster: {name}; model: {MODEL['num_hidden_layers']} bf16 Llama layers, hidden "
          f"{MODEL['hidden_size']}, batch 8 x 64; AdamW")
    print()
    head = (f"{'plan':36} {'colls':>11} {'KB sent/rank':>15} | {'bytes ms':>9} {'time ms':>9} "
            f"{'time/bytes':>10}")
    print(head)
    print("-" * len(head))
    ratios = []
    for label, shape, names, config in PLANS:
        by_bytes = _compile(shape, names, config, None)
        by_time = _compile(shape, names, config, cluster)
        (cb, bb), (ct, bt) = _collectives(by_bytes), _collectives(by_time)
        slow = by_bytes.estimate(cluster)["step_seconds"]
        fast = by_time.estimate()["step_seconds"]
        ratios.append(fast / slow)
        same = " (same)" if by_time.mlir == by_bytes.mlir else ""
        print(f"{label:36} {cb:>5}/{ct:<5} {bb / 1e3:>7.0f}/{bt / 1e3:<7.0f} | "
              f"{slow * 1e3:9.3f} {fast * 1e3:9.3f} {fast / slow:10.3f}{same}")
    print()
    print(f"(colls and KB: chosen by bytes / by time; geometric mean time/bytes "
          f"{float(np.exp(np.mean(np.log(ratios)))):.3f})")


if __name__ == "__main__":
    main()

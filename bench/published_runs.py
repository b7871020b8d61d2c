#!/usr/bin/env python3
"""The cost model held to published training runs (bench/published_runs.json).

For each row of published_runs.json (dense and MoE; A100, H100, H800):
builds the abstract model, the cluster and the published plan as an
autoplan.Candidate, prices that plan directly (compiled abstractly at one
and two layers per pipeline chunk and extrapolated to the model's depth,
as auto_plan prices every candidate), then runs auto_plan narrowed around
the published plan to find where the published plan ranks in ernie's
search and how much faster ernie's best plan is predicted to be.

Like with like. Each source counts FLOPs its own way, and each row names
the figure it compares:
- Narayanan et al. 2021 (Megatron-LM, SC21): TFLOP/s per GPU under a
  formula that assumes full recomputation (4 passes over the layers):
  hardware FLOPs. Compared with ernie's HFU (model + recomputed FLOPs),
  the published plan priced with full recomputation.
- Korthikanti et al. 2022: MFU (model FLOPs) and HFU (plus the selective
  recomputation's attention FLOPs), both; MFU compared with ernie's MFU,
  the plan priced with selective recomputation.
- Llama 3 (Dubey et al. 2024), MoE Parallel Folding (Liu et al. 2025): BF16
  MFU of model FLOPs (for MoE, the activated experts): ernie's MFU.
What cannot be compared gets its reason in the table instead of a number.

Model shapes ernie builds. GPT's GeLU MLP (2 matrices of 4h) is a Llama
SwiGLU MLP of equal parameters and FLOPs (3 matrices of 8h/3, rounded to a
multiple of 64), MHA, untied; Mixtral 8x22B and Qwen2-57B-A14B are ERNIE
4.5 MoE configs (every layer MoE; Mixtral moe_num_shared_experts = 0;
Qwen2's shared expert of width 20480 = 8 shared experts of 2560, without
Qwen2's sigmoid gate on it, and without its q/k/v biases).

Plans. Fields a source does not state (micro-batch size, interleaving,
ZeRO, recomputation) are set as the table says (marked *) for the direct
price; the rank is that of the best searched plan that agrees with every
field the source does state. "best vs pub" is the predicted step time of
the published plan (direct price) over that of the search's best
(both extrapolated the same way).

    PYTHONPATH=build/python .venv/bin/python bench/published_runs.py [--only N ...] [--no-search]
        [--json OUT]    (then --from-json OUT ... prints the merged table of runs)
"""

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "build" / "python"))

import ernie  # noqa: E402
from ernie import autoplan, cost  # noqa: E402
from ernie.autoplan import Candidate  # noqa: E402
from ernie.models.ernie4_5 import Ernie4_5Config, Ernie4_5ForCausalLM  # noqa: E402
from ernie.models.llama import LlamaConfig, LlamaForCausalLM  # noqa: E402
from ernie.optimizer import AdamW  # noqa: E402

RUNS = json.loads((ROOT / "bench" / "published_runs.json").read_text())


# --------------------------------------------------------------------------
# Models and clusters
# --------------------------------------------------------------------------

def gpt_as_llama(shape, layers=None):
    """GPT (GeLU MLP of 4h, MHA, learned positions) as a Llama of equal
    parameters and FLOPs: SwiGLU of 8h/3 rounded to a multiple of 64."""
    h = shape["hidden"]
    ffn = round(2 * shape["ffn"] / 3 / 64) * 64
    with ernie.nn.abstract():
        return LlamaForCausalLM(LlamaConfig(
            dtype="bf16", vocab_size=shape["vocab"], hidden_size=h, intermediate_size=ffn,
            num_hidden_layers=layers or shape["layers"], num_attention_heads=shape["heads"],
            num_key_value_heads=shape["kv_heads"]))


def llama(shape, layers=None):
    with ernie.nn.abstract():
        return LlamaForCausalLM(LlamaConfig(
            dtype="bf16", vocab_size=shape["vocab"], hidden_size=shape["hidden"],
            intermediate_size=shape["ffn"], num_hidden_layers=layers or shape["layers"],
            num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
            rope_theta=500000.0))


def ernie_moe(shape, vocab, shared, shared_width_note=""):
    """A MoE of every layer MoE as an ERNIE 4.5 MoE config."""
    with ernie.nn.abstract():
        return Ernie4_5ForCausalLM(Ernie4_5Config(
            dtype="bf16", vocab_size=vocab, hidden_size=shape["hidden"],
            intermediate_size=shape["expert_ffn"], num_hidden_layers=shape["layers"],
            num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
            tie_word_embeddings=False, moe_num_experts=shape["routed_experts"],
            moe_k=shape["top_k"], moe_num_shared_experts=shared,
            moe_intermediate_size=shape["expert_ffn"], moe_layer_start_index=0))


SELENE = "selene_a100"  # 384 DGX A100 80GB, NVLink 300 GB/s, IB 25 GB/s per GPU


def selene(gpus):
    spec = cost.load_cluster(SELENE)
    spec["nodes"] = gpus // 8
    return spec


def h100_eos(gpus):
    """DGX H100 (Eos): NVLink 450 GB/s each way, 400 Gb/s IB per GPU."""
    return cost.make_cluster("h100_sxm", nodes=gpus // 8, devices_per_node=8,
                             intra_node=(450e9, 3e-6), inter_node=(50e9, 1e-5),
                             name=f"{gpus // 8} DGX H100 (IB 400 Gb/s per GPU)")


# --------------------------------------------------------------------------
# The rows: what ernie builds for each, or why it cannot compare it
# --------------------------------------------------------------------------

def rows():
    """index -> dict: model (thunk), cluster, batch, seq, ranks, published
    (Candidate priced directly), stated (the fields the source states),
    assumed (what the direct price sets beyond them), choices (the
    narrowed search), metric ('mfu'/'hfu'), published figure and its FLOP
    count; or skip: the reason it is not compared."""
    r = {}
    rc_full = dict(recompute="full", gradient_accumulation_fusion=False)

    # 0-2. Narayanan et al. 2021 (hardware FLOPs: full recomputation counted).
    def narayanan(row, gpus, batch, dp, mp, pp, tflops, choices, stated=None, assumed=None,
                  **extra):
        return dict(model=lambda: gpt_as_llama(row["shape"]), cluster=selene(gpus), batch=batch,
                    seq=2048, ranks=gpus,
                    published=Candidate(dp=dp, mp=mp, pp=pp, micro_batch_size=1,
                                        micro_batches=batch // dp, **rc_full),
                    stated=stated or dict(dp=dp, mp=mp, pp=pp),
                    assumed=assumed or "vpp1* mbs1* no-gaf*",
                    choices={**choices, "vpp": [1], "micro_batch_size": [1],
                             "gradient_accumulation_fusion": [False]},
                    metric="hfu", figure=tflops / 312,
                    figure_note=f"{tflops} TFLOP/s = {tflops / 312 * 100:.1f} % of 312, hardware "
                                f"FLOPs (full recompute counted)", **extra)
    # 0. 145.6B, 1536 A100: tp8 pp8 dp24, 47 % of peak.
    r[0] = narayanan(RUNS[0], 1536, 2304, 24, 8, 8, 148, {"mp": [4, 8], "pp": [4, 8, 16]})
    # 1. 1T, 3072 A100: tp8 pp64 dp6, 52 %.
    r[1] = narayanan(RUNS[1], 3072, 3072, 6, 8, 64, 163, {"mp": [8], "pp": [32, 64, 128]})
    # 2. 174.6B, 384 A100: tp*pp = 96 (split not stated), dp4.
    r[2] = narayanan(RUNS[2], 384, 1536, 4, 8, 12, 153, {"mp": [4, 8], "pp": [12, 24]},
                     stated=dict(dp=4), assumed="tp8* pp12* (only tp*pp=96 stated) mbs1 no-gaf*",
                     rank_on=dict(dp=4, mp=8, pp=12))
    # 3-5. Korthikanti et al. 2022 (MFU, model FLOPs): sp, selective recomputation.
    # (Each run's global batch is its GPU count of 2048-token sequences.)
    def korthikanti(row, gpus, dp, pp, vpp, mfu, choices, assumed="gaf*", hfu=None, **extra):
        batch = gpus
        return dict(model=lambda: gpt_as_llama(row["shape"]), cluster=selene(gpus), batch=batch,
                    seq=2048, ranks=gpus,
                    published=Candidate(dp=dp, mp=8, pp=pp, vpp=vpp, sequence_parallel=True,
                                        recompute="selective", micro_batch_size=1,
                                        micro_batches=batch // dp),
                    stated=dict(dp=dp, mp=8, pp=pp, **({"vpp": vpp} if vpp > 1 else {}),
                                sequence_parallel=True),
                    assumed=assumed, choices={**choices, "micro_batch_size": [1]},
                    metric="mfu", figure=mfu,
                    figure_note=f"MFU {mfu * 100:.1f} % (model FLOPs"
                                + (f"; HFU {hfu * 100:.1f} %)" if hfu else ")"),
                    **({"hfu_figure": hfu} if hfu else {}), **extra)
    # 3. GPT-3 175B, 64 A100: tp8 pp8 dp1 vpp3, MFU 51.4 / HFU 52.8.
    r[3] = korthikanti(RUNS[3], 64, 1, 8, 3, 0.514,
                       {"mp": [4, 8], "pp": [4, 8, 16], "vpp": [1, 2, 3]}, hfu=0.528, max_vpp=3)
    # 4. MT-NLG 530B, 2240 A100: tp8 pp35 dp8 vpp3, MFU 54.2.
    r[4] = korthikanti(RUNS[4], 2240, 8, 35, 3, 0.542, {"mp": [8], "pp": [35], "vpp": [1, 3]},
                       max_vpp=3)
    # 5. GPT 1T, 512 A100: tp8 pp64 dp1, MFU 56.3 / HFU 57.0.
    r[5] = korthikanti(RUNS[5], 512, 1, 64, 1, 0.563, {"mp": [8], "pp": [32, 64], "vpp": [1, 2]},
                       assumed="vpp1* gaf*", hfu=0.570)
    # 6, 7. Llama 3 405B, 8,192 and 16,384 H100: tp8 pp16 dp64/128, MFU 43 / 41.
    for i, dp, figure in ((6, 64, 0.43), (7, 128, 0.41)):
        row6 = RUNS[i]
        r[i] = dict(model=lambda row6=row6: llama(row6["shape"]),
                    cluster="meta_llama3_h100", batch=2048, seq=8192, ranks=dp * 128,
                    published=Candidate(dp=dp, mp=8, pp=16, sequence_parallel=True, zero=1,
                                        micro_batch_size=1, micro_batches=2048 // dp,
                                        layers_per_stage=autoplan.uneven_stages(126, 16)),
                    stated=dict(dp=dp, mp=8, pp=16),
                    assumed="126 layers as [7, 8 x 14, 7] (Meta's); vpp, mbs not stated: "
                            "vpp1 mbs1 sp zero1 (FSDP ~ZeRO-2) no-rc (stated) priced, else the "
                            "search's first that fits",
                    choices={"mp": [8], "pp": [8, 16], "vpp": [1, 2, 4], "micro_batch_size": [1]},
                    max_vpp=4, metric="mfu", figure=figure, knobs_assumed=True,
                    figure_note=f"MFU {figure * 100:.0f} % (BF16 model FLOPs)")
    r[8] = dict(skip="context parallelism (cp16) is not a plan ernie builds; the row's dp is "
                     "inconsistent (8*16*16*4 = 8,192, not 16,384 GPUs)")
    r[9] = dict(skip="parallel transformer block and sliding-window attention are not shapes "
                     "ernie builds; GPU SKU and FFN not stated; FLOP count of SWA unclear")
    r[10] = dict(skip="MLA attention and FP8 GEMMs are not shapes ernie builds; DualPipe not "
                      "a schedule it has; no MFU/TFLOP/s reported (GPU-hours only)")
    # 11, 12. MoE Parallel Folding's no-folding baselines: MCore TP2 EPn PPk, ETP = TP.
    def mcore_moe(row, vocab, shared, gpus, pp, pps, model_note, figure, figure_note):
        return dict(model=lambda: ernie_moe(row["shape"], vocab, shared), cluster=h100_eos(gpus),
                    batch=256, seq=4096, ranks=gpus,
                    published=Candidate(dp=2, mp=2, pp=pp, ep=4, micro_batch_size=1,
                                        micro_batches=256 // 8),
                    stated=dict(dp=2, mp=2, pp=pp, ep=4, ep_on_dp=False),
                    assumed=f"no-folding baseline TP2 EP4 PP{pp} (ernie's ep axis inside dp8, "
                            f"experts also split over mp as MCore's ETP=TP); {model_note}; "
                            "mbs1* vpp1*; ZeRO and recompute not stated: "
                            "zero0 no-rc priced, else the search's first that fits",
                    choices={"mp": [1, 2, 4], "pp": pps, "vpp": [1], "micro_batch_size": [1],
                             "ep": [1, 2, 4, 8]},
                    metric="mfu", figure=figure, knobs_assumed=True, figure_note=figure_note)
    r[11] = mcore_moe(RUNS[11], 32000, 0, 128, 8, [4, 8], "vocab 32000*", 0.463,
                      "MFU 46.3 % (458.3 TFLOP/s, BF16 model FLOPs), MCore without folding; "
                      "with folding (TP2 ETP1 EP8): 49.3 %")
    r[12] = mcore_moe(RUNS[12], 151936, 8, 64, 4, [2, 4],
                      "shared expert 20480 = 8 x 2560, no sigmoid gate, no qkv bias", 0.353,
                      "MFU 35.3 % (BF16 model FLOPs), MCore without folding; with folding "
                      "(TP2 ETP1 EP4, moe_dp 4): 39 %")
    r[13] = dict(skip="FP8 MLP GEMMs (the search plans BF16); ep 8 inside a 168-way sharding "
                      "group is not one of its expert layouts; MFU definition and the plan's link to the "
                      "47 % claim unverified; interconnect not stated")
    return r


# --------------------------------------------------------------------------
# Pricing and search
# --------------------------------------------------------------------------

def price(model, c, batch, seq, cluster, optimizer):
    """The published plan's step, as auto_plan prices a candidate: compiled
    at 1 and 2 layers per pipeline chunk, extrapolated to the full depth."""
    family = (type(model), model.config)
    spec = cost.load_cluster(cluster)
    chunks = c.pp * c.vpp
    per_chunk = max(c.layers_per_stage) if c.layers_per_stage else \
        model.config.num_hidden_layers // chunks
    one = autoplan._evaluate(family, c, chunks, batch, seq, spec, optimizer)
    two = autoplan._evaluate(family, c, 2 * chunks, batch, seq, spec, optimizer) \
        if per_chunk > 1 else one
    return autoplan._extrapolate(one, two, per_chunk, c.layers_per_stage), spec


def rank_of(ranked, want):
    for i, (c, guess) in enumerate(ranked, 1):
        if all(getattr(c, k) == v for k, v in want.items()):
            return i, c, guess
    return None, None, None


def run_row(i, r, search=True, workers=None):
    run = RUNS[i]
    out = {"row": i, "id": run["id"], "model": run["model"],
           "cluster": f"{run['cluster']['gpus']} x {run['cluster']['gpu'].split(' (')[0]}"}
    if "skip" in r:
        out["skip"] = r["skip"]
        return out
    t0 = time.perf_counter()
    model = r["model"]()
    optimizer = AdamW(1e-4)
    guess, spec = price(model, r["published"], r["batch"], r["seq"], r["cluster"], optimizer)
    e = guess["estimate"]
    limit = 0.9 * spec["device"]["memory_bytes"]
    out.update(published=r["published"].name, assumed=r["assumed"], metric=r["metric"],
               figure=r["figure"], figure_note=r["figure_note"],
               predicted=e[r["metric"]], mfu=e["mfu"], hfu=e["hfu"],
               step=e["step_seconds"], memory_gib=guess["memory_bytes"] / 2**30,
               fits=guess["memory_bytes"] <= limit, price_s=time.perf_counter() - t0)
    if "hfu_figure" in r:
        out["hfu_figure"] = r["hfu_figure"]
    print(f"[{i}] {r['published'].name}: {e['step_seconds']:.2f} s, MFU {e['mfu'] * 100:.1f} %, "
          f"HFU {e['hfu'] * 100:.1f} %, {out['memory_gib']:.1f} GiB "
          f"({out['price_s']:.0f} s)", flush=True)
    if not search:
        return out
    if not out["fits"] and r.get("knobs_assumed"):
        out["priced_as"] = "search"  # the memory knobs were ours: take the search's
    t1 = time.perf_counter()
    try:
        autoplan.auto_plan(model, cluster=r["cluster"], global_batch=r["batch"],
                           seq_len=r["seq"], ranks=r["ranks"], top=1, choices=r["choices"],
                           max_vpp=r.get("max_vpp", 2), workers=workers,
                           exhaustive=True)  # the published plan's rank, however far down
    except autoplan.NothingFits as err:
        out["search_error"] = str(err)[:160]
        return out
    s = autoplan.auto_plan.last_search
    ranked = s["ranked"]
    rank, c, match = rank_of(ranked, r.get("rank_on", r["stated"]))
    best_c, best_g = ranked[0]
    if out.get("priced_as") == "search" and c is not None:
        # The source states no memory knobs and ours do not fit: the
        # published structure with the knobs the search found to fit.
        e = match["estimate"]
        out.update(published=c.name, predicted=e[r["metric"]], mfu=e["mfu"], hfu=e["hfu"],
                   step=e["step_seconds"], memory_gib=match["memory_bytes"] / 2**30,
                   fits=True,
                   assumed=out["assumed"] + f" (priced as stated, needs {out['memory_gib']:.0f} GiB)")
    out.update(rank=rank, of=len(ranked), best=best_c.name,
               best_step=best_g["estimate"]["step_seconds"],
               best_metric=best_g["estimate"][r["metric"]],
               speedup=out["step"] / best_g["estimate"]["step_seconds"],
               ranked_as=c.name if c else None, compiles=s["compiles"],
               search_s=time.perf_counter() - t1)
    print(f"[{i}] search: best {best_c.name} {out['best_step']:.2f} s; published rank "
          f"{rank} of {len(ranked)} ({out['ranked_as']}); {s['compiles']} compiles, "
          f"{out['search_s']:.0f} s", flush=True)
    return out


def table(results):
    lines = ["| # | model | cluster | published plan (ernie's form; * assumed) | published "
             "figure (FLOP count) | ernie predicted (same count) | pred / pub | rank in "
             "search | our best plan | best vs pub (pred. speedup) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for o in results:
        head = f"| {o['row']} | {o['model']} | {o['cluster']} |"
        if "skip" in o:
            lines.append(head + f" - | - | not compared: {o['skip']} | - | - | - | - |")
            continue
        m = o["metric"].upper()
        pred = f"{m} {o['predicted'] * 100:.1f} %"
        if o["metric"] == "mfu":
            pred += f" (HFU {o['hfu'] * 100:.1f} %)"
        pred += f"; {o['step']:.2f} s/step"
        if not o["fits"]:
            pred += f"; needs {o['memory_gib']:.0f} GiB > 72"
        ratio = f"{o['predicted'] / o['figure']:.2f}"
        if "hfu_figure" in o:
            ratio += f" (HFU {o['hfu'] / o['hfu_figure']:.2f})"
        if "rank" in o:
            rank = f"{o['rank']} of {o['of']}" if o["rank"] else f"not fitting ({o['of']} fit)"
            best = f"{o['best']} ({m} {o['best_metric'] * 100:.1f} %)"
            speed = f"{o['speedup']:.2f}x"
        else:
            rank = best = speed = o.get("search_error", "not searched")
        lines.append(head + f" {o['published']} [{o['assumed']}] | {o['figure_note']} | {pred} "
                     f"| {ratio} | {rank} | {best} | {speed} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", type=int, nargs="*", help="row indices (0-13)")
    ap.add_argument("--no-search", action="store_true", help="price the published plans only")
    ap.add_argument("--workers", type=int)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--from-json", nargs="*", help="print the table of earlier --json runs "
                                                   "(merged, in row order) and stop")
    a = ap.parse_args()
    if a.from_json:
        merged = {o["row"]: o for f in a.from_json for o in json.loads(Path(f).read_text())}
        print(table([merged[k] for k in sorted(merged)]))
        return
    spec = rows()
    order = a.only if a.only else list(range(len(RUNS)))
    results = []
    for i in order:
        try:
            results.append(run_row(i, spec[i], not a.no_search, a.workers))
        except (ValueError, RuntimeError) as err:
            results.append({"row": i, "id": RUNS[i]["id"], "model": RUNS[i]["model"],
                            "cluster": f"{RUNS[i]['cluster']['gpus']} GPUs",
                            "skip": f"ernie failed: {str(err).splitlines()[0][:140]}"})
        if a.json:
            Path(a.json).write_text(json.dumps(results, indent=1))
    print()
    print(table(results))


if __name__ == "__main__":
    main()

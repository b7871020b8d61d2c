"""Compile time and per-rank model state of full-size models, compiled
abstractly (no tensor allocated): Llama-70B on dp x mp = 8 x 8 and a
7.5 B-parameter GPT on dp = 64, each at ZeRO levels 0-3, Llama-70B on
dp x pp x mp = 8 x 16 x 8 (1024 ranks; 16 micro-batches, 1F1B) at ZeRO-1,
ERNIE 4.5 MoE (21B-A3B, 300B-A47B) and the Qwen families' published sizes
(Qwen2.5-7B and -72B, Qwen3-8B, Qwen3-30B-A3B) beside hand counts.

    PYTHONPATH=build/python .venv/bin/python bench/abstract_compile.py

The 7.5 B rows are checked against Rajbhandari et al. (120 / 31.4 / 16.6 /
1.9 GB at dp = 64) by python/tests/test_frontend.py; this prints them beside
the compile time.
"""

import sys
import time
from pathlib import Path

import numpy as np

import ernie
import ernie.distributed as dist
from ernie.models.llama import LlamaConfig, LlamaForCausalLM, parallelize_plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python" / "tests"))
from test_frontend import GPT  # noqa: E402  (the GPT-style model of the ZeRO test)

PAPER = {0: 120, 1: 31.4, 2: 16.6, 3: 1.9}


def row(name, build, mesh, config_for, inputs, paper=None):
    with ernie.nn.abstract():
        model = build()
    params = sum(int(np.prod(p.shape)) for p in model.parameters())
    for level in range(4):
        t = time.time()
        prog = ernie.compile(model, ernie.optimizer.AdamW(1e-4, multi_precision=True), inputs,
                             mesh=mesh, config=config_for(level), abstract=True)
        seconds = time.time() - t
        r = prog.report()
        ref = f"{paper[level]:8.1f}" if paper else " " * 8
        print(f"{name:28s} {params / 1e9:6.2f}B  ZeRO-{level}  {seconds:6.1f} s  "
              f"{r['model_state_bytes'] / 1e9:9.2f} GB {ref}")


def main():
    print(f"{'model, mesh':28s} {'params':>7s}  {'level':6s} {'compile':>8s}  "
          f"{'state/rank':>12s} {'paper':>8s}")
    ids = np.zeros((64, 16), np.int64)
    row("GPT 7.5B, dp=64", lambda: GPT(vocab=61440, h=4096, layers=36, heads=32),
        dist.ProcessMesh(list(range(64)), ["dp"]),
        lambda level: {"dp_config": {"sharding_level": level}}, [ids, ids], PAPER)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=8192, intermediate_size=28672,
                      num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                      dtype="bf16")
    ids = np.zeros((8, 16), np.int64)
    row("Llama-70B, dp=8 x mp=8", lambda: LlamaForCausalLM(cfg),
        dist.ProcessMesh(np.arange(64).reshape(8, 8), ["dp", "mp"]),
        lambda level: {"dp_config": {"sharding_level": level},
                       "mp_config": {"parallelize_plan": parallelize_plan()}}, [ids, ids])
    pipeline_row(cfg)
    moe_rows()
    qwen_rows()
    deepseek_row()


def moe_rows():
    """ERNIE-4.5-21B-A3B and -300B-A47B (bench/configs: the published
    configs, uncertain fields in docs/ernie4_5_notes.md) in bf16 with a
    capacity factor of 1.25 (the published models are dropless; a static
    dropless buffer holds every token for every expert), one 4096-token
    sequence per data-parallel rank: model state per rank and all-to-all
    bytes per step beside the hand count."""
    from ernie.models.ernie4_5 import Ernie4_5Config, Ernie4_5_MoeForCausalLM
    from ernie.moe import capacity
    configs = Path(__file__).resolve().parent / "configs"
    print(f"\n{'MoE model, mesh':44s} {'params':>8s} {'compile':>8s} {'state/rank':>11s} "
          f"{'hand':>8s} {'a2a/step':>10s} {'hand':>10s}")
    # a2a/step: every stage's all-to-all buffers of one step, summed.
    seq = 4096
    cases = [
        ("ERNIE-4.5-21B-A3B, ep = dp = 8, ZeRO-1", "ernie4_5_21b_a3b.json", (8,), ["dp"], None),
        ("ERNIE-4.5-300B-A47B, pp 8 x ep=dp 8 x mp 8, ZeRO-1", "ernie4_5_300b_a47b.json",
         (8, 8, 8), ["pp", "dp", "mp"], 8),
    ]
    for name, file, shape, names, micro in cases:
        cfg = Ernie4_5Config.from_json(configs / file, dtype="bf16", moe_capacity_factor=1.25)
        with ernie.nn.abstract():
            model = Ernie4_5_MoeForCausalLM(cfg)
        mesh = dist.ProcessMesh(np.arange(int(np.prod(shape))).reshape(shape).tolist(), names)
        mp = mesh.get_dim_size("mp") if "mp" in names else 1
        pp = mesh.get_dim_size("pp") if "pp" in names else 1
        ep = mesh.get_dim_size("dp")
        config = {"dp_config": {"sharding_level": 1}, "ep_config": {"axis": "dp"}}
        if mp > 1:
            from ernie.models.ernie4_5 import parallelize_plan
            config["mp_config"] = {"parallelize_plan": parallelize_plan(cfg.tie_word_embeddings)}
        if pp > 1:  # 54 layers: uneven stages, a split after each stage's last layer
            ends = np.cumsum([len(c) for c in np.array_split(range(cfg.num_hidden_layers), pp)])
            config["pp_config"] = {"split_spec": {f"model.layers.{e - 1}": dist.SplitPoint.END
                                                  for e in ends[:-1]},
                                   "accumulate_steps": micro}
        ids = np.zeros((ep * (micro or 1), seq), np.int64)
        t = time.time()
        prog = ernie.compile(model, ernie.optimizer.AdamW(1e-4, multi_precision=True), [ids, ids],
                             mesh=mesh, config=config, abstract=True)
        seconds = time.time() - t
        r = prog.report()
        params = sum(int(np.prod(p.shape)) for p in model.parameters())
        state = (max(st["parameter_bytes"] + st["gradient_bytes"] + st["optimizer_state_bytes"]
                 for st in r["stages"]) if pp > 1 else r["model_state_bytes"])
        hand_state = _hand_state(cfg, ep, mp, pp)
        # The experts' all-to-alls (over the expert axis, dp here).
        a2a = r["collectives"]["all_to_all[dp]"]["bytes"]
        # Per MoE layer and micro-batch: four buffers [E, 1 group, C, hidden]
        # in bf16 (dispatch, combine; forward and backward); under mp each
        # tensor-parallel rank dispatches 1 / mp of the tokens.
        moe_layers = sum(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
        c = capacity(cfg.moe_config(), seq)
        hand_a2a = moe_layers * (micro or 1) * 4 * cfg.moe_num_experts * c * cfg.hidden_size * 2 \
            / mp
        print(f"{name:44s} {params / 1e9:7.1f}B {seconds:7.1f}s {state / 1e9:9.2f}GB "
              f"{hand_state / 1e9:6.2f}GB {a2a / 2**30:8.2f}GiB {hand_a2a / 2**30:8.2f}GiB")


# Published shapes (each model's config.json on the Hugging Face hub) and
# the parameter counts its model card gives.
QWEN = [
    ("Qwen2.5-7B", "qwen2", 7.61e9, dict(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
        rope_theta=1e6, tie_word_embeddings=False)),
    ("Qwen2.5-72B", "qwen2", 72.7e9, dict(
        hidden_size=8192, intermediate_size=29568, num_hidden_layers=80,
        num_attention_heads=64, num_key_value_heads=8, vocab_size=152064,
        rope_theta=1e6, tie_word_embeddings=False)),
    ("Qwen3-8B", "qwen3", 8.2e9, dict(
        hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
        rope_theta=1e6, tie_word_embeddings=False)),
    ("Qwen3-30B-A3B", "qwen3_moe", 30.5e9, dict(
        hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, vocab_size=151936,
        num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
        norm_topk_prob=True, rope_theta=1e6, tie_word_embeddings=False)),
    ("Mistral-7B-v0.1", "mistral", 7.24e9, dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
        sliding_window=4096, tie_word_embeddings=False)),
    ("Mixtral-8x7B", "mixtral", 46.7e9, dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
        num_local_experts=8, num_experts_per_tok=2, rope_theta=1e6,
        tie_word_embeddings=False)),
]
_MOE = ("qwen3_moe", "mixtral")


def _qwen_hand_params(family, f):
    """The parameter count by hand: embedding and untied head, per layer
    q/k/v/o (q/k/v biases for Qwen2, per-head q/k norms for Qwen3, neither
    for Mistral and Mixtral), the MLP
    (SwiGLU, or the router and every expert) and two norms, the final norm."""
    h, layers = f["hidden_size"], f["num_hidden_layers"]
    d = f.get("head_dim", h // f["num_attention_heads"])
    q, kv = f["num_attention_heads"] * d, f["num_key_value_heads"] * d
    attn = h * q * 2 + h * kv * 2
    attn += q + 2 * kv if family == "qwen2" else 2 * d if family.startswith("qwen3") else 0
    if family in _MOE:
        e = f.get("num_experts", f.get("num_local_experts"))
        mlp = h * e + e * 3 * h * f.get("moe_intermediate_size", f["intermediate_size"])
    else:
        mlp = 3 * h * f["intermediate_size"]
    return layers * (attn + mlp + 2 * h) + 2 * f["vocab_size"] * h + h


def qwen_rows():
    """The Qwen, Mistral and Mixtral published sizes compiled abstractly (bf16, AdamW
    with f32 master weights) on dp 8 at ZeRO-1, one 4096-token sequence per
    rank (Qwen3-30B-A3B: its experts on the ZeRO axis, capacity factor
    1.25): parameters beside the model card's and a hand count, model state
    per rank beside a hand count (bf16 parameters and gradients whole, f32
    master and moments over dp; experts' all of it over ep = dp; the
    routers are f32, which the hand count takes as bf16: 0.04 GB for
    Qwen3-30B-A3B's 48)."""
    from ernie.models.auto import FAMILIES
    print(f"\n{'Model (dp 8, ZeRO-1)':30s} {'params':>9s} {'card':>7s} {'hand':>9s} "
          f"{'compile':>8s} {'state/rank':>11s} {'hand':>9s}")
    mesh = dist.ProcessMesh(list(range(8)), ["dp"])
    ids = np.zeros((8, 4096), np.int64)
    for name, family, card, fields in QWEN:
        make_config, model_class = FAMILIES[family]
        cfg = make_config({"model_type": family, **fields, "torch_dtype": "bfloat16"})
        if family in _MOE:
            import dataclasses
            cfg = dataclasses.replace(cfg, moe_capacity_factor=1.25)
        with ernie.nn.abstract():
            model = model_class(cfg)
        params = sum(int(np.prod(p.shape)) for p in model.parameters())
        config = {"dp_config": {"sharding_level": 1}}
        experts = 0
        if family in _MOE:
            config["ep_config"] = {"axis": "dp"}
            experts = fields["num_hidden_layers"] * cfg.num_experts * 3 * \
                fields["hidden_size"] * cfg.moe_intermediate_size
        t = time.time()
        prog = ernie.compile(model, ernie.optimizer.AdamW(1e-4, multi_precision=True),
                             [ids, ids], mesh=mesh, config=config, abstract=True)
        seconds = time.time() - t
        state = prog.report()["model_state_bytes"]
        dense = params - experts
        hand_state = dense * 4 + dense * 12 / 8 + experts * 16 / 8
        print(f"{name:30s} {params / 1e9:8.3f}B {card / 1e9:6.2f}B "
              f"{_qwen_hand_params(family, fields) / 1e9:8.3f}B {seconds:7.1f}s "
              f"{state / 1e9:9.2f}GB {hand_state / 1e9:7.2f}GB")


def deepseek_row():
    """DeepSeek-V3 (671B without its multi-token-prediction module) in
    bf16, AdamW with f32 master weights, on 64 ranks: dp 64 at ZeRO-1 with
    the routed experts on the ZeRO axis (ep = dp = 64, 4 experts a rank),
    one 4096-token sequence per rank, capacity factor 1.25: parameters
    beside the report's 671B and a hand count, model state per rank beside
    a hand count (the routers are f32, counted as bf16 by hand)."""
    from ernie.models.deepseek_v3 import DeepseekV3Config, DeepseekV3ForCausalLM
    cfg = DeepseekV3Config(dtype="bf16", moe_capacity_factor=1.25)
    with ernie.nn.abstract():
        model = DeepseekV3ForCausalLM(cfg)
    params = sum(int(np.prod(p.shape)) for p in model.parameters())
    experts = (cfg.num_hidden_layers - cfg.first_k_dense_replace) * cfg.n_routed_experts * 3 * \
        cfg.hidden_size * cfg.moe_intermediate_size
    mesh = dist.ProcessMesh(list(range(64)), ["dp"])
    ids = np.zeros((64, 4096), np.int64)
    t = time.time()
    prog = ernie.compile(model, ernie.optimizer.AdamW(1e-4, multi_precision=True), [ids, ids],
                         mesh=mesh, config={"dp_config": {"sharding_level": 1},
                                            "ep_config": {"axis": "dp"}}, abstract=True)
    seconds = time.time() - t
    state = prog.report()["model_state_bytes"]
    dense = params - experts
    hand_state = dense * 4 + dense * 12 / 64 + experts * 16 / 64
    print(f"{'DeepSeek-V3 (dp=ep 64, ZeRO-1)':30s} {params / 1e9:8.3f}B {671:6d}B "
          f"{'':9s} {seconds:7.1f}s {state / 1e9:9.2f}GB {hand_state / 1e9:7.2f}GB")


def _hand_state(cfg, ep, mp, pp):
    """Model state of the fullest rank, counted by hand: bf16 parameters,
    gradients, f32 master weights and two AdamW moments split over the
    ZeRO-1 axis (ep = dp). Experts split over ep (and their width over mp);
    attention, embedding and LM head over mp; norms, router replicated. With pp
    the fullest stage is counted (layers split evenly, the embedding with
    the first, the head with the last)."""
    h, e, i = cfg.hidden_size, cfg.moe_num_experts, cfg.moe_intermediate_size
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    attn = (h * hq * d * 2 + h * hkv * d * 2) / mp
    dense, experts = [], []  # per layer: state ZeRO splits, and experts' own
    for layer in range(cfg.num_hidden_layers):
        n, x = attn + 2 * h, 0.0
        if cfg.is_moe_layer(layer):
            x = e * 3 * h * i / (ep * mp)
            n += h * e + 3 * h * i * cfg.moe_num_shared_experts / mp
        else:
            n += 3 * h * cfg.intermediate_size / mp
        dense.append(n)
        experts.append(x)
    stages = [[float(sum(a)), float(sum(b))] for a, b in
              zip(np.array_split(np.array(dense), pp), np.array_split(np.array(experts), pp))]
    stages[0][0] += cfg.vocab_size * h / mp
    if not cfg.tie_word_embeddings:
        stages[-1][0] += cfg.vocab_size * h / mp
    stages[-1][0] += h
    # bf16 parameters (2 bytes); gradients bf16 (2), or f32 (4) where a
    # pipeline sums them over micro-batches (Megatron's main_grad); f32
    # master and moments (12) split over dp by ZeRO-1 — but not the
    # experts', already split over it.
    grad = 4 if pp > 1 else 2
    return max((n + x) * (2 + grad) + n * 12 / ep + x * 12 for n, x in stages)


def pipeline_row(cfg):
    """Llama-70B on 1024 ranks: per stage (first, middle, last) its model
    state and the activations 1F1B keeps (p - s micro-batches)."""
    with ernie.nn.abstract():
        model = LlamaForCausalLM(cfg)
    mesh = dist.ProcessMesh(np.arange(1024).reshape(8, 16, 8), ["dp", "pp", "mp"])
    ids = np.zeros((16 * 8, 16), np.int64)  # 16 micro-batches of one sequence per dp rank
    t = time.time()
    prog = ernie.compile(model, ernie.optimizer.AdamW(1e-4, multi_precision=True), [ids, ids],
                         mesh=mesh, abstract=True,
                         config={"dp_config": {"sharding_level": 1},
                                 "mp_config": {"parallelize_plan": parallelize_plan()},
                                 "pp_config": {"split_spec": "llama.layers", "accumulate_steps": 16}})
    seconds = time.time() - t
    print(f"\nLlama-70B, dp=8 x pp=16 x mp=8 (1024 ranks), ZeRO-1, 16 micro-batches, 1F1B: "
          f"compiled in {seconds:.1f} s")
    # Megatron's scatter/gather of pipeline transfers: per micro-batch and
    # direction one activation (tokens x hidden, bf16) split over mp.
    tokens = ids.shape[1] * ids.shape[0] // (16 * 8)
    shard = tokens * cfg.hidden_size * 2 // 8
    print(f"{'stage':>6s} {'params':>9s} {'grads':>9s} {'opt state':>10s} {'activations':>12s} "
          f"{'sent/step':>10s} {'Megatron':>9s} {'ratio':>6s}")
    stages = prog.report()["stages"]
    for s in (0, len(stages) // 2, len(stages) - 1):
        st = stages[s]
        sent = st["collectives"].get("send", {"bytes": 0})["bytes"]
        directions = 1 if s in (0, len(stages) - 1) else 2
        limit = 16 * directions * shard
        print(f"{s:6d} {st['parameter_bytes'] / 1e9:7.2f}GB {st['gradient_bytes'] / 1e9:7.2f}GB "
              f"{st['optimizer_state_bytes'] / 1e9:8.2f}GB {st['activation_bytes'] / 1e9:10.3f}GB "
              f"{sent / 2**20:8.2f}MiB {limit / 2**20:7.2f}MiB {sent / limit:6.3f}")


if __name__ == "__main__":
    main()

"""The `transformers` side of the parity tests (test_qwen.py,
test_ernie_parity.py), run by the
reference environment's interpreter (scripts/reference_env.sh) in a
subprocess: the tests' own environment has neither torch nor transformers.

    python hf_reference.py make FAMILY SEED FOLDER
        a tiny random model of FAMILY ("qwen2", "qwen2-tied", "qwen3",
        "qwen3_moe", "ernie4_5", "ernie4_5_moe", "ernie4_5_moe-aux",
        "mistral", "mixtral", "deepseek_v3", "deepseek_v3-plain",
        "llama-rope", "qwen2-yarn", "deepseek_v3-yarn"), made
        by transformers with torch.manual_seed(SEED)
        and saved by its own save_pretrained (f32) into FOLDER; FAMILY+fused
        saves transformers' own layout (save_original_format=False: experts
        fused into experts.gate_up_proj / experts.down_proj).
    python hf_reference.py run FOLDER IN.npz OUT.npz
        loads FOLDER with transformers' AutoModelForCausalLM (f32, eval)
        and writes, for IN's `ids` (and `labels`, Hugging Face's unshifted
        ones), `logits`, `loss` (what transformers reports), `aux_loss`
        (an MoE model's, when transformers reports one) and, under
        `state/<name>`, every tensor of the loaded model's state_dict in
        Hugging Face's names.

Every output also holds `versions`: the torch and transformers that made
it.
"""

import json
import sys

import numpy as np
import torch
import transformers

TINY = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
            max_position_embeddings=64)


def config(family):
    if family in ("qwen2", "qwen2-tied"):
        return transformers.Qwen2Config(**TINY, rope_theta=1e6,
                                        tie_word_embeddings=family == "qwen2-tied")
    if family == "qwen3":
        # head_dim 16 != hidden_size / heads (8), as Qwen3's published sizes.
        return transformers.Qwen3Config(**TINY, head_dim=16, tie_word_embeddings=True)
    if family == "qwen3_moe":
        # Layer 1 dense (mlp_only_layers), layers 0 and 2 sparse; the
        # load-balancing loss on, as a training config would have it.
        return transformers.Qwen3MoeConfig(
            **{**TINY, "num_hidden_layers": 3}, head_dim=8, num_experts=4,
            num_experts_per_tok=2, moe_intermediate_size=24, norm_topk_prob=True,
            mlp_only_layers=[1], output_router_logits=True, router_aux_loss_coef=0.02)
    if family == "ernie4_5":
        return transformers.Ernie4_5Config(**TINY, head_dim=8, tie_word_embeddings=True,
                                           use_bias=False)
    if family.startswith("ernie4_5_moe"):
        # Layers 1-2 sparse (4 experts, top 2, a shared expert), layer 0 dense.
        # "-aux": the load-balancing loss on; otherwise off, as the
        # published configs ship (output_router_logits false).
        return transformers.Ernie4_5_MoeConfig(
            **{**TINY, "num_hidden_layers": 3}, head_dim=8, tie_word_embeddings=True,
            moe_num_experts=4, moe_k=2, moe_num_shared_experts=1, moe_intermediate_size=24,
            moe_layer_start_index=1, moe_layer_end_index=2,
            output_router_logits=family.endswith("-aux"), router_aux_loss_coef=0.02)
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
            "beta_fast": 32, "beta_slow": 1}
    if family == "qwen2-yarn":  # Qwen's long-context scaling
        return transformers.Qwen2Config(**TINY, rope_parameters={**yarn, "rope_theta": 1e6})
    if family == "deepseek_v3-yarn":  # the published V3's kind, mscale folded into softmax
        cfg = config("deepseek_v3")
        cfg.rope_parameters = {**yarn, "rope_theta": 10000.0, "mscale": 1.0,
                               "mscale_all_dim": 1.0}
        return transformers.DeepseekV3Config(**{**cfg.to_dict(), "rope_parameters":
                                                cfg.rope_parameters})
    if family == "llama-rope":
        # Llama 3.1's rope scaling, its original context shrunk to 16 so that
        # the tiny model's frequencies fall in all three bands.
        return transformers.LlamaConfig(**TINY, rope_parameters={
            "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
    if family == "mistral":
        # A window of 3 on the tests' 8 tokens: most queries lose keys.
        return transformers.MistralConfig(**TINY, sliding_window=3, head_dim=8)
    if family == "mixtral":
        return transformers.MixtralConfig(
            **{**TINY, "intermediate_size": 24}, sliding_window=5, num_local_experts=4,
            num_experts_per_tok=2, output_router_logits=True, router_aux_loss_coef=0.02)
    if family.startswith("deepseek_v3"):
        # MLA with q/k heads of 8 + 8 and values of 12; 8 experts in 4
        # groups of 2, 2 groups kept, top 2, a shared expert, layer 0 dense.
        # "-plain": no query bottleneck, rope on halves (not interleaved).
        plain = family.endswith("-plain")
        return transformers.DeepseekV3Config(
            **{**TINY, "num_hidden_layers": 3, "num_key_value_heads": 4},  # MLA: every head
            moe_intermediate_size=16,
            n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2,
            n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5,
            q_lora_rank=None if plain else 16, kv_lora_rank=16, qk_rope_head_dim=8,
            qk_nope_head_dim=8, v_head_dim=12, rope_interleave=not plain,
            num_nextn_predict_layers=0)
    raise SystemExit(f"unknown family {family}")


def versions():
    return json.dumps({"torch": torch.__version__, "transformers": transformers.__version__})


def make(family, seed, folder):
    torch.manual_seed(int(seed))
    family, fused = family.removesuffix("+fused"), family.endswith("+fused")
    model = transformers.AutoModelForCausalLM.from_config(config(family))
    with torch.no_grad():  # biases and norms away from their initial 0 and 1
        for name, p in model.named_parameters():
            if name.endswith(("bias", "norm.weight", "layernorm.weight")):
                p.add_(0.1 * torch.randn_like(p))
            if name.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight")):
                # routers far from ties
                p.mul_(20.0)
        for name, buffer in model.named_buffers():  # DeepSeek's selection biases
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(0.3 * torch.randn_like(buffer))
    # "+fused": transformers' own layout (experts fused, its own names).
    model.save_pretrained(folder, save_original_format=not fused)


def run(folder, inp, out):
    arrays = dict(np.load(inp))
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.eval()
    ids = torch.tensor(arrays["ids"])
    with torch.no_grad():
        result = model(input_ids=ids, labels=torch.tensor(arrays["labels"]))
    state = {f"state/{k}": v.detach().numpy() for k, v in model.state_dict().items()}
    extra = {}
    if getattr(result, "aux_loss", None) is not None:  # MoE: the balancing loss apart
        extra["aux_loss"] = result.aux_loss.numpy()
    np.savez(out, logits=result.logits.numpy(), loss=result.loss.numpy(), versions=versions(),
             **extra, **state)


if __name__ == "__main__":
    {"make": make, "run": run}[sys.argv[1]](*sys.argv[2:])

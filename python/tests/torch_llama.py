"""The Llama of ernie.models.llama in PyTorch (Hugging Face's LlamaForCausalLM
arithmetic: RMSNorm in f32 on an upcast input, rotate-half rotary embedding,
grouped-query causal attention, SwiGLU), as a script for the optional
comparison tests: an interpreter with torch runs it in a subprocess, so the
tests' own environment needs no torch.

    python torch_llama.py IN.npz OUT.npz

IN holds the config (`config`, a JSON string), `ids`, `labels` (Hugging
Face's: shifted here, as the model does) and every
parameter under ernie's name and [in, out] layout. OUT gets, for `f64` (the
model in float64) and `autocast` (f32 weights under torch.autocast to bf16:
GEMMs in bf16, softmax, norms and the loss in f32), the loss as
`<mode>/loss` and each parameter's gradient as `<mode>/<name>`."""

import json
import sys

import numpy as np
import torch
import torch.nn.functional as Fn


def loss_and_grads(arrays, cfg, mode):
    dtype = torch.float64 if mode == "f64" else torch.float32
    w = {k: torch.tensor(arrays[k], dtype=dtype, requires_grad=True)
         for k in arrays if k not in ("config", "ids", "labels")}
    ids = torch.tensor(arrays["ids"])
    labels = torch.tensor(arrays["labels"])
    B, S = ids.shape
    H, NH, NKV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D, eps = H // NH, cfg["rms_norm_eps"]
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = torch.outer(torch.arange(S, dtype=torch.float64), inv)
    cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :].to(dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :].to(dtype)
    mask = torch.full((S, S), float("-inf"), dtype=dtype).triu(1)

    def rms(x, weight):  # LlamaRMSNorm
        wide = x.to(dtype)
        wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
        return weight * wide.to(x.dtype)

    def rope(x):  # apply_rotary_pos_emb with rotate_half
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return x * cos.to(x.dtype) + torch.cat([-x2, x1], -1) * sin.to(x.dtype)

    def forward():
        h = Fn.embedding(ids, w["llama.embed_tokens.weight"])
        for i in range(cfg["num_hidden_layers"]):
            p = lambda n: w[f"llama.layers.{i}.{n}"]
            n1 = rms(h, p("input_layernorm.weight"))
            q = rope((n1 @ p("self_attn.q_proj.weight")).view(B, S, NH, D)).transpose(1, 2)
            k = rope((n1 @ p("self_attn.k_proj.weight")).view(B, S, NKV, D)).transpose(1, 2)
            v = (n1 @ p("self_attn.v_proj.weight")).view(B, S, NKV, D).transpose(1, 2)
            rep = NH // NKV
            k = k[:, :, None].expand(B, NKV, rep, S, D).reshape(B, NH, S, D)
            v = v[:, :, None].expand(B, NKV, rep, S, D).reshape(B, NH, S, D)
            probs = torch.softmax(q @ k.transpose(-1, -2) * D ** -0.5 + mask, -1)
            a = (probs.to(v.dtype) @ v).transpose(1, 2).reshape(B, S, H)
            h = h + a @ p("self_attn.o_proj.weight")
            n2 = rms(h, p("post_attention_layernorm.weight"))
            mlp = Fn.silu(n2 @ p("mlp.gate_proj.weight")) * (n2 @ p("mlp.up_proj.weight"))
            h = h + mlp @ p("mlp.down_proj.weight")
        logits = rms(h, w["llama.norm.weight"]) @ w["lm_head.weight"]
        # Hugging Face's loss: labels = input_ids, position t against t + 1.
        return Fn.cross_entropy(logits[:, :-1].reshape(B * (S - 1), -1),
                                labels[:, 1:].reshape(-1))

    if mode == "f64":
        loss = forward()
    else:
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            loss = forward()
    loss.backward()
    out = {f"{mode}/loss": np.float64(loss.item())}
    out.update({f"{mode}/{k}": v.grad.double().numpy() for k, v in w.items()})
    return out


def main():
    arrays = dict(np.load(sys.argv[1]))
    cfg = json.loads(str(arrays["config"]))
    torch.manual_seed(0)
    out = {}
    for mode in ("f64", "autocast"):
        out.update(loss_and_grads(arrays, cfg, mode))
    np.savez(sys.argv[2], **out)


if __name__ == "__main__":
    main()

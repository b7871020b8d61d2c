"""Work every rank of a mesh axis would repeat (an op none of whose tensors
is split over the axis) divided over it when compiled for a cluster on which
the compute saved clearly outweighs the collectives added: a user's
tensor-parallel plan that leaves the LM head replicated no longer runs the
whole vocabulary's GEMMs on every mp rank. Results are compared with the
single-device program."""

import re

import numpy as np

import ernie
import ernie.distributed as dist
from ernie import cost
from ernie.models.llama import LlamaConfig, LlamaForCausalLM

MODEL = dict(vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, seed=5)
RNG = np.random.default_rng(11)
IDS = RNG.integers(0, MODEL["vocab_size"], size=(4, 32))
LABELS = IDS  # Hugging Face's labels: the model shifts them

# Megatron's pairs for attention and MLP; the embedding and the LM head are
# left out, so they are replicated over mp.
LAYERS_ONLY = {
    "llama.layers.*.self_attn.(q|k|v)_proj": dist.ColWiseParallel(),
    "llama.layers.*.self_attn.o_proj": dist.RowWiseParallel(),
    "llama.layers.*.mlp.(gate|up)_proj": dist.ColWiseParallel(),
    "llama.layers.*.mlp.down_proj": dist.RowWiseParallel(),
}

# A CPU-like device (10 GFLOP/s GEMMs) with fast links between two ranks:
# the head's GEMMs (2 x 128 x 64 x 2048 x 3 FLOP) take milliseconds, a
# gather of its logits tens of microseconds.
SLOW_COMPUTE = cost.make_cluster(
    {"name": "10 GFLOP/s", "memory_bytes": 10**10, "memory_bandwidth": 1e10,
     "peak_flops": {"f32": 1e10, "bf16": 1e10}, "vector_flops": 1e9,
     "launch_overhead": 1e-7},
    devices_per_node=2, intra_node=(1e10, 1e-5), name="two slow ranks")


def compile_mp(cluster=None, steps=3):
    mesh = dist.ProcessMesh(np.arange(2), ["mp"])
    model = LlamaForCausalLM(LlamaConfig(**MODEL))
    prog = ernie.compile(model, ernie.optimizer.SGD(0.1), [IDS, LABELS], mesh=mesh,
                         config={"mp_config": {"parallelize_plan": LAYERS_ONLY}},
                         cluster=cluster)
    return prog, [prog.step(IDS, LABELS) for _ in range(steps)]


def head_flops(prog):
    """The FLOPs one rank spends in the GEMMs that read or make the LM
    head's [64, 2048] weight, its logits or their gradient: 2 m k n each,
    which is 2 sqrt(|A| |B| |C|) whatever is transposed or batched."""
    grad = prog.mlir.split("func.func @forward_grad", 1)[1].split("func.func @", 1)[0]
    total = 0
    for line in grad.splitlines():
        if "ernie.matmul" not in line or "2048" not in line.split(":")[-1]:
            continue
        shapes = re.findall(r"tensor<([0-9x]+)xf32>", line.split(":")[-1])
        sizes = [int(np.prod([int(d) for d in s.split("x")])) for s in shapes]
        total += 2 * round(float(np.sqrt(float(np.prod(sizes, dtype=np.float64)))))
    return total


def test_a_replicated_head_is_divided_and_computes_the_single_device_step():
    single = LlamaForCausalLM(LlamaConfig(**MODEL))
    ref = ernie.compile(single, ernie.optimizer.SGD(0.1), [IDS, LABELS])
    ref_losses = [ref.step(IDS, LABELS) for _ in range(3)]

    whole, whole_losses = compile_mp()
    divided, divided_losses = compile_mp(SLOW_COMPUTE)

    # By bytes every mp rank runs the head's three GEMMs whole (3 x 2 x 128
    # tokens x 64 x 2048); on the slow-compute cluster each rank runs half.
    assert head_flops(whole) == 3 * 2 * 128 * 64 * 2048
    assert head_flops(divided) == head_flops(whole) // 2
    gathers = divided.report()["collectives"].get("all_gather[mp]", {"count": 0})["count"]
    assert gathers > whole.report()["collectives"].get("all_gather[mp]", {"count": 0})["count"]

    # f32 sums in another order (the loss over two halves of the tokens, a
    # contraction's partial products): agreement to ~1e-6 relative.
    np.testing.assert_allclose(divided_losses, ref_losses, rtol=2e-6)
    np.testing.assert_allclose(whole_losses, ref_losses, rtol=2e-6)
    want, got = ref.state_dict(), divided.state_dict()
    for name, value in want.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)

    # The step model, which chose it, predicts it faster there.
    assert divided.estimate()["step_seconds"] < 0.9 * whole.estimate(SLOW_COMPUTE)["step_seconds"]


def test_fast_compute_keeps_the_head_whole():
    """On H100s the head's GEMMs take microseconds, less than a gather's
    latency: nothing is divided, and the program is the one compiled by
    bytes."""
    whole, _ = compile_mp(steps=0)
    fast, _ = compile_mp(cost.make_cluster("h100_sxm", devices_per_node=2), steps=0)
    assert head_flops(fast) == head_flops(whole)

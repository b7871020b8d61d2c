"""Data-parallel gradients all-reduced in buckets (--ernie-bucket-gradients,
dp_config bucket_mb): one collective per bucket, started as soon as its
last gradient is computed, and in f32 the very bits of one all-reduce per
gradient (every element is summed over the ranks in the same order)."""

import re

import numpy as np
import pytest

import ernie
import ernie.distributed as dist
from ernie.models.llama import LlamaConfig, LlamaForCausalLM, parallelize_plan

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, seed=9)
RNG = np.random.default_rng(3)
IDS = RNG.integers(0, TINY["vocab_size"], size=(4, 16))
LABELS = IDS  # Hugging Face's labels: the model shifts them


def run(dp_config, shape=(2,), names=("dp",), dtype="f32", steps=3, mp=False, pp=None):
    mesh = dist.ProcessMesh(np.arange(int(np.prod(shape))).reshape(shape), list(names))
    config = {"dp_config": dp_config}
    if mp:
        config["mp_config"] = {"parallelize_plan": parallelize_plan()}
    if pp:
        config["pp_config"] = pp
    model = LlamaForCausalLM(LlamaConfig(**TINY, dtype=dtype))
    prog = ernie.compile(model, ernie.optimizer.AdamW(1e-2), [IDS, LABELS], mesh=mesh,
                         config=config)
    return prog, [prog.step(IDS, LABELS) for _ in range(steps)]


def dp_all_reduces(prog):
    return prog.report()["collectives"].get("all_reduce[dp]", {"count": 0})["count"]


@pytest.mark.parametrize("zero", [0, 1])
def test_buckets_are_bit_identical_and_fewer(zero):
    plain, want = run({"sharding_level": zero, "bucket_mb": 0})
    one, got_one = run({"sharding_level": zero})  # 25 MiB: the toy fits one bucket
    many, got_many = run({"sharding_level": zero, "bucket_mb": 0.004})  # ~4 KiB each
    assert got_one == want and got_many == want
    for name, value in plain.state_dict().items():
        np.testing.assert_array_equal(one.state_dict()[name], value, err_msg=name)
        np.testing.assert_array_equal(many.state_dict()[name], value, err_msg=name)
    grads = len(list(plain.model.named_parameters()))
    loss_reductions = dp_all_reduces(plain) - grads
    assert dp_all_reduces(one) == loss_reductions + 1
    assert loss_reductions + 1 < dp_all_reduces(many) < dp_all_reduces(plain)
    # The same bytes travel, in fewer messages.
    volume = lambda p: p.report()["collectives"]["all_reduce[dp]"]["bytes"]
    assert volume(one) == volume(many) == volume(plain)
    # Each bucket starts where its last gradient is ready: before the end
    # of the backward, not at the return.
    grad = many.mlir.split("func.func @forward_grad", 1)[1].split("func.func @", 1)[0]
    lines = grad.splitlines()
    starts = [i for i, l in enumerate(lines) if "ernie.all_reduce_start" in l]
    last_matmul = max(i for i, l in enumerate(lines) if "ernie.matmul" in l)
    assert starts and starts[0] < last_matmul


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_zero_collectives_are_bucketed_bit_for_bit(zero):
    """ZeRO-2/3's gradient reduce-scatters, ZeRO-1/2's gathers of the
    updated parameters and ZeRO-3's gathers of the parameters where they are
    used travel in buckets too: the same weights bit for bit, the same bytes
    in fewer messages."""
    plain, want = run({"sharding_level": zero, "bucket_mb": 0})
    one, got_one = run({"sharding_level": zero})
    many, got_many = run({"sharding_level": zero, "bucket_mb": 0.004})
    assert got_one == want and got_many == want
    for name, value in plain.state_dict().items():
        np.testing.assert_array_equal(one.state_dict()[name], value, err_msg=name)
        np.testing.assert_array_equal(many.state_dict()[name], value, err_msg=name)
    grads = len(list(plain.model.named_parameters()))
    counts = lambda p, kind: p.report()["collectives"].get(f"{kind}[dp]", {"count": 0, "bytes": 0})
    if zero >= 2:
        assert counts(plain, "reduce_scatter")["count"] == grads
        assert counts(one, "reduce_scatter")["count"] == 1
        assert 1 < counts(many, "reduce_scatter")["count"] < grads
    if zero <= 2:
        # The updated shards gathered back, one bucket for the toy.
        assert counts(plain, "all_gather")["count"] == grads
    else:
        # ZeRO-3 gathers each parameter where it is used, forward and
        # backward; buckets prefetch them in that order.
        assert counts(plain, "all_gather")["count"] > grads
    assert counts(one, "all_gather")["count"] == 1
    assert 1 < counts(many, "all_gather")["count"] < counts(plain, "all_gather")["count"]
    for kind in ("reduce_scatter", "all_gather", "all_reduce"):
        assert counts(one, kind)["bytes"] == counts(many, kind)["bytes"] == counts(plain, kind)["bytes"]


def test_buckets_with_tensor_parallelism():
    plain, want = run({"bucket_mb": 0}, shape=(2, 2), names=("dp", "mp"), mp=True)
    bucketed, got = run({}, shape=(2, 2), names=("dp", "mp"), mp=True)
    assert got == want
    assert dp_all_reduces(bucketed) < dp_all_reduces(plain)


def test_bf16_gradients_reduce_in_f32_by_default():
    f32, losses = run({}, dtype="bf16")
    native, native_losses = run({"grad_reduce_dtype": "native"}, dtype="bf16")
    assert re.search(r"all_reduce_start .*\{accumulate = f32\} : tensor<.*bf16>", f32.mlir)
    assert "accumulate" not in native.mlir
    # The f32 message is twice the bf16 one, in the report and the cost model.
    reduced = lambda p: p.report()["collectives"]["all_reduce[dp]"]["bytes"]
    bf16_bucketed = sum(2 * int(np.prod([int(d) for d in dims.split("x")]))
                        for line in re.findall(r"all_reduce_start .*", native.mlir)
                        for dims in re.findall(r"tensor<([0-9x]+)xbf16>", line.split(" : ")[1]))
    assert bf16_bucketed > 0
    assert reduced(f32) - reduced(native) == bf16_bucketed
    comm = lambda p: p.estimate("dgx_h100")["comm_seconds"]["dp"]
    assert comm(f32) > comm(native)
    # Both train; they part only by the roundings of the reduced gradients.
    np.testing.assert_allclose(losses, native_losses, rtol=2e-2)


@pytest.mark.parametrize("zero", [0, 1])
def test_pipelined_bf16_gradients_reduce_in_f32_by_default(zero):
    """Under a pipeline the dp sum runs once, in the update, on the
    micro-batches' f32 mean (Megatron's main grads), not on its bf16
    rounding; ZeRO-1's update, reading only its shard, reduce-scatters it."""
    def pipelined(reduce_dtype):
        dp = {"sharding_level": zero, "grad_reduce_dtype": reduce_dtype}
        return run(dp, shape=(2, 2), names=("pp", "dp"), dtype="bf16", steps=2,
                   pp={"split_spec": "llama.layers", "accumulate_steps": 2})
    (f32, losses), (native, native_losses) = pipelined("float32"), pipelined("native")
    def sums(prog):
        update = prog.mlir.split("func.func @train_update.0", 1)[1].split("func.func @", 1)[0]
        found = re.findall(r"ernie\.(all_reduce|reduce_scatter) %\S+ over @mesh\[dp\][^:]*: "
                           r"tensor<[0-9x]+(\w+)>", update)
        return {kind for kind, _ in found}, {dtype for _, dtype in found}
    kinds = {"reduce_scatter"} if zero else {"all_reduce"}
    assert sums(f32) == (kinds, {"f32"})
    # Native: the matmuls' bf16 gradients as they are (the norms' are made
    # in f32, and their rounding to bf16 now follows the sum).
    native_kinds, native_types = sums(native)
    assert native_kinds == kinds and "bf16" in native_types
    np.testing.assert_allclose(losses, native_losses, rtol=2e-2)


@pytest.mark.parametrize("bad", [{"bucket_mb": -1}, {"bucket_mb": True},
                                 {"grad_reduce_dtype": "fp16"}])
def test_bad_bucket_configs_are_refused(bad):
    with pytest.raises(ValueError, match="dp_config"):
        run(bad, steps=0)

"""The cost model from Python (ernie.cost, Program.estimate): shipped devices
and clusters, what the estimate accounts for, and errors that name the bad
field. Hand-computed rooflines and alpha-beta times are in the lit test
test/Passes/ernie-step-cost.mlir; the calibration against measured steps
is bench/cost_calibration.py (a table, not a timed test)."""

import re

import numpy as np
import pytest

import ernie
import ernie.distributed as dist
from ernie import _ernie, compiler, cost
from ernie.models.llama import LlamaConfig, LlamaForCausalLM, parallelize_plan

SMALL = dict(vocab_size=1024, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=4)


def abstract_program(shape=None, names=None, config=None, batch=8, seq=128, cluster=None,
                     **model):
    with ernie.nn.abstract():
        m = LlamaForCausalLM(LlamaConfig(**{**SMALL, **model}))
    ids = np.zeros((batch, seq), np.int64)
    mesh = dist.ProcessMesh(np.arange(int(np.prod(shape))).reshape(shape), names) if shape else None
    return ernie.compile(m, ernie.optimizer.AdamW(1e-4), [ids, ids], mesh=mesh, config=config,
                         abstract=True, cluster=cluster)


def test_shipped_hardware_loads():
    assert {"h100_sxm", "h200", "a100_80gb"} <= set(cost.devices())
    assert {"dgx_h100", "meta_llama3_h100", "selene_a100"} <= set(cost.clusters())
    c = cost.load_cluster("meta_llama3_h100")
    assert c["nodes"] * c["devices_per_node"] == 16384
    assert c["device"]["peak_flops"]["bf16"] == pytest.approx(989.4e12)


def test_one_rank_step_is_its_flops_over_the_peak_at_least():
    """An abstract program estimates without values; the step is at least
    its model FLOPs at the device's GEMM peak, and MFU is below the GEMM
    efficiency the device file promises."""
    prog = abstract_program()
    est = prog.estimate("dgx_h100")
    peak = cost.load_device("h100_sxm")["peak_flops"]["f32"]
    assert est["ranks"] == 1 and est["model_flops"] > 0
    assert est["step_seconds"] >= est["model_flops"] / peak
    assert 0 < est["mfu"] <= 0.7
    assert est["compute_seconds"] == pytest.approx(sum(est["compute_by_op"].values()))
    # A Llama step's FLOPs: 6 per parameter per token plus attention, within
    # 15 % (the non-GEMM ops and the embedding's gather are not 6N).
    params = sum(int(np.prod(p.shape)) for _, p in prog.model.named_parameters())
    assert est["model_flops"] == pytest.approx(6 * params * 8 * 128, rel=0.15)


def test_data_parallel_halves_gemms_not_the_update():
    """dp 2 halves each rank's GEMM FLOPs (not their time: the launches
    stay, small GEMMs turn memory-bound); without ZeRO each rank still
    updates every parameter."""
    one = abstract_program().estimate("dgx_h100")
    dp = abstract_program([2], ["dp"], {"dp_config": {}}).estimate("dgx_h100")
    ops = lambda e, op: e["compute_by_op"][op]
    assert ops(one, "ernie.matmul") / 2 < ops(dp, "ernie.matmul") < 0.8 * ops(one, "ernie.matmul")
    assert ops(dp, "ernie.adamw_update") == pytest.approx(ops(one, "ernie.adamw_update"))
    assert dp["comm_seconds"]["dp"] > 0
    assert dp["model_flops"] == pytest.approx(one["model_flops"], rel=1e-3)  # + the loss scaling


def test_tensor_parallel_traffic_is_on_mp_and_crossing_nodes_costs_more():
    prog = abstract_program([2], ["mp"], {"mp_config": {"parallelize_plan": parallelize_plan()}})
    near = prog.estimate("dgx_h100")
    far = prog.estimate(cost.make_cluster("h100_sxm", nodes=2, devices_per_node=1,
                                          inter_node=(50e9, 1e-5)))
    assert near["comm_seconds"]["mp"] > 0
    # 9x less bandwidth, 3x the latency (the layer's small collectives).
    assert far["comm_seconds"]["mp"] > 3 * near["comm_seconds"]["mp"]


def test_pipeline_bubble_is_near_1f1b():
    """pp 2, 4 micro-batches: the idle share of the step is near
    (p - 1) / (m + p - 1) = 1/5 (stages are not equal: the last one has the
    head and the loss)."""
    prog = abstract_program([2], ["pp"], {"pp_config": {"split_spec": "llama.layers",
                                                        "accumulate_steps": 4}})
    est = prog.estimate("dgx_h100")
    assert 0.5 * 0.2 <= est["bubble_seconds"] / est["step_seconds"] <= 1.6 * 0.2


def _backward_gradients(mlir, stage):
    """(element count, bytes per element) of each gradient @train_backward.<stage> returns."""
    head = mlir.split(f"func.func @train_backward.{stage}(", 1)[1].split("{\n", 1)[0]
    grads = re.findall(r"tensor<([0-9x]+)x(\w+)> \{ernie.gradient", head.split("->", 1)[1])
    return [(int(np.prod([int(n) for n in dims.split("x")])), {"f32": 4, "bf16": 2}[dtype])
            for dims, dtype in grads]


def _pipelined(micro_batches, fusion=True, accumulate=None):
    """Llama on pp 2 (abstract), as compiled; with `accumulate`, its traced
    module through the same passes with the pipeline schedule's accumulate
    option set so (as `mlir`): the runtime's own sums are no Python knob."""
    prog = abstract_program([2], ["pp"], {"pp_config": {
        "split_spec": "llama.layers", "accumulate_steps": micro_batches,
        "gradient_accumulation_fusion": fusion}}, batch=8)
    if accumulate is None:
        return prog, prog.mlir
    options = compiler.pipeline_options(prog.optimizer, True, True, pipeline={
        "stages": 2, "virtual_stages": 1, "accumulate_steps": micro_batches,
        "schedule": "1F1B", "gradient_accumulation_fusion": fusion})
    options.accumulate = accumulate
    compiled, _, _ = _ernie.compile(prog.traced_module, options, write_program=False)
    return prog, compiled.text()


@pytest.mark.parametrize("micro_batches", [1, 2, 4])
@pytest.mark.parametrize("mode", ["gemm", "add", "runtime"])
def test_pipelines_pay_for_summing_micro_batch_gradients(micro_batches, mode):
    """Where the backward adds into the running sums it takes (accumulate=
    gemm, the default: a weight gradient's GEMM adds into its sum; add:
    after the GEMM), only the sums' zeroing before the first micro-batch is
    the runtime's: launch + the bytes once per gradient. Where the runtime
    sums (accumulate=runtime), after each backward call but a chunk's first
    it adds the call's gradients into the step's (reads both, writes one):
    per chunk (m - 1) x (launch + 3 x its gradient bytes over the memory
    bandwidth). Either on the stage the step's time is charged to."""
    cluster = cost.load_cluster("dgx_h100")
    d = cluster["device"]
    bandwidth = d["memory_bandwidth"] * d.get("memory_efficiency", 1.0)
    prog, mlir = _pipelined(micro_batches, fusion=mode == "gemm",
                            accumulate="runtime" if mode == "runtime" else None)
    assert ("ernie.matmul_accumulate" in mlir) == (mode == "gemm")
    est = cost.estimate(mlir, cluster)
    summed = est["compute_by_op"].get("runtime.sum_micro_batches", 0.0)
    zeroed = est["compute_by_op"].get("runtime.zero_gradient_sums", 0.0)
    per_stage = []
    for stage in range(2):
        grads = _backward_gradients(mlir, stage)
        if mode == "runtime":
            per_stage.append((micro_batches - 1) * sum(
                d["launch_overhead"] + 3 * n * size / bandwidth for n, size in grads))
        else:
            per_stage.append(sum(d["launch_overhead"] + n * size / bandwidth
                                 for n, size in grads))
    charged, other = (summed, zeroed) if mode == "runtime" else (zeroed, summed)
    assert charged == pytest.approx(per_stage[0], rel=1e-6) or \
        charged == pytest.approx(per_stage[1], rel=1e-6)
    assert other == 0
    if mode == "runtime":
        assert (summed > 0) == (micro_batches > 1)


def test_gradient_accumulation_fusion_makes_weight_gradients_accumulating_gemms():
    """The three ways run the same FLOPs (plus one add per gradient
    element), and GEMMs adding into the f32 sums (one more read of them,
    inside the GEMM) are the fastest: an add after each GEMM writes the
    product and reads it again, and so do the runtime's sums after each
    call. (Between those two, on a model this small, launches decide.)"""
    cluster = cost.load_cluster("dgx_h100")
    ests = {}
    for mode in ("gemm", "add", "runtime"):
        _, mlir = _pipelined(4, fusion=mode == "gemm",
                             accumulate="runtime" if mode == "runtime" else None)
        ests[mode] = cost.estimate(mlir, cluster)
    gemm, add, runtime = ests["gemm"], ests["add"], ests["runtime"]
    for e in (add, runtime):
        assert gemm["model_flops"] == pytest.approx(e["model_flops"], rel=1e-3)
    assert gemm["compute_by_op"].get("ernie.matmul_accumulate", 0) > 0
    assert "ernie.matmul_accumulate" not in add["compute_by_op"]
    assert runtime["compute_by_op"]["runtime.sum_micro_batches"] > 0
    assert gemm["step_seconds"] < min(add["step_seconds"], runtime["step_seconds"])


def test_recomputation_is_counted_apart_from_model_flops():
    plain = abstract_program().estimate("dgx_h100")
    full = abstract_program(config={"recompute": "full"}).estimate("dgx_h100")
    assert full["recompute_seconds"] > 0 and plain["recompute_seconds"] == 0
    assert full["model_flops"] == pytest.approx(plain["model_flops"], rel=1e-6)
    assert full["step_seconds"] > plain["step_seconds"]


def test_bad_cluster_descriptions_name_the_field():
    prog = abstract_program()
    good = cost.load_cluster("dgx_h100")
    bad = dict(good, device=dict(good["device"], peak_flops={"f32": 1e12, "bf16": "fast"}))
    with pytest.raises(ValueError, match=r"device: peak_flops.bf16: expected a positive number"):
        prog.estimate(bad)
    with pytest.raises(ValueError, match=r"devices_per_nod: unknown field"):
        prog.estimate(dict(good, devices_per_nod=8))
    with pytest.raises(ValueError, match=r"inter_node: expected a JSON object"):
        prog.estimate(dict(good, nodes=2))
    with pytest.raises(ValueError, match=r"no cluster 'dgx_h1000'"):
        prog.estimate("dgx_h1000")
    small = abstract_program([8], ["dp"], {"dp_config": {}}, batch=8)
    with pytest.raises(ValueError, match=r"8 ranks but the cluster .* only 4 devices"):
        small.estimate(cost.make_cluster("h100_sxm", devices_per_node=4))


# Two nodes of four H100s; the network between them 9x slower than NVLink,
# with 3x its latency.
TWO_NODES = cost.make_cluster("h100_sxm", nodes=2, devices_per_node=4, intra_node=(450e9, 3e-6),
                              inter_node=(50e9, 1e-5))
BF16 = dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
            num_key_value_heads=8, dtype="bf16")


@pytest.mark.parametrize("shape,names,config", [
    ([8], ["dp"], {"dp_config": {"sharding_level": 3}}),
    ([4, 2], ["dp", "mp"], {"dp_config": {"sharding_level": 1}, "mp_config": {
        "parallelize_plan": parallelize_plan(sequence_parallel=True)}}),
], ids=["zero3", "dp+mp+sp+zero1"])
def test_compiling_for_a_cluster_chooses_collectives_by_their_time(shape, names, config):
    """compile(cluster=) hands the cluster to propagation and partition,
    which then weigh each collective by the cost model's time for it there
    (latency per hop, the links its group crosses) instead of by its bytes.
    Here that changes the program, and the step model — which sees the
    whole step, overlap included — predicts it faster on that cluster
    (ZeRO-3: 3.65 -> 3.44 ms; dp 4 x mp 2: 1.91 -> 1.74 ms)."""
    by_bytes = abstract_program(shape, names, config, batch=8, seq=64, **BF16)
    by_time = abstract_program(shape, names, config, batch=8, seq=64, cluster=TWO_NODES, **BF16)
    assert by_time.cluster is TWO_NODES
    assert by_time.mlir != by_bytes.mlir
    fast, slow = by_time.estimate()["step_seconds"], by_bytes.estimate(TWO_NODES)["step_seconds"]
    assert fast < 0.97 * slow
    # The model state is the plan's, not the collectives'.
    assert by_time.report()["model_state_bytes"] == by_bytes.report()["model_state_bytes"]


def test_a_cluster_too_small_for_the_mesh_is_refused_at_compile():
    with pytest.raises(ValueError, match=r"the mesh has 8 ranks but the cluster '1 x 4' only 4 devices"):
        abstract_program([8], ["dp"], {"dp_config": {}}, cluster=cost.make_cluster(
            "h100_sxm", devices_per_node=4))
    with pytest.raises(ValueError, match=r"no cluster 'dgx_h1000'"):
        abstract_program([8], ["dp"], {"dp_config": {}}, cluster="dgx_h1000")
    with pytest.raises(ValueError, match=r"estimate\(\) needs a cluster"):
        abstract_program([2], ["dp"], {"dp_config": {}}).estimate()


def test_calibrated_cpu_is_a_cluster_the_model_reads():
    cluster = cost.calibrate_cpu(ranks=2, repeats=1, profile=False)
    d = cluster["device"]
    assert d["peak_flops"]["f32"] > 1e8 and d["memory_bandwidth"] > 1e8
    assert cluster["shared_processors"] >= 1
    est = abstract_program([2], ["dp"], {"dp_config": {}}).estimate(cluster)
    assert est["step_seconds"] > 0


def test_sequence_parallel_keeps_the_batch_split_over_dp():
    """Sequence parallelism's constraints once replicated the batch: every
    dp rank computed the whole global batch (dp times the FLOPs, and its
    activations). Its step does the FLOPs of plain tensor parallelism."""
    mesh = ([2, 2], ["dp", "mp"])
    tp = abstract_program(*mesh, {"dp_config": {}, "mp_config": {
        "parallelize_plan": parallelize_plan()}}).estimate("dgx_h100")
    sp = abstract_program(*mesh, {"dp_config": {}, "mp_config": {
        "parallelize_plan": parallelize_plan(sequence_parallel=True)}}).estimate("dgx_h100")
    assert sp["model_flops"] == pytest.approx(tp["model_flops"], rel=0.01)


def test_zero_levels_do_not_change_the_step_flops():
    """ZeRO moves state, not work: at every level a dp rank computes its own
    batch. Level 3 once computed the loss gradient (and what followed it
    back to the last layer) on the global batch on every rank: a weight
    gradient wanted split over dp pulled its batch-split operand whole."""
    model = dict(vocab_size=512, hidden_size=128, intermediate_size=352, num_hidden_layers=2,
                 num_attention_heads=8, num_key_value_heads=4)
    est = {level: abstract_program([8], ["dp"], {"dp_config": {"sharding_level": level}},
                                   batch=16, seq=64, **model).estimate("dgx_h100")
           for level in (1, 2, 3)}
    for level in (2, 3):
        assert est[level]["model_flops"] == pytest.approx(est[1]["model_flops"], rel=0.005)
        # The loss and its gradient (one fused op; 8x the work when
        # computed on the global batch).
        loss_grad = lambda e: e["compute_by_op"]["ernie.cross_entropy_and_grad"]
        assert loss_grad(est[level]) == pytest.approx(loss_grad(est[1]), rel=0.01)


def test_shared_processors_in_a_pipeline():
    """Two pipeline ranks time-sliced onto one processor: every step costs
    twice its own time while both stages run, its own time while the other
    idles (warm-up and cool-down). The step lies strictly between the
    unshared step and twice it, and its parts still add up to it."""
    from ernie.autoplan import breakdown

    prog = abstract_program([2], ["pp"], {"pp_config": {"split_spec": "llama.layers",
                                                        "accumulate_steps": 4}})
    alone = prog.estimate(cost.make_cluster("h100_sxm", devices_per_node=2))
    shared = prog.estimate(cost.make_cluster("h100_sxm", devices_per_node=2, shared_processors=1))
    assert alone["step_seconds"] < shared["step_seconds"] < 2 * alone["step_seconds"]
    # Without the idle stages' share it would be twice the compute-bound step.
    assert shared["step_seconds"] < 2 * alone["step_seconds"] - 0.5 * alone["bubble_seconds"]
    parts = sum(s for _, s in breakdown(shared))
    assert parts == pytest.approx(shared["step_seconds"], rel=1e-9)


@pytest.mark.parametrize("capacity_factor", [None, 1.0, 2.0])
def test_moe_flops_count_the_rows_routing_fills(capacity_factor):
    """The expert GEMMs (ernie.expert_matmul) compute the slots routing
    fills, not every slot of the buffers (dropless: a slot for every token
    of the group, E / k = 8 times the rows routing uses). So a step's FLOPs
    are 6 x active parameters a token (Megatron's count), within 15 % as
    for Llama (the embedding's gather, attention and the non-GEMM ops are
    not 6N); counting the empty slots would add 18 x hidden x intermediate
    a slot, 4x this model's count when dropless."""
    from ernie.models.ernie4_5 import Ernie4_5Config, Ernie4_5_MoeForCausalLM
    cfg = Ernie4_5Config(vocab_size=1024, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                         moe_num_experts=16, moe_k=2, moe_num_shared_experts=1,
                         moe_intermediate_size=256, moe_layer_start_index=1,
                         moe_capacity_factor=capacity_factor)
    with ernie.nn.abstract():
        m = Ernie4_5_MoeForCausalLM(cfg)
    batch, seq = 8, 128
    ids = np.zeros((batch, seq), np.int64)
    prog = ernie.compile(m, ernie.optimizer.AdamW(1e-4), [ids, ids], abstract=True)
    est = prog.estimate("dgx_h100")
    tokens, moe = batch * seq, 3
    active = sum(int(np.prod(p.shape)) for n, p in m.named_parameters() if ".experts." not in n) \
        + moe * 2 * 3 * 256 * 256  # k = 2 experts a token
    assert est["model_flops"] == pytest.approx(6 * active * tokens, rel=0.15)
    assert "expert_matmul" in prog.mlir

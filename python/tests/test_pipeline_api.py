"""The pipeline API: where split points land, the bad inputs, PipelineLayer
and SharedLayerDesc, and the schedule library's bindings.

Everything here runs without the pipeline passes: split points are checked
in the traced (unpartitioned) IR, errors before compilation, schedules
against independent re-implementations of GPipe's, 1F1B's and Megatron's
interleaved orders, and the simulated bubble against its closed form.
"""

import re

import numpy as np
import pytest

import ernie
import ernie.distributed as dist
import ernie.functional as F
from ernie.distributed import LayerDesc, PipelineLayer, SharedLayerDesc, SplitPoint
from ernie.models.llama import LlamaConfig, LlamaForCausalLM
from ernie.nn import Embedding, Linear, Module, RMSNorm

TINY = dict(vocab_size=32, hidden_size=16, intermediate_size=24, num_attention_heads=4,
            num_key_value_heads=2)


def llama(layers=4, **kw):
    return LlamaForCausalLM(LlamaConfig(**TINY, num_hidden_layers=layers, **kw))


def batch(b=4, s=8, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 32, size=(b, s)), rng.integers(0, 32, size=(b, s))]


def pp_mesh(pp, **other):
    names = list(other) + ["pp"]
    shape = list(other.values()) + [pp]
    return dist.ProcessMesh(np.arange(int(np.prod(shape))).reshape(shape), names)


def traced(model, mesh, config, inputs=None):
    """The traced module of `model` after parallelize(config)."""
    dist.parallelize(model, None, mesh, config)
    return ernie.trace_model(model, inputs or batch(), mesh)


def split_positions(text):
    """Per ernie.split_point op, how many rms_norm ops precede it (two per
    Llama decoder layer: where in the layer stack the boundary is)."""
    ops = re.findall(r"ernie\.(split_point|rms_norm)\b", text)
    out, norms = [], 0
    for op in ops:
        if op == "rms_norm":
            norms += 1
        else:
            out.append(norms)
    return out


# ---------------------------------------------------------------------------
# Where split points land
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("layers,pp,vpp,want", [
    (4, 2, 1, [4]),           # after layer 1
    (4, 4, 1, [2, 4, 6]),     # after every layer but the last
    (4, 2, 2, [2, 4, 6]),     # 4 chunks of one layer
    (6, 2, 1, [6]),           # after layer 2
    (6, 3, 1, [4, 8]),
])
def test_split_spec_prefix_divides_layers_evenly(layers, pp, vpp, want):
    config = {"pp_config": {"split_spec": "llama.layers", "vpp_degree": vpp,
                            "accumulate_steps": 2 * pp}}
    text = traced(llama(layers), pp_mesh(pp), config)
    assert split_positions(text) == want


def test_split_spec_list_of_prefixes():
    class Stack(Module):
        def __init__(self):
            super().__init__()
            self.blocks = ernie.nn.LayerList([RMSNorm(4) for _ in range(2)])
            self.extra = ernie.nn.LayerList([RMSNorm(4) for _ in range(2)])

        def forward(self, x):
            for layer in list(self.blocks) + list(self.extra):
                x = layer(x)
            return F.sum(x)
    x = np.ones((2, 4), np.float32)
    text = traced(Stack(), pp_mesh(2), {"pp_config": {"split_spec": ["blocks", "extra"]}}, [x])
    assert split_positions(text) == [2]
    text = traced(Stack(), pp_mesh(4), {"pp_config": {"split_spec": ["blocks", "extra"]}}, [x])
    assert split_positions(text) == [1, 2, 3]


def test_split_spec_dict_end_and_beginning():
    # END: the layer's output (one tensor) is marked.
    text = traced(llama(), pp_mesh(2), {"pp_config": {"split_spec": {"llama.layers.0": SplitPoint.END}}})
    assert split_positions(text) == [2]
    # BEGINNING: every tensor input of the layer (hidden states, positions).
    text = traced(llama(), pp_mesh(2),
                  {"pp_config": {"split_spec": {"llama.layers.1": SplitPoint.BEGINNING}}})
    assert split_positions(text) == [2, 2]
    text = traced(llama(), pp_mesh(4), {"pp_config": {"split_spec": {
        "llama.layers.0": SplitPoint.END, "llama.layers.2": SplitPoint.BEGINNING,
        "llama.layers.3": SplitPoint.BEGINNING}}})
    assert split_positions(text) == [2, 4, 4, 6, 6]


def test_split_points_only_in_pipelined_traces():
    model = llama()
    config = {"pp_config": {"split_spec": "llama.layers"}}
    dist.parallelize(model, None, pp_mesh(2), config)
    # The same marked model traced without a pp axis is one stage.
    assert "split_point" not in ernie.trace_model(model, batch(), None)
    assert "split_point" not in ernie.trace_model(model, batch(), dist.ProcessMesh([0, 1], ["pp"]),
                                                  split_points=False)
    assert split_positions(ernie.trace_model(model, batch(), None, split_points=True)) == [4]
    # A later parallelize without pp_config removes the marks.
    dist.parallelize(model, None, pp_mesh(2), {})
    assert "split_point" not in ernie.trace_model(model, batch(), pp_mesh(2))


def test_functional_split_point_marks_tensors_elementwise():
    trace = ernie.tensor.Trace("f")
    with ernie.tensor.tracing(trace):
        x = trace.argument([2, 3], "f32")
        y, z, k = F.split_point((x, F.exp(x), 3))
        assert k == 3 and y.shape == (2, 3)
        trace.tracer.finish([F.sum(y + z).handle])
    assert trace.split_point_count == 2
    assert trace.tracer.text().count("ernie.split_point") == 2
    off = ernie.tensor.Trace("g", split_points=False)
    with ernie.tensor.tracing(off):
        x = off.argument([2], "f32")
        assert F.split_point(x) is x


def test_micro_batch_tracing():
    text = ernie.trace_model(llama(), batch(b=8), None, micro_batches=4)
    assert "tensor<2x8xi64>" in text and "tensor<8x8xi64>" not in text
    with pytest.raises(ValueError, match="8 rows .* do not divide into accumulate_steps=3"):
        ernie.trace_model(llama(), batch(b=8), None, micro_batches=3)


# ---------------------------------------------------------------------------
# Bad pp_config
# ---------------------------------------------------------------------------

def test_split_spec_errors():
    mesh4 = pp_mesh(4)
    with pytest.raises(ValueError, match=re.escape(
            "split_spec 'llama.layers' matches 6 layers, which do not divide into 4 stages")):
        dist.parallelize(llama(6), None, mesh4, {"pp_config": {"split_spec": "llama.layers"}})
    with pytest.raises(ValueError, match=r"matches 2 layers: more stages \(4\) than layers"):
        dist.parallelize(llama(2), None, mesh4, {"pp_config": {"split_spec": "llama.layers"}})
    with pytest.raises(ValueError, match=r"matches 4 layers: more stages \(8\) than layers"):
        dist.parallelize(llama(4), None, mesh4, {"pp_config": {"split_spec": "llama.layers",
                                                                "vpp_degree": 2,
                                                                "accumulate_steps": 4}})
    with pytest.raises(ValueError, match=r"'llama.layer' matches no sub-layer named "
                                         r"'llama.layer.<int>' \(nearby: 'llama.layers'\)"):
        dist.parallelize(llama(), None, mesh4, {"pp_config": {"split_spec": "llama.layer"}})
    with pytest.raises(ValueError, match=r"names 'llama.layers.9', which is not a sub-layer.*"
                                         r"nearby: .*'llama.layers.0'"):
        dist.parallelize(llama(), None, pp_mesh(2),
                         {"pp_config": {"split_spec": {"llama.layers.9": SplitPoint.END}}})
    with pytest.raises(ValueError, match=r"places 1 split point\(s\); 4 stages .* need 3"):
        dist.parallelize(llama(), None, mesh4,
                         {"pp_config": {"split_spec": {"llama.layers.0": SplitPoint.END}}})
    with pytest.raises(TypeError, match="not SplitPoint.END or SplitPoint.BEGINNING"):
        dist.parallelize(llama(), None, pp_mesh(2),
                         {"pp_config": {"split_spec": {"llama.layers.0": "END"}}})
    with pytest.raises(TypeError, match="split_spec is a layer-name prefix"):
        dist.parallelize(llama(), None, pp_mesh(2), {"pp_config": {"split_spec": 3}})


def test_pp_config_errors():
    mesh = pp_mesh(2)
    spec = {"split_spec": "llama.layers"}
    cases = [
        ({**spec, "schedule": "1F1B"}, ValueError, "unknown pp_config keys"),
        ({**spec, "accumulate_steps": 0}, ValueError, "accumulate_steps must be an integer >= 1"),
        ({**spec, "vpp_degree": 1.5}, ValueError, "vpp_degree must be an integer >= 1"),
        ({**spec, "schedule_mode": "ZBH1"}, ValueError, "unknown pipeline schedule 'ZBH1'"),
        ({**spec, "schedule_mode": "VPP"}, ValueError, "needs vpp_degree >= 2"),
        ({**spec, "schedule_mode": "1F1B", "vpp_degree": 2, "accumulate_steps": 2}, ValueError,
         "runs one chunk per pipeline rank"),
        ({**spec, "vpp_degree": 2, "accumulate_steps": 3}, ValueError,
         r"interleaved schedule needs accumulate_steps \(3\) to be a multiple of pp \(2\)"),
        ({**spec, "global_spec": "llama.rope"}, ValueError, "global_spec names 'llama.rope'"),
    ]
    for pp, kind, message in cases:
        with pytest.raises(kind, match=message):
            dist.parallelize(llama(), None, mesh, {"pp_config": pp})
    with pytest.raises(ValueError, match="needs a mesh dimension named 'pp'"):
        dist.parallelize(llama(), None, dist.ProcessMesh([0, 1], ["dp"]), {"pp_config": spec})
    # Accepted: global_spec (values crossing stages are sent anyway), the schedules.
    for pp in ({**spec, "global_spec": ["llama.embed_tokens"]},
               {**spec, "schedule_mode": "FThenB", "accumulate_steps": 3},
               {**spec, "schedule_mode": "VPP", "vpp_degree": 2, "accumulate_steps": 4}):
        model, _ = dist.parallelize(llama(), None, mesh, {"pp_config": pp})
        assert model._ernie_plan["pipeline"]["schedule"] in ("1F1B", "FThenB", "interleaved")
    settings = dist.parallelize(llama(), None, mesh, {"pp_config": {
        **spec, "vpp_degree": 2, "accumulate_steps": 4}})[0]._ernie_plan["pipeline"]
    assert (settings["schedule"], settings["virtual_stages"], settings["accumulate_steps"]) == \
        ("interleaved", 2, 4)


def test_compile_errors_before_the_passes():
    mesh = pp_mesh(2, dp=2)
    opt = ernie.optimizer.SGD(0.1)
    spec = {"split_spec": "llama.layers"}
    with pytest.raises(ValueError, match="4 rows .* do not divide into accumulate_steps=3"):
        ernie.compile(llama(), opt, batch(b=4), mesh=mesh,
                      config={"pp_config": {**spec, "accumulate_steps": 3}})
    with pytest.raises(ValueError, match=r"a micro-batch has 1 rows \(4 / accumulate_steps=4\), "
                                         r"which do not divide over dp=2"):
        ernie.compile(llama(), opt, batch(b=4), mesh=mesh,
                      config={"dp_config": {}, "pp_config": {**spec, "accumulate_steps": 4}})
    with pytest.raises(ValueError, match="needs an optimizer"):
        ernie.compile(llama(), None, batch(), mesh=pp_mesh(2), config={"pp_config": spec})
    with pytest.raises(ValueError, match="places no split point"):
        ernie.compile(llama(), opt, batch(), mesh=pp_mesh(2))

    class Skips(Module):  # a marked layer the forward never calls
        def __init__(self):
            super().__init__()
            self.layers = ernie.nn.LayerList([RMSNorm(4) for _ in range(3)])

        def forward(self, x):
            return F.sum(F.split_point(self.layers[0](x)))
    with pytest.raises(ValueError, match="layer 'layers.1', which the model's forward never calls"):
        ernie.compile(Skips(), opt, [np.ones((2, 4), np.float32)], mesh=pp_mesh(2),
                      config={"pp_config": {"split_spec": {"layers.1": SplitPoint.END}}})


# ---------------------------------------------------------------------------
# PipelineLayer, LayerDesc, SharedLayerDesc
# ---------------------------------------------------------------------------

class Block(Module):
    def __init__(self, d):
        super().__init__()
        self.norm = RMSNorm(d)
        self.proj = Linear(d, d, bias=False)

    def forward(self, x):
        return x + self.proj(self.norm(x))


def head(embedding, x):
    return F.matmul(x, embedding.p("weight"), transpose_b=True)


def loss(logits, labels):
    return F.cross_entropy(logits, labels)


def tied_descs(blocks=4, d=8, vocab=16):
    return ([SharedLayerDesc("embed", Embedding, None, "weight", vocab, d)]
            + [LayerDesc(Block, d) for _ in range(blocks)]
            + [LayerDesc(RMSNorm, d), SharedLayerDesc("embed", Embedding, head, "weight", vocab, d)])


def test_pipeline_layer_builds_segments_and_shares():
    model = PipelineLayer(tied_descs(), num_stages=2, loss_fn=loss)
    names = [n for n, _ in model.named_parameters()]
    assert names == ["shared_layers.embed.weight", "1.norm.weight", "1.proj.weight",
                     "2.norm.weight", "2.proj.weight", "3.norm.weight", "3.proj.weight",
                     "4.norm.weight", "4.proj.weight", "5.weight"]
    assert model.segment_parts == [0, 3, 7]  # Paddle's uniform: the remainder goes last
    assert [model.get_stage_from_index(i) for i in range(7)] == [0, 0, 0, 1, 1, 1, 1]
    embed = model.shared_layers["embed"]
    assert embed.weight.pipeline_stages == [0, 1]
    assert model.run_function[-1].func is head and model.run_function[0] is embed
    # seg_method "layer:": equal numbers of Blocks, the rest where they fall.
    model = PipelineLayer(tied_descs(), num_stages=2, loss_fn=loss, seg_method="layer:Block")
    assert model.segment_parts == [0, 3, 7]
    model = PipelineLayer(tied_descs(), num_stages=2, num_virtual_pipeline_stages=2,
                          loss_fn=loss, seg_method="layer:Block")
    assert model.segment_parts == [0, 2, 3, 4, 7]
    assert model.shared_layers["embed"].weight.pipeline_stages == [0, 3]


def test_pipeline_layer_places_split_points_and_declares_holders():
    model = PipelineLayer(tied_descs(), num_stages=2, num_virtual_pipeline_stages=2, loss_fn=loss)
    ids, labels = np.zeros((4, 5), np.int64), np.ones((4, 5), np.int64)
    text = ernie.trace_model(model, [ids, labels], pp_mesh(2))
    assert text.count("ernie.split_point") == 3
    assert re.search(r'ernie.param = "shared_layers.embed.weight", '
                     r'ernie.pipeline_stages = array<i64: 0, 3>', text), text
    # One stage: no markers, no declared stages.
    text = ernie.trace_model(model, [ids, labels], None)
    assert "split_point" not in text and "pipeline_stages" not in text


def test_shared_layer_with_two_attributes_and_a_subset():
    def tail(linear, x):  # the later occurrence shares the weight only
        return F.matmul(x, linear.p("weight"))
    descs = [SharedLayerDesc("proj", Linear, None, ["weight", "bias"], 4, 4),
             LayerDesc(RMSNorm, 4), LayerDesc(RMSNorm, 4),
             SharedLayerDesc("proj", Linear, tail, "weight", 4, 4)]
    model = PipelineLayer(descs, num_stages=4, loss_fn=lambda y, _: F.sum(y))
    proj = model.shared_layers["proj"]
    assert proj.weight.pipeline_stages == [0, 3] and proj.bias.pipeline_stages == [0]
    text = ernie.trace_model(model, [np.ones((2, 4), np.float32)] * 2, pp_mesh(4))
    assert 'ernie.param = "shared_layers.proj.bias", ernie.pipeline_stages = array<i64: 0>' in text
    assert 'ernie.param = "shared_layers.proj.weight", ernie.pipeline_stages = array<i64: 0, 3>' in text


def test_pipeline_layer_errors():
    with pytest.raises(ValueError, match=r"SharedLayerDesc 'proj' at entry 2 shares \['weight', "
                                         r"'bias'\], which is not a subset of the pivot's .*"
                                         r"\['weight'\]: \['bias'\] not shared there"):
        PipelineLayer([SharedLayerDesc("proj", Linear, None, "weight", 4, 4), LayerDesc(RMSNorm, 4),
                       SharedLayerDesc("proj", Linear, None, ["weight", "bias"], 4, 4)], num_stages=2)
    with pytest.raises(ValueError, match=r"SharedLayerDesc 'proj': the layer \(Linear\) has no "
                                         r"attribute 'bias'"):
        PipelineLayer([SharedLayerDesc("proj", Linear, None, ["weight", "bias"], 4, 4, bias=False),
                       LayerDesc(RMSNorm, 4)], num_stages=2)
    with pytest.raises(ValueError, match="'proj': 'epsilon' of the layer is a float, not a Parameter"):
        PipelineLayer([SharedLayerDesc("proj", RMSNorm, None, "epsilon", 4), LayerDesc(RMSNorm, 4)],
                      num_stages=2)
    with pytest.raises(ValueError, match="'embed' is built by Embedding at its first occurrence "
                                         "but Linear at entry 1"):
        PipelineLayer([SharedLayerDesc("embed", Embedding, None, "weight", 4, 4),
                       SharedLayerDesc("embed", Linear, None, "weight", 4, 4)], num_stages=2)
    with pytest.raises(ValueError, match=r"has 3 layers, fewer than its 4 chunks \(num_stages=2 x "
                                         r"num_virtual_pipeline_stages=2\)"):
        PipelineLayer([LayerDesc(RMSNorm, 4)] * 3, num_stages=2, num_virtual_pipeline_stages=2)
    with pytest.raises(ValueError, match="matches 3 layers, which do not divide into 2 chunks"):
        PipelineLayer([LayerDesc(Block, 4)] * 3, num_stages=2, seg_method="layer:Block")
    with pytest.raises(ValueError, match="seg_method must be"):
        PipelineLayer([LayerDesc(Block, 4)] * 2, num_stages=2, seg_method="parameters")
    with pytest.raises(ValueError, match="needs num_stages"):
        PipelineLayer([LayerDesc(Block, 4)] * 2)
    with pytest.raises(TypeError, match="entry 1 is 3"):
        PipelineLayer([LayerDesc(Block, 4), 3], num_stages=2)
    with pytest.raises(ValueError, match="key must be a non-empty name"):
        SharedLayerDesc("a.b", Linear)
    with pytest.raises(ValueError, match="repeats a name"):
        SharedLayerDesc("a", Linear, None, ["weight", "weight"])
    model = PipelineLayer(tied_descs(), num_stages=2, loss_fn=loss)
    with pytest.raises(ValueError, match=r"num_stages=2 but the mesh's 'pp' dimension has 4"):
        dist.parallelize(model, None, pp_mesh(4), {"pp_config": {}})
    with pytest.raises(ValueError, match="split_spec and a PipelineLayer both place split points"):
        dist.parallelize(model, None, pp_mesh(2), {"pp_config": {"split_spec": "x"}})
    with pytest.raises(ValueError, match="vpp_degree=2 but the PipelineLayer has "
                                         "num_virtual_pipeline_stages=1"):
        dist.parallelize(model, None, pp_mesh(2), {"pp_config": {"vpp_degree": 2}})


def test_pipeline_layer_num_stages_from_the_global_mesh():
    dist.set_mesh(pp_mesh(2, dp=2))
    try:
        assert PipelineLayer([LayerDesc(Block, 4)] * 2).num_stages == 2
    finally:
        dist.set_mesh(None)


# ---------------------------------------------------------------------------
# Schedules: the runtime's library against independent orders
# ---------------------------------------------------------------------------

def fthenb(p, m, r):
    return [("F", r, k) for k in range(m)] + [("B", r, k) for k in range(m)]


def one_f_one_b(p, m, r):
    warm = min(p - r - 1, m)
    order = [("F", r, k) for k in range(warm)]
    for i in range(m - warm):
        order += [("F", r, warm + i), ("B", r, i)]
    return order + [("B", r, k) for k in range(m - warm, m)]


def interleaved(p, v, m, r):
    """Megatron-LM's interleaved 1F1B (schedules.py): the k-th forward of
    rank r runs model chunk (k mod pv) div p on micro-batch
    (k div pv) * p + k mod p; backwards take the chunks in reverse."""
    total = m * v

    def step(action, k):
        j = (k % (p * v)) // p
        j = j if action == "F" else v - 1 - j
        return (action, j * p + r, (k // (p * v)) * p + k % p)
    warm = min((p - r - 1) * 2 + (v - 1) * p, total)
    order = [step("F", k) for k in range(warm)]
    for i in range(total - warm):
        order += [step("F", warm + i), step("B", i)]
    return order + [step("B", k) for k in range(total - warm, total)]


@pytest.mark.parametrize("p,m", [(4, 8), (2, 2), (3, 5), (4, 1)])
def test_fthenb_and_1f1b_orders(p, m):
    for kind, want in (("FThenB", fthenb), ("1F1B", one_f_one_b)):
        got = dist.pipeline_schedule(kind, p, 1, m)
        assert len(got) == p
        for r in range(p):
            assert [tuple(s) for s in got[r]] == want(p, m, r), (kind, r)


@pytest.mark.parametrize("p,v,m", [(4, 2, 8), (2, 2, 4), (2, 3, 6), (4, 2, 12)])
def test_interleaved_order(p, v, m):
    got = dist.pipeline_schedule("interleaved", p, v, m)
    assert dist.pipeline_schedule("VPP", p, v, m) == got
    for r in range(p):
        assert [tuple(s) for s in got[r]] == interleaved(p, v, m, r), r


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 4), (3, 7), (8, 16)])
@pytest.mark.parametrize("f,b", [(1.0, 1.0), (1.0, 2.0)])
def test_1f1b_bubble_fraction(p, m, f, b):
    sim = dist.simulate_pipeline("1F1B", p, 1, m, f, b)
    assert sim["bubble_fraction"] == pytest.approx((p - 1) / (m + p - 1), rel=1e-12)
    assert sim["makespan"] == pytest.approx((m + p - 1) * (f + b), rel=1e-12)
    assert sim["busy"] == pytest.approx(p * m * (f + b), rel=1e-12)
    assert len(sim["ranks"]) == p and all(len(r) == 2 * m for r in sim["ranks"])
    # The timeline follows the schedule's order on every rank.
    order = dist.pipeline_schedule("1F1B", p, 1, m)
    for r in range(p):
        assert [t[:3] for t in sim["ranks"][r]] == [tuple(s) for s in order[r]]
        ends = [t[4] for t in sim["ranks"][r]]
        assert ends == sorted(ends)
    # GPipe has the same bubble with equal stage costs.
    gpipe = dist.simulate_pipeline("FThenB", p, 1, m, f, b)
    assert gpipe["bubble_fraction"] == pytest.approx((p - 1) / (m + p - 1), rel=1e-12)


@pytest.mark.parametrize("p,v,m", [(4, 2, 8), (2, 2, 4), (4, 4, 8), (2, 3, 6)])
def test_interleaving_divides_the_bubble_by_v(p, v, m):
    """A chunk is 1/v of a rank's layers: its steps cost 1/v. The idle time
    per rank falls from (p - 1)(f + b) to (p - 1)(f + b) / v."""
    f, b = 1.0, 2.0
    plain = dist.simulate_pipeline("1F1B", p, 1, m, f, b)
    inter = dist.simulate_pipeline("interleaved", p, v, m, f / v, b / v)
    idle = lambda sim: sim["makespan"] - sim["busy"] / p
    assert idle(plain) == pytest.approx((p - 1) * (f + b), rel=1e-12)
    assert idle(inter) == pytest.approx((p - 1) * (f + b) / v, rel=1e-12)
    assert inter["bubble_fraction"] == pytest.approx((p - 1) / (v * m + p - 1), rel=1e-12)


def test_schedule_errors():
    with pytest.raises(ValueError, match="unknown pipeline schedule 'zero-bubble'"):
        dist.pipeline_schedule("zero-bubble", 4, 1, 8)
    with pytest.raises(ValueError, match="interleaved schedule needs virtual_stages >= 2, not 1"):
        dist.pipeline_schedule("interleaved", 4, 1, 8)
    with pytest.raises(ValueError, match=r"micro-batches \(6\) divisible by stages \(4\)"):
        dist.pipeline_schedule("interleaved", 4, 2, 6)
    with pytest.raises(ValueError, match="1F1B schedule needs virtual_stages = 1, not 2"):
        dist.pipeline_schedule("1F1B", 4, 2, 8)
    with pytest.raises(ValueError, match="stages >= 1, not 0"):
        dist.pipeline_schedule("1F1B", 0, 1, 8)
    with pytest.raises(ValueError, match="non-negative"):
        dist.simulate_pipeline("1F1B", 2, 1, 2, -1.0, 1.0)

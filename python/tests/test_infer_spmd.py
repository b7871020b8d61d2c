"""ernie.distributed.infer_spmd / infer_backward as a Python (or Paddle) user
calls them: every registered op with a valid case, every attribute spelling,
and bad input as a ValueError naming the op and the attribute.

The sweep enumerates the dialect at run time (_ernie.spmd_ops), so a new op
with a sharding rule and no case here fails test_every_op_has_a_case.
"""

import numpy as np
import pytest

import ernie.distributed as dist
from ernie import _ernie

F, I, B = "f32", "i64", "i1"
MESH = dist.ProcessMesh([[0, 1, 2, 3], [4, 5, 6, 7]], ["x", "y"])  # 2 x 4

U = ([((8, 16), F)], [[0, 1]], {}, [[0, 1]])
BIN = ([((8, 16), F), ((8, 16), F)], [[0, -1], [-1, 1]], {}, [[0, 1]])

# op -> (inputs, dims_mappings, attrs, expected output dims_mappings or None)
CASES = {
    **{op: U for op in ("abs", "neg", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "silu",
                        "relu", "reciprocal", "erf", "stop_gradient", "split_point")},
    "gelu": ([((8, 16), F)], [[0, 1]], {"approximate": True}, [[0, 1]]),
    **{op: BIN for op in ("add", "sub", "mul", "div", "maximum", "minimum", "pow")},
    "compare": ([((8, 16), F), ((8, 16), F)], [[0, -1], [-1, 1]], {"direction": "lt"}, [[0, 1]]),
    "select": ([((8, 16), B), ((8, 16), F), ((8, 16), F)], [[0, -1], [-1, 1], [-1, -1]], {}, [[0, 1]]),
    "cast": ([((8, 16), F)], [[0, 1]], {"dtype": "bf16"}, [[0, 1]]),
    "constant": ([], [], {"value": np.zeros((4, 8), np.float32)}, [[-1, -1]]),
    "full": ([], [], {"shape": [4, 8], "dtype": F, "value": 0.5}, [[-1, -1]]),
    "iota": ([], [], {"shape": [4, 8], "dtype": I, "dimension": 1}, [[-1, -1]]),
    "matmul": ([((8, 16), F), ((32, 16), F)], [[0, 1], [-1, 1]], {"trans_y": True}, [[0, -1]]),
    # The contraction (split here on mesh dim 1) is never split when added
    # to an accumulator: each rank's partial product would carry it.
    "matmul_accumulate": ([((8, 16), "bf16"), ((16, 32), "bf16"), ((8, 32), F)],
                          [[0, 1], [1, -1], [-1, -1]], {}, [[0, -1]]),
    "scaled_matmul": ([((16, 64), "f8E4M3FN"), ((32, 64), "f8E4M3FN"), ((), F), ((), F)],
                      [[0, -1], [1, -1], [], []],
                      {"transpose_b": True, "shape": [16, 32], "dtype": F}, [[0, 1]]),
    "reduce_sum": ([((8, 16), F)], [[0, 1]], {"axis": -1, "keepdim": True}, [[0, -1]]),
    "reduce_mean": ([((8, 16), F)], [[0, 1]], {"axis": [-1]}, [[0]]),
    "reduce_max": ([((8, 16), F)], [[0, 1]], {"axes": [0, 1]}, [[]]),
    "softmax": ([((8, 16), F)], [[0, 1]], {"axis": -1}, [[0, -1]]),
    "log_softmax": ([((8, 16), F)], [[0, 1]], {"axis": 0}, [[-1, 1]]),
    "rms_norm": ([((8, 16), F), ((16,), F)], [[0, 1], [-1]], {"epsilon": 1e-6}, [[0, -1]]),
    "layer_norm": ([((8, 16), F), ((16,), F), ((16,), F)], [[0, 1], [-1], [-1]],
                   {"epsilon": 1e-5, "begin_norm_axis": 1}, [[0, -1]]),
    "reshape": ([((8, 16), F)], [[0, 1]], {"shape": [0, 4, -1]}, [[0, 1, -1]]),
    "transpose": ([((8, 16), F)], [[0, 1]], {"perm": [-1, 0]}, [[1, 0]]),
    "broadcast": ([((16,), F)], [[1]], {"shape": [8, 16]}, [[-1, 1]]),
    "slice": ([((8, 16), F)], [[0, 1]], {"start": [0, 0], "limit": [8, 8], "step": [1, 1]}, [[0, -1]]),
    "pad": ([((8, 16), F)], [[0, 1]], {"low": [0, 1], "high": [0, 1], "interior": [0, 0]}, [[0, -1]]),
    "concat": ([((8, 16), F), ((8, 8), F)], [[0, 1], [-1, -1]], {"axis": -1}, [[0, -1]]),
    "split": ([((8, 16), F)], [[0, 1]], {"num_or_sections": 2, "axis": 0}, [[-1, 1], [-1, 1]]),
    "gather": ([((8, 16), F), ((3,), I)], [[0, 1], [-1]], {"axis": 0}, [[-1, 1]]),
    "index_add": ([((8, 16), F), ((3,), I), ((3, 16), F)], [[-1, 1], [-1], [-1, 1]], {"axis": 0},
                  [[-1, 1]]),
    "embedding": ([((4, 8), I), ((32, 16), F)], [[0, -1], [1, -1]], {"padding_idx": 0},
                  [[0, -1, -1]]),
    "topk": ([((8, 16), F)], [[0, 1]], {"k": 2, "axis": -1, "largest": False}, [[0, -1], [0, -1]]),
    # MoE: groups split, tokens within a group and k stay whole, hidden splits
    # (and the weights' gradient is then partial over it).
    "moe_route": ([((4, 16, 2), I)], [[0, 1, -1]], {"num_experts": 8, "capacity": 4},
                  [[0, -1, -1]]),
    "moe_dispatch": ([((4, 16, 32), F), ((4, 16, 2), I), ((4, 16, 2), I), ((4, 16, 2), F)],
                     [[0, -1, 1], [0, -1, -1], [0, -1, -1], [0, -1, -1]],
                     {"num_experts": 8, "capacity": 4}, [[-1, 0, -1, 1]]),
    "moe_combine": ([((8, 4, 4, 32), F), ((4, 16, 2), I), ((4, 16, 2), I), ((4, 16, 2), F)],
                    [[-1, 0, -1, 1], [0, -1, -1], [0, -1, -1], [0, -1, -1]], {}, [[0, -1, 1]]),
    "moe_weights_grad": ([((4, 16, 32), F), ((8, 4, 4, 32), F), ((4, 16, 2), I), ((4, 16, 2), I)],
                         [[0, -1, 1], [-1, 0, -1, 1], [0, -1, -1], [0, -1, -1]], {},
                         [[0, -1, -1]]),
    # The expert GEMMs: experts and groups split with the rows, the capacity
    # never; the weight gradient sums over the groups (partial over mesh 1).
    "expert_matmul": ([((8, 4, 4, 32), F), ((8, 32, 16), F), ((8, 4), I)],
                      [[0, 1, -1, -1], [0, -1, -1], [0, 1]], {"fill": 0.25},
                      [[0, 1, -1, -1]]),
    "expert_weight_grad": ([((8, 4, 4, 32), F), ((8, 4, 4, 16), F), ((8, 4), I)],
                           [[0, 1, -1, -1], [0, 1, -1, -1], [0, 1]], {"fill": 0.25},
                           [[0, -1, -1]]),
    "rope": ([((2, 8, 4, 16), F), ((8,), I)], [[0, -1, 1, -1], [-1]], {"theta": 10000.0},
             [[0, -1, 1, -1]]),
    "attention": ([((2, 8, 4, 16), F), ((2, 8, 4, 16), F), ((2, 8, 4, 16), F)],
                  [[0, -1, 1, -1], [0, -1, 1, -1], [0, -1, 1, -1]], {"causal": True},
                  [[0, -1, 1, -1]]),
    "attention_grad": ([((2, 8, 4, 16), F)] * 4, [[0, -1, 1, -1]] * 4, {"causal": True},
                       [[0, -1, 1, -1]] * 3),
    "cross_entropy": ([((8, 32), F), ((8,), I)], [[0, 1], [0]], {"reduction": "none"}, [[0]]),
    "cross_entropy_grad": ([((8, 32), F), ((8,), I), ((8,), F)], [[0, 1], [0], [0]],
                           {"reduction": "none", "ignore_index": -100}, [[0, 1]]),
    "sgd_update": ([((8, 16), F), ((8, 16), F), ((8, 16), F), ((), F)],
                   [[0, 1], [0, 1], [0, 1], []], {"momentum": 0.9}, [[0, 1], [0, 1]]),
    "adamw_update": ([((8, 16), F)] * 4 + [((), F), ((), I)], [[0, 1]] * 4 + [[], []],
                     {"beta1": 0.9, "weight_decay": 0}, [[0, 1]] * 3),
    "stage_all_reduce": ([((8, 16), F)], [[0, 1]], {"stages": [0, 1], "channel": 0}, None),
    "stage_broadcast": ([((8, 16), F)], [[0, 1]], {"stages": [0, 1], "channel": 0}, None),
}


def ops_with_rules():
    return sorted(name.removeprefix("ernie.") for name, has_rule in _ernie.spmd_ops() if has_rule)


def ops_without_rules():
    return sorted(name.removeprefix("ernie.") for name, has_rule in _ernie.spmd_ops() if not has_rule)


def test_every_op_has_a_case():
    assert len(ops_with_rules()) >= 57
    missing = [op for op in ops_with_rules() if op not in CASES]
    assert not missing, f"ops with a sharding rule but no infer_spmd case: {missing}"


def check_specs(inputs, in_maps, outs):
    assert len(in_maps) == len(inputs)
    for (shape, _), m in zip(inputs, in_maps):
        assert len(m) == len(shape)
    for spec in outs:
        used = [d for d in spec.dims_mapping + spec.partial_dims if d != -1]
        assert len(used) == len(set(used)) and all(0 <= d < MESH.ndim for d in used)


@pytest.mark.parametrize("op", ops_with_rules())
def test_every_op_runs(op):
    inputs, maps, attrs, want = CASES[op]
    ins, outs = dist.infer_spmd(op, inputs, maps, MESH, **attrs)
    check_specs(inputs, ins, outs)
    if want is not None:
        assert [o.dims_mapping for o in outs] == want
    # Backward from the forward's outputs: the same rule, from the other side.
    back_ins, back_outs = dist.infer_backward(op, inputs, [o.dims_mapping for o in outs], MESH, **attrs)
    check_specs(inputs, back_ins, back_outs)
    assert [o.dims_mapping for o in back_outs] == [o.dims_mapping for o in outs]


@pytest.mark.parametrize("op", ops_without_rules())
def test_ops_without_rules_are_value_errors(op):
    with pytest.raises(ValueError, match=f"ernie.{op}"):
        dist.infer_spmd(op, [((8, 16), F)], [[0, -1]], MESH)


# ---------------------------------------------------------------------------
# Attribute spellings.
# ---------------------------------------------------------------------------

def out0(*args, **kwargs):
    return dist.infer_spmd(*args, **kwargs)[1][0]


def test_matmul_transposes_in_every_spelling():
    x, w = ((8, 16), F), ((32, 16), F)
    for spelling in ("trans_y", "transpose_y", "transpose_b"):
        assert out0("matmul", [x, w], [[0, -1], [1, -1]], MESH, **{spelling: True}).dims_mapping == [0, 1]
    # trans_x=False is the default; both given is ambiguous.
    assert out0("matmul", [((8, 16), F), ((16, 4), F)], [[0, 1], [1, -1]], MESH,
                trans_x=False, trans_y=False) == ([0, -1], [1])
    with pytest.raises(ValueError, match="'ernie.matmul'.*'transpose_b' is given twice"):
        dist.infer_spmd("matmul", [x, w], [[0, -1], [1, -1]], MESH, trans_y=True, transpose_b=True)
    with pytest.raises(ValueError, match="'ernie.matmul'.*contraction"):
        dist.infer_spmd("matmul", [x, w], [[0, -1], [1, -1]], MESH)


def test_negative_axes_and_lists():
    x = [((4, 8, 16), F)]
    assert out0("softmax", x, [[0, -1, 1]], MESH, axis=-1).dims_mapping == [0, -1, -1]
    for axis in (-1, [-1], 2, [2]):
        spec = out0("reduce_sum", x, [[0, -1, 1]], MESH, axis=axis, keepdim=True)
        assert spec == ([0, -1, -1], [1])
    spec = out0("reduce_max", x, [[0, -1, 1]], MESH, axis=[-1, 0])
    assert spec == ([-1], [0, 1]) and spec.partial_types == {0: "max", 1: "max"}
    assert out0("reduce_mean", x, [[0, -1, 1]], MESH, axes=[1], keep_dim=False).dims_mapping == [0, 1]
    assert out0("transpose", x, [[0, -1, 1]], MESH, perm=[-1, 0, 1]).dims_mapping == [1, 0, -1]
    assert out0("concat", [((4, 8), F), ((4, 8), F)], [[0, 1], [0, 1]], MESH, axis=-2).dims_mapping == [-1, 1]


def test_reshape_shape_with_paddle_conventions():
    x = [((8, 16, 64), F)]
    assert out0("reshape", x, [[0, -1, 1]], MESH, shape=[0, 0, 4, -1]).dims_mapping == [0, -1, 1, -1]
    assert out0("reshape", x, [[0, -1, 1]], MESH, shape=(8, 16, 4, 16)).dims_mapping == [0, -1, 1, -1]
    with pytest.raises(ValueError, match="'ernie.reshape'.*more than one -1"):
        dist.infer_spmd("reshape", x, [[0, -1, 1]], MESH, shape=[-1, -1])
    with pytest.raises(ValueError, match="'ernie.reshape'.*cannot hold"):
        dist.infer_spmd("reshape", x, [[0, -1, 1]], MESH, shape=[3, -1])
    with pytest.raises(ValueError, match="'ernie.reshape'.*element count"):
        dist.infer_spmd("reshape", x, [[0, -1, 1]], MESH, shape=[8, 8])
    with pytest.raises(ValueError, match="'ernie.reshape'.*'shape' must be a list of integers"):
        dist.infer_spmd("reshape", x, [[0, -1, 1]], MESH, shape=7)


def test_split_sections():
    x = [((8, 12), F)]
    outs = dist.infer_spmd("split", x, [[0, 1]], MESH, num_or_sections=[4, -1, 2], axis=1)[1]
    assert len(outs) == 3
    assert len(dist.infer_spmd("split", x, [[0, 1]], MESH, num=3, axis=-1)[1]) == 3
    assert len(dist.infer_spmd("split", x, [[0, 1]], MESH, sizes=[6, 6], axis=1)[1]) == 2
    with pytest.raises(ValueError, match="'ernie.split'.*cannot split a dimension of 12 into 5"):
        dist.infer_spmd("split", x, [[0, 1]], MESH, num_or_sections=5, axis=1)


def test_elementwise_broadcasts_as_numpy():
    # Paddle's add with broadcasting: y [12] against x [64, 36, 12].
    ins, outs = dist.infer_spmd("add", [((64, 36, 12), F), ((12,), F)], [[-1, -1, -1], [0]], MESH)
    assert ins == [[-1, -1, 0], [0]] and outs[0].dims_mapping == [-1, -1, 0]
    with pytest.raises(ValueError, match="'ernie.add'.*do not broadcast"):
        dist.infer_spmd("add", [((4, 6), F), ((5,), F)], [[-1, -1], [-1]], MESH)


def test_paddle_attributes_ernie_fixes():
    logits, labels = ((8, 32), F), ((8,), I)
    spec = out0("cross_entropy", [logits, labels], [[0, 1], [0]], MESH, reduction="none", axis=-1,
                soft_label=False, use_softmax=True, numeric_stable_mode=True)
    assert spec == ([0], [1])
    with pytest.raises(ValueError, match="'ernie.cross_entropy'.*'axis' must be -1 or 1"):
        dist.infer_spmd("cross_entropy", [logits, labels], [[0, 1], [0]], MESH, axis=0)
    with pytest.raises(ValueError, match="'ernie.cross_entropy'.*'soft_label' must be False"):
        dist.infer_spmd("cross_entropy", [logits, labels], [[0, 1], [0]], MESH, soft_label=True)
    with pytest.raises(ValueError, match="'ernie.layer_norm'.*'begin_norm_axis' must be -1 or 1"):
        dist.infer_spmd("layer_norm", [logits, ((32,), F), ((32,), F)], [[0, 1], [-1], [-1]], MESH,
                        begin_norm_axis=0)


@pytest.mark.parametrize("op,inputs,maps,attrs,match", [
    ("matmul", [((8, 16), F), ((16, 4), F)], [[0, 1], [1, -1]], {"transpose_q": True},
     r"'ernie.matmul': has no attribute 'transpose_q' \(it has transpose_a, transpose_b\)"),
    ("matmul", [((8, 16), F), ((16, 4), F)], [[0, 1], [1, -1]], {"trans_x": "yes"},
     r"'ernie.matmul': attribute 'transpose_a' cannot be"),
    ("matmul", [((8, 16), F), ((16, 4), F)], [[0, 1], [1, -1]], {"trans_x": [1.5]},
     r"infer_spmd\('ernie.matmul'\): attribute 'trans_x'"),
    ("softmax", [((8, 16), F)], [[0, 1]], {}, r"'ernie.softmax' op requires attribute 'axis'"),
    ("softmax", [((8, 16), F)], [[0, 1]], {"axis": 5}, r"ernie.softmax.*axis"),
    ("softmax", [((8, 16), F)], [[0, 1]], {"axis": -7}, r"'ernie.softmax'.*'axis'"),
    ("reduce_sum", [((8, 16), F)], [[0, 1]], {"axis": [1, 1]}, r"ernie.reduce_sum.*sorted and distinct"),
    ("softmax", [((8, 16), F)], [[0, 1]], {"axis": 2 ** 70}, r"infer_spmd\('ernie.softmax'\): attribute 'axis'"),
    ("topk", [((8, 16), F)], [[0, 1]], {"k": 0, "axis": 1}, r"'ernie.topk'.*'k'"),
    ("cross_entropy", [((8, 32), F), ((8,), I)], [[0, 1], [0]], {"reduction": "avg"},
     r"reduction must be none, mean or sum"),
    ("matmul", [((8, 16), F)], [[0, 1]], {}, r"'ernie.matmul' takes 2 operands, got 1"),
    ("add", [((8, 16), F), ((8, 16), F)], [[0, 1]], {}, r"infer_spmd\('ernie.add'\): 1 input dims_mappings for 2"),
    ("add", [((8, 16), F), ((8, 16), F)], [[0, 1], [0]], {}, r"the dims_mapping of input 1 has 1 entries"),
    ("add", [((8, 16), F), ((8, 16), F)], [[0, 0], [0, 1]], {}, r"input 0 \(a mesh dimension out of range"),
    ("add", [((8, 16), F), ((8, 16), F)], [[2, 0], [0, 1]], {}, r"names mesh dimension 2 of a mesh of 2"),
    ("add", [((8, -16), F), ((8, 16), F)], [[0, 1], [0, 1]], {}, r"infer_spmd\('ernie.add'\).*non-negative"),
    ("add", [((8, 16), "f33"), ((8, 16), F)], [[0, 1], [0, 1]], {}, r"infer_spmd\('ernie.add'\).*dtype"),
    ("nope", [], [], {}, r"unknown op 'ernie.nope'"),
    ("reshape", [((8, 16), F)], [[0, 1]], {"shape": []}, r"'ernie.reshape'.*element count"),
    ("full", [], [], {"shape": [4]}, r"'ernie.full': needs a 'dtype'"),
    ("cast", [((8, 16), F)], [[0, 1]], {"dtype": "float128"}, r"infer_spmd\('ernie.cast'\): attribute 'dtype'"),
])
def test_bad_input_is_a_value_error(op, inputs, maps, attrs, match):
    with pytest.raises(ValueError, match=match):
        dist.infer_spmd(op, inputs, maps, MESH, **attrs)


def test_meshes_are_checked():
    """The binding checks a mesh itself (ProcessMesh checks too, before it)."""
    types = [([4], F), ([4], F)]
    maps = [([0], []), ([0], [])]
    with pytest.raises(ValueError, match="'ernie.add'.*size 0"):
        _ernie.infer_spmd("ernie.add", types, maps, ["x"], [0])
    with pytest.raises(ValueError, match="'ernie.add'.*non-empty"):
        _ernie.infer_spmd("ernie.add", types, maps, [""], [2])
    with pytest.raises(ValueError, match="'ernie.add'.*one size per axis"):
        _ernie.infer_spmd("ernie.add", types, maps, [], [])
    with pytest.raises(ValueError, match="'ernie.add'.*more than"):
        _ernie.infer_spmd("ernie.add", types, maps, ["x", "y"], [2 ** 32, 2 ** 32])


def test_backward_resolves_outputs():
    # Paddle's matmul backward: mn[1, 0] -> mk[1, -1], kn[-1, 0].
    ins, outs = dist.infer_backward("matmul", [((64, 32), F), ((32, 48), F)], [[1, 0]], MESH)
    assert ins == [[1, -1], [-1, 0]] and outs == [([1, 0], [])]
    # An output sharding the rule cannot keep comes back as the rule makes it.
    ins, outs = dist.infer_backward("softmax", [((8, 16), F)], [[0, 1]], MESH, axis=-1)
    assert ins == [[0, -1]] and outs[0].dims_mapping == [0, -1]
    with pytest.raises(ValueError, match="'ernie.split' has 2 outputs; got 1"):
        dist.infer_backward("split", [((8, 16), F)], [[0, -1]], MESH, axis=1, num=2)
    with pytest.raises(ValueError, match="output 0 has a sharding of rank 1"):
        dist.infer_backward("exp", [((8, 16), F)], [[0]], MESH)

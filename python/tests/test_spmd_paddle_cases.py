"""Paddle's own SPMD rule tests (test/auto_parallel/spmd_rules/ in
PaddlePaddle/Paddle: test_matmul_rule.py, test_elementwise_rule.py,
test_reduction_rule.py, test_softmax_rule.py, test_layer_norm_rule.py,
test_embedding_rule.py, test_transpose_rule.py, test_reshape_rule.py,
test_split_rule.py, test_concat_rule.py,
test_cross_entropy_with_softmax_rule.py; rms_norm from the C++ rule test in
test/cpp/auto_parallel), transcribed: the inputs, the
attributes and Paddle's expected dims_mappings (and partial dims where
Paddle checks them), run through ernie.distributed.infer_spmd /
infer_backward.

Where ernie legitimately answers otherwise, the case carries ernie's answer
as well as Paddle's and the reason (`differs`); docs/spmd-rules.md lists
every one. Shapes are Paddle's except where noted in `note` (Paddle's rule
does not check shapes; ernie's ops do).
"""

import pytest

import ernie.distributed as dist

F, I = "f32", "i64"
M4 = ([0, 1, 2, 3], ["d0"])                                  # mesh [4]
M23 = ([[0, 1, 2], [3, 4, 5]], ["d0", "d1"])                   # mesh [2, 3]
M24 = ([[0, 1, 2, 3], [4, 5, 6, 7]], ["d0", "d1"])             # mesh [2, 4]
M22 = ([[0, 1], [2, 3]], ["d0", "d1"])                         # mesh [2, 2]


def case(name, op, mesh, inputs, maps, attrs, want_in, want_out, partial=None,
         backward=None, differs=None, note=None):
    """`maps`: input dims_mappings (forward) or, with backward=True, output
    dims_mappings. `want_*`: Paddle's expected values. `partial`: Paddle's
    expected partial dims of output 0. `differs`: (ernie_in, ernie_out,
    ernie_partial, reason) where ernie's answer is another."""
    return pytest.param(op, mesh, inputs, maps, attrs, want_in, want_out, partial, bool(backward),
                        differs, id=name)


X, Y = ((64, 32), F), ((32, 48), F)
X4 = ((512, 48, 64, 32), F)

CASES = [
    # ----------------------------------------------------------- matmul
    case("matmul/mk[1,0],kn[0,-1]", "matmul", M23, [X, Y], [[1, 0], [0, -1]], {},
         [[1, 0], [0, -1]], [[1, -1]], partial=[0]),
    case("matmul/row-parallel", "matmul", M23, [X, Y], [[1, -1], [-1, -1]], {},
         [[1, -1], [-1, -1]], [[1, -1]], partial=[]),
    case("matmul/n-parallel", "matmul", M23, [X, Y], [[-1, -1], [-1, 0]], {},
         [[-1, -1], [-1, 0]], [[-1, 0]], partial=[]),
    case("matmul/partial-propagation", "matmul", M23, [X, Y], [[1, 0], [-1, -1]], {},
         [[1, 0], [0, -1]], [[1, -1]], partial=[0]),
    case("matmul/kn[1,0]", "matmul", M23, [X, Y], [[-1, -1], [1, 0]], {},
         [[-1, 1], [1, 0]], [[-1, 0]], partial=[1]),
    case("matmul/batched", "matmul", M23, [X4, Y], [[0, 1, -1, -1], [-1, -1]], {},
         [[0, 1, -1, -1], [-1, -1]], [[0, 1, -1, -1]], partial=[]),
    case("matmul/batched-k-split", "matmul", M23, [X4, Y], [[1, -1, -1, 0], [-1, -1]], {},
         [[1, -1, -1, 0], [0, -1]], [[1, -1, -1, -1]], partial=[0]),
    case("matmul/trans_x", "matmul", M23, [X4, ((64, 48), F)], [[1, -1, -1, 0], [-1, -1]],
         {"trans_x": True}, [[1, -1, -1, 0], [-1, -1]], [[1, -1, 0, -1]], partial=[],
         note="y is [64, 48] (Paddle's test keeps [32, 48], which trans_x does not contract)"),
    case("matmul/trans_y", "matmul", M23, [X4, ((48, 32), F)], [[-1, -1, -1, -1], [1, 0]],
         {"trans_y": True}, [[-1, -1, -1, 0], [1, 0]], [[-1, -1, -1, 1]], partial=[0],
         note="y is [48, 32] for the transposed contraction"),
    case("matmul/trans_x+trans_y", "matmul", M23, [X4, ((48, 64), F)], [[-1, -1, 0, 1], [1, 0]],
         {"trans_x": True, "trans_y": True}, [[-1, -1, 0, 1], [-1, 0]], [[-1, -1, 1, -1]],
         partial=[0], note="y is [48, 64] for the transposed contraction"),
    case("matmul/k-on-two-axes", "matmul", M23, [X4, ((48, 64), F)], [[-1, -1, 1, -1], [-1, 0]],
         {"trans_x": True, "trans_y": True}, "NotImplementedError", None,
         differs=([[-1, -1, 1, -1], [-1, 1]], [[-1, -1, -1, -1]], [1],
                  "Paddle refuses k sharded over two mesh axes; ernie keeps the cheaper "
                  "(x's, the larger tensor) and reshards y")),
    case("matmul/backward", "matmul", M23, [X, Y], [[1, 0]], {},
         [[1, -1], [-1, 0]], [[1, 0]], backward=True),
    case("matmul/backward-trans", "matmul", M23,
         [((512, 48, 32, 64), F), ((512, 48, 48, 32), F)], [[-1, -1, 0, 1]],
         {"trans_x": True, "trans_y": True}, [[-1, -1, -1, 0], [-1, -1, 1, -1]],
         [[-1, -1, 0, 1]], backward=True,
         note="y's batch is [512, 48] (Paddle's [512, 1] broadcasts; ernie's matmul does not)"),

    # ------------------------------------------------------ elementwise
    case("add/[0,-1],[-1,-1]", "add", M4, [((64, 36), F)] * 2, [[0, -1], [-1, -1]], {},
         [[0, -1], [0, -1]], [[0, -1]]),
    case("add/[0,-1],[-1,0]", "add", M4, [((64, 36), F)] * 2, [[0, -1], [-1, 0]], {},
         [[0, -1], [0, -1]], [[0, -1]]),
    case("add/replicated", "add", M4, [((64, 36), F)] * 2, [[-1, -1], [-1, -1]], {},
         [[-1, -1], [-1, -1]], [[-1, -1]]),
    case("relu/[-1,0]", "relu", M4, [((64, 36), F)], [[-1, 0]], {}, [[-1, 0]], [[-1, 0]]),
    case("add/broadcast-[0,-1,-1],[-1]", "add", M4, [((64, 36, 12), F), ((12,), F)],
         [[0, -1, -1], [-1]], {}, [[0, -1, -1], [-1]], [[0, -1, -1]]),
    case("add/broadcast-[-1,0,-1],[-1]", "add", M4, [((64, 36, 12), F), ((12,), F)],
         [[-1, 0, -1], [-1]], {}, [[-1, 0, -1], [-1]], [[-1, 0, -1]]),
    case("add/broadcast-[-1,-1,0],[-1]", "add", M4, [((64, 36, 12), F), ((12,), F)],
         [[-1, -1, 0], [-1]], {}, [[-1, -1, 0], [0]], [[-1, -1, 0]]),
    case("add/broadcast-[-1,-1,-1],[0]", "add", M4, [((64, 36, 12), F), ((12,), F)],
         [[-1, -1, -1], [0]], {}, [[-1, -1, 0], [0]], [[-1, -1, 0]]),
    case("add/broadcast-size-1", "add", M4, [((64, 36, 12), F), ((1, 12), F)],
         [[-1, 0, -1], [-1, -1]], {}, [[-1, 0, -1], [-1, -1]], [[-1, 0, -1]]),
    case("add/broadcast-4d-x", "add", M4, [((64, 1, 1, 12), F), ((64, 32, 12), F)],
         [[0, -1, -1, -1], [-1, -1, -1]], {}, [[0, -1, -1, -1], [-1, -1, -1]], [[0, -1, -1, -1]]),
    case("add/broadcast-4d-y", "add", M4, [((64, 1, 1, 12), F), ((64, 32, 12), F)],
         [[-1, -1, -1, -1], [0, -1, -1]], {}, [[-1, -1, -1, -1], [0, -1, -1]], [[-1, 0, -1, -1]]),
    case("add/2d-mesh", "add", M23, [((96, 24, 48), F)] * 2, [[0, 1, -1], [-1, -1, -1]], {},
         [[0, 1, -1], [0, 1, -1]], [[0, 1, -1]]),
    case("add/2d-mesh-merge", "add", M23, [((96, 24, 48), F)] * 2, [[0, -1, -1], [-1, 1, 0]], {},
         [[0, 1, -1], [0, 1, -1]], [[0, 1, -1]]),
    case("add/2d-mesh-broadcast", "add", M23, [((96, 24, 48), F), ((48,), F)],
         [[0, -1, -1], [1]], {}, [[0, -1, 1], [1]], [[0, -1, 1]]),
    case("add/2d-mesh-broadcast-conflict", "add", M23, [((96, 24, 48), F), ((48,), F)],
         [[0, 1, -1], [0]], {}, [[0, 1, -1], [-1]], [[0, 1, -1]]),
    case("add/2d-mesh-broadcast-4d", "add", M23, [((96, 1, 1, 48), F), ((96, 24, 48), F)],
         [[-1, -1, -1, 1], [0, -1, 1]], {}, [[-1, -1, -1, 1], [0, -1, 1]], [[-1, 0, -1, 1]]),
    case("add/backward-[0,-1]", "add", M4, [((64, 36), F)] * 2, [[0, -1]], {},
         [[0, -1], [0, -1]], [[0, -1]], backward=True),
    case("add/backward-replicated", "add", M4, [((64, 36), F)] * 2, [[-1, -1]], {},
         [[-1, -1], [-1, -1]], [[-1, -1]], backward=True),
    case("relu/backward", "relu", M4, [((64, 36), F)], [[-1, 0]], {},
         [[-1, 0]], [[-1, 0]], backward=True),

    # -------------------------------------------------------- reductions
    case("max/axis0", "reduce_max", M4, [X], [[0, -1]], {"axis": [0], "keep_dim": False},
         [[0, -1]], [[-1]], partial=[0]),
    case("max/axis0-keepdim", "reduce_max", M4, [X], [[0, -1]], {"axis": [0], "keep_dim": True},
         [[0, -1]], [[-1, -1]], partial=[0]),
    case("max/axis1", "reduce_max", M4, [X], [[0, -1]], {"axis": [1], "keep_dim": False},
         [[0, -1]], [[0]], partial=[]),
    case("max/axis1-keepdim", "reduce_max", M4, [X], [[0, -1]], {"axis": [1], "keep_dim": True},
         [[0, -1]], [[0, -1]], partial=[]),
    case("max/all", "reduce_max", M4, [X], [[0, -1]], {"axis": [0, 1], "keep_dim": False},
         [[0, -1]], [[]], partial=[0]),
    case("max/all-keepdim", "reduce_max", M4, [X], [[0, -1]], {"axis": [0, 1], "keep_dim": True},
         [[0, -1]], [[-1, -1]], partial=[0]),
    case("max/2d-mesh-[0,-1,-1]", "reduce_max", M23, [((96, 24, 48), F)], [[0, -1, -1]],
         {"axis": [1, 2], "keep_dim": False}, [[0, -1, -1]], [[0]], partial=[]),
    case("max/2d-mesh-[-1,0,1]", "reduce_max", M23, [((96, 24, 48), F)], [[-1, 0, 1]],
         {"axis": [1, 2], "keep_dim": False}, [[-1, 0, 1]], [[-1]], partial=[0, 1]),
    case("max/2d-mesh-[1,-1,-1]", "reduce_max", M23, [((96, 24, 48), F)], [[1, -1, -1]],
         {"axis": [1, 2], "keep_dim": False}, [[1, -1, -1]], [[1]], partial=[]),
    case("max/2d-mesh-[0,1,-1]", "reduce_max", M23, [((96, 24, 48), F)], [[0, 1, -1]],
         {"axis": [1, 2], "keep_dim": False}, [[0, 1, -1]], [[0]], partial=[1]),
    case("max/2d-mesh-[0,1,-1]-keepdim", "reduce_max", M23, [((96, 24, 48), F)], [[0, 1, -1]],
         {"axis": [1, 2], "keep_dim": True}, [[0, 1, -1]], [[0, -1, -1]], partial=[1]),
    case("max/backward-axis0", "reduce_max", M4, [X], [[-1]], {"axis": [0], "keep_dim": False},
         [[-1, -1]], [[-1]], backward=True),
    case("max/backward-axis0-keepdim", "reduce_max", M4, [X], [[-1, -1]],
         {"axis": [0], "keep_dim": True}, [[-1, -1]], [[-1, -1]], backward=True),
    case("max/backward-axis1", "reduce_max", M4, [X], [[0]], {"axis": [1], "keep_dim": False},
         [[0, -1]], [[0]], backward=True),
    case("max/backward-axis1-keepdim", "reduce_max", M4, [X], [[0, -1]],
         {"axis": [1], "keep_dim": True}, [[0, -1]], [[0, -1]], backward=True),
    case("max/backward-all", "reduce_max", M4, [X], [[]], {"axis": [0, 1], "keep_dim": False},
         [[-1, -1]], [[]], backward=True),

    # ----------------------------------------------------------- softmax
    case("softmax/batch-I", "softmax", M24, [((8, 16, 48), F)], [[1, -1, -1]], {"axis": -1},
         [[1, -1, -1]], [[1, -1, -1]]),
    case("softmax/batch-II", "softmax", M24, [((8, 16, 48), F)], [[-1, 1, -1]], {"axis": -1},
         [[-1, 1, -1]], [[-1, 1, -1]]),
    case("softmax/softmax-axis", "softmax", M24, [((8, 16, 48), F)], [[1, -1, 0]], {"axis": -1},
         [[1, -1, -1]], [[1, -1, -1]]),
    case("softmax/axis1", "softmax", M24, [((8, 16, 48), F)], [[-1, 1, 0]], {"axis": 1},
         [[-1, -1, 0]], [[-1, -1, 0]]),
    case("softmax/axis-2", "softmax", M24, [((8, 16, 48), F)], [[-1, 1, 0]], {"axis": -2},
         [[-1, -1, 0]], [[-1, -1, 0]]),
    case("softmax/backward-batch-I", "softmax", M24, [((8, 16, 48), F)], [[1, -1, -1]],
         {"axis": -1}, [[1, -1, -1]], [[1, -1, -1]], backward=True),
    case("softmax/backward-softmax-axis", "softmax", M24, [((8, 16, 48), F)], [[1, -1, 0]],
         {"axis": -1}, [[1, -1, -1]], [[1, -1, -1]], backward=True),
    case("softmax/backward-axis1", "softmax", M24, [((8, 16, 48), F)], [[-1, 1, 0]],
         {"axis": 1}, [[-1, -1, 0]], [[-1, -1, 0]], backward=True),
    case("log_softmax/axis-2", "log_softmax", M24, [((8, 16, 48), F)], [[-1, 1, 0]],
         {"axis": -2}, [[-1, -1, 0]], [[-1, -1, 0]],
         note="Paddle's test builds the log_softmax rule beside softmax; same semantics"),

    # -------------------------------------------------------- layer_norm
    # Paddle's layer_norm also returns mean and variance ([1, -1] etc.);
    # ernie's has one result, compared here.
    case("layer_norm/[1,-1,-1]", "layer_norm", M23,
         [((64, 32, 1024), F), ((1024,), F), ((1024,), F)], [[1, -1, -1], [-1], [-1]],
         {"epsilon": 1e-3, "begin_norm_axis": 2}, [[1, -1, -1], [-1], [-1]], [[1, -1, -1]]),
    case("layer_norm/[1,0,-1],scale[0]", "layer_norm", M23,
         [((64, 32, 1024), F), ((1024,), F), ((1024,), F)], [[1, 0, -1], [0], [0]],
         {"epsilon": 1e-3, "begin_norm_axis": 2}, [[1, 0, -1], [-1], [-1]], [[1, 0, -1]]),
    case("layer_norm/backward-[1,-1,-1]", "layer_norm", M23,
         [((64, 32, 1024), F), ((1024,), F), ((1024,), F)], [[1, -1, -1]],
         {"epsilon": 1e-3, "begin_norm_axis": 2}, [[1, -1, -1], [-1], [-1]], [[1, -1, -1]],
         backward=True),
    case("layer_norm/backward-[-1,1,-1]", "layer_norm", M23,
         [((64, 32, 1024), F), ((1024,), F), ((1024,), F)], [[-1, 1, -1]],
         {"epsilon": 1e-3, "begin_norm_axis": 2}, [[-1, 1, -1], [-1], [-1]], [[-1, 1, -1]],
         backward=True),
    case("layer_norm/begin_norm_axis-1", "layer_norm", M23,
         [((64, 32, 1024), F), ((32 * 1024,), F), ((32 * 1024,), F)], [[0, -1, -1], [-1], [1]],
         {"epsilon": 1e-3, "begin_norm_axis": 1}, [[0, -1, -1], [-1], [-1]], [[0, -1, -1]],
         differs=("ValueError", None, None,
                  "ernie's layer_norm normalises the last dimension only (Paddle's "
                  "begin_norm_axis < rank - 1 is a reshape to [.., prod] before it)")),

    # rms_norm: Paddle's C++ rule test (test/cpp/auto_parallel,
    # FusedRmsNormSPMDRule); Paddle's op also returns the inverse variance.
    case("rms_norm/[1,-1,-1]", "rms_norm", M23, [((64, 32, 1024), F), ((1024,), F)],
         [[1, -1, -1], [-1]], {"epsilon": 0.5}, [[1, -1, -1], [-1]], [[1, -1, -1]]),
    case("rms_norm/[1,0,-1],scale[0]", "rms_norm", M23, [((64, 32, 1024), F), ((1024,), F)],
         [[1, 0, -1], [0]], {"epsilon": 0.5}, [[1, 0, -1], [-1]], [[1, 0, -1]]),
    case("rms_norm/backward", "rms_norm", M23, [((64, 32, 1024), F), ((1024,), F)],
         [[0, 1, -1]], {"epsilon": 0.5}, [[0, 1, -1], [-1]], [[0, 1, -1]], backward=True),

    # --------------------------------------------------------- embedding
    case("embedding/dp", "embedding", M24, [((4, 1024), I), ((512, 768), F)], [[1, -1], [-1, -1]],
         {"padding_idx": -1, "sparse": False}, [[1, -1], [-1, -1]], [[1, -1, -1]]),
    case("embedding/col-parallel", "embedding", M24, [((4, 1024), I), ((512, 768), F)],
         [[1, -1], [-1, 0]], {"padding_idx": -1, "sparse": False},
         [[1, -1], [-1, 0]], [[1, -1, 0]]),
    case("embedding/vocab-parallel", "embedding", M24, [((4, 1024), I), ((512, 768), F)],
         [[1, -1], [0, -1]], {"padding_idx": -1, "sparse": False},
         [[1, -1], [0, -1]], [[1, -1, -1]], partial=[0]),
    case("embedding/vocab-parallel+padding_idx", "embedding", M24,
         [((4, 1024), I), ((512, 768), F)], [[1, -1], [0, -1]],
         {"padding_idx": 128, "sparse": False}, "ValueError", None,
         differs=([[1, -1], [0, -1]], [[1, -1, -1]], [0],
                  "ernie's padding_idx only stops the row's gradient; a vocabulary "
                  "split stays correct, so ernie keeps it")),
    case("embedding/vocab-parallel+sparse", "embedding", M24,
         [((4, 1024), I), ((512, 768), F)], [[1, -1], [0, -1]],
         {"padding_idx": -1, "sparse": True}, "ValueError", None,
         differs=([[1, -1], [0, -1]], [[1, -1, -1]], [0],
                  "ernie has no sparse gradients: `sparse` is accepted and has no effect")),
    case("embedding/backward-dp", "embedding", M24, [((4, 1024), I), ((512, 768), F)],
         [[1, -1, -1]], {"padding_idx": -1, "sparse": False},
         [[1, -1], [-1, -1]], [[1, -1, -1]], backward=True),
    case("embedding/backward-col", "embedding", M24, [((4, 1024), I), ((512, 768), F)],
         [[-1, 0, 1]], {"padding_idx": -1, "sparse": False},
         [[-1, 0], [-1, 1]], [[-1, 0, 1]], backward=True),
    case("embedding/backward-two-batch-axes", "embedding", M24, [((4, 1024), I), ((512, 768), F)],
         [[1, 0, -1]], {"padding_idx": -1, "sparse": False},
         [[1, 0], [-1, -1]], [[1, 0, -1]], backward=True),

    # --------------------------------------------------------- transpose
    case("transpose/[1,0]", "transpose", M4, [((64, 36), F)], [[0, -1]], {"perm": [1, 0]},
         [[0, -1]], [[-1, 0]]),
    case("transpose/identity", "transpose", M4, [((64, 36), F)], [[0, -1]], {"perm": [0, 1]},
         [[0, -1]], [[0, -1]]),
    case("transpose/4d", "transpose", M4, [((64, 48, 36, 24), F)], [[-1, -1, 0, -1]],
         {"perm": [0, 2, 3, 1]}, [[-1, -1, 0, -1]], [[-1, 0, -1, -1]]),
    case("transpose/2d-mesh", "transpose", M23, [((64, 48, 36, 24), F)], [[-1, 0, 1, -1]],
         {"perm": [0, 2, 3, 1]}, [[-1, 0, 1, -1]], [[-1, 1, -1, 0]]),
    case("transpose/negative-perm", "transpose", M23, [((64, 48, 36, 24), F)], [[-1, -1, 0, 1]],
         {"perm": [-1, 0, -2, 1]}, [[-1, -1, 0, 1]], [[1, -1, 0, -1]]),
    case("transpose/backward", "transpose", M4, [((64, 36), F)], [[-1, 0]], {"perm": [1, 0]},
         [[0, -1]], [[-1, 0]], backward=True),
    case("transpose/backward-4d", "transpose", M4, [((64, 48, 36, 24), F)], [[-1, 0, -1, -1]],
         {"perm": [0, 2, 3, 1]}, [[-1, -1, 0, -1]], [[-1, 0, -1, -1]], backward=True),
    case("transpose/backward-negative-perm", "transpose", M23, [((64, 48, 36, 24), F)],
         [[1, -1, 0, -1]], {"perm": [-1, 0, -2, 1]}, [[-1, -1, 0, 1]], [[1, -1, 0, -1]],
         backward=True),

    # ----------------------------------------------------------- reshape
    case("reshape/[0,-1,1,-1]", "reshape", M23, [((6, 12, 48, 24), F)], [[0, -1, 1, -1]],
         {"shape": [1, 72, 48, 4, 6]}, [[0, -1, 1, -1]], [[-1, 0, 1, -1, -1]]),
    case("reshape/[-1,0,-1,1]", "reshape", M23, [((6, 12, 48, 24), F)], [[-1, 0, -1, 1]],
         {"shape": [1, 72, 48, 4, 6]}, [[-1, -1, -1, -1]], [[-1, -1, -1, -1, -1]]),
    case("reshape/[1,-1,-1,0]", "reshape", M23, [((6, 12, 48, 24), F)], [[1, -1, -1, 0]],
         {"shape": [1, 72, 48, 4, 6]}, [[1, -1, -1, 0]], [[-1, 1, -1, 0, -1]]),
    case("reshape/misaligned", "reshape", M23, [((6, 12, 48, 24), F)], [[0, 1, -1, -1]],
         {"shape": [3, 24, 6, 8, 24]}, [[-1, -1, -1, -1]], [[-1, -1, -1, -1, -1]]),
    case("reshape/[1,-1,-1,0]-to-3x24", "reshape", M23, [((6, 12, 48, 24), F)], [[1, -1, -1, 0]],
         {"shape": [3, 24, 6, 8, 24]}, [[1, -1, -1, 0]], [[1, -1, -1, -1, 0]]),
    case("reshape/minus-one", "reshape", M23, [((6, 12, 48, 24), F)], [[-1, -1, 0, 1]],
         {"shape": [3, 24, 6, -1, 24]}, [[-1, -1, 0, 1]], [[-1, -1, 0, -1, 1]]),
    case("reshape/zero-copies", "reshape", M23, [((6, 12, 48, 24), F)], [[1, -1, -1, 0]],
         {"shape": [1, 72, 0, 4, 6]}, [[1, -1, -1, 0]], [[-1, 1, -1, 0, -1]]),
    case("reshape/identity", "reshape", M23, [((6, 12, 48, 24), F)], [[-1, -1, 0, 1]],
         {"shape": [6, 12, 48, 24]}, [[-1, -1, 0, 1]], [[-1, -1, 0, 1]]),
    case("reshape/merge-split", "reshape", M23, [((6, 12, 48, 24), F)], [[0, -1, 1, -1]],
         {"shape": [72, 3, 16, 24]}, [[0, -1, 1, -1]], [[0, 1, -1, -1]]),
    case("reshape/merge-minor-dropped", "reshape", M23, [((6, 12, 48, 24), F)], [[1, -1, 0, -1]],
         {"shape": [72, 3, 16, 24]}, [[1, -1, -1, -1]], [[1, -1, -1, -1]]),
    case("reshape/5d-to-4d", "reshape", M23, [((1, 72, 48, 4, 6), F)], [[-1, 1, -1, 0, -1]],
         {"shape": [6, 12, 48, 24]}, [[-1, 1, -1, 0, -1]], [[1, -1, -1, 0]]),
    case("reshape/heads", "reshape", M23, [((8, 1024, 3072), F)], [[0, 1, -1]],
         {"shape": [0, 0, -1, 192]}, [[0, 1, -1]], [[0, 1, -1, -1]]),
    case("reshape/heads-split-hidden", "reshape", M23, [((1, 2048, 12288), F)], [[0, -1, 1]],
         {"shape": [0, 0, 6, 2048]}, [[0, -1, 1]], [[0, -1, 1, -1]],
         differs=([[-1, -1, 1]], [[-1, -1, 1, -1]], None,
                  "a dimension of size 1 cannot be split: ernie's rules give size-1 "
                  "dimensions no factor, Paddle keeps the mapping on them")),
    case("reshape/two-minus-ones", "reshape", M23, [((6, 12, 48, 24), F)], [[-1, -1, 0, 1]],
         {"shape": [3, 24, 6, -1, -1]}, "ValueError", None),
    case("reshape/backward", "reshape", M23, [((6, 12, 48, 24), F)], [[-1, 0, 1, -1, -1]],
         {"shape": [1, 72, 48, 4, 6]}, [[0, -1, 1, -1]], [[-1, 0, 1, -1, -1]], backward=True),
    case("reshape/backward-[-1,1,-1,0,-1]", "reshape", M23, [((6, 12, 48, 24), F)],
         [[-1, 1, -1, 0, -1]], {"shape": [1, 72, 48, 4, 6]}, [[1, -1, -1, 0]],
         [[-1, 1, -1, 0, -1]], backward=True),

    # ------------------------------------------------------------- split
    case("split/num2-axis1", "split", M4, [((64, 32, 48), F)], [[0, -1, -1]], {"num": 2, "axis": 1},
         [[0, -1, -1]], [[0, -1, -1]] * 2),
    case("split/sections", "split", M4, [((64, 32, 48), F)], [[0, -1, -1]],
         {"sections": [15, 16, 17], "axis": 2}, [[0, -1, -1]], [[0, -1, -1]] * 3),
    case("split/sections-split-axis", "split", M4, [((64, 32, 48), F)], [[-1, -1, 0]],
         {"sections": [15, 16, 17], "axis": 2}, [[-1, -1, -1]], [[-1, -1, -1]] * 3),
    case("split/num2-axis-2", "split", M4, [((64, 32, 48), F)], [[0, -1, -1]],
         {"num": 2, "axis": -2}, [[0, -1, -1]], [[0, -1, -1]] * 2),
    case("split/2d-mesh-num3", "split", M23, [((96, 32, 48, 24), F)], [[0, 1, -1, -1]],
         {"num": 3, "axis": -1}, [[0, 1, -1, -1]], [[0, 1, -1, -1]] * 3),
    case("split/2d-mesh-sections-axis0", "split", M23, [((96, 32, 48, 24), F)], [[0, 1, -1, -1]],
         {"sections": [32, 32, 32], "axis": 0}, [[-1, 1, -1, -1]], [[-1, 1, -1, -1]] * 3),
    case("split/backward-num2", "split", M4, [((64, 32, 48), F)], [[0, -1, -1]] * 2,
         {"num": 2, "axis": 1}, [[0, -1, -1]], [[0, -1, -1]] * 2, backward=True),
    case("split/backward-sections", "split", M4, [((64, 32, 48), F)], [[0, -1, -1]] * 3,
         {"sections": [15, 16, 17], "axis": 2}, [[0, -1, -1]], [[0, -1, -1]] * 3, backward=True),
    case("split/backward-split-axis", "split", M4, [((64, 32, 48), F)],
         [[-1, 0, -1], [-1, -1, -1]], {"num": 2, "axis": -2},
         [[-1, -1, -1]], [[-1, -1, -1]] * 2, backward=True),

    # ------------------------------------------------------------ concat
    case("concat/forward", "concat", M22, [((16, 16, 16), F), ((4, 16, 16), F), ((2, 16, 16), F)],
         [[-1, 0, 1], [-1, 1, 0], [-1, -1, 0]], {"axis": 0},
         [[-1, 1, 0]] * 3, [[-1, 1, 0]],
         differs=([[-1, 0, 1]] * 3, [[-1, 0, 1]], None,
                  "another conflict winner: ernie keeps the layout of the largest input "
                  "(16x16x16) and reshards the two small ones, the fewest bytes; Paddle's "
                  "vote picks the layout two inputs share on dim 2")),
    case("concat/backward", "concat", M22, [((16, 16, 16), F), ((4, 16, 16), F), ((2, 16, 16), F)],
         [[-1, 1, 0]], {"axis": 0}, [[-1, 1, 0]] * 3, [[-1, 1, 0]], backward=True),

    # ----------------------------------------------------- cross-entropy
    # Paddle's cross_entropy_with_softmax returns (softmax, loss) with labels
    # and loss [.., 1]; ernie's returns the loss alone, labels without the
    # trailing 1 (reduction="none" is Paddle's per-token loss). The loss's
    # dims_mapping is compared.
    case("cross_entropy/dp", "cross_entropy", M24, [((8, 1024, 50304), F), ((8, 1024), I)],
         [[1, -1, -1], [-1, 0]], {"reduction": "none", "ignore_index": -1, "axis": -1,
                                  "soft_label": False, "use_softmax": True,
                                  "numeric_stable_mode": True},
         [[1, 0, -1], [1, 0]], [[1, 0]]),
    case("cross_entropy/vocab-parallel", "cross_entropy", M24,
         [((8, 1024, 50304), F), ((8, 1024), I)], [[-1, -1, 0], [-1, -1]],
         {"reduction": "none", "ignore_index": -1, "axis": -1},
         [[-1, -1, 0], [-1, -1]], [[-1, -1]],
         differs=([[-1, -1, 0], [-1, -1]], [[-1, -1]], [0],
                  "ernie's per-token loss over a split vocabulary is Partial(sum) on that "
                  "axis (the vocab-parallel loss, summed where it is read); Paddle's kernel "
                  "reduces inside and reports the loss replicated")),
    case("cross_entropy/mp-dp", "cross_entropy", M24, [((8, 1024, 50304), F), ((8, 1024), I)],
         [[-1, -1, 0], [1, -1]], {"reduction": "none", "ignore_index": -1, "axis": -1},
         [[1, -1, 0], [1, -1]], [[1, -1]],
         differs=([[1, -1, 0], [1, -1]], [[1, -1]], [0],
                  "as vocab-parallel: the loss is Partial(sum) over the vocabulary's axis")),
    case("cross_entropy/soft-label", "cross_entropy", M24,
         [((8, 1024, 50304), F), ((8, 1024), I)], [[-1, -1, 0], [1, -1]],
         {"reduction": "none", "soft_label": True}, "ValueError", None),
    case("cross_entropy/axis1", "cross_entropy", M24, [((8, 1024, 50304), F), ((8, 1024), I)],
         [[1, -1, 0], [-1, -1]], {"reduction": "none", "axis": 1},
         [[1, -1, 0], [1, -1, 0]], [[1, -1, 0]],
         differs=("ValueError", None, None,
                  "ernie's cross_entropy takes the class dimension last (axis=-1); "
                  "a transpose first gives Paddle's axis=1")),
    case("cross_entropy/backward-dp", "cross_entropy", M24,
         [((8, 1024, 50304), F), ((8, 1024), I)], [[1, 0]],
         {"reduction": "none", "axis": -1}, [[1, 0, -1], [1, 0]], [[1, 0]], backward=True),
    case("cross_entropy/backward-mp-dp", "cross_entropy", M24,
         [((8, 1024, 50304), F), ((8, 1024), I)], [[1, -1]],
         {"reduction": "none", "axis": -1}, [[1, -1, 0], [1, -1]], [[1, -1]], backward=True,
         differs=([[1, -1, -1], [1, -1]], [[1, -1]], None,
                  "Paddle's backward reads the vocabulary split from the softmax output, "
                  "which ernie's op does not return; from the loss alone the vocabulary "
                  "is unconstrained and ernie leaves it whole")),
]


def mesh_of(spec):
    ids, names = spec
    return dist.ProcessMesh(ids, names)


@pytest.mark.parametrize("op,mesh,inputs,maps,attrs,want_in,want_out,partial,backward,differs", CASES)
def test_paddle_case(op, mesh, inputs, maps, attrs, want_in, want_out, partial, backward, differs):
    if differs is not None:
        # The table records Paddle's answer and ernie's; ernie's is checked.
        assert differs[3], "a difference needs its reason"
        want_in, want_out, partial = differs[0], differs[1], differs[2]
    call = dist.infer_backward if backward else dist.infer_spmd
    if want_in in ("ValueError", "NotImplementedError"):
        with pytest.raises(ValueError, match=f"ernie.{op}"):
            call(op, inputs, maps, mesh_of(mesh), **attrs)
        return
    ins, outs = call(op, inputs, maps, mesh_of(mesh), **attrs)
    assert ins == want_in
    assert [o.dims_mapping for o in outs] == want_out
    if partial is not None:
        assert outs[0].partial_dims == partial
        if op == "reduce_max" and partial:
            assert set(outs[0].partial_types.values()) == {"max"}


def test_every_difference_is_documented():
    """docs/spmd-rules.md names every case where ernie answers otherwise."""
    from conftest import REPO
    doc = (REPO / "docs" / "spmd-rules.md").read_text()
    for param in CASES:
        if param.values[-1] is not None:
            assert f"`{param.id}`" in doc, param.id

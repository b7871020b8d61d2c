"""An independent numpy interpreter of ernie IR, for checking the compiler.

It reads a module in MLIR's generic form (``ernie-opt --mlir-print-op-generic``)
and evaluates functions with numpy, every op written from its definition in
ErnieOps.td, not from the compiler's code. Floats are computed in float64
whatever their declared type (rounding to narrower types is not modelled), so
it is the reference for gradient checks by finite differences and for the
optimizer semantics. It is a test oracle, not a runtime.
"""

import math
import re
from dataclasses import dataclass, field

import numpy as np

# --------------------------------------------------------------------------
# Parsing the generic form.
# --------------------------------------------------------------------------

_TYPE = re.compile(r"tensor<([0-9x]*?)x?([a-zA-Z0-9]+)>")


def parse_type(text):
    """'tensor<4x8xf32>' -> ((4, 8), 'f32'); 'tensor<f32>' -> ((), 'f32')."""
    body = text.strip()[len("tensor<"):-1]
    parts = body.split("x")
    dims = tuple(int(p) for p in parts[:-1] if p.isdigit())
    return dims, parts[-1]


def split_top(text, sep=","):
    """Splits at `sep` outside (), [], {}, <>."""
    out, depth, cur = [], 0, []
    for i, ch in enumerate(text):
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>" and not (ch == ">" and i and text[i - 1] == "-"):
            depth -= 1
        if ch == sep and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


_SHARDING = re.compile(r"#ernie\.sharding<@(\w+), \[(.*?)\](?:, partial = \{(.*)\})?>$")


def parse_sharding(text):
    """'#ernie.sharding<@m, [{dp}, {}], partial = {mp = sum}>' ->
    ([['dp'], []], [('mp', 'sum')])."""
    m = _SHARDING.match(text.strip())
    dims = [[a.strip() for a in d.strip()[1:-1].split(",") if a.strip()]
            for d in split_top(m.group(2))] if m.group(2).strip() else []
    partial = [tuple(x.strip() for x in item.split("=")) for item in split_top(m.group(3))] if m.group(3) else []
    return dims, partial


def parse_value(text):
    text = text.strip()
    if text.startswith("#ernie.sharding<"):
        return parse_sharding(text)
    if text.startswith("[") and text.endswith("]"):
        return [parse_value(v) for v in split_top(text[1:-1])]
    if text.startswith("{") and text.endswith("}"):
        return parse_props(text[1:-1])
    if text.startswith("array<"):
        inner = text[len("array<"):-1]
        if ":" not in inner:
            return []
        return [int(v) for v in inner.split(":", 1)[1].split(",") if v.strip()]
    if text.startswith("#ernie<"):
        return text[len("#ernie<"):-1].split()[-1]
    if text.startswith("dense<"):
        body, ty = text.rsplit(":", 1)
        data = body.strip()[len("dense<"):-1]
        data = data.replace("true", "1").replace("false", "0")
        shape, dtype = parse_type(ty)
        values = np.array(eval(data), dtype=np.float64 if dtype.startswith(("f", "bf")) else np.int64)
        return np.broadcast_to(values, shape).copy() if values.shape != shape else values
    if text.startswith("@"):
        return text[1:]
    if text.startswith('"'):
        return text.strip('"')
    if ":" in text:
        number, ty = (t.strip() for t in text.rsplit(":", 1))
        if number in ("true", "false"):
            return number == "true"
        if number.startswith("0x") and ty.startswith(("f", "bf")):
            bits = int(number, 16)
            return float(np.array([bits], dtype=np.uint32).view(np.float32)[0]) if ty == "f32" else float("nan")
        return int(number) if ty.startswith("i") else float(number)
    if text in ("true", "false"):
        return text == "true"
    return text


def parse_props(text):
    props = {}
    for item in split_top(text):
        if "=" in item:
            key, value = item.split("=", 1)
            props[key.strip()] = parse_value(value)
        else:
            props[item.strip()] = True
    return props


@dataclass
class Op:
    name: str
    results: list
    operands: list
    props: dict
    result_types: list


@dataclass
class Function:
    name: str
    args: list
    arg_types: list
    ops: list = field(default_factory=list)
    arg_attrs: list = field(default_factory=list)
    res_attrs: list = field(default_factory=list)


_OP = re.compile(r'^\s*(?:(%[\w]+)(?::(\d+))?\s*=\s*)?"([\w.]+)"\((.*?)\)\s*(<\{(.*)\}>)?\s*(\{.*\})?\s*:\s*\((.*?)\)\s*->\s*(.*)$')


def parse_module(text, meshes=None):
    functions = {}
    current = None
    for line in text.splitlines():
        if '"ernie.mesh"' in line and meshes is not None:
            props = parse_props(re.search(r"<\{(.*)\}>", line).group(1))
            meshes[props["sym_name"]] = (props["axis_names"], props["axis_sizes"])
            continue
        if '"func.func"' in line:
            props = parse_props(re.search(r"<\{(.*)\}>", line).group(1))
            current = Function(props["sym_name"], [], [],
                               arg_attrs=props.get("arg_attrs", []),
                               res_attrs=props.get("res_attrs", []))
            functions[current.name] = current
            continue
        if line.strip().startswith("^bb0(") and current is not None:
            for arg in split_top(line.strip()[len("^bb0("):-2]):
                name, ty = arg.split(":", 1)
                current.args.append(name.strip())
                current.arg_types.append(parse_type(ty))
            continue
        m = _OP.match(line)
        if not m or current is None:
            continue
        result, count, opname, operands, _, props, _, _, rtypes = m.groups()
        n = int(count) if count else (1 if result else 0)
        results = [result] if n == 1 else [f"{result}#{i}" for i in range(n)]
        rtypes = rtypes.strip()
        if rtypes.startswith("("):
            rtypes = rtypes[1:-1]
        types = [parse_type(t) for t in split_top(rtypes) if t.startswith("tensor")]
        current.ops.append(Op(opname, results,
                              [o.strip() for o in split_top(operands)],
                              parse_props(props) if props else {}, types))
    return functions


# --------------------------------------------------------------------------
# Op semantics.
# --------------------------------------------------------------------------

_erf = np.vectorize(math.erf)


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _rope(x, pos, theta, interleaved):
    d = x.shape[-1]
    half = d // 2
    freq = theta ** (-2.0 * np.arange(half) / d)
    pos = np.asarray(pos, dtype=np.float64)
    if pos.ndim == 1:
        pos = pos[None, :]
    angle = pos[:, :, None, None] * freq  # [B|1, S, 1, half]
    cos, sin = np.cos(angle), np.sin(angle)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = b * cos + a * sin
        return out
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def _attention_probs(q, k, causal, scale, window=None):
    hq, hkv = q.shape[2], k.shape[2]
    group = hq // hkv
    d = q.shape[3]
    scale = scale if scale else 1.0 / math.sqrt(d)
    probs = []
    for h in range(hq):
        s = np.einsum("bsd,btd->bst", q[:, :, h], k[:, :, h // group]) * scale
        if causal:  # keys t <= s, and s - window < t with a sliding window
            seen = np.tril(np.ones(s.shape[1:], bool))
            if window:
                seen &= np.triu(np.ones(s.shape[1:], bool), -(window - 1))
            s = np.where(seen, s, -np.inf)
        probs.append(_softmax(s, -1))
    return probs, group, scale


def _attention(q, k, v, causal, scale, window=None):
    probs, group, _ = _attention_probs(q, k, causal, scale, window)
    return np.stack([np.einsum("bst,btd->bsd", p, v[:, :, h // group])
                     for h, p in enumerate(probs)], axis=2)


def _attention_grad(q, k, v, dout, causal, scale, window=None):
    probs, group, scale = _attention_probs(q, k, causal, scale, window)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for h, p in enumerate(probs):
        kv = h // group
        do = dout[:, :, h]
        dv[:, :, kv] += np.einsum("bst,bsd->btd", p, do)
        dp = np.einsum("bsd,btd->bst", do, v[:, :, kv])
        ds = p * (dp - (dp * p).sum(-1, keepdims=True))
        dq[:, :, h] = np.einsum("bst,btd->bsd", ds, k[:, :, kv]) * scale
        dk[:, :, kv] += np.einsum("bst,bsd->btd", ds, q[:, :, h]) * scale
    return dq, dk, dv


def _cross_entropy_parts(logits, labels, ignore):
    lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    keep = labels != ignore
    safe = np.where(keep, labels, 0)
    picked = np.take_along_axis(logits, safe[..., None], -1)[..., 0]
    return np.where(keep, lse - picked, 0.0), keep, safe


def _cross_entropy(logits, labels, ignore, reduction):
    loss, keep, _ = _cross_entropy_parts(logits, labels, ignore)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return np.array(loss.sum())
    return np.array(loss.sum() / keep.sum())


def _cross_entropy_grad(logits, labels, dloss, ignore, reduction):
    _, keep, safe = _cross_entropy_parts(logits, labels, ignore)
    g = _softmax(logits, -1)
    np.put_along_axis(g, safe[..., None], np.take_along_axis(g, safe[..., None], -1) - 1, -1)
    g = g * keep[..., None]
    if reduction == "none":
        return g * dloss[..., None]
    if reduction == "mean":
        return g * dloss / keep.sum()
    return g * dloss


def _pad(x, low, high, interior):
    shape = [lo + n + max(n - 1, 0) * it + hi for n, lo, hi, it in zip(x.shape, low, high, interior)]
    out = np.zeros(shape, x.dtype)
    idx = tuple(slice(lo, lo + (n - 1) * (it + 1) + 1, it + 1) for n, lo, it in zip(x.shape, low, interior))
    out[idx] = x
    return out


def _index_add(base, indices, updates, axis):
    out = base.copy()
    for ii in np.ndindex(indices.shape):
        src = (slice(None),) * axis + ii
        dst = (slice(None),) * axis + (indices[ii],)
        out[dst] += updates[src]
    return out


def _topk(x, k, axis, largest):
    order = np.argsort(-x if largest else x, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(x, idx, axis), idx.astype(np.int64)


def _gelu(x, approximate):
    if approximate:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def _matmul(a, b, ta, tb):
    if ta:
        a = np.swapaxes(a, -1, -2)
    if tb:
        b = np.swapaxes(b, -1, -2)
    return a @ b


def _reduce(fn, x, axes, keepdim):
    return np.asarray(fn(x, axis=tuple(axes), keepdims=keepdim))


def _norm_weight(w, x):
    return np.asarray(w, dtype=x.dtype)


def round_bf16(x):
    """Rounds to the nearest bfloat16 (ties to even), kept in float64."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32).astype(np.float64)


def _dtype(element):
    if element == "i1":
        return np.bool_
    if element.startswith("i"):
        return np.int64
    return np.float64


def evaluate_op(op, args):
    p = op.props
    n = op.name.split(".", 1)[1]
    rt = op.result_types
    unary = {
        "neg": np.negative, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
        "rsqrt": lambda x: 1 / np.sqrt(x), "tanh": np.tanh,
        "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "silu": lambda x: x / (1 + np.exp(-x)),
        "relu": lambda x: np.maximum(x, 0), "abs": np.abs, "reciprocal": lambda x: 1 / x,
        "erf": _erf, "stop_gradient": lambda x: x,
        # Layout annotations: the global value is unchanged.
        "sharding_constraint": lambda x: x, "reshard": lambda x: x,
    }
    binary = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
              "maximum": np.maximum, "minimum": np.minimum, "pow": np.power}
    if n in unary:
        return [np.asarray(unary[n](args[0]))]
    if n in binary:
        if n == "div" and args[0].dtype == np.int64:
            return [np.asarray(np.trunc(args[0] / args[1]).astype(np.int64))]
        return [np.asarray(binary[n](args[0], args[1]))]
    if n == "gelu":
        return [_gelu(args[0], p.get("approximate", False))]
    if n == "cast":
        out = args[0].astype(_dtype(rt[0][1]))
        if rt[0][1] == "bf16":
            out = round_bf16(out)
        elif rt[0][1] == "f32" and out.dtype == np.float64:
            out = out.astype(np.float32).astype(np.float64)
        return [out]
    if n == "compare":
        fn = [np.equal, np.not_equal, np.less, np.less_equal, np.greater, np.greater_equal][p["direction"]]
        return [fn(args[0], args[1])]
    if n == "select":
        return [np.where(args[0], args[1], args[2])]
    if n == "constant":
        return [np.asarray(p["value"], dtype=_dtype(rt[0][1]))]
    if n == "full":
        return [np.full(rt[0][0], p["value"], dtype=_dtype(rt[0][1]))]
    if n == "iota":
        shape, dim = rt[0][0], p["dimension"]
        view = [1] * len(shape)
        view[dim] = shape[dim]
        return [np.broadcast_to(np.arange(shape[dim]).reshape(view), shape).astype(_dtype(rt[0][1]))]
    if n == "matmul":
        return [_matmul(args[0], args[1], p.get("transpose_a"), p.get("transpose_b"))]
    if n == "reduce_sum":
        return [_reduce(np.sum, args[0], p["axes"], p.get("keepdim", False))]
    if n == "reduce_mean":
        return [_reduce(np.mean, args[0], p["axes"], p.get("keepdim", False))]
    if n == "reduce_max":
        return [_reduce(np.max, args[0], p["axes"], p.get("keepdim", False))]
    if n == "softmax":
        return [_softmax(args[0], p["axis"])]
    if n == "log_softmax":
        x = args[0]
        return [x - x.max(p["axis"], keepdims=True) - np.log(np.exp(x - x.max(p["axis"], keepdims=True)).sum(p["axis"], keepdims=True))]
    if n == "rms_norm":
        x, w = args
        eps = p.get("epsilon", 1e-6)
        return [x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * _norm_weight(w, x)]
    if n == "layer_norm":
        x, w, b = args
        eps = p.get("epsilon", 1e-5)
        c = x - x.mean(-1, keepdims=True)
        return [c / np.sqrt((c * c).mean(-1, keepdims=True) + eps) * w + b]
    if n == "reshape":
        return [args[0].reshape(rt[0][0])]
    if n == "transpose":
        return [np.transpose(args[0], p["perm"])]
    if n == "broadcast":
        x, dims, shape = args[0], p["dims"], rt[0][0]
        view = [1] * len(shape)
        for i, d in enumerate(dims):
            view[d] = x.shape[i]
        return [np.broadcast_to(x.reshape(view), shape).copy()]
    if n == "slice":
        return [args[0][tuple(slice(s, l, st) for s, l, st in zip(p["start"], p["limit"], p["step"]))]]
    if n == "pad":
        return [_pad(args[0], p["low"], p["high"], p["interior"])]
    if n == "concat":
        return [np.concatenate(args, axis=p["axis"])]
    if n == "split":
        cuts = np.cumsum(p["sizes"])[:-1]
        return np.split(args[0], cuts, axis=p["axis"])
    if n == "gather":
        return [np.take(args[0], args[1], axis=p["axis"])]
    if n == "index_add":
        return [_index_add(args[0], args[1], args[2], p["axis"])]
    if n == "embedding":
        return [args[1][args[0]]]
    if n == "topk":
        return list(_topk(args[0], p["k"], p["axis"], p.get("largest", True)))
    if n == "rope":
        return [_rope(args[0], args[1], p.get("theta", 10000.0), p.get("interleaved", False))]
    if n == "attention":
        return [_attention(*args, p.get("causal", False), p.get("scale"), p.get("window"))]
    if n == "attention_grad":
        return list(_attention_grad(*args, p.get("causal", False), p.get("scale"),
                                    p.get("window")))
    if n == "cross_entropy":
        return [_cross_entropy(args[0], args[1], p.get("ignore_index", -100), p.get("reduction", "mean"))]
    if n == "cross_entropy_grad":
        return [_cross_entropy_grad(*args, p.get("ignore_index", -100), p.get("reduction", "mean"))]
    if n == "cross_entropy_and_grad":
        ignore, reduction = p.get("ignore_index", -100), p.get("reduction", "mean")
        return [_cross_entropy(args[0], args[1], ignore, reduction),
                _cross_entropy_grad(*args, ignore, reduction)]
    if n == "sgd_update":
        param, grad, buf, lr = args
        mom, wd = p.get("momentum", 0.0), p.get("weight_decay", 0.0)
        g = grad + wd * param
        nbuf = mom * buf + g
        step = g + mom * nbuf if p.get("nesterov") else nbuf
        return [param - lr * step, nbuf]
    if n == "adamw_update":
        param, grad, m, v, lr, t = args
        b1, b2 = p.get("beta1", 0.9), p.get("beta2", 0.999)
        eps, wd = p.get("epsilon", 1e-8), p.get("weight_decay", 0.01)
        m2 = b1 * m + (1 - b1) * grad
        v2 = b2 * v + (1 - b2) * grad * grad
        mh, vh = m2 / (1 - b1 ** float(t)), v2 / (1 - b2 ** float(t))
        return [param - lr * (mh / (np.sqrt(vh) + eps) + wd * param), m2, v2]
    raise NotImplementedError(op.name)


class Interpreter:
    def __init__(self, module_text):
        self.functions = parse_module(module_text)

    def run(self, name, *inputs):
        fn = self.functions[name]
        env = {a: np.asarray(x) for a, x in zip(fn.args, inputs)}
        for op in fn.ops:
            args = [env[o] for o in op.operands if o]
            if op.name == "func.return":
                return [np.asarray(a) for a in args]
            if op.name == "func.call":
                outs = self.run(op.props["callee"], *args)
            else:
                outs = evaluate_op(op, args)
            for r, v in zip(op.results, outs):
                env[r] = np.asarray(v)
        raise ValueError(f"@{name} has no return")


# --------------------------------------------------------------------------
# Many ranks: a partitioned (SPMD) program run on a simulated mesh.
# --------------------------------------------------------------------------

class Mesh:
    def __init__(self, names, sizes):
        self.names, self.sizes = list(names), list(sizes)
        self.ranks = int(np.prod(self.sizes))

    def coords(self, rank):
        out = {}
        for name, size in reversed(list(zip(self.names, self.sizes))):
            out[name] = rank % size
            rank //= size
        return out

    def rank_of(self, coords):
        rank = 0
        for name, size in zip(self.names, self.sizes):
            rank = rank * size + coords[name]
        return rank

    def index(self, rank, axes):
        """Linear coordinate of `rank` over `axes` (major to minor)."""
        c, i = self.coords(rank), 0
        for a in axes:
            i = i * self.sizes[self.names.index(a)] + c[a]
        return i

    def group(self, rank, axes):
        """The ranks differing from `rank` only along `axes`, in order."""
        sizes = [self.sizes[self.names.index(a)] for a in axes]
        members = []
        for flat in range(int(np.prod(sizes))):
            c = dict(self.coords(rank))
            for a, s in reversed(list(zip(axes, sizes))):
                c[a] = flat % s
                flat //= s
            members.append(self.rank_of(c))
        return members

    def piece(self, value, sharding, rank):
        """`rank`'s block of the global `value` under `sharding`. A pending
        sum is split as the value on the first member of each partial group
        and zeros elsewhere; a pending max/min/avg is the value everywhere."""
        dims, partial = sharding
        if any(kind == "sum" and self.coords(rank)[axis] != 0 for axis, kind in partial):
            value = np.zeros_like(value)
        index = []
        for d, axes in enumerate(dims):
            parts = int(np.prod([self.sizes[self.names.index(a)] for a in axes])) if axes else 1
            size = value.shape[d] // parts
            start = self.index(rank, axes) * size if axes else 0
            index.append(slice(start, start + size))
        return value[tuple(index)]

    def whole(self, pieces, sharding):
        """The global value from every rank's piece (pending sums added)."""
        dims, partial = sharding
        sample = pieces[0]
        shape = [n * (int(np.prod([self.sizes[self.names.index(a)] for a in axes])) if axes else 1)
                 for n, axes in zip(sample.shape, dims)]
        out = np.zeros(shape, dtype=sample.dtype)
        seen = np.zeros(shape, dtype=bool)
        partial_axes = [a for a, _ in partial]
        for rank, piece in enumerate(pieces):
            if any(self.coords(rank)[a] != 0 for a in partial_axes):
                continue
            def complete(r, pending):
                """The value at `r` once `pending` reductions are done."""
                if not pending:
                    return pieces[r]
                (axis, kind), rest = pending[0], pending[1:]
                return _reduce_group([complete(m, rest) for m in self.group(r, [axis])], kind)

            total = complete(rank, list(partial))
            index = []
            for d, axes in enumerate(dims):
                size = sample.shape[d]
                start = self.index(rank, axes) * size if axes else 0
                index.append(slice(start, start + size))
            index = tuple(index)
            if seen[index].any():
                assert np.allclose(out[index], total, equal_nan=True), "replicas disagree"
            out[index] = total
            seen[index] = True
        return out


def _reduce_group(values, kind):
    stacked = np.stack(values)
    return {"sum": stacked.sum(0), "avg": stacked.mean(0),
            "max": stacked.max(0), "min": stacked.min(0)}[kind]


def _block(x, dim, index, n):
    size = x.shape[dim] // n
    sl = [slice(None)] * x.ndim
    sl[dim] = slice(index * size, (index + 1) * size)
    return x[tuple(sl)]


class SpmdSimulator(Interpreter):
    """Runs a partitioned module on every rank of its mesh in lockstep."""

    def __init__(self, module_text):
        meshes = {}
        self.functions = parse_module(module_text, meshes)
        (names, sizes), = meshes.values()
        self.mesh = Mesh(names, sizes)

    def run_ranks(self, name, per_rank_inputs):
        fn = self.functions[name]
        mesh = self.mesh
        envs = [{a: np.asarray(x) for a, x in zip(fn.args, inputs)} for inputs in per_rank_inputs]
        for op in fn.ops:
            args = [[env[o] for o in op.operands if o] for env in envs]
            if op.name == "func.return":
                # One list per result, each over the ranks.
                return [[np.asarray(args[r][i]) for r in range(mesh.ranks)]
                        for i in range(len(args[0]))]
            outs = self._step(op, args)
            for env, values in zip(envs, outs):
                for r, v in zip(op.results, values):
                    env[r] = np.asarray(v)
        raise ValueError(f"@{name} has no return")

    def _step(self, op, args):
        mesh, p = self.mesh, op.props
        kind = op.name.split(".", 1)[1]
        if op.name == "func.call":
            per_rank = self.run_ranks(p["callee"], args)
            return [[per_rank[i][r] for i in range(len(per_rank))] for r in range(mesh.ranks)]
        if kind not in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                        "shard_slice", "partial_init", "axis_index"):
            return [evaluate_op(op, a) for a in args]
        axes = p["axes"]
        outs = []
        for rank in range(mesh.ranks):
            group = mesh.group(rank, axes)
            me, n = mesh.index(rank, axes), len(group)
            inputs = [args[g][0] for g in group] if args[rank] else []
            if kind == "all_reduce":
                outs.append([_reduce_group(inputs, p["kind"])])
            elif kind == "reduce_scatter":
                outs.append([_block(_reduce_group(inputs, p["kind"]), p["dim"], me, n)])
            elif kind == "all_gather":
                outs.append([np.concatenate(inputs, axis=p["dim"])])
            elif kind == "all_to_all":
                outs.append([np.concatenate([_block(x, p["split_dim"], me, n) for x in inputs],
                                            axis=p["concat_dim"])])
            elif kind == "shard_slice":
                outs.append([_block(args[rank][0], p["dim"], me, n)])
            elif kind == "partial_init":
                x = args[rank][0]
                outs.append([x if p["kind"] != "sum" or me == 0 else np.zeros_like(x)])
            else:  # axis_index
                outs.append([np.array(me, dtype=np.int64)])
        return outs

    def run_global(self, name, *inputs):
        """Splits global inputs by the arguments' `ernie.shard_of`, runs every
        rank, and reassembles each result from its `ernie.shard_of`."""
        fn = self.functions[name]
        shardings = [attrs.get("ernie.shard_of") for attrs in fn.arg_attrs]
        per_rank = [[self.mesh.piece(np.asarray(x), s, r) if s else np.asarray(x)
                     for x, s in zip(inputs, shardings)] for r in range(self.mesh.ranks)]
        outs = self.run_ranks(name, per_rank)
        results = []
        for i, ranks in enumerate(outs):
            attrs = fn.res_attrs[i] if i < len(fn.res_attrs) else {}
            s = attrs.get("ernie.shard_of")
            results.append(self.mesh.whole(ranks, s) if s else ranks[0])
        return results

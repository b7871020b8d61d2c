"""Random ernie programs for differential testing of sharding.

`Gen(seed, autodiff, cfg).build()` returns (MLIR text, function name, argument
specs): a few ops drawn from the dialect (elementwise, matmul, reductions,
softmax, reshapes, slices, concat/split, norms, embedding, gather,
cross-entropy) over random shapes, on a random 1-3 axis mesh, with random
argument/result shardings, sharding constraints (Partial ones included) and
reshards. With `autodiff`, some f64 arguments are parameters and the program
ends in a scalar loss. `cfg` tunes the mix (p_constraint, p_reshard,
max_ops, partial_kinds, ...). The same seed gives the same program.
"""
import random

MESHES = [[("a", 2)], [("a", 4)], [("a", 2), ("b", 2)], [("a", 2), ("b", 4)],
          [("a", 2), ("b", 2), ("c", 2)]]

DIMS = [1, 2, 2, 4, 4, 4, 8, 8, 8, 16, 3, 6, 12]
DIMS2 = [2, 4, 4, 8, 8, 8, 16, 16, 4, 2, 1, 6]


def ty(shape, et="f64"):
    return "tensor<" + "".join(f"{d}x" for d in shape) + et + ">"


class Gen:
    def __init__(self, seed, autodiff=False, cfg=None):
        self.r = random.Random(seed)
        self.cfg = cfg or {}
        self.mesh = self.r.choice(MESHES)
        self.axes = dict(self.mesh)
        self.args = []   # dicts: name, shape, et, attrs, bound
        self.lines = []
        self.vals = []   # (name, shape) float values
        self.n = 0
        self.autodiff = autodiff
        self.nparam = 0

    # ---------------------------------------------------------- helpers
    def fresh(self):
        self.n += 1
        return f"%v{self.n}"

    def rshape(self, rank=None):
        r = self.r
        if rank is None:
            rank = r.choice([1, 2, 2, 3, 3, 4])
        while True:
            s = tuple(r.choice(self.cfg.get('dims') and DIMS2 or DIMS) for _ in range(rank))
            n = 1
            for d in s:
                n *= d
            if n <= 1024:
                return s

    def sharding(self, shape, p=0.5, allow_partial=False):
        r = self.r
        free = list(self.axes)
        r.shuffle(free)
        dims = []
        for d in shape:
            chosen = []
            if r.random() < p:
                k = r.choice(self.cfg.get('ks', [1, 1, 1, 2]))
                prod = 1
                for a in list(free):
                    if len(chosen) >= k:
                        break
                    if d % (prod * self.axes[a]) == 0:
                        chosen.append(a)
                        prod *= self.axes[a]
                        free.remove(a)
            dims.append(chosen)
        text = "[" + ", ".join("{" + ", ".join(c) + "}" for c in dims) + "]"
        if allow_partial and free and r.random() < 0.5:
            k = r.randint(1, len(free))
            kinds = self.cfg.get("partial_kinds", ["sum", "sum", "sum", "max", "avg", "min"])
            text += ", partial = {" + ", ".join(f"{a} = {r.choice(kinds)}" for a in free[:k]) + "}"
        return text

    def sattr(self, shape, **kw):
        return f"{{ernie.sharding = #ernie.sharding<@mesh, {self.sharding(shape, **kw)}>}}"

    def new_arg(self, shape, et="f64", bound=None, shard=True):
        name = f"%arg{len(self.args)}"
        attrs = []
        if shard and self.r.random() < 0.8:
            attrs.append(f"ernie.sharding = #ernie.sharding<@mesh, {self.sharding(shape, p=self.cfg.get('p_arg', 0.6))}>")
        if self.autodiff and et == "f64" and self.r.random() < 0.6:
            attrs.append(f'ernie.param = "p{self.nparam}"')
            self.nparam += 1
        self.args.append(dict(name=name, shape=shape, et=et, attrs=attrs, bound=bound))
        if et == "f64":
            self.vals.append((name, shape))
        return name

    def float_val(self, min_rank=0, pred=None):
        cands = [v for v in self.vals if len(v[1]) >= min_rank and (pred is None or pred(v[1]))]
        if cands and self.r.random() < self.cfg.get("p_last", 0.0) and cands[-1] == self.vals[-1]:
            return cands[-1]
        if cands and self.r.random() < 0.85:
            # prefer recent values
            w = [i + 1 for i in range(len(cands))]
            return self.r.choices(cands, weights=w)[0]
        rank = max(min_rank, self.r.choice([1, 2, 2, 3, 3]))
        for _ in range(100):
            s = self.rshape(rank)
            if pred is None or pred(s):
                break
        return self.new_arg(s), s

    def same_shape(self, shape):
        cands = [v for v in self.vals if v[1] == shape]
        if cands and self.r.random() < 0.6:
            return self.r.choice(cands)[0]
        return self.new_arg(shape)

    def emit(self, line, name, shape):
        self.lines.append(line)
        self.vals.append((name, shape))
        if self.r.random() < self.cfg.get("p_constraint", 0.25):
            c = self.fresh()
            prio = self.r.choice(["", "", " {priority = 1}", " {priority = 0}", " {priority = 2}"])
            sh = self.sharding(shape, p=0.5, allow_partial=self.cfg.get("partial", True))
            self.lines.append(f"{c} = ernie.sharding_constraint {name} <@mesh, {sh}>{prio} : {ty(shape)}")
            self.vals.append((c, shape))
        if self.r.random() < self.cfg.get("p_reshard", 0.0):
            c = self.fresh()
            sh = self.sharding(shape, p=0.5, allow_partial=self.cfg.get("reshard_partial", True))
            self.lines.append(f"{c} = ernie.reshard {self.vals[-1][0]} <@mesh, {sh}> : {ty(shape)}")
            self.vals.append((c, shape))

    # ---------------------------------------------------------- ops
    def op_unary(self):
        x, s = self.float_val()
        op = self.r.choice(["exp", "tanh", "neg", "tanh"])
        o = self.fresh()
        self.emit(f"{o} = ernie.{op} {x} : {ty(s)}", o, s)

    def op_binary(self):
        x, s = self.float_val()
        y = self.same_shape(s)
        op = self.r.choice(["add", "mul", "sub", "maximum"])
        o = self.fresh()
        self.emit(f"{o} = ernie.{op} {x}, {y} : {ty(s)}", o, s)

    def op_matmul(self):
        r = self.r
        x, s = self.float_val(min_rank=2)
        ta, tb = r.random() < 0.3, r.random() < 0.3
        batch = s[:-2]
        m, k = (s[-1], s[-2]) if ta else (s[-2], s[-1])
        n = r.choice([2, 4, 8, 6, 16])
        rank2 = not batch or r.random() < 0.5
        rb = (batch if not rank2 else ()) + ((n, k) if tb else (k, n))
        y = self.same_shape(rb)
        attrs = []
        if ta:
            attrs.append("transpose_a")
        if tb:
            attrs.append("transpose_b")
        a = (" {" + ", ".join(attrs) + "}") if attrs else ""
        os = batch + (m, n)
        o = self.fresh()
        self.emit(f"{o} = ernie.matmul {x}, {y}{a} : {ty(s)}, {ty(rb)} -> {ty(os)}", o, os)

    def op_reduce(self):
        r = self.r
        x, s = self.float_val(min_rank=1)
        k = r.randint(1, len(s))
        axes = sorted(r.sample(range(len(s)), k))
        keep = r.random() < 0.4
        os = tuple((1 if i in axes else d) for i, d in enumerate(s)) if keep else \
            tuple(d for i, d in enumerate(s) if i not in axes)
        op = r.choice(["reduce_sum", "reduce_max", "reduce_mean"])
        o = self.fresh()
        kd = " keepdim" if keep else ""
        self.emit(f"{o} = ernie.{op} {x} axes = [{', '.join(map(str, axes))}]{kd} : {ty(s)} -> {ty(os)}", o, os)

    def op_softmax(self):
        x, s = self.float_val(min_rank=1)
        ax = self.r.randrange(len(s))
        o = self.fresh()
        self.emit(f"{o} = ernie.softmax {x}, axis = {ax} : {ty(s)}", o, s)

    def op_transpose(self):
        x, s = self.float_val(min_rank=2)
        perm = list(range(len(s)))
        while perm == list(range(len(s))):
            self.r.shuffle(perm)
        os = tuple(s[p] for p in perm)
        o = self.fresh()
        self.emit(f"{o} = ernie.transpose {x}, perm = [{', '.join(map(str, perm))}] : {ty(s)} -> {ty(os)}", o, os)

    def op_reshape(self):
        r = self.r
        x, s = self.float_val(min_rank=1)
        s = tuple(s)
        mode = r.choice(self.cfg.get("reshape_modes", ["split", "merge", "both", "unit", "refactor"]))
        if mode == "refactor":
            n = 1
            for d in s:
                n *= d
            os = []
            while n > 1 and len(os) < 4:
                fs = [f for f in range(2, n + 1) if n % f == 0]
                f = r.choice(fs)
                if r.random() < 0.3:
                    f = n
                os.append(f)
                n //= f
                if r.random() < 0.1:
                    os.append(1)
            if n > 1:
                os.append(n)
            if not os:
                os = [1]
        else:
            os = list(s)
        if mode in ("split", "both"):
            i = r.randrange(len(os))
            d = os[i]
            fs = [f for f in range(2, d) if d % f == 0]
            if fs:
                f = r.choice(fs)
                os[i:i + 1] = [f, d // f]
        if mode in ("merge", "both") and len(os) >= 2:
            i = r.randrange(len(os) - 1)
            os[i:i + 2] = [os[i] * os[i + 1]]
        if mode == "unit":
            i = r.randrange(len(os) + 1)
            os.insert(i, 1)
        os = tuple(os)
        if os == s:
            return
        o = self.fresh()
        self.emit(f"{o} = ernie.reshape {x} : {ty(s)} -> {ty(os)}", o, os)

    def op_broadcast(self):
        r = self.r
        x, s = self.float_val(pred=lambda sh: len(sh) <= 3)
        os = list(s)
        dims = list(range(len(s)))
        # expand size-1 dims
        for i, d in enumerate(s):
            if d == 1 and r.random() < 0.7:
                os[i] = r.choice([2, 4, 8])
        if r.random() < 0.8 or os == list(s):
            pos = r.randint(0, len(os))
            os.insert(pos, r.choice([2, 4, 8, 3]))
            dims = [d if d < pos else d + 1 for d in dims]
        os = tuple(os)
        o = self.fresh()
        self.emit(f"{o} = ernie.broadcast {x}, dims = [{', '.join(map(str, dims))}] : {ty(s)} -> {ty(os)}", o, os)

    def op_slice(self):
        r = self.r
        x, s = self.float_val(min_rank=1)
        parts, os = [], []
        for d in s:
            if r.random() < 0.5 or d == 1:
                st, li, step = 0, d, 1
            else:
                st = r.randrange(d)
                li = r.randint(st + 1, d)
                step = r.choice([1, 1, 2, 3])
            parts.append(f"{st}:{li}" + (f":{step}" if step != 1 else ""))
            os.append(-(-(li - st) // step))
        os = tuple(os)
        o = self.fresh()
        self.emit(f"{o} = ernie.slice {x} [{', '.join(parts)}] : {ty(s)} -> {ty(os)}", o, os)

    def op_concat(self):
        r = self.r
        x, s = self.float_val(min_rank=1)
        ax = r.randrange(len(s))
        ins, tys = [x], [s]
        for _ in range(r.choice([1, 1, 2])):
            s2 = list(s)
            s2[ax] = r.choice([s[ax], 2, 4, 1, 6])
            s2 = tuple(s2)
            ins.append(self.same_shape(s2))
            tys.append(s2)
        os = list(s)
        os[ax] = sum(t[ax] for t in tys)
        os = tuple(os)
        o = self.fresh()
        self.emit(f"{o} = ernie.concat {', '.join(ins)} axis = {ax} : {', '.join(ty(t) for t in tys)} -> {ty(os)}", o, os)

    def op_split(self):
        r = self.r
        x, s = self.float_val(min_rank=1, pred=lambda sh: any(d >= 2 for d in sh))
        axs = [i for i, d in enumerate(s) if d >= 2]
        if not axs:
            return
        ax = r.choice(axs)
        d = s[ax]
        if r.random() < 0.5 and d % 2 == 0:
            sizes = [d // 2, d // 2]
        else:
            c = sorted(r.sample(range(1, d), min(d - 1, r.choice([1, 2]))))
            sizes = [b - a for a, b in zip([0] + c, c + [d])]
        outs = [self.fresh() for _ in sizes]
        oss = []
        for sz in sizes:
            t = list(s)
            t[ax] = sz
            oss.append(tuple(t))
        base = self.fresh()
        self.lines.append(f"{base}:{len(sizes)} = ernie.split {x} axis = {ax}, sizes = [{', '.join(map(str, sizes))}] : {ty(s)} -> {', '.join(ty(t) for t in oss)}")
        for i, t in enumerate(oss):
            self.vals.append((f"{base}#{i}", t))
        i = r.randrange(len(oss))
        # maybe constrain one piece
        if r.random() < self.cfg.get("p_constraint", 0.25):
            c = self.fresh()
            self.lines.append(f"{c} = ernie.sharding_constraint {base}#{i} <@mesh, {self.sharding(oss[i])}> : {ty(oss[i])}")
            self.vals.append((c, oss[i]))

    def op_rms_norm(self):
        x, s = self.float_val(min_rank=1)
        w = self.same_shape((s[-1],))
        o = self.fresh()
        self.emit(f"{o} = ernie.rms_norm {x}, {w}, epsilon = 1.0e-6 : {ty(s)}, {ty((s[-1],))}", o, s)

    def int_arg(self, shape, bound):
        return self.new_arg(shape, et="i64", bound=bound)

    def op_embedding(self):
        r = self.r
        V = r.choice([4, 8, 16, 6])
        D = r.choice([2, 4, 8])
        ids_shape = self.rshape(r.choice([1, 2]))
        ids = self.int_arg(ids_shape, V)
        tbl = self.same_shape((V, D))
        os = ids_shape + (D,)
        o = self.fresh()
        pad = f" {{padding_idx = {r.randrange(V)} : i64}}" if r.random() < 0.2 else ""
        self.emit(f"{o} = ernie.embedding {ids}, {tbl}{pad} : {ty(ids_shape, 'i64')}, {ty((V, D))} -> {ty(os)}", o, os)

    def op_gather(self):
        r = self.r
        x, s = self.float_val(min_rank=1)
        ax = r.randrange(len(s))
        ishape = self.rshape(r.choice([1, 1, 2]))
        idx = self.int_arg(ishape, s[ax])
        os = s[:ax] + ishape + s[ax + 1:]
        if len(os) > 5:
            return
        o = self.fresh()
        self.emit(f"{o} = ernie.gather {x}[{idx}] axis = {ax} : {ty(s)}, {ty(ishape, 'i64')} -> {ty(os)}", o, os)

    def op_cross_entropy(self, reduction=None):
        r = self.r
        x, s = self.float_val(min_rank=1, pred=lambda sh: sh[-1] >= 2)
        C = s[-1]
        ls = s[:-1]
        lab = self.int_arg(ls, C)
        red = reduction or r.choice(["none", "sum", "mean"])
        attrs = []
        if r.random() < 0.4:
            attrs.append(f"ignore_index = {r.randrange(C)} : i64")
        if red != "mean" or r.random() < 0.5:
            attrs.append(f"reduction = #ernie<loss_reduction {red}>")
        a = (" {" + ", ".join(attrs) + "}") if attrs else ""
        os = ls if red == "none" else ()
        o = self.fresh()
        self.emit(f"{o} = ernie.cross_entropy {x}, {lab}{a} : {ty(s)}, {ty(ls, 'i64')} -> {ty(os)}", o, os)
        return o, os

    OPS = ["unary", "binary", "matmul", "matmul", "reduce", "softmax", "transpose", "reshape",
           "reshape", "broadcast", "slice", "concat", "split", "rms_norm", "embedding", "gather",
           "cross_entropy"]

    def build(self):
        r = self.r
        nops = r.randint(self.cfg.get("min_ops", 1), self.cfg.get("max_ops", 6))
        ops = self.cfg.get("ops", self.OPS)
        for _ in range(nops):
            getattr(self, "op_" + r.choice(ops))()
        if not self.vals:
            self.op_unary()
        if self.autodiff:
            name, s = self.vals[-1]
            if s != ():
                o = self.fresh()
                self.lines.append(f"{o} = ernie.reduce_sum {name} axes = [{', '.join(map(str, range(len(s))))}] : {ty(s)} -> tensor<f64>")
                name = o
            if self.nparam == 0:
                # ensure a param
                for a in self.args:
                    if a["et"] == "f64":
                        a["attrs"].append(f'ernie.param = "p{self.nparam}"')
                        self.nparam += 1
                        break
            rets = [(name, ())]
            res_attrs = [""]
        else:
            rets = [self.vals[-1]]
            if len(self.vals) > 1 and r.random() < 0.3:
                rets.append(r.choice(self.vals[:-1]))
            res_attrs = []
            for _, s in rets:
                res_attrs.append(" " + self.sattr(s, p=0.5) if r.random() < 0.4 else "")
        mesh = ", ".join(f"{a} = {n}" for a, n in self.mesh)
        fname = "forward" if self.autodiff else "f"
        args = []
        for a in self.args:
            at = (" {" + ", ".join(a["attrs"]) + "}") if a["attrs"] else ""
            args.append(f"{a['name']}: {ty(a['shape'], a['et'])}{at}")
        res = ", ".join(f"{ty(s)}{ra}" for (_, s), ra in zip(rets, res_attrs))
        body = "\n".join("  " + l for l in self.lines)
        ret = f"  return {', '.join(n for n, _ in rets)} : {', '.join(ty(s) for _, s in rets)}"
        text = (f"ernie.mesh @mesh({mesh})\n"
                f"func.func @{fname}({', '.join(args)}) -> ({res}) {{\n{body}\n{ret}\n}}\n")
        return text, fname, [(a["shape"], a["et"], a["bound"]) for a in self.args]

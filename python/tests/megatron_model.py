"""A transformer with separate q/k/v projections and Megatron's
tensor- and sequence-parallel plans (Korthikanti et al.), for the tests that
check ernie's plans against the published communication and memory."""

import ernie
import ernie.distributed as dist


class MegatronBlock(ernie.nn.Module):
    """A transformer layer with separate q/k/v projections, as Megatron's
    tensor-parallel layer: attention and MLP each one column-parallel and one
    row-parallel matmul."""

    def __init__(self, h, heads):
        super().__init__()
        self.norm1, self.norm2 = ernie.nn.RMSNorm(h), ernie.nn.RMSNorm(h)
        self.attn = ernie.nn.Module()
        self.attn.q = ernie.nn.Linear(h, h, bias=False)
        self.attn.k = ernie.nn.Linear(h, h, bias=False)
        self.attn.v = ernie.nn.Linear(h, h, bias=False)
        self.attn.o = ernie.nn.Linear(h, h, bias=False)
        self.attn.forward = self._attention
        self.mlp = ernie.nn.Module()
        self.mlp.up = ernie.nn.Linear(h, 4 * h, bias=False)
        self.mlp.down = ernie.nn.Linear(4 * h, h, bias=False)
        self.mlp.forward = lambda x: self.mlp.down(ernie.functional.gelu(self.mlp.up(x)))
        self.heads = heads

    def _attention(self, x):
        b, s, h = x.shape
        shape = (b, s, self.heads, h // self.heads)
        q, k, v = (p(x).reshape(shape) for p in (self.attn.q, self.attn.k, self.attn.v))
        return self.attn.o(ernie.functional.attention(q, k, v, causal=True).reshape(b, s, h))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class MegatronModel(ernie.nn.Module):
    def __init__(self, vocab, h, heads, layers):
        super().__init__()
        self.embed = ernie.nn.Embedding(vocab, h)
        self.layers = ernie.nn.LayerList(MegatronBlock(h, heads) for _ in range(layers))
        self.norm = ernie.nn.RMSNorm(h)
        self.head = ernie.nn.Linear(h, vocab, bias=False)

    def forward(self, ids, labels):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return ernie.functional.cross_entropy(self.head(self.norm(x)), labels)


MEGATRON_TP = {"layers.*.attn.[qkv]": dist.ColWiseParallel(), "layers.*.attn.o": dist.RowWiseParallel(),
               "layers.*.mlp.up": dist.ColWiseParallel(), "layers.*.mlp.down": dist.RowWiseParallel()}
MEGATRON_SP = dict(MEGATRON_TP, **{"embed": dist.SequenceParallelBegin(),
                                  "layers.*.norm[12]": dist.SequenceParallelEnable(),
                                  "layers.*.attn": dist.SequenceParallelDisable(),
                                  "layers.*.mlp": dist.SequenceParallelDisable(),
                                  "norm": dist.SequenceParallelEnd()})

"""The transformer layer of Korthikanti et al. (2022), "Reducing Activation
Recomputation in Large Transformer Models", §4: LayerNorm, q/k/v
projections, attention written out (scores = q k^T / sqrt(d) plus a causal
mask, softmax, probabilities x v — the "core attention" their selective
recomputation targets), the output projection, LayerNorm, a 4h GeLU MLP;
every linear layer with a bias. No dropout: ernie has none, so the
formulas' dropout terms are left out where the tests compare."""

import numpy as np

import ernie
import ernie.functional as F


class GPTBlock(ernie.nn.Module):
    def __init__(self, h, heads, dtype):
        super().__init__()
        self.ln1, self.ln2 = ernie.nn.LayerNorm(h, dtype=dtype), ernie.nn.LayerNorm(h, dtype=dtype)
        self.q, self.k, self.v, self.o = (ernie.nn.Linear(h, h, dtype=dtype) for _ in range(4))
        self.fc1, self.fc2 = ernie.nn.Linear(h, 4 * h, dtype=dtype), ernie.nn.Linear(4 * h, h, dtype=dtype)
        self.heads = heads

    def attention(self, x, mask):
        b, s, h = x.shape
        d = h // self.heads
        q, k, v = (p(x).reshape((b, s, self.heads, d)).transpose((0, 2, 1, 3))
                   for p in (self.q, self.k, self.v))
        scores = F.matmul(q, k, transpose_b=True) * (1.0 / np.sqrt(d)) + mask
        out = F.matmul(F.softmax(scores, axis=-1), v)
        return self.o(out.transpose((0, 2, 1, 3)).reshape((b, s, h)))

    def forward(self, x, mask):
        x = x + self.attention(self.ln1(x), mask)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPTModel(ernie.nn.Module):
    def __init__(self, vocab, h, heads, layers, dtype="f32"):
        super().__init__()
        self.embed = ernie.nn.Embedding(vocab, h, dtype=dtype)
        self.layers = ernie.nn.LayerList(GPTBlock(h, heads, dtype) for _ in range(layers))
        self.ln = ernie.nn.LayerNorm(h, dtype=dtype)
        self.head = ernie.nn.Linear(h, vocab, bias=False, dtype=dtype)
        self.heads = heads

    def forward(self, ids, labels):
        x = self.embed(ids)
        b, s, _ = x.shape
        causal = np.triu(np.full((s, s), -1e4, np.float32), 1)  # one additive mask, shared
        mask = F.broadcast_to(F.cast(F.constant(causal), x.dtype), (b, self.heads, s, s))
        for layer in self.layers:
            x = layer(x, mask)
        logits = F.cast(self.head(self.ln(x)), "f32")
        return F.cross_entropy(logits, labels)

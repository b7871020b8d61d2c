"""The training step against optimizers written out in numpy.

`--ernie-autodiff=optimizer=...` builds @train_step; the reference
interpreter runs it for 10 steps, feeding back parameters and state. The
expected trajectory applies the textbook update (PyTorch's SGD with momentum
and weight decay, Loshchilov & Hutter's AdamW) to the gradients the compiled
@forward_grad returns, in f64: they agree to 1e-9 relative.
"""

import numpy as np
import pytest

from test_gradients import compile_grad

MODEL = """
func.func @forward(%x: tensor<6x4xf64>, %y: tensor<6xi64>,
                   %w: tensor<4x3xf64> {ernie.param = "w"}, %b: tensor<3xf64> {ernie.param = "b"}) -> tensor<f64> {
  %h = ernie.matmul %x, %w : tensor<6x4xf64>, tensor<4x3xf64> -> tensor<6x3xf64>
  %bb = ernie.broadcast %b, dims = [1] : tensor<3xf64> -> tensor<6x3xf64>
  %z = ernie.add %h, %bb : tensor<6x3xf64>
  %l = ernie.cross_entropy %z, %y : tensor<6x3xf64>, tensor<6xi64> -> tensor<f64>
  return %l : tensor<f64>
}
"""

rng = np.random.default_rng(1)
X = rng.normal(size=(6, 4))
Y = rng.integers(0, 3, size=6)
W0, B0 = rng.normal(size=(4, 3)), rng.normal(size=3)
LR = 0.1


def test_sgd_momentum_weight_decay(ernie_opt):
    interp = compile_grad(ernie_opt, MODEL, ["--ernie-autodiff=optimizer=sgd momentum=0.9 weight-decay=0.01"])
    params, state = [W0.copy(), B0.copy()], [np.zeros((4, 3)), np.zeros(3)]
    ref_params, ref_bufs = [W0.copy(), B0.copy()], [np.zeros((4, 3)), np.zeros(3)]
    for step in range(1, 11):
        loss, w, b, bw, bb = interp.run("train_step", *params, *state, X, Y, np.array(LR), np.array(step))
        params, state = [w, b], [bw, bb]
        grads = interp.run("forward_grad", X, Y, *ref_params)[1:]
        for i, g in enumerate(grads):
            g = g + 0.01 * ref_params[i]
            ref_bufs[i] = 0.9 * ref_bufs[i] + g
            ref_params[i] = ref_params[i] - LR * ref_bufs[i]
    for got, want in zip(params, ref_params):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_adamw(ernie_opt):
    b1, b2, eps, wd = 0.9, 0.95, 1e-8, 0.1
    interp = compile_grad(ernie_opt, MODEL, [f"--ernie-autodiff=optimizer=adamw beta2={b2} weight-decay={wd}"])
    params = [W0.copy(), B0.copy()]
    state = [np.zeros((4, 3)), np.zeros((4, 3)), np.zeros(3), np.zeros(3)]
    ref = [W0.copy(), B0.copy()]
    m, v = [np.zeros((4, 3)), np.zeros(3)], [np.zeros((4, 3)), np.zeros(3)]
    losses = []
    for t in range(1, 11):
        outs = interp.run("train_step", *params, *state, X, Y, np.array(LR), np.array(t))
        losses.append(float(outs[0]))
        params, state = outs[1:3], outs[3:]
        grads = interp.run("forward_grad", X, Y, *ref)[1:]
        for i, g in enumerate(grads):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            mh, vh = m[i] / (1 - b1 ** t), v[i] / (1 - b2 ** t)
            ref[i] = ref[i] - LR * (mh / (np.sqrt(vh) + eps) + wd * ref[i])
    for got, want in zip(params, ref):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    assert losses[-1] < losses[0]  # it trains


def test_clipping_bounds_the_update(ernie_opt):
    interp = compile_grad(ernie_opt, MODEL, ["--ernie-autodiff=optimizer=sgd clip-norm=0.01"])
    outs = interp.run("train_step", W0, B0, np.zeros((4, 3)), np.zeros(3), X, Y, np.array(1.0), np.array(1))
    step = np.sqrt(((outs[1] - W0) ** 2).sum() + ((outs[2] - B0) ** 2).sum())
    assert step == pytest.approx(0.01, rel=1e-4)


def test_eval_step_is_the_forward(ernie_opt):
    interp = compile_grad(ernie_opt, MODEL, ["--ernie-autodiff=optimizer=adamw"])
    assert np.allclose(interp.run("eval_step", W0, B0, X, Y)[0], interp.run("forward", X, Y, W0, B0)[0])

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


def test_bf16_parameters_with_f32_master_weights(ernie_opt):
    """multi-precision: the update runs on the f32 master, the bf16
    parameter is the master rounded to bf16, every step."""
    from ernie_reference import round_bf16
    model = MODEL.replace("tensor<4x3xf64> {ernie.param", "tensor<4x3xbf16> {ernie.param").replace(
        "%h = ernie.matmul %x, %w : tensor<6x4xf64>, tensor<4x3xf64>",
        "%wf = ernie.cast %w : tensor<4x3xbf16> -> tensor<4x3xf64>\n  %h = ernie.matmul %x, %wf : tensor<6x4xf64>, tensor<4x3xf64>")
    interp = compile_grad(ernie_opt, model, ["--ernie-autodiff=optimizer=adamw multi-precision=true"])
    w = round_bf16(W0)
    params = [w, B0.copy()]
    # w: f32 master, moments; b (f64) has no master: its moments only.
    state = [W0.astype(np.float32).astype(np.float64), np.zeros((4, 3)), np.zeros((4, 3)), np.zeros(3), np.zeros(3)]
    for t in range(1, 11):
        outs = interp.run("train_step", *params, *state, X, Y, np.array(LR), np.array(t))
        params, state = outs[1:3], outs[3:]
        master = state[0]
        np.testing.assert_array_equal(params[0], round_bf16(master))
        # The master moved further than bf16 could resolve on its own.
        assert not np.array_equal(master, round_bf16(master))


def test_loss_scaling_leaves_gradients_unchanged(ernie_opt):
    plain = compile_grad(ernie_opt, MODEL).run("forward_grad", X, Y, W0, B0)
    scaled = compile_grad(ernie_opt, MODEL, ["--ernie-autodiff=loss-scale=1024"]).run("forward_grad", X, Y, W0, B0)
    for a, b in zip(plain, scaled):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_two_layer_mlp_against_handwritten_backprop(ernie_opt):
    """Gradients of a tanh MLP with a sum-of-squares loss, derived by hand."""
    src = """
func.func @forward(%x: tensor<5x4xf64>, %t: tensor<5x2xf64>,
                   %w1: tensor<4x6xf64> {ernie.param = "w1"}, %w2: tensor<6x2xf64> {ernie.param = "w2"}) -> tensor<f64> {
  %h = ernie.matmul %x, %w1 : tensor<5x4xf64>, tensor<4x6xf64> -> tensor<5x6xf64>
  %a = ernie.tanh %h : tensor<5x6xf64>
  %o = ernie.matmul %a, %w2 : tensor<5x6xf64>, tensor<6x2xf64> -> tensor<5x2xf64>
  %d = ernie.sub %o, %t : tensor<5x2xf64>
  %s = ernie.mul %d, %d : tensor<5x2xf64>
  %l = ernie.reduce_sum %s axes = [0, 1] : tensor<5x2xf64> -> tensor<f64>
  return %l : tensor<f64>
}
"""
    x, t = rng.normal(size=(5, 4)), rng.normal(size=(5, 2))
    w1, w2 = rng.normal(size=(4, 6)), rng.normal(size=(6, 2))
    loss, g1, g2 = compile_grad(ernie_opt, src).run("forward_grad", x, t, w1, w2)
    a = np.tanh(x @ w1)
    d = a @ w2 - t
    do = 2 * d
    want2 = a.T @ do
    want1 = x.T @ ((do @ w2.T) * (1 - a * a))
    assert loss == pytest.approx((d * d).sum(), rel=1e-12)
    np.testing.assert_allclose(g1, want1, rtol=1e-10)
    np.testing.assert_allclose(g2, want2, rtol=1e-10)

"""Optimizers: what `--ernie-autodiff` builds into @train_step.

An optimizer here is a description — its hyperparameters become the
autodiff pass's options and the update runs inside the compiled step. The
learning rate is fed every step, so schedulers are plain Python.
"""

from __future__ import annotations

import math
import numbers


class LRScheduler:
    def __call__(self, step: int) -> float:
        raise NotImplementedError


class WarmupDecay(LRScheduler):
    """Linear warm-up from 0 over `warmup_steps`, then `kind` decay to
    `min_lr` at `total_steps`: "cosine", "linear", or "constant" (the base
    rate after the warm-up). Steps are 1-based."""

    KINDS = ("cosine", "linear", "constant")

    def __init__(self, learning_rate, warmup_steps, total_steps, kind="cosine", min_lr=0.0):
        if kind not in self.KINDS:
            raise ValueError(f"schedule kind {kind!r} is not one of {', '.join(self.KINDS)}")
        if warmup_steps < 0 or total_steps <= 0 or warmup_steps > total_steps:
            raise ValueError("need 0 <= warmup_steps <= total_steps and total_steps > 0")
        if not 0 <= min_lr <= learning_rate:
            raise ValueError(f"min_lr {min_lr} must be in [0, learning rate {learning_rate}]")
        self.kind, self.base, self.min_lr = kind, learning_rate, min_lr
        self.warmup, self.total = warmup_steps, total_steps

    def __call__(self, step):
        if self.warmup and step <= self.warmup:
            return self.base * step / self.warmup
        if self.kind == "constant":
            return self.base
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        if self.kind == "linear":
            return self.base - (self.base - self.min_lr) * progress
        return self.min_lr + 0.5 * (self.base - self.min_lr) * (1 + math.cos(math.pi * progress))


class LinearWarmupCosine(WarmupDecay):
    """Linear warm-up from 0 over `warmup_steps`, then cosine decay to
    `min_lr` at `total_steps` (steps are 1-based): WarmupDecay's cosine."""

    def __init__(self, learning_rate, warmup_steps, total_steps, min_lr=0.0):
        super().__init__(learning_rate, warmup_steps, total_steps, "cosine", min_lr)


def _number(name, value, low=0.0, below=None):
    """`value` as a float: finite, >= low, and < below when given (PyTorch's
    bounds: a learning rate or weight decay of 0 is allowed, NaN never)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < low or (below is not None and v >= below):
        if below is not None:
            bounds = f"in [{low:g}, {below:g})"
        else:
            bounds = "finite" if low == -math.inf else f"finite and >= {low:g}"
        raise ValueError(f"{name} must be {bounds}, got {value!r}")
    return v


class Optimizer:
    name = "none"

    def __init__(self, learning_rate=1e-3, weight_decay=0.0, grad_clip=None,
                 report_grad_norm=False):
        if not callable(learning_rate):
            _number("learning_rate", learning_rate)
        self.learning_rate = learning_rate
        self.weight_decay = _number("weight_decay", weight_decay)
        # None: no clipping; otherwise a positive global-norm bound.
        if grad_clip is not None and _number("grad_clip", grad_clip, low=-math.inf) <= 0:
            raise ValueError(f"grad_clip must be positive (or None for no clipping), got {grad_clip!r}")
        self.grad_clip = grad_clip
        # The step returns the gradients' global norm before clipping
        # (Program.grad_norm), as torch's clip_grad_norm_ does.
        self.report_grad_norm = bool(report_grad_norm)
        self.sharding_level = 0   # ZeRO level (dist.shard_optimizer, dp_config)
        self.sharding_axis = None

    def get_lr(self, step: int) -> float:
        lr = self.learning_rate
        # A scheduler's value is checked each step as a constant one is once.
        return _number("learning_rate", lr(step) if callable(lr) else lr)

    def pass_options(self) -> dict:
        options = {"optimizer": self.name, "weight-decay": self.weight_decay}
        if self.grad_clip:
            options["clip-norm"] = float(self.grad_clip)
        if self.report_grad_norm:
            options["grad-norm"] = True
        return options


class SGD(Optimizer):
    name = "sgd"

    def __init__(self, learning_rate=1e-3, momentum=0.0, weight_decay=0.0, grad_clip=None,
                 report_grad_norm=False):
        super().__init__(learning_rate, weight_decay, grad_clip, report_grad_norm)
        self.momentum = _number("momentum", momentum, below=1.0)

    def pass_options(self):
        return {**super().pass_options(), "momentum": self.momentum}


class AdamW(Optimizer):
    name = "adamw"

    def __init__(self, learning_rate=1e-3, beta1=0.9, beta2=0.999, epsilon=1e-8,
                 weight_decay=0.01, multi_precision=False, grad_clip=None,
                 report_grad_norm=False):
        super().__init__(learning_rate, weight_decay, grad_clip, report_grad_norm)
        self.beta1 = _number("beta1", beta1, below=1.0)
        self.beta2 = _number("beta2", beta2, below=1.0)
        self.epsilon = _number("epsilon", epsilon)
        self.multi_precision = multi_precision

    def pass_options(self):
        return {**super().pass_options(), "beta1": self.beta1, "beta2": self.beta2,
                "epsilon": self.epsilon, "multi-precision": self.multi_precision}

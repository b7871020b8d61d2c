"""Optimizers: what `--ernie-autodiff` builds into @train_step.

An optimizer here is a description — its hyperparameters become the
autodiff pass's options and the update runs inside the compiled step. The
learning rate is fed every step, so schedulers are plain Python.
"""

from __future__ import annotations

import math


class LRScheduler:
    def __call__(self, step: int) -> float:
        raise NotImplementedError


class LinearWarmupCosine(LRScheduler):
    """Linear warm-up from 0 over `warmup_steps`, then cosine decay to
    `min_lr` at `total_steps` (steps are 1-based)."""

    def __init__(self, learning_rate, warmup_steps, total_steps, min_lr=0.0):
        if warmup_steps < 0 or total_steps <= 0 or warmup_steps > total_steps:
            raise ValueError("need 0 <= warmup_steps <= total_steps and total_steps > 0")
        self.base, self.warmup, self.total, self.min_lr = learning_rate, warmup_steps, total_steps, min_lr

    def __call__(self, step):
        if self.warmup and step <= self.warmup:
            return self.base * step / self.warmup
        span = max(1, self.total - self.warmup)
        progress = min(1.0, (step - self.warmup) / span)
        return self.min_lr + 0.5 * (self.base - self.min_lr) * (1 + math.cos(math.pi * progress))


class Optimizer:
    name = "none"

    def __init__(self, learning_rate=1e-3, weight_decay=0.0, grad_clip=None):
        self.learning_rate = learning_rate
        self.weight_decay = weight_decay
        self.grad_clip = grad_clip
        self.sharding_level = 0   # ZeRO level (dist.shard_optimizer, dp_config)
        self.sharding_axis = None

    def get_lr(self, step: int) -> float:
        lr = self.learning_rate
        return float(lr(step) if callable(lr) else lr)

    def pass_options(self) -> dict:
        options = {"optimizer": self.name, "weight-decay": self.weight_decay}
        if self.grad_clip:
            options["clip-norm"] = float(self.grad_clip)
        return options


class SGD(Optimizer):
    name = "sgd"

    def __init__(self, learning_rate=1e-3, momentum=0.0, weight_decay=0.0, grad_clip=None):
        super().__init__(learning_rate, weight_decay, grad_clip)
        self.momentum = momentum

    def pass_options(self):
        return {**super().pass_options(), "momentum": self.momentum}


class AdamW(Optimizer):
    name = "adamw"

    def __init__(self, learning_rate=1e-3, beta1=0.9, beta2=0.999, epsilon=1e-8,
                 weight_decay=0.01, multi_precision=False, grad_clip=None):
        super().__init__(learning_rate, weight_decay, grad_clip)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon
        self.multi_precision = multi_precision

    def pass_options(self):
        return {**super().pass_options(), "beta1": self.beta1, "beta2": self.beta2,
                "epsilon": self.epsilon, "multi-precision": self.multi_precision}

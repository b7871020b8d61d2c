"""Checks shared by the model configs: field kinds and the size a config
implies, both before any layer is built.

A config read from a Hugging Face folder is input like any other: a count
that is not a positive integer, a coefficient that is NaN or infinite, or a
model so large that building it would exhaust the host is refused naming
the field, before the first layer exists.
"""

from __future__ import annotations

import math

# The parameters a config may imply (about 17.6 trillion): far above any
# model ernie trains, far below what a hostile count asks for.
MAX_PARAMETERS = 1 << 44
# Layers a config may list: each is a Python object built eagerly.
MAX_LAYERS = 1 << 14


def check_counts(cfg, names, minimum=1):
    """Each field of `names` is an int (not a bool) >= `minimum`."""
    for name in names:
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{type(cfg).__name__}.{name} must be an integer, got {value!r}")
        if value < minimum:
            raise ValueError(f"{type(cfg).__name__}.{name} must be >= {minimum}, got {value}")


def check_finite(cfg, names, minimum=None, positive=False, optional=()):
    """Each field of `names` is a finite real number (>= `minimum`, > 0 with
    `positive`); those in `optional` may be None."""
    for name in names:
        value = getattr(cfg, name)
        if value is None and name in optional:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{type(cfg).__name__}.{name} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"{type(cfg).__name__}.{name} must be finite, got {value!r}")
        if (minimum is not None and value < minimum) or (positive and value <= 0):
            bound = "positive" if positive else f">= {minimum}"
            raise ValueError(f"{type(cfg).__name__}.{name} must be {bound}, got {value!r}")


def check_size(cfg, layers, parameters):
    """Refuses a config of more than MAX_LAYERS layers or MAX_PARAMETERS
    parameters (computed from the config alone)."""
    if layers > MAX_LAYERS:
        raise ValueError(f"{type(cfg).__name__}.num_hidden_layers = {layers} is over the "
                         f"limit of {MAX_LAYERS}")
    if parameters > MAX_PARAMETERS:
        raise ValueError(f"{type(cfg).__name__} implies {parameters:.3e} parameters, over the "
                         f"limit of {MAX_PARAMETERS:.3e} (check hidden_size, "
                         f"intermediate_size, vocab_size and num_hidden_layers)")

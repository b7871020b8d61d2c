"""allclose.py — compares two .npy files within a relative tolerance (lit's
numeric cmp): `allclose.py A B [--rtol R]`; exits 1 naming the largest
difference when they differ, 0 when they agree."""

import argparse
import sys

import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("a")
ap.add_argument("b")
ap.add_argument("--rtol", type=float, default=1e-6)
args = ap.parse_args()
a, b = np.load(args.a).astype(np.float64), np.load(args.b).astype(np.float64)
if a.shape != b.shape:
    sys.exit(f"{args.a} has shape {a.shape}, {args.b} has {b.shape}")
scale = max(np.abs(a).max(initial=0.0), np.abs(b).max(initial=0.0), np.finfo(np.float32).tiny)
err = np.abs(a - b).max(initial=0.0) / scale
if not err <= args.rtol:
    sys.exit(f"{args.a} and {args.b} differ by {err:.3g} of their scale (rtol {args.rtol:g})")

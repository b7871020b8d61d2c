"""Loss tables for scripts/gpu_check.sh: two or more runs' losses.npy (ernie-run
--outputs) side by side, and the largest relative difference of each against
the first. Standard library only (the GPU machine may have no numpy).

    python3 bench/gpu/compare_losses.py BOUND NAME=DIR [NAME=DIR ...]

Exits 1 when a run differs from the first by more than BOUND (relative).
"""
import struct
import sys


def read_npy_f64(path):
    """A 1-D little-endian float64 .npy file (what ernie-run writes)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:6] != b"\x93NUMPY":
        raise SystemExit(f"{path}: not a .npy file")
    major = data[6]
    header_len = struct.unpack("<H" if major == 1 else "<I", data[8:10] if major == 1 else data[8:12])[0]
    start = (10 if major == 1 else 12) + header_len
    header = data[start - header_len:start].decode("latin1")
    if "'<f8'" not in header:
        raise SystemExit(f"{path}: expected float64 losses, header {header.strip()}")
    body = data[start:]
    return list(struct.unpack(f"<{len(body) // 8}d", body))


def main():
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    bound = float(sys.argv[1])
    runs = [arg.split("=", 1) for arg in sys.argv[2:]]
    losses = {name: read_npy_f64(f"{d}/losses.npy") for name, d in runs}
    names = [name for name, _ in runs]
    ref = losses[names[0]]
    print(f"{'step':>5} " + " ".join(f"{n:>16}" for n in names))
    steps = len(ref)
    for i in range(steps):
        if i < 5 or (i + 1) % 10 == 0 or i + 1 == steps:
            print(f"{i + 1:5d} " + " ".join(f"{losses[n][i]:16.8f}" for n in names))
    status = 0
    for n in names[1:]:
        worst = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(losses[n], ref))
        ok = len(losses[n]) == steps and worst <= bound
        print(f"{n} vs {names[0]}: largest relative difference {worst:.3e} "
              f"(bound {bound:g}) {'ok' if ok else 'FAILED'}")
        status |= not ok
    sys.exit(status)


if __name__ == "__main__":
    main()

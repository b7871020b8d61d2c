"""What a training run reports: a line per logged step on the terminal (one
line updated in place on a tty), a JSON line per logged step, TensorBoard
scalars (the `tensorboard` package's own event writer, optional), and a PNG
of the run at the end (matplotlib, optional). Process 0 writes them.

The FLOP count behind MFU is the compiled program's own: every rank's
model FLOPs as the cost model counts the program's ops (2·m·n·k per GEMM,
attention's two GEMMs, elementwise ops one FLOP an element; recomputation
excluded; a MoE layer's expert GEMMs count the slots routing fills),
divided by the step time and by the peak of all ranks (a named cluster's,
or on CPUs the GEMM peak `ernie.cost.calibrate_cpu` measured). HFU counts
everything the program computes, recomputation included.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path


class TensorBoardWriter:
    """Scalars as TensorBoard event files, with tensorboard's own writer."""

    def __init__(self, directory):
        try:
            from tensorboard.compat.proto.event_pb2 import Event
            from tensorboard.compat.proto.summary_pb2 import Summary
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError:
            raise RuntimeError("metrics.tensorboard needs the tensorboard package "
                               "(pip install tensorboard)") from None
        self._event, self._summary = Event, Summary
        self._writer = EventFileWriter(str(directory))

    def scalars(self, step: int, values: dict) -> None:
        summary = self._summary(value=[self._summary.Value(tag=k, simple_value=float(v))
                                       for k, v in values.items()])
        self._writer.add_event(self._event(wall_time=time.time(), step=step, summary=summary))

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()


def _duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Metrics:
    """The run's records; `log` takes one step's values (None where a
    value is not known yet)."""

    # What JSONL and TensorBoard carry, in this order.
    # lm_loss and aux_loss: what a model reports apart (F.report_metric).
    KEYS = ("loss", "lm_loss", "aux_loss", "lr", "grad_norm", "tokens_per_s",
            "tokens_per_s_per_rank", "step_s",
            "data_wait_s", "mfu", "hfu", "memory_per_rank_bytes", "eval_loss", "samples")

    # What a log line shows, in this order.
    SHOWN = (("loss", lambda v: f"loss {v:.4f}"), ("eval_loss", lambda v: f"eval {v:.4f}"),
             ("aux_loss", lambda v: f"aux {v:.3g}"),
             ("lr", lambda v: f"lr {v:.3g}"), ("grad_norm", lambda v: f"|g| {v:.3g}"),
             ("tokens_per_s", lambda v: f"{v:.0f} tok/s"),
             ("step_s", lambda v: f"{v * 1e3:.0f} ms"), ("mfu", lambda v: f"MFU {v * 100:.1f}%"),
             ("data_wait_s", lambda v: f"data {v * 1e3:.1f} ms"))

    def __init__(self, every=1, jsonl="", tensorboard="", plot="", steps=0, leader=True,
                 stream=None):
        self.every, self.steps, self.leader = every, steps, leader
        self.stream = stream or sys.stdout
        self.tty = self.leader and hasattr(self.stream, "isatty") and self.stream.isatty()
        self._jsonl = open(jsonl, "a") if jsonl and leader else None
        self._tb = TensorBoardWriter(tensorboard) if tensorboard and leader else None
        self._plot = plot if leader else ""
        self.history = []
        self._start = time.monotonic()

    def header(self, text: str) -> None:
        if self.leader:
            print(text, file=self.stream, flush=True)

    def log(self, step: int, record: dict) -> None:
        """Step `step`'s values (keys of KEYS)."""
        record = {k: record[k] for k in self.KEYS if record.get(k) is not None}
        self.history.append({"step": step, **record})
        if not self.leader:
            return
        if self._jsonl:
            self._jsonl.write(json.dumps({"step": step, "time": time.time(), **record}) + "\n")
            self._jsonl.flush()
        if self._tb:
            self._tb.scalars(step, {k: v for k, v in record.items()
                                    if isinstance(v, (int, float)) and not isinstance(v, bool)
                                    and math.isfinite(v)})
        if step % self.every and step != self.steps and "eval_loss" not in record:
            return
        elapsed = time.monotonic() - self._start
        done = len(self.history)
        left = self.steps - step
        eta = elapsed / done * left if done else 0
        parts = [f"step {step}/{self.steps}"]
        for key, show in self.SHOWN:
            if key in record:
                parts.append(show(record[key]))
        parts.append(f"ETA {_duration(eta)}")
        line = " | ".join(parts)
        if self.tty:
            end = "\n" if step == self.steps else ""
            print(f"\r\033[K{line}", end=end, file=self.stream, flush=True)
        else:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self.tty:
            print(file=self.stream, flush=True)
        if self._jsonl:
            self._jsonl.close()
            self._jsonl = None
        if self._tb:
            self._tb.close()
            self._tb = None
        if self._plot:
            self.plot(self._plot)
            self._plot = ""

    def plot(self, path) -> None:
        """Loss (and eval loss), learning rate and tokens/s over steps."""
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            raise RuntimeError("metrics.plot needs matplotlib (pip install matplotlib)") from None
        fig, axes = plt.subplots(3, 1, figsize=(7, 8), sharex=True)
        for ax, keys, label in ((axes[0], ("loss", "eval_loss"), "loss"),
                                (axes[1], ("lr",), "learning rate"),
                                (axes[2], ("tokens_per_s",), "tokens/s")):
            for key in keys:
                points = [(h["step"], h[key]) for h in self.history if key in h]
                if points:
                    ax.plot(*zip(*points), label=key, marker="." if key == "eval_loss" else None)
            ax.set_ylabel(label)
            ax.legend()
        axes[-1].set_xlabel("step")
        fig.tight_layout()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
        plt.close(fig)

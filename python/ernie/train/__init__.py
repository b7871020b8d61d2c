"""ernie.train: a training job from one config file.

    python -m ernie.train --config job.toml [--section.key value ...] [--dry-run]
    python -m ernie.distributed.launch --nproc-per-node 2 -m ernie.train --config job.toml

`Trainer(job).run()` builds the model (a family of `ernie.models` with its
Hugging Face config fields, or a Hugging Face folder), the mesh and the
strategy from [parallel], the optimizer and its schedule, compiles once per
process, and trains from a Megatron-format token dataset: each process reads
only its ranks' rows of each global batch (`ernie.distributed.local_batch`)
in a prefetch thread, in the one global sample order of `ernie.data`. It
evaluates on the held-out split, logs metrics (config.py, metrics.py),
checkpoints with the data position and resumes from the newest complete
checkpoint (`checkpoint.resume = "auto"`) on any mesh. SIGTERM or SIGINT
saves a checkpoint at the next step boundary (every process at the same
one) and exits 0; a loss or gradient norm that turns NaN or infinite stops
the run naming the step, the last good checkpoint kept, and (one process)
replays the steps since that checkpoint checking every tensor, naming the
first that is not finite. `--dry-run` compiles abstractly,
prints the plan and memory per rank, and exits.
"""

from __future__ import annotations

import math
import signal
import sys
import time
from pathlib import Path

import numpy as np

from .. import cost
from .. import distributed as dist
from ..compiler import compile as compile_program
from ..data import DataLoader, PackedSamples
from ..models.auto import AutoModelForCausalLM
from ..moe import moe_layers
from ..nn import abstract
from ..optimizer import SGD, AdamW, WarmupDecay
from ..strategy import (FP8, DataParallel, ExpertParallel, PipelineParallel, Recompute,
                        Strategy, TensorParallel)
from .config import ConfigError, JobConfig, load
from .metrics import Metrics

__all__ = ["ConfigError", "JobConfig", "Trainer", "load"]


class TrainingStopped(RuntimeError):
    """The run cannot go on (a non-finite loss): names the step."""


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n} B"


class Trainer:
    """One process's part of a training job (every process runs one)."""

    def __init__(self, job: JobConfig, dry_run: bool = False, stream=None):
        self.job, self.dry_run = job, dry_run
        self.stream = stream or sys.stdout
        self._stop_requested = False

    # -- set-up ------------------------------------------------------------

    def _mesh(self):
        p = self.job.parallel
        dims = [(name, size) for name, size in (("dp", p.dp), ("pp", p.pp), ("mp", p.mp))
                if size > 1]
        if not dims:
            return None, 1
        ranks = math.prod(size for _, size in dims)
        shape = [size for _, size in dims]
        mesh = dist.ProcessMesh(np.arange(ranks).reshape(shape).tolist(),
                                dim_names=[name for name, _ in dims])
        return mesh, ranks

    def _auto_plan(self, optimizer):
        """plan = "auto": the plan search's fastest plan that fits, over
        parallel.ranks ranks of parallel.cluster (default: this machine).
        Returns (mesh, ranks, strategy, description)."""
        p, t = self.job.parallel, self.job.training
        chosen = [k for k in ("dp", "mp", "pp", "zero", "micro_batches")
                  if getattr(p, k) != getattr(type(p)(), k)]
        if chosen:
            raise ConfigError(f"parallel.plan = \"auto\" chooses {', '.join(chosen)} itself: "
                              f"leave them out, or set plan = \"manual\"")
        env = dist.init_parallel_env()
        ranks = p.ranks or env.world_size * max(1, p.ranks_per_process)
        spec = p.cluster or cost.calibrate_cpu(ranks=ranks, repeats=2, profile=False)
        with abstract():
            shadow = self._model()
        best = dist.auto_plan(shadow, cluster=spec, global_batch=t.global_batch,
                              seq_len=t.seq_len, ranks=ranks, top=1, workers=1,
                              optimizer=optimizer)[0]
        strategy = Strategy.from_config(best.config or {})
        return best.mesh, ranks, strategy, repr(best)

    def _environment(self, ranks: int):
        """init_parallel_env with this process's share of the mesh's ranks."""
        env = dist.init_parallel_env()
        per = self.job.parallel.ranks_per_process or max(1, ranks // env.world_size)
        if env.world_size > 1 and per * env.world_size != ranks:
            raise ConfigError(f"parallel: the mesh has {ranks} ranks, which {env.world_size} "
                              f"processes x {per} ranks (parallel.ranks_per_process) do not make")
        return dist.init_parallel_env(ranks_per_process=per)

    def _model(self):
        # The packed samples come shifted (batch.labels = tokens[:, 1:]:
        # every token of a sample is some position's target), so the model
        # takes Paddle's pre-shifted labels, not Hugging Face's.
        m, t = self.job.model, self.job.training
        if m.pretrained:
            return AutoModelForCausalLM.from_pretrained(m.pretrained, pre_shifted_labels=True)
        if "model_type" in m.config and m.config["model_type"] != m.family:
            raise ConfigError(f"model.config.model_type {m.config['model_type']!r} differs from "
                              f"model.family {m.family!r}")
        return AutoModelForCausalLM.from_config({**m.config, "model_type": m.family},
                                                seed=t.seed, where="[model]",
                                                pre_shifted_labels=True)

    def _strategy(self, model) -> Strategy:
        p, t = self.job.parallel, self.job.training
        if p.zero and p.dp == 1:
            raise ConfigError("parallel.zero shards over dp: it needs parallel.dp > 1")
        sections = {}
        if p.dp > 1:
            sections["dp"] = DataParallel(sharding_level=p.zero)
            if moe_layers(model):
                sections["ep"] = ExpertParallel(axis="dp")  # experts spread over dp
        if p.mp > 1:
            sections["mp"] = TensorParallel(
                parallelize_plan=model.parallelize_plan(p.sequence_parallel))
        elif p.sequence_parallel:
            raise ConfigError("parallel.sequence_parallel splits over mp: it needs "
                              "parallel.mp > 1")
        if p.pp > 1:
            sections["pp"] = PipelineParallel(split_spec=model.split_spec,
                                              accumulate_steps=p.micro_batches,
                                              schedule_mode=p.schedule)
        if t.recompute != "none":
            sections["recompute"] = Recompute(granularity=t.recompute)
        if t.fp8:
            sections["fp8"] = FP8()
        return Strategy(**sections)

    def _optimizer(self):
        o, s, t = self.job.optimizer, self.job.lr_schedule, self.job.training
        if s.warmup_steps > t.steps:
            raise ConfigError(f"lr_schedule.warmup_steps {s.warmup_steps} exceeds "
                              f"training.steps {t.steps}")
        if s.min_lr > o.lr:
            raise ConfigError(f"lr_schedule.min_lr {s.min_lr} exceeds optimizer.lr {o.lr}")
        lr = WarmupDecay(o.lr, s.warmup_steps, t.steps, s.kind, s.min_lr)
        clip = t.grad_clip or None
        if o.name == "sgd":
            return SGD(lr, momentum=o.momentum, weight_decay=o.weight_decay, grad_clip=clip,
                       report_grad_norm=True)
        return AdamW(lr, beta1=o.beta1, beta2=o.beta2, epsilon=o.eps,
                     weight_decay=o.weight_decay, grad_clip=clip, report_grad_norm=True)

    def _samples(self, model, split):
        d, t = self.job.data, self.job.training
        if not d.path:
            raise ConfigError("data.path: the token dataset's prefix (python -m ernie.data "
                              "prepare writes one) is required to train")
        return PackedSamples(d.path, t.seq_len, split=split, valid_fraction=d.valid_fraction,
                             seed=t.seed, eos_id=None if d.eos_id < 0 else d.eos_id,
                             vocab_size=model.config.vocab_size)

    # -- the run -----------------------------------------------------------

    def run(self) -> int:
        job, t = self.job, self.job.training
        if job.eval.every and not job.data.valid_fraction:
            raise ConfigError("eval.every needs a held-out split: set data.valid_fraction > 0")
        optimizer = self._optimizer()
        searched = None
        if job.parallel.plan == "auto":
            mesh, ranks, strategy, searched = self._auto_plan(optimizer)
        else:
            mesh, ranks = self._mesh()
        env = self._environment(ranks)
        leader = env.rank == 0
        if self.dry_run:
            with abstract():
                model = self._model()
        else:
            model = self._model()
        if searched is None:
            strategy = self._strategy(model)
        elif leader:
            print(f"plan search: {searched}", file=self.stream, flush=True)
        # Before any compute: the data must fit the model.
        train = None if self.dry_run else self._samples(model, "train")
        valid = self._samples(model, "valid") if job.eval.every and not self.dry_run else None
        example = np.zeros((t.global_batch, t.seq_len), np.int64)
        start = time.perf_counter()
        program = compile_program(model, optimizer, [example, example], mesh,
                                  strategy=strategy, seed=t.seed, check_finite=t.check_finite,
                                  abstract=self.dry_run)
        compile_s = time.perf_counter() - start
        metrics = Metrics(job.metrics.every, job.metrics.jsonl, job.metrics.tensorboard,
                          job.metrics.plot, t.steps, leader, self.stream)
        try:
            peak = self._header(metrics, model, program, ranks, env, compile_s)
            if self.dry_run:
                return 0
            return self._train(program, model, train, valid, metrics, peak)
        finally:
            metrics.close()

    def _header(self, metrics, model, program, ranks, env, compile_s):
        """Start-up lines; returns the cost figures MFU uses (None: none)."""
        t = self.job.training
        params = sum(math.prod(p.shape) for _, p in model.named_parameters())
        report = program.report()
        state = report.get("model_state_bytes")
        if state is None and report.get("stages"):  # a pipeline: the fullest stage's
            state = max(st["parameter_bytes"] + st["optimizer_state_bytes"] +
                        st["gradient_bytes"] for st in report["stages"])
        peak = None
        if not self.dry_run:  # MFU's peak: this machine's, measured
            try:
                cluster = cost.calibrate_cpu(ranks=ranks, repeats=2, profile=False)
                peak = program.estimate(cluster)
            except Exception as e:  # a plan the cost model cannot price: no MFU, said so
                metrics.header(f"MFU: not available ({e})")
        plan = ", ".join(f"{n}={s}" for n, s in zip(program.mesh.dim_names, program.mesh.shape)) \
            if program.mesh else "one rank"
        lines = [
            f"ernie.train: {type(model).__name__}, {params / 1e6:.2f} M parameters",
            f"plan: mesh [{plan}], {ranks} rank(s), {env}",
            f"tokens per step: {t.global_batch * t.seq_len} ({t.global_batch} x {t.seq_len})",
            f"memory per rank: {_bytes(report.get('peak_bytes_per_rank', 0))} peak "
            f"(model state: parameters, gradients, optimizer {_bytes(state or 0)})",
            f"compile: {compile_s:.2f} s",
        ]
        if peak:
            lines.append(
                f"MFU = model FLOPs per step ({peak['model_flops'] / 1e9:.3f} GFLOP, counted from "
                f"the compiled ops; recomputation excluded) / (step time x {ranks} rank(s) x "
                f"peak {peak['peak_flops'] / 1e9:.1f} GFLOP/s per rank, calibrate_cpu's GEMM "
                f"peak); HFU counts what the program computes, recomputation included")
        for line in lines:
            metrics.header(line)
        return peak

    def _checkpoint_dir(self):
        return Path(self.job.checkpoint.dir) if self.job.checkpoint.dir else None

    def _resume(self, program, train):
        """The loader to train from, after loading a checkpoint if asked."""
        c = self.job.checkpoint
        rows = dist.local_batch(program)
        where = None
        root = self._checkpoint_dir()
        if c.resume == "auto" and root is not None and any(root.glob("step-*")):
            where = root
        elif c.resume not in ("auto", "never"):
            where = Path(c.resume)
        return self._loader_from(program, train, rows, where), where

    def _loader_from(self, program, train, rows, checkpoint):
        """The training data from the start, or (`checkpoint` a path) from
        the position saved with it, after loading it into `program`."""
        if checkpoint is None:
            return DataLoader(train, self.job.training.global_batch, positions=rows,
                              prefetch=self.job.data.prefetch)
        meta = program.load_checkpoint(checkpoint)
        position = (meta.get("data_position") or {}).get("train")
        if position is None:
            raise ConfigError(f"{checkpoint}: the checkpoint has no data position (not one "
                              f"ernie.train saved)")
        return DataLoader.from_position(train, position, positions=rows,
                                        prefetch=self.job.data.prefetch)

    def _save(self, program, loader):
        root = self._checkpoint_dir()
        if root is None:
            return None
        return program.save_checkpoint(root, keep=self.job.checkpoint.keep,
                                       data_position={"train": loader.position()})

    def _evaluate(self, program, valid, rows) -> float:
        e, t = self.job.eval, self.job.training
        losses = []
        with DataLoader(valid, t.global_batch, positions=rows, steps=e.batches) as loader:
            for batch in loader:
                losses.append(program.eval(batch.inputs, batch.labels, rows=rows))
        return float(np.mean(losses))

    def _nonfinite(self, program, train, rows, step, error, last_good) -> str:
        """Why the run stops at `step`: the check's error, and where the
        first non-finite tensor is. One process replays the steps since the
        last good checkpoint (or from the start) in a fresh session that
        checks every tensor: the replay is bitwise the run, so it fails at
        the first tensor that went NaN or infinite, perhaps a step earlier
        (gradients) than the loss did."""
        t = self.job.training
        kept = f"; the last good checkpoint is {last_good}" if last_good else ""
        message = f"step {step}: {error}{kept}"
        if not t.locate_nonfinite or t.check_finite == "tensors":
            return message
        if program.job is not None:
            return (message + "; to name the first non-finite tensor, run again with "
                    "--training.check_finite tensors" +
                    (f" --checkpoint.resume {last_good}" if last_good else ""))
        program.reopen(check_finite="tensors")
        loader = self._loader_from(program, train, rows, last_good)
        replayed_from = program.step_count
        with loader:
            while program.step_count < step:
                batch = next(loader)
                try:
                    program.step(batch.inputs, batch.labels, rows=rows)
                except RuntimeError as e:
                    return (f"{message}; replayed from step {replayed_from} checking every "
                            f"tensor: step {program.step_count}: {e}")
        return message + "; a replay checking every tensor found none (not reproducible)"

    def _on_signal(self, signum, frame):
        """The first SIGTERM / SIGINT: save at the next step boundary. A
        second one (Ctrl-C again): stop now, without saving."""
        if self._stop_requested:
            signal.signal(signum, signal.SIG_DFL)
            raise KeyboardInterrupt(f"{signal.Signals(signum).name} again: stopping without "
                                    f"a checkpoint")
        self._stop_requested = True

    def _train(self, program, model, train, valid, metrics, peak) -> int:
        job, t = self.job, self.job.training
        loader, resumed = self._resume(program, train)
        if resumed is not None:
            metrics.header(f"resumed from {resumed} at step {program.step_count}")
        rows = dist.local_batch(program)
        tokens = t.global_batch * t.seq_len
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        last_good = None
        try:
            while program.step_count < t.steps:
                begin = time.perf_counter()
                batch = next(loader)
                got = time.perf_counter()
                step = program.step_count + 1
                try:
                    loss = program.step(batch.inputs, batch.labels, rows=rows)
                except RuntimeError as e:
                    if "not finite" not in str(e):
                        raise
                    raise TrainingStopped(self._nonfinite(program, train, rows, step, e,
                                                          last_good)) from None
                end = time.perf_counter()
                seconds = end - begin
                record = {"loss": loss, "lr": program.optimizer.get_lr(step),
                          "grad_norm": program.grad_norm,
                          "tokens_per_s": tokens / seconds,
                          "tokens_per_s_per_rank": tokens / seconds / program.num_ranks,
                          "step_s": end - got, "data_wait_s": got - begin,
                          "memory_per_rank_bytes": program.report().get("peak_bytes_per_rank")
                          if step == 1 else None, **program.last_metrics}
                if peak:
                    flops = peak["model_flops"]
                    capacity = seconds * peak["peak_flops"] * peak["ranks"]
                    record["mfu"] = flops / capacity
                    # Hardware FLOPs: what the program computes and recomputes.
                    record["hfu"] = (flops + peak.get("recompute_flops", 0)) / capacity
                if job.metrics.sample_ids:  # the whole global batch, from its indices
                    first = (step - 1) * t.global_batch
                    record["samples"] = [train.sample_id(g)
                                         for g in range(first, first + t.global_batch)]
                if job.eval.every and step % job.eval.every == 0:
                    record["eval_loss"] = self._evaluate(program, valid, rows)
                metrics.log(step, record)
                if job.checkpoint.every and step % job.checkpoint.every == 0:
                    last_good = self._save(program, loader)
                # Every process stops at the same step when any was asked to.
                if program.any_process(self._stop_requested):
                    path = self._save(program, loader)
                    metrics.header(f"stopped at step {step} on request; checkpoint {path}")
                    return 0
            if job.checkpoint.dir and (not job.checkpoint.every or
                                       program.step_count % job.checkpoint.every):
                self._save(program, loader)
            if job.export.hf:
                state = program.state_dict()
                if dist.get_rank() == 0:
                    model.save_pretrained(job.export.hf, state=state)
                    metrics.header(f"exported {job.export.hf}")
            return 0
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            loader.close()

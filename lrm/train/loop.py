"""Training a job: one process or N (`python -m lrm.launch`, torchrun), CPU (gloo) or GPU (nccl).

`train(job)` runs a `TrainJob` (lrm.train.job: what to train on what, and how it starts) in
three parts, read top to bottom:

    build    look at the data once (rows and CTR, distinct hashed ids, the split) -> fit the
             schedule and hashed tables -> the model (tables on meta), head bias at
             logit(train CTR) -> [the job's transform: FP8] -> shard it (DMP, the job's plan) -> fused
             Adagrad (tables) + fused AdamW (dense) [+ the dense weights' moving average,
             lrm.train.average] -> the loaders -> [the checkpoint it starts from: a resume]
    run      steps (torchrec's TrainPipelineSparseDist; one process on a GPU: each step one
             CUDA graph replay, lrm.train.step_graph) in segments that end where it
             evaluates: every log_every steps loss, windowed NE, samples/s; every val_every
             steps NE on the validation slice, stopping when it stops improving; every
             eval_every steps NE/AUC on the held-out day; the checkpoint manager each step;
             where it validated (train.val_tail), the best validated state restored and
             the train days from it on, the validation slice (the newest rows) last,
             trained once (`_tail`; lrm.train.schedule says why)
    finish   final checkpoint, [the best validated state restored: no tail], final eval
             (with confidence intervals), the unsharded model to `job.out` (rank 0)

Where the run keeps a moving average of the dense weights (`train.ema_decay`), the average
is what every evaluation scores, what validation copies as a best state and what the run
saves; the steps and the checkpoints' model part are the trained weights.

The loss is `job.loss(model, batch)` (default: log loss of the logits; an ExFM student's is
its distillation loss, handed by lrm.exfm.distill). A step consumes the same impressions whatever the
number of processes (lrm.train.data). Inside a step the host never waits for the device:
the loss and the meters stay there, and a non-finite loss is caught on the device, its
update skipped (lrm.train.guard); the run stops with NonFiniteLossError at the next log
point (at most `log_every` steps later) or before anything is saved, so the model and the
checkpoints keep their last good state. Deterministic on CPU: generators are seeded per
step, tables are initialized independently of the plan, and a resume seeks the data to the
checkpointed position, so it reproduces the uninterrupted run bit for bit.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lrm import metrics
from lrm.checkpoint import CheckpointManager
from lrm.config import ModelConfig
from lrm.data.batch import Batch
from lrm.dist import Dist, intra_op_threads, loader_workers, process_group, quiet_libraries
from lrm.errors import ConfigError, DataError
from lrm.models import build_model
from lrm.models.precision import autocast
from lrm.models.saved import ModelCard, load_weights, read_card, save_model
from lrm.progress import Reporter
from lrm.sharding import parallel
from lrm.train import schedule as schedules
from lrm.train.average import DenseAverage
from lrm.train.data import EpochStream, TrainData, fit_tables, loaders, model_hash_sizes, \
    per_rank_batch, run_identity, seek
from lrm.train.early_stop import EarlyStopping
from lrm.train.evaluate import scored
from lrm.train.graphs import graph_mlps
from lrm.train.guard import NonFiniteGuard, NonFiniteLossError
from lrm.train.job import TrainJob
from lrm.train.meter import Meter
from lrm.train.state import TrainState, seed_step
from lrm.train.step_graph import EAGER_STEPS, GraphSteps, unsupported
from lrm.train.steps import LrSchedule, StepRunner, Steps, compile_dense, dense_optimizer, \
    dense_parameters

log = logging.getLogger("lrm")
LogFn = Callable[[Mapping[str, float], int], None]

__all__ = ["LogFn", "NonFiniteLossError", "TrainResult", "train"]


@dataclass
class TrainResult:
    steps: int  # optimizer steps of the whole run (including those before a resume)
    samples: int  # impressions of the whole run, all ranks
    samples_per_s: float  # this process's run: impressions / time in train steps
    eval: dict[str, Any]  # final held-out metrics (the same dict on every rank)
    history: list[dict[str, float]] = field(default_factory=list)  # rank 0's log points
    resumed_from: int | None = None  # step of the checkpoint resumed from
    start: str = "fresh"  # how it started: fresh | warm | resume (lrm.train.job)
    init_from: Path | None = None  # warm: the model folder it started from
    checkpoint: Path | None = None  # the last checkpoint written
    out: Path | None = None  # the final model folder
    world_size: int = 1
    train_days: list[int] = field(default_factory=list)
    eval_day: int = -1
    schedule: dict[str, Any] = field(default_factory=dict)  # what the run took (lrm.train.schedule)
    validation: dict[str, Any] = field(default_factory=dict)  # best NE, its step, stopped early?
    fp8: list[str] = field(default_factory=list)  # the layers that trained in FP8
    sharding: dict[str, str] = field(default_factory=dict)  # table -> how it was sharded

    def summary(self, kind: str) -> dict[str, Any]:
        """The run's metrics as a stage reports them (JSON-able)."""
        return {"kind": kind, "steps": self.steps, "samples": self.samples,
                "samples_per_s": self.samples_per_s, "world_size": self.world_size,
                "train_days": self.train_days, "eval_day": self.eval_day,
                "resumed_from": self.resumed_from, "start": self.start,
                "init_from": str(self.init_from) if self.init_from else None, "eval": self.eval,
                "schedule": self.schedule, "validation": self.validation,
                "fp8": self.fp8, "sharding": self.sharding}


def train(job: TrainJob, *, log_fn: LogFn | None = None) -> TrainResult:
    """Run `job` (see the module docstring); rank 0 writes `job.out`.

    log_fn(metrics, step): called on rank 0 at every log point and eval (e.g. MLflow).
    """
    quiet_libraries()
    with process_group(job.train.device) as env, contextlib.ExitStack() as cleanup:
        run = _Run(job, env, cleanup, log_fn)
        stopped_early = run.loop()
        return run.finish(stopped_early)


class _Run:
    """A job being run: built by the constructor, then `loop()`, then `finish()`."""

    def __init__(self, job: TrainJob, env: Dist, cleanup: contextlib.ExitStack,
                 log_fn: LogFn | None) -> None:
        """Everything a run needs, from the job: data, schedule, model, optimizers, loaders,
        and the checkpoint it starts from."""
        self.job, self.env, self.log_fn = job, env, log_fn
        cfg = self.cfg = job.train
        kind = self.kind = job.kind
        self.workers = loader_workers(job.loader.num_workers, env.device)  # as loaders() takes
        torch.set_num_threads(intra_op_threads(cfg.threads,
                                               self.workers if job.loader.prefetch else 0))
        # -- the data decides: rows and CTR, hashed table sizes, the schedule ----------
        # a model started from another (warm) keeps its tables; a resume fits them as its
        fit = cfg.fit_tables and job.start != "warm"  # run first did
        data = self.data = TrainData.open(job.data, job.split, job.eval_data, fit=fit,
                                          cap=job.model.tables.hash_size)
        self.schema = read_card(job.init_from).schema if job.init_from is not None else \
            fit_tables(data.schema, data.stats)
        sched = self.sched = schedules.plan(cfg, data.stats.rows, env.world_size)
        if env.is_main and sched.adapted:
            log.info("train %s: the schedule fits %d rows: %s", kind, data.stats.rows,
                     "; ".join(sched.adapted))
        if env.is_main and cfg.steps and sched.epochs > 1:  # literal steps: no validation
            log.warning("train %s: train.steps=%d is %d passes over the train days' %d rows "
                        "at batch %d, with no validation slice to stop at the best state; "
                        "repeated passes can overfit (leave train.steps at 0: the schedule "
                        "then fits the data and validates)", kind, cfg.steps, sched.epochs,
                        data.stats.rows, sched.batch_size)

        # -- the model, sharded, and its optimizers -----------------------------------
        torch.manual_seed(cfg.seed)
        model = build_model(kind, self.schema, job.model,  # type: ignore[arg-type]
                            device="meta", dense_device=env.device)
        model.init_output_bias(data.stats.ctr)  # type: ignore[operator]
        self.sizes = model_hash_sizes(model)
        self.fp8: list[str] = []  # the layers the job's transform converted (to FP8)
        if job.transform is not None:
            model, self.fp8 = job.transform(model)
        if cfg.compile:
            log.info("train %s: compiled %s", kind, compile_dense(model, env.device))
        elif cfg.cuda_graphs and (graphed := graph_mlps(
                model, per_rank_batch(sched.batch_size, env.world_size), env.device, cfg.amp)):
            log.info("train %s: CUDA graphs of %s", kind, graphed)
        self.dmp = parallel.shard(model, env, embedding_lr=cfg.embedding_lr, seed=cfg.seed,
                                  plan=job.plan)
        if job.init_from is not None:
            _warm_start(self.dmp, job, self.sizes)
        # the dense weights' average (train.ema_decay), from the weights the run starts with
        self.average = DenseAverage(dense_parameters(self.dmp), cfg.ema_decay) \
            if cfg.ema_decay else None
        self.state = TrainState()
        self.ckpt: CheckpointManager | None = None
        self.guard = NonFiniteGuard(env, self._non_finite)
        self.state.guard = self.guard
        dense_opt, adamw = dense_optimizer(self.dmp, cfg.lr, cfg.weight_decay)
        self.guard.gate(self.dmp, adamw)
        self.opt = parallel.optimizer(self.dmp, dense_opt)
        self.lrs = LrSchedule(self.opt)
        self.loaders = loaders(data, sched.batch_size, sched.val_batches, job.loader, env,
                               self.sizes, job.teacher_column)
        assert self.loaders.train_batches == sched.epoch_batches, (self.loaders, sched)
        self.stream = EpochStream(self.loaders.train, sched.epoch_batches)
        self.stopper = EarlyStopping(self.dmp, self.state, cfg.patience, fetch=self._fetch)

        # -- checkpoints: everything a resume needs is a stateful part -----------------
        self.parts: dict[str, Any] = {"model": self.dmp, "optim": self.opt,
                                      "train": self.state, "data": self.stream}
        if self.average is not None:
            self.parts["average"] = self.average
        self.resumed_from: int | None = None
        if job.checkpoints is not None:
            self.ckpt = cleanup.enter_context(CheckpointManager(  # closed on every path
                job.checkpoints, env, job.checkpoint,
                run_identity(kind, job.model, self.sizes, cfg, sched.batch_size,
                             sched.epoch_batches, env, data, job.loader),
                owner=_owner(job.out, job.checkpoints)))
            # AdamW's state is lazy: made (a dummy step) only when there is one to load
            self.resumed_from = self.ckpt.start(self.parts, job.start == "resume",
                                                prepare=dense_opt.init_state, force=job.force)
            self.opt.zero_grad(set_to_none=True)
            self.guard.reset(self.state.step)
            with self._served():
                self.stopper.resumed(self.state.step)
            if self.state.best_step >= 0:  # its checkpoint stays through retention
                self.ckpt.pin(self.state.best_step)
        self.history: list[dict[str, float]] = []
        self.restored: int | None = None  # the best state's step, put back before the tail
        self.meter = Meter(env, cfg.ne_window)
        self.batch_rows = 0  # impressions of the latest step's batch (this rank)
        self.steps = _steps(self.dmp, self.opt, env, self._step, cfg,
                            self.loaders.train.windows, kind,
                            per_rank_batch(sched.batch_size, env.world_size),
                            max(sched.warmup - self.state.step, 0))

    # -- run -----------------------------------------------------------------------------
    def loop(self) -> bool:
        """The steps, in segments up to each evaluation; True when it stopped early."""
        env, sched, state, cfg = self.env, self.sched, self.state, self.cfg
        total = sched.steps
        left = max(total - state.step, 0) + sched.tail if state.tail_from < 0 else \
            state.tail_from + sched.tail - state.step
        reporter = Reporter(f"train {self.kind}", total=left * sched.batch_size,
                            unit="samples") if env.is_main else None
        stopped_early = self._catch_up()
        with contextlib.closing(iter(self.stream)) as it, \
                (reporter or contextlib.nullcontext(_Quiet())) as rep:
            self.meter.resume_clock()
            while state.step < total and not stopped_early and state.tail_from < 0:
                # a segment of steps up to the next evaluation: the pipeline drains at its end
                end = _next_pause(state.step, total, sched, cfg.eval_every)
                segment = islice(it, end - state.step)
                while state.step < end:
                    self._advance(segment, rep, total)
                self.steps.pause()
                if state.step == total:
                    break
                self.guard.check()
                if sched.validates_at(state.step):
                    stopped_early = self._validate()
                if cfg.eval_every and state.step % cfg.eval_every == 0:
                    self._evaluate(cfg.eval_batches or None)
                self.meter.resume_clock()
            if stopped_early and state.tail_from < 0:
                log.info("train %s: validation NE has not improved for %d validations; "
                         "stopped at step %d of %d", self.kind, cfg.patience, state.step, total)
            if sched.tail:
                self._tail(stopped_early, rep)
        self.guard.check()
        return stopped_early

    def _tail(self, stopped_early: bool, rep: Any) -> None:
        """The validation slice (the train days' newest rows) trains once, in time order,
        from the best validated state (schedule.tail): the run ends having learnt from every
        row, and early stopping still chose how long the passes before it ran. A run resumed
        in this pass goes on with it."""
        state, sched = self.state, self.sched
        if state.tail_from < 0:
            if not stopped_early and state.validated_at != state.step:
                self._validate()  # the final state competes too
            self.restored = self.stopper.restore(state.step)
            if self.average is not None:  # the served weights go on: the average restarts
                self.average.restart(from_average=self.restored is None)
            if self.ckpt is not None:
                self.ckpt.rewritten()
            state.tail_from = state.step
            # a best state within the first pass has not seen the rows after it either
            at = self.restored if self.restored is not None else state.step
            state.tail_batch = min(at, sched.epoch_batches)
            log.info("train %s: %s; the train days from batch %d on, the newest rows last, "
                     "train once (%d steps)", self.kind, f"restored the state of step "
                     f"{self.restored} (validation NE {state.best_ne:.5f})"
                     if self.restored is not None else "the last state is the best",
                     state.tail_batch, len(self.loaders.train) - state.tail_batch)
        end = state.tail_from + len(self.loaders.train) - state.tail_batch
        done = state.step - state.tail_from
        seek(self.loaders.train, state.tail_batch + done)
        with contextlib.closing(iter(self.loaders.train)) as it:
            segment = islice(it, end - state.step)
            self.meter.resume_clock()
            while state.step < end:
                self._advance(segment, rep, end, stream=False)
            self.steps.pause()

    def _catch_up(self) -> bool:
        """Where a resumed run starts: a checkpoint saved at a validation step holds the
        state before that validation (saves come first); run it now, as the run never
        stopped did. True when the run had already stopped early there (or before the
        pass over the validation slice it resumed in)."""
        state, sched = self.state, self.sched
        if self.resumed_from is None or not sched.val_batches:
            return False
        if state.tail_from >= 0:
            return state.tail_from < sched.steps
        if state.stale >= self.cfg.patience:
            return True
        if sched.validates_at(state.step) and state.validated_at < state.step < sched.steps:
            return self._validate()
        return False

    def _advance(self, segment: Iterator[Batch], rep: Any, total: int,
                 stream: bool = True) -> None:
        """One optimizer step and its bookkeeping: counts, logs, checkpoint (`stream`: a
        batch of the epochs' stream, whose position moves; the validation slice's pass
        counts its position in steps, TrainState.tail_from)."""
        env, state, cfg = self.env, self.state, self.cfg
        seed_step(cfg.seed, state.step, env.rank, env.device)
        self.lrs.set(self.sched.lr_factor(state.step))
        if not self.steps.step(segment):
            raise DataError(self.job.data, None, None, "the train days hold fewer batches than "
                            "the schedule counted (changed while training?)")
        if self.average is not None:
            self.average.update()
        state.step += 1
        state.samples += self.batch_rows * env.world_size
        if stream:
            self.stream.advance()
        self.meter.tick(self.batch_rows)
        rep.update(self.batch_rows * env.world_size)
        logs = state.step % cfg.log_every == 0 or state.step == total
        if logs:  # the host reads the device's values here only
            self.guard.check()
            self._log_point(point := self.meter.point())
            rep.update(0, loss=point["loss"], ne=point["ne_window"])
        if self.ckpt is not None and self.ckpt.step(state.step, self.parts):  # checks the guard
            self.meter.resume_clock()

    def _step(self, b: Batch) -> tuple[torch.Tensor, None]:
        """The step the pipeline runs: forward and loss; it then runs the backward and the
        optimizer step (both gated by `ok`)."""
        with autocast(self.env.device, self.cfg.amp):
            loss, serving = self.job.loss(self.dmp, b)
        ok = self.guard.watch(loss)
        self.meter.record(serving, b.labels, ok)
        self.batch_rows = b.size
        return loss, None

    def _log_point(self, point: dict[str, float]) -> None:
        if self.env.is_main:
            self.history.append({"step": self.state.step, **point})
            if self.log_fn is not None:
                self.log_fn(point, self.state.step)

    def _served(self) -> contextlib.AbstractContextManager[None]:
        """The weights the run would save, in the model for the block: the dense average
        where the run keeps one (the trained weights come back after)."""
        return self.average.applied() if self.average is not None else contextlib.nullcontext()

    def _evaluate(self, max_batches: int | None, ci: bool = False) -> dict[str, Any]:
        with self._served():
            ev = _evaluate(self.dmp, self.loaders.held_out, self.env, max_batches=max_batches,
                           ci=ci)
        self._log_point({f"eval_{k}": float(v) for k, v in ev.items() if _scalar(v)})
        return ev

    def _validate(self) -> bool:
        """Score the validation slice; True when training should stop. A better state is
        kept as a checkpoint too (saved now unless this step just was), pinned through
        retention: a run resumed after it restores it at the end (`_fetch`)."""
        state = self.state
        with self._served():  # a better state's copy is of the weights it would save
            ev = _evaluate(self.dmp, self.loaders.validation_batches(), self.env,
                           max_batches=None)
            stop = self.stopper.update(ev["ne"], state.step)
        state.validated_at = state.step
        self._log_point({"val_ne": ev["ne"], "val_best_ne": state.best_ne})
        if self.ckpt is not None and state.best_step == state.step:
            if self.ckpt.saved_at != state.step:
                self.ckpt.save(state.step, self.parts)
            self.ckpt.pin(state.step)
        return stop

    def _fetch(self, step: int) -> bool:
        """The model's weights of `step` from this run's checkpoint of it (see _validate),
        with that step's dense average in them where the run keeps one."""
        kept = {k: self.parts[k] for k in ("model", "average") if k in self.parts}
        count = self.average.updates if self.average is not None else 0
        if self.ckpt is None or not self.ckpt.restore_model(step, kept):
            return False
        if self.average is not None:
            self.average.swap()
            # the updates counted so far stay (as the in-memory copy leaves them): the
            # newest rows' pass goes on averaging at the rate the run had reached
            self.average.updates = count
        return True

    def _non_finite(self, step: int, value: float) -> str:
        here = value if not math.isfinite(value) else "finite here, not on every rank"
        last = (self.ckpt.last if self.ckpt else None) or "none"
        return (f"train {self.kind}: the loss is not finite ({here}) at step {step} (its update "
                f"was skipped; stopped at step {self.state.step}). Last good checkpoint: "
                f"{last}. Lower train.lr / train.embedding_lr and --resume from it, or check "
                f"the data (dense values too large to learn from?) and start afresh")

    # -- finish --------------------------------------------------------------------------
    def finish(self, stopped_early: bool) -> TrainResult:
        """Final checkpoint, the best validated state back, final eval, the model saved."""
        job, env, state, sched = self.job, self.env, self.state, self.sched
        if sched.val_batches and not sched.tail and not stopped_early and \
                state.validated_at != state.step:
            self._validate()  # the final state competes too
        if self.ckpt is not None:  # the run's own last state: a resume with more steps goes
            self.ckpt.finish(state.step, self.parts)  # on from it as an uninterrupted run would
        if sched.tail:  # put back before the validation slice trained (_tail)
            restored = self.restored if self.restored is not None or self.resumed_from is None \
                else (state.best_step if 0 <= state.best_step != state.tail_from else None)
        else:
            restored = self.stopper.restore(state.step) if sched.val_batches else None
            if restored is not None:
                log.info("train %s: restored the state of step %d (validation NE %.5f)",
                         self.kind, restored, state.best_ne)
        if self.average is not None:
            if restored is None or sched.tail:  # the current state's average (a restored
                self.average.swap()  # one has its own, unless the slice trained on from it)
            self.average = None  # the model holds what the run saves: scored as it is
        final = self._evaluate(None, ci=True)
        weights = parallel.full_state_dict(self.dmp, env)
        validation = {"best_ne": state.best_ne if math.isfinite(state.best_ne) else None,
                      "best_step": state.best_step, "stopped_early": stopped_early,
                      "restored": restored,
                      # the pass over the newest rows after it: from this step, from this
                      # batch of the train days on (-1: none)
                      "tail_from": state.tail_from, "tail_batch": state.tail_batch}
        sharding = parallel.sharding_types(self.dmp)
        if env.is_main and job.out is not None:
            assert weights is not None
            info = {"steps": state.step, "samples": state.samples,
                    "train_days": self.data.train_days, "eval_day": self.data.eval_day,
                    "eval": final, "world_size": env.world_size, "batch_size": sched.batch_size,
                    "recd": job.loader.recd, "loader_workers": self.workers,
                    "verticals": list(job.split.verticals),
                    "schedule": sched.summary(), "validation": validation, "start": job.start,
                    "init_from": str(job.init_from) if job.init_from else None,
                    "fp8": self.fp8, "sharding": sharding, **job.info}
            save_model(job.out, ModelCard(kind=self.kind, schema=self.schema, model=job.model,
                                          hash_sizes=self.sizes, info=info), weights)
        env.barrier()
        return TrainResult(
            steps=state.step, samples=state.samples, samples_per_s=self.meter.samples_per_s,
            eval=final, history=self.history, resumed_from=self.resumed_from,
            start=self.job.start if self.resumed_from is not None or self.job.start == "warm"
            else "fresh", init_from=self.job.init_from,
            checkpoint=self.ckpt.last if self.ckpt else None, out=job.out,
            world_size=env.world_size, train_days=self.data.train_days,
            eval_day=self.data.eval_day, schedule=sched.summary(), validation=validation,
            fp8=self.fp8, sharding=sharding)


def _owner(out: Path | None, checkpoints: Path) -> str | None:
    """The run a checkpoint folder's checkpoints are of: its model folder, relative to the
    checkpoint folder (so a moved project keeps its pairs)."""
    return None if out is None else os.path.relpath(Path(out).resolve(),
                                                    Path(checkpoints).resolve())


def _steps(dmp: nn.Module, opt: torch.optim.Optimizer, env: Dist, step_fn: Any,
           cfg: Any, windows: bool, kind: str, batch: int, warmup_left: int) -> StepRunner:
    """Whole-step CUDA graphs where they apply (lrm.train.step_graph: one process on a GPU,
    no shared-history batches), captured after the learning-rate warm-up; else torchrec's
    train pipeline."""
    why = "train.cuda_graphs is off" if not cfg.cuda_graphs else \
        unsupported(dmp, env.world_size, env.device, windows)
    if why is None:
        log.info("train %s: whole-step CUDA graphs (captured after %d uncaptured steps)",
                 kind, max(warmup_left, EAGER_STEPS))
        return GraphSteps(dmp, opt, env.device, step_fn, batch=batch, eager_steps=warmup_left)
    if env.device.type == "cuda" and env.is_main:
        log.info("train %s: no whole-step CUDA graphs (%s): torchrec's train pipeline",
                 kind, why)
    return Steps(dmp, opt, env.device, step_fn)


def _next_pause(step: int, total: int, sched: schedules.Schedule, eval_every: int) -> int:
    """The first step after `step` at which the loop evaluates (or the last step)."""
    ends = [total]
    for every in (sched.val_every if sched.val_batches else 0, eval_every):
        if every:
            ends.append((step // every + 1) * every)
    return min(ends)


def _scalar(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _grows(then: ModelConfig, job: TrainJob) -> bool:
    """Whether the job's model is a saved model's (`then`) with the parts its growth adds
    (an ExFM student's auxiliary head or adapter: lrm.exfm.distill)."""
    return job.growth is not None and then != job.model and job.growth.grow(then) == job.model


def _warm_start(dmp: nn.Module, job: TrainJob, sizes: dict[str, int]) -> None:
    """Load a saved model's weights (plain tensors) into the sharded model."""
    path, kind = job.init_from, job.kind
    assert path is not None
    card = read_card(path)
    grown = card.kind == kind and _grows(card.model, job)
    if card.kind != kind or card.hash_sizes != sizes or (card.model != job.model
                                                          and not grown):
        raise ConfigError(f"init_from {path}: a {card.kind} with another config or table "
                          f"sizes than this {kind}; it cannot start this run")
    weights = load_weights(path)
    # the keys compared here: a load that is not strict reports none (torch's
    # _load_from_state_dict lists missing and unexpected keys only when strict)
    have = set(dmp.state_dict())
    missing = [k for k in have if k not in weights]
    unexpected = [k for k in weights if k not in have]
    prefixes = job.growth.prefixes if job.growth is not None and grown else ()
    fresh = [k for k in missing if not k.startswith(prefixes)]
    if fresh or unexpected:
        raise ConfigError(f"init_from {path}: its weights do not fit this {kind} (missing "
                          f"{sorted(fresh)[:3]}, unexpected {unexpected[:3]})")
    dmp.load_state_dict(dict(weights), strict=not grown)  # DMP renames the keys it is given
    log.info("started from the weights of %s%s", path,
             f" (the parts it grows start fresh: {len(missing)} tensors)" if missing else "")


def _evaluate(model: nn.Module, batches: Iterable[Batch], env: Dist, *,
              max_batches: int | None, ci: bool = False) -> dict[str, Any]:
    """Score every rank's share of `batches`; the metrics of all of them on every rank. As
    `lrm evaluate` scores (in the memory of a batch: a held-out day of any size; the
    ranks' sums added up), and in float32 also where the steps train under bf16 autocast:
    the NE that validation compares, the card records and the registry judges is the saved
    model's (bf16 moved it by 1e-4 to 4e-4 on an H100), the one `lrm evaluate` gives."""
    scores = metrics.StreamingScore(resamples=metrics.BOOTSTRAP if ci else 0, seed=env.rank)
    for logits, labels in scored(model, batches, env.device, max_batches=max_batches):
        scores.update(logits, labels)
    scores.reduce(env.all_sum)
    return scores.compute()


class _Quiet:
    """The Reporter interface for ranks other than 0."""

    def update(self, n: float = 1, **stats: float) -> None:
        pass

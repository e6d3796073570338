"""The training loop: one process or `torchrun --nproc_per_node=N`, CPU (gloo) or GPU (nccl).

    read the train days (rows, CTR, distinct ids) -> fit the schedule and hashed tables
    -> build the model (tables on meta), head bias at logit(train CTR) -> [transform it]
    -> shard it (DMP) -> fused Adagrad (tables) + fused AdamW (dense) -> [resume]
    -> steps through torchrec's TrainPipelineSparseDist: forward, loss, guard, backward, step
       (one process on a GPU: each step one CUDA graph replay, lrm.train.step_graph)
    -> every log_every steps: loss, windowed NE, samples/s (progress, log_fn)
    -> every val_every steps: NE on the validation slice; stop when it stops improving
    -> every eval_every steps: NE/AUC on the held-out day; the checkpoint manager each step
    -> final checkpoint, restore the best validated state, final eval (with confidence
       intervals), unsharded model to `out` (rank 0)

The loss is `loss_fn(model, batch)` (default: log loss of the logits; ExFM passes its
distillation loss, lrm.exfm.distill); `init_from` warm-starts from a saved model folder.
A step consumes the same impressions whatever the number of processes (lrm.train.data).
Inside a step the host never waits for the device: the loss and the meters stay there, and
a non-finite loss is caught on the device, its update skipped (lrm.train.guard); the run
stops with NonFiniteLossError at the next log point (at most `log_every` steps later) or
before anything is saved, so the model and the checkpoints keep their last good state.
Deterministic on CPU: generators are seeded per step, tables are initialized independently
of the plan, and a resume seeks the data to the checkpointed position, so it reproduces the
uninterrupted run bit for bit.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torchrec.distributed.types import ShardingPlan

from lrm.checkpoint import CheckpointManager
from lrm.config import CheckpointConfig, LoaderConfig, ModelConfig, SplitConfig, TrainConfig
from lrm.data.batch import Batch
from lrm.data.schema import read_schema
from lrm.dist import Dist, intra_op_threads, loader_workers, process_group, quiet_libraries
from lrm.errors import ConfigError, DataError
from lrm.models import build_model
from lrm.progress import Reporter
from lrm.sharding import parallel
from lrm.train import schedule as schedules
from lrm.train.data import EpochStream, fit_tables, hashed_features, loaders, \
    model_hash_sizes, per_rank_batch, run_identity, scan_days, split_days
from lrm.train.early_stop import EarlyStopping
from lrm.train.evaluate import predict, score
from lrm.train.export import WEIGHTS, ModelCard, read_card, save_model
from lrm.train.graphs import graph_mlps
from lrm.train.guard import NonFiniteGuard, NonFiniteLossError
from lrm.train.meter import Meter
from lrm.train.precision import autocast
from lrm.train.state import TrainState, seed_step
from lrm.train.step_graph import EAGER_STEPS, GraphSteps, unsupported
from lrm.train.steps import LrSchedule, StepFn, Steps, compile_dense, dense_optimizer

log = logging.getLogger("lrm")
LogFn = Callable[[Mapping[str, float], int], None]
# (model, batch) -> (loss to minimize, serving-head log loss: what the meters report)
LossFn = Callable[[nn.Module, Batch], tuple[torch.Tensor, torch.Tensor]]
# model -> model, between building it and sharding it (e.g. lrm.fp8's dispatch)
Transform = Callable[[nn.Module], nn.Module]

__all__ = ["NonFiniteLossError", "TrainResult", "bce_loss", "train"]


def bce_loss(model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The default loss: log loss of the model's logits against the click labels."""
    loss = F.binary_cross_entropy_with_logits(model(batch).float(), batch.labels)
    return loss, loss


@dataclass
class TrainResult:
    steps: int  # optimizer steps of the whole run (including those before a resume)
    samples: int  # impressions of the whole run, all ranks
    samples_per_s: float  # this process's run: impressions / time in train steps
    eval: dict[str, Any]  # final held-out metrics (the same dict on every rank)
    history: list[dict[str, float]] = field(default_factory=list)  # rank 0's log points
    resumed_from: int | None = None  # step of the checkpoint resumed from
    checkpoint: Path | None = None  # the last checkpoint written
    out: Path | None = None  # the final model folder
    world_size: int = 1
    train_days: list[int] = field(default_factory=list)
    eval_day: int = -1
    schedule: dict[str, Any] = field(default_factory=dict)  # what the run took (lrm.train.schedule)
    validation: dict[str, Any] = field(default_factory=dict)  # best NE, its step, stopped early?

    def summary(self, kind: str) -> dict[str, Any]:
        """The run's metrics as a stage reports them (JSON-able)."""
        return {"kind": kind, "steps": self.steps, "samples": self.samples,
                "samples_per_s": self.samples_per_s, "world_size": self.world_size,
                "train_days": self.train_days, "eval_day": self.eval_day,
                "resumed_from": self.resumed_from, "eval": self.eval,
                "schedule": self.schedule, "validation": self.validation}


def train(kind: str, cfg: TrainConfig, model_cfg: ModelConfig, data: Path, *,
          split: SplitConfig | None = None, loader_cfg: LoaderConfig | None = None,
          checkpoint: CheckpointConfig | None = None, checkpoints: Path | None = None,
          resume: bool = False, out: Path | None = None, plan: ShardingPlan | None = None,
          transform: Transform | None = None, log_fn: LogFn | None = None,
          init_from: Path | None = None, loss_fn: LossFn = bce_loss,
          teacher_column: str | None = None, info: Mapping[str, Any] | None = None,
          new_data: bool = False, eval_from: Path | None = None) -> TrainResult:
    """Train a `kind` model on `data` (see the module docstring); rank 0 writes `out`.

    split: which days train and which is held out (default: every day but the last).
    checkpoints: the checkpoint folder (None: no checkpoints), saved per `checkpoint`;
    resume: start from its newest checkpoint (a fresh run clears the folder instead).
    plan: a torchrec ShardingPlan (None: lrm.sharding's default).
    transform: applied to the built model before sharding (e.g. FP8 dispatch).
    log_fn(metrics, step): called on rank 0 at every log point and eval (e.g. MLflow).
    init_from: a model folder whose weights start this run (a warm start: the optimizers
    start fresh, the tables keep its sizes; a checkpoint resumed from wins over it).
    loss_fn(model, batch) -> (loss, serving log loss); the held-out eval always scores
    `model(batch)`. teacher_column: read into `batch.teacher_logits` (augmented data).
    info: more entries for the saved model card's training summary.
    new_data: with resume, the checkpoint is of other data (the streaming flow's previous
    day): only the model and the optimizers come back; this run counts its own steps.
    eval_from: read the held-out day from this dataset instead of `data` (e.g. the held-out
    last slice of the train day, when the next day is not there yet).
    """
    quiet_libraries()
    split, loader_cfg = split or SplitConfig(), loader_cfg or LoaderConfig()
    data = Path(data)
    with process_group(cfg.device) as env, contextlib.ExitStack() as cleanup:
        workers = loader_workers(loader_cfg.num_workers, env.device)  # as loaders() takes
        torch.set_num_threads(intra_op_threads(cfg.threads, workers if loader_cfg.prefetch else 0))
        # -- the data decides: rows and CTR, hashed table sizes, the schedule ----------
        schema, _ = read_schema(data)
        train_days, eval_day = split_days(data, split, eval_from)
        fit = cfg.fit_tables and init_from is None  # a warm start keeps its tables (below)
        stats = scan_days(data, train_days, hashed_features(schema) if fit else (),
                          model_cfg.tables.hash_size)
        if init_from is not None:  # a warm start keeps the tables it starts from
            schema = read_card(Path(init_from)).schema
        else:
            schema = fit_tables(schema, stats)
        sched = schedules.plan(cfg, stats.rows, env.world_size)
        if env.is_main and sched.adapted:
            log.info("train %s: the schedule fits %d rows: %s", kind, stats.rows,
                     "; ".join(sched.adapted))
        if env.is_main and cfg.steps and sched.epochs > 1:  # literal steps: no validation
            log.warning("train %s: train.steps=%d is %d passes over the train days' %d rows "
                        "at batch %d, with no validation slice to stop at the best state; "
                        "repeated passes can overfit (leave train.steps at 0: the schedule "
                        "then fits the data and validates)", kind, cfg.steps, sched.epochs,
                        stats.rows, sched.batch_size)

        # -- build: model, sharding, optimizers, data -----------------------------------
        torch.manual_seed(cfg.seed)
        model = build_model(kind, schema, model_cfg, device="meta",  # type: ignore[arg-type]
                            dense_device=env.device)
        model.init_output_bias(stats.ctr)  # type: ignore[operator]
        sizes = model_hash_sizes(model)
        if transform is not None:
            model = transform(model)
        if cfg.compile:
            log.info("train %s: compiled %s", kind, compile_dense(model, env.device))
        elif cfg.cuda_graphs and (graphed := graph_mlps(
                model, per_rank_batch(sched.batch_size, env.world_size), env.device, cfg.amp)):
            log.info("train %s: CUDA graphs of %s", kind, graphed)
        dmp = parallel.shard(model, env, embedding_lr=cfg.embedding_lr, seed=cfg.seed,
                             plan=plan)
        if init_from is not None:
            _warm_start(dmp, Path(init_from), kind, model_cfg, sizes)
        guard = NonFiniteGuard(env, lambda step, value: _non_finite(kind, step, value, state,
                                                                     ckpt))
        dense_opt, adamw = dense_optimizer(dmp, cfg.lr, cfg.weight_decay)
        guard.gate(dmp, adamw)
        opt = parallel.optimizer(dmp, dense_opt)
        lrs = LrSchedule(opt)
        ld = loaders(data, sched.batch_size, train_days, eval_day, sched.val_batches,
                     loader_cfg, env, sizes, teacher_column, eval_from)
        assert ld.train_batches == sched.epoch_batches, (ld.train_batches, sched)
        state, stream = TrainState(guard=guard), EpochStream(ld.train, sched.epoch_batches)
        stopper = EarlyStopping(dmp, state, cfg.patience)

        # -- checkpoints: everything a resume needs is a stateful part -----------------
        parts = {"model": dmp, "optim": opt, "train": state, "data": stream}
        ckpt = None
        resumed_from = None
        if checkpoints is not None:
            ckpt = cleanup.enter_context(CheckpointManager(  # closed on every path
                checkpoints, env, checkpoint or CheckpointConfig(),
                run_identity(kind, model_cfg, sizes, cfg, sched.batch_size,
                             sched.epoch_batches, env, data, train_days, loader_cfg)))
            # AdamW's state is lazy: made (a dummy step) only when there is one to load
            resumed_from = ckpt.start(parts, resume, new_data=new_data,
                                      prepare=dense_opt.init_state)
            opt.zero_grad(set_to_none=True)
            guard.reset(state.step)
            stopper.resumed(state.step)

        # -- the loop ---------------------------------------------------------------
        total = sched.steps
        meter, history = Meter(env, cfg.ne_window), []
        reporter = Reporter(f"train {kind}", total=max(total - state.step, 0) * sched.batch_size,
                            unit="samples") if env.is_main else None
        sizes_seen: list[int] = [0]  # impressions of the step's batch (this rank)

        def log_point(point: dict[str, float]) -> None:
            if env.is_main:
                history.append({"step": state.step, **point})
                if log_fn is not None:
                    log_fn(point, state.step)

        def evaluate(max_batches: int | None, ci: bool = False) -> dict[str, Any]:
            ev = _evaluate(dmp, ld.held_out, env, max_batches=max_batches, ci=ci)
            log_point({f"eval_{k}": float(v) for k, v in ev.items() if _scalar(v)})
            return ev

        def validate() -> bool:
            """Score the validation slice; True when training should stop."""
            ev = _evaluate(dmp, ld.validation_batches(), env, max_batches=None)
            stop = stopper.update(ev["ne"], state.step)
            log_point({"val_ne": ev["ne"], "val_best_ne": state.best_ne})
            return stop

        def step_fn(b: Batch) -> tuple[torch.Tensor, None]:
            """The step the pipeline runs: forward and loss; it then runs the backward and
            the optimizer step (both gated by `ok`)."""
            with autocast(env.device, cfg.amp):
                loss, serving = loss_fn(dmp, b)
            ok = guard.watch(loss)
            meter.record(serving, b.labels, ok)
            sizes_seen[0] = b.size
            return loss, None

        steps = _steps(dmp, opt, env, step_fn, cfg, ld.train.windows, kind,
                       per_rank_batch(sched.batch_size, env.world_size),
                       max(sched.warmup - state.step, 0))
        stopped_early = False
        with contextlib.closing(iter(stream)) as it, \
                (reporter or contextlib.nullcontext(_Quiet())) as rep:
            meter.resume_clock()
            while state.step < total and not stopped_early:
                # a segment of steps up to the next evaluation: the pipeline drains at its end
                end = _next_pause(state.step, total, sched, cfg.eval_every)
                segment = islice(it, end - state.step)
                while state.step < end:
                    seed_step(cfg.seed, state.step, env.rank, env.device)
                    lrs.set(sched.lr_factor(state.step))
                    if not steps.step(segment):
                        raise DataError(data, None, None, "the train days hold fewer batches "
                                        "than the schedule counted (changed while training?)")
                    state.step += 1
                    state.samples += sizes_seen[0] * env.world_size
                    stream.advance()
                    meter.tick(sizes_seen[0])
                    rep.update(sizes_seen[0] * env.world_size)
                    logs = state.step % cfg.log_every == 0 or state.step == total
                    if logs:  # the host reads the device's values here only
                        guard.check()
                        log_point(point := meter.point())
                        rep.update(0, loss=point["loss"], ne=point["ne_window"])
                    if ckpt is not None and ckpt.step(state.step, parts):  # checks the guard
                        meter.resume_clock()
                steps.pause()
                if state.step == total:
                    break
                guard.check()
                if sched.validates_at(state.step):
                    stopped_early = validate()
                if cfg.eval_every and state.step % cfg.eval_every == 0:
                    evaluate(cfg.eval_batches or None)
                meter.resume_clock()
            if stopped_early:
                log.info("train %s: validation NE has not improved for %d validations; "
                         "stopped at step %d of %d", kind, cfg.patience, state.step, total)
        guard.check()

        # -- finish: checkpoint, the best state, final eval, model ----------------------
        if ckpt is not None:  # the run's own last state: a resume with more steps goes on
            ckpt.finish(state.step, parts)  # from it exactly as an uninterrupted run would
        if sched.val_batches and not stopped_early:
            validate()  # the final state competes too
        restored = stopper.restore(state.step) if sched.val_batches else None
        if restored is not None:
            log.info("train %s: restored the state of step %d (validation NE %.5f)", kind,
                     restored, state.best_ne)
        final = evaluate(None, ci=True)
        weights = parallel.full_state_dict(dmp, env)
        validation = {"best_ne": state.best_ne if math.isfinite(state.best_ne) else None,
                      "best_step": state.best_step, "stopped_early": stopped_early,
                      "restored": restored}
        if env.is_main and out is not None:
            assert weights is not None
            info = {"steps": state.step, "samples": state.samples, "train_days": train_days,
                    "eval_day": eval_day, "eval": final, "world_size": env.world_size,
                    "batch_size": sched.batch_size, "recd": loader_cfg.recd,
                    "loader_workers": workers,
                    "schedule": sched.summary(), "validation": validation,
                    "init_from": str(init_from) if init_from else None, **(info or {})}
            save_model(Path(out), ModelCard(kind=kind, schema=schema, model=model_cfg,
                                            hash_sizes=sizes, info=info), weights)
        env.barrier()
        return TrainResult(
            steps=state.step, samples=state.samples, samples_per_s=meter.samples_per_s,
            eval=final, history=history, resumed_from=resumed_from,
            checkpoint=ckpt.last if ckpt else None,
            out=Path(out) if out is not None else None, world_size=env.world_size,
            train_days=train_days, eval_day=eval_day, schedule=sched.summary(),
            validation=validation)


def _steps(dmp: nn.Module, opt: torch.optim.Optimizer, env: Dist, step_fn: StepFn,
           cfg: TrainConfig, windows: bool, kind: str, batch: int,
           warmup_left: int) -> Steps | GraphSteps:
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


def _warm_start(dmp: nn.Module, path: Path, kind: str, model_cfg: ModelConfig,
                sizes: dict[str, int]) -> None:
    """Load a saved model's weights (plain tensors) into the sharded model."""
    card = read_card(path)
    if card.kind != kind or card.model != model_cfg or card.hash_sizes != sizes:
        raise ConfigError(f"init_from {path}: a {card.kind} with another config or table "
                          f"sizes than this {kind}; it cannot start this run")
    weights = torch.load(path / WEIGHTS, map_location="cpu", weights_only=True)
    dmp.load_state_dict(dict(weights))  # DMP renames the keys of the dict it is given
    log.info("started from the weights of %s", path)


def _evaluate(model: nn.Module, batches: Iterable[Batch], env: Dist, *,
              max_batches: int | None, ci: bool = False) -> dict[str, Any]:
    """Score every rank's share of `batches`; the metrics on every rank. In float32 also
    where the steps train under bf16 autocast: the NE that validation compares, the card
    records and the registry judges is the saved model's (bf16 moved it by 1e-4 to 4e-4
    on an H100), the same as `lrm evaluate` of that model gives."""
    logits, labels = predict(model, batches, env.device, max_batches=max_batches)
    all_logits, all_labels = env.gather_cat(logits), env.gather_cat(labels)
    result = score(all_logits, all_labels, ci=ci) if env.is_main else None
    return env.broadcast(result)  # type: ignore[return-value]


def _non_finite(kind: str, step: int, value: float, state: TrainState,
                ckpt: CheckpointManager | None) -> str:
    here = value if not math.isfinite(value) else "finite here, not on every rank"
    last = (ckpt.last if ckpt else None) or "none"
    return (f"train {kind}: the loss is not finite ({here}) at step {step} (its update was "
            f"skipped; stopped at step {state.step}). Last good checkpoint: {last}. Check "
            f"the data (NaN/inf dense values) or lower train.lr / train.embedding_lr, then "
            f"--resume")


class _Quiet:
    """The Reporter interface for ranks other than 0."""

    def update(self, n: float = 1, **stats: float) -> None:
        pass

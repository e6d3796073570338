"""The training loop: one process or `torchrun --nproc_per_node=N`, CPU (gloo) or GPU (nccl).

    build the model (tables on meta) -> shard it (DMP) -> fused Adagrad + AdamW
    -> [resume from the latest checkpoint] -> for each batch: forward, loss, backward, step
    -> every log_every steps: loss, windowed NE, samples/s (progress, log_fn)
    -> every eval_every steps: NE/AUC on the held-out day; every checkpoint_every: DCP save
    -> final eval, final checkpoint, unsharded model to `out` (rank 0)

The loss is `loss_fn(model, batch)` (default: log loss of the logits; ExFM passes its
distillation loss, lrm.exfm.distill); `init_from` warm-starts from a saved model folder.
A step consumes the same impressions whatever the number of processes (lrm.train.data).
A non-finite loss stops every rank before the update (the model and the checkpoints keep
their last good state) with NonFiniteLossError. Deterministic on CPU: generators are
seeded per step, tables are initialized independently of the plan, and a resume skips
the batches already consumed, so it reproduces the uninterrupted run bit for bit.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torchrec.distributed.types import ShardingPlan
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper

from lrm.config import LoaderConfig, ModelConfig, TrainConfig
from lrm.data.loader import BatchLoader
from lrm.data.schema import read_schema
from lrm.data.batch import Batch
from lrm.errors import ConfigError, LrmError
from lrm.models import build_model
from lrm.progress import Reporter
from lrm.sharding import parallel
from lrm.checkpoint.dcp import Checkpointer
from lrm.train.data import epochs_from, loaders, model_hash_sizes
from lrm.dist import Dist, intra_op_threads, process_group, quiet_libraries
from lrm.train.evaluate import autocast, predict, score
from lrm.train.export import WEIGHTS, ModelCard, read_card, save_model
from lrm.train.meter import Meter
from lrm.train.state import TrainState, seed_step

log = logging.getLogger("lrm")
LogFn = Callable[[Mapping[str, float], int], None]
# (model, batch) -> (loss to minimize, serving-head log loss: what the meters report)
LossFn = Callable[[nn.Module, Batch], tuple[torch.Tensor, torch.Tensor]]


def bce_loss(model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The default loss: log loss of the model's logits against the click labels."""
    loss = F.binary_cross_entropy_with_logits(model(batch).float(), batch.labels)
    return loss, loss


class NonFiniteLossError(LrmError):
    """The loss became NaN or infinite; training stopped before applying that step."""


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


@dataclass(frozen=True)
class Options:
    """train()'s keyword options (see its docstring)."""

    loader_cfg: LoaderConfig
    out: Path | None
    checkpoints: Path | None
    resume: bool
    plan: ShardingPlan | None
    log_fn: LogFn | None
    init_from: Path | None
    loss_fn: LossFn
    teacher_column: str | None


def train(kind: str, cfg: TrainConfig, model_cfg: ModelConfig, data: Path, *,
          loader_cfg: LoaderConfig | None = None, out: Path | None = None,
          checkpoints: Path | None = None, resume: bool = False,
          plan: ShardingPlan | None = None, log_fn: LogFn | None = None,
          init_from: Path | None = None, loss_fn: LossFn = bce_loss,
          teacher_column: str | None = None) -> TrainResult:
    """Train a `kind` model on `data` (see the module docstring); rank 0 writes `out`.

    checkpoints: folder of step-N/ DCP checkpoints (None: no checkpoints); resume: start
    from its latest complete checkpoint (a fresh run clears the folder instead).
    plan: a torchrec ShardingPlan (None: the planner's default, see lrm.sharding.parallel).
    log_fn(metrics, step): called on rank 0 at every log point and eval (e.g. MLflow).
    init_from: a model folder (lrm.train.export) whose weights start this run (a warm
    start: the optimizers start fresh; a checkpoint resumed from wins over it).
    loss_fn(model, batch) -> (loss, serving log loss): e.g. ExFM's distillation loss;
    the held-out eval always scores `model(batch)`.
    teacher_column: read into `batch.teacher_logits` for training (augmented data).
    """
    quiet_libraries()
    loader_cfg = loader_cfg or LoaderConfig()
    loader_threads = loader_cfg.num_workers if loader_cfg.prefetch else 0
    torch.set_num_threads(intra_op_threads(cfg.threads, loader_threads))
    opts = Options(loader_cfg, out, checkpoints, resume, plan, log_fn,
                   Path(init_from) if init_from is not None else None, loss_fn,
                   teacher_column)
    with process_group(cfg.device) as env:
        return _train(env, kind, cfg, model_cfg, Path(data), opts)


def _train(env: Dist, kind: str, cfg: TrainConfig, model_cfg: ModelConfig, data: Path,
           opts: Options) -> TrainResult:
    loader_cfg, out, log_fn = opts.loader_cfg, opts.out, opts.log_fn
    # -- build: model, sharding, optimizers, data ---------------------------------------
    torch.manual_seed(cfg.seed)
    schema, _ = read_schema(data)
    model = build_model(kind, schema, model_cfg, device="meta",  # type: ignore[arg-type]
                        dense_device=env.device)
    sizes = model_hash_sizes(model)
    dmp = parallel.shard(model, env, embedding_lr=cfg.embedding_lr, seed=cfg.seed,
                         plan=opts.plan)
    if opts.init_from is not None:
        _warm_start(dmp, opts.init_from, kind, model_cfg, sizes)
    dense_opt = parallel.dense_optimizer(dmp, cfg.lr, cfg.weight_decay)
    opt = parallel.optimizer(dmp, dense_opt)
    train_data, eval_data, train_days, eval_day = loaders(data, cfg, loader_cfg, env, sizes,
                                                          opts.teacher_column)
    total = cfg.steps or cfg.epochs * len(train_data)

    # -- state: fresh, or the latest checkpoint ------------------------------------------
    state = TrainState(batch_size=train_data.batch_size, world_size=env.world_size,
                       steps_per_epoch=len(train_data), seed=cfg.seed)
    ckpt = Checkpointer(opts.checkpoints, env, cfg.keep_checkpoints) if opts.checkpoints \
        else None

    def full_state() -> dict[str, Any]:
        return {"model": dmp.state_dict(), "optim": opt.state_dict(),
                "train": state.state_dict()}

    resumed_from = None
    if ckpt is not None and opts.resume:
        state, resumed_from = _restore(ckpt, dmp, dense_opt, opt, state)
    elif ckpt is not None:
        ckpt.clear()
    last_ckpt = ckpt.latest() if ckpt else None
    saved_at = state.step if resumed_from is not None else -1  # step of last_ckpt

    # -- the loop -------------------------------------------------------------------------
    meter, history = Meter(env, cfg.ne_window), []
    reporter = Reporter(f"train {kind}", total=max(total - state.step, 0) * cfg.batch_size,
                        unit="samples") if env.is_main else None

    def log_point(point: dict[str, float]) -> None:
        if env.is_main:
            history.append({"step": state.step, **point})
            if log_fn is not None:
                log_fn(point, state.step)

    def evaluate(max_batches: int | None) -> dict[str, Any]:
        ev = _evaluate(dmp, eval_data, env, amp=cfg.amp, max_batches=max_batches)
        log_point({f"eval_{k}": float(v) for k, v in ev.items()})
        return ev

    with contextlib.closing(epochs_from(train_data, state.step)) as batches, \
            (reporter or contextlib.nullcontext(_Quiet())) as rep:
        meter.resume_clock()
        for b in islice(batches, max(total - state.step, 0)):
            seed_step(cfg.seed, state.step, env.rank)
            b = b.to(env.device, non_blocking=True)
            with autocast(env.device, cfg.amp):
                loss, serving = opts.loss_fn(dmp, b)
            value = loss.item()
            if env.any(not math.isfinite(value)):  # every rank stops, before the update
                raise _non_finite(kind, value, state, ckpt)
            serving_value = value if serving is loss else serving.item()
            opt.zero_grad(set_to_none=True)
            loss.backward()  # the tables' fused row-wise Adagrad runs inside the backward
            opt.step()  # AdamW on the dense part
            state.step += 1
            state.samples += b.size * env.world_size
            meter.step(serving_value, b.labels)
            rep.update(b.size * env.world_size, loss=serving_value)

            if state.step % cfg.log_every == 0 or state.step == total:
                log_point(point := meter.point())
                rep.update(0, ne=point["ne_window"])
            if cfg.eval_every and state.step % cfg.eval_every == 0 and state.step < total:
                evaluate(cfg.eval_batches or None)
                meter.resume_clock()
            if ckpt and cfg.checkpoint_every and state.step % cfg.checkpoint_every == 0:
                last_ckpt, saved_at = ckpt.save(state.step, full_state()), state.step
                meter.resume_clock()

    # -- finish: final eval, checkpoint, model ------------------------------------------
    final = evaluate(None)
    if ckpt is not None and saved_at != state.step:
        last_ckpt = ckpt.save(state.step, full_state())
    weights = parallel.full_state_dict(dmp, env)
    if env.is_main and out is not None:
        assert weights is not None
        info = {"steps": state.step, "samples": state.samples, "train_days": train_days,
                "eval_day": eval_day, "eval": final, "world_size": env.world_size,
                "batch_size": cfg.batch_size, "dedup": loader_cfg.dedup,
                "init_from": str(opts.init_from) if opts.init_from else None}
        save_model(Path(out), ModelCard(kind=kind, schema=schema, model=model_cfg,
                                        hash_sizes=sizes, info=info), weights)
    env.barrier()
    return TrainResult(
        steps=state.step, samples=state.samples, samples_per_s=meter.samples_per_s,
        eval=final, history=history, resumed_from=resumed_from, checkpoint=last_ckpt,
        out=Path(out) if out is not None else None, world_size=env.world_size,
        train_days=train_days, eval_day=eval_day)


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


def _restore(ckpt: Checkpointer, dmp: nn.Module, dense_opt: KeyedOptimizerWrapper,
             opt: CombinedOptimizer, state: TrainState) -> tuple[TrainState, int | None]:
    """Load the latest complete checkpoint into the model, optimizers and state."""
    ckpt.discard_incomplete()
    latest = ckpt.latest()
    if latest is None:
        log.info("no checkpoint in %s: starting from scratch", ckpt.root)
        return state, None
    dense_opt.init_state()  # AdamW's state is lazy: create it so DCP can load into it
    sd = {"model": dmp.state_dict(), "optim": opt.state_dict(), "train": state.state_dict()}
    ckpt.load(sd, latest)
    dmp.load_state_dict(sd["model"])
    opt.load_state_dict(sd["optim"])
    opt.zero_grad(set_to_none=True)
    saved = TrainState.from_state_dict(sd["train"])
    state.check_resume(saved, str(latest))
    log.info("resumed from %s (step %d)", latest, saved.step)
    return saved, saved.step


def _evaluate(model: nn.Module, loader: BatchLoader, env: Dist, *, amp: bool,
              max_batches: int | None) -> dict[str, Any]:
    """Score every rank's share of the held-out day; the metrics on every rank."""
    logits, labels = predict(model, loader, env.device, amp=amp, max_batches=max_batches)
    all_logits, all_labels = env.gather_cat(logits), env.gather_cat(labels)
    result = score(all_logits, all_labels) if env.is_main else None
    return env.broadcast(result)  # type: ignore[return-value]


def _non_finite(kind: str, value: float, state: TrainState,
                ckpt: Checkpointer | None) -> NonFiniteLossError:
    here = value if not math.isfinite(value) else "finite here, not on every rank"
    last = (ckpt.latest() if ckpt else None) or "none"
    return NonFiniteLossError(
        f"train {kind}: the loss is not finite ({here}) at step {state.step} (epoch "
        f"{state.epoch}); stopped before applying it. Last good checkpoint: {last}. Check "
        f"the data (NaN/inf dense values) or lower train.lr / train.embedding_lr, then "
        f"--resume")


class _Quiet:
    """The Reporter interface for ranks other than 0."""

    def update(self, n: float = 1, **stats: float) -> None:
        pass

"""The training loop: one process or `torchrun --nproc_per_node=N`, CPU (gloo) or GPU (nccl).

    build the model (tables on meta) -> [transform it] -> shard it (DMP)
    -> fused Adagrad (tables) + AdamW (dense) -> [resume: lrm.checkpoint]
    -> for each batch: forward, loss, backward, step
    -> every log_every steps: loss, windowed NE, samples/s (progress, log_fn)
    -> every eval_every steps: NE/AUC on the held-out day; the checkpoint manager each step
    -> final eval, final checkpoint, unsharded model to `out` (rank 0)

The loss is `loss_fn(model, batch)` (default: log loss of the logits; ExFM passes its
distillation loss, lrm.exfm.distill); `init_from` warm-starts from a saved model folder.
A step consumes the same impressions whatever the number of processes (lrm.train.data).
A non-finite loss stops every rank before the update (the model and the checkpoints keep
their last good state) with NonFiniteLossError. Deterministic on CPU: generators are
seeded per step, tables are initialized independently of the plan, and a resume seeks the
data to the checkpointed position, so it reproduces the uninterrupted run bit for bit.
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

from lrm.checkpoint import CheckpointManager
from lrm.config import CheckpointConfig, LoaderConfig, ModelConfig, SplitConfig, TrainConfig
from lrm.data.batch import Batch
from lrm.data.loader import BatchLoader
from lrm.data.schema import read_schema
from lrm.dist import Dist, intra_op_threads, process_group, quiet_libraries
from lrm.errors import ConfigError, LrmError
from lrm.models import build_model
from lrm.progress import Reporter
from lrm.sharding import parallel
from lrm.train.data import EpochStream, loaders, model_hash_sizes, run_identity
from lrm.train.evaluate import autocast, predict, score
from lrm.train.export import WEIGHTS, ModelCard, read_card, save_model
from lrm.train.meter import Meter
from lrm.train.state import TrainState, seed_step

log = logging.getLogger("lrm")
LogFn = Callable[[Mapping[str, float], int], None]
# (model, batch) -> (loss to minimize, serving-head log loss: what the meters report)
LossFn = Callable[[nn.Module, Batch], tuple[torch.Tensor, torch.Tensor]]
# model -> model, between building it and sharding it (e.g. lrm.fp8's dispatch)
Transform = Callable[[nn.Module], nn.Module]


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

    def summary(self, kind: str) -> dict[str, Any]:
        """The run's metrics as a stage reports them (JSON-able)."""
        return {"kind": kind, "steps": self.steps, "samples": self.samples,
                "samples_per_s": self.samples_per_s, "world_size": self.world_size,
                "train_days": self.train_days, "eval_day": self.eval_day,
                "resumed_from": self.resumed_from, "eval": self.eval}


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
    start fresh; a checkpoint resumed from wins over it).
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
    torch.set_num_threads(intra_op_threads(cfg.threads,
                                           loader_cfg.num_workers if loader_cfg.prefetch else 0))
    data = Path(data)
    with process_group(cfg.device) as env, contextlib.ExitStack() as cleanup:
        # -- build: model, sharding, optimizers, data -----------------------------------
        torch.manual_seed(cfg.seed)
        schema, _ = read_schema(data)
        model = build_model(kind, schema, model_cfg, device="meta",  # type: ignore[arg-type]
                            dense_device=env.device)
        sizes = model_hash_sizes(model)
        if transform is not None:
            model = transform(model)
        dmp = parallel.shard(model, env, embedding_lr=cfg.embedding_lr, seed=cfg.seed,
                             plan=plan)
        if init_from is not None:
            _warm_start(dmp, Path(init_from), kind, model_cfg, sizes)
        dense_opt = parallel.dense_optimizer(dmp, cfg.lr, cfg.weight_decay)
        opt = parallel.optimizer(dmp, dense_opt)
        train_data, eval_data, train_days, eval_day = loaders(
            data, cfg, split, loader_cfg, env, sizes, teacher_column, eval_from)
        total = cfg.steps or cfg.epochs * len(train_data)
        state, stream = TrainState(), EpochStream(train_data)

        # -- checkpoints: everything a resume needs is a stateful part -----------------
        parts = {"model": dmp, "optim": opt, "train": state, "data": stream}
        ckpt = None
        if checkpoints is not None:
            ckpt = cleanup.enter_context(CheckpointManager(  # closed on every path
                checkpoints, env, checkpoint or CheckpointConfig(),
                run_identity(kind, model_cfg, sizes, cfg, env, data, train_days, loader_cfg)))
            # AdamW's state is lazy: made (a dummy step) only when there is one to load
            resumed_from = ckpt.start(parts, resume, new_data=new_data,
                                      prepare=dense_opt.init_state)
            opt.zero_grad(set_to_none=True)
        else:
            resumed_from = None

        # -- the loop ---------------------------------------------------------------
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

        with contextlib.closing(iter(stream)) as batches, \
                (reporter or contextlib.nullcontext(_Quiet())) as rep:
            meter.resume_clock()
            for b in islice(batches, max(total - state.step, 0)):
                seed_step(cfg.seed, state.step, env.rank)
                b = b.to(env.device, non_blocking=True)
                with autocast(env.device, cfg.amp):
                    loss, serving = loss_fn(dmp, b)
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
                if ckpt is not None and ckpt.step(state.step, parts):
                    meter.resume_clock()

        # -- finish: final eval, checkpoint, model --------------------------------------
        final = evaluate(None)
        if ckpt is not None:
            ckpt.finish(state.step, parts)
        weights = parallel.full_state_dict(dmp, env)
        if env.is_main and out is not None:
            assert weights is not None
            info = {"steps": state.step, "samples": state.samples, "train_days": train_days,
                    "eval_day": eval_day, "eval": final, "world_size": env.world_size,
                    "batch_size": cfg.batch_size, "recd": loader_cfg.recd,
                    "init_from": str(init_from) if init_from else None, **(info or {})}
            save_model(Path(out), ModelCard(kind=kind, schema=schema, model=model_cfg,
                                            hash_sizes=sizes, info=info), weights)
        env.barrier()
        return TrainResult(
            steps=state.step, samples=state.samples, samples_per_s=meter.samples_per_s,
            eval=final, history=history, resumed_from=resumed_from,
            checkpoint=ckpt.last if ckpt else None,
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


def _evaluate(model: nn.Module, loader: BatchLoader, env: Dist, *, amp: bool,
              max_batches: int | None) -> dict[str, Any]:
    """Score every rank's share of the held-out day; the metrics on every rank."""
    logits, labels = predict(model, loader, env.device, amp=amp, max_batches=max_batches)
    all_logits, all_labels = env.gather_cat(logits), env.gather_cat(labels)
    result = score(all_logits, all_labels) if env.is_main else None
    return env.broadcast(result)  # type: ignore[return-value]


def _non_finite(kind: str, value: float, state: TrainState,
                ckpt: CheckpointManager | None) -> NonFiniteLossError:
    here = value if not math.isfinite(value) else "finite here, not on every rank"
    last = (ckpt.last if ckpt else None) or "none"
    return NonFiniteLossError(
        f"train {kind}: the loss is not finite ({here}) at step {state.step} (stopped "
        f"before applying it). Last good checkpoint: {last}. Check the data (NaN/inf dense "
        f"values) or lower train.lr / train.embedding_lr, then --resume")


class _Quiet:
    """The Reporter interface for ranks other than 0."""

    def update(self, n: float = 1, **stats: float) -> None:
        pass

"""A training run, put together in one place: the job.

Every place that trains (the train, teacher and student stages, the ExFM students day by day,
the stream's models) builds a `TrainJob` with `build_job` and runs it with
`lrm.train.train(job)`. The job holds everything the run needs: the model's kind and shape,
the training, split, loader and checkpoint configs, the data and the held-out data, the loss,
how the run starts, the sharding plan (resolved from its file by `build_job`) and the
model's transform.

Training knows nothing of its callers: what a kind of run adds, its caller hands the job.
FP8 is a transform applied between building the model and sharding it (lrm.fp8.dispatch,
like torchtitan's Float8 model converter, which no trainer component resolves); a job whose
`train.fp8` names a report is refused without one, so no caller can forget it. An ExFM
student (lrm.exfm.distill) hands its model shape, its loss, the teacher's column and the
parts it grows on a warm start.

How a run starts (`Start`):

    fresh    a new model (hashed tables fit the train days when train.fit_tables is on)
    warm     the weights and tables of a saved model folder (`init_from`), fresh optimizers
             (a model carried from day to day starts each day so: lrm.train.days)
    resume   the newest checkpoint of `checkpoints`, a run of this same data that stopped: it
             goes on where it stopped, bit for bit (none there: fresh)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from lrm.config import (
    MODEL_KINDS,
    CheckpointConfig,
    LoaderConfig,
    ModelConfig,
    SplitConfig,
    TrainConfig,
)
from lrm.data.batch import Batch
from lrm.errors import ConfigError

# (model, batch) -> (loss to minimize, serving-head log loss: what the meters report)
LossFn = Callable[[nn.Module, Batch], tuple[torch.Tensor, torch.Tensor]]
# model -> (the model, the names of the layers it converted), between building the model and
# sharding it (lrm.fp8.dispatch's FP8 transform)
Transform = Callable[[nn.Module], tuple[nn.Module, list[str]]]
Start = Literal["fresh", "warm", "resume"]
STARTS: tuple[Start, ...] = ("fresh", "warm", "resume")


@dataclass(frozen=True)
class Growth:
    """What a warm start may add to the model it starts from (an ExFM student's auxiliary head
    and adapter: lrm.exfm.distill): a saved model whose config `grow` turns into the job's
    starts it, its parameters under `prefixes` starting fresh."""

    prefixes: tuple[str, ...]
    grow: Callable[[ModelConfig], ModelConfig]


def bce_loss(model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The default loss: log loss of the model's logits against the click labels."""
    loss = F.binary_cross_entropy_with_logits(model(batch).float(), batch.labels)
    return loss, loss


@dataclass(frozen=True, kw_only=True)
class TrainJob:
    """What one training run needs (module docstring); made by `build_job`."""

    kind: str  # "student" | "teacher"
    train: TrainConfig
    model: ModelConfig  # tables, and the shape of `kind` (an ExFM student's heads included)
    data: Path  # the dataset whose split.days train
    split: SplitConfig = field(default_factory=SplitConfig)
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    checkpoints: Path | None = None  # the checkpoint folder (None: no checkpoints)
    start: Start = "fresh"
    init_from: Path | None = None  # warm: the model folder whose weights start the run
    eval_data: Path | None = None  # read the held-out day from here instead of `data`
    out: Path | None = None  # the final model folder (rank 0 writes it)
    plan: Any = None  # a torchrec ShardingPlan (None: lrm.sharding's default)
    transform: Transform | None = None  # the FP8 transform (lrm.fp8.dispatch; None: none)
    loss: LossFn = bce_loss
    teacher_column: str | None = None  # read into batch.teacher_logits (augmented data)
    growth: Growth | None = None  # what a warm start may add to its model (None: nothing)
    info: Mapping[str, Any] = field(default_factory=dict)  # more for the model card
    force: bool = False  # a fresh start may remove another run's checkpoints

    def __post_init__(self) -> None:
        if self.kind not in MODEL_KINDS:
            raise ConfigError(f"train: unknown model kind {self.kind!r}; one of {MODEL_KINDS}")
        if self.start not in STARTS:
            raise ConfigError(f"train: start {self.start!r} is not one of {STARTS}")
        if (self.start == "warm") != (self.init_from is not None):
            raise ConfigError("train: a warm start names the model folder it starts from "
                              "(init_from), and only a warm start does")
        if self.start == "resume" and self.checkpoints is None:
            raise ConfigError("train: a resume start needs the checkpoint folder it starts "
                              "from")
        if self.train.fp8 and self.transform is None:
            raise ConfigError(f"train.fp8: {self.train.fp8} names a probe report, but the job "
                              f"has no transform to apply it (hand build_job "
                              f"lrm.fp8.dispatch.transform(train.fp8, kind))")

    def but(self, **changes: Any) -> TrainJob:
        """This job with some fields changed (e.g. the next day's split and out)."""
        return dataclasses.replace(self, **changes)


def build_job(kind: str, *, train: TrainConfig, model: ModelConfig, data: Path,
              split: SplitConfig | None = None, loader: LoaderConfig | None = None,
              checkpoint: CheckpointConfig | None = None, checkpoints: Path | None = None,
              start: Start = "fresh", init_from: Path | None = None,
              eval_data: Path | None = None, out: Path | None = None,
              plan: Path | None = None, plan_entry: str | None = None,
              transform: Transform | None = None, loss: LossFn = bce_loss,
              teacher_column: str | None = None, growth: Growth | None = None,
              info: Mapping[str, Any] | None = None, force: bool = False) -> TrainJob:
    """The one way a training job is made.

    plan: a sharding plan file (stage shard_plan), its entry `plan_entry` (default: the
    kind) resolved to a torchrec plan for this model, data and device. transform: the FP8
    transform of `train.fp8` (lrm.fp8.dispatch.transform). loss, teacher_column, growth:
    what an ExFM student's variant trains with (lrm.exfm.distill.Distillation.job_args).
    """
    from lrm.sharding.plan import training_plan

    sharding = None if plan is None else training_plan(
        Path(plan), plan_entry or kind, kind=kind, model_cfg=model, data=Path(data),
        device=train.device)
    return TrainJob(kind=kind, train=train, model=model, data=Path(data),
                    split=split or SplitConfig(), loader=loader or LoaderConfig(),
                    checkpoint=checkpoint or CheckpointConfig(), checkpoints=checkpoints,
                    start=start, init_from=init_from, eval_data=eval_data, out=out,
                    plan=sharding, transform=transform, loss=loss,
                    teacher_column=teacher_column, growth=growth, info=dict(info or {}),
                    force=force)


__all__ = ["STARTS", "Growth", "LossFn", "Start", "TrainJob", "Transform", "bce_loss",
           "build_job"]

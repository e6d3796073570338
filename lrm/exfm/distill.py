"""ExFM's student loss: labels on the serving head, distillation on the auxiliary head.

For a batch with labels y and the teacher's logits t (augmented data):

    serving  = BCE(serving head, y)                          always
    target   = adapter(t, dense) if the adapter is on, else t     (detached: a label)
    distill  = BCE(aux head, sigmoid(target))   with the auxiliary head
             = BCE(serving head, sigmoid(target))   without it (plain distillation)
    adapter  = BCE(adapter(t, dense), y)                      the adapter learns from fresh labels
    loss     = serving + weight * distill + adapter

Each part switches off in `DistillConfig` for ablation: `distill: false` is the labels-only
student (loss == serving BCE), `aux_head: false` distills into the serving head,
`adapter: false` distills toward the raw teacher logit.

`ExFMLoss` is a training job's loss (lrm.train.job): (model, batch) -> (loss, serving log
loss); the second is what the loop's meters report as the training NE. `distillation(model,
cfg)` is everything a student of a variant hands `lrm.train.build_job`: its shape, its
loss, the teacher's column and the parts it grows on a warm start (training knows nothing
of ExFM).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lrm.config import DistillConfig, ModelConfig, StudentModelConfig
from lrm.data.batch import Batch
from lrm.exfm.augment import TEACHER_COLUMN
from lrm.models.exfm import ExFMStudent, StudentOutputs
from lrm.train.job import Growth

# the parts a student grows for its variant (lrm.models.exfm's module names): on a model
# without them (the labels-only days before) they start fresh, everything else from it
GROWN = ("aux_head.", "adapter.")


@dataclass
class LossParts:
    """The student loss and its parts (scalars; `distill`/`adapter` 0 when off)."""

    total: torch.Tensor
    serving: torch.Tensor
    distill: torch.Tensor
    adapter: torch.Tensor


def student_config(size: StudentModelConfig, cfg: DistillConfig) -> StudentModelConfig:
    """`size` with the parts `cfg` trains: an auxiliary head and/or an adapter."""
    return dataclasses.replace(size, aux_head=cfg.distill and cfg.aux_head,
                               adapter=cfg.distill and cfg.adapter)


@dataclass(frozen=True)
class Distillation:
    """What a student of one variant hands lrm.train.build_job."""

    model: ModelConfig  # the student's shape with the variant's heads and adapter
    loss: ExFMLoss
    teacher_column: str | None  # the teacher's logits in the data (None: labels only)
    growth: Growth  # a warm start from the model without those parts grows them


def distillation(model: ModelConfig, cfg: DistillConfig) -> Distillation:
    """The student `model` trained as variant `cfg` (module docstring)."""

    def grow(saved: ModelConfig) -> ModelConfig:
        return dataclasses.replace(saved, student=student_config(saved.student, cfg))

    return Distillation(model=grow(model), loss=ExFMLoss(cfg),
                        teacher_column=TEACHER_COLUMN if cfg.distill else None,
                        growth=Growth(GROWN, grow))


def distill_target(out: StudentOutputs, batch: Batch, cfg: DistillConfig) -> torch.Tensor:
    """The distillation target logit, detached: the adapter's output, or the teacher's logit."""
    if cfg.adapter:
        if out.adapter is None:
            raise ValueError("distill.adapter is on but the model has no adapter")
        return out.adapter.detach()
    if batch.teacher_logits is None:
        raise ValueError("distillation needs batch.teacher_logits (augmented data)")
    return batch.teacher_logits.detach().float()


def exfm_loss(out: StudentOutputs, batch: Batch, cfg: DistillConfig) -> LossParts:
    """The student loss of one batch (module docstring)."""
    y = batch.labels.float()
    serving = F.binary_cross_entropy_with_logits(out.serving.float(), y)
    zero = serving.new_zeros(())
    distill = adapter = zero
    if cfg.distill:
        soft = torch.sigmoid(distill_target(out, batch, cfg))
        if cfg.aux_head:
            if out.aux is None:
                raise ValueError("distill.aux_head is on but the model has no auxiliary head")
            head = out.aux
        else:
            head = out.serving
        distill = F.binary_cross_entropy_with_logits(head.float(), soft)
        if cfg.adapter:
            assert out.adapter is not None
            adapter = F.binary_cross_entropy_with_logits(out.adapter, y)
    total = serving + cfg.weight * distill + adapter
    return LossParts(total=total, serving=serving, distill=distill, adapter=adapter)


class ExFMLoss:
    """A training job's loss (lrm.train.job): (model, batch) -> (loss, serving log loss).

    Labels only and distillation on the serving head call the model plainly (any student
    works); with an auxiliary head or an adapter it calls `model(batch, all_heads=True)`
    (an ExFMStudent, possibly wrapped by DMP, whose forward passes the keyword on).
    """

    def __init__(self, cfg: DistillConfig) -> None:
        self.cfg = cfg
        self.last: LossParts | None = None  # the parts of the latest batch, for logging

    def outputs(self, model: nn.Module, batch: Batch) -> StudentOutputs:
        c = self.cfg
        if not (c.distill and (c.aux_head or c.adapter)):  # the serving head is all it needs
            return StudentOutputs(serving=model(batch), aux=None, adapter=None)
        inner = getattr(model, "module", model)  # DMP's (and DDP's) unwrapped module
        if not isinstance(inner, ExFMStudent):
            raise TypeError(f"distillation needs an ExFM student, got {type(inner).__name__} "
                            "(build it with student_config(size, distill_config))")
        return model(batch, all_heads=True)

    def __call__(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        parts = exfm_loss(self.outputs(model, batch), batch, self.cfg)
        self.last = parts
        return parts.total, parts.serving

"""The schedule a run takes, fitted to its data: batch size, epochs, steps, validation, warm-up.

TrainConfig states what the user wants; on a small dataset the literal values fail (7,200
Criteo rows at batch 2048 are 3 optimizer steps, and the model ends worse than the base
rate), so the schedule adapts:

* enough optimizer steps (runs given in epochs): when the epochs at `batch_size` make fewer
  than `fit_steps` steps, the batch shrinks (to a multiple of the world size, not below
  `min_batch_size`): a log of 200k impressions trains in 500 steps of ~400, not 100 of
  2048 (measured: NE 0.928 -> 0.912 on such a log, README); and when even at
  `min_batch_size` a run takes fewer than `min_steps`, the epochs grow (tiny data only: more
  passes measured worse wherever one pass gave enough steps);
* a validation slice, when the run passes over the train days more than once: the last
  `val_fraction` of their batches (at most `val_max_rows` impressions) is held out of the
  passes and scored every `val_every` steps (0: ten times an epoch); training stops after
  `patience` validations without a better NE and the best state is restored
  (lrm.train.early_stop). A single pass never sees a row twice, so it cannot overfit by
  repetition and its windowed train NE is already a held-out NE (progressive validation):
  there a slice would only cost data (measured on the Criteo sample: the teacher's NE
  0.908 with all rows, 0.921 with a tenth held out);
* the tail (`val_tail`, on): the slice is the newest rows of a log in time order, the rows
  most like the next day, so once the best state is back the train days from it on train
  once, in time order, up to the newest row: the slice, and where the best state came
  before the end of the first pass, the rows after it too (it never saw them). Early
  stopping still chooses how long the passes run; the run ends having learnt from every
  row, the newest last. Measured on MovieLens 100K (day 9 held out, trained on days 0-8,
  4 seeds, 2 cores of an Intel Xeon): two passes scored 0.9002 (student) / 0.9082
  (teacher) with the slice never trained, 0.8900 / 0.8976 with the tail; three passes
  (student) 0.8997 -> 0.8902; one pass, the default, 0.8857 / 0.8959. On ml-latest-small
  (the same cut, seeds 0-1), whose newest rows are years after the rest, the slice stopped
  two passes at step 24 of 498: 1.0040 / 0.9959 never trained, 0.9078 / 0.9040 with the
  tail (one pass 0.9086 / 0.9054). The other designs,
  same seeds: re-running the chosen steps from scratch on every row scored 0.9181 (where
  the best state came within the first pass, fewer steps than a pass: the newest rows
  again untrained), and at least a pass of them 0.8874 / 0.8971 (three passes 0.8917),
  level with the tail at twice the training; validating on an interleaved tenth of the
  batches instead of the newest (never trained either) 0.8963 / 0.9093; the slice alone
  after the best state, not the first pass's rows after it, 0.8951 / 0.8987;
* warm-up: the learning rates of both optimizers ramp linearly over the first
  `warmup_steps` steps (at most a tenth of an epoch).

`steps` > 0 is taken literally: the batch size is then the user's, and there is no
validation slice (nor tail). Nothing but the run's length depends on `steps`, so a run cut
short and resumed with more steps goes on exactly as the longer run would have.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from lrm.config import TrainConfig


@dataclass(frozen=True)
class Schedule:
    batch_size: int  # impressions per step over all ranks
    epoch_batches: int  # train batches per rank in an epoch (= its steps)
    val_batches: int  # validation batches per rank after them (0: no validation)
    steps: int  # optimizer steps of the run
    epochs: int  # passes over the train batches (the last may be partial)
    val_every: int  # steps between validations (0: none)
    warmup: int  # steps of linear learning-rate warm-up
    # the tail: steps over the validation slice once the best state is back, at least
    # (lrm.train.loop: more where the best state came within the first pass; 0: none)
    tail: int = 0
    adapted: tuple[str, ...] = ()  # what the data changed, in words (for the log)

    def lr_factor(self, step: int) -> float:
        """The learning-rate multiplier of the step after `step` steps."""
        return min(1.0, (step + 1) / self.warmup) if self.warmup else 1.0

    def validates_at(self, step: int) -> bool:
        return bool(self.val_batches and self.val_every) and step % self.val_every == 0

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        d["adapted"] = list(self.adapted)
        return d


def _split(batches: int, batch_size: int, cfg: TrainConfig) -> int:
    """Validation batches (per rank) out of `batches` per rank; 0 when there are too few."""
    if cfg.val_fraction <= 0 or batches < 2:
        return 0
    cap = max(1, cfg.val_max_rows // batch_size)
    return max(1, min(round(batches * cfg.val_fraction), cap, batches - 1))


def plan(cfg: TrainConfig, rows: int, world_size: int) -> Schedule:
    """The schedule of a run over `rows` train-day impressions on `world_size` ranks."""
    adapted: list[str] = []
    batch, epochs = cfg.batch_size, cfg.epochs
    target = max(cfg.fit_steps, cfg.min_steps)
    if cfg.steps == 0 and target:
        train_rows = rows * (1 - cfg.val_fraction) if epochs > 1 else rows
        if epochs * int(train_rows // batch) < target:
            floor = max(cfg.min_batch_size, world_size)
            fit = int(epochs * train_rows // target) // world_size * world_size
            new = min(batch, max(fit, floor // world_size * world_size))
            if new != batch:
                adapted.append(f"batch {batch} -> {new} (about {target} steps over {rows} "
                               f"rows)")
                batch = new
            per_epoch = int(train_rows // batch)
            if per_epoch and epochs * per_epoch < cfg.min_steps:
                more = math.ceil(cfg.min_steps / per_epoch)
                adapted.append(f"epochs {epochs} -> {more} (batch {batch} is the floor)")
                epochs = more
    # a step: one batch of batch_size / W on every rank; the loader cuts the stream into
    # such batches (dropping the last partial one) and deals them out round-robin
    per_rank = rows // (batch // world_size) // world_size  # = steps an epoch
    val = _split(per_rank, batch, cfg) if cfg.steps == 0 and epochs > 1 else 0
    epoch_batches = max(per_rank - val, 0)
    steps = cfg.steps or epochs * epoch_batches
    val_every = (cfg.val_every or max(1, epoch_batches // 10)) if val else 0
    warmup = min(cfg.warmup_steps, epoch_batches // 10)
    return Schedule(batch_size=batch, epoch_batches=epoch_batches, val_batches=val,
                    steps=steps, epochs=math.ceil(steps / epoch_batches) if epoch_batches
                    else 0, val_every=val_every, warmup=warmup,
                    tail=val if cfg.val_tail else 0, adapted=tuple(adapted))


def can_step(cfg: TrainConfig, rows: int, world_size: int = 1) -> bool:
    """Whether a run over `rows` train impressions takes a step at the smallest batch its
    schedule takes, as a model's first run (fitted to the data) and as a day a model is
    carried over (lrm.train.days: not fitted) alike. The one rule of "too small to train
    on": a day of a log, a surface's day, a stream's new file."""
    return all(plan(t, rows, world_size).epoch_batches >= 1
               for t in (cfg, replace(cfg, fit_steps=0)))

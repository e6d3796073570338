"""The train state a checkpoint carries beside the model, optimizers and data position, and
the per-step seeding that makes a resumed run draw what the uninterrupted one drew."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import torch


class Check(Protocol):
    def check(self) -> None: ...


@dataclass
class TrainState:
    step: int = 0  # optimizer steps taken
    samples: int = 0  # impressions trained on, over all ranks
    best_ne: float = math.inf  # the lowest validation NE so far (lrm.train.early_stop)
    best_step: int = -1  # the step it was measured at (-1: none yet)
    stale: int = 0  # validations since the best
    validated_at: int = -1  # the step of the last validation (-1: none yet)
    # the step at which the validation slice began to train, the best state back (-1: not
    # yet; lrm.train.schedule's tail): a run resumed after it goes on with that pass
    tail_from: int = -1
    tail_batch: int = -1  # the batch of the train days that pass began at
    # checked before the state is saved (not state itself): lrm.train.guard, so that no
    # checkpoint holds a state past a step whose loss was not finite
    guard: Check | None = field(default=None, repr=False, compare=False)

    def _names(self) -> list[str]:
        return [f.name for f in fields(self) if f.name != "guard"]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every field as a tensor (checkpoints hold tensors; nothing is unpickled)."""
        if self.guard is not None:
            self.guard.check()
        return {k: torch.tensor(getattr(self, k), dtype=torch.float64 if k == "best_ne"
                                else torch.int64) for k in self._names()}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        for k in self._names():
            if k in sd:  # a checkpoint from before a field existed keeps its default
                setattr(self, k, float(sd[k]) if k == "best_ne" else int(sd[k]))


def seed_step(seed: int, step: int, rank: int, device: torch.device | None = None) -> None:
    """Seed the generators a step draws from, the CPU's and `device`'s, from (seed, step,
    rank): a resumed run draws what the uninterrupted one drew, with no generator state in
    the checkpoint. (Not `torch.manual_seed`, which seeds every backend torch knows of:
    150-170 us a call on a 2-core CPU against 4 us, and a graphed step on an H100 is
    under 1 ms.)"""
    h = hashlib.blake2b(f"{seed}:{step}:{rank}".encode(), digest_size=8).digest()
    s = int.from_bytes(h, "little") & ((1 << 63) - 1)
    torch.default_generator.manual_seed(s)
    if device is not None and device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda.default_generators[index].manual_seed(s)

"""The train state a checkpoint carries beside the model, optimizers and data position, and
the per-step seeding that makes a resumed run draw what the uninterrupted one drew."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch


class _Ints:
    """state_dict / load_state_dict for a dataclass of ints."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every field as an int64 tensor (checkpoints hold tensors; nothing is unpickled)."""
        return {k: torch.tensor(v, dtype=torch.int64)
                for k, v in asdict(self).items()}  # type: ignore[call-overload]

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        for f in fields(self):  # type: ignore[arg-type]
            setattr(self, f.name, int(sd[f.name]))


@dataclass
class TrainState(_Ints):
    step: int = 0  # optimizer steps taken
    samples: int = 0  # impressions trained on, over all ranks


@dataclass
class Segment(_Ints):
    """A streaming run's pass over its data (a day): which data, and the step it began at.

    A resume on the same data goes on where it stopped; one on other data (the next day)
    keeps the model and optimizer state and begins a new pass at the current step.
    """

    key: int = 0  # `data_key` of the pass's train data (0: none yet)
    start: int = 0  # the optimizer step the pass began at


def data_key(identity: Any) -> int:
    """A non-zero 63-bit key of a JSON-able description of the train data."""
    text = json.dumps(identity, sort_keys=True, default=str)
    h = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return (int.from_bytes(h, "little") & ((1 << 63) - 1)) or 1


def seed_step(seed: int, step: int, rank: int) -> None:
    """Seed torch's generators from (seed, step, rank): a resumed run draws what the
    uninterrupted one drew, with no generator state in the checkpoint."""
    h = hashlib.blake2b(f"{seed}:{step}:{rank}".encode(), digest_size=8).digest()
    torch.manual_seed(int.from_bytes(h, "little") & ((1 << 63) - 1))

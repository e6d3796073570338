"""The train state a checkpoint carries beside the model, optimizers and data position, and
the per-step seeding that makes a resumed run draw what the uninterrupted one drew."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch


@dataclass
class TrainState:
    step: int = 0  # optimizer steps taken
    samples: int = 0  # impressions trained on, over all ranks

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every field as an int64 tensor (checkpoints hold tensors; nothing is unpickled)."""
        return {k: torch.tensor(v, dtype=torch.int64) for k, v in asdict(self).items()}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        for f in fields(self):
            setattr(self, f.name, int(sd[f.name]))


def seed_step(seed: int, step: int, rank: int) -> None:
    """Seed torch's generators from (seed, step, rank): a resumed run draws what the
    uninterrupted one drew, with no generator state in the checkpoint."""
    h = hashlib.blake2b(f"{seed}:{step}:{rank}".encode(), digest_size=8).digest()
    torch.manual_seed(int.from_bytes(h, "little") & ((1 << 63) - 1))

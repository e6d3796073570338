"""The train state a checkpoint carries beside the model and optimizer, and step seeding.

The data position is the step: every rank gets the same number of batches per epoch, so
step s is batch s mod steps_per_epoch of epoch s // steps_per_epoch. A resume must cut
the data the same way, which `check_resume` verifies.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, fields

import torch

from lrm.errors import ConfigError


@dataclass
class TrainState:
    step: int = 0  # optimizer steps taken
    samples: int = 0  # impressions trained on, over all ranks
    batch_size: int = 0  # per rank
    world_size: int = 0
    steps_per_epoch: int = 0
    seed: int = 0

    @property
    def epoch(self) -> int:
        return self.step // self.steps_per_epoch if self.steps_per_epoch else 0

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every field as an int64 tensor (DCP saves tensors; nothing needs unpickling)."""
        return {k: torch.tensor(v, dtype=torch.int64) for k, v in asdict(self).items()}

    @classmethod
    def from_state_dict(cls, sd: dict[str, torch.Tensor]) -> TrainState:
        return cls(**{f.name: int(sd[f.name]) for f in fields(cls)})

    def check_resume(self, saved: TrainState, where: str) -> None:
        """A resume reproduces the run only if the data is cut into the same batches."""
        for k in ("batch_size", "world_size", "steps_per_epoch", "seed"):
            now, then = getattr(self, k), getattr(saved, k)
            if now != then:
                raise ConfigError(
                    f"train: cannot resume from {where}: it was written with {k}={then}, this "
                    f"run has {k}={now}; the data order would differ (start fresh without "
                    f"--resume, or run with the checkpoint's settings)")


def seed_step(seed: int, step: int, rank: int) -> None:
    """Seed torch's generators from (seed, step, rank): a resumed run draws what the
    uninterrupted one drew, with no generator state in the checkpoint."""
    h = hashlib.blake2b(f"{seed}:{step}:{rank}".encode(), digest_size=8).digest()
    torch.manual_seed(int.from_bytes(h, "little") & ((1 << 63) - 1))

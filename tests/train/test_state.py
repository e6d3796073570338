"""Per-step seeding: a step's draws depend on (seed, step, rank) alone, so a resumed run
draws what the uninterrupted one drew."""

from __future__ import annotations

import torch

from lrm.train.state import seed_step


def _draw(seed: int, step: int, rank: int) -> torch.Tensor:
    seed_step(seed, step, rank, torch.device("cpu"))
    return torch.rand(8)


def test_a_step_draws_the_same_whatever_was_drawn_before():
    first = _draw(0, 5, 0)
    torch.rand(100)  # other draws in between (e.g. steps before a resume)
    assert torch.equal(_draw(0, 5, 0), first)
    assert not torch.equal(_draw(0, 6, 0), first)  # another step
    assert not torch.equal(_draw(0, 5, 1), first)  # another rank
    assert not torch.equal(_draw(1, 5, 0), first)  # another seed

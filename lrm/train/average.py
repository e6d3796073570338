"""An exponential moving average of the dense weights: what a run evaluates and saves in
place of its last step's weights (`train.ema_decay`; the tables stay as trained).

Why: the foundation model trains at batch 512, where a step sees ~16 clicks, and AdamW moves
every weight of the output layer by about the learning rate each step, so a version's end
state is wherever its last noisy steps left it. Measured on the default synthetic world (one
seed, the FM's versions through days 1-4): each predicted 0.92-1.20 of its own training
day's clicks, though the world's daily CTR is flat. An average over the last ~50 steps
(decay 0.98) keeps the learning rate and removes the swing (next-day calibration 0.98-1.04
against 0.94-1.23). The students' days on that world, which take few large steps, gained
little (3 seeds), so it was the FM's alone, until a small log showed the same swing in the
student: where the schedule shrinks the batch to ~160 rows, MovieLens 100K's student held out
on days 7 and 8 scored 1.5% and 2.5% better with the average (and 0.3% worse on day 9), and no
log measured lost more than 0.13% (lrm/config.py, `TrainConfig.ema_decay`): on in `train`.

The t-th update decays at min(decay, (1 + t) / (10 + t)) (TensorFlow's
ExponentialMovingAverage with num_updates), so a short run's average is not its first
steps'. Written here, not torch's `swa_utils.AveragedModel`: that deep-copies the whole
module, the sharded tables included, and swaps nothing in place; the average here is of the
dense parameters only, updated by one foreach lerp a step, and exchanged with the weights in
place (the optimizer and CUDA graphs keep their tensors). Its state (the updates counted and
the averaged tensors) is a checkpointed part, so a resumed run averages as the
uninterrupted one did.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch

COUNT = "updates"


class DenseAverage:
    """The average of `params` (name -> parameter) at `decay`; `in_model` while it is the
    model's weights (the trained weights then wait in its place)."""

    def __init__(self, params: Mapping[str, torch.Tensor], decay: float) -> None:
        if not 0 < decay < 1:
            raise ValueError(f"decay must be in (0, 1), not {decay}")
        self.decay = decay
        self.params = dict(params)
        self.shadow = {k: p.detach().clone() for k, p in self.params.items()}
        # the lists the per-step lerp takes, built once (every later write is in place)
        self._weights = [p.detach() for p in self.params.values()]
        self._averages = list(self.shadow.values())
        self.updates = 0
        self.in_model = False

    def rate(self) -> float:
        """The decay of the next update, the t-th (t counts it)."""
        t = self.updates + 1
        return min(self.decay, (1 + t) / (10 + t))

    @torch.no_grad()
    def update(self) -> None:
        """Fold the weights of the step just taken into the average."""
        if self.in_model:
            raise RuntimeError("update() while the average is in the model")
        rate = self.rate()
        self.updates += 1
        torch._foreach_lerp_(self._averages, self._weights, 1.0 - rate)

    @torch.no_grad()
    def swap(self) -> None:
        """Exchange the model's weights and the average, in place."""
        for k, p in self.params.items():
            held = p.detach().clone()
            p.detach().copy_(self.shadow[k])
            self.shadow[k].copy_(held)
        self.in_model = not self.in_model

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """The average in the model for the block (as it is, when it already is)."""
        if self.in_model:
            yield
            return
        self.swap()
        try:
            yield
        finally:
            self.swap()

    @torch.no_grad()
    def restart(self, from_average: bool = False) -> None:
        """Weights and average the same from here on, its count kept: the model's weights
        as they are (a best state put back), or, `from_average`, the average's (the model
        takes it). Before the validation slice trains (lrm.train.loop)."""
        if from_average and self.in_model:
            raise RuntimeError("restart(from_average=True) while the average is in the model")
        for k, p in self.params.items():
            if from_average:
                p.detach().copy_(self.shadow[k])
            else:
                self.shadow[k].copy_(p.detach())
        self.in_model = False

    def state_dict(self) -> dict[str, torch.Tensor]:
        if self.in_model:
            raise RuntimeError("state_dict() while the average is in the model")
        return {COUNT: torch.tensor(self.updates, dtype=torch.int64), **self.shadow}

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        with torch.no_grad():
            for k, t in self.shadow.items():
                t.copy_(sd[k])
        self.updates = int(sd[COUNT])


__all__ = ["DenseAverage"]

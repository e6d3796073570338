"""Training progress numbers: loss, windowed NE and samples/s, summed over every rank.

The per-step sums stay on the device (no host sync inside a step); `point()`, at a log
point, reads them.
"""

from __future__ import annotations

import math
import time
from collections import deque

import torch

from lrm import metrics
from lrm.dist import Dist


class WindowNE:
    """NE over the last `rows` impressions (whole log periods)."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.periods: deque[tuple[float, float, float]] = deque()  # (log loss, pos, rows)

    def push(self, loss_sum: float, pos: float, rows: float) -> None:
        self.periods.append((loss_sum, pos, rows))
        while len(self.periods) > 1 and sum(p[2] for p in self.periods) - \
                self.periods[0][2] >= self.rows:
            self.periods.popleft()

    def ne(self) -> float:
        loss, pos, rows = (sum(p[i] for p in self.periods) for i in range(3))
        return metrics.ne_from_sums(loss, pos, rows)


class Meter:
    """Per-step sums between log points, and the time spent in train steps.

    `record(loss, labels, ok)` in every step (device tensors; a step whose loss was not
    finite, `ok` 0, adds nothing), `tick(n)` after it; `point()` (a collective: every rank
    calls it at the same steps) sums the period over ranks into {loss, ne_window,
    samples_per_s}; `resume_clock()` after a pause (eval, checkpoint) keeps the pause out
    of samples/s.
    """

    def __init__(self, env: Dist, ne_window: int) -> None:
        self.env = env
        self.window = WindowNE(ne_window)
        # log loss, positives, rows of the period: on the device, added to in every step
        self.sums = torch.zeros(3, dtype=torch.float64, device=env.device)
        self.samples = 0  # impressions of the period, all ranks
        self.period_s = 0.0  # this rank's seconds in train steps since the last point
        self.train_s = 0.0  # ... since the start
        self.trained = 0  # impressions trained since the start, all ranks
        self._last = time.perf_counter()

    def record(self, loss: torch.Tensor, labels: torch.Tensor, ok: torch.Tensor) -> None:
        n = labels.numel()
        step = torch.stack([loss.detach().to(torch.float64) * n,
                            labels.detach().to(torch.float64).sum(),
                            torch.ones_like(self.sums[0]) * n])
        self.sums += torch.where(ok.bool(), step, 0.0)

    def tick(self, n: int) -> None:
        """One step of `n` impressions (this rank's) is done."""
        self.samples += n * self.env.world_size
        self.trained += n * self.env.world_size
        self.tick_time()

    def resume_clock(self) -> None:
        self._last = time.perf_counter()

    def point(self) -> dict[str, float]:
        loss, pos, rows = self.env.all_sum(self.sums).tolist()  # the host waits here
        self.tick_time()
        self.window.push(loss, pos, rows)
        out = {"loss": loss / rows if rows else math.nan, "ne_window": self.window.ne(),
               "samples_per_s": self.samples / max(self.period_s, 1e-9)}
        self.sums.zero_()
        self.samples, self.period_s = 0, 0.0
        return out

    def tick_time(self) -> None:
        """Count the time since the last tick as training (the device's queued work has
        just been waited for)."""
        now = time.perf_counter()
        self.period_s += now - self._last
        self.train_s += now - self._last
        self._last = now

    @property
    def samples_per_s(self) -> float:
        return self.trained / max(self.train_s, 1e-9)

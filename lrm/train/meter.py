"""Training progress numbers: loss, windowed NE and samples/s, summed over every rank."""

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

    `step()` after every optimizer step; `point()` (a collective: every rank calls it at
    the same steps) sums the period over ranks into {loss, ne_window, samples_per_s};
    `resume_clock()` after a pause (eval, checkpoint) keeps the pause out of samples/s.
    """

    def __init__(self, env: Dist, ne_window: int) -> None:
        self.env = env
        self.window = WindowNE(ne_window)
        self.period = torch.zeros(4, dtype=torch.float64)  # log loss, positives, rows, samples
        self.period_s = 0.0  # this rank's seconds in train steps since the last point
        self.train_s = 0.0  # ... since the start
        self.trained = 0  # impressions trained since the start, all ranks
        self._last = time.perf_counter()

    def step(self, loss: float, labels: torch.Tensor) -> None:
        n = labels.numel()
        self.period += torch.tensor([loss * n, float(labels.sum()), n, n * self.env.world_size],
                                    dtype=torch.float64)
        now = time.perf_counter()
        self.period_s += now - self._last
        self.train_s += now - self._last
        self._last = now
        self.trained += n * self.env.world_size

    def resume_clock(self) -> None:
        self._last = time.perf_counter()

    def point(self) -> dict[str, float]:
        loss, pos, rows, _ = self.env.all_sum(self.period).tolist()
        samples = float(self.period[3])
        self.window.push(loss, pos, rows)
        out = {"loss": loss / rows if rows else math.nan, "ne_window": self.window.ne(),
               "samples_per_s": samples / max(self.period_s, 1e-9)}
        self.period.zero_()
        self.period_s = 0.0
        return out

    @property
    def samples_per_s(self) -> float:
        return self.trained / max(self.train_s, 1e-9)

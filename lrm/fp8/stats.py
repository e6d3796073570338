"""Online estimates over batches: a mean with its confidence interval, tensor statistics.

The probe sees one value of each error measure per batch; `Running` keeps Welford's mean
and variance of those values and gives a Student-t confidence interval for the mean, so
the probe can stop as soon as every interval it judges by is narrow enough
(`Running.half_width() <= width`). `TensorStats` accumulates the distribution of a tensor
over batches: amax, moments (mean, std, kurtosis), quantiles of |x| and the outlier share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from scipy import stats as _sp

QUANTILES = (0.5, 0.99, 0.999)
_MAX_QUANTILE_SAMPLE = 1 << 20  # torch.quantile's input is capped; sample past this


@dataclass
class Running:
    """Mean of one value per batch, online (Welford), with a t confidence interval."""

    n: int = 0
    mean: float = 0.0
    _m2: float = 0.0

    def add(self, x: float) -> None:
        if not math.isfinite(x):  # an infinite SQNR (exact GEMM) is capped by the caller
            raise ValueError(f"non-finite sample {x}")
        self.n += 1
        d = x - self.mean
        self.mean += d / self.n
        self._m2 += d * (x - self.mean)

    @property
    def std(self) -> float:
        return math.sqrt(self._m2 / (self.n - 1)) if self.n > 1 else math.nan

    def half_width(self, confidence: float = 0.95) -> float:
        """Half the width of the two-sided t interval of the mean (inf with < 2 samples)."""
        if self.n < 2:
            return math.inf
        t = float(_sp.t.ppf(0.5 + confidence / 2, self.n - 1))
        return t * self.std / math.sqrt(self.n)

    def summary(self, confidence: float = 0.95) -> dict[str, Any]:
        h = self.half_width(confidence)
        lo, hi = (self.mean - h, self.mean + h) if math.isfinite(h) else (None, None)
        return {"mean": self.mean, "ci": [lo, hi], "n": self.n,
                "std": None if math.isnan(self.std) else self.std}


@dataclass
class TensorStats:
    """Distribution of a tensor's values over every batch it is seen in.

    outlier_k: an entry is an outlier when |x - mean| > outlier_k * std (of its batch).
    Quantiles of |x| are averaged over batches (an online estimate; exact for one batch).
    """

    outlier_k: float = 6.0
    count: int = 0
    amax: float = 0.0
    _sums: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])  # sum x^1..x^4
    _outliers: int = 0
    _q: list[Running] = field(default_factory=lambda: [Running() for _ in QUANTILES])

    @torch.no_grad()
    def add(self, x: torch.Tensor) -> None:
        x = x.detach().double().flatten()
        if x.numel() == 0:
            return
        self.count += x.numel()
        a = x.abs()
        self.amax = max(self.amax, float(a.max()))
        p = x.clone()
        for i in range(4):
            self._sums[i] += float(p.sum())
            p.mul_(x)
        mu, sd = x.mean(), x.std(unbiased=False)
        self._outliers += int(((x - mu).abs() > self.outlier_k * sd).sum()) if sd > 0 else 0
        if a.numel() > _MAX_QUANTILE_SAMPLE:
            g = torch.Generator().manual_seed(a.numel())
            a = a[torch.randint(0, a.numel(), (_MAX_QUANTILE_SAMPLE,), generator=g)]
        qs = torch.quantile(a, torch.tensor(QUANTILES, dtype=a.dtype, device=a.device))
        for r, v in zip(self._q, qs.tolist()):
            r.add(v)

    def summary(self) -> dict[str, Any]:
        if self.count == 0:
            return {"count": 0}
        n = self.count
        m1, m2, m3, m4 = (s / n for s in self._sums)
        var = max(m2 - m1 * m1, 0.0)
        # the 4th central moment from raw moments
        c4 = m4 - 4 * m1 * m3 + 6 * m1 * m1 * m2 - 3 * m1 ** 4
        kurt = c4 / (var * var) if var > 0 else math.nan
        out: dict[str, Any] = {"count": n, "amax": self.amax, "mean": m1, "std": math.sqrt(var),
                               "kurtosis": kurt, "outlier_share": self._outliers / n,
                               "outlier_k": self.outlier_k}
        for q, r in zip(QUANTILES, self._q):
            out[f"abs_p{q * 100:g}"] = r.mean
        return out


__all__ = ["QUANTILES", "Running", "TensorStats"]

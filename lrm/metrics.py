"""Offline metrics of a CTR model: normalized entropy, AUC, calibration, and their
bootstrap confidence intervals.

    NE = -mean(y log p + (1 - y) log(1 - p)) / -(c log c + (1 - c) log(1 - c)),
    c the empirical CTR of the labels (natural log; the base cancels).

Functions take logits by default (log-sigmoid keeps the log loss finite and exact for
confident predictions); pass `probs=True` for probabilities, which are clamped to
[eps, 1 - eps]. Sums are accumulated in float64. A metric that is undefined on its input
(NE or AUC when every label is the same, calibration with no positive label) is NaN.

AUC is exact and rank-based (Mann-Whitney U with average ranks for ties): one sort,
O(n log n). torchrec's `metrics.auc` integrates over the sorted order without grouping
ties (a tie block's pairs count as 0 or 1 depending on the sort, not 0.5), and
torchmetrics' `binary_auroc` accumulates in float32 and sigmoid-transforms inputs outside
[0, 1] on its own; neither is both exact and explicit, so this module has its own.

`bootstrap_ci` says how far a metric of a small day can be trusted: the same three metrics
on rows resampled with replacement (the Poisson bootstrap: every row drawn Poisson(1)
times, independently, which streams and vectorizes; Chamandy et al. 2012), their
percentile interval. Neither torchrec nor torchmetrics resamples rows with weights for AUC,
hence the code here.

`StreamingScore` gives the same metrics and intervals of a stream of batches in memory
that does not grow with the stream (`lrm evaluate` of a day of any size): sums, and for
AUC the weights of positives and negatives per bin of score (AUC_BINS over logits in
[-AUC_RANGE, AUC_RANGE]: a bin's pairs count 0.5, as a tie does; the intervals' AUCs on
AUC_CI_BINS bins). Each row's bootstrap weights are drawn as the row passes. Its state is
sums, so the scores of a job's ranks add up (`reduce`) to the score of all their rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.detach().reshape(-1).to(torch.float64)


def log_losses(preds: torch.Tensor, labels: torch.Tensor, *, probs: bool = False,
               eps: float = 1e-12) -> torch.Tensor:
    """Per-sample log loss -(y log p + (1 - y) log(1 - p)), float64."""
    x, y = _flat(preds), _flat(labels)
    if x.shape != y.shape:
        raise ValueError(f"{x.numel()} predictions for {y.numel()} labels")
    if probs:
        p = x.clamp(eps, 1 - eps)
        return -(y * torch.log(p) + (1 - y) * torch.log1p(-p))
    return -(y * F.logsigmoid(x) + (1 - y) * F.logsigmoid(-x))


def entropy(ctr: float) -> float:
    """-(c log c + (1 - c) log(1 - c)): the log loss of always predicting the base rate."""
    if not 0 < ctr < 1:
        return 0.0
    return -(ctr * math.log(ctr) + (1 - ctr) * math.log1p(-ctr))


def ne_from_sums(loss_sum: float, pos: float, rows: float) -> float:
    """NE from sums of per-row log loss and of labels over `rows` rows (NaN if undefined)."""
    h = entropy(pos / rows) if rows else 0.0
    return loss_sum / rows / h if h > 0 else math.nan


def normalized_entropy(preds: torch.Tensor, labels: torch.Tensor, *, probs: bool = False,
                       eps: float = 1e-12) -> float:
    """NE of logits (or probabilities with probs=True) against 0/1 labels; lower is better."""
    ll = log_losses(preds, labels, probs=probs, eps=eps)
    return ne_from_sums(float(ll.sum()), float(_flat(labels).sum()), ll.numel())


def auc(preds: torch.Tensor, labels: torch.Tensor) -> float:
    """Exact ROC AUC: P(score of a positive > score of a negative) + 0.5 P(equal).

    Any monotone score works (logits or probabilities give the same AUC).
    """
    x, y = _flat(preds), _flat(labels)
    if x.shape != y.shape:
        raise ValueError(f"{x.numel()} predictions for {y.numel()} labels")
    n_pos = float(y.sum())
    n_neg = y.numel() - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    xs, order = torch.sort(x)
    _, counts = torch.unique_consecutive(xs, return_counts=True)
    ends = torch.cumsum(counts, 0)  # 1-based rank of each tie block's last row
    avg_rank = ends.to(torch.float64) - (counts.to(torch.float64) - 1) / 2
    pos_upto = torch.cumsum(y[order], 0)[ends - 1]  # positives up to each block's end
    pos_per_block = torch.diff(pos_upto, prepend=pos_upto.new_zeros(1))
    rank_sum = float((avg_rank * pos_per_block).sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def calibration(preds: torch.Tensor, labels: torch.Tensor, *, probs: bool = False) -> float:
    """Sum of predicted probabilities / sum of labels (1.0: calibrated in aggregate)."""
    x = _flat(preds)
    p = x if probs else torch.sigmoid(x)
    pos = float(_flat(labels).sum())
    return float(p.sum()) / pos if pos > 0 else math.nan


CI_LEVEL = 0.95  # of every confidence interval lrm reports
BOOTSTRAP = 200  # resamples of every confidence interval lrm reports
_CELLS = 1 << 22  # resamples x rows held at once (bounds the bootstrap's memory)


def _poisson1(rows: int, n: int, g: torch.Generator) -> torch.Tensor:
    """[rows, n] float64 draws of Poisson(1), by inverting its CDF (torch.poisson is ~2x
    slower here); counts above 12 (probability 2e-10) are cut to 12."""
    cdf = torch.tensor([math.exp(-1) * sum(1 / math.factorial(j) for j in range(k + 1))
                        for k in range(12)])
    return torch.searchsorted(cdf, torch.rand(rows, n, generator=g)).to(torch.float64)


def _block_sums(w: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Sums of `w` [R, n] over each run of rows ending (exclusive) at `ends` -> [R, blocks]."""
    c = torch.cumsum(w, 1)[:, ends - 1]
    return torch.diff(c, dim=1, prepend=c.new_zeros(c.shape[0], 1))


def _ne(loss: torch.Tensor, pos: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """NE [R] from sums [R] of log loss, labels and rows (NaN where undefined)."""
    c = pos / rows
    h = -(c * torch.log(c) + (1 - c) * torch.log1p(-c))
    return torch.where(h > 0, loss / rows / h, torch.nan)


def _block_auc(wp: torch.Tensor, wn: torch.Tensor) -> torch.Tensor:
    """AUC [R] from the weights of positives and negatives [R, blocks] of blocks of equal
    (or binned) score, ascending: a pair within a block counts 0.5."""
    below = torch.cumsum(wn, 1) - wn  # negative weight strictly below each block
    n_pos, n_neg = wp.sum(1), wn.sum(1)
    return torch.where((n_pos > 0) & (n_neg > 0),
                       (wp * (below + 0.5 * wn)).sum(1) / (n_pos * n_neg), torch.nan)


def _weighted(w: torch.Tensor, ll: torch.Tensor, y: torch.Tensor, p: torch.Tensor,
              ends: torch.Tensor) -> Iterator[torch.Tensor]:
    """NE, AUC and calibration [R] under R row weightings `w` [R, n] (float64) of rows
    sorted by score, `ends` closing each run of equal scores (a tie block)."""
    rows, pos = w.sum(1), w @ y
    yield _ne(w @ ll, pos, rows)
    yield _block_auc(_block_sums(w * y, ends), _block_sums(w * (1 - y), ends))
    yield torch.where(pos > 0, (w @ p) / pos, torch.nan)  # calibration


def bootstrap_ci(preds: torch.Tensor, labels: torch.Tensor, *, resamples: int = BOOTSTRAP,
                 level: float = CI_LEVEL, seed: int = 0, probs: bool = False
                 ) -> dict[str, tuple[float, float]]:
    """{"ne", "auc", "calibration"} -> (low, high): the `level` percentile interval of each
    metric over `resamples` Poisson-bootstrap resamples of the rows (seeded: the same input
    gives the same interval). NaN where the metric is undefined on the input.
    """
    x, y = _flat(preds), _flat(labels)
    if x.shape != y.shape:
        raise ValueError(f"{x.numel()} predictions for {y.numel()} labels")
    if resamples < 1 or not 0 < level < 1:
        raise ValueError(f"need resamples >= 1 and 0 < level < 1, got {resamples}, {level}")
    names = ("ne", "auc", "calibration")
    n = x.numel()
    if n == 0:
        return {k: (math.nan, math.nan) for k in names}
    # weights are drawn per row independently, so the rows can be sorted by score once
    xs, order = torch.sort(x)
    y = y[order]
    ll = log_losses(xs, y, probs=probs)
    p = xs.clamp(0, 1) if probs else torch.sigmoid(xs)
    ends = torch.cumsum(torch.unique_consecutive(xs, return_counts=True)[1], 0)
    g = torch.Generator().manual_seed(seed)
    per = max(1, _CELLS // n)  # resamples per chunk
    out: list[list[torch.Tensor]] = [[] for _ in names]
    for r0 in range(0, resamples, per):
        w = _poisson1(min(per, resamples - r0), n, g)
        for acc, m in zip(out, _weighted(w, ll, y, p, ends), strict=True):
            acc.append(m)
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    ci = {}
    for k, acc in zip(names, out, strict=True):
        lo, hi = torch.nanquantile(torch.cat(acc), q).tolist()
        ci[k] = (lo, hi)
    return ci


def _summary(rows: int, values: Callable[[], tuple[float, float, float, float, float]]
             ) -> dict[str, Any]:
    """{ne, auc, calibration, rows, log_loss, ctr}: what every scorer reports; `values()`
    gives the five metrics of the rows (NaN without rows)."""
    ne, auc_, cal, loss, ctr = values() if rows else (math.nan,) * 5
    return {"ne": ne, "auc": auc_, "calibration": cal, "rows": rows, "log_loss": loss,
            "ctr": ctr}


def _with_intervals(out: dict[str, Any], bounds: Mapping[str, Sequence[float]], level: float,
                    resamples: int) -> dict[str, Any]:
    """`out` with {ne_ci, auc_ci, calibration_ci}: [low, high], the level and resamples."""
    out.update({f"{k}_ci": list(v) for k, v in bounds.items()})
    out.update(ci_level=level, ci_resamples=resamples)
    return out


def score(logits: torch.Tensor, labels: torch.Tensor, *, ci: bool = False,
          resamples: int = BOOTSTRAP) -> dict[str, Any]:
    """{ne, auc, calibration, rows, log_loss, ctr} of logits against 0/1 labels, every row
    held (exact AUC); with `ci`, also {ne_ci, auc_ci, calibration_ci}: [low, high] at
    CI_LEVEL over `resamples` bootstrap resamples of the rows. `StreamingScore` gives the
    same of a stream of batches."""
    out = _summary(int(labels.numel()), lambda: (
        normalized_entropy(logits, labels), auc(logits, labels), calibration(logits, labels),
        float(log_losses(logits, labels).mean()), float(labels.double().mean())))
    if ci and resamples:
        _with_intervals(out, bootstrap_ci(logits, labels, resamples=resamples), CI_LEVEL,
                        resamples)
    return out


def paired_ne(preds: Sequence[torch.Tensor], labels: torch.Tensor, *,
              resamples: int = BOOTSTRAP, seed: int = 0, probs: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The NE of several models' predictions of the same rows, and their NEs under the same
    `resamples` Poisson-bootstrap resamples of the rows: ([M], [resamples, M]), seeded.

    Paired: every model's NE in a resample is over the same weighted rows, so a difference
    between two models' NEs is measured against the noise of the rows both scored (much
    less than either NE's own: a day's hard rows are hard for both). A choice between
    models on a small day (lrm.exfm.pick) reads its intervals from the differences."""
    y = _flat(labels)
    ll = torch.stack([log_losses(p, y, probs=probs) for p in preds], 1)  # [n, M]
    n, m = ll.shape
    if resamples < 1:
        raise ValueError(f"need resamples >= 1, got {resamples}")
    rows, pos = torch.tensor([float(n)], dtype=torch.float64), y.sum().reshape(1)
    point = _ne(ll.sum(0), pos.expand(m), rows.expand(m))
    if n == 0:
        return point, torch.full((resamples, m), math.nan, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    per = max(1, _CELLS // n)
    out = []
    for r0 in range(0, resamples, per):
        w = _poisson1(min(per, resamples - r0), n, g)  # [R, n]
        out.append(_ne(w @ ll, (w @ y)[:, None], w.sum(1)[:, None]))
    return point, torch.cat(out)


AUC_RANGE = 16.0  # logits binned for a streamed AUC: [-16, 16] (sigmoid: 1e-7 from 0 or 1)
AUC_BINS, AUC_CI_BINS = 1 << 16, 1 << 13  # bins of 0.0005 and of 0.004 in logit


def _bins(x: torch.Tensor, n: int) -> torch.Tensor:
    return ((x.clamp(-AUC_RANGE, AUC_RANGE) + AUC_RANGE) * (n / (2 * AUC_RANGE))
            ).long().clamp_(0, n - 1)


class StreamingScore:
    """NE, AUC and calibration of batches of logits (`update`), with `resamples`
    Poisson-bootstrap intervals (`compute`), in memory that does not grow with the rows
    (see the module docstring): 2 x AUC_BINS + resamples x (4 + 2 x AUC_CI_BINS) float64.
    The same rows give the same result (the weights are seeded); `score` of the same rows
    in one piece agrees on NE and calibration, and on AUC within a bin's pairs."""

    def __init__(self, *, resamples: int = BOOTSTRAP, seed: int = 0) -> None:
        if resamples < 0:
            raise ValueError(f"resamples must be >= 0, got {resamples}")
        self.resamples = resamples
        self._g = torch.Generator().manual_seed(seed)
        self.rows, self._loss, self._pos, self._prob = 0, 0.0, 0.0, 0.0
        self._hist = torch.zeros(2, AUC_BINS, dtype=torch.float64)  # positives, negatives
        r = resamples
        self._sums = torch.zeros(4, r, dtype=torch.float64)  # rows, pos, loss, prob
        self._ci_hist = torch.zeros(2, r, AUC_CI_BINS, dtype=torch.float64)

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        x, y = _flat(logits), _flat(labels)
        ll, p = log_losses(x, y), torch.sigmoid(x)
        self.rows += y.numel()
        self._loss += float(ll.sum())
        self._pos += float(y.sum())
        self._prob += float(p.sum())
        fine = _bins(x, AUC_BINS)
        self._hist[0].index_add_(0, fine, y)
        self._hist[1].index_add_(0, fine, 1 - y)
        if self.resamples and y.numel():
            w = _poisson1(self.resamples, y.numel(), self._g)
            self._sums += torch.stack([w.sum(1), w @ y, w @ ll, w @ p])
            coarse = _bins(x, AUC_CI_BINS)
            self._ci_hist[0].index_add_(1, coarse, w * y)
            self._ci_hist[1].index_add_(1, coarse, w * (1 - y))

    def reduce(self, sum_: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Replace this score's state by `sum_` of it: with the elementwise sum over a job's
        ranks (lrm.dist.Dist.all_sum), every rank then computes the score of every rank's
        rows. Each rank draws its rows' bootstrap weights from its own `seed` (the rows'
        weights must be independent)."""
        head = torch.tensor([self.rows, self._loss, self._pos, self._prob], dtype=torch.float64)
        parts = (head, self._hist, self._sums, self._ci_hist)
        flat = sum_(torch.cat([t.reshape(-1) for t in parts]))
        head, self._hist, self._sums, self._ci_hist = (
            v.reshape(t.shape).clone() for v, t in
            zip(flat.split([t.numel() for t in parts]), parts, strict=True))
        self.rows = int(head[0])
        self._loss, self._pos, self._prob = (float(v) for v in head[1:])

    def compute(self, level: float = CI_LEVEL) -> dict[str, Any]:
        """What `score(..., ci=True)` gives for the rows seen (no CI with 0 resamples)."""
        n = self.rows
        out = _summary(n, lambda: (
            ne_from_sums(self._loss, self._pos, n),
            float(_block_auc(self._hist[:1], self._hist[1:])[0]),
            self._prob / self._pos if self._pos > 0 else math.nan, self._loss / n,
            self._pos / n))
        if self.resamples:
            rows, pos, loss, prob = self._sums
            q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
            per = {"ne": _ne(loss, pos, rows), "auc": _block_auc(*self._ci_hist),
                   "calibration": torch.where(pos > 0, prob / pos, torch.nan)}
            _with_intervals(out, {k: torch.nanquantile(v, q).tolist() if n else [math.nan] * 2
                                  for k, v in per.items()}, level, self.resamples)
        return out


class StreamingMetrics:
    """Metrics accumulated over batches: `update(logits, labels)` each batch, then `compute()`.

    NE, log loss, CTR and calibration keep four float64 sums (constant memory). AUC needs
    every prediction: with keep_auc=True (default) the logits (float32) and labels (bool)
    are kept, 5 bytes per row; keep_auc=False drops them and reports AUC as NaN.
    `window_ne()` is the NE of the last `window` rows (a ring buffer of per-row log loss
    and label, for training logs).
    """

    def __init__(self, *, window: int = 100_000, keep_auc: bool = True,
                 probs: bool = False) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        self.window, self.keep_auc, self.probs = window, keep_auc, probs
        self.reset()

    def reset(self) -> None:
        self.rows = 0
        self._loss = self._pos = self._prob = 0.0
        self._preds: list[torch.Tensor] = []
        self._labels: list[torch.Tensor] = []
        self._win_loss = torch.zeros(self.window, dtype=torch.float64)
        self._win_y = torch.zeros(self.window, dtype=torch.float64)
        self._win_at = 0  # next slot to write
        self._win_rows = 0

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        x, y = _flat(logits), _flat(labels)
        ll = log_losses(x, y, probs=self.probs)
        self.rows += y.numel()
        self._loss += float(ll.sum())
        self._pos += float(y.sum())
        self._prob += float(x.clamp(0, 1).sum() if self.probs else torch.sigmoid(x).sum())
        if self.keep_auc:
            self._preds.append(x.to(torch.float32))
            self._labels.append(y.to(torch.bool))
        self._push_window(ll, y)

    def _push_window(self, ll: torch.Tensor, y: torch.Tensor) -> None:
        n = ll.numel()
        if n >= self.window:
            ll, y, n = ll[-self.window:], y[-self.window:], self.window
        first = min(n, self.window - self._win_at)  # up to the end of the ring, then wrap
        a = self._win_at
        self._win_loss[a:a + first], self._win_y[a:a + first] = ll[:first], y[:first]
        self._win_loss[:n - first], self._win_y[:n - first] = ll[first:], y[first:]
        self._win_at = (a + n) % self.window
        self._win_rows = min(self._win_rows + n, self.window)

    def window_ne(self) -> float:
        """NE of the last `window` rows (fewer before that many were seen)."""
        k = self._win_rows
        return ne_from_sums(float(self._win_loss[:k].sum()), float(self._win_y[:k].sum()), k)

    def compute(self) -> dict[str, float]:
        """{ne, auc, calibration, rows, log_loss, ctr, window_ne} over everything seen."""
        n = self.rows
        out = {
            "ne": ne_from_sums(self._loss, self._pos, n),
            "auc": math.nan,
            "calibration": self._prob / self._pos if self._pos > 0 else math.nan,
            "rows": n,
            "log_loss": self._loss / n if n else math.nan,
            "ctr": self._pos / n if n else math.nan,
            "window_ne": self.window_ne(),
        }
        if self.keep_auc and n:
            out["auc"] = auc(torch.cat(self._preds), torch.cat(self._labels).to(torch.float64))
        return out

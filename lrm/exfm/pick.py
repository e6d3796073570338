"""Which variant a vertical model serves (`registry.variant: auto`), chosen so that noise does
not choose it.

A small surface's validation day holds a few hundred impressions, and one day's NE
difference between two variants of its VM is mostly noise: picking the lowest NE on one day
served labels only where distillation was 4.6% and 8.2% better on the held-out day, and a
variant 1.9% worse than labels only (issue 44). So the pick

* pools several validation days: the last `registry.pick.days` evaluation days before the
  held-out one on which every candidate was scored (`pool`);
* starts from a prior, the variant that distils (`registry.pick.prior`; ExFM's premise, and what
  the evidence favoured wherever there was enough of it), and moves off it only to a
  candidate whose NE is lower on the same rows beyond the noise: the whole `CI_LEVEL`
  interval of the paired difference NE(candidate) - NE(prior) below zero (the rows
  resampled alike for both, lrm.metrics.paired_ne); among several such, the lowest NE;
* offers the foundation model's own prediction (`FM`: the logits the augment stage logged
  for the same rows) as a candidate where no VM beats it: it serves when its interval
  against the VM chosen above lies below zero (on a surface too small for its VM to learn
  what the FM knows). Serving it costs the FM's compute, so a tie goes to the VM.

With thin evidence (a day without clicks, a few rows) every interval straddles zero and the
prior serves. The rule is judged on held-out days later than every day it saw
(bench/exfm.py: `exfm.pick_regret`, `exfm.served_vs_labels`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from lrm import metrics

FM = "fm"  # the candidate that serves the foundation model's own prediction
LABELS_ONLY = "labels_only"


@dataclass(frozen=True)
class Scores:
    """Every candidate's logits on the same rows (a vertical's validation day), and their
    labels."""

    labels: torch.Tensor  # [n]
    logits: Mapping[str, torch.Tensor] = field(default_factory=dict)  # candidate -> [n]

    @property
    def rows(self) -> int:
        return int(self.labels.numel())


@dataclass(frozen=True)
class Pick:
    """The served candidate, why, and what it was chosen on."""

    served: str
    prior: str
    reason: str
    ne: dict[str, float]  # candidate -> its NE on the pooled validation rows
    # candidate -> the interval of NE(candidate) - NE(prior) (the FM's: against the VM chosen)
    against: dict[str, list[float]]
    rows: int
    days: list[int]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def prior_of(variants: Sequence[str], distils: Mapping[str, bool], prior: str = "") -> str:
    """The variant served while the evidence is thin: `prior` (registry.pick.prior) where given,
    else the first of `variants` that distils, else labels only."""
    if prior:
        return prior
    return next((v for v in variants if distils.get(v)), LABELS_ONLY)


def pool(per_day: Mapping[int, Scores], candidates: Sequence[str], days: int
         ) -> tuple[Scores, list[int]]:
    """The last `days` days of `per_day` on which every candidate was scored, their rows
    together (a day a candidate missed, a skipped day, is no pair: left out)."""
    usable = sorted(d for d, s in per_day.items() if all(c in s.logits for c in candidates))
    chosen = usable[-days:] if days > 0 else []
    if not chosen:
        return Scores(torch.zeros(0), {c: torch.zeros(0) for c in candidates}), []
    return Scores(torch.cat([per_day[d].labels for d in chosen]),
                  {c: torch.cat([per_day[d].logits[c] for d in chosen]) for c in candidates}
                  ), chosen


def choose(scores: Scores, prior: str, *, days: Sequence[int] = (),
           level: float = metrics.CI_LEVEL, resamples: int = metrics.BOOTSTRAP,
           seed: int = 0, fm_ties: bool = False) -> Pick:
    """The served candidate of `scores` (module docstring): `prior` unless a VM candidate
    beats it beyond the noise; then the FM (`FM`, when among the candidates) if it beats
    that choice beyond the noise, or, with `fm_ties`, unless that choice beats the FM
    beyond the noise (a tie goes to the FM). `fm_ties` is off here, the rule on its own;
    the stages pass `registry.pick.fm_ties`, on by default (lrm.config.PickConfig)."""
    if prior not in scores.logits:
        raise ValueError(f"the prior {prior!r} is not among the candidates "
                         f"{sorted(scores.logits)}")
    names = list(scores.logits)
    point, boot = metrics.paired_ne([scores.logits[c] for c in names], scores.labels,
                                    resamples=resamples, seed=seed)
    ne = {c: float(point[i]) for i, c in enumerate(names)}
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)

    def interval(a: str, b: str) -> list[float]:
        # a resample without a click has no NE: left out, unless too many are (no evidence)
        d = boot[:, names.index(a)] - boot[:, names.index(b)]
        if d.isnan().double().mean() > (1 - level) / 2:
            return [math.nan, math.nan]
        return d.nanquantile(q).tolist()

    against = {c: interval(c, prior) for c in names if c not in (prior, FM)}
    better = [c for c, (_, hi) in against.items() if hi < 0 and ne[c] < ne[prior]]
    served = min(better, key=lambda c: ne[c]) if better else prior
    reason = (f"{served}: NE {ne[served]:.4f} below the prior {prior}'s {ne[prior]:.4f} "
              f"beyond the noise (paired {level:.0%} interval of the difference "
              f"[{against[served][0]:+.4f}, {against[served][1]:+.4f}])" if better else
              f"the prior {prior}: no candidate beats it beyond the noise on "
              f"{scores.rows} rows")
    if FM in scores.logits:
        against[FM] = interval(FM, served)
        lo, hi = against[FM]
        if hi < 0 and ne[FM] < ne[served]:
            reason = (f"the foundation model: NE {ne[FM]:.4f} below {served}'s "
                      f"{ne[served]:.4f} beyond the noise (paired interval [{lo:+.4f}, "
                      f"{hi:+.4f}])")
            served = FM
        elif fm_ties and not (lo > 0 and ne[served] < ne[FM]):
            reason = (f"the foundation model: {served} (NE {ne[served]:.4f}) does not beat "
                      f"its {ne[FM]:.4f} beyond the noise (paired interval [{lo:+.4f}, "
                      f"{hi:+.4f}]; registry.pick.fm_ties)")
            served = FM
    return Pick(served=served, prior=prior, reason=reason, ne=ne, against=against,
                rows=scores.rows, days=list(days))


def day_scores(models: Mapping[str, Path], data: Path, day: int,
               verticals: Sequence[int] | None, *, teacher_column: str | None = None,
               batch_size: int = 8192) -> Scores:
    """Each model folder's logits (serving head) on the rows of `verticals` (None: every
    row) of `day` of `data`, in one pass: the same rows, in the same order, for every model;
    with `teacher_column`, the foundation model's logits logged there too (as `FM`). The
    models share their tables' sizes (the sizes of one vertical model)."""
    from lrm.data.loader import BatchLoader
    from lrm.models.saved import load_model

    loaded = {name: load_model(path) for name, path in models.items()}
    sizes = {tuple(sorted(c.hash_sizes.items())) for _, c in loaded.values()}
    if len(sizes) > 1:
        raise ValueError(f"day_scores: the models' tables differ ({sorted(models)})")
    hash_sizes = dict(next(iter(sizes))) if sizes else {}
    loader = BatchLoader(data, batch_size, days=[day], dedup=True, hash_sizes=hash_sizes,
                         verticals=verticals, teacher_column=teacher_column)
    labels: list[torch.Tensor] = []
    logits: dict[str, list[torch.Tensor]] = {n: [] for n in [*loaded,
                                                             *([FM] if teacher_column else [])]}
    for m, _ in loaded.values():
        m.eval()
    with torch.no_grad():
        for batch in loader:
            labels.append(batch.labels.float())
            for name, (m, _) in loaded.items():
                logits[name].append(m(batch).float())
            if teacher_column:
                assert batch.teacher_logits is not None
                logits[FM].append(batch.teacher_logits.float())
    cat = (lambda xs: torch.cat(xs) if xs else torch.zeros(0))  # noqa: E731
    return Scores(cat(labels), {n: cat(v) for n, v in logits.items()})


KEEP_DAYS = 30  # the stored days of scores kept per VM (the pick reads the newest few)


def save_scores(folder: Path, day: int, scores: Scores, owner: str) -> Path:
    """A day's scores into `folder` (a VM's, the stream's): day=D.pt, plain tensors
    (loaded with weights_only: nothing unpickled), written atomically; the days before the
    newest KEEP_DAYS removed."""
    import os

    from lrm import io

    folder = Path(folder)
    io.claim_dir(folder, owner)
    path = folder / f"day={day}.pt"
    tmp = folder / f".day={day}.pt.tmp"
    io.save_tensors({"labels": scores.labels, **{f"logits.{k}": v
                                                 for k, v in scores.logits.items()}}, tmp)
    os.replace(tmp, path)
    for d in sorted(stored_days(folder))[:-KEEP_DAYS]:
        (folder / f"day={d}.pt").unlink(missing_ok=True)
    return path


def stored_days(folder: Path) -> list[int]:
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(int(p.name[4:-3]) for p in folder.glob("day=*.pt") if p.name[4:-3].isdigit())


def load_scores(folder: Path, before: int | None = None) -> dict[int, Scores]:
    """The stored days' scores of `folder` (those before day `before`)."""
    out = {}
    for d in stored_days(folder):
        if before is not None and d >= before:
            continue
        t = torch.load(Path(folder) / f"day={d}.pt", weights_only=True)
        out[d] = Scores(t["labels"], {k[7:]: v for k, v in t.items()
                                      if k.startswith("logits.")})
    return out


__all__ = ["FM", "KEEP_DAYS", "Pick", "Scores", "choose", "day_scores", "load_scores", "pool",
           "prior_of", "save_scores", "stored_days"]

"""Scoring a model on a held-out day: NE, AUC, calibration over every impression, each with
a bootstrap confidence interval (lrm.metrics).

`evaluate` loads a saved model folder and scores it in this process (the unsharded model):
every row of the day unless `max_rows` says otherwise, and the result says how many. It
streams: each batch's scores go into a lrm.metrics.StreamingScore and are dropped, so a
day of any size is scored in the memory of a batch (its AUC on scores binned finely). The
training loop scores its sharded model the same way on every rank and adds the ranks'
sums (StreamingScore.reduce), so a run's held-out metrics are those `lrm evaluate` gives
of the model it saved. `predict` (every score kept) is for the benchmarks and tests that
want the scores themselves (lrm.metrics.score: their exact metrics).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lrm import metrics
from lrm.data.batch import Batch
from lrm.data.loader import BatchLoader
from lrm.data.schema import day_files, pick_day, read_schema
from lrm.dist import quiet_libraries
from lrm.errors import ConfigError
from lrm.models.saved import load_model
from lrm.progress import Reporter


@torch.no_grad()
def scored(model: nn.Module, batches: Iterable[Batch], device: torch.device, *,
           max_batches: int | None = None, reporter: Reporter | None = None
           ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(logits, labels) of each batch, float32 on the CPU, scored in float32 on any device
    (no autocast: an NE is the saved model's, wherever it runs)."""
    was_training = model.training
    model.eval()
    try:
        for batch in islice(batches, max_batches):
            batch = batch.to(device, non_blocking=True)
            out = model(batch)
            yield out.float().cpu(), batch.labels.float().cpu()
            if reporter is not None:
                reporter.update(batch.size)
    finally:
        model.train(was_training)


def predict(model: nn.Module, batches: Iterable[Batch], device: torch.device, *,
            max_batches: int | None = None,
            reporter: Reporter | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, labels) of every impression in `batches`, float32 on the CPU, scored in
    float32 on any device (no autocast: an NE is the saved model's, wherever it runs)."""
    pairs = list(scored(model, batches, device, max_batches=max_batches, reporter=reporter))
    if not pairs:
        return torch.zeros(0), torch.zeros(0)
    return torch.cat([x for x, _ in pairs]), torch.cat([y for _, y in pairs])


def evaluate_days(model_dir: Path, data: Path, days: Sequence[int], *, batch_size: int = 8192,
                  device: str = "cpu", resamples: int = metrics.BOOTSTRAP) -> dict[str, Any]:
    """Score the saved model on each of `days` (every row), then on all of them pooled:
    the pooled metrics (with intervals, as `evaluate`'s) and `per_day` {day: metrics}."""
    quiet_libraries()
    dev = torch.device(device)
    model, card = load_model(model_dir, dev)
    per_day, pooled = {}, metrics.StreamingScore(resamples=resamples)
    for d in days:  # in the memory of a batch: each day's sums, and the pooled sums
        loader = _loader(data, d, batch_size, card)
        day = metrics.StreamingScore(resamples=resamples)
        with Reporter(f"evaluate {card.kind} day {d}", total=loader.num_rows(),
                      unit="rows") as rep:
            for x, y in scored(model, loader, dev, reporter=rep):
                day.update(x, y)
                pooled.update(x, y)
        per_day[d] = {**day.compute(), "day": d}
    out = pooled.compute()
    return {**out, "days": list(days), "day_rows": out["rows"], "kind": card.kind,
            "per_day": per_day}


def _loader(data: Path, day: int, batch_size: int, card: Any,
            verticals: Sequence[int] | None = None) -> BatchLoader:
    schema, _ = read_schema(data)  # before the loader, which refuses the model's tables
    if schema.sparse_features != card.schema.sparse_features or \
            schema.dense != card.schema.dense:
        raise ConfigError(f"evaluate: {data} has schema {schema.name!r} with other "
                          f"features than the model's ({card.schema.name!r})")
    return BatchLoader(data, batch_size, days=[day], dedup=True, hash_sizes=card.hash_sizes,
                       verticals=verticals)


def evaluate(model_dir: Path, data: Path, *, day: int = -1, batch_size: int = 8192,
             device: str = "cpu", max_rows: int = 0, resamples: int = metrics.BOOTSTRAP,
             verticals: Sequence[int] | None = None) -> dict[str, Any]:
    """Score the saved model in `model_dir` on one day of `data` (either layout): every row
    of it (the sessions on `verticals`, when given), or its first `max_rows` (> 0);
    confidence intervals from `resamples` bootstrap resamples (0: none). The result's
    `rows` is how many were scored, of `day_rows`."""
    quiet_libraries()
    dev = torch.device(device)
    model, card = load_model(model_dir, dev)
    chosen = pick_day(list(day_files(data)), day, "evaluate.day")
    loader = _loader(data, chosen, batch_size, card, verticals)
    day_rows = loader.num_rows()
    want = min(max_rows, day_rows) if max_rows > 0 else day_rows
    scores = metrics.StreamingScore(resamples=resamples)
    with Reporter(f"evaluate {card.kind}", total=want, unit="rows") as rep:
        for logits, labels in scored(model, loader, dev, reporter=rep,
                                     max_batches=-(-want // batch_size)):
            take = want - scores.rows
            scores.update(logits[:take], labels[:take])
    return {**scores.compute(), "day": chosen, "day_rows": day_rows, "kind": card.kind}

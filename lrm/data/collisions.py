"""How many ids share an embedding row: the collision rate of hashed tables, per day.

The loader maps a feature's ids into its table's rows by floor modulo (`id mod rows`,
lrm.data.chunks), so two ids of a day collide when they land on the same row, and an id
that arrives today may land on a row that another id trained yesterday. For one day and
each sparse feature this reports

    ids                 distinct ids of the day
    rows                distinct rows they use
    collision_rate      share of the ids whose row holds another id of the day too
    lookup_collisions   share of the lookups that read such a shared row
    new_ids             share of the ids not seen the day before (None on the first day):
                        arrivals, and returning ids
    new_on_used_rows    share of those that land on a row another id used the day before
                        (they start from that id's trained embedding)

A feature whose table has at least as many rows as its id space (`vocab`) cannot collide
and reports zeros.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lrm.data import parquet

GROWING = ("user_id", "ad_id")  # synthetic features whose id spaces keep growing (churn)


def watched(vocab: Mapping[str, int], hash_sizes: Mapping[str, int]) -> list[str]:
    """The features worth a collision report: those whose ids arrive over time (user and ad
    ids) and every feature whose table is smaller than its id space (or has none known)."""
    return [f for f in hash_sizes
            if f in GROWING or f not in vocab or vocab[f] > hash_sizes[f]]


def feature_ids(files: Iterable[Path], feature: str) -> np.ndarray:
    """Every id of `feature` in the files (one per lookup; list columns flattened)."""
    return ids_by_feature(files, [feature])[feature]


def ids_by_feature(files: Iterable[Path], features: Sequence[str]) -> dict[str, np.ndarray]:
    """{feature: every id of it in the files}, each file read once (lrm.data.parquet: a
    damaged file is named)."""
    parts: dict[str, list[np.ndarray]] = {f: [] for f in features}
    for path in files:
        table = parquet.read_table(path, columns=list(features))
        for f in features:
            col = table.column(f).combine_chunks()
            while pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
                col = pc.list_flatten(col)
            parts[f].append(pc.drop_null(col).to_numpy(zero_copy_only=False).astype(np.int64))
    return {f: np.concatenate(p) if p else np.zeros(0, np.int64) for f, p in parts.items()}


def collision_stats(ids: np.ndarray, rows: int, previous: np.ndarray | None = None
                    ) -> dict[str, Any]:
    """The module docstring's numbers for one feature's lookups `ids` in a table of `rows`
    rows; `previous`: the feature's lookups the day before (or None)."""
    uniq, counts = np.unique(ids, return_counts=True)
    slot = np.remainder(uniq, rows)  # the loader's floor modulo
    slots, per_slot = np.unique(slot, return_counts=True)
    shared = per_slot[np.searchsorted(slots, slot)] > 1
    out: dict[str, Any] = {
        "ids": int(len(uniq)), "rows": int(len(slots)), "table_rows": int(rows),
        "collision_rate": float(shared.mean()) if len(uniq) else 0.0,
        "lookup_collisions": float(counts[shared].sum() / counts.sum()) if len(uniq) else 0.0,
        "new_ids": None, "new_on_used_rows": None,
    }
    if previous is not None and len(uniq):
        before = np.unique(previous)
        new = ~np.isin(uniq, before, assume_unique=True)
        out["new_ids"] = float(new.mean())
        used = np.unique(np.remainder(before, rows))
        out["new_on_used_rows"] = float(np.isin(slot[new], used).mean()) if new.any() else 0.0
    return out


def day_collisions(files: Sequence[Path], hash_sizes: Mapping[str, int],
                   previous_files: Sequence[Path] | None = None,
                   features: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """{feature: collision_stats} for one day's files (either layout), against the day
    before when its files are given; `features` default: every one of `hash_sizes`."""
    feats = list(features) if features is not None else list(hash_sizes)
    today = ids_by_feature(files, feats)
    before = ids_by_feature(previous_files, feats) if previous_files else {}
    return {f: collision_stats(today[f], hash_sizes[f], before.get(f)) for f in feats}


def markdown(stats: Mapping[str, Mapping[str, Any]]) -> str:
    """The day's collision table (GitHub markdown)."""
    def pct(x: Any) -> str:
        return "n/a" if x is None else f"{100 * x:.2f}%"

    lines = ["| feature | ids | table rows | ids on a shared row | lookups on a shared row "
             "| ids not seen yesterday | of those, on a row used yesterday |",
             "|---|---|---|---|---|---|---|"]
    for f, s in stats.items():
        lines.append(f"| {f} | {s['ids']} | {s['table_rows']} | {pct(s['collision_rate'])} | "
                     f"{pct(s['lookup_collisions'])} | {pct(s['new_ids'])} | "
                     f"{pct(s['new_on_used_rows'])} |")
    return "\n".join(lines) + "\n"

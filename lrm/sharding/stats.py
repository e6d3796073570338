"""Table statistics from the data: what each table looks up per step.

Read through lrm.data's BatchLoader, exactly as training reads (ids hashed into the
tables' rows, RecD's user rows when `recd`), from `batches` batches of `batch_size`
impressions spread evenly over the dataset (the loader's rank/world split picks every
k-th batch without assembling the others). Per sparse feature:

    rows_per_sample   lookup rows per impression: 1 item side; sessions / impressions of
                      a batch on the RecD user side (a user table sees one row per session)
    pooling           ids per lookup row (the pooling factor)
    ids_per_sample    rows_per_sample x pooling: what the tables look up per impression
    unique_ids_per_batch   distinct ids in a batch
    hot               share of lookups on the hottest 0.1%, 1%, 10% of the table's rows
                      (hot[1]: the access skew at 1%); counted over the batches read, so
                      a table with more rows than ids read looks hotter than it is
    blocks            share of lookups per 1/32 of the table's rows (row-wise shards)
    nonempty          share of impressions with at least one id

and per table (its features together: a shared table's ids are counted once) the same
skew figures and distinct ids. `cooccurrence[f][g]` is the share of impressions where
both features have ids (DMT's towers group features that co-occur). `loads` turns the
statistics into what the cost model needs of each table of a model, per training step.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torchrec import EmbeddingBagCollection

from lrm.data.loader import BatchLoader
from lrm.data.schema import FeatureSchema
from lrm.errors import ConfigError

FORMAT = "lrm.table-stats/1"
HOT_FRACTIONS = (0.001, 0.01, 0.1)
BLOCKS = 32


@dataclass(frozen=True)
class FeatureStats:
    side: str  # "user" | "item"
    table_rows: int  # rows of the table the feature's ids are hashed into
    rows_per_sample: float
    pooling: float
    ids_per_sample: float
    unique_ids_per_batch: float
    distinct_ids: int  # distinct ids (rows) seen in the batches read
    hot: tuple[float, ...]
    blocks: tuple[float, ...]
    nonempty: float


@dataclass(frozen=True)
class TableStats:
    rows: int
    features: tuple[str, ...]
    unique_ids_per_batch: float
    distinct_ids: int
    hot: tuple[float, ...]
    blocks: tuple[float, ...]


@dataclass(frozen=True)
class Stats:
    batch_size: int  # impressions per batch read (train.batch_size: one step of every rank)
    recd: bool
    batches: int  # batches read
    impressions: int  # impressions read
    features: dict[str, FeatureStats]
    tables: dict[str, TableStats]
    cooccurrence: dict[str, dict[str, float]] = field(default_factory=dict)
    data: str = ""

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["format"] = FORMAT
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any], where: str = "stats") -> Stats:
        if d.get("format") != FORMAT:
            raise ConfigError(f"{where}: not a table-statistics file ({FORMAT})")
        try:
            return cls(batch_size=int(d["batch_size"]), recd=bool(d["recd"]),
                       batches=int(d["batches"]), impressions=int(d["impressions"]),
                       features={k: FeatureStats(**{**v, "hot": tuple(v["hot"]),
                                                    "blocks": tuple(v["blocks"])})
                                 for k, v in d["features"].items()},
                       tables={k: TableStats(**{**v, "features": tuple(v["features"]),
                                               "hot": tuple(v["hot"]),
                                               "blocks": tuple(v["blocks"])})
                               for k, v in d["tables"].items()},
                       cooccurrence={k: dict(v) for k, v in d.get("cooccurrence", {}).items()},
                       data=str(d.get("data", "")))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"{where}: malformed table statistics ({e!r})") from None

    @classmethod
    def read(cls, path: Path) -> Stats:
        try:
            return cls.from_json(json.loads(Path(path).read_text()), str(path))
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"{path}: cannot read the table statistics ({e})") from None


# -- from the data ----------------------------------------------------------------------

def _skew(counts: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(hot shares, block shares) of a per-row lookup count."""
    total = float(counts.sum())
    rows = counts.size
    if total == 0:
        return tuple(0.0 for _ in HOT_FRACTIONS), tuple(1.0 / BLOCKS for _ in range(BLOCKS))
    desc = np.sort(counts)[::-1]
    csum = np.cumsum(desc, dtype=np.float64)
    hot = tuple(float(csum[min(rows, max(1, math.ceil(x * rows))) - 1] / total)
                for x in HOT_FRACTIONS)
    edges = np.linspace(0, rows, BLOCKS + 1).astype(np.int64)
    per_row = np.concatenate([[0.0], np.cumsum(counts, dtype=np.float64)])
    blocks = tuple(float((per_row[b] - per_row[a]) / total)
                   for a, b in zip(edges[:-1], edges[1:], strict=True))
    return hot, blocks


def compute(data: Path, tables: Mapping[str, tuple[int, Sequence[str]]], *, batch_size: int,
            recd: bool, batches: int, days: Sequence[int] | None = None) -> Stats:
    """Statistics of `data` for `tables` (name -> (rows, features)); see the module doc."""
    hash_sizes = {f: rows for rows, feats in tables.values() for f in feats}
    probe = BatchLoader(data, batch_size, days=days, dedup=recd, hash_sizes=hash_sizes,
                        prefetch=0, num_workers=0)
    total = -(-probe.num_rows() // batch_size)
    stride = max(1, total // batches)
    loader = BatchLoader(data, batch_size, days=days, dedup=recd, hash_sizes=hash_sizes,
                         rank=0, world_size=stride, prefetch=2, num_workers=1)
    schema: FeatureSchema = loader.schema
    user = set(schema.user_features)
    feats = [f for _, fs in tables.values() for f in fs]
    counts = {f: np.zeros(hash_sizes[f], dtype=np.int64) for f in feats}
    rows = dict.fromkeys(feats, 0)
    ids = dict.fromkeys(feats, 0)
    uniq = dict.fromkeys(feats, 0)
    t_uniq = dict.fromkeys(tables, 0)
    co = np.zeros((len(feats), len(feats)))
    n_batches = impressions = 0
    for b in loader:
        if n_batches == batches:
            break
        n_batches += 1
        impressions += b.size
        present = []
        values: dict[str, torch.Tensor] = {}
        for f in feats:
            jt = (b.user if f in user else b.item)[f]
            v, lengths = jt.values(), jt.lengths()
            values[f] = v
            rows[f] += lengths.numel()
            ids[f] += v.numel()
            if v.numel():
                counts[f] += np.bincount(v.numpy(), minlength=counts[f].size)
                uniq[f] += int(torch.unique(v).numel())
            has = lengths > 0
            if f in user and b.inverse is not None:
                has = has[b.inverse]
            present.append(has.to(torch.float64))
        p = torch.stack(present, 1)
        co += (p.T @ p).numpy()
        for name, (_, fs) in tables.items():
            v = torch.cat([values[f] for f in fs])
            t_uniq[name] += int(torch.unique(v).numel()) if v.numel() else 0
    if n_batches == 0:
        raise ConfigError(f"{data}: no batch of {batch_size} impressions to compute table "
                          f"statistics from")
    out_f = {}
    for i, f in enumerate(feats):
        hot, blocks = _skew(counts[f])
        r, n = rows[f] / impressions, ids[f] / max(rows[f], 1)
        out_f[f] = FeatureStats(
            side="user" if f in user else "item", table_rows=hash_sizes[f], rows_per_sample=r,
            pooling=n, ids_per_sample=ids[f] / impressions,
            unique_ids_per_batch=uniq[f] / n_batches, distinct_ids=int((counts[f] > 0).sum()),
            hot=hot, blocks=blocks, nonempty=float(co[i, i] / impressions))
    out_t = {}
    for name, (n_rows, fs) in tables.items():
        c = sum(counts[f] for f in fs)
        hot, blocks = _skew(c)
        out_t[name] = TableStats(rows=n_rows, features=tuple(fs),
                                 unique_ids_per_batch=t_uniq[name] / n_batches,
                                 distinct_ids=int((c > 0).sum()), hot=hot, blocks=blocks)
    cooc = {f: {g: float(co[i, j] / impressions) for j, g in enumerate(feats)}
            for i, f in enumerate(feats)}
    return Stats(batch_size=batch_size, recd=recd, batches=n_batches, impressions=impressions,
                 features=out_f, tables=out_t, cooccurrence=cooc, data=str(data))


# -- what a model's tables do per step ----------------------------------------------------

@dataclass(frozen=True)
class TableLoad:
    """One table's work per training step (every rank's batch together): the cost model's
    input. `uniform_batch`: every rank looks up the same number of rows (item side)."""

    name: str
    module: str  # FQN of the EmbeddingBagCollection holding it ("" for a bare one)
    rows: int
    dim: int
    features: tuple[str, ...]
    ids: float  # ids looked up per step
    unique_ids: float  # distinct rows touched per step (the optimizer updates these)
    pooled_rows: float  # pooled embeddings out per step (a feature's lookup rows)
    hot: tuple[float, ...] = (0.001, 0.01, 0.1)  # at HOT_FRACTIONS; uniform by default
    blocks: tuple[float, ...] = ()  # lookup share per equal block of rows; () uniform
    uniform_batch: bool = True

    def hit_share(self, fraction: Any) -> Any:
        """Share of lookups on the hottest `fraction` of rows (a number or an array):
        piecewise power law between the measured points (exact for uniform access: x)."""
        f = np.clip(np.asarray(fraction, dtype=np.float64), 0.0, 1.0)
        xs = np.log([*HOT_FRACTIONS, 1.0])
        ys = np.log(np.maximum([*self.hot, 1.0], 1e-12))
        out = np.exp(np.interp(np.log(np.maximum(f, 1e-300)), xs, ys))
        out = np.where(f <= HOT_FRACTIONS[0], self.hot[0] * f / HOT_FRACTIONS[0], out)
        return out if out.ndim else float(out)

    def row_share(self, r0: Any, r1: Any) -> Any:
        """Share of lookups on rows [r0, r1) (numbers or arrays)."""
        r0, r1 = np.asarray(r0, dtype=np.float64), np.asarray(r1, dtype=np.float64)
        if not self.blocks:
            return (r1 - r0) / self.rows
        n = len(self.blocks)
        cum = np.concatenate([[0.0], np.cumsum(self.blocks)])
        grid = np.arange(n + 1)
        return np.interp(r1 / self.rows * n, grid, cum) - np.interp(r0 / self.rows * n, grid,
                                                                    cum)


def model_tables(model: nn.Module) -> list[tuple[str, Any]]:
    """(EBC FQN, EmbeddingBagConfig) of every table of a model, in module order."""
    return [(path, t) for path, m in model.named_modules()
            if isinstance(m, EmbeddingBagCollection) for t in m.embedding_bag_configs()]


def loads(model: nn.Module, stats: Stats) -> list[TableLoad]:
    """The per-step work of every table of `model` (a step: `stats.batch_size` impressions).

    An EBC with user-side features looks them up per user row (a session under RecD); one
    that also holds item-side features (a table shared across sides) takes B + U rows for
    every feature (lrm.models.tables.stack_rows), and the rows per rank vary with U.
    """
    out = []
    B = stats.batch_size
    by_module: dict[str, list[Any]] = {}
    for path, t in model_tables(model):
        by_module.setdefault(path, []).append(t)
    for path, configs in by_module.items():
        feats = [f for t in configs for f in t.feature_names]
        missing = [f for f in feats if f not in stats.features]
        if missing:
            raise ConfigError(f"table statistics ({stats.data}) lack features {missing}: "
                              f"recompute them for this model")
        sides = {stats.features[f].side for f in feats}
        user_rows = max((stats.features[f].rows_per_sample for f in feats
                         if stats.features[f].side == "user"), default=0.0)
        if sides == {"user"}:
            per_key = user_rows
        elif "user" in sides:
            per_key = 1.0 + user_rows
        else:
            per_key = 1.0
        for t in configs:
            st = stats.tables.get(t.name)
            if st is None or st.rows != t.num_embeddings:
                raise ConfigError(f"table statistics ({stats.data}) do not match table "
                                  f"{t.name} ({t.num_embeddings} rows): recompute them")
            fs = [stats.features[f] for f in t.feature_names]
            out.append(TableLoad(
                name=t.name, module=path, rows=t.num_embeddings, dim=t.embedding_dim,
                features=tuple(t.feature_names), ids=B * sum(f.ids_per_sample for f in fs),
                unique_ids=st.unique_ids_per_batch, pooled_rows=B * per_key * len(fs),
                hot=st.hot, blocks=st.blocks, uniform_batch="user" not in sides))
    return out


def table_specs(model: nn.Module) -> dict[str, tuple[int, list[str]]]:
    """name -> (rows, features) of a model's tables: what `compute` takes."""
    return {t.name: (t.num_embeddings, list(t.feature_names)) for _, t in model_tables(model)}

"""The cost model: seconds per training step that a shard puts on the rank holding it.

A shard of table t (rows [r0, r1), columns [c0, c0 + c)) on a rank costs, per step:

    compute   per_shard + ids x per_id                       (kernel work per lookup)
    memory    ids x c x (per_id_col + miss x per_miss_col)   (rows gathered, fwd and bwd;
              + ids x miss x per_miss                         a missed row waits on DRAM)
              + unique x (c x per_unique_col + miss x per_unique_miss)   (the optimizer
                                                              updates each row touched once)
              + pooled x c x per_out_col                     (pooled outputs and grads)
    comm      the shard's all-to-all bytes (ids in, pooled embeddings out, gradients
              back) over the intra- and inter-host links of the topology

with ids / unique the lookups that fall in its rows (the table's row blocks), pooled the
rows it pools (every sample's, for each of its features), and miss the share of lookups
outside the cache (from the table's skew: the hottest rows that fit stay cached; a rank's
shards share its cache). A rank also pays `per_call` once per step for its kernel call:
the same on every rank, it changes no plan and is reported apart. The
coefficients are a `Calibration`: fitted to fbgemm's fused TBE timed on the machine at
hand (`python -m lrm.sharding.calibrate`, kept as calibration/DEVICE.json), or, for a GPU
that has no calibration file yet, an analytic bandwidth model from the topology's HBM
bandwidth. A rank's cost is the sum of its shards' (`Plan.rank_costs`).
"""

from __future__ import annotations

import importlib.resources
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lrm.errors import ConfigError
from lrm.sharding.stats import TableLoad
from lrm.sharding.topology import COLUMN_WISE, ROW_WISE, TABLE_ROW_WISE, TABLE_WISE, Topology

FORMAT = "lrm.sharding-calibration/1"
# the calibrations lrm ships, found through the package (not the working directory: lrm runs
# from the user's own project folder); a plain folder in a regular install
CALIBRATIONS = Path(str(importlib.resources.files("lrm.sharding") / "calibration"))
FLOAT, INDEX, MOMENTUM = 4, 8, 4  # bytes: an fp32 weight, an int64 id, a row-wise Adagrad state
COEFFICIENTS = ("per_call", "per_shard", "per_id", "per_id_col", "per_miss", "per_miss_col",
                "per_unique_col", "per_unique_miss", "per_out_col")


@dataclass(frozen=True)
class Calibration:
    """Seconds per unit of work of one rank's embedding kernel (see the module docstring)."""

    device: str
    source: str  # where the figures come from (machine, library versions, or "analytic")
    cache_bytes: float  # rows that fit here stay cached (0: no cache term)
    per_call: float = 0.0  # once per kernel call: a rank's fixed cost, the same on every rank
    per_shard: float = 0.0
    per_id: float = 0.0
    per_id_col: float = 0.0
    per_miss: float = 0.0
    per_miss_col: float = 0.0
    per_unique_col: float = 0.0
    per_unique_miss: float = 0.0
    per_out_col: float = 0.0
    fit: dict[str, Any] = field(default_factory=dict)  # how well the fit explains the timings

    @classmethod
    def analytic(cls, topo: Topology) -> Calibration:
        """Bandwidth only: every byte a lookup moves at the topology's HBM bandwidth (fwd
        reads a row, bwd reads the gradient and rewrites the row; pooled outputs are written
        and their gradients read). For a GPU until `calibrate` has run on one."""
        bw = topo.hbm_bw
        return cls(device=topo.device, source=f"analytic: HBM at {bw / 1e9:g} GB/s",
                   cache_bytes=0.0, per_id_col=2 * FLOAT / bw, per_unique_col=2 * FLOAT / bw,
                   per_out_col=2 * FLOAT / bw)

    @classmethod
    def load(cls, folder: Path, topo: Topology) -> Calibration:
        """`folder/DEVICE.json` for the topology's device; the analytic model when a GPU
        has none (said in the plan's `calibration.source`). A CPU must have one."""
        path = Path(folder) / f"{topo.device}.json"
        if not path.exists():
            if topo.device == "cuda":
                return cls.analytic(topo)
            raise ConfigError(f"{path}: no cost-model calibration for {topo.device}; run "
                              f"python -m lrm.sharding.calibrate --out {path}")
        try:
            d = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"{path}: cannot read the calibration ({e})") from None
        if d.get("format") != FORMAT or d.get("device") != topo.device:
            raise ConfigError(f"{path}: not a {topo.device} calibration ({FORMAT})")
        try:
            return cls(device=d["device"], source=d["source"], cache_bytes=d["cache_bytes"],
                       fit=d.get("fit", {}), **{k: float(d[k]) for k in COEFFICIENTS})
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"{path}: malformed calibration ({e!r})") from None

    def elsewhere(self) -> str | None:
        """A CPU calibration measured on another CPU model: a line saying so and how to
        calibrate this one (None: measured on this CPU model, or not a measured CPU's). The
        plan is still made: the costs' ratios carry over better than their seconds."""
        if self.device != "cpu" or not self.source.startswith("measured: "):
            return None
        from lrm.dist import cpu_name

        here = cpu_name()
        if self.source.startswith(f"measured: {here}, "):
            return None
        there = self.source.removeprefix("measured: ").split(",")[0]
        return (f"the cost model's cpu calibration was measured on {there}, not this CPU "
                f"({here}): the plan's seconds are that CPU's. Calibrate this one (a few "
                f"minutes): python -m lrm.sharding.calibrate --out calibration/cpu.json, then "
                f"lrm shard-plan --calibration calibration")

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self)}

    def features(self, *, ids: Any, unique: Any, pooled: Any, cols: Any,
                 miss: Any) -> tuple[Any, ...]:
        """The work counts of one shard that the coefficients multiply, per_call's
        excepted (COEFFICIENTS[1:] order; numbers or arrays)."""
        return (1.0, ids, ids * cols, ids * miss, ids * miss * cols, unique * cols,
                unique * miss, pooled * cols)

    def kernel_time(self, **work: Any) -> tuple[Any, Any]:
        """(compute, memory) seconds of shards' lookups; `work` as in `features`. The
        per-call cost is a rank's, not a shard's (all of a rank's tables run in one
        kernel): the same on every rank, it moves no plan and is left out here."""
        x = self.features(**work)
        k = [getattr(self, c) for c in COEFFICIENTS[1:]]
        compute = k[0] * x[0] + k[1] * x[1]
        return compute, sum(a * b for a, b in zip(k[2:], x[2:], strict=True))


@dataclass(frozen=True)
class ShardCost:
    compute: float  # seconds per step
    memory: float
    comm: float
    bytes: int  # memory the shard occupies (weights + optimizer state)

    @property
    def total(self) -> float:
        return self.compute + self.memory + self.comm


class CostModel:
    """Per-shard costs on a topology (see the module docstring)."""

    def __init__(self, topo: Topology, calibration: Calibration, *,
                 tables: int | None = None) -> None:
        """tables: how many tables the plan places; a rank's shards share its cache, so
        each shard is costed with the cache divided by the tables a rank holds on
        average (at least one)."""
        if calibration.device != topo.device:
            raise ConfigError(f"a {calibration.device} calibration cannot cost a "
                              f"{topo.device} topology")
        self.topo, self.cal = topo, calibration
        self.cache = calibration.cache_bytes / max(1.0, (tables or 0) / topo.world_size)

    def shard_bytes(self, rows: int, cols: int) -> int:
        return rows * cols * FLOAT + rows * MOMENTUM

    def miss(self, t: TableLoad, rows: np.ndarray, cols: np.ndarray,
             share: np.ndarray) -> np.ndarray:
        """Share of shards' lookups that miss the cache: the hottest rows that fit stay."""
        row_bytes = cols * FLOAT + MOMENTUM
        if self.cache <= 0:
            return np.zeros_like(share)
        fits = self.cache / row_bytes  # rows of a shard that stay cached
        # a shard's hottest `fits` rows take at most the table's hottest share of lookups
        hit = np.minimum(1.0, t.hit_share(fits / t.rows) / np.maximum(share, 1e-300))
        return np.where((rows * row_bytes <= self.cache) | (share <= 0), 0.0,
                        np.maximum(0.0, 1.0 - hit))

    def shards(self, t: TableLoad, kind: str, row0: Any, rows: Any, cols: Any,
               host_ranks: int | None = None) -> tuple[np.ndarray, ...]:
        """(compute, memory, comm, bytes) of shards of `t` under sharding type `kind`, one
        entry per shard (arrays of first rows, rows, columns)."""
        topo = self.topo
        W, R = topo.world_size, topo.ranks_per_host
        row0, rows = np.asarray(row0, dtype=np.int64), np.asarray(rows, dtype=np.int64)
        cols = np.broadcast_to(np.asarray(cols, dtype=np.float64), rows.shape)
        share = np.where(rows < t.rows, t.row_share(row0, row0 + rows), 1.0)
        ids, unique = t.ids * share, t.unique_ids * share
        compute, memory = self.cal.kernel_time(
            ids=ids, unique=unique, pooled=t.pooled_rows, cols=cols,
            miss=self.miss(t, rows, cols, share))
        emb = t.pooled_rows * cols * FLOAT  # pooled embeddings (or partial sums) of the step
        away = (W - 1) / W  # share of the step's samples that live on other ranks
        ids_in = (ids * INDEX + t.pooled_rows * INDEX) * away  # ids and lengths
        if kind in (TABLE_WISE, COLUMN_WISE, ROW_WISE):
            # all-to-all with every rank: ids in; outputs out (fwd), gradients in (bwd)
            comm = topo.link_time(ids_in + 2 * emb * away, R - 1, W - R)
        elif kind == TABLE_ROW_WISE:
            # partial sums reduce-scattered inside the host, then the host's 1/R share of
            # the reduced rows goes to the other hosts (and back in the backward)
            r = host_ranks or R
            comm = (topo.link_time(ids_in, R - 1, W - R)
                    + topo.link_time(2 * emb * (r - 1) / r, r - 1, 0)
                    + topo.link_time(2 * emb / r * (W - R) / W, 0, W - R))
        else:
            raise ValueError(f"unknown sharding type {kind!r}")
        nbytes = rows * cols.astype(np.int64) * FLOAT + rows * MOMENTUM
        z = np.zeros(rows.shape)
        return compute + z, memory + z, comm + z, nbytes

    def shard(self, t: TableLoad, kind: str, row0: int, rows: int, cols: int,
              host_ranks: int | None = None) -> ShardCost:
        """The cost of one shard of `t` under sharding type `kind`."""
        c, m, k, b = self.shards(t, kind, [row0], [rows], [cols], host_ranks)
        return ShardCost(compute=float(c[0]), memory=float(m[0]), comm=float(k[0]),
                         bytes=int(b[0]))

"""A sharding plan: every table's sharding type and shards, its JSON form, torchrec's form.

`plans/sharding.json` (stage shard_plan) holds one plan per model the pipeline trains
("teacher", "student", "students.NAME": their tables differ in width):

    {"format": "lrm.sharding-plan/1", "topology": {...}, "planner": "lrm",
     "calibration": {...}, "models": {"student": {
        "tables": {"t_user_id": {"module": "embeddings.user_ebc", "sharding_type":
                   "table_wise", "rows": 100000, "dim": 16, "features": [...],
                   "shards": [{"rank": 0, "offsets": [0, 0], "sizes": [100000, 16],
                               "cost_ms": 0.21, "bytes": 6800000}], "cost_ms": 0.21}},
        "ranks": [{"rank": 0, "host": 0, "cost_ms": ..., "compute_ms": ...,
                   "memory_ms": ..., "comm_ms": ..., "bytes": ..., "capacity_bytes": ...}],
        "max_ms": ..., "mean_ms": ..., "imbalance": ..., ...}}}

`to_torchrec` turns one model's plan into the torchrec ShardingPlan DMP takes, through
torchrec's own per-type generators (table_wise(rank), column_wise(ranks), row_wise(),
table_row_wise(host)) and checks that the shards they make are the plan's; `from_torchrec`
reads a torchrec plan back (to score torchrec's planner with lrm's cost model).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from lrm.errors import ConfigError
from lrm.sharding.cost import CostModel, ShardCost
from lrm.sharding.stats import TableLoad
from lrm.sharding.topology import (
    COLUMN_WISE,
    DEVICE_TYPES,
    ROW_WISE,
    SHARDING_TYPES,
    TABLE_ROW_WISE,
    TABLE_WISE,
    Topology,
)

FORMAT = "lrm.sharding-plan/1"
KERNEL = "fused"  # fbgemm's TBE with the row-wise Adagrad fused into the backward


@dataclass(frozen=True)
class Shard:
    rank: int
    row0: int
    rows: int
    col0: int
    cols: int


@dataclass
class Placement:
    """One table's sharding: its type and shards, each with its cost."""

    table: TableLoad
    kind: str
    shards: list[Shard]
    costs: list[ShardCost] = field(default_factory=list)

    @property
    def cost(self) -> float:
        return sum(c.total for c in self.costs)


@dataclass(frozen=True)
class RankCost:
    rank: int
    compute: float
    memory: float
    comm: float
    bytes: int

    @property
    def total(self) -> float:
        return self.compute + self.memory + self.comm


@dataclass
class Plan:
    """Where every table of one model goes on a topology."""

    topology: Topology
    placements: dict[str, Placement]
    planner: str = "lrm"
    seconds: float = 0.0  # time the planner took
    lower_bound: float = 0.0  # no plan's most loaded rank can cost less (seconds)
    towers: list[dict[str, Any]] | None = None
    notes: list[str] = field(default_factory=list)

    def rank_costs(self) -> list[RankCost]:
        W = self.topology.world_size
        acc = [[0.0, 0.0, 0.0, 0] for _ in range(W)]
        for p in self.placements.values():
            for s, c in zip(p.shards, p.costs, strict=True):
                a = acc[s.rank]
                a[0] += c.compute
                a[1] += c.memory
                a[2] += c.comm
                a[3] += c.bytes
        return [RankCost(r, a[0], a[1], a[2], int(a[3])) for r, a in enumerate(acc)]

    def loads(self) -> list[float]:
        return [r.total for r in self.rank_costs()]

    @property
    def max_cost(self) -> float:
        return max(self.loads())

    @property
    def imbalance(self) -> float:
        """max / mean cost over ranks (1: perfectly even)."""
        loads = self.loads()
        mean = sum(loads) / len(loads)
        return max(loads) / mean if mean > 0 else 1.0

    def rescore(self, model: CostModel) -> Plan:
        """This plan's shards costed by `model` (e.g. another topology's bandwidths)."""
        for p in self.placements.values():
            p.costs = [model.shard(p.table, p.kind, s.row0, s.rows, s.cols,
                                   len(p.shards)) for s in p.shards]
        return self

    def check(self, capacity: int | None = None) -> None:
        """Every table placed once and fully; ranks in range; memory within capacity."""
        W = self.topology.world_size
        for name, p in self.placements.items():
            t = p.table
            if p.kind not in SHARDING_TYPES:
                raise ConfigError(f"{name}: unknown sharding type {p.kind!r}")
            cells = 0
            for s in p.shards:
                if not 0 <= s.rank < W:
                    raise ConfigError(f"{name}: shard on rank {s.rank}, outside 0..{W - 1}")
                if s.row0 < 0 or s.col0 < 0 or s.row0 + s.rows > t.rows or \
                        s.col0 + s.cols > t.dim:
                    raise ConfigError(f"{name}: shard {s} outside the {t.rows}x{t.dim} table")
                cells += s.rows * s.cols
            if cells != t.rows * t.dim:  # shards tile the table (they never overlap here)
                raise ConfigError(f"{name}: shards cover {cells} of {t.rows * t.dim} cells")
        if capacity is not None:
            for r in self.rank_costs():
                if r.bytes > capacity:
                    raise ConfigError(f"rank {r.rank}: tables take {r.bytes} bytes, more "
                                      f"than its {capacity}")

    # -- JSON ---------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        tables = {}
        for name, p in self.placements.items():
            t = p.table
            tables[name] = {
                "module": t.module, "sharding_type": p.kind, "compute_kernel": KERNEL,
                "rows": t.rows, "dim": t.dim, "features": list(t.features),
                "cost_ms": round(p.cost * 1e3, 6),
                "load": {"ids": t.ids, "unique_ids": t.unique_ids,
                         "pooled_rows": t.pooled_rows, "hot": list(t.hot),
                         "blocks": list(t.blocks), "uniform_batch": t.uniform_batch},
                "shards": [{"rank": s.rank, "offsets": [s.row0, s.col0],
                            "sizes": [s.rows, s.cols], "cost_ms": round(c.total * 1e3, 6),
                            "bytes": c.bytes} for s, c in zip(p.shards, p.costs, strict=True)]}
        topo = self.topology
        ranks = [{"rank": r.rank, "host": topo.host_of(r.rank),
                  "cost_ms": round(r.total * 1e3, 6), "compute_ms": round(r.compute * 1e3, 6),
                  "memory_ms": round(r.memory * 1e3, 6), "comm_ms": round(r.comm * 1e3, 6),
                  "bytes": r.bytes, "capacity_bytes": topo.memory_bytes}
                 for r in self.rank_costs()]
        loads = [r["cost_ms"] for r in ranks]
        out: dict[str, Any] = {
            "planner": self.planner, "plan_seconds": round(self.seconds, 4),
            "max_ms": max(loads), "mean_ms": sum(loads) / len(loads),
            "imbalance": round(self.imbalance, 6),
            "lower_bound_ms": round(self.lower_bound * 1e3, 6),
            "sharding_types": {k: sum(p.kind == k for p in self.placements.values())
                               for k in SHARDING_TYPES},
            "tables": tables, "ranks": ranks, "notes": self.notes}
        if self.towers is not None:
            out["towers"] = self.towers
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any], topology: Topology, model: CostModel | None = None,
                  where: str = "plan") -> Plan:
        placements = {}
        try:
            for name, e in d["tables"].items():
                ld = e["load"]
                t = TableLoad(name=name, module=e["module"], rows=int(e["rows"]),
                              dim=int(e["dim"]), features=tuple(e["features"]), ids=ld["ids"],
                              unique_ids=ld["unique_ids"], pooled_rows=ld["pooled_rows"],
                              hot=tuple(ld["hot"]), blocks=tuple(ld["blocks"]),
                              uniform_batch=bool(ld["uniform_batch"]))
                shards = [Shard(int(s["rank"]), int(s["offsets"][0]), int(s["sizes"][0]),
                                int(s["offsets"][1]), int(s["sizes"][1])) for s in e["shards"]]
                placements[name] = Placement(t, e["sharding_type"], shards)
        except (KeyError, TypeError, ValueError, IndexError) as err:
            raise ConfigError(f"{where}: malformed plan ({err!r})") from None
        plan = cls(topology, placements, planner=str(d.get("planner", "?")),
                   seconds=float(d.get("plan_seconds", 0.0)), towers=d.get("towers"))
        plan.check()
        if model is not None:
            plan.rescore(model)
        else:
            for p, e in zip(plan.placements.values(), d["tables"].values(), strict=True):
                p.costs = [ShardCost(0.0, 0.0, float(s["cost_ms"]) / 1e3, int(s["bytes"]))
                           for s in e["shards"]]
        return plan


# -- the plan file ---------------------------------------------------------------------

def write_file(plans: Mapping[str, Plan], path: Path, *, calibration: Mapping[str, Any],
               stats: str, stage: str, force: bool = False) -> dict[str, Any]:
    """Write every model's plan to `path` (one JSON file, atomically); returns the doc."""
    from lrm import io

    first = next(iter(plans.values()))
    doc = {"format": FORMAT, "topology": first.topology.to_json(), "planner": first.planner,
           "calibration": dict(calibration), "stats": stats,
           "models": {k: p.to_json() for k, p in plans.items()}}
    io.write_json(doc, path, stage=stage, force=force)
    return doc


def read_file(path: Path) -> tuple[Topology, dict[str, Any]]:
    """(topology, model key -> plan JSON) of a plan file; errors name the file."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: plan file not found (run lrm shard-plan)") from None
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the plan ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(f"{path}: not a sharding plan ({FORMAT})")
    try:
        topo = Topology.from_json(doc["topology"])
        models = dict(doc["models"])
    except (KeyError, TypeError) as e:
        raise ConfigError(f"{path}: malformed plan ({e!r})") from None
    return topo, models


# -- torchrec ---------------------------------------------------------------------------

def _generator(p: Placement, topo: Topology) -> Any:
    from torchrec.distributed.sharding_plan import (
        column_wise,
        row_wise,
        table_row_wise,
        table_wise,
    )

    ranks = [s.rank for s in p.shards]
    if p.kind == TABLE_WISE:
        return table_wise(rank=ranks[0], compute_kernel=KERNEL)
    if p.kind == COLUMN_WISE:
        return column_wise(ranks=ranks, compute_kernel=KERNEL)
    if p.kind == ROW_WISE:
        return row_wise(compute_kernel=KERNEL)
    if p.kind == TABLE_ROW_WISE:
        return table_row_wise(host_index=topo.host_of(ranks[0]))
    raise ConfigError(f"{p.table.name}: unknown sharding type {p.kind!r}")


def _shards_of(ps: Any) -> list[Shard]:
    spec = ps.sharding_spec
    if spec is None:
        return []
    return [Shard(int(m.placement.rank()), int(m.shard_offsets[0]), int(m.shard_sizes[0]),
                  int(m.shard_offsets[1]), int(m.shard_sizes[1])) for m in spec.shards]


def to_torchrec(plan: Plan, model: nn.Module, *, device: str,
                local_world_size: int | None = None) -> Any:
    """The torchrec ShardingPlan of `plan` for `model` (its tables must be the plan's)."""
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan
    from torchrec.distributed.types import ShardingPlan

    topo = plan.topology
    local = local_world_size or topo.ranks_per_host
    sharder = EmbeddingBagCollectionSharder()
    seen: set[str] = set()
    out = {}
    for path, m in model.named_modules():
        if not isinstance(m, EmbeddingBagCollection):
            continue
        gens = {}
        for t in m.embedding_bag_configs():
            p = plan.placements.get(t.name)
            if p is None:
                raise ConfigError(f"the plan has no placement for table {t.name} (of "
                                  f"{path or 'the model'}): plan again for this model")
            if (p.table.rows, p.table.dim) != (t.num_embeddings, t.embedding_dim):
                raise ConfigError(f"the plan's table {t.name} is {p.table.rows}x{p.table.dim}; "
                                  f"the model's is {t.num_embeddings}x{t.embedding_dim}: "
                                  f"plan again for this model")
            gens[t.name] = _generator(p, topo)
            seen.add(t.name)
        module_plan = construct_module_sharding_plan(
            m, gens, sharder=sharder, local_size=local, world_size=topo.world_size,
            device_type=device)
        for name, ps in module_plan.items():
            ps.compute_kernel = KERNEL  # table_row_wise() takes no kernel: set it here
            want = sorted(plan.placements[name].shards, key=lambda s: (s.row0, s.col0))
            got = sorted(_shards_of(ps), key=lambda s: (s.row0, s.col0))
            if got != want:
                raise ConfigError(f"table {name}: torchrec cannot shard it as the plan says "
                                  f"({plan.placements[name].kind}: {want} vs {got})")
        out[path] = module_plan
    extra = sorted(set(plan.placements) - seen)
    if extra:
        raise ConfigError(f"the plan places tables the model does not have: {extra}")
    return ShardingPlan(out)


def from_torchrec(sharding_plan: Any, loads: Sequence[TableLoad], topo: Topology,
                  model: CostModel, planner: str = "torchrec") -> Plan:
    """lrm's Plan of a torchrec ShardingPlan (its sharding types as lrm names them)."""
    by_name = {t.name: t for t in loads}
    placements = {}
    for _, module_plan in sharding_plan.plan.items():
        for name, ps in module_plan.items():
            kind = ps.sharding_type
            if kind == "table_column_wise":  # column-wise shards placed like tables
                kind = COLUMN_WISE
            placements[name] = Placement(by_name[name], kind, _shards_of(ps))
    plan = Plan(topo, placements, planner=planner)
    plan.check()
    return plan.rescore(model)


def training_plan(path: Path, key: str, *, kind: str, model_cfg: Any, data: Path,
                  device: str) -> Any:
    """The torchrec ShardingPlan for a `kind` model of `model_cfg` on dataset `data`, from
    plan file `path` (its entry `key`), for a run of WORLD_SIZE processes (torchrun's; 1
    without it) on `device` (train.device: auto | cpu | cuda)."""
    import torch

    from lrm.data.schema import read_schema
    from lrm.models import build_model

    schema, _ = read_schema(data)
    model = build_model(kind, schema, model_cfg, device="meta", dense_device="meta")
    device = "cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) \
        else "cpu"  # as lrm.dist picks the training device
    topo, models = read_file(path)
    if key not in models:
        raise ConfigError(f"{path}: no plan for {key} (it has {sorted(models)}): run "
                          f"lrm shard-plan for this model")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != topo.world_size:
        raise ConfigError(f"{path}: the plan is for {topo.world_size} ranks; this run has "
                          f"{world} (plan again with --world-size {world}, or launch "
                          f"python -m lrm.launch --nproc-per-node={topo.world_size})")
    plan = Plan.from_json(models[key], topo, where=f"{path}: {key}")
    bad = sorted(n for n, p in plan.placements.items() if p.kind not in DEVICE_TYPES[device])
    if bad:
        raise ConfigError(f"{path}: tables {bad} are sharded in ways torchrec cannot run on "
                          f"{device} ranks (plan with --compute-device {device})")
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(topo.ranks_per_host)))
    return to_torchrec(plan, model, device=device, local_world_size=local)


def summary_table(plan: Plan, title: str, most: int = 32) -> Any:
    """A rich Table of a plan: one line per rank (its tables, cost parts, memory); past
    `most` ranks, the `most` most loaded ones."""
    from rich.table import Table

    topo = plan.topology
    on: dict[int, list[str]] = {r: [] for r in range(topo.world_size)}
    for name, p in plan.placements.items():
        tag = {TABLE_WISE: "", COLUMN_WISE: "/cw", ROW_WISE: "/rw", TABLE_ROW_WISE: "/twrw"}
        for s in p.shards:
            on[s.rank].append(name + tag[p.kind])
    table = Table(title=f"{title}: max {plan.max_cost * 1e3:.3f} ms, max/mean "
                        f"{plan.imbalance:.3f} ({plan.planner}, {plan.seconds:.2f} s)")
    for col in ("rank", "host", "ms/step", "compute", "memory", "comm", "MiB", "tables"):
        table.add_column(col, justify="left" if col == "tables" else "right")
    ranks = plan.rank_costs()
    shown = ranks if len(ranks) <= most else sorted(
        sorted(ranks, key=lambda r: -r.total)[:most], key=lambda r: r.rank)
    if len(shown) < len(ranks):
        table.caption = f"the {most} most loaded of {len(ranks)} ranks"
    for r in shown:
        table.add_row(str(r.rank), str(topo.host_of(r.rank)), f"{r.total * 1e3:.3f}",
                      f"{r.compute * 1e3:.3f}", f"{r.memory * 1e3:.3f}",
                      f"{r.comm * 1e3:.3f}", f"{r.bytes / (1 << 20):.1f}",
                      " ".join(sorted(on[r.rank])))
    return table

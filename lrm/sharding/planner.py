"""The planners: where each table's shards go, minimizing the most loaded rank's cost.

* `greedy` (the baseline): tables by cost, largest first, each whole (table-wise) to the
  least loaded rank with room; a table that fits no rank whole gets the cheapest split
  that fits.
* `lrm` (the default): the same greedy start, then two searches until nothing improves
  or the time limit is spent:
  - local refinement: move a shard off the most loaded rank to the least loaded rank
    that can take it, or swap it for a cheaper shard there, while that lowers the
    maximum (each step lowers the sum of squared loads, so it ends);
  - splitting: when the most loaded rank is held up by one table, try that table's next
    finer split (column-wise in more shards, row-wise, table-row-wise on a host), place
    it and refine again; keep it only if the maximum drops. Splits cost extra lookups
    and traffic, so a table is split only where that buys a lower maximum.
  Why this and not an exact solver: the assignment is a makespan problem (NP-hard); an
  ILP over 1,000 tables x 512 ranks x split choices does not finish in seconds, while
  the greedy start (largest first to the least loaded: LPT) is within 4/3 of the optimal
  assignment when memory does not bind (Graham's bound), and the moves and splits land
  within a few percent of the lower bound max(mean load, heaviest indivisible shard),
  which every plan reports (`lower_bound_ms`). Two starts are searched, whole tables and
  tables pre-split under the mean load; the better plan wins.
* `torchrec`: torchrec's EmbeddingShardingPlanner on the same tables, topology and
  statistics (lrm.sharding.compare), for comparison.

On one device every table stays whole (table-wise): nothing to balance, and splitting
only adds work (measured on an H100: torchrec's planner split the user tables
column-wise there, costing 2 ms of host time per step). With `towers` (DMT), each table
may only use the ranks of its tower's host (lrm.sharding.towers).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from lrm.errors import ConfigError
from lrm.sharding.cost import CostModel, ShardCost
from lrm.sharding.plan import Placement, Plan, Shard
from lrm.sharding.stats import TableLoad
from lrm.sharding.topology import (
    COLUMN_WISE,
    GIB,
    ROW_WISE,
    TABLE_ROW_WISE,
    TABLE_WISE,
    Topology,
)

MIN_COLUMNS = 4  # torchrec's column-wise shards are multiples of 4 columns
_TOL = 1e-9
NEAR = 1e-3  # a plan within 0.1% of the lower bound is done: the search stops there


def _gib(n: float) -> str:
    return f"{n / GIB:.3g} GiB"


@dataclass(frozen=True, eq=False)
class Option:
    """One way to shard a table: per shard its first row, rows, first column, columns, and
    rank (-1: any rank may take it, table-/column-wise; row-wise shards sit on fixed ranks;
    table-row-wise ones on the ranks of one host, chosen when placed), with its costs."""

    kind: str
    row0: np.ndarray
    rows: np.ndarray
    col0: np.ndarray
    cols: np.ndarray
    rank: np.ndarray
    parts: np.ndarray  # [shards, 3]: compute, memory, comm seconds
    nbytes: np.ndarray

    @property
    def n(self) -> int:
        return int(self.rows.size)

    # cached: the search reads them per shard and per candidate; `parts` never changes
    @cached_property
    def cost(self) -> np.ndarray:
        return self.parts.sum(1)

    @cached_property
    def total(self) -> float:
        return float(self.parts.sum())

    @cached_property
    def peak(self) -> float:
        return float(self.cost.max())

    @property
    def peak_bytes(self) -> int:
        return int(self.nbytes.max())

    def shard_cost(self, i: int) -> ShardCost:
        c, m, k = self.parts[i]
        return ShardCost(float(c), float(m), float(k), int(self.nbytes[i]))


def _row_blocks(rows: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """torchrec's row-wise split: blocks of ceil(rows / n), the last ones short or empty."""
    block = math.ceil(rows / n)
    r0 = np.minimum(np.arange(n, dtype=np.int64) * block, rows)
    return r0, np.minimum(r0 + block, rows) - r0


def options(t: TableLoad, topo: Topology, model: CostModel,
            hosts: Sequence[int] | None = None) -> list[Option]:
    """Every way `t` may be sharded on `topo` (within `hosts`, when given)."""
    types = topo.sharding_types()
    n_ranks = topo.world_size if hosts is None else len(hosts) * topo.ranks_per_host
    out = []

    def make(kind: str, row0: Any, rows: Any, col0: Any, cols: Any, rank: Any,
             group: int | None = None) -> Option:
        row0, rows = np.asarray(row0, np.int64), np.asarray(rows, np.int64)
        col0 = np.broadcast_to(np.asarray(col0, np.int64), rows.shape)
        cols = np.broadcast_to(np.asarray(cols, np.int64), rows.shape)
        c, m, k, b = model.shards(t, kind, row0, rows, cols, group)
        return Option(kind, row0, rows, col0, cols,
                      np.broadcast_to(np.asarray(rank, np.int64), rows.shape),
                      np.stack([c, m, k], 1), b)

    out.append(make(TABLE_WISE, [0], [t.rows], 0, t.dim, -1))
    if COLUMN_WISE in types:
        for k in range(2, min(n_ranks, t.dim // MIN_COLUMNS) + 1):
            w = t.dim // k
            if t.dim % k == 0 and w % MIN_COLUMNS == 0:
                out.append(make(COLUMN_WISE, np.zeros(k), np.full(k, t.rows),
                                np.arange(k) * w, w, -1))
    W, R = topo.world_size, topo.ranks_per_host
    if ROW_WISE in types and hosts is None and t.rows >= W:
        r0, n = _row_blocks(t.rows, W)
        out.append(make(ROW_WISE, r0, n, 0, t.dim, np.arange(W)))
    if TABLE_ROW_WISE in types and t.rows >= R and R > 1:
        r0, n = _row_blocks(t.rows, R)
        out.append(make(TABLE_ROW_WISE, r0, n, 0, t.dim, -1, group=R))
    return out


class _NoRoom(Exception):
    def __init__(self, table: str, kind: str, nbytes: int, rank: int, free: float) -> None:
        super().__init__(table)
        self.table, self.kind, self.nbytes, self.rank, self.free = table, kind, nbytes, rank, free


class _State:
    """Loads, memory and shard positions of a plan being built."""

    def __init__(self, topo: Topology, allowed: Mapping[str, np.ndarray | None]) -> None:
        W = topo.world_size
        self.topo = topo
        self.cap = float(topo.memory_bytes)
        self.load = np.zeros(W)
        self.mem = np.zeros(W)
        self.choice: dict[str, Option] = {}
        self.ranks: dict[str, list[int]] = {}
        self.on: list[dict[tuple[str, int], float]] = [{} for _ in range(W)]
        self.allowed = allowed  # table -> bool mask of the ranks it may use (None: all)

    def copy(self) -> _State:
        s = _State.__new__(_State)
        s.topo, s.cap, s.allowed = self.topo, self.cap, self.allowed
        s.load, s.mem = self.load.copy(), self.mem.copy()
        s.choice, s.ranks = dict(self.choice), {k: list(v) for k, v in self.ranks.items()}
        s.on = [dict(d) for d in self.on]
        return s

    def movable(self, name: str) -> bool:
        return self.choice[name].kind in (TABLE_WISE, COLUMN_WISE)

    def _put(self, name: str, i: int, rank: int) -> None:
        opt = self.choice[name]
        c = float(opt.cost[i])
        self.load[rank] += c
        self.mem[rank] += opt.nbytes[i]
        self.on[rank][(name, i)] = c
        self.ranks[name][i] = rank

    def _take(self, name: str, i: int) -> int:
        rank = self.ranks[name][i]
        opt = self.choice[name]
        self.load[rank] -= float(opt.cost[i])
        self.mem[rank] -= opt.nbytes[i]
        del self.on[rank][(name, i)]
        return rank

    def remove(self, name: str) -> None:
        for i in range(self.choice[name].n):
            self._take(name, i)
        del self.choice[name], self.ranks[name]

    def candidates(self, name: str, nbytes: float, exclude: Sequence[int] = ()) -> np.ndarray:
        """Loads, with inf where a shard of `name` of `nbytes` may not go."""
        cand = self.load.copy()
        cand[self.mem + nbytes > self.cap] = np.inf
        mask = self.allowed.get(name)
        if mask is not None:
            cand[~mask] = np.inf
        for r in exclude:
            if r >= 0:
                cand[r] = np.inf
        return cand

    def place(self, t: TableLoad, opt: Option) -> None:
        """Put `opt`'s shards on the least loaded ranks that can take them (or raise _NoRoom)."""
        name = t.name
        self.choice[name] = opt
        self.ranks[name] = [-1] * opt.n
        cost = opt.cost
        try:
            if opt.kind == ROW_WISE:
                over = self.mem[opt.rank] + opt.nbytes > self.cap
                if over.any():
                    raise self._no_room(name, opt.kind, int(opt.nbytes[over].max()))
                for i, r in enumerate(opt.rank):
                    self._put(name, i, int(r))
            elif opt.kind == TABLE_ROW_WISE:
                best, best_host = np.inf, -1
                mask = self.allowed.get(name)
                for h in range(self.topo.hosts):
                    rs = np.asarray(self.topo.host_ranks(h))
                    if mask is not None and not mask[rs[0]]:
                        continue
                    if (self.mem[rs] + opt.nbytes > self.cap).any():
                        continue
                    peak = float((self.load[rs] + cost).max())
                    if peak < best:
                        best, best_host = peak, h
                if best_host < 0:
                    raise self._no_room(name, opt.kind, opt.peak_bytes)
                for i, r in enumerate(self.topo.host_ranks(best_host)):
                    self._put(name, i, r)
            else:
                for i in np.argsort(-cost, kind="stable"):
                    cand = self.candidates(name, opt.nbytes[i], self.ranks[name])
                    r = int(np.argmin(cand))
                    if not np.isfinite(cand[r]):
                        raise self._no_room(name, opt.kind, int(opt.nbytes[i]))
                    self._put(name, int(i), r)
        except _NoRoom:
            for i, r in enumerate(self.ranks[name]):
                if r >= 0:
                    self._take(name, i)
            del self.choice[name], self.ranks[name]
            raise

    def _no_room(self, name: str, kind: str, nbytes: int) -> _NoRoom:
        free = self.cap - self.mem
        mask = self.allowed.get(name)
        if mask is not None:
            free = np.where(mask, free, -np.inf)
        r = int(np.argmax(free))
        return _NoRoom(name, kind, nbytes, r, float(free[r]))

    # -- local refinement -----------------------------------------------------------
    def refine(self, deadline: float, lower: float = 0.0, swap_ranks: int = 16) -> None:
        """Moves and swaps off the most loaded rank while they lower it (module docstring),
        until the maximum reaches `lower` (a lower bound) or time is up."""
        while time.perf_counter() < deadline:
            m = int(np.argmax(self.load))
            top = self.load[m]
            if top <= lower * (1 + NEAR):
                return
            tol = _TOL * max(top, 1e-12)
            units = sorted(((c, k) for k, c in self.on[m].items() if self.movable(k[0])),
                           reverse=True)
            if self._move(m, top, tol, units) or self._swap(m, top, tol, units, swap_ranks):
                continue
            return

    def _move(self, m: int, top: float, tol: float, units: list) -> bool:
        for c, (name, i) in units:
            nbytes = self.choice[name].nbytes[i]
            cand = self.candidates(name, nbytes, self.ranks[name])
            r = int(np.argmin(cand))
            if cand[r] + c < top - tol:
                self._take(name, i)
                self._put(name, i, r)
                return True
        return False

    def _swap(self, m: int, top: float, tol: float, units: list, k: int) -> bool:
        order = [int(r) for r in np.argsort(self.load)[:k + 1] if r != m][:k]
        best = None
        for c, (name, i) in units:
            bu = self.choice[name].nbytes[i]
            mask = self.allowed.get(name)
            for r in order:
                if name in {n for n, _ in self.on[r]} or (mask is not None and not mask[r]):
                    continue
                for (n2, j), c2 in self.on[r].items():
                    if c2 >= c or not self.movable(n2):
                        continue
                    m2 = self.allowed.get(n2)
                    if (m2 is not None and not m2[m]) or n2 in {n for n, _ in self.on[m]}:
                        continue
                    bv = self.choice[n2].nbytes[j]
                    if self.mem[r] - bv + bu > self.cap or self.mem[m] - bu + bv > self.cap:
                        continue
                    peak = max(top - c + c2, self.load[r] - c2 + c)
                    if peak < top - tol and (best is None or peak < best[0]):
                        best = (peak, name, i, n2, j, r)
        if best is None:
            return False
        _, name, i, n2, j, r = best
        self._take(name, i)
        self._take(n2, j)
        self._put(name, i, r)
        self._put(n2, j, m)
        return True

    def plan(self, loads: Sequence[TableLoad], planner: str, seconds: float,
             lower_bound: float) -> Plan:
        placements = {}
        for t in loads:
            opt = self.choice[t.name]
            shards = [Shard(r, int(opt.row0[i]), int(opt.rows[i]), int(opt.col0[i]),
                            int(opt.cols[i])) for i, r in enumerate(self.ranks[t.name])]
            placements[t.name] = Placement(t, opt.kind, shards,
                                           [opt.shard_cost(i) for i in range(opt.n)])
        return Plan(self.topo, placements, planner=planner, seconds=seconds,
                    lower_bound=lower_bound)


def _memory_error(err: _NoRoom, label: str, topo: Topology,
                  need: float) -> ConfigError:
    W, cap = topo.world_size, topo.memory_bytes
    total = W * cap
    short = f"; in all the tables need at least {_gib(need)} and the {W} ranks hold " \
        f"{_gib(total)}" + (f" ({_gib(need - total)} missing)" if need > total else "")
    key = "hbm_gb" if topo.device == "cuda" else "host_gb"
    return ConfigError(
        f"{label}: the topology cannot hold the tables: {err.table} ({err.kind} shard of "
        f"{_gib(err.nbytes)}) fits on no rank; rank {err.rank} has the most room, "
        f"{_gib(max(err.free, 0))} free of {_gib(cap)} for tables, "
        f"{_gib(err.nbytes - max(err.free, 0))} missing{short}; raise "
        f"sharding.topology.{key} or world_size")


def plan(loads: Sequence[TableLoad], topo: Topology, model: CostModel, *, method: str = "lrm",
         time_limit: float = 5.0, hosts: Mapping[str, int] | None = None,
         label: str = "model") -> Plan:
    """Place every table of `loads` on `topo` (see the module docstring).

    hosts: table -> the host whose ranks it must use (DMT towers); label names the model
    in errors. A topology that cannot hold the tables is a ConfigError saying how much
    memory is missing on which rank.
    """
    if method not in ("lrm", "greedy"):
        raise ValueError(f"unknown planner {method!r}")
    start = time.perf_counter()
    W = topo.world_size
    allowed: dict[str, np.ndarray | None] = {}
    opts: dict[str, list[Option]] = {}
    for t in loads:
        h = None if hosts is None else hosts[t.name]
        if h is None:
            allowed[t.name] = None
        else:
            mask = np.zeros(W, dtype=bool)
            mask[list(topo.host_ranks(h))] = True
            allowed[t.name] = mask
        opts[t.name] = options(t, topo, model, None if h is None else [h])
    by_total = {n: sorted(o, key=lambda x: (x.total, x.peak)) for n, o in opts.items()}
    need = sum(min(int(o.nbytes.sum()) for o in os_) for os_ in opts.values())
    lower = max(sum(o[0].total for o in by_total.values()) / W,
                max(min(x.peak for x in o) for o in opts.values()))
    mean = sum(o[0].total for o in by_total.values()) / W

    def start_from(presplit: bool) -> _State:
        """Every table placed, largest first, on the least loaded rank with room: whole
        (greedy), or (presplit) in the cheapest split whose largest shard stays under the
        mean load; when a shard fits no rank, smaller shards are tried."""
        st = _State(topo, allowed)

        def choices(name: str) -> list[Option]:
            o = by_total[name]
            head = [x for x in o if x.peak <= mean] or [min(o, key=lambda x: x.peak)] \
                if presplit else [x for x in o if x.kind == TABLE_WISE]
            rest = sorted((x for x in o if x is not head[0]), key=lambda x: (x.peak_bytes,
                                                                          x.total))
            return head[:1] + rest

        first = {t.name: choices(t.name) for t in loads}
        order = sorted(loads, key=lambda t: (
            {ROW_WISE: 0, TABLE_ROW_WISE: 1}.get(first[t.name][0].kind, 2),
            -first[t.name][0].peak))
        for t in order:
            err = None
            for opt in first[t.name]:
                try:
                    st.place(t, opt)
                    err = None
                    break
                except _NoRoom as e:
                    err = e  # the last tried has the smallest shards: the nearest miss
            if err is not None:
                raise _memory_error(err, label, topo, need)
        return st

    st = start_from(presplit=False)
    if method == "lrm" and W > 1:
        # two starts, each refined and split where that helps; the better plan wins
        # (pre-splitting is faster on many tables, starting whole wins where splits cost)
        best = None
        for i, presplit in enumerate((False, True)):
            s0 = st if not presplit else start_from(presplit=True)
            share = start + time_limit * (i + 1) / 2
            s0.refine(share, lower)
            s0 = _split(s0, loads, opts, share, lower)
            if best is None or s0.load.max() < best.load.max():
                best = s0
            if best.load.max() <= lower * (1 + NEAR):
                break
        st = best
    return st.plan(loads, method, time.perf_counter() - start, lower)


def _split(st: _State, loads: Sequence[TableLoad], opts: Mapping[str, list[Option]],
           deadline: float, lower: float) -> _State:
    """Finer splits of the tables on the most loaded rank, kept when the maximum drops."""
    by_name = {t.name: t for t in loads}
    tried: set[tuple[str, int]] = set()
    while time.perf_counter() < deadline:
        top = float(st.load.max())
        if top <= lower * (1 + NEAR):
            return st
        m = int(np.argmax(st.load))
        units = sorted(((c, name) for (name, _), c in st.on[m].items()), reverse=True)
        improved = False
        for c, name in units:
            finer = sorted((o for o in opts[name] if o.peak < c * (1 - 1e-9)
                            and (name, id(o)) not in tried), key=lambda o: (o.total, o.peak))
            for o in finer[:3]:
                tried.add((name, id(o)))
                trial = st.copy()
                trial.remove(name)
                try:
                    trial.place(by_name[name], o)
                except _NoRoom:
                    continue
                trial.refine(deadline, lower)
                if trial.load.max() < top * (1 - 1e-6):
                    st, improved = trial, True
                    break
            if improved or time.perf_counter() >= deadline:
                break
        if not improved:
            return st
    return st


def plan_model(loads: Sequence[TableLoad], topo: Topology, model: CostModel, *,
               method: str = "lrm", towers: bool = False, time_limit: float = 5.0,
               cooccurrence: Mapping[str, Mapping[str, float]] | None = None,
               module: object = None, label: str = "model") -> Plan:
    """One model's plan by `method` (lrm | greedy | torchrec), with DMT towers when asked
    and the topology has more than one host (one host: a single tower, nothing to do)."""
    if method == "torchrec":
        from lrm.sharding.compare import torchrec_plan

        try:
            return torchrec_plan(loads, topo, model, module=module,  # type: ignore[arg-type]
                                 timeout=max(1, int(time_limit)))
        except Exception as e:  # torchrec's PlannerError: it says what did not fit
            if type(e).__name__ != "PlannerError":
                raise
            raise ConfigError(f"{label}: torchrec's planner found no plan: "
                              f"{str(e).splitlines()[0]}") from None
    hosts, report = None, None
    if towers and topo.hosts > 1:
        from lrm.sharding.towers import group

        hosts, report = group(loads, topo, model, cooccurrence or {})
    p = plan(loads, topo, model, method=method, time_limit=time_limit, hosts=hosts,
             label=label)
    if towers and topo.hosts == 1:
        p.notes.append("towers: one host, so one tower: nothing to group")
    if report is not None:
        by_table = p.rank_costs()
        for r in report:
            ranks = list(topo.host_ranks(r["host"]))
            r["cost_ms"] = round(sum(by_table[k].total for k in ranks) * 1e3, 6)
        p.towers = report
    return p

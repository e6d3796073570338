"""Sharding benchmarks: `python bench/sharding.py [--quick]` prints one JSON line per case.

sharding.imbalance   max/mean cost over ranks of lrm's plan vs torchrec's
                     EmbeddingShardingPlanner's (ratio: torchrec's over lrm's), per
                     (tables, ranks); the greedy baseline's, and every plan scored by
                     torchrec's EmbeddingPerfEstimator too, ride along
sharding.plan_time   seconds to plan, torchrec's over lrm's
sharding.estimate    the cost model's estimate vs the time measured on 2 CPU processes
                     (gloo) training the planned tables: each rank's lookups, and the whole
                     step; ratio: min/max of the two (1 = exact), the signed error beside

Tables: rows lognormal (median 1e5, capped at 1e8), widths 16-128, pooling factors
lognormal (median 2.7, capped at 100), 30% user-side (one lookup row per 5 impressions,
RecD); 512 impressions per rank and step. Topology: GPUs, 8 to a host, 80 GiB HBM, NVLink
300 GB/s, 25 GB/s between hosts; lrm's cost model is the analytic HBM one (no GPU
calibration file yet). torchrec's planner runs in a child process, killed after its
budget: on 1,000 tables its enumeration alone takes minutes, and that is the outcome
reported. lrm's search gets 4 s (building its options comes on top). Cases: 10, 100,
1,000 tables x 8, 64, 512 ranks, torchrec's budget 300 s (--quick: 10x8 and 100x8 with
10 s, 1,000x512 with 5 s; --smoke: 10x8 with lrm's search at 0.5 s, and the estimate on
small tables, 256 impressions a rank, one step: seconds, that it runs).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import add_mode_flags, emit, record, smoke, use_mode  # noqa: E402
from lrm.sharding import compare, planner  # noqa: E402
from lrm.sharding.cost import CALIBRATIONS, Calibration, CostModel  # noqa: E402
from lrm.sharding.plan import Plan  # noqa: E402
from lrm.sharding.stats import TableLoad  # noqa: E402
from lrm.sharding.topology import GIB, Topology  # noqa: E402

PER_RANK_BATCH = 512
FULL = [(n, w) for n in (10, 100, 1000) for w in (8, 64, 512)]
QUICK = [(10, 8), (100, 8), (1000, 512)]
SMOKE = [(10, 8)]


def tables(n: int, world: int, seed: int = 0, batch: int = PER_RANK_BATCH,
           max_rows: float = 1e8) -> list[TableLoad]:
    g = np.random.default_rng(seed + 1000 * n)
    B = batch * world
    out = []
    for i in range(n):
        rows = int(min(g.lognormal(np.log(1e5), 2.0), max_rows)) + 16
        dim = int(g.choice([16, 32, 64, 128], p=[0.3, 0.3, 0.25, 0.15]))
        pool = float(min(g.lognormal(1.0, 1.0), 100.0))
        user = bool(g.random() < 0.3)
        per = 0.2 if user else 1.0
        ids = B * per * pool
        out.append(TableLoad(name=f"t{i}", module="", rows=rows, dim=dim, features=(f"f{i}",),
                             ids=ids, unique_ids=min(float(rows), ids * 0.6),
                             pooled_rows=B * per, uniform_batch=not user))
    return out


def gpu_topology(world: int) -> Topology:
    return Topology(world_size=world, ranks_per_host=min(8, world), device="cuda",
                    memory_bytes=int(80 * GIB * 0.85), intra_host_bw=300e9,
                    inter_host_bw=25e9, hbm_bw=3350e9)


def _torchrec_child(conn: Any) -> None:
    """Plans (n, world, budget) jobs with torchrec's planner until the pipe closes."""
    import torchrec.distributed.planner  # noqa: F401  (imported before the first budget runs)

    conn.send_bytes(b"up")
    while True:
        try:
            n, world, budget = json.loads(conn.recv_bytes().decode())
        except EOFError:
            return
        topo = gpu_topology(world)
        loads = tables(n, world)
        model = CostModel(topo, Calibration.load(CALIBRATIONS, topo), tables=n)
        module = compare.tables_module(loads)
        conn.send_bytes(b"ready")  # the budget starts now
        try:
            p = compare.torchrec_plan(loads, topo, model, module=module, timeout=budget)
            conn.send_bytes(json.dumps({"plan": p.to_json(), "seconds": p.seconds}).encode())
        except Exception as e:  # reported as the outcome (e.g. torchrec's PlannerError)
            conn.send_bytes(json.dumps({"error": f"{type(e).__name__}: {e}"[:300]}).encode())


class TorchrecPlanner:
    """torchrec's planner in a child process (imported once), killed when a job runs past
    its budget (torchrec's own timeout bounds only its proposers, not its enumeration)."""

    def __init__(self) -> None:
        self.proc: Any = None

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_torchrec_child, args=(child,), daemon=True)
        self.proc.start()
        if not (self.conn.poll(600) and self.conn.recv_bytes() == b"up"):
            raise RuntimeError("torchrec's planner process did not start")

    def plan(self, n: int, world: int, budget: float) -> dict[str, Any]:
        if self.proc is None:
            self._start()
        self.conn.send_bytes(json.dumps([n, world, max(1, int(budget))]).encode())
        if self.conn.poll(600) and self.conn.recv_bytes() == b"ready" and \
                self.conn.poll(budget):
            return json.loads(self.conn.recv_bytes().decode())
        self.close()  # past its budget: the next job gets a fresh process
        return {"timed_out": True}

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.join()
            self.proc = None


def imbalance(per_rank: list[float]) -> float:
    mean = sum(per_rank) / len(per_rank)
    return max(per_rank) / mean if mean > 0 else 1.0


def plan_case(n: int, world: int, budget: float, time_limit: float,
              torchrec: TorchrecPlanner) -> None:
    topo = gpu_topology(world)
    loads = tables(n, world)
    cal = Calibration.load(CALIBRATIONS, topo)
    model = CostModel(topo, cal, tables=n)
    ours = planner.plan(loads, topo, model, method="lrm", time_limit=time_limit)
    greedy = planner.plan(loads, topo, model, method="greedy")
    tr = torchrec.plan(n, world, budget)
    theirs = None
    if "plan" in tr:
        theirs = Plan.from_json(tr["plan"], topo, model)
        theirs.seconds = tr["seconds"]
    est = {name: imbalance(compare.torchrec_costs(p))
           for name, p in (("lrm", ours), ("greedy", greedy), ("torchrec", theirs)) if p}
    case = f"{n} tables x {world} ranks"
    extra = {"greedy": round(greedy.imbalance, 4), "lower_bound_ms": ours.lower_bound * 1e3,
             "max_ms": {"lrm": ours.max_cost * 1e3, "greedy": greedy.max_cost * 1e3,
                        "torchrec": theirs.max_cost * 1e3 if theirs else None},
             "by_torchrec_estimator": {k: round(v, 4) for k, v in est.items()},
             "types": {"lrm": ours.to_json()["sharding_types"],
                       "torchrec": theirs.to_json()["sharding_types"] if theirs else None},
             "cost_model": cal.source}
    if theirs is not None:
        emit("sharding.imbalance", case, "max/mean", round(ours.imbalance, 4),
             round(theirs.imbalance, 4), "lower", **extra)
        emit("sharding.plan_time", case, "s", round(ours.seconds, 3), round(theirs.seconds, 3),
             "lower", greedy_s=round(greedy.seconds, 3))
        return
    why = tr.get("error") or f"torchrec's planner did not finish in {budget:.0f} s"
    for bench, unit, cand in (("sharding.imbalance", "max/mean", round(ours.imbalance, 4)),
                              ("sharding.plan_time", "s", round(ours.seconds, 3))):
        record({"bench": bench, "case": case, "unit": unit, "candidate": cand,
                "baseline": round(budget, 1) if unit == "s" and "error" not in tr else None,
                "ratio": round(budget / cand, 2) if unit == "s" and "error" not in tr
                else None, "better": "lower", "baseline_outcome": why,
                **({"bound": "baseline and ratio are lower bounds"} if unit == "s"
                   else extra)})


# -- the cost model against 2 CPU processes --------------------------------------------

def _estimate_worker(rank: int, port: int, plan_doc: str, steps: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torchrec import KeyedJaggedTensor
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    from lrm.sharding import parallel
    from lrm.sharding.plan import to_torchrec

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        doc = json.loads(plan_doc)
        topo = Topology.from_json(doc["topology"])
        plan = Plan.from_json(doc["plan"], topo)
        loads = [p.table for p in plan.placements.values()]
        ebc = compare.tables_module(loads)
        dmp = DistributedModelParallel(
            ebc, env=ShardingEnv.from_process_group(dist.GroupMember.WORLD),
            device=torch.device("cpu"), plan=to_torchrec(plan, ebc, device="cpu"),
            sharders=parallel.sharders(0.01))
        lookups = [x for m in dmp.modules() for x in getattr(m, "_lookups", [])]  # a list,
        # not a ModuleList, in torchrec's ShardedEmbeddingBagCollection
        seen: list[tuple[Any, Any]] = []
        hooks = [m.register_forward_hook(lambda m, args, out: seen.append((m, args)))
                 for m in lookups]
        g = np.random.default_rng(rank)
        B = doc["batch"]
        steps_s = []
        for step in range(steps + 2):
            lengths, values = [], []
            for t in loads:
                n = g.poisson(t.ids / t.pooled_rows, B)
                lengths.append(n)
                values.append(g.integers(0, t.rows, int(n.sum())))
            kjt = KeyedJaggedTensor(keys=[t.features[0] for t in loads],
                                    values=torch.from_numpy(np.concatenate(values)),
                                    lengths=torch.from_numpy(np.concatenate(lengths)))
            seen.clear()
            dist.barrier()
            t0 = time.perf_counter()
            dmp(kjt).values().sum().backward()
            dist.barrier()
            if step >= 2:
                steps_s.append(time.perf_counter() - t0)
        for h in hooks:
            h.remove()
        # this rank's lookups alone: its lookup modules rerun (fwd + bwd) on the inputs the
        # input dist gave them in the last step, the other rank doing the same meanwhile
        local = []
        for _ in range(steps):
            dist.barrier()
            t0 = time.perf_counter()
            for m, args in seen:
                y = m(*args)
                (y if isinstance(y, torch.Tensor) else torch.cat(list(y), 1)).sum().backward()
            local.append(time.perf_counter() - t0)
        Path(out, f"rank{rank}.json").write_text(json.dumps({"step": steps_s,
                                                             "lookup": local}))
    finally:
        dist.destroy_process_group()


PER_RANK_BATCH_CPU = 2048


def estimate_case(steps: int, batch: int = PER_RANK_BATCH_CPU, max_rows: float = 2e6) -> None:
    """Plan 12 CPU-sized tables for 2 CPU ranks with the measured CPU calibration, train
    them under 2 processes and compare each step's time with the estimate."""
    import tempfile

    import torch.multiprocessing as tmp_mp

    topo = Topology(world_size=2, ranks_per_host=2, device="cpu", memory_bytes=4 * GIB,
                    intra_host_bw=2e9, inter_host_bw=2e9, hbm_bw=1.0)
    g = np.random.default_rng(7)
    B = 2 * batch
    loads = []
    for i in range(12):  # item-side tables: every rank looks up `batch` rows
        rows = int(min(g.lognormal(np.log(1e5), 1.5), max_rows)) + 16
        pool = float(min(g.lognormal(1.0, 0.7), 20.0))
        loads.append(TableLoad(name=f"t{i}", module="", rows=rows,
                               dim=int(g.choice([16, 32, 64])), features=(f"f{i}",),
                               ids=B * pool, unique_ids=min(float(rows), B * pool * 0.9),
                               pooled_rows=B))
    cal = Calibration.load(CALIBRATIONS, topo)
    model = CostModel(topo, cal, tables=len(loads))
    plan = planner.plan(loads, topo, model, time_limit=2)
    doc = json.dumps({"topology": topo.to_json(), "plan": plan.to_json(), "batch": batch})
    with tempfile.TemporaryDirectory() as d, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        tmp_mp.spawn(_estimate_worker, args=(port, doc, steps, d), nprocs=2)
        got = [json.loads(Path(d, f"rank{r}.json").read_text()) for r in range(2)]
    ranks = plan.rank_costs()
    lookup_est = [r.compute + r.memory + cal.per_call for r in ranks]
    lookup_got = [statistics.median(x["lookup"]) for x in got]
    step_est = max(r.total + cal.per_call for r in ranks)  # the ranks wait for each other
    step_got = max(statistics.median(x["step"]) for x in got)
    common = {"cost_model": cal.source, "per_rank_batch": batch,
              "ranks_on": "this machine, both ranks (its load: load_avg)"}
    for r in range(2):
        e, m = lookup_est[r], lookup_got[r]
        record({
            "bench": "sharding.estimate", "case": f"rank {r} lookups (fwd+bwd), 12 tables x "
            "2 CPU ranks", "unit": "s", "candidate": round(e, 6), "baseline": round(m, 6),
            "ratio": round(min(e, m) / max(e, m), 4), "better": "higher",
            "error": round(e / m - 1, 3), "tables": [n for n, p in plan.placements.items()
                                                     if any(s.rank == r for s in p.shards)],
            "note": "candidate: the cost model's compute + memory (+ per_call) of the rank; "
                    "baseline: its lookup modules timed on their dist'd inputs; ratio: "
                    "min/max", **common})
    record({
        "bench": "sharding.estimate", "case": "step (input dist, lookups, output dist, "
        "fwd+bwd), 12 tables x 2 CPU ranks (gloo)", "unit": "s", "candidate": round(step_est, 6),
        "baseline": round(step_got, 6), "ratio": round(min(step_est, step_got)
                                                      / max(step_est, step_got), 4),
        "better": "higher", "error": round(step_est / step_got - 1, 3),
        "note": "candidate: the slowest rank's estimate with communication; baseline: the "
                "measured median step", **common})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_mode_flags(ap, "three cases, under a minute")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds torchrec's planner may take per case")
    args = ap.parse_args()
    quick = use_mode(args)
    budget = args.budget or (10.0 if quick else 300.0)
    torchrec = TorchrecPlanner()
    try:
        for n, w in (SMOKE if smoke() else QUICK if quick else FULL):
            b = min(budget, 5.0) if quick and n * w > 10_000 else budget
            plan_case(n, w, budget=b, time_limit=0.5 if smoke() else 4.0, torchrec=torchrec)
    finally:
        torchrec.close()
    if smoke():
        estimate_case(steps=1, batch=256, max_rows=1e5)
    else:
        estimate_case(steps=3 if quick else 20)


if __name__ == "__main__":
    main()

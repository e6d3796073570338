"""Shared pieces of the sharding tests: tables drawn at random, a calibration and
topologies (the tiny dataset, `tiny_data`, is tests/conftest.py's)."""

from __future__ import annotations

import numpy as np

from lrm.sharding.cost import Calibration, CostModel
from lrm.sharding.stats import TableLoad
from lrm.sharding.topology import GIB, Topology

# a fixed CPU calibration (the test results must not move with the repo's measured file)
CAL = Calibration(device="cpu", source="tests", cache_bytes=32 << 20, per_shard=1e-4,
                  per_id=2e-8, per_id_col=1e-10, per_miss=5e-8, per_miss_col=1e-10,
                  per_unique_col=1e-9, per_out_col=5e-10)


def topology(world: int, *, device: str = "cpu", rph: int | None = None,
             gib: float = 64.0) -> Topology:
    return Topology(world_size=world, ranks_per_host=rph or world, device=device,
                    memory_bytes=int(gib * GIB), intra_host_bw=100e9, inter_host_bw=10e9,
                    hbm_bw=2000e9)


def cost_model(topo: Topology) -> CostModel:
    cal = CAL if topo.device == "cpu" else Calibration.analytic(topo)
    return CostModel(topo, cal)


def random_tables(n: int, seed: int = 0, batch: int = 4096,
                  dims: tuple[int, ...] = (16, 32, 64)) -> list[TableLoad]:
    """`n` tables with lognormal rows and pooling (a few big ones, many small)."""
    g = np.random.default_rng(seed)
    out = []
    for i in range(n):
        rows = int(min(g.lognormal(9, 2), 5e6)) + 16
        pool = float(min(g.lognormal(0.5, 1.0), 100.0))
        user = bool(g.random() < 0.3)
        rows_per = 0.2 if user else 1.0
        out.append(TableLoad(name=f"t{i}", module="", rows=rows, dim=int(g.choice(dims)),
                             features=(f"f{i}",), ids=batch * rows_per * pool,
                             unique_ids=min(rows, batch * rows_per * pool),
                             pooled_rows=batch * rows_per, uniform_batch=not user))
    return out

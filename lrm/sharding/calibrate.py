"""Calibrate the cost model's kernel term by timing fbgemm's fused TBE on this machine.

    python -m lrm.sharding.calibrate --out lrm/sharding/calibration/cpu.json
    python -m lrm.sharding.calibrate --device cuda --out lrm/sharding/calibration/cuda.json

Times the kernel training uses (fbgemm's SplitTableBatchedEmbeddingBagsCodegen with the
exact row-wise Adagrad fused into the backward; on CPU the tables in host memory, as
torchrec's `fused` kernel on a CPU rank) forward + backward over a grid of tables, rows,
widths, batch and pooling, with uniform and Zipf-skewed ids, plus random mixes of 1-16
tables of every size (as a rank holds them), in one thread (a training rank under torchrun
runs one), and fits the coefficients of `Calibration` (`fit`). Each point is the best of
`repeat` runs, the least disturbed by other work on a shared machine; every run looks up
fresh ids (a training step never repeats the last one's), so only rows that are hot stay
cached. The fit's error on the points is kept in the file, with the points.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lrm.dist import cpu_name
from lrm.sharding.cost import COEFFICIENTS, FLOAT, MOMENTUM, Calibration
from lrm.sharding.stats import HOT_FRACTIONS, TableLoad

GRID = {"tables": (1, 4), "rows": (1_000, 100_000, 1_000_000), "dim": (8, 32, 128),
        "batch": (512, 4096), "pooling": (1, 8), "zipf": (0.0, 1.1)}
QUICK = {"tables": (1, 4), "rows": (1_000, 1_000_000), "dim": (8, 64), "batch": (1024,),
         "pooling": (1, 8), "zipf": (0.0, 1.1)}
MIXES, QUICK_MIXES = 60, 12  # random ranks' worth of tables (1-16 of all sizes) on top
MAX_POINT_BYTES = 1 << 30  # tables of one timed point, at most


def cache_bytes() -> float:
    """The last-level cache of CPU 0 (bytes), from sysfs; 0 when unknown (or on a GPU)."""
    best = 0
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip().upper()
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        try:
            best = max(best, int(text.rstrip("KMG")) * mult)
        except ValueError:
            continue
    return float(best)


def _probabilities(rows: int, zipf: float) -> np.ndarray | None:
    if zipf <= 0:
        return None
    p = np.arange(1, rows + 1, dtype=np.float64) ** -zipf
    return p / p.sum()


def _hot(rows: int, p: np.ndarray | None) -> tuple[float, ...]:
    """Share of lookups on the hottest fractions of rows, from the id distribution."""
    if p is None:
        return HOT_FRACTIONS
    c = np.cumsum(p)  # already hottest first
    return tuple(float(c[max(1, int(np.ceil(x * rows))) - 1]) for x in HOT_FRACTIONS)


def _bytes(tables: list[dict[str, Any]]) -> int:
    return sum(t["rows"] * (t["dim"] * FLOAT + MOMENTUM) for t in tables)


def time_point(tables: list[dict[str, Any]], batch: int, device: str,
               repeat: int) -> dict[str, Any]:
    """Best seconds of forward + backward (with the fused optimizer) of one TBE holding
    `tables` (each {rows, dim, pooling, zipf}), `batch` bags per table."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
        EmbeddingLocation,
        PoolingMode,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    dev = torch.device(device)
    loc, comp = (EmbeddingLocation.DEVICE, ComputeDevice.CUDA) if device == "cuda" else \
        (EmbeddingLocation.HOST, ComputeDevice.CPU)
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(t["rows"], t["dim"], loc, comp) for t in tables],
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.01, eps=1e-8,
        pooling_mode=PoolingMode.SUM, device=dev)
    g = np.random.default_rng(sum(t["rows"] + t["dim"] for t in tables) + batch)
    probs = [_probabilities(t["rows"], t["zipf"]) for t in tables]
    lengths = np.concatenate([np.full(batch, t["pooling"]) for t in tables])
    offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)])).to(dev)
    best, unique = float("inf"), np.zeros(len(tables))
    for k in range(repeat + 1):  # fresh ids every run (a step never repeats the last's),
        ids = [g.choice(t["rows"], size=batch * t["pooling"], p=p) if p is not None else
               g.integers(0, t["rows"], batch * t["pooling"]) for t, p in zip(tables, probs)]
        indices = torch.from_numpy(np.concatenate(ids)).to(dev)
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = tbe(indices, offsets)
        out.sum().backward()
        if device == "cuda":
            torch.cuda.synchronize()
        if k:  # the first run warms up; so only rows that are hot stay cached
            best = min(best, time.perf_counter() - t0)
            unique += np.array([np.unique(x).size for x in ids]) / repeat
    return {"batch": batch, "seconds": best,
            "tables": [{**t, "ids": batch * t["pooling"], "unique": float(u),
                        "hot": _hot(t["rows"], p)}
                       for t, u, p in zip(tables, unique, probs)]}


def _work(cal: Calibration, p: dict[str, Any]) -> np.ndarray:
    """The coefficients' work counts of one timed point: one kernel call over its tables,
    which share the cache."""
    from lrm.sharding.cost import CostModel
    from lrm.sharding.topology import Topology

    topo = Topology(world_size=1, ranks_per_host=1, device=cal.device, memory_bytes=1,
                    intra_host_bw=1.0, inter_host_bw=1.0, hbm_bw=1.0)
    model = CostModel(topo, cal, tables=len(p["tables"]))
    total = np.zeros(len(COEFFICIENTS) - 1)
    for x in p["tables"]:
        t = TableLoad(name="t", module="", rows=x["rows"], dim=x["dim"], features=("f",),
                      ids=x["ids"], unique_ids=x["unique"], pooled_rows=p["batch"],
                      hot=tuple(x["hot"]))
        miss = float(model.miss(t, np.array([x["rows"]]), np.array([x["dim"]]),
                                np.array([1.0]))[0])
        total += np.array(cal.features(ids=t.ids, unique=t.unique_ids, pooled=p["batch"],
                                       cols=x["dim"], miss=miss))
    return np.concatenate([[1.0], total])


def fit(points: list[dict[str, Any]], device: str, source: str,
        cache: float) -> Calibration:
    """Non-negative coefficients fitted to log(time) with a soft-L1 loss (scipy's
    least_squares, started from nnls on relative error): on a shared machine other work
    stretches timings by factors, long kernels more often than short ones, so errors are
    multiplicative and a few points are far off; this fit is unbiased on both the grid and
    the mixed workloads (a relative-error fit underestimated the mixed ones ~2x)."""
    from scipy.optimize import least_squares, nnls

    base = Calibration(device=device, source=source, cache_bytes=cache)
    X = np.stack([_work(base, p) for p in points])
    y = np.array([p["seconds"] for p in points])
    scale = X.max(0)
    scale[scale == 0] = 1.0
    A = X / scale
    k0, _ = nnls(A / y[:, None], np.ones_like(y))
    k = least_squares(lambda k: np.log(np.maximum(A @ k, 1e-12)) - np.log(y),
                      np.maximum(k0, 1e-9), bounds=(0.0, np.inf), loss="soft_l1",
                      f_scale=0.3).x
    coef = k / scale
    rel = np.abs(X @ coef - y) / y
    cal = replace(base, **dict(zip(COEFFICIENTS, (float(c) for c in coef), strict=True)))
    return replace(cal, fit={"points": len(points), "median_rel_error": float(np.median(rel)),
                             "p90_rel_error": float(np.quantile(rel, 0.9)),
                             "max_rel_error": float(rel.max())})


def workloads(grid: dict[str, tuple], mixes: int, seed: int = 0
              ) -> list[tuple[list[dict[str, Any]], int]]:
    """The points to time: the grid (n equal tables) and `mixes` random sets of 1-16
    tables of every size, as a rank holds them."""
    out = []
    keys = [k for k in grid if k not in ("tables", "batch")]
    for n, batch, *values in itertools.product(grid["tables"], grid["batch"],
                                               *(grid[k] for k in keys)):
        out.append(([dict(zip(keys, values, strict=True))] * n, batch))
    g = np.random.default_rng(seed)
    for _ in range(mixes):
        ts = [{"rows": int(min(g.lognormal(np.log(3e4), 2.0), 3e6)) + 16,
               "dim": int(g.choice([8, 16, 32, 64, 128])),
               "pooling": int(max(1, min(g.lognormal(1.0, 1.0), 30))),
               "zipf": float(g.choice([0.0, 1.1]))} for _ in range(int(g.integers(1, 17)))]
        out.append((ts, int(g.choice([512, 2048, 4096]))))
    return [(ts, b) for ts, b in out if _bytes(ts) <= MAX_POINT_BYTES]


def calibrate(device: str = "cpu", *, grid: dict[str, tuple] | None = None,
              mixes: int = MIXES, repeat: int = 5,
              log: Any = print) -> tuple[Calibration, list[dict[str, Any]]]:
    """Time the workloads and fit (see the module docstring)."""
    torch.set_num_threads(1)
    points = []
    for tables, batch in workloads(grid or GRID, mixes):
        p = time_point(tables, batch, device=device, repeat=repeat)
        points.append(p)
        log(json.dumps({"tables": len(tables), "rows": sum(t["rows"] for t in tables),
                        "batch": batch, "seconds": p["seconds"]}))
    import fbgemm_gpu
    import torchrec

    where = torch.cuda.get_device_name(0) if device == "cuda" else f"{cpu_name()}, {os.cpu_count()} cores"
    source = (f"measured: {where}, 1 thread, torch {torch.__version__}, fbgemm_gpu "
              f"{fbgemm_gpu.__version__}, torchrec {torchrec.__version__}")
    return fit(points, device, source, cache_bytes() if device == "cpu" else 0.0), points


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="a smaller grid")
    ap.add_argument("--note", default="", help="said after the source, e.g. 'under load'")
    args = ap.parse_args(argv)
    cal, points = calibrate(args.device, grid=QUICK if args.quick else GRID,
                            mixes=QUICK_MIXES if args.quick else MIXES, repeat=args.repeat)
    if args.note:
        cal = replace(cal, source=f"{cal.source}; {args.note}")
    doc = {**cal.to_json(), "points": points}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(args.out)
    print(json.dumps({k: v for k, v in cal.to_json().items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

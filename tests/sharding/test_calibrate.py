"""The calibration: fbgemm's kernel timed, and the fit that recovers known coefficients."""

from __future__ import annotations

import numpy as np
import pytest

from lrm.sharding import calibrate
from lrm.sharding.cost import COEFFICIENTS, Calibration


def test_the_work_of_a_timed_point_is_counted_as_the_cost_model_says():
    """Two tables in one kernel call, counted by hand from lrm.sharding.cost's formula: a
    small one that stays in the cache, and a large uniform one whose cached rows are its
    share of the cache (the call's two tables split it) over its row bytes."""
    cache = float(1 << 20)
    cal = Calibration(device="cpu", source="hand", cache_bytes=cache)
    batch = 512
    small = {"rows": 100, "dim": 8, "ids": 1024, "unique": 90.0, "hot": (0.001, 0.01, 0.1)}
    large = {"rows": 1_000_000, "dim": 64, "ids": 512, "unique": 500.0,
             "hot": (0.001, 0.01, 0.1)}
    miss = 1 - (cache / 2) / (64 * 4 + 4) / 1_000_000  # fp32 row + Adagrad state, uniform
    hand = {
        "per_call": 1,  # one kernel call
        "per_shard": 2,  # two tables
        "per_id": 1024 + 512,
        "per_id_col": 1024 * 8 + 512 * 64,
        "per_miss": 512 * miss,  # the small table never misses
        "per_miss_col": 512 * miss * 64,
        "per_unique_col": 90 * 8 + 500 * 64,
        "per_unique_miss": 500 * miss,
        "per_out_col": batch * 8 + batch * 64,  # a pooled row per bag and table
    }
    work = calibrate._work(cal, {"batch": batch, "tables": [small, large]})
    assert dict(zip(COEFFICIENTS, work.tolist())) == pytest.approx(hand, rel=1e-9)


def test_the_fit_recovers_the_coefficients_of_exact_timings():
    truth = Calibration(device="cpu", source="truth", cache_bytes=1 << 20, per_call=2e-4,
                        per_shard=1e-4, per_id=2e-8, per_id_col=3e-10, per_miss=4e-8,
                        per_miss_col=2e-10, per_unique_col=1e-9, per_unique_miss=3e-8,
                        per_out_col=5e-10)
    g = np.random.default_rng(0)
    points = []
    for tables, batch in calibrate.workloads(calibrate.QUICK, mixes=40):
        p = {"batch": batch, "tables": [
            {**t, "ids": batch * t["pooling"],
             "unique": batch * t["pooling"] * g.uniform(0.2, 1.0),
             "hot": (0.001, 0.01, 0.1) if t["zipf"] == 0 else (0.2, 0.4, 0.7)} for t in tables]}
        p["seconds"] = float(calibrate._work(truth, p) @ np.array(
            [getattr(truth, c) for c in COEFFICIENTS]))
        points.append(p)
    fit = calibrate.fit(points, "cpu", "test", 1 << 20)
    for c in COEFFICIENTS:
        assert getattr(fit, c) == pytest.approx(getattr(truth, c), rel=1e-3), c
    assert fit.fit["max_rel_error"] < 1e-6


def test_one_kernel_timing_is_a_positive_best_of_runs():
    tables = [{"rows": 100, "dim": 8, "pooling": 2, "zipf": 1.1},
              {"rows": 5000, "dim": 16, "pooling": 1, "zipf": 0.0}]
    p = calibrate.time_point(tables, batch=16, device="cpu", repeat=2)
    assert p["seconds"] > 0 and [t["ids"] for t in p["tables"]] == [32, 16]
    assert 0 < p["tables"][0]["unique"] <= 32
    assert p["tables"][0]["hot"][0] > 0.001  # Zipf: the hottest row takes more than its share
    assert p["tables"][1]["hot"] == (0.001, 0.01, 0.1)  # uniform

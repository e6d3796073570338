"""Dense scaling at the edges of float64: any finite column gets finite moments and finite,
standardized features, chunk by chunk as in one piece; a constant column reads 0.

Planted bugs that turn these red (each tried): the moments summed unscaled (as before: NaN
or infinite moments past ~1e102), no halving of x - mean near float64's largest value, a
constant column's mean taken from the rounded sum.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

from lrm.data.logs.dense import Stats, scaled
from lrm.data.schema import day_files
from lrm.errors import DataError
from tests.data._logs import T0, frame, run

MAX = sys.float_info.max


def strict_json(text: str | bytes) -> Any:
    """JSON as the standard has it: no NaN or Infinity."""
    def refuse(c: str) -> None:
        raise ValueError(f"not strict JSON: {c}")
    return json.loads(text, parse_constant=refuse)


def ingest_prices(prices: list[float], out: Path, **opts: Any) -> tuple[dict[str, Any],
                                                                          list[float]]:
    """`prices` as the dense column of a small log: its scaling (from state.json) and the
    features written (in the dataset's order)."""
    n = len(prices)
    log = frame([{"uid": f"u{i % 5}", "item": f"ad{i % 7}", "ts": T0 + i * 60,
                  "click": i % 2, "price": p} for i, p in enumerate(prices)])
    src = out.parent / f"{out.name}.parquet"
    log.write_parquet(src)
    _, rows = run([src], out, label="click", user="uid", item="item", time="ts",
                  dense=["price"], **opts)
    how = strict_json((out / "_ingest" / "state.json").read_text())["dense"]["price"]
    meta = pq.read_schema(day_files(out)[0][0]).field("price").metadata[b"lrm.scaling"]
    assert strict_json(meta) == how  # the schema says the same, as JSON
    assert rows.height == n
    return how, rows["price"].to_list()


def features(values: np.ndarray, how: dict[str, Any]) -> np.ndarray:
    return pl.DataFrame({"x": values}).select(scaled(pl.col("x"), how))["x"].to_numpy()


def chunked(x: np.ndarray, sizes: list[int]) -> Stats:
    """The merged moments of `x` read in chunks of `sizes` (cycled)."""
    st, i, j = None, 0, 0
    while i < len(x):
        piece = Stats.of(pl.Series("d:x", x[i:i + sizes[j % len(sizes)]]))
        st = piece if st is None else st.merge(piece)
        i, j = i + sizes[j % len(sizes)], j + 1
    assert st is not None
    return st


def test_the_probes_huge_values_give_finite_standardized_features(tmp_path):
    n = 20
    # (a) +-1e308: the mean is 0 and the std 1e308, not NaN
    how, f = ingest_prices([1e308 if i % 2 else -1e308 for i in range(n)], tmp_path / "a")
    assert how["transform"] == "none" and how["mean"] == 0 and how["skew"] == 0
    assert math.isclose(how["std"], 1e308)
    assert sorted(f) == [-1.0] * 10 + [1.0] * 10
    # (b) one 1e200 among 0..19: heavy-tailed, so log-scaled like any outlier
    prices = [1e200 if i == 7 else float(i) for i in range(n)]
    how, f = ingest_prices(prices, tmp_path / "b")
    assert how["transform"] == "log1p" and how["skew"] > 2
    expect = (np.log1p(prices) - how["mean"]) / how["std"]
    np.testing.assert_allclose(sorted(f), np.sort(expect), rtol=1e-6)
    assert sorted(f)[-1] > 4 > 0 > sorted(f)[-2]  # the one outlier, far out
    # (c) a constant 1e39 is 0 everywhere, not the rounding of its mean
    how, f = ingest_prices([1e39] * n, tmp_path / "c", chunk_rows=7)
    assert (how["mean"], how["std"], how["skew"]) == (1e39, 1.0, 0.0)
    assert f == [0.0] * n


def test_a_column_scaled_by_any_power_of_two_gives_the_same_features_bit_for_bit():
    rng = np.random.default_rng(0)
    base = np.concatenate([rng.normal(3, 1, 500), rng.uniform(-2, 2, 500)])
    base = base / np.abs(base).max() * 1.5  # (|x| <= 1.5: 2**1022 * x stays finite)
    want = chunked(base, [97, 300, 1])
    assert want.decide()["transform"] == "none"
    expect = features(base, want.decide())
    for e in (-990, -400, -120, -99, 60, 101, 130, 400, 700, 1022):
        x = np.ldexp(base, e)
        st = chunked(x, [97, 300, 1])
        how = st.decide()
        assert how["mean"] == math.ldexp(want.decide()["mean"], e), e
        assert how["std"] == math.ldexp(want.decide()["std"], e), e
        assert how["skew"] == want.decide()["skew"], e
        np.testing.assert_array_equal(features(x, how), expect, err_msg=str(e))


def test_chunks_of_ordinary_and_huge_values_merge_as_one_piece():
    rng = np.random.default_rng(1)
    for big in (1e40, 1e150, 1e300, MAX):
        x = np.concatenate([rng.normal(5, 2, 400), [big, -big / 3], rng.normal(5, 2, 400)])
        whole = Stats.of(pl.Series("d:x", x)).decide()
        for sizes in ([400, 2, 400], [1], [3, 250]):
            parts = chunked(x, sizes).decide()
            assert parts["transform"] == whole["transform"] == "signed_log1p"
            for k in ("mean", "std"):
                assert math.isclose(parts[k], whole[k], rel_tol=1e-9), (big, sizes, k)
            assert math.isclose(parts["skew"], whole["skew"], abs_tol=1e-3)
            assert np.isfinite(features(x, parts)).all()


def test_values_near_the_largest_float_do_not_overflow_x_minus_mean():
    # 12 at MAX, 8 at -MAX: skew -0.41 (not log-scaled), mean 0.2 MAX: -MAX - mean would be
    # -1.2 MAX, infinite, without the halving
    x = np.array([MAX] * 12 + [-MAX] * 8)
    how = chunked(x, [5]).decide()
    assert how["transform"] == "none" and math.isfinite(how["std"])
    f = features(x, how)
    np.testing.assert_allclose(f, [2 / math.sqrt(6)] * 12 + [-math.sqrt(1.5)] * 8, rtol=1e-6)


def test_a_constant_column_reads_zero_whatever_its_value_and_chunks():
    for v in (0.1, 1 / 3, 7.0, -2.5e-200, 1e39, MAX):
        x = np.full(1000, v)
        for sizes in ([1000], [20], [7, 333]):
            how = chunked(x, sizes).decide()
            assert (how["transform"], how["mean"], how["std"], how["skew"]) == \
                ("none", v, 1.0, 0.0), (v, sizes)
            assert (features(x, how) == 0).all(), (v, sizes)


def test_a_scaling_that_is_not_finite_is_an_error_naming_the_column():
    from lrm.data.logs.dense import check_finite

    with pytest.raises(DataError) as e:
        check_finite({"mean": math.nan, "std": 1.0, "skew": math.inf}, "price")
    assert e.value.field == "price" and "mean and skew" in str(e.value)
    assert Stats.of(pl.Series("d:price", [1.0, 2.0])).name == "price"


def test_a_continued_ingest_names_the_row_its_scaling_cannot_reach(tmp_path):
    """A continued ingest keeps the days before's scaling (0..19: mean 9.5, std 5.8); a
    1e300 on the next day would standardize past float32, to infinity: an error naming its
    file, row and column, before anything is kept. Red with the check dropped (inf
    written)."""
    from lrm.data.logs.culprits import RowError
    from tests.data._logs import write

    def day(prices: list[float], d: int, name: str) -> Path:
        rows = [{"uid": f"u{i % 5}", "item": f"ad{i % 7}", "ts": T0 + d * 86_400 + i * 60,
                 "click": i % 2, "price": p} for i, p in enumerate(prices)]
        return write(frame(rows), tmp_path / name)

    mapping = dict(label="click", user="uid", item="item", time="ts", dense=["price"])
    run([day([float(i) for i in range(20)], 0, "d0.parquet")], tmp_path / "d0", **mapping)
    with pytest.raises(RowError) as e:
        run([day([1.0, 2.0, 1e300], 1, "d1.parquet")], tmp_path / "d1",
            prior=tmp_path / "d0", **mapping)
    assert (e.value.file.name, e.value.line, e.value.field) == ("d1.parquet", 3, "price")
    assert "1e+300 is beyond the scaling" in str(e.value)
    ok, rows = run([day([1.0, 25.0], 1, "d2.parquet")], tmp_path / "d2", prior=tmp_path / "d0",
                   **mapping)
    assert rows["price"].is_finite().all() and ok["rows"] == 2


def test_a_csv_read_in_many_chunks_is_scaled_by_all_of_its_values(tmp_path):
    """A CSV export (a blank price among them) read 7 rows at a time: the scaling in the
    state and the written features are those of the whole column, every chunk's moments
    merged in. Red with a chunk's moments replacing those before (the last chunk's only)."""
    from tests.data._logs import write

    prices = [round(1.5 * i + (i % 4) * 0.25, 2) for i in range(60)]  # rising: each chunk
    rows = [{"uid": f"u{i % 5}", "item": f"ad{i % 7}", "ts": T0 + i * 60, "click": i % 2,
             "price": None if i == 23 else p} for i, p in enumerate(prices)]
    src = write(frame(rows), tmp_path / "log.csv")
    _, got = run([src], tmp_path / "out", label="click", user="uid", item="item", time="ts",
                 dense=["price"], chunk_rows=7)
    how = strict_json((tmp_path / "out" / "_ingest" / "state.json").read_text())["dense"]
    x = np.array([p for i, p in enumerate(prices) if i != 23])
    assert how["price"]["transform"] == "none" and how["price"]["values"] == 59
    assert math.isclose(how["price"]["mean"], x.mean(), rel_tol=1e-12)
    assert math.isclose(how["price"]["std"], x.std(), rel_tol=1e-12)
    f = got["price"].to_numpy()
    assert got.height == 60 and (f == 0).sum() >= 1  # the blank reads 0
    np.testing.assert_allclose(np.sort(f[f != 0]), np.sort((x - x.mean()) / x.std()),
                               rtol=1e-5, atol=1e-6)

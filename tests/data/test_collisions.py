"""The collision report of hashed tables: ids sharing a row, lookups on shared rows, arrivals."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lrm.data import collisions


def test_collision_stats_counts_ids_lookups_and_arrivals():
    # rows 10: ids 0 and 10 share row 0; 3 has row 3 alone; 10 is looked up twice
    s = collisions.collision_stats(np.array([0, 10, 10, 3]), 10, previous=np.array([0, 5, 5]))
    assert (s["ids"], s["rows"], s["table_rows"]) == (3, 2, 10)
    assert s["collision_rate"] == pytest.approx(2 / 3)
    assert s["lookup_collisions"] == pytest.approx(3 / 4)
    assert s["new_ids"] == pytest.approx(2 / 3)  # 3 and 10 were not there the day before
    assert s["new_on_used_rows"] == pytest.approx(1 / 2)  # 10 lands on row 0, used by id 0


def test_negative_ids_use_the_loaders_floor_modulo():
    s = collisions.collision_stats(np.array([-1, 9]), 10)  # -1 mod 10 == 9: one row
    assert s["rows"] == 1 and s["collision_rate"] == 1.0


def test_a_table_as_large_as_the_id_space_never_collides():
    ids = np.random.default_rng(0).integers(0, 1000, 5000)
    s = collisions.collision_stats(ids, 1000)
    assert s["collision_rate"] == s["lookup_collisions"] == 0.0
    assert s["new_ids"] is None  # no day before


def test_day_collisions_reads_scalar_and_list_columns(tmp_path):
    f = tmp_path / "part.parquet"
    pq.write_table(pa.table({"ad_id": pa.array([1, 4, 7], pa.int64()),
                             "user_history": pa.array([[1, 4], None, [7]],
                                                      pa.list_(pa.int64()))}), f)
    got = collisions.day_collisions([f], {"ad_id": 3, "user_history": 100, "x": 5},
                                    features=["ad_id", "user_history"])
    assert got["ad_id"]["collision_rate"] == 1.0  # 1, 4, 7 all land on row 1
    assert got["user_history"]["ids"] == 3 and got["user_history"]["collision_rate"] == 0.0
    assert "| ad_id | 3 | 3 | 100.00% |" in collisions.markdown(got)


def test_watched_features_are_the_arriving_ids_and_the_tables_smaller_than_their_ids():
    vocab = {"user_id": 100, "ad_id": 50, "user_age": 7, "geo": 1000}
    sizes = {"user_id": 100, "ad_id": 50, "user_age": 7, "geo": 64, "C1": 2000}
    assert collisions.watched(vocab, sizes) == ["user_id", "ad_id", "geo", "C1"]

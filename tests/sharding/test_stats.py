"""Table statistics from the data: lookups per impression (sessions on RecD's user side),
pooling, skew, unique ids; and the per-step loads of a model's tables."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.compute as pc
import pytest

from lrm.config import GenerateConfig, ModelConfig, StudentModelConfig, TableConfig
from lrm.data import parquet
from lrm.data.dedup import expand_histories
from lrm.data.loader import BatchLoader
from lrm.data.schema import day_files, read_schema
from lrm.models import build_model
from lrm.sharding import stats as S

B = 256


def _model(data, shared=None):
    schema, _ = read_schema(data)
    cfg = ModelConfig(tables=TableConfig(shared=shared or {}),
                      student=StudentModelConfig(embedding_dim=8))
    return build_model("student", schema, cfg, device="meta", dense_device="meta")


def _lengths(t, col):
    return int(pc.sum(pc.list_value_length(t.column(col))).as_py() or 0)


def _sessions_and_impressions(data):
    """Sessions, impressions, history values stored (once per run of a user's sessions)
    and history values the sessions see (each its own list)."""
    schema, _ = read_schema(data)
    sessions = impressions = stored = seen = 0
    for files in day_files(data).values():
        for f in files:
            t = parquet.read_table(f)
            sessions += t.num_rows
            impressions += _lengths(t, "label")
            stored += _lengths(t, "user_history")
            seen += _lengths(expand_histories(t, schema, source=f), "user_history")
    return sessions, impressions, stored, seen


@pytest.fixture(scope="module")
def all_batches(tiny_data):
    model = _model(tiny_data)
    return model, S.compute(tiny_data, S.table_specs(model), batch_size=B, recd=True,
                            batches=10_000)


def test_user_tables_look_up_one_row_per_session(tiny_data, all_batches):
    _, st = all_batches
    sessions, impressions, stored, seen = _sessions_and_impressions(tiny_data)
    assert stored < seen  # stored once per run of sessions; looked up per session below
    assert st.impressions == impressions  # every batch was read
    user = st.features["user_id"]
    assert user.side == "user"
    # one row per session in each batch; a session cut by a batch boundary counts twice
    assert sessions / impressions <= user.rows_per_sample <= (sessions + st.batches) / impressions
    item = st.features["ad_id"]
    assert item.side == "item" and item.rows_per_sample == 1.0 and item.pooling == 1.0
    # history ids looked up: these short histories stay in each session's own list (the
    # loader shares windows only for long ones), so every list once, from its session row
    # (twice for a session a batch boundary cuts)
    assert not BatchLoader(tiny_data, B).windows
    h = st.features["user_history"]
    longest = GenerateConfig().max_history
    assert seen <= h.ids_per_sample * impressions <= seen + st.batches * longest
    assert h.pooling == pytest.approx(seen / sessions, rel=0.05)
    assert h.ids_per_sample == pytest.approx(h.rows_per_sample * h.pooling)
    plain = S.compute(tiny_data, S.table_specs(all_batches[0]), batch_size=B, recd=False,
                      batches=10_000)
    assert plain.features["user_id"].rows_per_sample == 1.0  # without RecD: per impression


def test_skew_unique_ids_and_cooccurrence(all_batches):
    _, st = all_batches
    for f, x in st.features.items():
        assert 0 < x.hot[0] <= x.hot[1] <= x.hot[2] <= 1, f
        assert sum(x.blocks) == pytest.approx(1.0), f
        assert 1 <= x.unique_ids_per_batch <= B * x.ids_per_sample, f
        assert x.distinct_ids <= x.table_rows
        assert st.cooccurrence[f][f] == pytest.approx(x.nonempty)
    # user ids are Zipf-popular: the hottest 10% of rows take far more than 10% of lookups
    assert st.features["user_id"].hot[2] > 0.3
    assert st.tables["t_user_id"].features == ("user_id",)


def test_skew_figures_of_a_known_count():
    counts = np.ones(1000, dtype=np.int64)
    counts[0] = 501  # 1500 lookups, a third on row 0
    hot, blocks = S._skew(counts)
    assert hot[0] == pytest.approx(501 / 1500)  # hottest 0.1%: row 0
    assert hot[1] == pytest.approx(510 / 1500)  # hottest 1%: 10 rows
    assert hot[2] == pytest.approx(600 / 1500)
    assert blocks[0] == pytest.approx((501 + 30) / 1500, abs=2 / 1500)  # rows 0..31
    assert sum(blocks) == pytest.approx(1.0)


def test_loads_per_step_count_sessions_and_shared_tables(tiny_data, all_batches):
    model, st = all_batches
    loads = {t.name: t for t in S.loads(model, st)}
    u = st.features["user_id"]
    assert loads["t_user_id"].pooled_rows == pytest.approx(B * u.rows_per_sample)
    assert loads["t_user_id"].module == "embeddings.user_ebc"
    assert not loads["t_user_id"].uniform_batch
    assert loads["t_ad_id"].pooled_rows == B and loads["t_ad_id"].uniform_batch
    h = st.features["user_history"]
    assert loads["t_user_history"].ids == pytest.approx(B * h.ids_per_sample)
    # user_history looked up in ad_id's table: that item-side table takes B + U rows a key
    shared = _model(tiny_data, {"user_history": "ad_id"})
    st2 = S.compute(tiny_data, S.table_specs(shared), batch_size=B, recd=True, batches=4)
    t = {x.name: x for x in S.loads(shared, st2)}["t_ad_id"]
    per_key = 1 + st2.features["user_history"].rows_per_sample
    assert t.pooled_rows == pytest.approx(B * per_key * 2) and not t.uniform_batch
    assert t.ids == pytest.approx(B * (st2.features["ad_id"].ids_per_sample
                                       + st2.features["user_history"].ids_per_sample))


def test_statistics_round_trip_and_must_match_the_model(tmp_path, all_batches, tiny_data):
    model, st = all_batches
    path = tmp_path / "s.json"
    path.write_text(json.dumps(st.to_json()))
    back = S.Stats.read(path)
    assert back == st
    other = _model(tiny_data)
    for m in other.modules():  # a model whose tables have other sizes
        if hasattr(m, "embedding_bag_configs"):
            for t in m.embedding_bag_configs():
                t.num_embeddings += 1
    with pytest.raises(Exception, match="do not match table"):
        S.loads(other, st)
    path.write_text("{}")
    with pytest.raises(Exception, match="not a table-statistics file"):
        S.Stats.read(path)


def test_hit_share_and_row_share_interpolate():
    t = S.TableLoad(name="t", module="", rows=1000, dim=8, features=("f",), ids=1,
                    unique_ids=1, pooled_rows=1, hot=(0.2, 0.5, 0.9),
                    blocks=(0.5, 0.25, 0.25, 0.0))
    assert t.hit_share(0.01) == pytest.approx(0.5) and t.hit_share(1.0) == 1.0
    assert t.hit_share(0.0005) == pytest.approx(0.1)  # linear below the first point
    assert 0.5 < t.hit_share(0.03) < 0.9
    assert t.row_share(0, 250) == pytest.approx(0.5)
    assert t.row_share(0, 1000) == pytest.approx(1.0)
    assert t.row_share(125, 375) == pytest.approx(0.25 + 0.125)  # halves of blocks 0 and 1

"""The synthetic world written out as a user's flat click log (lrm.data.synthetic.export):
with `FIELD`, what real exports do (surfaces of very unequal share, unknown written -124, a
numeric item attribute, a first day that starts 55 minutes before midnight and a last day
that ends at noon), and read back by `lrm ingest logs` through its mapping.

Planted bugs that turn these red (each tried): the first day not cut (a whole day 0); the
unknown code not written; the duration drawn per impression instead of per ad.
"""

from __future__ import annotations

import polars as pl

from lrm.config import GenerateConfig, VerticalConfig
from lrm.data.synthetic import export
from tests.data._logs import run

WORLD = GenerateConfig(users=3000, ads=400, advertisers=40, categories=8, days=3,
                       sessions_per_day=400, mean_session_length=4.0, max_history=20,
                       verticals=[VerticalConfig(name="feed", share=0.8),
                                  VerticalConfig(name="search", share=0.19),
                                  VerticalConfig(name="live", share=0.008)])


def test_a_field_export_has_what_real_exports_have(tmp_path):
    log = export.log_frame(WORLD, export.FIELD)
    share = {s: n / log.height for s, n in log.group_by("surface").len().iter_rows()}
    assert set(share) == {"feed", "search", "live"} and 0 < share["live"] < 0.01
    day0 = log.filter(pl.col("ts") < export.T0 + 86_400)["ts"]
    assert day0.len() > 0 and day0.min() >= export.T0 + (23 + 5 / 60) * 3600  # 55 minutes
    assert log["ts"].max() < export.T0 + (2 * 24 + 12) * 3600  # the last day ends at noon
    for c in export.CODED:  # unknown is -124, a text code among the others
        assert (log[c] == "-124").any() and log[c].dtype == pl.String
    per_ad = log.group_by("ad_id").agg(pl.col(export.DURATION).n_unique())
    assert per_ad[export.DURATION].max() == 1 and log[export.DURATION].skew() > 2

    f = tmp_path / "log.csv"
    log.write_csv(f)
    mapping = {k: v for k, v in vars(export.mapping(export.FIELD)).items() if k != "files"}
    m, _ = run([f], tmp_path / "out", **mapping)
    assert m["rows"] == log.height and m["days"] == 3
    assert m["day_rows"][0] < 0.1 * m["day_rows"][1]
    assert m["dense_scaling"][export.DURATION]["transform"] == "log1p"
    assert m["vocab"]["user_gender"] == 3 and m["vocab"]["surface"] == 3


def test_the_plain_export_is_the_world_as_it_is():
    log = export.log_frame(WORLD)
    assert log.filter(pl.col("ts") < export.T0 + 86_400)["ts"].min() < export.T0 + 3600 * 6
    assert export.DURATION not in log.columns and log["user_gender"].dtype.is_integer()
    assert export.mapping().item_dense == []

"""The cost model: compute, memory traffic and communication of a shard."""

from __future__ import annotations

import json

import pytest

from lrm.errors import ConfigError
from lrm.sharding.cost import CALIBRATIONS, Calibration, CostModel
from lrm.sharding.stats import TableLoad
from lrm.sharding.topology import COLUMN_WISE, ROW_WISE, TABLE_ROW_WISE, TABLE_WISE
from tests.sharding.conftest import CAL, cost_model, topology

T = TableLoad(name="t", module="", rows=1_000_000, dim=64, features=("f",), ids=50_000,
              unique_ids=30_000, pooled_rows=8192)


def test_one_rank_has_no_communication_and_more_ranks_do():
    one = cost_model(topology(1)).shard(T, TABLE_WISE, 0, T.rows, T.dim)
    assert one.comm == 0 and one.compute > 0 and one.memory > 0
    topo = topology(8)
    many = cost_model(topo).shard(T, TABLE_WISE, 0, T.rows, T.dim)
    assert many.compute == one.compute
    # 7/8 of the step's samples live on other ranks: their ids (and lengths) come in, their
    # pooled embeddings go out and their gradients come back, all over the intra-host link
    volume = ((T.ids + T.pooled_rows) * 8 + 2 * T.pooled_rows * T.dim * 4) * 7 / 8
    assert many.comm == pytest.approx(volume / topo.intra_host_bw)
    assert one.bytes == T.rows * (T.dim * 4 + 4)  # weights + row-wise Adagrad state


def test_slow_links_cost_more_and_hosts_split_the_traffic():
    one_host = cost_model(topology(8)).shard(T, TABLE_WISE, 0, T.rows, T.dim).comm
    two_hosts = cost_model(topology(8, rph=4)).shard(T, TABLE_WISE, 0, T.rows, T.dim).comm
    assert two_hosts > one_host  # half the peers now sit behind the 10x slower link
    topo = topology(8, rph=4)
    nbytes = 1e9
    assert topo.link_time(nbytes, 3, 4) == pytest.approx(
        nbytes / 7 * 3 / topo.intra_host_bw + nbytes / 7 * 4 / topo.inter_host_bw)


def test_splits_divide_the_work_they_can():
    cm = cost_model(topology(8, device="cuda", rph=4))
    tw = cm.shard(T, TABLE_WISE, 0, T.rows, T.dim)
    cw = cm.shard(T, COLUMN_WISE, 0, T.rows, T.dim // 4)
    assert cw.bytes < tw.bytes / 3 and cw.memory < tw.memory and cw.comm < tw.comm
    rw = cm.shard(T, ROW_WISE, 0, T.rows // 8, T.dim)
    assert rw.memory < tw.memory / 4  # an eighth of the lookups (uniform rows)
    assert rw.comm > tw.comm / 8  # but every shard sends partial sums for every sample
    twrw = cm.shard(T, TABLE_ROW_WISE, 0, T.rows // 4, T.dim, 4)
    assert twrw.comm < 4 * rw.comm


def test_skewed_rows_put_the_lookups_where_they_fall():
    # few pooled rows: the lookups, not the partial sums every shard writes, dominate
    hot = TableLoad(**{**T.__dict__, "blocks": (0.7, 0.1, 0.1, 0.1), "pooled_rows": 16})
    cm = cost_model(topology(4, device="cuda"))
    first = cm.shard(hot, ROW_WISE, 0, T.rows // 4, T.dim)
    last = cm.shard(hot, ROW_WISE, 3 * T.rows // 4, T.rows // 4, T.dim)
    assert first.memory > 5 * last.memory


def test_cache_misses_come_from_the_skew():
    cm = CostModel(topology(1), CAL)
    import numpy as np

    small = cm.miss(T, np.array([1000]), np.array([64]), np.array([1.0]))
    assert small[0] == 0  # 260 kB: cached
    uniform = cm.miss(T, np.array([T.rows]), np.array([64]), np.array([1.0]))[0]
    fits = CAL.cache_bytes / (64 * 4 + 4) / T.rows
    assert uniform == pytest.approx(1 - fits, rel=1e-6)
    skewed = TableLoad(**{**T.__dict__, "hot": (0.3, 0.6, 0.9)})
    assert cm.miss(skewed, np.array([T.rows]), np.array([64]), np.array([1.0]))[0] < 0.5


def test_calibrations_load_by_device(tmp_path):
    cpu, cuda = topology(2), topology(2, device="cuda")
    with pytest.raises(ConfigError, match="no cost-model calibration for cpu"):
        Calibration.load(tmp_path, cpu)
    analytic = Calibration.load(tmp_path, cuda)  # a GPU without a calibration file
    assert analytic.source.startswith("analytic") and analytic.per_id_col > 0
    (tmp_path / "cuda.json").write_text(json.dumps(CAL.to_json()))  # a cpu file named cuda
    with pytest.raises(ConfigError, match="not a cuda calibration"):
        Calibration.load(tmp_path, cuda)
    (tmp_path / "cpu.json").write_text(json.dumps(CAL.to_json()))
    assert Calibration.load(tmp_path, cpu) == CAL
    with pytest.raises(ConfigError, match="cannot cost a cuda topology"):
        CostModel(cuda, CAL)


def test_the_repos_cpu_calibration_is_a_measured_fit():
    cal = Calibration.load(CALIBRATIONS, topology(2))
    assert cal.source.startswith("measured") and cal.fit["points"] >= 50
    assert cal.per_call > 0 and cal.per_id > 0 and cal.cache_bytes > 0

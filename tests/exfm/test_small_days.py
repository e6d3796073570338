"""A day, or a surface's day, too small to train on (an export's partial first day: a few
minutes before the first day boundary) is said in one line and skipped, never fatal: the
vertical models go on from the day before it, the foundation model joins it to its next
version (issue 44 item 3)."""

from __future__ import annotations

import json
import logging

import pyarrow.compute as pc
import pytest

from lrm import io
from lrm.config import (
    DedupConfig,
    DistillConfig,
    ExFMConfig,
    GenerateConfig,
    ModelConfig,
    StudentModelConfig,
    TableConfig,
    TrainConfig,
    VerticalConfig,
)
from lrm.data import dedup, synthetic
from lrm.data.schema import part_path, read_schema
from lrm.errors import ConfigError
from lrm.exfm import fm
from lrm.exfm import students as S
from lrm.exfm.schedule import Schedule, joined, schedule
from lrm.train import build_job
from lrm.train.days import model_of
from tests.exfm.conftest import TINY_TEACHER

# the big surface and a tiny one (about 7% of the sessions)
WORLD = GenerateConfig(users=800, ads=150, advertisers=20, categories=6, days=3,
                       sessions_per_day=300, mean_session_length=6.0, max_history=10,
                       seed=3, verticals=[VerticalConfig(name="big", share=0.93),
                                          VerticalConfig(name="tab/2", share=0.07)])
FIRST_DAY_ROWS = 100  # the export starts late on day 0: its last 100 impressions
TRAIN = TrainConfig(batch_size=64, lr=0.01, log_every=5, threads=1, min_batch_size=32,
                    fit_steps=20, min_steps=5)


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    """Days 0-2 with day 0 cut to its last FIRST_DAY_ROWS impressions (whole sessions)."""
    root = tmp_path_factory.mktemp("small-days")
    for d in range(WORLD.days):
        t = synthetic.generate_day(WORLD, d)
        if d == 0:
            sid = t.column("session_id")
            first = pc.max(sid.slice(0, t.num_rows - FIRST_DAY_ROWS)).as_py()
            t = t.filter(pc.greater(sid, first))
        io.write_parquet(t, part_path(root / "raw", d))
    dedup.dedup_dataset(root / "raw", root / "sessions", DedupConfig())
    return root / "sessions"


def _rows(data, day, vertical=None):
    from lrm.train.data import scan_days

    return scan_days(data, [day], verticals=None if vertical is None else [vertical]).rows


def test_a_surface_s_partial_first_day_is_skipped_and_its_model_goes_on(sessions, tmp_path,
                                                                         caplog):
    """The tiny surface's day 0 holds a few impressions: the VM says so in one line and
    starts on day 1 (fresh), day 2 going on from it. Red with the check dropped (the run
    fails: 'fewer than one batch'), and with the seed of the variants the labels-only
    model of the last day before the FM (model_of a skipped day: no such folder)."""
    schema, _ = read_schema(sessions)
    vms = {vm.name: vm for vm in S.vertical_models(schema, ["s"])}
    assert set(vms) == {"big-s", "tab_2-s"}  # the raw name made safe
    vm = vms["tab_2-s"]
    assert 0 < _rows(sessions, 0, vm.vertical) < TRAIN.min_batch_size <= _rows(sessions, 0)
    model = ModelConfig(tables=TableConfig(max_rows=5000),
                        student=StudentModelConfig(embedding_dim=4, bottom_mlp=[8],
                                                   top_mlp=[8]))

    def job_for(vm, variant, data):
        return build_job("student", train=TRAIN, model=model, data=data)

    chains = tmp_path / "chains"
    with caplog.at_level(logging.INFO, logger="lrm"):
        out = S.train_vm(vm, {"labels_only": DistillConfig(distill=False)}, job_for,
                         sessions=sessions, augmented=sessions, days=[0, 1], first_served=1,
                         chains=chains, owner="test")
    rows = out.rows["labels_only"]
    assert [r["train_day"] for r in rows] == [0, 1]
    assert "impressions, fewer than one step" in rows[0]["skipped"]
    said = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("tab_2-s day 0: skipped, ")
    assert rows[1]["steps"] > 0 and 0 < rows[1]["ne"] < 2
    # day 1 is the variant chain's first day: it starts fresh (no labels-only day trained)
    first = json.loads((model_of(chains / "labels_only", 1) / "model.json").read_text())
    assert first["info"]["start"] != "warm" and not first["info"].get("init_from")
    assert S.last_model(chains, "labels_only") == model_of(chains / "labels_only", 1)
    assert S.last_model(chains, "aux_head") is None  # a variant that never trained


def test_the_foundation_model_joins_a_version_too_small_to_the_next(sessions):
    """T = 1: version 1 would train on day 0 alone (100 impressions, fewer than a batch of
    128): it is left out and version 2 trains on days 0-1, its first day logged day 2. Red with the window not carried
    over (version 2 on day 1 alone)."""
    job = build_job("teacher", train=TrainConfig(threads=1), model=TINY_TEACHER, data=sessions)
    sched = schedule([0, 1, 2], ExFMConfig(teacher_days=1, teacher_every=1, teacher_lag=1))
    assert sched.cuts == (1, 2)
    got = fm.trainable(job, sched)
    assert got.cuts == (2,) and got.lag == 1
    assert got.windows() == [(2, [0, 1])] and got.first_served == 2


def test_joined_carries_every_small_window_to_the_next_and_refuses_none_left():
    small = {(0,), (0, 1)}  # windows too small, as tuples of days

    def why(window):
        return "3 impressions" if tuple(window) in small else None

    out, lines = joined(Schedule((1, 2, 3, 4), 2), why)
    assert out == Schedule((3, 4), 2) and out.windows() == [(3, [0, 1, 2]), (4, [3])]
    assert len(lines) == 2 and "until day 1" in lines[0] and "join the next" in lines[0]
    # the last version's window too small: left out, no version after it
    out, _ = joined(Schedule((1, 4), 2), lambda w: "few" if w == [1, 2, 3] else None)
    assert out.cuts == (1,)
    with pytest.raises(ConfigError, match="too small to train the foundation model"):
        joined(Schedule((1, 2), 2), lambda w: "3 impressions")

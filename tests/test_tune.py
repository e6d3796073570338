"""lrm.tune: the days a search uses, its budget, the best trial and the params file it
makes, the search space's checks."""

from __future__ import annotations

import dataclasses
import math
import shutil

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from lrm.config import SplitConfig, TuneConfig, TuneSpace
from lrm.data.schema import day_files
from lrm.errors import ConfigError
from lrm.tune import apply, current, params_overlay, search_days, tune
from tests.conftest import LOADER, SMALL_MODEL, only_days, tiny_train

# a search that trains in seconds: the rates and the dim searched, one epoch
SPACE = TuneSpace(lr=[1e-3, 3e-2], embedding_lr=[0.01, 0.2], epochs=[], embedding_dim=[4, 8],
                  width=[])


def _tune(data, **cfg):
    return tune("student", train=tiny_train(), model=SMALL_MODEL, data=data,
                split=SplitConfig(), loader=LOADER, cfg=TuneConfig(space=SPACE, **cfg))


def _nan_day(src, dst, day):
    """A copy of dataset `src` whose `day` has NaN in a dense column (a bad value)."""
    shutil.copytree(src, dst)
    for f in day_files(dst)[day]:
        t = pq.read_table(f)
        i = t.schema.get_field_index("d_bid")
        col = t.column(i).combine_chunks()
        nan = pa.array([math.nan] * len(pc.list_flatten(col)), type=col.type.value_type)
        pq.write_table(t.set_column(i, t.schema.field(i), pa.ListArray.from_arrays(
            col.offsets, nan, type=col.type)), f)
    return dst


def test_search_days_hold_the_eval_day_out(datasets, tmp_path):
    """Planted bug that turns this red (tried): the validation days taken from every day
    (the held-out one among them)."""
    assert search_days(datasets["sessions"], SplitConfig(), 1) == ([0], [1], 2)
    with pytest.raises(ConfigError, match="needs 3"):  # 2 days before the held-out one
        search_days(datasets["sessions"], SplitConfig(), 2)
    with pytest.raises(ConfigError, match="1 day"):  # held out day 1: one day before it
        search_days(datasets["sessions"], SplitConfig(eval_day=1), 1)


def test_best_trial_is_written_and_the_first_is_the_params_as_they_are(datasets, tmp_path):
    """Planted bugs that turn this red (each tried): the worst trial kept (max); the params'
    own values not enqueued first; a trial scored on the held-out day (eval_day=held); the
    teacher's values not pinned in a student's file."""
    # the held-out day holds a NaN, which any read of it refuses (lrm.data.values): a
    # search that never reads it finishes every trial
    data = _nan_day(datasets["sessions"], tmp_path / "d", day=2)
    result = _tune(data, trials=2)
    assert len(result.trials) == 2 and result.stopped == "trials"
    assert all(t.state == "complete" and math.isfinite(t.ne) for t in result.trials)
    nes = {t.number: t.ne for t in result.trials}
    assert result.best.ne == min(nes.values()) and nes[result.best.number] == result.best.ne
    # trial 0 is the params' own values (inside the space): the best never loses to them
    assert result.trials[0].params == current(SPACE, "student", tiny_train(), SMALL_MODEL)
    assert result.trials[0].params == {"lr": 1e-2, "embedding_lr": 0.05, "embedding_dim": 8}
    doc = params_overlay(result, train=tiny_train(), model=SMALL_MODEL,
                         teacher_train=tiny_train(lr=5e-4, embedding_lr=0.07))
    best = result.best.params
    assert doc["train"] == {"lr": best["lr"], "embedding_lr": best["embedding_lr"]}
    assert doc["model"] == {"student": {"embedding_dim": best["embedding_dim"]}}
    # the teacher keeps its own values of the keys a student's file sets in `train`
    assert doc["teacher"] == {"train": {"lr": 5e-4, "embedding_lr": 0.07}}


def test_several_validation_days_score_a_trial_pooled(datasets, tmp_path):
    """Planted bug that turns this red (tried): the pooled score given the params' device
    as written ("auto": torch refuses it)."""
    data = tmp_path / "d"
    shutil.copytree(datasets["sessions"], data)
    shutil.copytree(data / "day=2", data / "day=3")  # a fourth day: 2 validate, 3 held out
    result = _tune(data, trials=1, valid_days=2)
    assert (result.train_days, result.valid_days, result.eval_day) == ([0], [1, 2], 3)
    assert result.trials[0].state == "complete" and math.isfinite(result.trials[0].ne)


def test_budget_in_minutes_starts_no_trial_after_it(datasets):
    """Planted bug that turns this red (tried): Optuna given no timeout."""
    result = _tune(datasets["sessions"], trials=4, minutes=1e-4)
    assert len(result.trials) == 1 and result.stopped == "minutes"


def test_a_trial_whose_loss_is_not_finite_fails_and_the_search_goes_on(datasets, tmp_path):
    """Planted bug that turns this red (tried): NonFiniteLossError not caught by a trial."""
    # learning rates no model survives: AdamW's first step moves every dense weight by about
    # the rate (1e29), so the next forward overflows float32 and bf16 alike, on any CPU (a
    # day of float32's largest dense value overflowed only where bf16 autocast rounds it
    # to infinity: on a CPU without native bf16 every trial finished). No trial finishes,
    # which is a one-line error
    data = only_days(datasets["sessions"], tmp_path / "d", [0, 1, 2])
    space = dataclasses.replace(SPACE, lr=[1e29, 1e30])
    with pytest.raises(ConfigError, match="no trial of 2 finished"):
        tune("student", train=tiny_train(), model=SMALL_MODEL, data=data,
             split=SplitConfig(), loader=LOADER, cfg=TuneConfig(space=space, trials=2))


def test_apply_scales_every_hidden_width_and_sets_the_dim():
    """Planted bug that turns this red (tried): the teacher's dense_mlp left out of WIDTHS."""
    train, model = apply({"lr": 0.02, "epochs": 3, "embedding_dim": 32, "width": 2.0},
                         "student", tiny_train(), SMALL_MODEL)
    assert (train.lr, train.epochs) == (0.02, 3)
    s = model.student
    assert (s.embedding_dim, s.bottom_mlp, s.top_mlp) == (32, [32], [64, 32])
    _, teacher = apply({"width": 0.5}, "teacher", tiny_train(), SMALL_MODEL)
    t0, t = SMALL_MODEL.teacher, teacher.teacher
    assert t.fm_mlp == [w // 2 for w in t0.fm_mlp] and t.top_mlp == [w // 2 for w in t0.top_mlp]
    assert t.dense_mlp == [w // 2 for w in t0.dense_mlp]


@pytest.mark.parametrize("bad, why", [
    (dict(lr=[0.1, 0.01]), "low <= high"),
    (dict(lr=[0.01]), r"\[low, high\]"),
    (dict(epochs=[0, 2]), "1 <= low"),
    (dict(epochs=[1.5, 2]), "integers"),
    (dict(embedding_dim=[0, 8]), "multiples of 4"),
    (dict(embedding_dim=[6, 8]), "multiples of 4"),
    (dict(width=[1.0, 1.0]), "repeated"),
    (dict(lr=[], embedding_lr=[], epochs=[], embedding_dim=[], width=[]), "searches nothing"),
])
def test_a_bad_search_space_is_refused(bad, why):
    with pytest.raises(ConfigError, match=why):
        TuneSpace(**bad)


def test_a_search_needs_a_budget():
    with pytest.raises(ConfigError, match="budget"):
        TuneConfig(trials=0, minutes=0)
    assert dataclasses.replace(TuneConfig(), trials=0, minutes=1.0).minutes == 1.0


def test_a_plan_that_cannot_be_read_is_refused_before_any_trial(datasets, tmp_path,
                                                                 monkeypatch):
    """The ops probe: `lrm tune --plan MISSING` started trial 0, which failed ("Trial 0
    failed with value None") before the plan's error came. Red without the read up front."""
    import lrm.train

    built = []
    monkeypatch.setattr(lrm.train, "build_job", lambda *a, **k: built.append(k) or 1 / 0)
    with pytest.raises(ConfigError, match="nowhere.json: plan file not found"):
        tune("student", train=tiny_train(), model=SMALL_MODEL, data=datasets["sessions"],
             split=SplitConfig(), loader=LOADER, cfg=TuneConfig(space=SPACE, trials=1),
             plan=tmp_path / "nowhere.json")
    assert built == []  # (a trial that builds its job fails: 1 / 0)

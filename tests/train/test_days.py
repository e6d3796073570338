"""A model carried from day to day (lrm.train.days): day D starts from the day before's
newest checkpoint (linked: a carry), a stopped day goes on from its own, the finished days'
folders are never written, and only the newest finished days are kept."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from lrm.config import CheckpointConfig, SplitConfig
from lrm.train import TrainJob
from lrm.train import days
from lrm.train.job import bce_loss
from tests.train.conftest import LOADER, SMALL_MODEL, datasets, tiny_train  # noqa: F401


def _files(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


OWNER = "test"


def _day(data, chain, day, **kw):
    """Day `day` of the carried student; (its result, whether it carried the day before)."""
    new_data = days.day_folder(chain, day, OWNER)[1]
    job = TrainJob(kind="student", train=tiny_train(steps=4), model=SMALL_MODEL, data=data,
                   split=SplitConfig(days=[day], eval_day=2), loader=LOADER,
                   checkpoint=CheckpointConfig(every=2), **kw)
    return days.train_day(job, chain, day, owner=OWNER), new_data


def test_each_day_starts_from_the_last_and_a_stopped_day_from_its_own(
        datasets, tmp_path):  # noqa: F811
    data, chain = datasets["sessions"], tmp_path / "chain"
    d0, new0 = _day(data, chain, 0)
    assert (new0, d0.resumed_from, d0.steps) == (False, None, 4)  # the first day: fresh
    assert days.finished(chain) == [0]
    day0 = _files(chain / "day=0")

    calls = {"n": 0}

    def stop_at_step_4(model, batch):
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("stopped mid-day")
        return bce_loss(model, batch)

    with pytest.raises(RuntimeError, match="stopped mid-day"):
        _day(data, chain, 1, loss=stop_at_step_4)
    assert _files(chain / "day=0") == day0  # the finished day is only read
    assert days.newest(chain) == d0.checkpoint  # what a day starts from has not moved
    seed = json.loads((chain / "day=1" / "_seed.json").read_text())
    assert seed["from_day"] == 0 and d0.checkpoint.name in seed["checkpoints"]
    linked = chain / "day=1" / d0.checkpoint.name / "manifest.json"
    assert os.path.samefile(linked, d0.checkpoint / "manifest.json")  # a link, not a copy

    assert days.finished(chain) == [0]  # the stopped day is not over
    d1, new1 = _day(data, chain, 1)  # day 1 again: its own checkpoint at step 2
    assert (new1, d1.resumed_from, d1.steps) == (False, 2, 4)
    assert d1.train_days == [1] and days.finished(chain) == [0, 1]


def test_the_next_day_resumes_the_model_not_the_step_count(datasets, tmp_path):  # noqa: F811
    data, chain = datasets["sessions"], tmp_path / "chain"
    d0, _ = _day(data, chain, 0)
    d1, new1 = _day(data, chain, 1)
    assert new1 and d1.resumed_from == d0.steps and d1.steps == 4  # its own 4 steps
    assert d1.checkpoint.parent == chain / "day=1"


def test_only_the_newest_finished_days_are_kept(tmp_path):
    chain = tmp_path / "chain"
    days.day_folder(chain, 1, OWNER)
    (chain / "day=0").mkdir()  # someone's own folder beside lrm's: never removed
    (chain / "day=0" / "mine.txt").write_text("keep me")
    for d in (1, 2, 3, 4):
        folder, new_data = days.day_folder(chain, d, OWNER)
        assert not new_data  # no checkpoint to start from in these folders
        days.finish(chain, d, {"day": d}, OWNER)
    assert sorted(p.name for p in chain.glob("day=*")) == ["day=0", "day=3", "day=4"]
    assert (chain / "day=0" / "mine.txt").read_text() == "keep me"
    days.finish(chain, 4, {"day": "again"}, OWNER)  # a second finish does not rewrite the mark
    assert json.loads((chain / "day=4" / "_done.json").read_text()) == {"day": 4}
    assert days.finished(chain) == [3, 4] and days.finished(chain, before=4) == [3]

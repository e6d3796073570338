"""A model carried from day to day (lrm.train.days): day D starts from the day before's model
with fresh optimizers (exactly a warm start from it), a stopped day goes on from its own
checkpoint, the finished days' folders are never written, and only the newest finished days
are kept."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
import torch

from lrm.config import CheckpointConfig, SplitConfig
from lrm.errors import ConfigError, DataError
from lrm.models.saved import WEIGHTS
from lrm.train import TrainJob, days, train
from lrm.train.job import bce_loss
from tests.conftest import LOADER, SMALL_MODEL, other_weights, tiny_train

OWNER = "test"


def _files(folder):
    """Every file under `folder` with its hash (lrm's markers aside: they name the writer)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.name.startswith(".lrm")}


def _job(data, day, **kw):
    return TrainJob(kind="student", train=tiny_train(steps=4), model=SMALL_MODEL, data=data,
                    split=SplitConfig(days=[day], eval_day=2), loader=LOADER,
                    checkpoint=CheckpointConfig(every=2), **kw)


def _weights(folder):
    return torch.load(folder / WEIGHTS, weights_only=True)


def _stopping_at(step):
    """A loss that raises at its `step`-th call: a run stopped mid-day, its checkpoints
    before that step on disk."""
    calls = {"n": 0}

    def loss(model, batch):
        calls["n"] += 1
        if calls["n"] == step:
            raise RuntimeError("stopped mid-day")
        return bce_loss(model, batch)

    return loss


def test_each_day_starts_from_the_last_and_a_stopped_day_from_its_own(
        datasets, tmp_path):  # noqa: F811
    data, chain = datasets["sessions"], tmp_path / "chain"
    d0 = days.train_day(_job(data, 0, out=tmp_path / "out0"), chain, 0, owner=OWNER)
    assert (d0.start, d0.resumed_from, d0.steps) == ("fresh", None, 4)  # the first day
    assert days.finished(chain) == [0] and days.newest(chain) == chain / "day=0" / "model"
    assert _files(tmp_path / "out0") == _files(chain / "day=0" / "model")  # the job's out
    day0 = _files(chain / "day=0")

    with pytest.raises(RuntimeError, match="stopped mid-day"):
        days.train_day(_job(data, 1, loss=_stopping_at(4)), chain, 1, owner=OWNER)
    assert _files(chain / "day=0") == day0  # the finished day is only read
    assert days.finished(chain) == [0]  # the stopped day is not over
    d1 = days.train_day(_job(data, 1), chain, 1, owner=OWNER)  # again: its own step 2
    assert (d1.start, d1.resumed_from, d1.steps) == ("resume", 2, 4)
    assert d1.train_days == [1] and days.finished(chain) == [0, 1]


def test_the_next_day_is_a_warm_start_from_the_day_before(datasets, tmp_path):  # noqa: F811
    """Fresh optimizers on the day before's model, its own step count: bit for bit what a
    warm start from that model folder trains (on the CPU, deterministic)."""
    data, chain = datasets["sessions"], tmp_path / "chain"
    days.train_day(_job(data, 0), chain, 0, owner=OWNER)
    d1 = days.train_day(_job(data, 1), chain, 1, owner=OWNER)
    assert (d1.start, d1.init_from, d1.steps) == ("warm", chain / "day=0" / "model", 4)
    assert d1.checkpoint.parent == chain / "day=1"
    warm = train(_job(data, 1, start="warm", init_from=chain / "day=0" / "model",
                      out=tmp_path / "warm"))
    assert warm.eval == d1.eval
    carried, plain = _weights(chain / "day=1" / "model"), _weights(tmp_path / "warm")
    assert all(torch.equal(carried[k], plain[k]) for k in plain)


def test_a_day_after_the_first_goes_on_at_the_batch_size_and_its_resume_too(
        datasets, tmp_path):  # noqa: F811
    """train.fit_steps fits a model's first run (many small steps); a day that goes on from
    the day before's model keeps train.batch_size (measured on the default world: the VMs'
    next-day NE 0.946 -> 0.938 and 2-5x quieter over seeds, lrm.train.days). A resume of that
    day takes the same schedule, decided by the chain rather than by how the run starts."""
    data, chain = datasets["sessions"], tmp_path / "chain"

    def job(day, **kw):
        return _job(data, day, **kw).but(train=tiny_train(steps=0, epochs=1, fit_steps=200,
                                                          min_steps=1, min_batch_size=64))

    d0 = days.train_day(job(0), chain, 0, owner=OWNER)
    assert d0.schedule["batch_size"] < 512  # the first run: fitted (smaller batches)
    fitted = train(job(1, out=tmp_path / "fresh1"))  # day 1 on its own, fresh: fitted too
    assert fitted.schedule["batch_size"] < 512

    with pytest.raises(RuntimeError, match="stopped mid-day"):
        days.train_day(job(1, loss=_stopping_at(3)), chain, 1, owner=OWNER)
    d1 = days.train_day(job(1), chain, 1, owner=OWNER)  # resumed from its own step 2
    assert d1.start == "resume" and d1.resumed_from == 2
    assert d1.schedule["batch_size"] == 512  # not fitted: the day goes on from day 0's model
    assert d1.steps == d1.schedule["epoch_batches"] < fitted.steps


def test_a_day_of_another_model_is_refused(datasets, tmp_path):  # noqa: F811
    chain = tmp_path / "chain"
    days.train_day(_job(datasets["sessions"], 0), chain, 0, owner=OWNER)
    other = dataclasses.replace(SMALL_MODEL, student=dataclasses.replace(
        SMALL_MODEL.student, embedding_dim=4))
    with pytest.raises(ConfigError, match="another config or table sizes"):
        days.train_day(_job(datasets["sessions"], 1).but(model=other), chain, 1, owner=OWNER)
    assert days.finished(chain) == [0]


def test_a_day_whose_model_was_swapped_since_is_not_started_from(datasets, tmp_path):  # noqa: F811
    """The issue-45 probe swapped day 7's state_dict.pt: day 8 started from it, trained and
    promoted. The day before's folder is checked against what lrm recorded; the next day
    fails naming the file and writes nothing. Red with load_weights' check dropped."""
    chain = tmp_path / "chain"
    days.train_day(_job(datasets["sessions"], 0), chain, 0, owner=OWNER)
    other_weights(chain / "day=0" / "model")
    with pytest.raises(DataError, match=r"day=0/model/state_dict\.pt: changed since lrm "
                                        r"wrote it"):
        days.train_day(_job(datasets["sessions"], 1), chain, 1, owner=OWNER)
    assert days.finished(chain) == [0] and not (chain / "day=1" / "model").exists()


def test_the_held_out_day_may_come_from_another_dataset(datasets, tmp_path):  # noqa: F811
    """A stream day whose next day is not there yet is scored on its own held-out slice."""
    from lrm.data import synthetic
    from lrm.data.loader import BatchLoader
    from tests.conftest import TINY

    held = tmp_path / "held"  # another day 0: a few sessions of their own
    synthetic.generate(dataclasses.replace(TINY, days=1, sessions_per_day=50, seed=9), held)
    r = train(TrainJob(kind="student", train=tiny_train(), model=SMALL_MODEL,
                       data=datasets["sessions"], split=SplitConfig(days=[0], eval_day=0),
                       eval_data=held, loader=LOADER))
    assert r.eval_day == 0 and r.train_days == [0]
    assert r.eval["rows"] == BatchLoader(held, 512, days=[0]).num_rows() < 1000


def test_only_the_newest_finished_days_are_kept(tmp_path):
    chain = tmp_path / "chain"
    (chain / "day=0").mkdir(parents=True)  # someone's own folder beside lrm's: never removed
    (chain / "day=0" / "mine.txt").write_text("keep me")
    from lrm import io
    for d in (1, 2, 3, 4):
        io.claim_dir(chain / f"day={d}", OWNER)
        days.finish(chain, d, {"day": d}, OWNER)
    assert sorted(p.name for p in chain.glob("day=*")) == ["day=0", "day=3", "day=4"]
    assert (chain / "day=0" / "mine.txt").read_text() == "keep me"
    days.finish(chain, 4, {"day": "again"}, OWNER)  # a second finish does not rewrite the mark
    assert json.loads((chain / "day=4" / "_done.json").read_text()) == {"day": 4}
    assert days.finished(chain) == [3, 4] and days.finished(chain, before=4) == [3]

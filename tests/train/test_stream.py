"""Streaming training (`train(..., resume=True, new_data=True)`): the next day goes on from the
previous day's checkpoint (its model and optimizer state) and trains one pass of its own
data, counting its own steps; the held-out day may come from another dataset (`eval_from`);
a checkpoint of another model is still refused."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lrm.config import CheckpointConfig, SplitConfig
from lrm.errors import ConfigError
from lrm.train import TrainJob, train
from lrm.train.export import WEIGHTS
from tests.train.conftest import LOADER, SMALL_MODEL, datasets, tiny_train  # noqa: F401

CKPT = CheckpointConfig(every=0)


def _day(data, chain, out, day, **kw):
    return train(TrainJob(kind="student", train=tiny_train(), model=SMALL_MODEL, data=data,
                          split=SplitConfig(days=[day], eval_day=day + 1), loader=LOADER,
                          checkpoint=CKPT, checkpoints=chain, out=out,
                          start="carry" if day > 0 else "resume", **kw))


def _weights(folder):
    return torch.load(folder / WEIGHTS, weights_only=True)


def test_the_next_day_goes_on_from_the_checkpoint(datasets, tmp_path):  # noqa: F811
    data, chain = datasets["sessions"], tmp_path / "chain"
    d0 = _day(data, chain, tmp_path / "d0", 0)
    assert d0.resumed_from is None and d0.steps > 0
    d1 = _day(data, chain, tmp_path / "d1", 1)  # the next day: one pass of its own data
    assert d1.resumed_from == d0.steps and d1.train_days == [1] and d1.eval_day == 2

    # the optimizer state came along: the tables' row-wise Adagrad goes on with day 0's
    # accumulated squared gradients, so day 1 moves the tables far less than a warm start from
    # day 0's weights alone (fresh optimizers) does over the same batches (measured: ~0.45x)
    warm = train(TrainJob(kind="student", train=tiny_train(), model=SMALL_MODEL, data=data,
                          split=SplitConfig(days=[1], eval_day=2), loader=LOADER,
                          out=tmp_path / "warm", init_from=tmp_path / "d0", start="warm"))
    assert warm.steps == d1.steps  # the day counts its own steps: one pass of day 1
    before, streamed, warmed = (_weights(tmp_path / n) for n in ("d0", "d1", "warm"))
    tables = [k for k in before if ".embedding_bags." in k]

    def moved(after):
        return sum(float((after[k] - before[k]).norm()) for k in tables)

    assert tables and moved(streamed) < 0.8 * moved(warmed)


def test_the_held_out_day_may_come_from_another_dataset(datasets, tmp_path):  # noqa: F811
    from lrm.data import synthetic
    from lrm.data.loader import BatchLoader
    from tests.train.conftest import TINY

    held = tmp_path / "held"  # another day 0: a few sessions of their own
    synthetic.generate(dataclasses.replace(TINY, days=1, sessions_per_day=50, seed=9), held)
    r = train(TrainJob(kind="student", train=tiny_train(), model=SMALL_MODEL,
                       data=datasets["sessions"], split=SplitConfig(days=[0], eval_day=0),
                       eval_data=held, loader=LOADER))
    assert r.eval_day == 0 and r.train_days == [0]
    assert r.eval["rows"] == BatchLoader(held, 512, days=[0]).num_rows() < 1000


def test_a_chain_of_another_model_is_refused(datasets, tmp_path):  # noqa: F811
    chain = tmp_path / "chain"
    _day(datasets["sessions"], chain, None, 0)
    other = dataclasses.replace(SMALL_MODEL, student=dataclasses.replace(
        SMALL_MODEL.student, embedding_dim=4))
    with pytest.raises(ConfigError, match=r"written by another run \(model: "):
        train(TrainJob(kind="student", train=tiny_train(), model=other, data=datasets["sessions"],
                       split=SplitConfig(days=[1], eval_day=2), loader=LOADER, checkpoint=CKPT,
                       checkpoints=chain, start="carry"))

"""The schedule fitted to the data: step floor, batch floor, validation slice, warm-up."""

from __future__ import annotations

import torch

from lrm.config import LoaderConfig, SplitConfig, TrainConfig

from lrm.dist import Dist
from lrm.train.data import TrainData, loaders
from lrm.train.schedule import plan


def test_a_small_dataset_gets_a_smaller_batch_for_enough_steps():
    """Planted bugs that turn this red (each tried): the batch shrunk for min_steps only
    (fit_steps ignored); the batch floor ignored."""
    log = plan(TrainConfig(), rows=168_000, world_size=1)  # a 200k-impression log's train days
    assert log.batch_size == 168_000 // 500 == 336 and log.steps == 500 and log.epochs == 1
    assert log.val_batches == 0 and log.val_every == 0  # one pass: no slice held out
    assert log.warmup == 50 and "336" in log.adapted[0]
    s = plan(TrainConfig(), rows=7609, world_size=1)  # the Criteo sample's: the batch floor
    assert s.batch_size == 128 and s.steps == 7609 // 128 == 59 and s.epochs == 1
    assert s.warmup == 5 and len(s.adapted) == 1  # 59 >= min_steps: no more passes
    big = plan(TrainConfig(), rows=2_000_000, world_size=1)  # enough rows: untouched
    assert big.batch_size == 2048 and big.steps == 2_000_000 // 2048 and not big.adapted
    assert big.warmup == 50


def test_the_batch_floor_then_more_epochs():
    s = plan(TrainConfig(min_batch_size=64), rows=1000, world_size=1)
    assert s.batch_size == 64 and s.epochs == 4  # 15 steps a pass: 4 passes for 50
    assert s.steps >= 50 - s.epoch_batches  # the last epoch's validation rows train less
    assert s.val_batches >= 1 and s.epoch_batches + s.val_batches == 1000 // 64
    assert s.val_every == max(1, s.epoch_batches // 10)
    assert len(s.adapted) == 2


def test_world_size_the_batch_divides_and_steps_match_the_loader(datasets):
    data = TrainData.open(datasets["sessions"], SplitConfig(days=[0, 1], eval_day=2))
    rows = data.stats.rows
    for world in (1, 2, 3):
        for cfg in (TrainConfig(batch_size=510, steps=7),
                    TrainConfig(batch_size=2048, epochs=3, min_batch_size=17)):
            s = plan(cfg, rows, world)
            assert s.batch_size % world == 0
            env = Dist(rank=world - 1, world_size=world, local_rank=0,
                       device=torch.device("cpu"))
            ld = loaders(data, s.batch_size, s.val_batches, LoaderConfig(), env, {})
            # the loader's batches of this rank are the schedule's steps an epoch
            assert ld.train_batches == s.epoch_batches > 0, (world, cfg, s)


def test_explicit_steps_are_literal_and_nothing_else_depends_on_them():
    short, long = (plan(TrainConfig(batch_size=512, steps=n, epochs=3), 23_000, 1)
                   for n in (30, 60))
    assert short.steps == 30 and long.steps == 60
    assert short.batch_size == long.batch_size == 512 and short.val_batches == 0
    assert {k: v for k, v in short.summary().items() if k not in ("steps", "epochs")} == \
        {k: v for k, v in long.summary().items() if k not in ("steps", "epochs")}


def test_validation_is_capped_and_off_when_asked():
    s = plan(TrainConfig(batch_size=100, epochs=2, val_max_rows=300), 100_000, 1)
    assert s.val_batches == 3 and s.epoch_batches == 997
    assert plan(TrainConfig(batch_size=100, epochs=2, val_fraction=0), 100_000, 1
                ).val_batches == 0
    assert plan(TrainConfig(min_steps=0, fit_steps=0), 7609, 1).batch_size == 2048  # off


def test_warm_up_ramps_to_the_learning_rate():
    s = plan(TrainConfig(warmup_steps=4), 100_000, 1)
    assert [s.lr_factor(i) for i in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert plan(TrainConfig(warmup_steps=0), 100_000, 1).lr_factor(0) == 1.0

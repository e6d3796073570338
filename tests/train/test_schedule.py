"""The schedule fitted to the data: step floor, batch floor, validation slice, warm-up."""

from __future__ import annotations

import torch

from lrm.config import LoaderConfig, SplitConfig, TrainConfig

from lrm.dist import Dist
from lrm.train.data import TrainData, loaders
from lrm.train.schedule import plan


def test_a_small_dataset_gets_a_smaller_batch_for_enough_steps():
    s = plan(TrainConfig(), rows=7609, world_size=1)  # the Criteo sample's train days
    assert s.batch_size == 7609 // 50 == 152 and s.steps == 50 and s.epochs == 1
    assert s.val_batches == 0 and s.val_every == 0  # one pass: no slice held out
    assert s.warmup == 5 and s.adapted and "152" in s.adapted[0]
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
    assert plan(TrainConfig(min_steps=0), 7609, 1).batch_size == 2048  # floor off


def test_warm_up_ramps_to_the_learning_rate():
    s = plan(TrainConfig(warmup_steps=4), 100_000, 1)
    assert [s.lr_factor(i) for i in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert plan(TrainConfig(warmup_steps=0), 100_000, 1).lr_factor(0) == 1.0

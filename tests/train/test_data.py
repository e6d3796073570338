"""The held-out batch cut and the windowed NE of the training meter."""

from __future__ import annotations

import torch

from lrm.train.data import eval_batch
from lrm.train.meter import WindowNE


def test_eval_batch_leaves_no_tail_for_any_rank_to_drop():
    for rows in (1, 7, 999, 9020, 11_860, 1_000_003):
        for world in (1, 2, 3, 8):
            for batch in (64, 500, 4096):
                b = eval_batch(rows, world, batch)
                steps = -(-rows // b)
                assert b <= batch or rows < world
                if b > world * -(-rows // (world * batch)):
                    assert steps % world == 0, (rows, world, batch, b)


def test_window_ne_spans_the_latest_periods():
    w = WindowNE(rows=1000)
    w.push(700.0, 30.0, 1000.0)  # a bad first period
    w.push(100.0, 30.0, 1000.0)
    assert len(w.periods) == 1  # the first one left the window
    c = 0.03
    h = -(c * torch.log(torch.tensor(c)) + (1 - c) * torch.log(torch.tensor(1 - c)))
    assert abs(w.ne() - 0.1 / float(h)) < 1e-6

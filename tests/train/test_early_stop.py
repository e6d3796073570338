"""Early stopping: stop after `patience` validations without a lower NE, restore the best."""

from __future__ import annotations

import math

import torch
from torch import nn

from lrm.train.early_stop import EarlyStopping
from lrm.train.state import TrainState


def _set(model: nn.Module, value: float) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)


def test_stops_after_patience_and_restores_the_best_weights():
    model, state = nn.Linear(3, 2), TrainState()
    stop = EarlyStopping(model, state, patience=2)
    decisions = []
    for step, ne in [(10, 0.9), (20, 0.8), (30, 0.85), (40, math.nan), (50, 0.8), (60, 0.7),
                     (70, 0.75), (80, 0.71)]:
        _set(model, step)  # the weights "at" that step
        decisions.append(stop.update(ne, step))
    # 0.85 and 0.8 (not lower than the best 0.8) count, NaN does not, 0.7 resets
    assert decisions == [False, False, False, False, True, False, False, True]
    assert (state.best_ne, state.best_step, state.stale) == (0.7, 60, 2)
    assert stop.restore(80) == 60
    assert all(torch.equal(p, torch.full_like(p, 60.0)) for p in model.parameters())
    assert stop.restore(60) is None  # already the best state


def test_a_resumed_run_fetches_the_best_state_it_did_not_copy():
    model, state = nn.Linear(3, 2), TrainState(best_ne=0.5, best_step=40, stale=1)
    fetched = []

    def fetch(step):  # the run's checkpoint of `step`
        fetched.append(step)
        _set(model, step)
        return True

    stop = EarlyStopping(model, state, patience=5, fetch=fetch)
    _set(model, 50)  # resumed at step 50: the step-40 weights are not in memory
    stop.resumed(50)
    assert stop.update(0.6, 60) is False and stop.restore(60) == 40 and fetched == [40]
    assert all(torch.equal(p, torch.full_like(p, 40.0)) for p in model.parameters())

    state = TrainState(best_ne=0.5, best_step=40, stale=1)  # no checkpoint of step 40 left
    stop = EarlyStopping(model, state, patience=5, fetch=lambda step: False)
    _set(model, 50)
    assert stop.update(0.6, 60) is False and stop.restore(60) is None
    assert all(torch.equal(p, torch.full_like(p, 50.0)) for p in model.parameters())

    state = TrainState(best_ne=0.5, best_step=40)  # resumed from the best step itself
    stop = EarlyStopping(model, state, patience=5)
    _set(model, 40)
    stop.resumed(40)
    _set(model, 70)
    assert stop.update(0.6, 70) is False and stop.restore(70) == 40
    assert all(torch.equal(p, torch.full_like(p, 40.0)) for p in model.parameters())


def test_train_state_carries_the_bookkeeping():
    a = TrainState(step=7, samples=70, best_ne=0.625, best_step=5, stale=2, validated_at=6)
    b = TrainState()
    b.load_state_dict(a.state_dict())
    assert (b.step, b.samples, b.best_ne, b.best_step, b.stale, b.validated_at) == \
        (7, 70, 0.625, 5, 2, 6)

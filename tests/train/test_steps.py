"""How a step runs: the train pipeline trains exactly as a plain loop would; the learning-rate
schedule reaches both optimizers; compiling the MLPs keeps the state-dict keys."""

from __future__ import annotations

import pytest
import torch

from lrm.config import ModelConfig, StudentModelConfig
from lrm.data.loader import BatchLoader
from lrm.data.schema import read_schema
from lrm.dist import process_group
from lrm.models import build_model
from lrm.sharding import parallel
from lrm.train.data import model_hash_sizes
from lrm.train.job import bce_loss
from lrm.train.steps import LrSchedule, Steps, compile_dense, dense_optimizer

MODEL = ModelConfig(student=StudentModelConfig(embedding_dim=8, bottom_mlp=[16],
                                               top_mlp=[16]))


def _run(data, pipelined: bool, lr_factors: list[float]) -> list[float]:
    schema, _ = read_schema(data)
    with process_group("cpu") as env:
        torch.manual_seed(0)
        model = build_model("student", schema, MODEL, device="meta")
        dmp = parallel.shard(model, env, embedding_lr=0.05, seed=0)
        dense, _ = dense_optimizer(dmp, 1e-2, 0.0)
        opt = parallel.optimizer(dmp, dense)
        lrs = LrSchedule(opt)
        batches = list(BatchLoader(data, 256, days=[0], hash_sizes=model_hash_sizes(model),
                                   prefetch=0))[:len(lr_factors)]
        losses: list[float] = []

        def step_fn(b):
            loss, _ = bce_loss(dmp, b)
            losses.append(float(loss))
            return loss, None

        if pipelined:
            steps, it = Steps(dmp, opt, env.device, step_fn), iter(batches)
            for f in lr_factors:
                lrs.set(f)
                assert steps.step(it)
            assert not steps.step(it)  # exhausted: nothing left in flight
            steps.pause()
        else:
            for f, b in zip(lr_factors, batches, strict=True):
                lrs.set(f)
                opt.zero_grad(set_to_none=True)
                loss, _ = step_fn(b)
                loss.backward()
                opt.step()
        return losses


def test_the_pipeline_trains_as_a_plain_loop_and_the_schedule_reaches_both_optimizers(
        datasets):
    factors = [0.25, 0.5, 1.0, 1.0, 1.0]
    plain = _run(datasets["sessions"], False, factors)
    assert _run(datasets["sessions"], True, factors) == plain  # same batches, same steps
    # a learning rate that changes changes the training: the schedule is applied
    assert _run(datasets["sessions"], True, [1.0] * 5) != plain


def test_compiling_the_mlps_keeps_the_model(datasets, monkeypatch):
    compiled = []
    original = torch.nn.Module.compile

    def eager(self, *args, **kwargs):  # inductor takes ~50 s on 2 cores; the wiring is what
        compiled.append(self)  # is tested here, with dynamo's eager backend
        return original(self, backend="eager")

    monkeypatch.setattr(torch.nn.Module, "compile", eager)
    schema, _ = read_schema(datasets["sessions"])
    for kind, want in (("student", ["bottom", "top"]), ("teacher", ["dense", "layers", "top"])):
        torch.manual_seed(0)
        model = build_model(kind, schema, MODEL)
        keys = list(model.state_dict())
        b = next(iter(BatchLoader(datasets["sessions"], 64, days=[2], prefetch=0,
                                  hash_sizes=model_hash_sizes(model))))
        with torch.no_grad():
            before = model(b)
            assert compile_dense(model, torch.device("cpu")) == want
            assert torch.equal(model(b), before)
        assert list(model.state_dict()) == keys
    assert len(compiled) == 5


@pytest.mark.parametrize("factor", [0.5])
def test_lr_schedule_scales_every_group_from_its_own_base(factor):
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [a], "lr": 0.1}, {"params": [b], "lr": 0.01}])
    lrs = LrSchedule(opt)
    lrs.set(factor)
    lrs.set(factor)  # not compounded
    assert [g["lr"] for g in opt.param_groups] == [0.1 * factor, 0.01 * factor]

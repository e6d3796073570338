"""The non-finite guard: a step with a NaN loss changes no weight and no optimizer state, the
host hears of it only when it checks, and a checkpoint is never taken past it."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from lrm.config import ModelConfig, StudentModelConfig
from lrm.data.loader import BatchLoader
from lrm.data.schema import read_schema
from lrm.dist import process_group
from lrm.models import build_model
from lrm.sharding import parallel
from lrm.train.data import model_hash_sizes
from lrm.train.guard import NonFiniteGuard, NonFiniteLossError, fused_table_modules
from lrm.train.job import bce_loss
from lrm.train.state import TrainState
from lrm.train.steps import Steps, dense_optimizer

MODEL = ModelConfig(student=StudentModelConfig(embedding_dim=8, bottom_mlp=[16],
                                               top_mlp=[16]))


def _snapshot(dmp, opt) -> dict[str, torch.Tensor]:
    out = {}
    for k, t in list(dmp.state_dict().items()) + [
            (f"opt.{k}", v) for k, v in _flat(opt.state_dict()["state"]).items()]:
        local = [s.tensor for s in t.local_shards()] if hasattr(t, "local_shards") else [t]
        out.update({f"{k}#{i}": x.detach().clone() for i, x in enumerate(local)})
    return out


def _flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        elif isinstance(v, torch.Tensor):
            out[f"{prefix}{k}"] = v
    return out


def test_a_nan_step_changes_nothing_and_is_reported_when_checked(datasets):
    data: Path = datasets["sessions"]
    schema, _ = read_schema(data)
    with process_group("cpu") as env:
        torch.manual_seed(0)
        model = build_model("student", schema, MODEL, device="meta")
        dmp = parallel.shard(model, env, embedding_lr=0.05, seed=0)
        # one pooling mode: every side's tables in one fused kernel
        assert len(fused_table_modules(dmp)) == 2
        guard = NonFiniteGuard(env, lambda step, v: f"bad loss {v} at step {step}")
        dense, adamw = dense_optimizer(dmp, 1e-2, 0.0)
        guard.gate(dmp, adamw)
        opt = parallel.optimizer(dmp, dense)
        steps = Steps(dmp, opt, env.device, lambda b: (_watched(guard, dmp, b), None))
        batches = list(BatchLoader(data, 256, days=[0], hash_sizes=model_hash_sizes(model),
                                   prefetch=0))[:3]
        steps.step(iter(batches[:1]))  # a good step: optimizer state exists from here on
        before = _snapshot(dmp, opt)
        bad = copy.copy(batches[1])
        bad.dense = torch.full_like(bad.dense, float("nan"))
        steps.step(iter([bad]))
        after = _snapshot(dmp, opt)
        assert before.keys() == after.keys()
        for k in before:  # tables, dense weights, Adagrad and AdamW state: all untouched
            assert torch.equal(before[k], after[k]), k
        state = TrainState(guard=guard)
        with pytest.raises(NonFiniteLossError, match="bad loss nan at step 1"):
            guard.check()
        with pytest.raises(NonFiniteLossError):  # what a checkpoint save calls first
            state.state_dict()

        steps.step(iter(batches[2:3]))  # a good step after it trains again
        changed = _snapshot(dmp, opt)
        assert any(not torch.equal(after[k], changed[k]) for k in after if "t_user_id" in k)
        assert any(not torch.equal(after[k], changed[k]) for k in after if "top.0.weight" in k)
        assert all(torch.isfinite(v.float()).all() for v in changed.values())
        guard.reset(3)  # a resumed run starts clean
        guard.check()
        state.state_dict()


def _watched(guard: NonFiniteGuard, dmp, b) -> torch.Tensor:
    loss, _ = bce_loss(dmp, b)
    guard.watch(loss)
    return loss


def test_the_dense_optimizer_must_be_fused(datasets):
    schema, _ = read_schema(datasets["sessions"])
    with process_group("cpu") as env:
        dmp = parallel.shard(build_model("student", schema, MODEL, device="meta"), env,
                             embedding_lr=0.05, seed=0)
        plain = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
        with pytest.raises(ValueError, match="fused"):
            NonFiniteGuard(env, str).gate(dmp, plain)

"""Dispatch: only the layers a report allows go to FP8; a tiny model trains with the plan."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from lrm.data.schema import read_schema
from lrm.errors import ConfigError, DataError
from lrm.fp8 import dispatch as D
from lrm.fp8.linear import Fp8Linear
from lrm.models import build_model
from lrm.models.saved import load_model, read_card
from lrm.train import TrainJob, train
from tests.conftest import LOADER, SMALL_MODEL, tiny_train


def _report(plan: dict[str, tuple[int, int]], kind: str = "student") -> dict:
    layers = {n: {"shape": {"rows": 256, "k": k, "n": n_}, "fp8": True}
              for n, (k, n_) in plan.items()}
    layers["bottom.0"] = {"shape": {"rows": 256, "k": 4, "n": 16}, "fp8": False}
    return {"format": D.FORMAT, "device": "test", "models": {
        "m": {"kind": kind, "plan": list(plan), "layers": layers}},
        "settings": {"recipe": "tensorwise", "backend": "scaled_mm", "compile": False}}


@pytest.fixture
def student(datasets):
    schema, _ = read_schema(datasets["sessions"])
    torch.manual_seed(0)
    return build_model("student", schema, SMALL_MODEL)


def test_dispatch_changes_only_the_planned_layers(student):
    before = {n: type(m) for n, m in student.named_modules()}
    params = {n: p for n, p in student.named_parameters()}
    keys = list(student.state_dict())
    top0 = student.top[0]
    plan, settings = D.plan_for(_report({"top.0": (top0.in_features, 32),
                                         "top.2": (99, 16)}), "student")  # top.2: other shape
    swapped = D.dispatch(student, plan, backend="scaled_mm", compile=False)
    assert swapped == ["top.0"]
    after = {n: type(m) for n, m in student.named_modules()}
    changed = {n for n in before if before[n] is not after[n]}
    assert changed == {"top.0"} and after["top.0"] is Fp8Linear
    assert {n: p for n, p in student.named_parameters()} == params  # the same Parameters
    assert list(student.state_dict()) == keys


def test_a_report_for_another_kind_plans_nothing():
    plan, _ = D.plan_for(_report({"top.0": (1, 32)}, kind="teacher"), "student")
    assert plan == {}


def test_transform_reads_the_report_and_bad_reports_are_clear_errors(tmp_path, student):
    assert D.transform("", "student") is None
    with pytest.raises(ConfigError, match="no such probe report"):
        D.transform(tmp_path / "none.json", "student")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(DataError, match="bad.json"):
        D.transform(bad, "student")
    good = tmp_path / "r.json"
    good.write_text(json.dumps(_report({"top.2": (32, 16)})))
    model, layers = D.transform(good, "student")(student)
    assert isinstance(model.top[2], Fp8Linear) and not isinstance(model.top[0], Fp8Linear)
    assert layers == ["top.2"]  # what the run's card records


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_tiny_model_trains_with_the_fp8_plan_on_cpu(datasets, tmp_path, monkeypatch):
    report = tmp_path / "r.json"  # top.0 was probed with another shape: left alone
    report.write_text(json.dumps(_report({"top.0": (1, 32), "top.2": (32, 16),
                                          "head": (16, 1)})))
    seen: list[list[str]] = []
    calls = []
    forward = Fp8Linear.forward
    monkeypatch.setattr(Fp8Linear, "forward", lambda self, x: calls.append(1) or
                        forward(self, x))

    def fp8(model: nn.Module) -> tuple[nn.Module, list[str]]:
        model, layers = D.transform(report, "student")(model)
        seen.append([n for n, m in model.named_modules() if isinstance(m, Fp8Linear)])
        return model, layers

    out = tmp_path / "model"
    res = train(TrainJob(kind="student", train=tiny_train(steps=6), model=SMALL_MODEL,
                         data=datasets["sessions"], loader=LOADER, out=out, transform=fp8))
    assert seen == [["top.2", "head"]] and res.fp8 == ["top.2", "head"]
    assert read_card(out).info["fp8"] == ["top.2", "head"]
    assert len(calls) >= 2 * 6  # both FP8 layers ran in every training step
    assert res.steps == 6 and math.isfinite(res.eval["ne"]) and res.eval["ne"] < 2
    model, _ = load_model(out)  # the saved weights load into the plain model
    assert not any(isinstance(m, Fp8Linear) for m in model.modules())


def test_a_plan_that_slows_the_whole_step_is_dropped(student, datasets, monkeypatch):
    from lrm.config import FP8Config
    from lrm.fp8 import report as R
    from tests.fp8.conftest import a_batch

    batch = a_batch(datasets["sessions"], student)
    plan, _ = D.plan_for(_report({"top.2": (32, 16)}), "student")
    for base_ms, fp8_ms, keep in ((1.0, 2.0, False), (2.0, 1.0, True), (1.0, 1.0, True)):
        times = iter([base_ms, fp8_ms])
        monkeypatch.setattr(R, "step_ms", lambda *a, **k: next(times))
        check = R.model_check(student, [batch], plan, FP8Config(), torch.device("cpu"), False,
                              "scaled_mm")
        assert check["keep"] is keep and check["speedup"] == base_ms / fp8_ms
    assert R.model_check(student, [batch], {}, FP8Config(), torch.device("cpu"), False,
                         "scaled_mm")["keep"] is False
    assert not isinstance(student.top[2], Fp8Linear)  # timed on a copy

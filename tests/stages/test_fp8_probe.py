"""Stage `fp8_probe`: the report and table of saved models; CPU says slow; bad input exit 2."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from flows.cli import app as lrm_app
from lrm.config import FP8Config, ParamsConfig
from lrm.fp8.dispatch import read_report
from lrm.models.precision import cpu_bf16
from stages import fp8_probe as stage
from stagekit import execute
from stagekit.cli import app

FAST = FP8Config(min_batches=2, max_batches=3, speed_reps=1, rows=256)


@pytest.fixture(scope="module")
def model_dir(student_dir):  # noqa: F811
    return student_dir


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_stage_writes_the_report_and_the_table(datasets, model_dir, tmp_path):  # noqa: F811
    out, table = tmp_path / "r/fp8.json", tmp_path / "r/fp8.md"
    params = ParamsConfig(fp8=FAST)
    params.train.device, params.train.batch_size = "cpu", 256
    m = execute(stage.STAGE, {"models": [str(model_dir)], "data": datasets["sessions"],
                              "out": out, "table": table, "metrics": tmp_path / "m.json"},
                params).metrics()
    doc = read_report(out)  # what train.fp8 reads
    probed = doc["models"]["student"]  # a bare DIR is named by its kind
    assert probed["kind"] == "student" and probed["batches"] in (2, 3)
    layers = probed["layers"]
    assert {"bottom.0", "top.0", "head", "interaction.dot_rest"} <= set(layers)
    e = layers["top.0"]
    for fmt in ("bf16", "e4m3_tensor", "e4m3_row", "mxfp8", "mxfp4", "e5m2_dgrad"):
        assert e["error"][fmt]["row_sqnr_db"]["n"] == probed["batches"]
    # timed against what training runs here: bf16 autocast on a CPU with native bf16
    want = "bf16" if params.train.amp and cpu_bf16() else "float32"
    assert e["speed"]["base_ms"] > 0 and e["speed"]["precision"] == want
    assert layers["interaction.dot_rest"]["speed"] is None and not layers[
        "interaction.dot_rest"]["fast"]  # no FP8 batched-matmul kernel to dispatch to
    for e in layers.values():  # the verdicts follow the measurements (timings: not asserted)
        if e["speed"] is not None:
            assert e["fast"] == (e["speed"]["speedup"] >= FAST.min_speedup)
        assert e["fp8"] == (e["safe"] and e["fast"])
    planned = {n for n, e in layers.items() if e["fp8"]}
    assert set(probed["plan"]) == (planned if probed["model_check"]["keep"] else set())
    assert m["student"]["safe"] >= 1 and doc["device"].startswith("CPU")
    text = table.read_text()
    assert "| top.0 | linear | 256 x " in text and "plan: " in text
    assert json.loads((tmp_path / "m.json").read_text())["student"]["layers"] == len(layers)


def test_lrm_has_the_hyphenated_command():
    r = CliRunner().invoke(lrm_app, ["fp8-probe", "--help"])
    assert r.exit_code == 0 and "--model" in r.output and "--fp8.min_sqnr_db" in r.output


def test_a_folder_that_is_no_model_is_exit_2(datasets, tmp_path):  # noqa: F811
    (tmp_path / "empty").mkdir()
    r = CliRunner().invoke(app(stage.STAGE), [
        "--model", str(tmp_path / "empty"), "--data", str(datasets["sessions"]),
        "--out", str(tmp_path / "r.json"), "--table", str(tmp_path / "r.md"),
        "--metrics", str(tmp_path / "m.json")])
    assert r.exit_code == 2 and "not a model folder" in r.output + r.stderr
    assert not (tmp_path / "r.json").exists()


def test_two_models_of_one_name_are_refused_before_any_probe(datasets, model_dir,  # noqa: F811
                                                             tmp_path, monkeypatch):
    """The ops probe: `--model a=M --model a=N` probed both (minutes each on a real model),
    then refused the name. Red with the names checked after probing."""
    from lrm.fp8 import report

    probed = []
    monkeypatch.setattr(report, "probe_saved",
                        lambda path, *a, **k: probed.append(path) or {"kind": "student"})
    for given in (["a=" + str(model_dir), "a=" + str(model_dir)],
                  [str(model_dir), str(model_dir)]):  # both named by their kind, student
        r = CliRunner().invoke(app(stage.STAGE), [
            *[w for m in given for w in ("--model", m)], "--data", str(datasets["sessions"]),
            "--out", str(tmp_path / "r.json"), "--table", str(tmp_path / "r.md"),
            "--metrics", str(tmp_path / "m.json")])
        assert r.exit_code == 2 and "--model: two models named" in r.output + r.stderr
    assert probed == [] and not (tmp_path / "r.json").exists()


def test_train_fp8_hands_the_training_loop_a_dispatch_transform(tmp_path, monkeypatch):
    import lrm.train
    from lrm.config import (CheckpointConfig, LoaderConfig, SplitConfig, StudentModelConfig,
                            TableConfig, TrainConfig)
    from lrm.fp8.dispatch import FORMAT
    from stages import train as train_stage

    report = tmp_path / "r.json"
    report.write_text(json.dumps({"format": FORMAT, "models": {"s": {
        "kind": "student", "plan": ["head"], "layers": {"head": {"shape": {"k": 64, "n": 1}}}}},
        "settings": {"recipe": "tensorwise", "backend": "scaled_mm", "compile": False}}))
    seen = {}

    class Stop(Exception):
        pass

    def fake_train(job, **kw):
        seen["transform"] = job.transform
        raise Stop

    monkeypatch.setattr(lrm.train, "train", fake_train)
    for fp8, has in (("", False), (str(report), True)):
        with pytest.raises(Stop):
            train_stage.run(kind="student", train=TrainConfig(fp8=fp8), split=SplitConfig(),
                            checkpoint=CheckpointConfig(), loader=LoaderConfig(),
                            tables=TableConfig(), model=StudentModelConfig(),
                            data=tmp_path, out=None)
        assert (seen["transform"] is not None) is has
    import torch

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = torch.nn.Linear(64, 1)

    from lrm.fp8.linear import Fp8Linear
    assert isinstance(seen["transform"](M())[0].head, Fp8Linear)


@pytest.mark.parametrize("name", ["teacher", "student"])
def test_the_exfm_stages_hand_their_jobs_the_fp8_transform(name, datasets, tmp_path,
                                                           monkeypatch):
    """`train.fp8` reaches the FM's and the students' jobs as well (lrm.train knows no FP8:
    each caller hands the transform). Plant: drop `transform=` in stages/NAME.py."""
    import dataclasses

    import lrm.train
    from lrm.fp8.dispatch import FORMAT
    from stages import student, teacher

    report = tmp_path / "r.json"
    report.write_text(json.dumps({"format": FORMAT, "models": {}, "settings": {}}))
    p = ParamsConfig()
    p = dataclasses.replace(p, train=dataclasses.replace(p.train, fp8=str(report)))
    seen = {}

    class Stop(Exception):
        pass

    def fake_build_job(kind, **kw):
        seen[kind] = kw.get("transform")
        raise Stop

    monkeypatch.setattr(lrm.train, "build_job", fake_build_job)
    common = dict(checkpoint=p.checkpoint, loader=p.loader,
                  tables=p.model.tables, data=datasets["sessions"], out=tmp_path / "out",
                  checkpoints=tmp_path / "ck")
    with pytest.raises(Stop):
        if name == "teacher":
            teacher.run(cfg=p.teacher, train=p.train_for("teacher"), exfm=p.exfm,
                        model=p.model.teacher,
                        margin=p.registry.margin, tracking_cfg=p.tracking, **common)
        else:
            student.run(cfg=p.students, train=p.train_for("students"),
                        serving="labels_only", pick=p.registry.pick,
                        day=0, **common)
    assert callable(seen[name if name == "teacher" else "student"])


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("cfg, batches, stopped, says", [
    # a CPU has no fast FP8 GEMM: the error on slow_device_batches only, and the table says so
    (FP8Config(min_batches=2, max_batches=8, slow_device_batches=2, speed_reps=1, rows=256),
     2, "slow_device", "this device has no fast FP8 GEMM: the error is measured on "
                       "fp8.slow_device_batches = 2 batches only"),
    # the time budget: the first batch past it is the last
    (FP8Config(min_batches=4, max_batches=8, slow_device_batches=8, budget_s=1e-3,
               speed_reps=1, rows=256),
     1, "budget", "the time budget fp8.budget_s = 0.001 s ran out"),
])
def test_the_probe_is_bounded_on_a_cpu_and_by_its_time_budget(datasets, model_dir, cfg,  # noqa: F811
                                                              batches, stopped, says):
    from lrm.fp8 import report as R

    res = R.probe_saved(model_dir, datasets["sessions"], cfg, device="cpu", batch_size=256)
    assert (res["batches"], res["stopped"]) == (batches, stopped)
    linears = [e for e in res["layers"].values() if e["op"] == "linear"]
    if stopped == "slow_device":  # nothing to time either: the emulated GEMM took minutes
        assert linears and all(e["speed"] is None and not e["fast"]
                               and "no fast FP8 GEMM" in e["why"]["fast"] for e in linears)
    doc = R.build({"student": res}, cfg, "cpu", amp=False)
    assert doc["settings"]["fast_fp8"] is False
    assert says in R.markdown(doc)
    # a CPU without oneDNN's FP8 matmul (no AVX512-FP16): the FP8 layers were emulated, and
    # the table says their speed is not FP8's
    no_gemm = {**doc, "settings": {**doc["settings"], "fp8_gemm": "float32 emulation"}}
    assert "this device has no FP8 GEMM" in R.markdown(no_gemm)
    assert ("this device has no FP8 GEMM" in R.markdown(doc)) == (
        doc["settings"]["fp8_gemm"] != "native")

"""Stage `train` through its command line: torchrun with 2 processes (rank 0 alone logs to
MLflow, with the model as a pyfunc), and bad input -> exit status 2 with one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import mlflow
import pytest
import yaml

from lrm.checkpoint.dcp import Checkpointer
from lrm.serving.pyfunc import OUTPUT, example_frame
from tests.conftest import REPO
from tests.train.conftest import datasets, poison_day  # noqa: F401  (session fixture)

pytestmark = pytest.mark.slow

PARAMS = {
    "train": {"batch_size": 512, "steps": 12, "log_every": 3, "checkpoint_every": 6,
              "lr": 0.01, "threads": 1},
    "model": {"student": {"embedding_dim": 8, "bottom_mlp": [16], "top_mlp": [32, 16]}},
    "loader": {"prefetch": 2, "num_workers": 1},
}


def _env(tmp_path, db="mlflow"):
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
            "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/{db}.db",
            "MLFLOW_EXPERIMENT_NAME": "test-train"}


def _params(tmp_path, **overrides):
    p = json.loads(json.dumps(PARAMS))
    for sec, vals in overrides.items():
        p.setdefault(sec, {}).update(vals)
    path = tmp_path / f"params-{len(list(tmp_path.glob('params-*')))}.yaml"
    path.write_text(yaml.safe_dump(p))
    return path


def test_torchrun_stage_trains_checkpoints_and_logs_once(datasets, tmp_path):  # noqa: F811
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "stages.train", "--model", "student", "--data", str(datasets["sessions"]),
           "--out", "models/student", "--checkpoints", "ck/student",
           "--params", str(_params(tmp_path)), "--metrics", "metrics/train.json"]
    r = subprocess.run(cmd, cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]

    m = json.loads((tmp_path / "metrics/train.json").read_text())
    assert m["steps"] == 12 and m["world_size"] == 2 and m["train_days"] == [0, 1]
    assert {"ne", "auc", "calibration", "rows"} <= m["eval"].keys()
    assert {p.name for p in (tmp_path / "models/student").iterdir()} == {
        "model.json", "state_dict.pt"}
    assert Checkpointer(tmp_path / "ck/student").complete() == [6, 12]

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["test-train"], output_format="list")
    assert len(runs) == 1  # rank 1 logged nothing
    run = runs[0]
    assert run.info.run_name == "train_student"
    assert run.data.params["batch_size"] == "512" and run.data.params["kind"] == "student"
    client = mlflow.MlflowClient()
    assert [x.step for x in client.get_metric_history(run.info.run_id, "loss")] == [3, 6, 9, 12]
    assert "eval_ne" in run.data.metrics and "samples_per_s" in run.data.metrics

    model = mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/model")
    assert [c.name for c in model.metadata.get_output_schema().inputs] == [OUTPUT]
    frame = example_frame(datasets["sessions"], day=2, rows=20)
    pred = model.predict(frame)
    assert len(pred) == 20 and pred[OUTPUT].between(0, 1).all()


def test_bad_input_exits_2_with_one_line(datasets, tmp_path):  # noqa: F811
    poisoned = poison_day(datasets["sessions"], tmp_path / "poisoned", day=1)
    base = ["--model", "student", "--data", str(datasets["sessions"]), "--out", "m",
            "--metrics", "metrics.json"]

    def args(**kw):
        a = dict(zip(base[::2], base[1::2], strict=True))
        a.update({f"--{k.replace('_', '-')}": str(v) for k, v in kw.items()})
        return [x for kv in a.items() for x in kv]

    cases = {
        "kind": (args(model="bogus"), "is not one of"),
        "data": (args(data=tmp_path / "nope"), "does not exist"),
        "param": (args(params=_params(tmp_path, train={"batch_size": 0})),
                  "train.batch_size: must be >= 1"),
        "days": (args(days="0,x"), "--days"),
        "nan": (args(data=poisoned, checkpoints="ck-nan", checkpoint_every=2,
                     params=_params(tmp_path, train={"steps": 40})), "not finite"),
    }
    procs = {name: subprocess.Popen(
        [sys.executable, "-m", "stages.train", *a,
         *([] if "--params" in a else ["--params", str(_params(tmp_path))])],
        cwd=tmp_path, env=_env(tmp_path, name), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
        for name, (a, _) in cases.items()}  # side by side, each with its own MLflow store
    for name, p in procs.items():
        out, err = p.communicate(timeout=300)
        assert p.returncode == 2, (name, err[-3000:])
        errors = [line for line in err.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and cases[name][1] in errors[0], (name, err[-3000:])
    assert not (tmp_path / "m").exists() and not (tmp_path / "metrics.json").exists()
    assert Checkpointer(tmp_path / "ck-nan").complete()


def test_cli_pins_an_option_per_train_key_and_the_model_kinds():
    import dataclasses
    import inspect

    from lrm.config import TrainConfig
    from lrm.models import KINDS
    from stages import train as stage

    options = set(inspect.signature(stage.command).parameters)
    assert {f.name for f in dataclasses.fields(TrainConfig)} <= options
    assert {"model", "data", "out", "checkpoints", "resume", "dedup", "params",
            "metrics"} <= options
    assert stage.KINDS == KINDS  # kept apart so option parsing does not import torch

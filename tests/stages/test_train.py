"""Stage `train` through its command line: 2 processes (lrm.launch) (rank 0 alone logs to
MLflow, with the model as a pyfunc), and bad input -> exit status 2 with one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import mlflow
import pytest
import yaml

from lrm.checkpoint import Store
from lrm.data.loader import BatchLoader
from lrm.serving.pyfunc import OUTPUT, example_frame
from tests.conftest import REPO, new_store, only_days, poison_day

pytestmark = pytest.mark.slow

PARAMS = {
    "train": {"batch_size": 512, "steps": 12, "log_every": 3, "lr": 0.01, "threads": 1},
    "checkpoint": {"every": 6},
    "model": {"student": {"embedding_dim": 8, "bottom_mlp": [16], "top_mlp": [32, 16]}},
    "loader": {"prefetch": 2, "num_workers": 1},
}


def _env(tmp_path, db="mlflow"):
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
            "MLFLOW_TRACKING_URI": new_store(tmp_path, f"{db}.db"),
            "MLFLOW_EXPERIMENT_NAME": "test-train"}


def _params(tmp_path, **overrides):
    p = json.loads(json.dumps(PARAMS))
    for sec, vals in overrides.items():
        p.setdefault(sec, {}).update(vals)
    path = tmp_path / f"params-{len(list(tmp_path.glob('params-*')))}.yaml"
    path.write_text(yaml.safe_dump(p))
    return path


def test_two_processes_train_checkpoint_and_log_once(datasets, tmp_path):  # noqa: F811
    cmd = [sys.executable, "-m", "lrm.launch", "--nproc-per-node=2", "-m", "stages.train",
           "--model", "student", "--data", str(datasets["sessions"]),
           "--out", "models/student", "--checkpoints", "ck/student",
           "--params", str(_params(tmp_path)), "--metrics", "metrics/train.json"]
    r = subprocess.run(cmd, cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]

    m = json.loads((tmp_path / "metrics/train.json").read_text())
    assert m["steps"] == 12 and m["world_size"] == 2 and m["train_days"] == [0, 1]
    assert {"ne", "auc", "calibration", "rows"} <= m["eval"].keys()
    assert {p.name for p in (tmp_path / "models/student").iterdir()} == {
        "model.json", "state_dict.pt", ".lrm-output.json"}
    assert [e.step for e in Store(tmp_path / "ck/student").entries()] == [6, 12]

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["test-train"], output_format="list")
    assert len(runs) == 1  # rank 1 logged nothing
    run = runs[0]
    assert run.info.run_name == "train_student"
    assert run.data.params["train.batch_size"] == "512" and run.data.params["kind"] == "student"
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

    def args(name, **kw):
        a = {"--model": "student", "--data": str(datasets["sessions"]), "--out": f"m-{name}",
             "--metrics": f"metrics-{name}.json"}
        a.update({f"--{k.replace('_', '-')}": str(v) for k, v in kw.items()})
        return [x for kv in a.items() for x in kv]

    cases = {
        "kind": (args("kind", model="bogus"), "is not one of"),
        "data": (args("data", data=tmp_path / "nope"), "does not exist"),
        "param": (args("param", params=_params(tmp_path, train={"batch_size": 0})),
                  "train.batch_size: must be >= 1"),
        "days": (args("days", days="0,x"), "split.days"),
        # a teacher.train key the config refuses names its section
        "teacher_key": (args("teacher_key", model="teacher", params=_params(
            tmp_path, teacher={"train": {"ema_decay": 1.5}})),
            "teacher.train.ema_decay: must be in [0, 1)"),
        "nan": (args("nan", data=poisoned, checkpoints="ck-nan", checkpoint_every=2,
                     params=_params(tmp_path, train={"steps": 40})), "not finite"),
        "one_day": (args("one_day", data=only_days(datasets["sessions"], tmp_path / "one",
                                                   [0]), checkpoints="ck-one"),
                    "--eval-data DIR"),
        # found after the checkpoint folder (nested, as the default checkpoints/student) is
        # claimed: the folder and its parent go again
        "damaged": (args("damaged", data=_truncated(datasets["sessions"], tmp_path / "dmg"),
                         checkpoints="ck-dmg/student"), "truncated, corrupt or not Parquet"),
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
        assert "Traceback" not in err, (name, err[-3000:])
        assert not (tmp_path / f"m-{name}").exists()
        assert not (tmp_path / f"metrics-{name}.json").exists()
    assert Store(tmp_path / "ck-nan").entries()
    assert not (tmp_path / "ck-dmg").exists()  # nor the claimed folder's parent


def _truncated(src, dst):  # noqa: ANN001, ANN202
    """A copy of dataset `src` with its last file cut in half."""
    shutil.copytree(src, dst)
    f = sorted(dst.rglob("*.parquet"))[-1]
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return dst


def test_two_runs_on_one_checkpoint_folder_the_second_fails_at_once(datasets, tmp_path):  # noqa: F811
    """The first run holds the lock on its outputs and checkpoints for its whole length."""
    from lrm.lock import exclusive

    with exclusive(tmp_path / "ck", purpose="lrm train student (the first run)"):
        r = subprocess.run(
            [sys.executable, "-m", "stages.train", "--model", "student", "--data",
             str(datasets["sessions"]), "--out", "m2", "--checkpoints", "ck",
             "--params", str(_params(tmp_path))],
            cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "ck is in use by pid" in last
    assert str(os.getpid()) in last and "the first run" in last
    assert not (tmp_path / "m2").exists()


def test_eval_data_holds_out_another_dataset(datasets, tmp_path):  # noqa: F811
    """--eval-data: a test file ingested on its own is the held-out day; every day of
    --data trains."""
    train_days = only_days(datasets["sessions"], tmp_path / "train", [0, 1])
    test = only_days(datasets["sessions"], tmp_path / "test", [2])
    p = subprocess.run(
        [sys.executable, "-m", "stages.train", "--model", "student", "--data", str(train_days),
         "--eval-data", str(test), "--out", "m", "--metrics", "metrics.json",
         "--params", str(_params(tmp_path, train={"steps": 4}))],
        cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["train_days"] == [0, 1] and m["eval_day"] == 2, m
    assert m["eval"]["rows"] == BatchLoader(test, 1024, days=[2]).num_rows()  # every one


@pytest.mark.parametrize("kind", ["teacher", "student"])
def test_the_teacher_trains_with_its_own_keys_and_the_student_with_train(kind, monkeypatch,
                                                                         tmp_path):
    """`lrm train --model teacher` trains as the FM does (teacher.train over train: Wukong's
    learning rate); the student takes `train` as it is. Through the configs the stage runner
    hands `run` (the CLI's, DVC's and the flows'). Plant: `trains` off the stage."""
    import lrm.train
    from lrm.config import ParamsConfig
    from stages import train as train_stage

    class Stop(Exception):
        pass

    seen = {}

    def fake_build_job(kind, *, train, **kw):
        seen["train"] = train
        raise Stop

    monkeypatch.setattr(lrm.train, "build_job", fake_build_job)
    p = ParamsConfig()
    assert p.teacher.train.lr is not None and p.teacher.train.lr != p.train.lr
    with pytest.raises(Stop):
        train_stage.run(kind=kind, data=tmp_path,
                        **train_stage.STAGE.configs(p, {"kind": kind}))
    assert seen["train"].lr == (p.teacher.train.lr if kind == "teacher" else p.train.lr)
    assert seen["train"].seed == p.train.seed  # every other key from train

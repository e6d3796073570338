"""ExFM's stages through their command lines: teacher -> augment -> student on tiny data
(4 days, T = 1: students stream over days 1 and 2), the registry, idempotent augment, the
table and the plot; and bad input -> exit status 2 with one line."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import mlflow
import pytest
import yaml

from lrm.config import DedupConfig, GenerateConfig
from lrm.data import dedup, synthetic
from tests.conftest import REPO

pytestmark = pytest.mark.slow

WORLD = GenerateConfig(users=2000, ads=300, advertisers=40, categories=8, days=4,
                       sessions_per_day=1200, mean_session_length=6.0, max_history=20,
                       drift=0.3, seed=5)
SMALL_TRAIN = {"batch_size": 512, "lr": 0.01, "log_every": 5, "threads": 1}
PARAMS = {
    "exfm": {"teacher_days": 1},
    "model": {"tables": {"max_rows": 5000},
              "teacher": {"embedding_dim": 8, "dense_embeddings": 1, "dense_mlp": [8],
                          "layers": 1, "fm_embeddings": 4, "lcb_embeddings": 4, "fm_rank": 4,
                          "fm_mlp": [16], "top_mlp": [16]}},
    "teacher": {"train": SMALL_TRAIN},
    "augment": {"batch_size": 1000},
    "students": {
        "train": SMALL_TRAIN,
        "models": {"a": {"embedding_dim": 4, "bottom_mlp": [8], "top_mlp": [16, 8]},
                   "b": {"embedding_dim": 4, "bottom_mlp": [8], "top_mlp": [8]}},
        "variants": {"labels_only": {"distill": False},
                     "distill_serving": {"aux_head": False, "adapter": False},
                     "aux_head": {"adapter": False},
                     "aux_adapter": {}},
    },
    "loader": {"prefetch": 1, "num_workers": 1},
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("exfm-world")
    synthetic.generate(WORLD, root / "raw")
    dedup.dedup_dataset(root / "raw", root / "sessions", DedupConfig())
    return root / "sessions"


def _env(tmp_path):
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
            "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
            "MLFLOW_EXPERIMENT_NAME": "test-exfm"}


def _stage(tmp_path, name, *args, params=PARAMS):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return subprocess.run([sys.executable, "-m", f"stages.{name}", *args, "--params", str(path)],
                          cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True,
                          timeout=300)


def _ok(r):
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]


def test_teacher_augment_student_chain(world, tmp_path):
    r = _stage(tmp_path, "teacher", "--data", str(world))
    _ok(r)
    assert "Successfully loaded" not in r.stdout + r.stderr  # fbgemm's import chatter is quiet
    t = json.loads((tmp_path / "metrics/teacher.json").read_text())
    assert t["train_days"] == [0] and t["eval_day"] == 1
    reg = t["registry"]  # the first version: no champion to beat, it becomes champion
    assert (reg["name"], reg["version"], reg["promoted"]) == ("lrm-teacher", "1", True)
    assert reg["champion"] is None and reg["challenger"]["ne"] == pytest.approx(t["eval"]["ne"])
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    client = mlflow.MlflowClient()
    mv = client.get_model_version_by_alias("lrm-teacher", "champion")
    assert str(mv.version) == "1" and mv.tags["lrm.content_hash"] == t["content_hash"]

    _ok(_stage(tmp_path, "augment", "--data", str(world)))
    a = json.loads((tmp_path / "metrics/augment.json").read_text())
    assert a["days"] == [1, 2, 3] and a["written"] == [1, 2, 3]
    assert a["teacher_version"] == {"hash": t["content_hash"], "registry": "lrm-teacher/1"}
    _ok(_stage(tmp_path, "augment", "--data", str(world)))  # idempotent
    again = json.loads((tmp_path / "metrics/augment.json").read_text())
    assert again["written"] == [] and again["skipped"] == [1, 2, 3]

    r = _stage(tmp_path, "student")
    _ok(r)  # every progress line says which student, variant and day it belongs to
    assert "[student a labels_only day 1: train student]" in r.stderr, r.stderr[-3000:]
    rep = json.loads((tmp_path / "metrics/exfm.json").read_text())
    assert rep["eval_day"] == 3 and rep["days"] == {"train": [1, 2], "eval": [2, 3]}
    assert [r["model"] for r in rep["table"]] == [
        "teacher (stale: trained to day 1)",
        "student a, labels only", "student a, distillation on the serving head",
        "student a, auxiliary head", "student a, auxiliary head + adapter",
        "student b, labels only", "student b, distillation on the serving head",
        "student b, auxiliary head", "student b, auxiliary head + adapter"]
    assert all(0 < r["ne"] < 2 and 0 < r["auc"] < 1 for r in rep["table"])
    assert rep["teacher"]["ne"] == a["teacher"]["3"]["ne"]
    assert set(rep["gain_vs_labels_only"]["a"]) == {"distill_serving", "aux_head", "aux_adapter"}
    with open(tmp_path / "plots/exfm_ne.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["day"] for r in rows] == ["2", "3"]
    assert {"teacher", "a/labels_only", "b/aux_adapter"} <= set(rows[0])
    assert (tmp_path / "metrics/exfm.md").read_text().startswith("| model | NE | AUC |")
    for s in ("a", "b"):
        for v in ("labels_only", "aux_adapter"):
            card = json.loads((tmp_path / f"models/students/{s}/{v}/model.json").read_text())
            assert card["info"]["train_days"] == [2]  # the last day, carried on from day 1
            assert card["info"]["start"] == "warm"  # from the day before's model
    full = json.loads((tmp_path / "models/students/a/aux_adapter/model.json").read_text())
    assert full["model"]["student"]["aux_head"] and full["model"]["student"]["adapter"]


def test_bad_input_exits_2_with_one_line(world, tmp_path):
    r = _stage(tmp_path, "augment", "--data", str(world), "--teacher", "nope")
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "not a model folder" in r.stderr
    bad = json.loads(json.dumps(PARAMS))
    bad["students"]["variants"] = {"x": {"weight": -1}}
    r = _stage(tmp_path, "student", "--data", str(world), params=bad)
    assert r.returncode == 2 and "students.variants.x.weight" in r.stderr
    bad = json.loads(json.dumps(PARAMS))
    bad["exfm"]["teacher_days"] = 9
    r = _stage(tmp_path, "student", "--data", str(world), params=bad)
    assert r.returncode == 2 and "no day to train on" in r.stderr

"""ExFM's stages through their command lines, on tiny data with two verticals (5 days): the
foundation model's versions (T = 1, a new one every 2 days, lagging 2), augment by the version
that served each day, the vertical models day by day in every variant (labels only before
the teacher serves, then each variant going on from that model), the table, the serving pick
and its registration; and bad input -> exit status 2 with one line."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys

import mlflow
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml

from lrm.config import DedupConfig, GenerateConfig, VerticalConfig
from lrm.data import dedup, synthetic
from lrm.exfm.augment import TEACHER_COLUMN
from lrm.models.saved import model_hash
from tests.conftest import REPO, new_store

pytestmark = pytest.mark.slow

WORLD = GenerateConfig(users=2000, ads=300, advertisers=40, categories=8, days=5,
                       sessions_per_day=1200, mean_session_length=6.0, max_history=20,
                       drift=0.3, seed=5,
                       verticals=[VerticalConfig(name="north", share=0.6),
                                  VerticalConfig(name="south", share=0.4, base_ctr=0.05,
                                                 position=2.0, own=0.5)])
# a few steps a run (train.fit_steps off, min_steps 4; by default each run took about 50,
# train.min_steps): what is checked is how versions, days and variants chain, not what they
# learn
SMALL_TRAIN = {"batch_size": 512, "lr": 0.01, "log_every": 5, "threads": 1, "fit_steps": 0,
               "min_steps": 4}
PARAMS = {
    "exfm": {"teacher_days": 1, "teacher_every": 2, "teacher_lag": 2},
    "model": {"tables": {"max_rows": 5000},
              "teacher": {"embedding_dim": 8, "dense_embeddings": 1, "dense_mlp": [8],
                          "layers": 1, "fm_embeddings": 4, "lcb_embeddings": 4, "fm_rank": 4,
                          "fm_mlp": [16], "top_mlp": [16]}},
    "teacher": {"train": SMALL_TRAIN},
    "augment": {"batch_size": 1000},
    "students": {
        "train": SMALL_TRAIN,
        "models": {"a": {"embedding_dim": 4, "bottom_mlp": [8], "top_mlp": [16, 8]}},
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
            "MLFLOW_TRACKING_URI": new_store(tmp_path),
            "MLFLOW_EXPERIMENT_NAME": "test-exfm"}


def _stage(tmp_path, name, *args, params=PARAMS):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return subprocess.run([sys.executable, "-m", f"stages.{name}", *args, "--params", str(path)],
                          cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True,
                          timeout=300)


def _ok(r):
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]


def test_teacher_augment_student_register_chain(world, tmp_path):
    r = _stage(tmp_path, "teacher", "--data", str(world))
    _ok(r)
    assert "Successfully loaded" not in r.stdout + r.stderr  # fbgemm's import chatter is quiet
    t = json.loads((tmp_path / "metrics/teacher.json").read_text())
    # versions 1 (days [0, 1)) and 3 (it goes on with days 1-2); 3 logs day 4 = 3 + lag - 1
    assert (t["cuts"], t["lag"], t["first_served"]) == ([1, 3], 2, 2)
    assert t["versions"]["1"]["train_days"] == [0] and t["versions"]["1"]["eval_day"] == 1
    assert t["versions"]["3"]["train_days"] == [1, 2] and t["versions"]["3"]["eval_day"] == 3
    fm = tmp_path / "models" / "teacher"
    assert json.loads((fm / "versions.json").read_text()) == {"cuts": [1, 3], "lag": 2}
    v3 = json.loads((fm / "until=3" / "model.json").read_text())["info"]
    assert v3["start"] == "warm" and v3["init_from"].endswith("day=1/model")  # from version 1
    reg = t["registry"]  # each version registered; the first has no champion to beat
    assert (reg["1"]["name"], reg["1"]["version"], reg["1"]["promoted"]) == \
        ("lrm-teacher", "1", True)
    assert reg["3"]["version"] == "2" and reg["3"]["champion_version"] == "1"
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    client = mlflow.MlflowClient()
    assert client.get_model_version("lrm-teacher", "1").tags["lrm.content_hash"] == \
        model_hash(fm / "until=1")

    _ok(_stage(tmp_path, "augment", "--data", str(world)))
    a = json.loads((tmp_path / "metrics/augment.json").read_text())
    assert a["days"] == [2, 3, 4] and a["written"] == [2, 3, 4]  # the days a version serves
    by_day = {d: v["hash"] for d, v in a["teacher_version"].items()}
    assert by_day == {"2": model_hash(fm / "until=1"), "3": model_hash(fm / "until=1"),
                      "4": model_hash(fm / "until=3")}  # lagging: day 3 not yet by version 3
    assert a["teacher_version"]["4"]["registry"] == "lrm-teacher/2"
    assert set(a["teacher_by_vertical"]["4"]) == {"north", "south"}
    # a day an earlier schedule augmented (lrm's, with its manifest) that this FM does not
    # serve: the students would take it for this FM's first day
    shutil.copytree(tmp_path / "data/augmented/day=2", tmp_path / "data/augmented/day=1")
    _ok(_stage(tmp_path, "augment", "--data", str(world)))  # idempotent
    again = json.loads((tmp_path / "metrics/augment.json").read_text())
    assert again["written"] == [] and again["skipped"] == [2, 3, 4]
    assert again["removed"] == [1] and not (tmp_path / "data/augmented/day=1").exists()

    r = _stage(tmp_path, "student", "--data", "data/augmented", "--sessions", str(world))
    _ok(r)  # every progress line says which student, variant and day it belongs to
    assert "[student north-a day 0: train student]" in r.stderr, r.stderr[-3000:]
    assert "[student south-a aux_head day 3: train student]" in r.stderr
    rep = json.loads((tmp_path / "metrics/exfm.json").read_text())
    assert (rep["eval_day"], rep["validation_days"]) == (4, [3])
    assert rep["days"] == {"train": [0, 1, 2, 3], "eval": [1, 2, 3, 4], "first_served": 2}
    assert set(rep["verticals"]) == {"north", "south"}
    assert rep["fm_served"].endswith("models/teacher/until=3")  # the version that logs day 4
    for name in ("north", "south"):
        v = rep["verticals"][name]
        assert v["teacher"]["ne"] == a["teacher_by_vertical"]["4"][name]["ne"]
        s = v["students"]["a"]
        assert set(s["variants"]) == {"labels_only", "distill_serving", "aux_head",
                                      "aux_adapter", "fm"}
        assert s["variants"]["fm"]["ne"] == v["teacher"]["ne"]
        assert all(0 < m["ne"] < 2 for m in s["variants"].values())
        # the pick: on the validation day's rows, every variant and the FM against the
        # prior (the first variant that distils), which serves unless beaten beyond the noise;
        # then the FM against that choice, which serves unless the choice beats it beyond the
        # noise (registry.pick.fm_ties: a tie goes to the FM)
        pick = s["pick"]
        assert pick["prior"] == "distill_serving" and pick["days"] == [3]
        assert set(pick["ne"]) == set(s["variants"]) and pick["rows"] > 100
        assert s["serving"] == pick["served"]
        lo, _ = pick["against"]["fm"]
        assert (s["serving"] == "fm") == (not lo > 0), pick  # lo > 0: the VM beats the FM
        if s["serving"] not in ("distill_serving", "fm"):
            lo, hi = pick["against"][s["serving"]]
            assert hi < 0 and pick["ne"][s["serving"]] < pick["ne"]["distill_serving"]
    serving = json.loads((tmp_path / "models/students/serving.json").read_text())
    assert serving == {f"{v}-a": {"variant": rep["verticals"][v]["students"]["a"]["serving"],
                                  "vertical": i} for i, v in enumerate(("north", "south"))}
    with open(tmp_path / "plots/exfm_ne.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["day"] for r in rows] == ["1", "2", "3", "4"]
    assert {"north-a/labels_only", "south-a/aux_adapter"} <= set(rows[0])
    assert (tmp_path / "metrics/exfm.md").read_text().startswith("| vertical | model |")
    chains = tmp_path / "checkpoints" / "students"
    for vm in ("north-a", "south-a"):
        for v in ("labels_only", "aux_adapter"):
            card = json.loads((tmp_path / f"models/students/{vm}/{v}/model.json").read_text())
            assert card["info"]["train_days"] == [3] and card["info"]["start"] == "warm"
        first = json.loads((chains / vm / "aux_adapter" / "day=2" / "model" /
                            "model.json").read_text())["info"]  # the variant's first day
        # the labels-only model of the day before the teacher's first day
        assert tmp_path / first["init_from"] == chains / vm / "_labels" / "day=1" / "model"
        assert first["verticals"] == [0 if vm == "north-a" else 1]
    full = json.loads((tmp_path / "models/students/north-a/aux_adapter/model.json").read_text())
    assert full["model"]["student"]["aux_head"] and full["model"]["student"]["adapter"]

    # run again on other data (a day's teacher logits changed): the days start over, no day
    # resumes the checkpoints of the run before (it would refuse: the data changed). And
    # south gets no VM now (students.verticals names north alone): it serves the FM
    part = next((tmp_path / "data/augmented/day=2").glob("*.parquet"))
    t = pq.read_table(part)
    i = t.schema.get_field_index(TEACHER_COLUMN)
    col = t.column(i).combine_chunks()
    half = pa.ListArray.from_arrays(col.offsets, pc.multiply(col.flatten(), pa.scalar(
                                    0.5, col.type.value_type)),
                                    type=col.type)
    kv = {k: v for k, v in pq.ParquetFile(part).metadata.metadata.items()
          if k != b"ARROW:schema"}  # lrm's own (the item table) kept
    with pq.ParquetWriter(part, t.schema) as w:
        w.add_key_value_metadata(kv)
        w.write_table(t.set_column(i, t.schema.field(i), half))
    north_only = json.loads(json.dumps(PARAMS))
    north_only["students"]["verticals"] = ["north"]
    _ok(_stage(tmp_path, "student", "--data", "data/augmented", "--sessions", str(world),
               params=north_only))
    info = json.loads((chains / "north-a" / "aux_head" / "day=2" / "model" /
                       "model.json").read_text())["info"]
    assert info["start"] == "warm"  # from the labels-only model, not "resume"
    serving = json.loads((tmp_path / "models/students/serving.json").read_text())  # anew
    assert serving["south-a"] == {"variant": "fm", "vertical": 1}
    rep = json.loads((tmp_path / "metrics/exfm.json").read_text())
    assert rep["verticals"]["south"]["students"]["a"]["not_trained"] == \
        "not in students.verticals"

    _ok(_stage(tmp_path, "register"))
    done = json.loads((tmp_path / "metrics/register.json").read_text())["students"]
    for vm, s in serving.items():
        assert done[vm]["name"] == f"lrm-student-{vm}" and done[vm]["variant"] == s["variant"]
        mv = client.get_model_version(f"lrm-student-{vm}", done[vm]["version"])
        assert mv.tags["lrm.variant"] == s["variant"]
        assert json.loads(mv.tags["lrm.verticals"]) == [s["vertical"]]
    # south's model is the FM's own prediction: scored on south's rows of day 4 only, and
    # what a user loads predicts as the FM's version that logged day 4 does
    assert done["south-a"]["challenger"]["rows"] == \
        a["teacher_by_vertical"]["4"]["south"]["rows"]
    assert done["south-a"]["challenger"]["ne"] == pytest.approx(
        a["teacher_by_vertical"]["4"]["south"]["ne"], abs=1e-4)
    frame = _rows_of(world, day=4, vertical=1, n=40)
    from lrm import registry
    from lrm.config import TrackingConfig
    from lrm.models.saved import load_model
    from lrm.serving.pyfunc import predict_frame

    served = registry.load("lrm-student-south-a",
                           cfg=TrackingConfig(uri=f"sqlite:///{tmp_path}/mlflow.db"))
    got = served.predict(frame)["probability"].to_numpy()
    want = predict_frame(*load_model(fm / "until=3"), frame)["probability"].to_numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    vm = predict_frame(*load_model(tmp_path / "models/students/north-a/labels_only"), frame)
    assert not np.allclose(vm["probability"].to_numpy(), want, atol=1e-4)  # not a VM's


def _rows_of(data, day, vertical, n):
    """The first `n` impressions of a vertical's day as a model input frame."""
    import pandas as pd

    from lrm.data import parquet
    from lrm.data.dedup import flatten_sessions
    from lrm.data.schema import day_files, read_schema
    from lrm.serving.pyfunc import input_columns

    schema, _ = read_schema(data)
    t = pa.concat_tables(parquet.read_table(f) for f in day_files(data)[day])
    t = t.filter(pc.equal(t.column("vertical"), vertical))
    t = flatten_sessions(t, schema).slice(0, n).select(input_columns(schema))
    return t.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)


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
    r = _stage(tmp_path, "teacher", "--data", str(world), params=bad)
    assert r.returncode == 2 and "the data's last day is 4" in r.stderr

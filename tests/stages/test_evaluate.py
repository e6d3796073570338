"""Stage `evaluate`: metrics JSON of one model (every row, with confidence intervals, and a
line saying how many rows), named entries merged, bad input -> exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from lrm.config import EvalConfig
from lrm.data.loader import BatchLoader
from lrm.errors import ConfigError
from stages import evaluate as stage
from stagekit.cli import app as stage_app
from tests.conftest import REPO, new_store

KEYS = {"ne", "auc", "calibration", "rows", "day_rows", "ne_ci", "auc_ci", "calibration_ci"}


@pytest.fixture(scope="module")
def model_dir(student_dir):  # noqa: F811
    return student_dir


def _cli(tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": str(REPO),
           "MLFLOW_TRACKING_URI": new_store(tmp_path)}
    return subprocess.Popen([sys.executable, "-m", "stages.evaluate", *map(str, args)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_cli_writes_the_metrics_json(datasets, model_dir, tmp_path):  # noqa: F811
    p = _cli(tmp_path, "--model", model_dir, "--data", datasets["raw"], "--out", "m/eval.json",
             "--day", "-1")
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    m = json.loads((tmp_path / "m/eval.json").read_text())
    assert KEYS <= m.keys() and m["day"] == 2 and m["kind"] == "student"
    assert 0 < m["ne"] < 2 and 0 <= m["auc"] <= 1 and m["rows"] > 0
    rows = BatchLoader(datasets["raw"], 4096, days=[2]).num_rows()
    assert m["rows"] == m["day_rows"] == rows  # every row of the held-out day
    for k in ("ne", "auc", "calibration"):
        assert m[f"{k}_ci"][0] < m[k] < m[f"{k}_ci"][1]
    assert f"scored {rows} rows of day 2 (every row): NE {m['ne']:.4f} [" in out


def test_named_models_merge_into_one_file(datasets, model_dir, tmp_path):  # noqa: F811
    out = tmp_path / "eval.json"
    cfg = EvalConfig(day=1, batch_size=4096)
    stage.run(models=[f"student={model_dir}", f"teacher={model_dir}"],
              data=datasets["sessions"], cfg=cfg, out=out)
    first = json.loads(out.read_text())
    assert set(first) == {"student", "teacher"} and KEYS <= first["student"].keys()
    assert first["student"]["day"] == 1
    stage.run(models=[str(model_dir)], name="challenger", data=datasets["sessions"], cfg=cfg,
              out=out)
    merged = json.loads(out.read_text())
    assert set(merged) == {"student", "teacher", "challenger"}
    assert merged["student"] == first["student"] and merged["challenger"] == first["student"]
    # told otherwise: the first 100 rows, no intervals
    some = stage.run(models=[str(model_dir)], data=datasets["sessions"], out=tmp_path / "s.json",
                     cfg=EvalConfig(day=1, batch_size=64, rows=100, bootstrap=0)).metrics()
    assert some["rows"] == 100 < some["day_rows"] == first["student"]["rows"]
    assert "ne_ci" not in some


def test_bad_input_exits_2(datasets, model_dir, tmp_path):  # noqa: F811
    cases = {
        "no model": (["--model", tmp_path / "nope", "--data", datasets["raw"]], "no model.json"),
        "names": (["--model", model_dir, "--model", model_dir], "name every model"),
        # NAME= was the current folder ("e.json lies inside input ."), =DIR a folder "=DIR"
        "no path": (["--model", "a=", "--data", datasets["raw"]], "'a=': give NAME=PATH, "
                                                                  "both parts (the path"),
        "no name": (["--model", f"={model_dir}", "--data", datasets["raw"]], "the name is "
                                                                             "empty"),
        # an entry "ne" made the file read as one model's metrics (replaced on the next
        # merge; lrm summary: a traceback)
        "metric": (["--model", f"ne={model_dir}", "--data", datasets["raw"]],
                   "'ne' names a metric of the file"),
    }
    procs = {k: _cli(tmp_path / k, *a, "--out", "e.json") for k, (a, _) in cases.items()
             if (tmp_path / k).mkdir() is None}
    for name, p in procs.items():
        _, err = p.communicate(timeout=300)
        assert p.returncode == 2, (name, err[-2000:])
        assert cases[name][1] in err and err.count("error: ") == 1, (name, err[-2000:])
        assert not (tmp_path / name / "e.json").exists()
    with pytest.raises(ConfigError, match="no day 9"):  # the same path, in-process
        stage.run(models=[str(model_dir)], data=datasets["raw"], cfg=EvalConfig(day=9),
                  out=tmp_path / "e.json")


def test_days_are_scored_each_and_pooled_with_intervals(datasets, model_dir, tmp_path):  # noqa: F811
    """Planted bugs that turn this red (each tried): the pooled metrics of the last day
    only; a range that leaves out its last day."""
    import torch

    from lrm import metrics
    from lrm.train.evaluate import _loader, predict
    from lrm.models.saved import load_model

    r = CliRunner().invoke(stage_app(stage.STAGE), [
        "--model-dir", str(model_dir), "--data", str(datasets["sessions"]), "--days", "1..2",
        "--out", str(tmp_path / "e.json")])
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "e.json").read_text())
    assert m["days"] == [1, 2] and set(m["per_day"]) == {"1", "2"}
    model, card = load_model(model_dir)
    xs, ys = [], []
    for d in (1, 2):
        x, y = predict(model, _loader(datasets["sessions"], d, 4096, card), torch.device("cpu"))
        day = m["per_day"][str(d)]
        assert day["rows"] == len(y) and day["ne"] == pytest.approx(
            metrics.normalized_entropy(x, y), rel=1e-6)
        assert day["ne_ci"][0] < day["ne"] < day["ne_ci"][1]
        xs.append(x)
        ys.append(y)
    x, y = torch.cat(xs), torch.cat(ys)
    assert m["rows"] == len(y) and m["ne"] == pytest.approx(metrics.normalized_entropy(x, y),
                                                            rel=1e-6)
    assert m["ne_ci"][0] < m["ne"] < m["ne_ci"][1] and m["auc_ci"][0] < m["auc"]
    lines = r.stdout.strip().splitlines()
    assert [ln.split(" rows of ")[1].split(" (")[0] for ln in lines] == [
        "day 1", "day 2", "days 1, 2 pooled"]
    r = CliRunner().invoke(stage_app(stage.STAGE), [
        "--model-dir", str(model_dir), "--data", str(datasets["sessions"]), "--days", "-2..-1",
        "--out", str(tmp_path / "f.json")])
    assert r.exit_code == 0 and json.loads((tmp_path / "f.json").read_text())["days"] == [1, 2]
    for bad, why in (("2..1", "comes after"), ("7..9", "no days in 7..9"), ("x", "day range"),
                     ("1..9", "1..9 runs outside the data's days 0..2")):
        r = CliRunner().invoke(stage_app(stage.STAGE), [
            "--model-dir", str(model_dir), "--data", str(datasets["sessions"]), "--days", bad,
            "--out", str(tmp_path / "g.json")])
        assert r.exit_code == 2 and why in r.stderr, (bad, r.stderr)


def test_a_range_with_a_day_the_data_lacks_or_a_day_beside_it_exits_2(datasets, model_dir,  # noqa: F811
                                                                      tmp_path):
    """--days 0..2 on data without day 1 names the day (it was skipped: "days 0, 2 pooled");
    --day with --days is one too many. Red with the gap check dropped, or the pair
    accepted (--day was ignored)."""
    from tests.conftest import only_days

    gap = only_days(datasets["sessions"], tmp_path / "gap", [0, 2])
    for args, why in ((["--data", gap, "--days", "0..2"], "the data has no day 1 of 0..2"),
                      (["--data", datasets["sessions"], "--day", "1", "--days", "1..2"],
                       "give one of them")):
        r = CliRunner().invoke(stage_app(stage.STAGE), [
            "--model-dir", str(model_dir), *map(str, args), "--out", str(tmp_path / "e.json")])
        assert r.exit_code == 2 and why in r.stderr, (args, r.stderr)
        assert not (tmp_path / "e.json").exists()


def test_a_model_folder_under_a_hive_path_and_data_of_other_features(datasets, model_dir,  # noqa: F811
                                                                     tmp_path, monkeypatch):
    """A model saved under `day=5/model` (the stream's checkpoints) is a path, not NAME=DIR;
    data of other features than the model's is exit 2 naming both schemas, not a
    traceback. Red with '=' always splitting, or the schema checked after the loader."""
    import shutil

    from lrm.config import LogsConfig
    from lrm.data.logs.ingest import ingest
    from tests.data._logs import clicks_log, write

    hive = tmp_path / "stream" / "day=5" / "model"
    shutil.copytree(model_dir, hive)
    monkeypatch.chdir(tmp_path / "stream")
    for arg in (str(hive), "day=5/model"):  # (relative: a path because it is one)
        r = CliRunner().invoke(stage_app(stage.STAGE), [
            "--model-dir", arg, "--data", str(datasets["sessions"]), "--day", "1",
            "--out", str(tmp_path / "h.json")])
        assert r.exit_code == 0, r.output
    logs = tmp_path / "logs"
    ingest([write(clicks_log(), tmp_path / "log.csv")], logs,
           LogsConfig(label="clicked", user="user", item="item", time="ts"))
    r = CliRunner().invoke(stage_app(stage.STAGE), [
        "--model-dir", str(model_dir), "--data", str(logs), "--day", "0",
        "--out", str(tmp_path / "l.json")])
    assert r.exit_code == 2 and "has schema 'logs' with other features" in r.stderr, r.output

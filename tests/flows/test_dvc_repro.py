"""End to end: `dvc repro` of the default DAG on tiny params, in a fresh clone with nothing
beside it (no ../shared), then a second `dvc repro` that does nothing; the clone stays clean."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

pytestmark = pytest.mark.slow

# What MLflow's UI renders when one of its requests fails: its fetch wrapper retries only a
# 429 or 556 and gives up on anything else, a dropped connection included. CI met it once,
# under load, on the registry page (the page a blocked registry request renders); a reload
# renders the page
MLFLOW_GAVE_UP = "An error occurred while rendering this component"
TINY = {
    "generate": {"users": 2000, "ads": 300, "advertisers": 40, "categories": 8, "days": 4,
                 "sessions_per_day": 150, "mean_session_length": 4.0, "max_history": 20,
                 "verticals": [{"name": "all"}]},
    "dedup": {"rows_per_file": 100},
    "train": {"batch_size": 256, "log_every": 2},
    "checkpoint": {"every": 0},
    # ExFM: one teacher version (day 0) logging days 1-3; students train on days 0-2 (labels
    # only on day 0), the validation day is 2, the table's day 3
    "exfm": {"teacher_days": 1, "teacher_every": 0, "teacher_lag": 1},
    "augment": {"batch_size": 1024},
    "students": {"models": {"small": {"embedding_dim": 4, "bottom_mlp": [8], "top_mlp": [8]}}},
}


def fresh_clone(dst: Path) -> Path:
    """A clone of the current working tree (tracked + unignored files), committed, in `dst`
    (a folder with nothing else in it: no ../shared). Not an untracked dvc.lock: the record
    of a pipeline run in this checkout (`make run` before `make test`), which a clone has
    not."""
    def listed(*which: str) -> list[bytes]:
        return subprocess.run(["git", "ls-files", *which, "--exclude-standard", "-z"], cwd=REPO,
                              check=True, capture_output=True).stdout.split(b"\0")

    files = listed("--cached") + [f for f in listed("--others")
                                  if f.rsplit(b"/", 1)[-1] != b"dvc.lock"]
    repo = dst / "repo"
    for f in filter(None, files):
        src = REPO / f.decode()
        if src.is_file():
            (repo / f.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, repo / f.decode())
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "clone"], cwd=repo, check=True)
    return repo


def tiny_params(repo: Path) -> None:
    params = yaml.safe_load((repo / "params.yaml").read_text())
    for sec, vals in TINY.items():
        params[sec].update(vals)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam",
                    "tiny"], cwd=repo, check=True)


def _png_has_content(path: Path) -> bool:
    import matplotlib.image

    img = matplotlib.image.imread(path)
    return img.shape[0] > 100 and float(img.std()) > 0.01  # not one flat colour


def _env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db"}


@pytest.fixture(scope="module")
def repro(tmp_path_factory):
    """A fresh clone (nothing beside it) on tiny params after one `dvc repro`."""
    tmp = tmp_path_factory.mktemp("repro")
    repo = fresh_clone(tmp)
    assert not (tmp / "shared").exists()
    tiny_params(repo)
    r = subprocess.run([sys.executable, "-m", "dvc", "repro"], cwd=repo, env=_env(tmp),
                       capture_output=True, text=True, timeout=900)
    return {"repo": repo, "tmp": tmp, "env": _env(tmp), "run": r}


def test_dvc_repro_on_a_fresh_clone_then_up_to_date(repro):
    repo, env, r = repro["repo"], repro["env"], repro["run"]
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Successfully loaded" not in r.stdout + r.stderr

    gen = json.loads((repo / "metrics/generate.json").read_text())
    ded = json.loads((repo / "metrics/dedup.json").read_text())
    assert gen["rows"] == ded["rows"] > 0 and ded["sessions"] < ded["rows"]
    ev = json.loads((repo / "metrics/eval.json").read_text())
    for kind in ("student", "teacher"):
        assert ev[kind]["rows"] > 0 and math.isfinite(ev[kind]["ne"]) and ev[kind]["day"] == 3
    exfm = json.loads((repo / "metrics/exfm.json").read_text())
    assert exfm["eval_day"] == 3 and len(exfm["table"]) == 1 + 4  # teacher + 4 variants
    summary = json.loads((repo / "metrics/summary.json").read_text())
    v = exfm["verticals"]["all"]
    served = v["students"]["small"]["serving"]  # each size's variant, chosen by measurement
    assert set(summary) == {"student", "teacher", "exfm_teacher", "exfm_small"}
    assert summary["student"] == {"ne": round(ev["student"]["ne"], 4),
                                  "auc": round(ev["student"]["auc"], 4)}
    assert summary["exfm_small"]["ne"] == round(
        v["students"]["small"]["variants"][served]["ne"], 4)

    # plots read offline: PNGs with content, one point per logged step / per day
    for png in ("train_student.png", "train_teacher.png", "exfm_ne.png"):
        assert _png_has_content(repo / "plots" / png), png
    steps = (repo / "plots/train_student.csv").read_text().splitlines()
    assert steps[0].startswith("step,loss") and len(steps) - 1 >= 2

    # `dvc metrics show` reads at a glance: the headline file only, in a row that fits
    shown = subprocess.run([sys.executable, "-m", "dvc", "metrics", "show", "--json"],
                           cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    files = next(iter(json.loads(shown.stdout).values()))["data"]  # the workspace
    assert list(files) == ["metrics/summary.json"], files
    table = subprocess.run([sys.executable, "-m", "dvc", "metrics", "show"], cwd=repo,
                           env=env, capture_output=True, text=True, timeout=120).stdout
    assert "exfm_small.ne" in table and max(map(len, table.splitlines())) <= 160, table

    _one_parent_run_per_repro(repro["tmp"], ev, summary)

    again = subprocess.run([sys.executable, "-m", "dvc", "repro"], cwd=repo, env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "up to date" in again.stdout, again.stdout
    assert "Running stage" not in again.stdout

    assert len(_parents(repro["tmp"])) == 1  # a repro that ran nothing made no parent run
    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True,
                            text=True, check=True).stdout
    # DVC's record of the run is the one new file (the user commits it); nothing else changed
    assert status == "?? dvc.lock\n", f"the run left files changed:\n{status}"


def _parents(tmp: Path) -> list:
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp}/mlflow.db")
    return mlflow.search_runs(search_all_experiments=True, output_format="list",
                              filter_string="tags.`lrm.dvc_repro` LIKE '%'")


def _one_parent_run_per_repro(tmp: Path, ev: dict, summary: dict) -> None:
    """The stage runs of one `dvc repro` nest under one parent run, which holds the params
    and the headline; a stage's run holds each number once, its constants as tags."""
    import mlflow

    from flows.dag import SYNTHETIC

    (parent,) = _parents(tmp)
    assert parent.info.run_name == "dvc repro dvc.yaml" and parent.info.status == "FINISHED"
    assert parent.data.params["train.batch_size"] == "256"  # the (tiny) params
    for kind in ("student", "teacher"):  # the evaluate stage's headline
        assert parent.data.metrics[f"{kind}.ne"] == pytest.approx(ev[kind]["ne"])
        assert parent.data.metrics[f"{kind}.auc"] == pytest.approx(ev[kind]["auc"])
    for model in ("exfm_teacher", "exfm_small"):  # the summary stage's
        assert parent.data.metrics[f"{model}.ne"] == summary[model]["ne"]
    stages = mlflow.search_runs(search_all_experiments=True, output_format="list",
                                filter_string="tags.`mlflow.parentRunId` = "
                                              f"'{parent.info.run_id}'")
    assert sorted(r.info.run_name for r in stages) == sorted(
        n.title.replace(" ", "_") for n in SYNTHETIC.nodes)
    (train,) = [r for r in stages if r.info.run_name == "train_student"]
    names = set(train.data.metrics)
    assert "eval_ne" in names and "eval.ne" not in names  # once, under one name
    assert not names & {"eval.ci_level", "eval_ci_level", "eval_day", "world_size"}, names
    assert train.data.tags["eval.ci_level"] == "0.95"  # a constant: a tag
    twins = {k for k in names if k.replace(".", "_") in names and "." in k}
    assert not twins, twins



def test_dvc_plots_show_after_the_criteo_pipeline_warns_of_nothing(repro, criteo_dir):
    """`make repro-criteo` on the real sample (a day per file, test.tsv held out) beside the
    default pipeline's run, then `dvc plots show`: every plot of both loads (the top-level
    plots of pipelines/criteo/dvc.yaml resolve against that file's folder) and the page it
    writes (dvc_plots/) leaves the clone clean."""
    repo, env = repro["repo"], repro["env"]
    tsv = repo / "data" / "criteo" / "tsv"
    tsv.mkdir(parents=True)
    for i, name in enumerate(("train.tsv", "dev.tsv", "test.tsv"), 1):
        shutil.copy(criteo_dir / name, tsv / f"day_{i:02d}.tsv")
    r = subprocess.run([sys.executable, "-m", "dvc", "repro", "pipelines/criteo/dvc.yaml"],
                       cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for png in ("train_student.png", "train_teacher.png"):
        assert _png_has_content(repo / "plots" / "criteo" / png), png

    shown = subprocess.run([sys.executable, "-m", "dvc", "plots", "show"], cwd=repo, env=env,
                           capture_output=True, text=True, timeout=300)
    said = shown.stdout + shown.stderr
    assert shown.returncode == 0, said
    assert "WARNING" not in said and "failed to load" not in said.lower(), said
    page = (repo / "dvc_plots" / "index.html").read_text()
    for png in ("criteo/train_student.png", "criteo/train_teacher.png", "exfm_ne.png"):
        assert f"<p>plots/{png}</p>" in page, f"{png} is not on dvc's page"
    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True,
                            text=True, check=True).stdout
    assert status == "?? dvc.lock\n?? pipelines/criteo/dvc.lock\n", f"files changed:\n{status}"


def test_the_mlflow_ui_opens_on_the_training_runs_and_shows_ne(repro):
    """`make ui`'s MLflow UI on the store of the repro, through a real browser: the address
    lrm gives opens on the training runs (the parent run of the repro, not MLflow 3's GenAI
    traces view), and the registry's list of versions shows each version's NE (4 digits)."""
    import mlflow

    from lrm import mlflow_ui, tracking
    from tests.flows.test_deployments import _free_port, browser, chromium

    binary = chromium()
    tmp, port = repro["tmp"], _free_port()
    base = f"http://127.0.0.1:{port}"
    mlflow.set_tracking_uri(f"sqlite:///{tmp}/mlflow.db")
    exp = mlflow.get_experiment_by_name("lrm")
    assert exp.tags[tracking.KIND_TAG] == tracking.EXPERIMENT_KIND
    v1 = mlflow.MlflowClient().get_model_version("lrm-student-small", "1")
    ne = f"NE {float(v1.tags['lrm.ne']):.4f}"
    # started as `make ui` starts it: warm (past MLflow 3.17's mapper race) when it returns
    with open(tmp / "mlflow-ui.log", "wb") as log, \
            mlflow_ui.running(f"sqlite:///{tmp}/mlflow.db", port, stdout=log,
                              stderr=subprocess.STDOUT, env=repro["env"], cwd=tmp):
        with browser(binary, tmp) as b:
            page = b.open(tracking.ui_url(base, exp.experiment_id), "Run Name",
                          "dvc repro dvc.yaml", timeout=120, reload_on=MLFLOW_GAVE_UP)
            assert "Latency" not in page and "Token Usage" not in page
            b.screenshot(tmp / "mlflow-runs.png")
            b.open(tracking.ui_url(base), "lrm", "Experiments", timeout=120,
                   reload_on=MLFLOW_GAVE_UP)
            b.open(f"{base}/#/models/lrm-student-small", "Version 1", ne, timeout=120,
                   reload_on=MLFLOW_GAVE_UP)
            b.screenshot(tmp / "mlflow-registry.png")
    # a reload covers a request lost on the way, never one the server failed: lrm's runs
    # and versions must not make MLflow's server answer 5xx
    served = (tmp / "mlflow-ui.log").read_text()
    failed = re.findall(r'"[A-Z]+ (\S+) HTTP/[\d.]+" 5\d\d', served)
    assert not failed, f"the MLflow server failed {failed}; reloads: {b.reloads}"
    if b.reloads:  # passed after a reload: said in the run's warnings, to see how often
        warnings.warn(f"the MLflow UI was reloaded: {b.reloads}", stacklevel=1)

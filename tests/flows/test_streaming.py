"""The streaming flow under prefect_test_harness, on tiny params (T = 1: day 0 is the first
teacher's): three days, each processed once, each student resumed from its checkpoint chain,
one registry version per day, @champion moved only when NE improves (a planted worse model
is not promoted), one report artifact and one MLflow parent run per day; a day run again
changes nothing; a failure mid-day leaves champion, checkpoints and augmented days as they
were and the next run completes the day; the folder source (files dropped in an inbox, the
next day there: evaluated on it) through `python -m flows.streaming`'s command."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import psutil
import pyarrow.parquet as pq
import pytest
import typer
import yaml
from prefect.testing.utilities import prefect_test_harness
from typer.testing import CliRunner

from flows.streaming import main as streaming_main
from flows.streaming import no_new_day, streaming
from lrm import lock, registry
from lrm.config import GenerateConfig, from_dict
from lrm.data import synthetic
from lrm.train import days as chains
from tests.conftest import HARNESS_STARTUP_S, REPO, new_store
from tests.test_registry import _scrambled

pytestmark = pytest.mark.slow

WORLD = {"users": 2000, "ads": 300, "advertisers": 40, "categories": 8, "days": 3,
         "sessions_per_day": 150, "mean_session_length": 4.0, "max_history": 20,
         "verticals": [{"name": "all"}]}  # one surface: a vertical model per size
TINY = {
    "generate": WORLD,
    "dedup": {"rows_per_file": 100},
    "train": {"batch_size": 128, "log_every": 2, "threads": 1},
    "checkpoint": {"every": 2},  # 3-4 steps a day: a checkpoint mid-day, one at its end
    "exfm": {"teacher_days": 1, "teacher_every": 2, "teacher_lag": 1},
    "augment": {"batch_size": 1024},
    "loader": {"prefetch": 1, "num_workers": 1},
    "model": {"teacher": {"embedding_dim": 8, "dense_embeddings": 1, "dense_mlp": [8],
                          "layers": 1, "fm_embeddings": 4, "lcb_embeddings": 4, "fm_rank": 4,
                          "fm_mlp": [16], "top_mlp": [16]}},
    "students": {"models": {"small": {"embedding_dim": 4, "bottom_mlp": [8], "top_mlp": [8]}}},
    "registry": {"margin": 0.0, "variant": "aux_adapter"},
}
STUDENT, TEACHER = "lrm-student-small", "lrm-teacher"
PLANTED_DAY = 2


@pytest.fixture(scope="module")
def harness():
    with prefect_test_harness(server_startup_timeout=HARNESS_STARTUP_S):
        yield


def _write_params(root: Path, **more: dict) -> Path:
    doc = {k: dict(v) for k, v in TINY.items()}
    for k, v in more.items():
        doc[k] = {**doc.get(k, {}), **v}
    path = root / "tiny.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _files(root: Path) -> dict[str, str]:
    """Every file under the stream's folder with its sha256."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _registry_state() -> dict:
    c = registry.client()
    out = {}
    for name in (STUDENT, TEACHER):
        versions = c.search_model_versions(f"name = '{name}'")
        aliases = c.get_registered_model(name).aliases
        out[name] = {"tags": {str(v.version): dict(v.tags) for v in versions},
                     "aliases": {k: str(v) for k, v in aliases.items()}}
    return out


def _runs() -> int:
    return len(mlflow.search_runs(search_all_experiments=True))


async def _artifacts() -> dict[str, str]:
    from prefect import get_client

    async with get_client() as client:
        return {a.key: a.data for a in await client.read_artifacts() if a.key}


async def _task_run_names() -> list[str]:
    from prefect import get_client

    async with get_client() as client:
        return [r.name for r in await client.read_task_runs()]


def _snapshot(stream: Path) -> dict:
    return {"files": _files(stream), "registry": _registry_state(), "runs": _runs(),
            "artifacts": asyncio.run(_artifacts())}


@pytest.fixture(scope="module")
def world(harness, tmp_path_factory):
    """Three days of the synthetic stream (a worse student planted on day 2), then day 2
    again; the snapshots and records each test reads."""
    root = tmp_path_factory.mktemp("stream")
    params = _write_params(root)
    real = registry.challenge

    def plant(model_dir, name, **kw):  # the day-2 student is replaced by a much worse one
        if name == STUDENT and Path(model_dir).parts[-3] == f"day={PLANTED_DAY}":
            _scrambled(Path(model_dir), Path(model_dir), seed=7)
        return real(model_dir, name, **kw)

    locked: list[Path] = []
    exclusive_all = lock.exclusive_all

    def recording(paths, **kw):  # every output a stage of the stream locks
        paths = list(paths)
        locked.extend(Path(p).resolve() for p in paths)
        return exclusive_all(paths, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", new_store(root))
        mp.chdir(root)
        mp.setattr(lock, "exclusive_all", recording)
        with pytest.MonkeyPatch.context() as planted:
            planted.setattr(registry, "challenge", plant)
            state = streaming(days=3, params=[str(params)], return_state=True)
        assert state.is_completed(), state.message
        records = state.result()
        before = _snapshot(root / "stream")
        again = streaming(day=PLANTED_DAY, params=[str(params)], return_state=True)
        assert again.is_completed(), again.message
        yield {"root": root, "params": params, "records": records, "before": before,
               "locked": locked,
               "again": again.result(), "after": _snapshot(root / "stream")}


def _tags(world, version):
    return world["after"]["registry"][STUDENT]["tags"][version]


def test_three_days_each_processed_once(world):
    recs = world["records"]
    assert [r["day"] for r in recs] == [1, 2, 3]
    names = asyncio.run(_task_run_names())  # day 2 was run again: a no-op
    assert [names.count(f"student small day {d}") for d in (1, 2, 3)] == [1, 1, 1]
    assert [names.count(f"augment day {d}") for d in (1, 2, 3)] == [1, 1, 1]
    days = sorted((world["root"] / "stream" / "days").glob("day=*.json"))
    assert [p.name for p in days] == ["day=1.json", "day=2.json", "day=3.json"]
    versions = [r["students"]["small"]["decision"]["version"] for r in recs]
    assert versions == ["1", "2", "3"]  # one new version a day, increasing
    # the teacher: first on day 0 (scored on day 1), again on days 1-2 (teacher_every: 2)
    assert [r["teacher"]["due"] for r in recs] == [True, False, True]
    assert recs[0]["teacher"]["window"] == [0] and recs[2]["teacher"]["window"] == [1, 2]
    assert recs[1]["teacher"]["next"] == 3
    assert sorted(world["after"]["registry"][TEACHER]["tags"]) == ["1", "2"]
    # day 3 is augmented by the teacher's champion of that day
    champion = world["after"]["registry"][TEACHER]["aliases"]["champion"]
    assert recs[2]["augmented_by"] == f"{TEACHER} v{champion}"
    # the day was its own newest: every model scored on the held-out last slice of it
    assert all(not r["next_day"] and "last 20% of sessions" in r["evaluated_on"] for r in recs)
    # a day writes in the stream's folder only: it locks no ExFM table or plot where the
    # flow runs (a killed day left those locks, and two streams from one folder would wait)
    stream = (world["root"] / "stream").resolve()
    assert world["locked"] and all(stream in p.parents for p in world["locked"]), \
        sorted(set(map(str, world["locked"])))


def test_students_start_each_day_from_the_day_before(world):
    trained = [r["students"]["small"]["train"] for r in world["records"]]
    assert trained[0]["start"] == "fresh"  # the first day
    chain = world["root"] / "stream" / "checkpoints" / "students" / "small" / "aux_adapter"
    for d, now in enumerate(trained[1:], start=2):
        assert now["start"] == "warm" and now["steps"] > 0  # its own steps
        # the day before's model
        assert world["root"] / now["init_from"] == chain / f"day={d - 1}" / "model"
        assert (world["root"] / now["checkpoint"]).parent == chain / f"day={d}"
    # the two newest finished days are kept, older ones removed
    assert sorted(p.name for p in chain.glob("day=*")) == ["day=2", "day=3"]
    # the fit and held-out parts of the newest done day only (each a copy of its day)
    work = world["root"] / "stream" / "work"
    assert sorted(p.name for p in work.glob("day=*")) == ["day=3"]


def test_the_champion_changes_only_when_ne_improves(world):
    champions = [r["students"]["small"]["champion"] for r in world["records"]]
    planted = world["records"][PLANTED_DAY - 1]["students"]["small"]["decision"]
    assert not planted["promoted"] and planted["challenger"]["ne"] > planted["champion"]["ne"]
    assert planted["champion_version"] == "1" and champions[:2] == ["1", "1"]  # it stayed
    champion = None
    for v in ("1", "2", "3"):
        t = _tags(world, v)
        if champion is None:
            assert t["lrm.decision"] == "promoted" and "lrm.champion_ne" not in t
        else:
            assert t["lrm.champion_version"] == champion
            better = float(t["lrm.ne"]) < float(t["lrm.champion_ne"])
            assert (t["lrm.decision"] == "promoted") == better, t
        if t["lrm.decision"] == "promoted":
            champion = v
        assert champions[int(v) - 1] == champion  # the alias after each day
    assert world["after"]["registry"][STUDENT]["aliases"] == {"champion": champion,
                                                             "challenger": "3"}


def test_each_day_has_a_report_artifact_and_a_parent_mlflow_run(world):
    arts = world["after"]["artifacts"]
    assert sorted(k for k in arts if k.startswith("lrm-stream-day-")) == [
        "lrm-stream-day-1", "lrm-stream-day-2", "lrm-stream-day-3"]
    md = arts["lrm-stream-day-2"]
    assert md == (world["root"] / "stream" / "reports" / "day=2.md").read_text()
    assert "| lrm-student-small | v2 | challenger |" in md
    assert "| lrm-student-small | v1 | champion |" in md
    assert "lrm-student-small v2: kept as @challenger" in md and "last 20%" in md
    assert "| user_id |" in md  # the collision table

    runs = mlflow.search_runs(search_all_experiments=True)
    for d, rec in zip((1, 2, 3), world["records"]):
        parent = runs[runs["tags.mlflow.runName"] == f"stream_day_{d}"]
        assert len(parent) == 1
        kids = runs[runs["tags.mlflow.parentRunId"] == parent["run_id"].iloc[0]]
        steps = {"dedup", "augment", "student_small", "register_small"}  # each a stage's run
        if rec["teacher"]["due"]:
            steps.add("teacher")
        assert set(kids["tags.mlflow.runName"]) == steps


def test_running_a_day_again_changes_nothing(world):
    assert world["again"] == [{**world["records"][PLANTED_DAY - 1], "already_done": True}]
    before, after = world["before"], world["after"]
    assert after["files"] == before["files"]  # checkpoints, data, models, records, reports
    assert after["registry"] == before["registry"]
    assert after["runs"] == before["runs"] and after["artifacts"] == before["artifacts"]


def test_a_promotion_by_hand_is_judged_on_the_rows_the_stream_judged_on(world, monkeypatch):
    """The issue-45 probe: `lrm models promote` scored the champion on all of its own
    training day (NE 0.872, against 0.991 on its held-out slice), so a better challenger
    was refused. By default both are scored on the rows the stream judged its newest day
    on (the champion gets the NE the stream gave it there), and a day a model trained on is
    refused, named. Red with the old default (the stream's sessions, the last day) or the
    overlap check dropped."""
    from flows.cli import app
    from lrm.streaming import ledger
    from lrm.streaming.layout import StreamPaths

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{world['root']}/mlflow.db")
    monkeypatch.chdir(world["root"])
    paths = StreamPaths(world["root"] / "stream")
    newest = ledger.recorded_days(paths)[-1]  # (day 4 where the test above ran first)
    judged = ledger.read(paths, newest)["students"]["small"]["decision"]
    champion = registry.alias_version(STUDENT, "champion")
    theirs = judged["challenger"] if judged["version"] == champion else judged["champion"]
    params = ["--params", str(world["params"])]
    r = CliRunner().invoke(app, ["models", "promote", STUDENT, str(PLANTED_DAY), *params])
    assert r.exit_code == 1 and "not promoted" in r.output, r.output  # the planted one
    t = registry.client().get_model_version(STUDENT, str(PLANTED_DAY)).tags
    assert t["lrm.evaluated_on"] == (f"day {newest}'s held-out last slice (as the stream "
                                     f"judged it) (manual promotion)")
    assert float(t["lrm.champion_ne"]) == pytest.approx(theirs["ne"], rel=1e-9)
    r = CliRunner().invoke(app, ["models", "promote", STUDENT, str(PLANTED_DAY), "--data",
                                 str(paths.sessions), "--day", str(PLANTED_DAY), *params])
    assert r.exit_code == 2 and f"{STUDENT} v{PLANTED_DAY} trained on day {PLANTED_DAY} " \
        f"(train_days [{PLANTED_DAY}]): scored on day {PLANTED_DAY} of " in r.output, r.output
    assert registry.alias_version(STUDENT, "champion") == champion


def test_a_failure_mid_day_leaves_everything_and_the_next_run_completes_the_day(world):
    from lrm.exfm import distill

    root, params = world["root"], world["params"]
    stream = root / "stream"
    chain = stream / "checkpoints" / "students" / "small" / "aux_adapter"
    real = distill.ExFMLoss.__call__
    calls = {"n": 0}

    def fail_mid_day(self, model, batch):  # step 3: after day 4's checkpoint at step 2
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected failure in the middle of day 4")
        return real(self, model, batch)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root}/mlflow.db")
        mp.chdir(root)
        before = {"chain": _files(chain), "registry": _registry_state(),
                  "augmented": {k: v for k, v in _files(stream / "augmented").items()
                                if not k.startswith("day=4")}}
        with pytest.MonkeyPatch.context() as broken:
            broken.setattr(distill.ExFMLoss, "__call__", fail_mid_day)
            state = streaming(days=1, params=[str(params)], return_state=True)
        assert state.is_failed() and calls["n"] == 3
        after = _files(chain)  # the finished days' checkpoints: as they were
        assert {k: after.get(k) for k in before["chain"]} == before["chain"]
        assert {k for k in after if k not in before["chain"]} <= {
            k for k in after if k.startswith("day=4/")}  # day 4's own, in its own folder
        assert chains.newest(chain) == chain / "day=3" / "model"  # what day 4 starts from
        assert _registry_state() == before["registry"]
        assert {k: v for k, v in _files(stream / "augmented").items()
                if not k.startswith("day=4")} == before["augmented"]
        assert not (stream / "days" / "day=4.json").exists()

        state = streaming(days=1, params=[str(params)], return_state=True)
        assert state.is_completed(), state.message
    (rec,) = state.result()
    assert rec["day"] == 4  # the failed day, not the one after it
    trained = rec["students"]["small"]["train"]
    # it went on from day 4's own checkpoint at step 2
    assert trained["start"] == "resume"
    assert trained["resumed_from"] == 2 and trained["steps"] >= 3
    assert rec["students"]["small"]["decision"]["version"] == "4"


def test_the_folder_source_through_the_command(harness, tmp_path, monkeypatch):
    """Files dropped in the inbox become days by content; day D + 1 there: scored on it. A
    file too small for a step of every model (a partial export) is no day: the run does
    the days before it, then fails naming it (exit 2). Red with the check dropped: it was
    day 3, and that day and every day after it failed in training, run after run."""
    inbox = tmp_path / "stream" / "incoming"
    inbox.mkdir(parents=True)
    cfg = from_dict(GenerateConfig, {**WORLD, "seed": 11}, "generate")
    for d in range(3):  # days 0 (the teacher's), 1 and 2
        pq.write_table(synthetic.generate_day(cfg, d), inbox / f"export-{d}.parquet")
    pq.write_table(synthetic.generate_day(cfg, 3).slice(0, 40), inbox / "export-3.parquet")
    (inbox / "zz-copy-of-day-1.parquet").write_bytes((inbox / "export-1.parquet").read_bytes())
    (inbox / "notes.txt").write_text("not data")
    for f in inbox.iterdir():  # dropped a while ago: settled (streaming.settle)
        os.utime(f, (time.time() - 3600,) * 2)
    params = _write_params(tmp_path, streaming={"source": "folder"})
    monkeypatch.setenv("MLFLOW_TRACKING_URI", new_store(tmp_path))
    monkeypatch.chdir(tmp_path)
    app = typer.Typer()
    app.command()(streaming_main)
    r = CliRunner().invoke(app, ["--days", "1", "--params", str(params)])
    assert r.exit_code == 2, r.output
    assert "export-3.parquet: cannot be the stream's day 3: its 40 impressions are too few " \
        "for one teacher step" in r.output and "(the days before it ran: [1])" in r.output
    assert (tmp_path / "stream" / "reports" / "day=1.md").is_file()
    raw = sorted(p.name for p in (tmp_path / "stream" / "raw").glob("day=*"))
    assert raw == ["day=0", "day=1", "day=2"]  # the copy is not a day of its own
    src = json.loads((tmp_path / "stream" / "raw" / "day=2" / "_source.json").read_text())
    assert src["origin"]["file"] == "export-2.parquet"
    rec = json.loads((tmp_path / "stream" / "days" / "day=1.json").read_text())
    assert rec["next_day"] and rec["evaluated_on"] == "day 2 (the next day)"
    assert rec["students"]["small"]["decision"]["evaluated_on"] == "day 2 (the next day)"
    assert (tmp_path / "stream" / "augmented" / "day=2" / "_manifest.json").is_file()
    assert len(list(inbox.iterdir())) == 6  # the inbox is only read


def test_an_inbox_that_is_not_there_or_holds_nothing_read_is_said(harness, tmp_path,
                                                                   monkeypatch):
    """`streaming.watch` naming no folder (a typo) is exit 2, not "no new day" on every run
    forever; a run with nothing to do names the inbox and the files no source reads. Red
    with the watch check dropped, or the old one-line message."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", new_store(tmp_path))
    monkeypatch.chdir(tmp_path)
    app = typer.Typer()
    app.command()(streaming_main)
    typo = _write_params(tmp_path, streaming={"source": "folder",
                                              "watch": str(tmp_path / "inbx")})
    r = CliRunner().invoke(app, ["--days", "1", "--params", str(typo)])
    assert r.exit_code == 2 and f"streaming.watch: {tmp_path / 'inbx'} is not a folder" in \
        r.output, r.output
    inbox = tmp_path / "stream" / "incoming"
    inbox.mkdir(parents=True)
    (inbox / "clicks.csv").write_text("uid,clicked\n1,0\n")
    params = _write_params(tmp_path, streaming={"source": "folder"})
    r = CliRunner().invoke(app, ["--days", "1", "--params", str(params)])
    assert r.exit_code == 0, r.output  # (the flow prints its line where Prefect sends it)
    from stagekit import load_params

    cfg = load_params([str(params)])
    line = no_new_day(cfg, inbox, [0], 2)
    assert line == (f"no new day to process (the inbox {inbox} holds no new file; its days "
                    f"[0] are the first teacher's: the stream starts at day 2; no source "
                    f"reads clicks.csv (a click log needs the ingest.logs mapping: its label "
                    f"or explode))")
    (inbox / "day-0.tsv").write_text("0\t1\n")  # being written: waits (streaming.settle)
    assert no_new_day(cfg, inbox, [], 0).startswith(
        f"no new day to process (the inbox {inbox} holds no new file that has settled: "
        f"day-0.tsv changed within the last 60 s (streaming.settle), taken once unchanged "
        f"that long;")


def test_bad_days_and_a_file_as_the_root_are_exit_2(harness, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.chdir(tmp_path)
    params = _write_params(tmp_path)
    app = typer.Typer()
    app.command()(streaming_main)
    for days in ("0", "-1"):
        r = CliRunner().invoke(app, ["--days", days, "--params", str(params)])
        assert r.exit_code == 2 and f"--days {days}: must be >= 1" in r.output, r.output
    afile = tmp_path / "a-file"
    afile.write_text("mine")
    r = CliRunner().invoke(app, ["--days", "1", "--params", str(params), "--root", str(afile)])
    assert r.exit_code == 2 and "the stream's folder is a file" in r.output, r.output
    assert afile.read_text() == "mine"
    assert not (tmp_path / "stream").exists()  # nothing made where it was not asked
    r = CliRunner().invoke(app, ["--day", "99", "--params", str(params)])
    assert r.exit_code == 2 and "--day 99: day 1 is not done yet" in r.output, r.output
    assert not list((tmp_path / "stream" / "raw").glob("day=*"))  # no day made before it


def test_a_stream_day_honours_train_fp8_and_the_streaming_plan(harness, tmp_path, monkeypatch):
    """The stream's models are built like every stage's (one training job): `train.fp8`'s
    layers train in FP8 and `streaming.plan` places their tables, here a plan that shards
    user_id's table column-wise (on one rank the default placement is table-wise only)."""
    from lrm.config import DedupConfig
    from lrm.data import dedup
    from lrm.fp8.dispatch import FORMAT
    from stagekit import execute, load_params
    from stages import shard_plan

    monkeypatch.setenv("MLFLOW_TRACKING_URI", new_store(tmp_path))
    monkeypatch.chdir(tmp_path)
    world = tmp_path / "world"  # the plan's statistics: the same world's days
    synthetic.generate(from_dict(GenerateConfig, WORLD, "generate"), world / "raw")
    dedup.dedup_dataset(world / "raw", world / "sessions", DedupConfig(rows_per_file=100))
    plan = tmp_path / "plan.json"
    execute(shard_plan.STAGE, {"data": world / "sessions", "out": plan,
                               "calibration": REPO / "lrm" / "sharding" / "calibration",
                               "metrics": tmp_path / "plan-metrics.json"},
            load_params([_write_params(tmp_path)]))
    doc = json.loads(plan.read_text())
    for key in ("teacher", "students.small"):
        doc["models"][key]["tables"]["t_user_id"]["sharding_type"] = "column_wise"
    plan.write_text(json.dumps(doc))
    report = tmp_path / "fp8.json"  # the small student's head (8 -> 1) in FP8
    report.write_text(json.dumps({
        "format": FORMAT, "device": "test", "models": {"m": {
            "kind": "student", "plan": ["head"],
            "layers": {"head": {"shape": {"rows": 256, "k": 8, "n": 1}, "fp8": True}}}},
        "settings": {"recipe": "tensorwise", "backend": "scaled_mm", "compile": False}}))
    params = _write_params(tmp_path, train={"fp8": str(report)},
                           streaming={"plan": str(plan)})
    state = streaming(days=1, params=[str(params)], return_state=True)
    assert state.is_completed(), state.message
    models = tmp_path / "stream" / "models"
    student = json.loads((models / "students" / "day=1" / "small" / "aux_adapter" /
                          "model.json").read_text())["info"]
    teacher = json.loads((models / "teacher" / "until=1" / "model.json").read_text())["info"]
    assert student["fp8"] == ["head"] and teacher["fp8"] == []
    for info in (student, teacher):
        assert info["sharding"]["t_user_id"] == "column_wise on ranks [0]"
        assert info["sharding"]["t_ad_id"] == "table_wise on ranks [0]"


def test_a_stream_of_two_surfaces_picks_beyond_the_noise_in_worker_processes(
        harness, tmp_path, monkeypatch):
    """registry.variant auto, students.ablation_every 2, streaming.workers 2, three days.
    Each vertical model is a task trained in a worker process of its own, its stage runs
    nested under the day's MLflow run. North: day 1 the whole ablation and the prior served
    (no evidence yet), day 2 the served variant and labels only, day 3 the whole ablation
    and the pick on the stored scores of the days every candidate was scored on (day 1).
    South's days are too small to train on (a few impressions): each is skipped in one line,
    the day completes, and south serves the foundation model, registered under its own
    name and scored on its rows. Red with the ablation every day (day 2 trains every
    variant), and with a worker's runs not nested (no parent run in the process)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", new_store(tmp_path))
    monkeypatch.chdir(tmp_path)
    two = [{"name": "north", "share": 0.97}, {"name": "south", "share": 0.03}]
    params = _write_params(
        tmp_path, generate={"verticals": two, "sessions_per_day": 300, "days": 4},
        registry={"variant": "auto"}, streaming={"workers": 2},
        students={"ablation_every": 2,
                  "variants": {"labels_only": {"distill": False},
                               "distill_serving": {"aux_head": False, "adapter": False},
                               "aux_head": {"adapter": False}}})
    state = streaming(days=3, params=[str(params)], return_state=True)
    assert state.is_completed(), state.message
    days = state.result()
    assert [r["day"] for r in days] == [1, 2, 3]
    north = [r["students"]["north-small"] for r in days]
    assert [n["ablation"] for n in north] == [True, False, True]
    assert north[0]["trained"] == ["aux_head", "distill_serving", "labels_only"]
    # no evidence yet: no VM beats the FM, and a tie goes to it (registry.pick.fm_ties)
    assert north[0]["variant"] == "fm"
    assert north[1]["trained"] == ["distill_serving", "labels_only"]  # served + control
    pick = north[2]["pick"]
    assert pick["prior"] == "distill_serving" and pick["days"] == [1]
    assert set(pick["ne"]) == {"labels_only", "distill_serving", "aux_head", "fm"}
    assert north[2]["variant"] == pick["served"]
    client = registry.client()
    d = north[2]["decision"]
    assert client.get_model_version(d["name"], d["version"]).tags["lrm.variant"] == \
        pick["served"]
    for rec in days:  # south: nothing to train on, the FM's own prediction serves
        s = rec["students"]["south-small"]
        assert s["trained"] == [] and s["variant"] == "fm"
        assert "impressions, fewer than one step" in rec_skipped(tmp_path, rec["day"])
    d = days[0]["students"]["south-small"]["decision"]
    mv = client.get_model_version("lrm-student-south-small", d["version"])
    assert mv.tags["lrm.variant"] == "fm" and json.loads(mv.tags["lrm.verticals"]) == [1]
    assert 0 < d["challenger"]["rows"] < 100  # scored on south's rows alone
    names = asyncio.run(_task_run_names())
    assert names.count("student north-small day 2") == 1
    runs = mlflow.search_runs(search_all_experiments=True)
    day_runs = dict(zip(runs["tags.mlflow.runName"], runs["run_id"], strict=True))
    for day in (1, 2, 3):
        students = runs[(runs["tags.lrm.stage"] == "student")
                        & (runs["tags.lrm.stream.day"] == str(day))]
        assert len(students) == 2  # north and south, each in its worker
        assert set(students["tags.mlflow.parentRunId"]) == {day_runs[f"stream_day_{day}"]}


def rec_skipped(root: Path, day: int) -> str:
    """What the student stage said of south's day (its metrics file in the reports)."""
    doc = json.loads((root / "stream" / "reports" /
                      f"student_south-small_day={day}.json").read_text())
    return doc["students"]["south-small"].get("skipped", "")


def test_a_failed_day_moves_no_champion_and_its_rerun_moves_them_once(harness, tmp_path,
                                                                         monkeypatch):
    """A day's promotions take effect when the day completes: a teacher judged better (here
    made so) in a day that then fails leaves @champion where it was; the day run again
    completes and moves it."""
    from lrm.exfm import distill

    monkeypatch.setenv("MLFLOW_TRACKING_URI", new_store(tmp_path))
    monkeypatch.chdir(tmp_path)
    params = _write_params(tmp_path, exfm={"teacher_every": 1})  # a new teacher every day
    state = streaming(days=1, params=[str(params)], return_state=True)
    assert state.is_completed(), state.message
    assert registry.alias_version(TEACHER, registry.CHAMPION) == "1"
    judge = registry.judge

    def better(new, old, margin):  # the day's teacher wins whatever it scores
        return (True, "planted") if old is not None else judge(new, old, margin)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(registry, "judge", better)
        mp.setattr(distill.ExFMLoss, "__call__", lambda *a: (_ for _ in ()).throw(
            RuntimeError("the day dies in its students' training")))
        failed = streaming(days=1, params=[str(params)], return_state=True)
    assert failed.is_failed()
    c = registry.client()
    assert c.get_model_version(TEACHER, "2").tags["lrm.decision"] == "promoted"  # judged,
    assert registry.alias_version(TEACHER, registry.CHAMPION) == "1"  # but not carried out
    assert not (tmp_path / "stream" / "days" / "day=2.json").exists()
    state = streaming(days=1, params=[str(params)], return_state=True)
    assert state.is_completed(), state.message
    (rec,) = state.result()
    assert rec["day"] == 2 and rec["teacher"]["decision"]["version"] == "2"
    assert registry.alias_version(TEACHER, registry.CHAMPION) == "2"  # now the day is done
    assert rec["augmented_by"] == f"{TEACHER} v2"  # and the day was logged by it


@pytest.mark.parametrize("command", [["flows.streaming", "--days", "3"],
                                     ["flows.pipeline", "--pipeline", "lrm"]])
def test_sigterm_stops_the_run_and_its_temporary_prefect_server(tmp_path, command):
    """`kill` (a scheduler, a CI timeout) of `python -m flows.streaming` (or of the pipeline
    flow, `make run`'s) exits 143 through Prefect's teardown, which stops the temporary
    server it started. Red with SIGTERM left to Python's default (each flow's, tried): the
    process died at once and its uvicorn server ran on, orphaned."""
    if command[0] == "flows.pipeline":  # a clone's folder, with its tiny params (make run's)
        from tests.flows.clone import fresh_clone, tiny_params

        cwd = fresh_clone(tmp_path)
        tiny_params(cwd)
        params = cwd / "params.yaml"
    else:
        cwd, params = tmp_path, _write_params(tmp_path)
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "PYTHONPATH": str(REPO)}
    env.pop("PREFECT_API_URL", None)  # its own temporary server, as a user's first run
    log = tmp_path / "out.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", *command, "--params", str(params)],
                                cwd=cwd, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        children: list[psutil.Process] = []
        deadline = time.monotonic() + 240
        server = "prefect.server.api.server:create_app"
        while not any(server in " ".join(c.cmdline())
                      for c in psutil.Process(proc.pid).children(recursive=True)):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        time.sleep(5)  # the flow is under way
        assert proc.poll() is None, log.read_text()
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM, log.read_text()[-3000:]
        _, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, f"left running: {[c.cmdline() for c in alive]}"
    finally:
        for p in [proc, *children]:
            try:
                p.kill()
            except (ProcessLookupError, psutil.NoSuchProcess):
                pass

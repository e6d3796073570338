"""The registry: @challenger on every new version, @champion only when NE improves on the same
data (a planted worse model is not promoted), decisions as tags, re-runs that change nothing,
a promotion stopped half-way finished by the next run, manual promotion and rollback,
`lrm models`, and a champion that loads back and answers `mlflow models serve` over HTTP."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from lrm import registry
from lrm.config import SplitConfig
from lrm.errors import ConfigError, DataError
from lrm.models.saved import WEIGHTS, load_model, read_card, save_model
from lrm.serving import pyfunc
from lrm.train import TrainJob, train
from tests.conftest import LOADER, SMALL_MODEL, new_store, tiny_train

pytestmark = pytest.mark.slow
NAME = "lrm-student-small"
EVAL_DAY = 2


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A tracking store of this module's own; the working folder holds its artifacts."""
    root = tmp_path_factory.mktemp("registry")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", new_store(root))
        mp.chdir(root)
        yield root


def _scrambled(good: Path, out: Path, seed: int) -> Path:
    """The good model with every weight replaced by noise: a much worse model."""
    g = torch.Generator().manual_seed(seed)
    w = torch.load(good / WEIGHTS, weights_only=True)
    bad = {k: torch.randn(v.shape, generator=g) * 3 if v.is_floating_point() else v
           for k, v in w.items()}
    return save_model(out, read_card(good), bad)


@pytest.fixture(scope="module")
def folders(store, datasets):  # noqa: F811
    good = store / "good"
    train(TrainJob(kind="student", train=tiny_train(), model=SMALL_MODEL,
                   data=datasets["sessions"], split=SplitConfig(days=[0, 1], eval_day=EVAL_DAY),
                   loader=LOADER, out=good))
    # two scrambles of it; which is the worse one is measured, not assumed of a seed
    noisy = [_scrambled(good, store / f"scrambled-{seed}", seed) for seed in (1, 2)]
    bad, worse = sorted(noisy, key=lambda m: registry.scores(m, datasets["sessions"],
                                                             EVAL_DAY)["ne"])
    return {"good": good, "bad": bad, "worse": worse, "sessions": datasets["sessions"]}


def _challenge(folders, which, name=NAME, margin=0.0):
    from lrm import tracking

    with tracking.run(f"register {which}"):
        return registry.challenge(folders[which], name, eval_data=folders["sessions"],
                                  eval_day=EVAL_DAY, margin=margin,
                                  evaluated_on=f"day {EVAL_DAY}")


def _version(name, version):
    return registry.client().get_model_version(name, version)


def _tags(name, version):
    return _version(name, version).tags


@pytest.mark.parametrize("challenger, champion, margin, promoted", [
    (0.90, None, 0.01, True),  # no champion yet
    (0.90, 0.95, 0.01, True),
    (0.90, 0.905, 0.01, False),  # better, but by less than the margin
    (0.90, 0.90, 0.0, False),  # a tie keeps the champion
    (0.95, 0.90, 0.0, False),  # worse
    (math.nan, 0.90, 0.0, False),
    (0.90, math.nan, 0.0, True),  # a champion that cannot be scored on this data
])
def test_judge(challenger, champion, margin, promoted):
    got, why = registry.judge(challenger, champion, margin)
    assert got is promoted and why


def test_champion_moves_only_when_ne_improves(folders):
    first = _challenge(folders, "bad")
    assert first.promoted and first.version == "1" and first.champion is None
    assert not first.earlier
    tags = _tags(NAME, "1")  # no champion to compare with: no empty champion tags
    assert "lrm.champion_ne" not in tags and "lrm.champion_version" not in tags
    assert all(v for v in tags.values()), tags
    assert _version(NAME, "1").description == (
        f"NE {first.challenger['ne']:.4f} on day {EVAL_DAY}: promoted to @champion")
    better = _challenge(folders, "good")
    assert better.promoted and better.version == "2" and better.champion_version == "1"
    assert better.challenger["ne"] < better.champion["ne"]
    worse = _challenge(folders, "worse")  # the planted worse model
    assert not worse.promoted and worse.version == "3"
    assert worse.challenger["ne"] > worse.champion["ne"] and worse.champion_version == "2"
    assert registry.alias_version(NAME, "champion") == "2"
    assert registry.alias_version(NAME, "challenger") == "3"
    tags = _tags(NAME, "3")  # the decision and both NEs are tags of the version
    assert tags["lrm.decision"] == "kept" and tags["lrm.champion_version"] == "2"
    assert float(tags["lrm.ne"]) == pytest.approx(worse.challenger["ne"])
    assert float(tags["lrm.champion_ne"]) == pytest.approx(worse.champion["ne"])
    assert tags["lrm.evaluated_on"] == f"day {EVAL_DAY}" and "margin" in tags["lrm.reason"]
    assert _tags(NAME, "2")["lrm.decision"] == "promoted"
    assert _version(NAME, "3").description == (  # the registry's pages: NE, 4 digits
        f"NE {worse.challenger['ne']:.4f} on day {EVAL_DAY} (champion v2: "
        f"{worse.champion['ne']:.4f}): kept as @challenger")


def test_a_rerun_changes_nothing(folders):
    before = {v.version: dict(v.tags) for v in
              registry.client().search_model_versions(f"name = '{NAME}'")}
    again = _challenge(folders, "good")
    assert again.version == "2" and again.promoted
    assert again.earlier  # read back from the version: nothing was decided now
    after = {v.version: dict(v.tags) for v in
             registry.client().search_model_versions(f"name = '{NAME}'")}
    assert after == before  # no new version, no tag rewritten
    assert registry.alias_version(NAME, "champion") == "2"


def test_a_promotion_stopped_before_the_alias_moved_is_finished_next_time(folders, monkeypatch):
    name = "lrm-student-cut"
    _challenge(folders, "bad", name)
    real = registry.client().__class__.set_registered_model_alias

    def refuse(self, model, alias, version):
        if alias == "champion":
            raise RuntimeError("killed between the tags and the alias")
        return real(self, model, alias, version)

    monkeypatch.setattr(registry.client().__class__, "set_registered_model_alias", refuse)
    with pytest.raises(RuntimeError, match="killed"):
        _challenge(folders, "good", name)
    monkeypatch.undo()
    assert registry.alias_version(name, "champion") == "1"  # not moved yet
    assert _tags(name, "2")["lrm.decision"] == "promoted"
    done = _challenge(folders, "good", name)
    assert done.version == "2" and registry.alias_version(name, "champion") == "2"


def test_rollback_and_manual_promotion_go_through_the_same_check(folders):
    assert registry.rollback(NAME, "1") == ("2", None)
    assert registry.alias_version(NAME, "champion") == "1"
    assert "replacing v2" in _tags(NAME, "1")["lrm.rollback"]
    with pytest.raises(ConfigError, match="earlier version"):
        registry.rollback(NAME, "3")
    kept = registry.promote(NAME, "3", eval_data=folders["sessions"], eval_day=EVAL_DAY,
                            margin=0.0)
    assert not kept.promoted and registry.alias_version(NAME, "champion") == "1"
    back = registry.promote(NAME, "2", eval_data=folders["sessions"], eval_day=EVAL_DAY,
                            margin=0.0)
    assert back.promoted and registry.alias_version(NAME, "champion") == "2"
    assert back.champion_version == "1" and "manual" in back.evaluated_on


def test_rollback_goes_to_an_earlier_champion_unless_forced(folders):
    """v2 was kept out by the NE rule: rolling back to it is refused (exit 2, one line
    saying why), and with --force it is done and says what it overrode."""
    from flows.cli import app

    name = "lrm-student-rollback"
    for which in ("bad", "worse", "good"):  # v1 champion, v2 kept, v3 champion
        _challenge(folders, which, name)
    assert registry.alias_version(name, "champion") == "3"
    runner = CliRunner()
    r = runner.invoke(app, ["models", "rollback", name, "2"])
    errors = [ln for ln in r.output.splitlines() if " INFO " not in ln]  # not a log line
    assert r.exit_code == 2 and len(errors) == 1 and errors[0].startswith("error: "), r.output
    assert "v2 was never @champion: the NE rule kept it" in r.output and "--force" in r.output
    assert registry.alias_version(name, "champion") == "3"
    r = runner.invoke(app, ["models", "rollback", name, "2", "--force"])
    assert r.exit_code == 0 and "by force: v2 was never @champion" in r.output, r.output
    assert registry.alias_version(name, "champion") == "2"
    assert "made champion by force" in _tags(name, "2")["lrm.rollback"]
    r = runner.invoke(app, ["models", "rollback", name, "1"])  # an earlier champion
    assert r.exit_code == 0 and "@champion is v1 again (was v2)" in r.output, r.output


def _trained_on(model: Path, out: Path, **info) -> Path:
    """A model's weights, its card saying it trained as `info` says."""
    card = read_card(model)
    return save_model(out, dataclasses.replace(card, info={**card.info, **info}),
                      torch.load(model / WEIGHTS, weights_only=True))


def test_a_promotion_by_hand_refuses_a_day_either_model_trained_on(folders, tmp_path):
    """Scored on a day it trained on, a model is judged on how it fit (issue 45: the
    stream's champion 0.872 on its training day, 0.991 on its held-out slice). Red with the
    check dropped (each promote below was judged)."""
    name = "lrm-student-overlap"
    _challenge(folders, "good", name)  # v1 @champion, trained on days 0 and 1
    _challenge(folders, "bad", name)  # v2, the same days
    with pytest.raises(ConfigError, match=r"registry: lrm-student-overlap v2 trained on day 1 "
                                          r"\(train_days \[0, 1\]\): scored on day 1 of "):
        registry.promote(name, "2", eval_data=folders["sessions"], eval_day=1, margin=0.0)
    later = _trained_on(folders["worse"], tmp_path / "later", train_days=[2], eval_day=2)
    _challenge({**folders, "later": later}, "later", name)  # v3, kept: trained on day 2
    with pytest.raises(ConfigError, match="lrm-student-overlap v1 trained on day 1"):
        registry.promote(name, "3", eval_data=folders["sessions"], eval_day=1, margin=0.0)
    assert registry.alias_version(name, "champion") == "1"
    # a stream day's model: fit on day 2's first part, carried from the day before's
    day2 = _trained_on(folders["good"], tmp_path / "day2", train_days=[2], eval_day=2,
                       init_from="stream/checkpoints/day=1/model")
    assert registry.seen(day2, 2, held_out=True) is None  # its own held-out slice
    assert registry.seen(day2, 2) == "trained on day 2 (train_days [2])"  # all of day 2
    assert registry.seen(day2, 1).startswith("went on from a model of the days before day 2")
    assert registry.seen(day2, 3) is None


def test_a_registered_model_is_loaded_only_as_registered(folders, tmp_path):
    """A version's model folder carries its own record (a model written inside a stage's
    output has none: the students'); one logged before that is vouched for by the
    registry's content hash, and files changed in the artifact store are refused. Red with
    the packaged copy unrecorded (the first load fails) or the hash check dropped."""
    name = "lrm-student-recorded"
    _challenge(folders, "good", name)
    got = registry.model_folder(name, "1", tmp_path / "a")
    assert load_model(got)[1] == read_card(folders["good"])
    source = _version(name, "1").source  # models:/m-... : the logged model's artifacts
    where = mlflow.get_logged_model(source.split("/")[-1]).artifact_location
    stored = list(Path(where.removeprefix("file://")).rglob(".lrm-output.json"))
    assert len(stored) == 1
    for marker in stored:  # as a version logged before the record travelled with it
        marker.unlink()
    assert load_model(registry.model_folder(name, "1", tmp_path / "b"))[1] == \
        read_card(folders["good"])
    for marker in stored:
        (marker.parent / WEIGHTS).write_bytes((folders["bad"] / WEIGHTS).read_bytes())
    with pytest.raises(DataError, match="lrm-student-recorded v1's files are not the model "
                                        "registered"):
        registry.model_folder(name, "1", tmp_path / "c")


def test_lrm_models_commands(folders):
    from flows.cli import app

    runner = CliRunner()
    r = runner.invoke(app, ["models"])
    assert r.exit_code == 0, r.output
    assert NAME in r.output and "@champion" in r.output and "kept" in r.output
    r = runner.invoke(app, ["models", "promote", NAME, "3", "--data", str(folders["sessions"])])
    assert r.exit_code == 1 and "not promoted" in r.output
    assert registry.alias_version(NAME, "champion") == "2"
    r = runner.invoke(app, ["models", "rollback", NAME, "7"])
    assert r.exit_code == 2 and "has no version '7'" in r.output


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_champion_loads_back_and_answers_mlflow_models_serve(folders, store):
    from mlflow.models import convert_input_example_to_serving_input

    frame = pyfunc.example_frame(folders["sessions"], EVAL_DAY, rows=8)
    model, card = load_model(folders["good"])  # the champion's folder
    want = pyfunc.predict_frame(model, card, frame)["probability"].to_numpy()
    got = registry.load(NAME).predict(frame)["probability"].to_numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert ((got > 0) & (got < 1)).all()

    port = _free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{store}/mlflow.db",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # its uvicorn
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "models", "serve", "-m", f"models:/{NAME}@champion",
         "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)],
        cwd=store, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    out = server.stdout.read().decode() if server.poll() is not None else ""
                    pytest.fail(f"mlflow models serve did not come up: {out[-2000:]}")
                time.sleep(0.5)
        body = convert_input_example_to_serving_input(frame).encode()
        status, answer = _invoke(port, body)
        assert status == 200, answer
        served = np.array([p["probability"] for p in answer["predictions"]])
        np.testing.assert_allclose(served, want, rtol=1e-5)

        # the README's request: a null id is a missing value (scored), not a 400
        split = json.loads(body)["dataframe_split"]
        ids = split["columns"].index("user_id")
        split["data"][0][ids] = None
        status, answer = _invoke(port, json.dumps({"dataframe_split": split}).encode())
        assert status == 200, answer
        assert len(answer["predictions"]) == len(frame)
        assert 0 < answer["predictions"][0]["probability"] < 1
        # the request the docs show beside `mlflow models serve` (docs/streaming.md)
        readme = (Path(__file__).resolve().parents[1] / "docs" / "streaming.md").read_text()
        example = readme.split("/invocations -H 'Content-Type: application/json' -d '", 1)[1]
        status, answer = _invoke(port, example.split("'", 1)[0].encode())
        assert status == 200 and len(answer["predictions"]) == 2, answer
        # a column the model does not read: a 400 that names it
        split["columns"].append("bogus_feature")
        for row in split["data"]:
            row.append(1)
        status, answer = _invoke(port, json.dumps({"dataframe_split": split}).encode())
        assert status == 400 and "bogus_feature" in answer["message"], answer
        # an id past 64 bits: a 400 naming the field and row, no stack trace (issue 45)
        split["columns"].pop(), [row.pop() for row in split["data"]]
        split["data"][1][ids] = 2**70
        status, answer = _invoke(port, json.dumps({"dataframe_split": split}).encode())
        assert status == 400 and "field user_id: row 2: " in answer["message"], answer
        assert "stack_trace" not in answer, answer
    finally:
        _stop(server)


def _invoke(port: int, body: bytes) -> tuple[int, dict]:
    """POST to the scoring server: (HTTP status, its JSON answer)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group (the server and its workers), SIGKILL after 20 s."""
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def test_models_list_shows_the_names_params_give(folders, tmp_path):
    """A stream or pipeline registering under its own names (`registry.student_prefix`,
    `teacher.registry_name`) is listed with its params; "lrm-" alone hid it ("no registered
    lrm models yet"). Red with the prefix fixed to "lrm-"."""
    from flows.cli import app

    _challenge(folders, "good", name="probe-student-small")
    params = tmp_path / "p.yaml"
    params.write_text("registry: {student_prefix: probe-student-}\n")
    r = CliRunner().invoke(app, ["models", "list", "--params", str(params)])
    assert r.exit_code == 0 and "probe-student-small" in r.output, r.output
    r = CliRunner().invoke(app, ["models", "list"])  # the defaults: lrm-* only
    assert r.exit_code == 0 and "probe-student-small" not in r.output, r.output


def test_models_list_matches_names_as_written_on_every_page(tmp_path, monkeypatch):
    """The ops probe: a prefix with a quote (registry.student_prefix "it's-") was
    MlflowException's traceback (the LIKE filter ended at the quote); its _ was a wildcard
    ("lrm_" listed lrmXstudent); and past 100 registered models the rest were not listed.
    Red with the LIKE filter back (one page)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", new_store(tmp_path))
    c = registry.client()
    names = ["it's-a", "lrmXstudent", "lrm_b", *(f"lrm-m{i:03d}" for i in range(101))]
    for name in names:
        c.create_registered_model(name)
        c.create_model_version(name, source=str(tmp_path))
    listed = {r["name"] for r in registry.list_models(("lrm-", "lrm_", "it's-"))}
    assert listed == set(names) - {"lrmXstudent"}
    # a registration looks its content up the same way (a traceback with "it's-")
    c.set_model_version_tag("it's-a", "1", registry.HASH_TAG, "abc")
    assert registry.find_model_version("it's-a", registry.HASH_TAG, "abc") == "1"


def test_a_version_is_read_as_mlflow_numbers_it_and_a_name_not_registered_is_said(
        tmp_path, monkeypatch):
    """The ops probe: `lrm models promote NAME 01` of the champion v1 scored v1 against
    itself and tagged the champion "kept"; `lrm models rollback nope 1` said "nope has no
    version '1'". Red with the version taken as typed, or with the name not looked up."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", new_store(tmp_path))
    c = registry.client()
    c.create_registered_model("m")
    for _ in range(2):
        c.create_model_version("m", source=str(tmp_path))
    c.set_registered_model_alias("m", registry.CHAMPION, "1")
    with pytest.raises(ConfigError, match=r"^registry: m v1 is already @champion$"):
        registry.promote("m", "01", eval_data=tmp_path, eval_day=0, margin=0.0)
    assert registry.DECISION_TAG not in _tags("m", "1")
    with pytest.raises(ConfigError, match=r"^registry: no registered model 'nope' "):
        registry.rollback("nope", "1")
    with pytest.raises(ConfigError, match=r"^registry: m has no version '3'$"):
        registry.rollback("m", "3")


def test_a_version_whose_files_are_gone_is_one_error_naming_where(tmp_path, monkeypatch):
    """The ops probe: with the store's artifact folder moved away, `lrm models promote`
    was FileNotFoundError's traceback (MLflow downloads nothing and says nothing). Red
    without the MLmodel check in registry.model_folder."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", new_store(tmp_path))
    c = registry.client()
    c.create_registered_model("m")
    (tmp_path / "artifacts").mkdir()
    c.create_model_version("m", source=str(tmp_path / "artifacts"))
    (tmp_path / "artifacts").rmdir()  # removed or moved
    with pytest.raises(DataError, match=r"m v1's files are not there \(removed or moved"):
        registry.model_folder("m", "1", tmp_path / "dst")


def test_lrm_models_list_shows_a_tag_edited_by_hand_as_it_is(tmp_path, monkeypatch):
    """The ops probe: an NE tag that is not a number (edited in MLflow's UI) was
    ValueError's traceback through `lrm models list`. Red with float() unguarded."""
    from flows.cli import app

    monkeypatch.setenv("MLFLOW_TRACKING_URI", new_store(tmp_path))
    c = registry.client()
    c.create_registered_model("lrm-m")
    c.create_model_version("lrm-m", source=str(tmp_path), tags={registry.NE_TAG: "n/a"})
    c.create_model_version("lrm-m", source=str(tmp_path), tags={registry.NE_TAG: "0.91"})
    r = CliRunner().invoke(app, ["models", "list"])
    assert r.exit_code == 0, r.output
    assert "│ n/a " in r.output and "│ 0.91000 " in r.output


def test_lrm_models_promote_refuses_a_day_without_its_data(tmp_path, monkeypatch):
    """The ops probe: `--day N` without `--data` was not read (the stream's newest judged
    day was used instead, or its absence named). Red without the check."""
    from flows.cli import app

    monkeypatch.setenv("MLFLOW_TRACKING_URI", new_store(tmp_path))
    monkeypatch.chdir(tmp_path)
    c = registry.client()
    c.create_registered_model("lrm-m")
    c.create_model_version("lrm-m", source=str(tmp_path))
    r = CliRunner().invoke(app, ["models", "promote", "lrm-m", "1", "--day", "3"])
    assert r.exit_code == 2 and "--day 3: give --data with it" in r.output, r.output


def test_a_verticals_tag_edited_by_hand_is_named_not_a_traceback(tmp_path, monkeypatch):
    """The ops probe: a version's lrm.verticals tag that is not JSON ids (edited in
    MLflow's UI) was JSONDecodeError's traceback through `lrm models promote`. Red
    without registry._verticals."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", new_store(tmp_path))
    c = registry.client()
    c.create_registered_model("m")
    c.create_model_version("m", source=str(tmp_path), tags={registry.VERTICALS_TAG: "feed"})
    with pytest.raises(ConfigError, match=r"^registry: m v1's tag lrm.verticals is 'feed', "
                                          r"not a JSON list of vertical ids"):
        registry.promote("m", "1", eval_data=tmp_path, eval_day=0, margin=0.0)

"""The runner: checks before anything runs, the metrics the run returns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lrm.config import ParamsConfig
from lrm.errors import LrmError
from stagekit import Arg, Metrics, Stage, execute


def _toy_stage(tmp_path: Path, calls: list) -> Stage:
    def run(*, src: Path, out: Path, metrics: Path | None = None) -> Metrics:
        calls.append((src, out))
        out.mkdir()
        return Metrics({"n": 1})

    return Stage(name="toy", run=run, reads={},
                 args={"src": Arg("--in", "in", "in"), "out": Arg("--out", "out", "out"),
                       "metrics": Arg("--metrics", "m", "metrics")})


@pytest.mark.parametrize("src, out", [("d", "d"), ("d", "d/out"), ("d/inner", "d")])
def test_an_output_overlapping_an_input_is_refused_before_anything_runs(tmp_path, src, out):
    (tmp_path / "d" / "inner").mkdir(parents=True)
    calls: list = []
    with pytest.raises(LrmError, match="input") as err:
        execute(_toy_stage(tmp_path, calls), {"src": tmp_path / src, "out": tmp_path / out},
                ParamsConfig())
    assert calls == [] and "\n" not in str(err.value)


def test_the_runner_writes_the_metrics_the_run_returns(tmp_path):
    calls: list = []
    (tmp_path / "src").mkdir()
    m = execute(_toy_stage(tmp_path, calls), {"src": tmp_path / "src", "out": tmp_path / "o",
                                              "metrics": tmp_path / "m" / "toy.json"},
                ParamsConfig())
    # the file holds exactly what the run returned (a file of anything else, or none, fails)
    assert m.metrics() == {"n": 1} == json.loads((tmp_path / "m" / "toy.json").read_text())
    assert calls == [(tmp_path / "src", tmp_path / "o")]  # the run ran once, with its args


def test_an_optional_output_given_as_off_is_not_written_and_none_gets_its_default(
        tmp_path, monkeypatch):
    """A flow turns a stage's table off with OFF; None is an option the CLI left unset,
    which takes the stage's default path (a stream day must not write ./metrics/...)."""
    from stagekit import OFF

    def run(*, src: Path, table: Path | None = Path("metrics/table.md")) -> Metrics:
        if table is not None:
            table.parent.mkdir(parents=True, exist_ok=True)
            table.write_text("| t |")
        return Metrics({"n": 1})

    stage = Stage(name="tabled", run=run, reads={},
                  args={"src": Arg("--in", "in", "in"),
                        "table": Arg("--table", "t", "out", file=True, cache=False)})
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    execute(stage, {"src": tmp_path / "src", "table": OFF}, ParamsConfig())
    assert not (tmp_path / "metrics").exists()
    execute(stage, {"src": tmp_path / "src", "table": None}, ParamsConfig())
    assert (tmp_path / "metrics" / "table.md").read_text() == "| t |"


def test_off_stays_off_through_a_pickled_flow():
    """`lrm serve` runs the stream's flow from a cloudpickled copy of its functions, whose
    globals (OFF among them) travel by value unless they pickle by reference."""
    import copy
    import pickle

    import cloudpickle

    from stagekit import OFF

    def flow_task() -> object:
        return OFF

    assert cloudpickle.loads(cloudpickle.dumps(flow_task))() is OFF
    assert pickle.loads(pickle.dumps(OFF)) is OFF and copy.deepcopy(OFF) is OFF


def test_a_run_that_fails_before_writing_leaves_its_state_folders_as_it_found_them(
        tmp_path):
    """A state folder (checkpoints) the runner claims: made, it goes again; there already
    and empty (the user's), its marker goes again (a failed `--resume` of an empty folder
    left one in it). Red with the unmark dropped."""
    def run(*, src: Path, state: Path) -> dict:
        raise LrmError("stopped before writing")

    stage = Stage(name="stateful", run=run, reads={},
                  args={"src": Arg("--in", "in", "in"), "state": Arg("--state", "s", "state")})
    (tmp_path / "src").mkdir()
    (tmp_path / "mine").mkdir()
    for state in (tmp_path / "made" / "here", tmp_path / "mine"):
        with pytest.raises(LrmError, match="stopped before writing"):
            execute(stage, {"src": tmp_path / "src", "state": state}, ParamsConfig())
    assert not (tmp_path / "made").exists() and list((tmp_path / "mine").iterdir()) == []


def test_a_folder_lrm_did_not_write_is_refused_naming_the_option_that_gave_it(tmp_path):
    """The ops probe: `lrm train --checkpoints DIR` on a user's folder said "choose another
    --out". Red with the option not passed to io.check_replaceable / io.claim_dir."""
    calls: list = []

    def run(*, src: Path, out: Path, state: Path) -> dict:
        calls.append(src)
        return {}

    stage = Stage(name="two", run=run, reads={},
                  args={"src": Arg("--in", "in", "in"), "out": Arg("--model-out", "o", "out"),
                        "state": Arg("--checkpoints", "s", "state")})
    for name in ("src", "users", "free"):
        (tmp_path / name).mkdir()
    (tmp_path / "users" / "notes.txt").write_text("mine")
    for args, option in (({"out": "users", "state": "free"}, "--model-out"),
                         ({"out": "free", "state": "users"}, "--checkpoints")):
        with pytest.raises(LrmError) as err:
            execute(stage, {"src": tmp_path / "src",
                            **{k: tmp_path / v for k, v in args.items()}}, ParamsConfig())
        assert str(err.value).endswith(f"or choose another {option}"), err.value
    assert calls == [] and (tmp_path / "users" / "notes.txt").read_text() == "mine"

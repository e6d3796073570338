"""The `lrm` command from a user's own project folder: every command runs there, with nothing
of the checkout in the working folder (package files are found through the package, outputs
go where the user is)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows import dag
from flows.cli import app
from flows.dvc_yaml import command
from tests.conftest import new_store
from tests.data._logs import clicks_log, write
from tests.data.test_criteo import random_lines
from tests.flows.clone import TINY

pytestmark = pytest.mark.slow


def _argv(node: dag.Node) -> list[str]:
    """The `lrm` command line a user types for a pipeline node: what `dvc repro` runs as
    `python -m stages.NAME ...` (the node's own arguments), as `lrm NAME ...`."""
    return [node.stage.command_name, *command(node.stage, node.args).split()[3:]]


CHECKOUT = ("lrm", "stages", "stagekit", "flows", "docs", "bench", "pipelines")


def test_no_stage_default_points_into_the_checkout():
    """What a command reads by default is found from any folder: no default path of any
    stage names a folder of the checkout (the shipped calibration's default was
    lrm/sharding/calibration, relative to the working folder: `lrm shard-plan` failed
    anywhere else). Package files come through the package (importlib.resources). Red with
    that default planted back in stages/shard_plan.py."""
    bad = [f"{s.name}.{k} = {v}" for s in dag.STAGES.values()
           for k, v in s.signature_defaults().items()
           if isinstance(v, (str, Path)) and Path(v).parts[:1] in {(c,) for c in CHECKOUT}]
    assert not bad


def test_the_lrm_commands_run_from_an_empty_folder(tmp_path, monkeypatch):
    """The issue-45 probe: `lrm shard-plan` failed from any folder but the checkout (the
    shipped calibration was looked up relative to the working folder). From an empty folder,
    the params file elsewhere, as a user types them: the default pipeline's commands up to
    a trained, evaluated baseline (generate, dedup, shard-plan, train, evaluate), the
    checkpoint and registry commands, and both ingests; nothing is written outside the
    folder. (The ExFM stages after them read no package file -- the test above -- and run
    end to end in tests/flows/test_pipeline.py; here they would add minutes.) Red with the
    calibration's default relative again (lrm.sharding.cost.CALIBRATIONS =
    Path("lrm/sharding/calibration"))."""
    params = tmp_path / "cfg" / "tiny.yaml"  # the user's params, outside the folder
    params.parent.mkdir()
    params.write_text(yaml.safe_dump({**TINY, "train": {**TINY["train"], "steps": 2},
                                      "checkpoint": {"every": 1}}))
    here = tmp_path / "project"
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", new_store(tmp_path))
    runner = CliRunner()

    def lrm(*argv: str, params_opt: bool = True) -> str:
        r = runner.invoke(app, [*argv, *(["--params", str(params)] if params_opt else [])])
        assert r.exit_code == 0, (argv, r.output[-3000:], r.exception)
        return r.output

    nodes = {n.name: n for n in dag.SYNTHETIC.nodes}
    for name in ("generate", "dedup", "shard_plan", "train_student", "evaluate"):
        node = nodes[name]
        # the calibration as a user's command line leaves it: the shipped one (dvc.yaml
        # names the checkout's copy, to track it as a dependency)
        args = {k: v for k, v in node.args.items() if k != "calibration"}
        if name == "evaluate":  # the student alone (the teacher is not trained here)
            args["models"] = [m for m in args["models"] if m.startswith("student=")]
        lrm(*_argv(dag.Node(node.name, node.stage, args)))
    assert (here / "plans" / "sharding.json").is_file()
    assert (here / "metrics" / "eval.json").is_file()
    assert "step-2" in lrm("checkpoint", "ls", "checkpoints/baseline/student", params_opt=False)
    lrm("checkpoint", "verify", "checkpoints/baseline/student", params_opt=False)
    lrm("models", "list")

    (here / "tsv").mkdir()
    (here / "tsv" / "day0.tsv").write_text("\n".join(random_lines(300)) + "\n")
    lrm("ingest", "criteo", "tsv", "--out", "criteo")
    write(clicks_log(), here / "clicks.csv")
    lrm("ingest", "logs", "clicks.csv", "--out", "logs", "--ingest.logs.label", "clicked",
        "--ingest.logs.user", "user", "--ingest.logs.item", "item", "--ingest.logs.time", "ts")
    assert (here / "criteo").is_dir() and (here / "logs").is_dir()
    # the params' folder and the store with its artifacts: all there is outside the project
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg", "mlflow.db", "mlruns", "project"]


def test_the_command_line_loads_without_fbgemm():
    """`lrm` (flows.cli, and the DAG table it reads) imports no fbgemm when it loads:
    fbgemm's import logs through the root logger, which installs Python's bare handler
    before Prefect's, and every line of `lrm serve`'s runs came out as "INFO:prefect...".
    Red with stages/train.py importing lrm.checkpoint at load (it did)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", "import sys, flows.cli; print(sorted(m for m in "
                        "('fbgemm_gpu', 'torchrec', 'torch') if m in sys.modules))"],
                       capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout


def test_each_command_s_summary_is_one_line_of_its_listing(monkeypatch):
    """`lrm --help` (and `lrm models --help`, ...): each command's summary, the first
    paragraph of its help, is one line of the command table at any width that holds it, not
    cut where its docstring's source line ended (rich keeps a docstring's line breaks: `lrm
    --help` broke `teacher`, `register`, `tune` and `deploy` mid-sentence). Red with the
    stages' summaries taken as written (stagekit.cli) or a summary spanning two source lines."""
    import click
    import typer.main
    import typer.rich_utils

    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", 400)

    def walk(group: click.Group, path: list[str]) -> int:
        r = CliRunner().invoke(app, [*path, "--help"])
        assert r.exit_code == 0, (path, r.output)
        lines = r.output.splitlines()
        seen = 0
        for name, cmd in group.commands.items():
            summary = " ".join((cmd.help or "").split("\n\n")[0].split())
            assert any(summary in line for line in lines), (path, name, summary, r.output)
            seen += 1 + (walk(cmd, [*path, name]) if isinstance(cmd, click.Group) else 0)
        return seen

    assert walk(typer.main.get_command(app), []) >= len(dag.STAGES)

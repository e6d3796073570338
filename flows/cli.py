"""The `lrm` command: one subcommand per stage (the same function as `python -m stages.X`),
`lrm checkpoint ls|verify DIR` (lrm.checkpoint.listing), `lrm serve` (the streaming
deployment), `lrm deploy --pool NAME` (the same on a work pool) and `lrm models` (the
registry).

A front door like the flows, so it lives beside them: it may import every stage (the
registry of stages is flows/dag.py's `STAGES`).

Nothing here imports torch (or fbgemm) when the module loads: fbgemm's import logs through
the root logger, which installs Python's bare handler (logging.basicConfig), and Prefect's
logging, set up after it, then leaves the root alone: every line of `lrm serve` (whose runs
import this module again in a spawned process) came out as "INFO:prefect.flow_runs:...".
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path

import typer

from flows.dag import STAGES
from lrm.config import ParamsConfig
from lrm.errors import ConfigError, LrmError
from stagekit import load_params
from stagekit.cli import command, fail, setup_logging

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="lrm: train and keep retraining large recommendation models.")
GROUP_HELP = {"ingest": "ingest: logs -> Parquet days (criteo: Criteo TSV; logs: any click "
                        "log through a column mapping)"}

_groups: dict[str, typer.Typer] = {}  # `lrm ingest criteo|logs`: a command's sources
for _stage in STAGES.values():
    if _stage.group is None:
        app.command(_stage.command_name)(command(_stage))
        continue
    if _stage.command_name not in _groups:
        _groups[_stage.command_name] = typer.Typer(
            add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False)
        app.add_typer(_groups[_stage.command_name], name=_stage.command_name,
                      help=GROUP_HELP.get(_stage.command_name))
    _groups[_stage.command_name].command(_stage.group)(command(_stage))

checkpoint_app = typer.Typer(add_completion=False, no_args_is_help=True,
                             pretty_exceptions_enable=False)
app.add_typer(checkpoint_app, name="checkpoint", help="checkpoint: list or verify a folder")


def _show(report: Callable[[Path], str], folder: Path) -> None:
    try:
        print(report(folder))
    except LrmError as e:
        raise fail(e) from None


@checkpoint_app.command("ls")
def checkpoint_ls(folder: Path = typer.Argument(..., help="checkpoint folder")) -> None:
    """List the checkpoints: step, baseline or delta, bytes, quantization, verified."""
    from lrm.checkpoint import listing

    _show(listing.ls, folder)


@checkpoint_app.command("verify")
def checkpoint_verify(folder: Path = typer.Argument(..., help="checkpoint folder")) -> None:
    """Check every file against its manifest (exit 2 naming what is wrong)."""
    from lrm.checkpoint import listing

    _show(listing.verify, folder)


PARAMS_OPT = typer.Option(None, "--params", help="params YAML file(s), later ones win "
                                                  "(default: ./params.yaml)")


@app.command("serve")
def serve(cron: str = typer.Option(None, "--cron", help='cron schedule, e.g. "0 2 * * *" '
                                                       '(default: streaming.cron)'),
          params: list[Path] = PARAMS_OPT,
          root: str = typer.Option(None, "--root", help="the stream's folder "
                                                       "(default: streaming.root)"),
          days: int = typer.Option(None, "--days", help="new days per run "
                                                       "(default: streaming.days)")) -> None:
    """Serve the streaming retraining flow as a Prefect deployment on a cron schedule."""
    from flows import deployments

    setup_logging()
    try:
        deployments.serve(cron, [str(p) for p in params] if params else None, root, days)
    except LrmError as e:
        raise fail(e) from None


@app.command("deploy")
def deploy(pool: str = typer.Option(..., "--pool", help="the Prefect work pool (a process "
                                                        "pool is created when missing)"),
           cron: str = typer.Option(None, "--cron", help='cron schedule, e.g. "0 2 * * *" '
                                                        '(default: streaming.cron)'),
           params: list[Path] = PARAMS_OPT,
           root: str = typer.Option(None, "--root", help="the stream's folder "
                                                        "(default: streaming.root)"),
           days: int = typer.Option(None, "--days", help="new days per run "
                                                        "(default: streaming.days)"),
           name: str = typer.Option("lrm-streaming-pool", "--name", help="deployment name"),
           heartbeat: int = typer.Option(30, "--heartbeat", help="seconds between a run's "
                                         "heartbeats (a lost run is crashed after 3 missed)"),
           ) -> None:
    """Deploy the streaming retraining flow to a Prefect work pool on a cron schedule.

    Its runs are executed by `prefect worker start --pool POOL` (on the GPU machines)."""
    from flows import deployments

    setup_logging()
    try:
        deployments.deploy(pool, cron, [str(p) for p in params] if params else None, root,
                           days, name, heartbeat)
    except LrmError as e:
        raise fail(e) from None


models_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False,
                         invoke_without_command=True,
                         help="The MLflow registry: versions, @champion/@challenger, NE.")
app.add_typer(models_app, name="models")


def _cfg(params: list[Path] | None) -> ParamsConfig:
    """The params, the tracking store opened: one that is not there is an error (a mistyped
    URI), not a new empty store these commands would read."""
    from lrm import tracking

    cfg = load_params([Path(p) for p in params] if params else None)
    tracking.connect(cfg.tracking, existing=True)
    return cfg


def _num(x: str | None) -> str:
    if not x:
        return ""
    try:
        v = float(x)
    except ValueError:  # a tag edited by hand (the MLflow UI): shown as it is, not a crash
        return x
    return f"{v:.5f}" if math.isfinite(v) else x


@models_app.callback()
def models(ctx: typer.Context, params: list[Path] = PARAMS_OPT) -> None:
    """With no subcommand: list the registered models (as `lrm models list`)."""
    if ctx.invoked_subcommand is None:
        list_models(params)


@models_app.command("list")
def list_models(params: list[Path] = PARAMS_OPT) -> None:
    """Every registered lrm model: versions, aliases, NE, the decision and why.

    The models: lrm-*, and the names params give (teacher.registry_name,
    registry.student_prefix)."""
    from rich.console import Console
    from rich.table import Table

    from lrm import registry

    try:
        cfg = _cfg(params)
        rows = registry.list_models(("lrm-", cfg.teacher.registry_name,
                                     cfg.registry.student_prefix), cfg.tracking)
    except LrmError as e:
        raise fail(e) from None
    if not rows:
        print("no registered lrm models yet (run the pipeline or the streaming flow)")
        return
    t = Table("model", "version", "aliases", "NE", "champion NE", "decision", "evaluated on",
              "reason")
    for r in rows:
        t.add_row(r["name"], r["version"], ", ".join(f"@{a}" for a in r["aliases"]),
                  _num(r["ne"]), _num(r["champion_ne"]) +
                  (f" (v{r['champion_version']})" if r["champion_version"] else ""),
                  r["decision"] or "", r["evaluated_on"] or "",
                  (r["reason"] or "") + (f" [{r['rollback']}]" if r["rollback"] else ""))
    Console(width=200).print(t)


@models_app.command("promote")
def promote(name: str = typer.Argument(..., help="registered model, e.g. lrm-student-small"),
            version: str = typer.Argument(..., help="the version to make @champion"),
            data: Path = typer.Option(None, "--data", help="dataset both are scored on "
                                                          "(default: the rows the stream "
                                                          "judged its newest day on)"),
            day: int = typer.Option(-1, "--day", help="its day (-1: the last)"),
            params: list[Path] = PARAMS_OPT) -> None:
    """Promote VERSION to @champion if it beats the champion as the flow judges (else exit 1).

    The same check as the flow: its NE and the champion's on the same rows, by default those
    the stream judged its newest day on (a day either model trained on is refused); exit 1
    when it does not beat the champion by the margin."""
    from lrm import registry
    from lrm.data.schema import day_files, pick_day
    from lrm.streaming import days as sdays
    from lrm.streaming.layout import StreamPaths

    setup_logging()
    try:
        cfg = _cfg(params)
        paths = StreamPaths(Path(cfg.streaming.root))
        if data is None and day != -1:  # (the stream's day was used, --day unread)
            raise ConfigError(f"--day {day}: give --data with it (without --data both are "
                              f"scored on the rows the stream judged its newest day on)")
        if data is None:
            plan = sdays.judged_on(paths)
            data, chosen, label = plan.eval_data, plan.eval_day, plan.label
        else:
            chosen, label = pick_day(list(day_files(data)), day, "--day"), None
        held = data.resolve() == paths.split(chosen)[1].resolve()
        d = registry.promote(name, version, eval_data=data, eval_day=chosen,
                             margin=cfg.registry.margin, cfg=cfg.tracking, held_out=held,
                             evaluated_on=label)
    except LrmError as e:
        raise fail(e) from None
    verb = "promoted to @champion" if d.promoted else "not promoted"
    print(f"{name} v{version} {verb}: {d.reason}")
    if not d.promoted:
        raise typer.Exit(1)


@models_app.command("rollback")
def rollback(name: str = typer.Argument(..., help="registered model"),
             version: str = typer.Argument(..., help="an earlier @champion to make @champion "
                                                     "again"),
             force: bool = typer.Option(False, "--force", help="also a version that was never "
                                                               "@champion (the NE rule kept it)"),
             params: list[Path] = PARAMS_OPT) -> None:
    """Point @champion back at an earlier champion (no NE check: the operator's call)."""
    from lrm import registry

    try:
        was, overrode = registry.rollback(name, version, _cfg(params).tracking, force=force)
    except LrmError as e:
        raise fail(e) from None
    if overrode is None:
        print(f"{name}: @champion is v{version} again (was v{was})", file=sys.stdout)
    else:
        print(f"{name}: @champion is v{version} (was v{was}), by force: {overrode}",
              file=sys.stdout)


def main() -> None:
    app()


if __name__ == "__main__":
    main()

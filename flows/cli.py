"""The `lrm` command: one subcommand per stage (the same function as `python -m stages.X`),
and `lrm checkpoint ls|verify DIR` (lrm.checkpoint.listing).

A front door like the flows, so it lives beside them: it may import every stage (the
registry of stages is flows/dag.py's `STAGES`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import typer

from flows.dag import STAGES
from lrm.checkpoint import listing
from lrm.errors import LrmError
from stages._common import app as stage_app
from stages._common import command, fail

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="lrm: train and keep retraining large recommendation models.")

for _stage in STAGES.values():
    if _stage.group is None:
        app.command(_stage.command_name)(command(_stage))
    else:  # a command group, e.g. `lrm ingest criteo`
        app.add_typer(stage_app(_stage), name=_stage.command_name,
                      help=f"{_stage.name}: {_stage.group} and future sources")

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
    _show(listing.ls, folder)


@checkpoint_app.command("verify")
def checkpoint_verify(folder: Path = typer.Argument(..., help="checkpoint folder")) -> None:
    """Check every file against its manifest (exit 2 naming what is wrong)."""
    _show(listing.verify, folder)


def main() -> None:
    app()


if __name__ == "__main__":
    main()

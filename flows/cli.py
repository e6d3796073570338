"""The `lrm` command: one subcommand per stage (the same function as `python -m stages.X`).

A front door like the flows, so it lives beside them: it may import every stage (the
registry of stages is flows/dag.py's `STAGES`).
"""

from __future__ import annotations

import typer

from flows.dag import STAGES
from stages._common import app as stage_app
from stages._common import command

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="lrm: train and keep retraining large recommendation models.")

for _stage in STAGES.values():
    if _stage.group is None:
        app.command(_stage.command_name)(command(_stage))
    else:  # a command group, e.g. `lrm ingest criteo`
        app.add_typer(stage_app(_stage), name=_stage.command_name,
                      help=f"{_stage.name}: {_stage.group} and future sources")


def main() -> None:
    app()


if __name__ == "__main__":
    main()

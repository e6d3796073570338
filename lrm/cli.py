"""The `lrm` command: one subcommand per stage, each the same function as `python -m stages.X`.

This is a front door like flows/, the one library module allowed to import stages.
"""

from __future__ import annotations

import typer

# Stage modules in DAG order; each exposes `command` (or `app` for a command group).
STAGES = ("generate", "ingest", "dedup", "train", "evaluate",
          "teacher", "augment", "student")  # ExFM: teacher -> augment -> students

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="lrm: train and keep retraining large recommendation models.")


def _register() -> None:
    # Imported here so `lrm --help` stays fast and the import direction stays one-way.
    import importlib

    for name in STAGES:
        mod = importlib.import_module(f"stages.{name}")
        if hasattr(mod, "app"):  # a command group, e.g. `lrm ingest criteo`
            app.add_typer(mod.app, name=name)
        else:
            app.command(name)(mod.command)


def main() -> None:
    _register()
    app()


if __name__ == "__main__":
    main()

"""The `lrm` command: one subcommand per stage, each the same function as `python -m stages.X`.

This is a front door like flows/, the one library module allowed to import stages.
"""

from __future__ import annotations

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="lrm: train and keep retraining large recommendation models.")


def _register() -> None:
    # Imported here so `lrm --help` stays fast and the import direction stays one-way.
    from stages import generate

    app.command("generate")(generate.command)
    for name in ("ingest", "dedup"):
        try:
            mod = __import__(f"stages.{name}", fromlist=["app", "command"])
        except ModuleNotFoundError as e:  # a stage not yet present in this checkout
            if e.name != f"stages.{name}":
                raise
            continue
        if hasattr(mod, "app"):
            app.add_typer(mod.app, name=name)
        else:
            app.command(name)(mod.command)


def main() -> None:
    _register()
    app()


if __name__ == "__main__":
    main()

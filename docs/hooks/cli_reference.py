"""MkDocs hook: the CLI reference, generated at build time from the `lrm` typer app.

Typer's own generator (`typer flows.cli utils docs`) writes the Markdown: every command and
subcommand with its usage, help, arguments and options, from the same objects `lrm X --help`
prints. Nothing is written by hand, so the page cannot drift from the command; a command that
fails to build fails the docs build.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
PAGE = "reference/cli.md"
INTRO = """\
Generated at build time from the `lrm` command itself (typer's `utils docs`), so it lists
exactly what `lrm COMMAND --help` prints. A stage's command takes its paths and switches,
then one `--section.key` option per params value the stage reads (with the short forms
such as `--lr`), each overriding `params.yaml` for that run: see
[Concepts](../concepts.md#params). `python -m stages.NAME` takes the same options.
"""


def cli_markdown() -> str:
    """The Markdown typer writes for the `lrm` app (in a child process: the CLI's import
    side effects, logging and all, stay out of MkDocs)."""
    env = {**os.environ, "TERMINAL_WIDTH": "100", "NO_COLOR": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "typer", "flows.cli", "utils", "docs", "--name", "lrm",
         "--title", "CLI reference"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise PluginError(f"typer could not document the lrm command:\n{proc.stderr}")
    text = proc.stdout
    head, _, rest = text.partition("\n")  # the title line, then the intro under it
    return f"{head}\n\n{INTRO}\n{rest}"


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, PAGE, content=cli_markdown()))
    return files

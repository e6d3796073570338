"""Every command the documentation shows names a command and options that exist.

The README's and every docs page's bash blocks, and the `lrm ...` synopses in their tables,
are read as a reader copies them: an `lrm` command is looked up in the `lrm` app (its click
tree), `python -m stages.NAME` in the same, `python -m flows.X` in that module's command, a
`python SCRIPT.py` by its `--help`, a `make` target in the Makefile; every `--option` must be
one the command takes. `lrm --help` runs as the quick start says, and `lrm COMMAND --help`
for every command the docs name. What the suite can run on tiny data runs as written:
tests/docs/test_examples.py.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from flows.cli import app
from flows.dag import STAGES
from tests.docs._pages import PAGES, REPO, Command, commands, inline_lrm

OPTION = re.compile(r"(?<![\w-])(--[a-z][\w.-]*)")
SEPARATORS = {"&&", "||", ";", "|"}
# commands of other tools, or ones the docs show for a machine the suite does not have
OTHERS = {"mkdir", "cp", "export", "curl", "pip", "prefect", "mlflow", "dvc", "torchrun",
          "touch", "python3.11", ".venv/bin/pip", "cat", "ls"}
ROOT = typer.main.get_command(app)


def _documented() -> list[Command]:
    """Every command line, and every inline `lrm WORD ...` (not `lrm NAME`: a placeholder)."""
    return [c for p in PAGES for c in [*commands(p), *inline_lrm(p)]
            if c.block != -1 or c.text.split()[1][:1].islower()]


def _synopsis(text: str) -> list[str]:
    """An inline synopsis's words: `[--day D \\| --days A..B]`, `train|teacher` unpacked."""
    return [w.strip("[]") for w in text.replace("\\|", " ").replace("|", " ").split()]


def _parts(argv: list[str]) -> list[list[str]]:
    """A line's commands: split at && ; | and without redirections or VAR=value prefixes."""
    out: list[list[str]] = [[]]
    skip = False
    for tok in argv:
        if skip:
            skip = False
        elif tok in SEPARATORS:
            out.append([])
        elif tok in (">", ">>", "<", "2>"):
            skip = True
        elif not out[-1] and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", tok):
            continue
        else:
            out[-1].append(tok)
    return [p for p in out if p]


def _opts(words: list[str]) -> list[str]:
    """The options among a command's words (a quoted argument is one word: not its insides)."""
    return [w.split("=")[0] for w in words if OPTION.fullmatch(w.split("=")[0])]


def _options(cmd: Any) -> set[str]:
    names = {"--help"}
    for p in cmd.params:
        names |= {o for o in [*p.opts, *getattr(p, "secondary_opts", [])] if o.startswith("--")}
    return names


def _walk(cmd: Any, words: list[str], where: str) -> tuple[Any, list[str]]:
    """The subcommand `words` lead to from `cmd`, and the words after it."""
    i = 0
    while getattr(cmd, "commands", None) and i < len(words) and not words[i].startswith("-"):
        if words[i] not in cmd.commands:
            raise AssertionError(f"{where}: {words[i]!r} is no subcommand of "
                                 f"{cmd.name}: {sorted(cmd.commands)}")
        cmd = cmd.commands[words[i]]
        i += 1
    return cmd, words[i:]


@functools.cache
def _module_command(module: str) -> Any:
    """`python -m flows.X`'s command (its `main`, run by typer.run)."""
    import importlib

    mod = importlib.import_module(module)
    one = typer.Typer()
    one.command()(mod.main)
    return typer.main.get_command(one)


def _script_options(script: str) -> str:
    """The source a `python SCRIPT.py` reads its options from (argparse's add_argument calls
    in the script, or bench/common.py for a benchmark): read, not run (a benchmark imports
    torch before it parses)."""
    path = REPO / script
    assert path.is_file(), f"{script}: no such file"
    helpers = REPO / "bench" / "common.py"
    return path.read_text() + (helpers.read_text() if path.parent.name == "bench" else "")


@functools.cache
def _make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([\w-]+):", text, re.M))


def _stage_words(module: str, rest: list[str]) -> list[str]:
    """`python -m stages.NAME ...` as the `lrm` words of the same command."""
    mine = [s for s in STAGES.values() if s.run.__module__ == module]
    assert mine, f"{module}: no stage of flows/dag.py runs it"
    if any(s.group for s in mine):
        return [module.rsplit(".", 1)[-1], *rest]
    return [mine[0].command_name, *rest]


def check(words: list[str], where: str) -> list[str]:
    """Assert one command exists with every option it is given; its checked options."""
    if words[0] == "lrm":
        cmd, rest = _walk(ROOT, words[1:], where)
    elif words[:2] == ["python", "-m"] and words[2] == "lrm.launch":
        inner = words.index("-m", 3)  # python -m lrm.launch ... -m stages.X ...
        return check(["python", "-m", *words[inner + 1:]], where)
    elif words[:2] == ["python", "-m"] and words[2].startswith("stages."):
        return check(["lrm", *_stage_words(words[2], words[3:])], where)
    elif words[:2] == ["python", "-m"] and words[2].startswith("flows."):
        cmd, rest = _module_command(words[2]), words[3:]
    elif words[0] == "python" and words[1].endswith(".py"):
        source = _script_options(words[1])
        opts = _opts(words[2:])
        for o in opts:
            assert f'"{o}"' in source, f"{words[1]} has no option {o} ({where})"
        return opts
    elif words[0] == "make":
        targets = [w for w in words[1:] if "=" not in w and not w.startswith("-")]
        for t in targets:
            assert t in _make_targets(), f"{where}: the Makefile has no target {t!r}"
        return targets
    else:
        return []
    known = _options(cmd)
    opts = _opts(rest)
    for o in opts:
        assert o in known, f"{where}: {' '.join(words[:3])}... has no option {o} " \
                           f"(it takes {sorted(known)})"
    return opts


CASES = _documented()


@pytest.mark.parametrize("cmd", CASES, ids=[f"{c.page}:{c.line}" for c in CASES])
def test_documented_command_exists_with_its_options(cmd: Command) -> None:
    where = f"{cmd.page}:{cmd.line}: {cmd.text}"
    if cmd.block == -1:  # a synopsis: `lrm ingest criteo FILE... --out DIR [--skip-bad]`
        check(_synopsis(cmd.text), where)
        return
    for words in _parts(cmd.argv):
        if words[0] in OTHERS or words[:2] == ["python", "-c"]:
            continue
        check(words, where)


def test_the_pages_show_commands_at_all() -> None:
    """The reader guards against a parser that finds nothing (and so checks nothing)."""
    lrm = [c for c in CASES if c.text.startswith("lrm ")]
    assert len(lrm) >= 30, len(lrm)
    assert {c.page for c in lrm} >= {"README.md", "docs/getting-started.md", "docs/data.md",
                                      "docs/training.md", "docs/streaming.md"}


def test_a_wrong_option_or_command_is_caught() -> None:
    """The check itself: a renamed option and a misspelt command are errors."""
    with pytest.raises(AssertionError, match="no option --modle"):
        check(["lrm", "train", "--modle", "student"], "planted")
    with pytest.raises(AssertionError, match="no subcommand"):
        check(["lrm", "ingest", "criteos", "a.tsv"], "planted")
    with pytest.raises(AssertionError, match="no option --lrr"):
        check(["python", "-m", "stages.train", "--lrr", "0.1"], "planted")
    with pytest.raises(AssertionError, match="no option --quik"):
        check(["python", "bench/scaling.py", "--quik"], "planted")
    with pytest.raises(AssertionError, match="no target"):
        check(["make", "docs-serv"], "planted")


def test_lrm_help_runs_as_the_quick_start_says() -> None:
    """`lrm --help`, the console script a fresh install puts on PATH, lists every command."""
    exe = REPO / ".venv" / "bin" / "lrm"
    lrm = str(exe) if exe.exists() else "lrm"
    proc = subprocess.run([lrm, "--help"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    for name in ROOT.commands:
        assert re.search(rf"│ {re.escape(name)}\s", proc.stdout), name


def _documented_lrm_commands() -> list[tuple[str, ...]]:
    paths: set[tuple[str, ...]] = set()
    for c in CASES:
        for words in [_synopsis(c.text)] if c.block == -1 else _parts(c.argv):
            if words[0] != "lrm":
                continue
            cmd, rest = _walk(ROOT, words[1:], c.page)
            paths.add(tuple(words[1:len(words) - len(rest)]))
    return sorted(paths)


DOCUMENTED = _documented_lrm_commands()


@pytest.mark.parametrize("path", DOCUMENTED, ids=[" ".join(p) or "lrm" for p in DOCUMENTED])
def test_documented_command_help(path: tuple[str, ...]) -> None:
    """`lrm COMMAND --help` of every command the docs name: exit 0, its usage line."""
    result = CliRunner().invoke(app, [*path, "--help"], prog_name="lrm",
                                 env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert f"Usage: lrm {' '.join(path)}".strip() in " ".join(result.output.split())


def test_every_stage_is_documented() -> None:
    """Each stage of the DAG has its `lrm` command shown somewhere in the docs."""
    shown = {p[0] for p in DOCUMENTED if p}
    for s in STAGES.values():
        name = "ingest" if s.group else s.command_name
        assert name in shown, f"lrm {name}: in no page of the docs"

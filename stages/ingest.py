"""Stage `ingest`: logs -> the impressions layout (DIR/day=D/*.parquet), two sources.

    lrm ingest criteo FILE_OR_FOLDER... --out data/criteo/raw [--skip-bad] [--days one]
    lrm ingest logs FILE_OR_GLOB... --out data/logs/raw --label clicked --user uid ...
    lrm ingest logs FILE_OR_GLOB... --out data/logs/raw --map mapping.yaml

`criteo`: Criteo TSV files; without FILE they come from `ingest.files`; a folder stands for
its *.tsv files and its subfolders' (in order: day2 before day10), which is how the Criteo
pipeline (pipelines/criteo/dvc.yaml) reads `data/criteo/tsv/`.

`logs`: any click log (Parquet, CSV/TSV, JSON lines; also .gz) through a column mapping:
the `ingest.logs` params, a mapping file (`--map FILE`, YAML with the same keys, laid over
them) and the flags (`--label COL --user COL --session-gap 30m ...`, laid over both).
Without FILE they come from `ingest.logs.files`; a folder stands for its log files (its
subfolders' too), a pattern with *, ? or ** for the files it matches, in order with numbers
read as numbers (day2 before day10: with `--days file`, file k is day k). See lrm.data.logs.

Bad input exits with status 2 and one line naming the file, line or row, and field.
"""

from __future__ import annotations

import glob
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from lrm import io
from lrm.config import IngestConfig, LogsConfig
from lrm.data.logs import LOG_SUFFIXES
from lrm.errors import ConfigError, LrmError
from stagekit import Arg, Metrics, Stage
from stagekit.cli import command, config_options, fail
from stagekit.params import read_params_file

NAME = "ingest"
LOGS = "ingest_logs"


def _files_below(folder: Path) -> list[Path]:
    """Every file in `folder` and the folders below it, hidden ones (.name) aside: a log
    exported a folder a day is taken whole, never skipped without a word."""
    out: list[Path] = []
    for f in folder.iterdir():
        if f.name.startswith("."):
            continue
        if f.is_dir():
            out += _files_below(f)
        elif f.is_file():
            out.append(f)
    return out


def _expand(paths: list[Path], names: tuple[str, ...], patterns: bool) -> list[Path]:
    """Files as given; a folder expands to its files whose names end with one of `names`,
    those of its subfolders too, and (with `patterns`) a path with *, ? or ** (any folders
    below) that is not a file to the files it matches, each in order (`lrm.io.in_order`:
    a/day2 before a/day10 before b/day1)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = io.in_order(f for f in _files_below(p) if f.name.endswith(names))
            if not found:
                raise ConfigError(f"{p}: no {' or '.join('*' + n for n in names)} files in "
                                  f"this folder")
            out += found
        elif patterns and not p.exists() and glob.has_magic(str(p)):
            found = io.in_order(f for f in glob.glob(str(p), recursive=True)
                                if Path(f).is_file())
            if not found:
                raise ConfigError(f"{p}: no file matches")
            out += found
        else:
            out.append(p)
    seen: dict[Path, Path] = {}
    for p in out:  # its rows twice: a glob and a name, or a folder and a file in it
        if (same := seen.setdefault(p.resolve(), p)) is not p:
            raise ConfigError(f"{p}: given twice ({same} is the same file); its rows would "
                              f"be read twice")
    return out


def input_files(paths: list[Path]) -> list[Path]:
    """Files as given; a folder expands to its *.tsv files, in order (`lrm.io.in_order`)."""
    return _expand(paths, (".tsv",), patterns=False)


def log_files(paths: list[Path]) -> list[Path]:
    """Files as given; a folder expands to its log files, a pattern to its matches (in order)."""
    return _expand(paths, LOG_SUFFIXES, patterns=True)


def run(*, listed: list[str], skip_bad: bool, days: str, chunk_rows: int,
        files: list[Path] | None = None, out: Path = Path("data/criteo/raw"),
        metrics: Path | None = Path("metrics/ingest.json"), force: bool = False
        ) -> Metrics:
    """Convert Criteo display-ads TSV files (label, I1..I13, C1..C26) to Parquet days."""
    from lrm.data import criteo  # polars import: only when the stage runs

    cfg = IngestConfig(files=listed, skip_bad=skip_bad, days=days, chunk_rows=chunk_rows)
    chosen = list(files or []) or [Path(f) for f in cfg.files]
    if not chosen:
        raise ConfigError("ingest: no input files; pass FILE... or set ingest.files")
    paths = input_files(chosen)
    io.check_paths(paths, [out])
    with io.atomic_dir(out, stage=NAME, force=force) as tmp:
        return Metrics(criteo.ingest(paths, tmp, cfg))


def run_logs(*, cfg: LogsConfig, chunk_rows: int, max_history: int,
             files: list[Path] | None = None, out: Path = Path("data/logs/raw"),
             metrics: Path | None = Path("metrics/ingest_logs.json"), force: bool = False
             ) -> Metrics:
    """Convert a click log (Parquet, CSV/TSV, JSON lines) to Parquet days, by a column mapping."""
    from lrm.data.logs import ingest  # polars import: only when the stage runs

    chosen = list(files or []) or [Path(f) for f in cfg.files]
    if not chosen:
        raise ConfigError("ingest logs: no input files; pass FILE... or set ingest.logs.files")
    paths = log_files(chosen)
    io.check_paths(paths, [out])
    with io.atomic_dir(out, stage=LOGS, force=force) as tmp:
        return Metrics(ingest.ingest(paths, tmp, cfg, chunk_rows=chunk_rows,
                                     max_history=max_history))


STAGE = Stage(
    name=NAME, run=run, short=("ingest",), group="criteo",
    reads={"listed": "ingest.files", "skip_bad": "ingest.skip_bad", "days": "ingest.days",
           "chunk_rows": "ingest.chunk_rows"},
    args={"files": Arg("", "Criteo TSV files or folders of them (params: ingest.files)", "in"),
          "out": Arg("--out", "output dataset folder", "out"),
          "metrics": Arg("--metrics", "stage metrics file", "metrics")},
)

LOGS_STAGE = Stage(
    name=LOGS, run=run_logs, cli_name=NAME, group="logs", short=("ingest.logs",),
    reads={"cfg": "ingest.logs", "chunk_rows": "ingest.chunk_rows",
           "max_history": "generate.max_history"},
    args={"files": Arg("", "log files, folders or patterns (params: ingest.logs.files)", "in"),
          "out": Arg("--out", "output dataset folder", "out"),
          "metrics": Arg("--metrics", "stage metrics file", "metrics")},
)


def read_mapping(path: Path) -> dict[str, Any]:
    """A mapping file: YAML whose keys are `ingest.logs`'s (an unknown key is an error)."""
    data = read_params_file(path, "mapping")
    known = {o.key.rsplit(".", 1)[1] for o in config_options("ingest.logs")}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{path}: unknown mapping keys {unknown}; known: {sorted(known)}")
    return data


def logs_command() -> Callable[..., None]:
    """`lrm ingest logs`: the stage's command, plus `--map FILE` laid under the flags."""
    base = command(LOGS_STAGE)
    params = {o.key.rsplit(".", 1)[1]: o.param for o in config_options("ingest.logs")}

    def cli(**kw: Any) -> None:
        mapping = kw.pop("mapping", None)
        if mapping is not None:
            try:
                for k, v in read_mapping(mapping).items():
                    if kw.get(params[k]) is None:  # a flag wins over the file
                        kw[params[k]] = v
            except LrmError as e:
                raise fail(e) from None
        base(**kw)

    sig = inspect.signature(base)
    opt = inspect.Parameter("mapping", inspect.Parameter.KEYWORD_ONLY, annotation=Path | None,
                            default=typer.Option(None, "--map", help="a mapping file: YAML "
                                                 "with the keys of ingest.logs, laid over the "
                                                 "params (the flags win)"))
    cli.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[*sig.parameters.values(), opt])
    cli.__doc__, cli.__name__ = base.__doc__, base.__name__
    return cli


COMMANDS: dict[str, Callable[[], Callable[..., None]]] = {
    "criteo": lambda: command(STAGE), "logs": logs_command}


def app() -> typer.Typer:
    """`lrm ingest` (and `python -m stages.ingest`): its subcommands."""
    a = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                    help="ingest: logs -> Parquet days (criteo: Criteo TSV; logs: any click "
                         "log through a column mapping)")
    a.callback()(lambda: None)
    for group, make in COMMANDS.items():
        a.command(group)(make())
    return a


if __name__ == "__main__":
    app()()

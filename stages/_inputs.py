"""Input files as a user names them to the ingest stages: files, folders (their subfolders
too), patterns."""

from __future__ import annotations

import glob
import logging
from collections.abc import Sequence
from pathlib import Path

from lrm import io
from lrm.errors import ConfigError

log = logging.getLogger("lrm")


def _files_below(folder: Path, work: list[Path]) -> list[Path]:
    """Every file in `folder` and the folders below it, hidden ones (.name) aside: a log
    exported a folder a day is taken whole, never skipped without a word. Files under a
    name that starts with _ go to `work`: Spark's and Hadoop's own (`_SUCCESS`, a job's
    `_temporary/` attempts, half-written or repeated), not data; pyarrow's datasets and
    Spark skip them too."""
    out: list[Path] = []
    for f in folder.iterdir():
        if f.name.startswith("."):
            continue
        into = work if f.name.startswith("_") else out
        if f.is_dir():
            into += _files_below(f, work)
        elif f.is_file():
            into.append(f)
    return out


def expand(paths: list[Path], names: tuple[str, ...], patterns: bool) -> list[Path]:
    """Files as given; a folder expands to its files whose names end with one of `names`,
    those of its subfolders too, and (with `patterns`) a path with *, ? or ** (any folders
    below) that is not a file to the files it matches, each in order (`lrm.io.in_order`:
    a/day2 before a/day10 before b/day1)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            work: list[Path] = []
            found = io.in_order(f for f in _files_below(p, work) if f.name.endswith(names))
            if skipped := [f for f in work if f.name.endswith(names)]:
                log.warning("%s: %d file(s) under a name that starts with _ not read (%s): a "
                            "job's work files (Spark, Hadoop), not its output; rename them to "
                            "read them", p, len(skipped), skipped[0])
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


def given(files: list[Path] | None, listed: Sequence[str], command: str, key: str
          ) -> list[Path]:
    """The inputs named on the command line, else those of params key `key`; none is an
    error saying both."""
    chosen = list(files or []) or [Path(f) for f in listed]
    if not chosen:
        raise ConfigError(f"{command}: no input files; pass FILE... or set {key}")
    return chosen

"""Errors that carry enough context for a user to fix their input."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


class LrmError(Exception):
    """Base class: an error the CLI reports as one line and exit status 2."""


@dataclass
class DataError(LrmError):
    """Bad input data, located to the file, line (1-based) and field."""

    file: Path | str
    line: int | None
    field: str | None
    message: str

    def __str__(self) -> str:
        where = str(self.file)
        if self.line is not None:
            where += f", line {self.line}"
        if self.field is not None:
            where += f", field {self.field}"
        return f"{where}: {self.message}"


class ConfigError(LrmError):
    """A params.yaml value that cannot work, with the key and why."""


class OutputError(LrmError):
    """An output path lrm must not replace (not written by lrm, or by another stage), or an
    output that overlaps an input or another output."""


class LockedError(LrmError):
    """An output or checkpoint folder another run (or this process) holds the lock on."""


def first_sentence(text: str, limit: int = 200) -> str:
    """A library's message cut to its first sentence for a one-line error (terminal escapes
    dropped: torch colours its advice)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text).strip()
    first = text.splitlines()[0] if text else ""
    return first.split(". ")[0][:limit]

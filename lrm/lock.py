"""TEMPORARY placeholder (replaced by the io branch): exclusive locks on output folders."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from pathlib import Path


@contextlib.contextmanager
def exclusive_all(paths: Iterable[Path], purpose: str = "") -> Iterator[None]:
    yield

"""Progress: a rich bar on a terminal, plain periodic log lines otherwise (DVC, Prefect, CI).

Every line carries the context it belongs to: `context(stage="student", student="small",
variant="aux_head", day=4)` labels everything logged or reported inside it, so lines from
a flow that runs many models say which one they are.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import time
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

_console = Console(stderr=True)
_context: contextvars.ContextVar[tuple[tuple[str, object], ...]] = contextvars.ContextVar(
    "lrm_progress_context", default=())


@contextlib.contextmanager
def context(**labels: object) -> Iterator[None]:
    """Label every progress and log line inside the block (nested labels add up)."""
    token = _context.set(_context.get() + tuple((k, v) for k, v in labels.items()
                                                 if v is not None))
    try:
        yield
    finally:
        _context.reset(token)


def where() -> str:
    """The current context as text: "student small/aux_head day 4" style, "" outside."""
    parts = []
    for k, v in _context.get():
        parts.append(str(v) if k in ("stage", "student", "variant") else f"{k} {v}")
    return " ".join(parts)


class _ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        ctx = where()
        record.lrm_context = f"[{ctx}] " if ctx else ""
        return True


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler on sys.stderr as it is at each line, not as it was when set up (a process
    that swaps it, such as a CLI runner calling commands one after another, would otherwise
    leave lrm writing to a closed stream: logging's own last-resort handler does the same)."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def setup_logging(level: int = logging.INFO) -> None:
    """lrm's own lines at `level` on stderr, each with its context; every other logger
    (torchrec, fbgemm's "Successfully loaded" lines, ...) only from WARNING."""
    lrm_log = logging.getLogger("lrm")
    lrm_log.setLevel(level)
    if not any(getattr(h, "_lrm", False) for h in lrm_log.handlers):
        h = _Stderr()
        h._lrm = True  # type: ignore[attr-defined]
        h.addFilter(_ContextFilter())
        h.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s %(lrm_context)s%(message)s", "%H:%M:%S"))
        lrm_log.addHandler(h)
        lrm_log.propagate = False
    root = logging.getLogger()
    if root.level == logging.NOTSET or root.level < logging.WARNING:
        root.setLevel(logging.WARNING)


def is_interactive() -> bool:
    return _console.is_terminal


class Reporter:
    """Advance-by-amount progress with optional live stats, terminal or log lines.

    Use as a context manager; `update(n, **stats)` adds `n` units of work and shows the
    latest stats (e.g. samples/s, NE) next to the bar or in the next log line.
    """

    def __init__(self, desc: str, total: float | None = None, unit: str = "it",
                 log_every_s: float = 5.0) -> None:
        self.desc, self.total, self.unit, self.log_every_s = desc, total, unit, log_every_s
        self.done = 0.0
        self.stats: dict[str, float] = {}
        self._progress: Progress | None = None
        self._task = None
        self._t0 = self._last_log = 0.0

    def __enter__(self) -> Reporter:
        self._t0 = self._last_log = time.monotonic()
        if is_interactive():
            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[stats]}"),
                console=_console, transient=False,
            )
            self._progress.start()
            ctx = where()
            desc = f"{ctx}: {self.desc}" if ctx and ctx != self.desc else self.desc
            self._task = self._progress.add_task(desc, total=self.total, stats="")
        return self

    def _fmt(self) -> str:
        return " ".join(f"{k}={v:.4g}" for k, v in self.stats.items())

    def update(self, n: float = 1, **stats: float) -> None:
        self.done += n
        self.stats.update(stats)
        if self._progress is not None:
            self._progress.update(self._task, advance=n, stats=self._fmt())
            return
        now = time.monotonic()
        if now - self._last_log >= self.log_every_s:
            self._last_log = now
            self._log_line(now)

    def _log_line(self, now: float) -> None:
        total = f"/{self.total:.0f}" if self.total else ""
        rate = self.done / max(now - self._t0, 1e-9)
        ctx = where()
        desc = f"{ctx}: {self.desc}" if ctx and ctx != self.desc else self.desc
        print(f"[{desc}] {self.done:.0f}{total} {self.unit} "
              f"({rate:.4g} {self.unit}/s) {self._fmt()}".rstrip(), file=sys.stderr, flush=True)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
        else:
            self._log_line(time.monotonic())


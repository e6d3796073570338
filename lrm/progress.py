"""Progress: a rich bar on a terminal, plain periodic log lines otherwise (DVC, Prefect, CI)."""

from __future__ import annotations

import sys
import time

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
            self._task = self._progress.add_task(self.desc, total=self.total, stats="")
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
        print(f"[{self.desc}] {self.done:.0f}{total} {self.unit} "
              f"({rate:.4g} {self.unit}/s) {self._fmt()}".rstrip(), file=sys.stderr, flush=True)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
        else:
            self._log_line(time.monotonic())


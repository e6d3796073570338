"""lrm's log lines: on sys.stderr as it is when a line is written."""

from __future__ import annotations

import io
import logging
import sys

from lrm import progress


def test_log_lines_follow_stderr_when_a_runner_swaps_it(monkeypatch):
    """A CLI runner gives each command its own stderr and closes it after: lrm's lines of a
    later command go to that command's stream, never to the closed one ("Logging error")."""
    lrm_log = logging.getLogger("lrm")
    monkeypatch.setattr(lrm_log, "handlers", [])  # set up afresh, undone after the test
    monkeypatch.setattr(lrm_log, "propagate", lrm_log.propagate)
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    progress.setup_logging()
    lrm_log.info("the first command")
    first.close()
    monkeypatch.setattr(sys, "stderr", second)
    progress.setup_logging()  # the second command sets up again: one handler still
    lrm_log.info("the second command")
    out = second.getvalue()
    assert "the second command" in out and "Logging error" not in out, out
    assert len(lrm_log.handlers) == 1

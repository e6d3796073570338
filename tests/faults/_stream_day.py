"""The stream day the kill test SIGKILLs: `flows.streaming.streaming` for the stream's next
day, in a process forked from the fault suite's forkserver (tests.faults.kills.forkserver:
torch, Prefect, MLflow and lrm imported once; a fresh interpreter would pay ~8 s a start).

The child talks to the test's Prefect server (the parent's prefect_test_harness): an
ephemeral server of its own would cost ~10 s a start, and a SIGKILL would leave it behind.
Every model the day trains wins against its champion (`judge` planted, as in the flow
tests' failed day), so each day has promotions that must wait for the day's end; the day's
report takes `report_s` longer, a window between the day's last decision and its
promotions that the test aims a kill at (as _killable slows fsync)."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Mapping
from typing import Any

from prefect.settings import PREFECT_API_URL, temporary_settings

from flows.streaming import streaming
from lrm import registry
from lrm.streaming import report

_judge = registry.judge
_markdown = report.markdown


def _the_day_wins(challenger_ne: float, champion_ne: float | None,
                  margin: float) -> tuple[bool, str]:
    if champion_ne is None:
        return _judge(challenger_ne, champion_ne, margin)
    return True, "planted: the day's model wins"


def run(spec: dict[str, Any]) -> None:
    """spec: root (the folder the flow runs in), params (a params file), mlflow (the
    tracking URI), prefect_api (the harness's API URL), tmp (for the process group's
    FileStore: a killed day leaves it behind), report_s."""
    tempfile.tempdir = spec["tmp"]
    os.environ["MLFLOW_TRACKING_URI"] = spec["mlflow"]
    os.chdir(spec["root"])
    registry.judge = _the_day_wins  # type: ignore[assignment]

    def slow_markdown(record: Mapping[str, Any]) -> str:
        time.sleep(spec["report_s"])
        return _markdown(record)

    report.markdown = slow_markdown  # type: ignore[assignment]
    with temporary_settings(updates={PREFECT_API_URL: spec["prefect_api"]}):
        state = streaming(days=1, params=[spec["params"]], return_state=True)
    if not state.is_completed():
        sys.exit(f"the stream day failed: {state.message}")

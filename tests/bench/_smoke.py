"""Test helper: run a benchmark as a user does (`python bench/NAME.py --smoke`), and read
back its JSON lines, each checked against the format readers rely on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.common import SMOKE_ENV, check_line

REPO = Path(__file__).resolve().parents[2]


def smoke(name: str, *args: str, timeout: float = 600) -> list[dict[str, Any]]:
    """`python bench/NAME.py --smoke ARGS` from the repo root: its result lines, each
    checked (bench.common.check_line); fails the test on a non-zero exit, with its stderr."""
    env = {k: v for k, v in os.environ.items() if k != SMOKE_ENV}  # the flag, not inherited
    r = subprocess.run([sys.executable, str(REPO / "bench" / f"{name}.py"), "--smoke", *args],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"bench/{name}.py --smoke exited {r.returncode}:\n" \
                              f"{r.stderr[-4000:]}"
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert lines, f"bench/{name}.py --smoke printed no result line:\n{r.stdout[-2000:]}"
    for rec in lines:
        check_line(rec)
        assert rec.get("smoke") is True, rec  # every line says it is a smoke run's
    return lines


def benches(lines: list[dict[str, Any]]) -> set[str]:
    return {x["bench"] for x in lines}


def cases(lines: list[dict[str, Any]], bench: str) -> list[str]:
    return [x["case"] for x in lines if x["bench"] == bench]

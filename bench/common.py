"""Benchmark helpers: the JSON line format every bench/*.py prints (see DESIGN.md)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any


def machine() -> str:
    """A short description of the machine the figures come from."""
    import torch

    from lrm.dist import cpu_name

    cpu = cpu_name()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{os.cpu_count()} cores, {cpu}, {gpu}, torch {torch.__version__}"


DEVICE: list[str | None] = [None]  # set by a bench that runs on a chosen device (--device)


def emit(bench: str, case: str, unit: str, candidate: float, baseline: float, better: str,
         **extra: Any) -> dict[str, Any]:
    """Print one JSON line; ratio > 1 always means the project wins."""
    if better not in ("higher", "lower"):
        raise ValueError(better)
    ratio = candidate / baseline if better == "higher" else baseline / candidate
    rec = {"bench": bench, "case": case, "unit": unit, "candidate": candidate,
           "baseline": baseline, "ratio": round(ratio, 4), "better": better,
           "machine": machine(), **({"device": DEVICE[0]} if DEVICE[0] else {}), **extra}
    print(json.dumps(rec), flush=True)
    return rec


def best_time(fn: Callable[[], Any], repeat: int = 3) -> float:
    """Best wall time of `repeat` calls (seconds): least disturbed by other load."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best

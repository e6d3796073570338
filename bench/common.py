"""Benchmark helpers: the JSON line format every bench/*.py prints (see DESIGN.md), the
machine it names, and the sizes a run takes (full, --quick, --smoke).

A line: {"bench", "case", "unit", "candidate", "baseline", "ratio", "better", "machine",
"load_avg", ...}; ratio > 1 always means the project wins; `machine` is `machine()`
(the CPU, the ISA that sets its kernels, the cores, torch's build, the GPU).

--smoke (or LRM_BENCH_SMOKE=1, which child processes inherit) runs every case of a benchmark
at tiny sizes, seconds each: it checks that the benchmark still runs and prints its lines
(`check_line`), not any figure. tests/bench runs each one so; `python -m bench` runs them
all and says which failed.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SMOKE_ENV = "LRM_BENCH_SMOKE"
FIELDS = ("bench", "case", "unit", "candidate", "baseline", "ratio", "better", "machine")
MACHINE_FIELDS = ("cpu", "isa", "cores", "torch", "gpu")
# the ISA extensions that decide which kernels torch, oneDNN and fbgemm run on x86
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
             "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")


def add_mode_flags(ap: argparse.ArgumentParser, quick_help: str = "small sizes, under a "
                   "minute") -> None:
    """--quick and --smoke, the sizes every benchmark offers."""
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help=quick_help)
    mode.add_argument("--smoke", action="store_true",
                      help="tiny sizes, seconds: that every case runs and prints its lines "
                           f"(no figure to read; also {SMOKE_ENV}=1)")


def use_mode(args: argparse.Namespace) -> bool:
    """Apply the parsed flags: --smoke sets SMOKE_ENV (children inherit it) and implies
    --quick. Returns whether the quick sizes (or smaller) apply."""
    if getattr(args, "smoke", False):
        os.environ[SMOKE_ENV] = "1"
    if smoke():
        args.quick = True
    return bool(getattr(args, "quick", False))


def smoke() -> bool:
    """Whether this process (or the benchmark that started it) runs at smoke sizes."""
    return os.environ.get(SMOKE_ENV, "") not in ("", "0")


def shared_data() -> Path:
    """The real samples beside the repo: LRM_SHARED_DATA, else ../shared/data (as the
    tests' conftest reads them); a benchmark skips a log that is absent there."""
    return Path(os.environ.get("LRM_SHARED_DATA",
                               Path(__file__).resolve().parents[2] / "shared" / "data"))


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    out: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                k, _, v = line.partition(":")
                out[k.strip()] = v.strip()
    except OSError:
        pass
    return out


@functools.lru_cache(maxsize=1)
def machine() -> dict[str, Any]:
    """The machine the figures come from: CPU model (and x86 family/model, which names
    the core generation where the model name does not), the ISA extensions its kernels
    use, the cores this process may run on, torch's version, build and the CPU kernels it
    picked, and the GPU if any."""
    import torch

    from lrm.dist import cpu_name

    info = _cpuinfo()
    flags = set(info.get("flags", "").split())
    gpu = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        gpu = {"name": p.name, "count": torch.cuda.device_count(),
               "capability": f"{p.major}.{p.minor}", "memory_gb": round(p.total_memory / 2**30)}
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return {
        "cpu": cpu_name(),
        "cpu_id": (f"{info['vendor_id']} family {info['cpu family']} model {info['model']}"
                   if {"vendor_id", "cpu family", "model"} <= info.keys()
                   else platform.machine()),
        "isa": [f for f in ISA_FLAGS if f in flags],
        "cores": cores,
        "torch": torch.__version__,
        "torch_cpu_kernels": torch.backends.cpu.get_cpu_capability(),
        "cuda": torch.version.cuda,
        "gpu": gpu,
    }


DEVICE: list[str | None] = [None]  # set by a bench that runs on a chosen device (--device)


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def emit(bench: str, case: str, unit: str, candidate: float, baseline: float, better: str,
         **extra: Any) -> dict[str, Any]:
    """Print one JSON line; ratio > 1 always means the project wins."""
    if better not in ("higher", "lower"):
        raise ValueError(better)
    ratio = candidate / baseline if better == "higher" else baseline / candidate
    return record({"bench": bench, "case": case, "unit": unit, "candidate": candidate,
                   "baseline": baseline, "ratio": round(ratio, 4), "better": better,
                   **extra})


def record(rec: dict[str, Any]) -> dict[str, Any]:
    """Print a line built by hand (a baseline that did not finish, say), with the machine,
    the load and the device added like emit's; checked against the format under --smoke."""
    rec = {**rec, "machine": machine(), **({"device": DEVICE[0]} if DEVICE[0] else {})}
    rec.setdefault("load_avg", _load())
    if smoke():
        rec["smoke"] = True
        check_line(rec)
    print(json.dumps(rec), flush=True)
    return rec


def check_line(rec: dict[str, Any]) -> None:
    """Raise ValueError unless `rec` has the fields a reader relies on: the line's names
    and unit, finite numbers for candidate, baseline and ratio (a baseline that did not
    finish may be null with a `baseline_outcome` saying why), `better`, and the machine."""
    missing = [k for k in FIELDS if k not in rec]
    if missing:
        raise ValueError(f"bench line lacks {missing}: {rec}")
    for k in ("bench", "case", "unit"):
        if not isinstance(rec[k], str) or not rec[k]:
            raise ValueError(f"bench line's {k} is not a name: {rec[k]!r}")
    if rec["better"] not in ("higher", "lower"):
        raise ValueError(f"bench line's better is {rec['better']!r}")
    for k in ("candidate", "baseline", "ratio"):
        v = rec[k]
        if v is None and k != "candidate" and "baseline_outcome" in rec:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"bench line {rec['bench']} / {rec['case']}: {k} is {v!r}")
    m = rec["machine"]
    if not isinstance(m, dict) or any(k not in m for k in MACHINE_FIELDS):
        raise ValueError(f"bench line's machine lacks {MACHINE_FIELDS}: {m!r}")


def best_time(fn: Callable[[], Any], repeat: int = 3) -> float:
    """Best wall time of `repeat` calls (seconds): least disturbed by other load."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best

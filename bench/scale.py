"""Cost as a day grows: `python bench/scale.py [--quick | --full]` prints one JSON line per
stage, size and measure.

One synthetic day of the default world (100k users, 10k ads, sessions of 8 impressions,
histories of up to 100 ads) at 1M and 10M impressions (and 50M with --full; --quick: 0.05M
and 0.2M), through the stages a user runs, each in a process of its own, one after the
other on the machine's cores:

    generate   lrm.data.synthetic.generate: the day's impressions (lrm generate)
    dedup      lrm.data.dedup.dedup_dataset: impressions -> sessions (lrm dedup)
    train      one pass of the default student over the day (lrm train: epochs 1, no
               validation slice, no checkpoints), then its end-of-run score with intervals
               on a held-out day as large as the day: the day itself (a cost, not a quality
               figure; a run's held-out day can be as large as its train days)
    evaluate   lrm.train.evaluate.evaluate of that model on the day (lrm evaluate: NE, AUC,
               calibration, 200 bootstrap resamples)

Per stage and size two lines, the smallest size the baseline of both: seconds per million
impressions of the stage's own call (not the interpreter's start), better lower (ratio > 1:
the larger day costs less per impression; the aim is ratio >= 1/1.2 at every size), and
the process's peak resident memory (getrusage of the child), better lower (the aim: flat,
bounded by a chunk or a batch, not the day). Every line gives the machine, its load and
the allocator of Arrow's buffers (`arrow_pool`: lrm.data.parquet.ARROW_POOL; set
ARROW_DEFAULT_MEMORY_POOL=mimalloc to measure pyarrow's own default).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import emit  # noqa: E402
from lrm.config import GenerateConfig  # noqa: E402

import pyarrow as pa  # noqa: E402  # after lrm, which picks its C++ pool (lrm/__init__.py)

STAGES = ("generate", "dedup", "train", "evaluate")
SIZES = {"quick": (50_000, 200_000), "default": (1_000_000, 10_000_000),
         "full": (1_000_000, 10_000_000, 50_000_000)}


def _world(sessions: int) -> GenerateConfig:
    return GenerateConfig(days=1, sessions_per_day=sessions)


def _sessions(impressions: int) -> int:
    return max(1, round(impressions / GenerateConfig().mean_session_length))


def stage(name: str, size: int, root: Path) -> dict[str, Any]:
    """Run one stage of the day of `size` impressions in `root` (in this process): its
    seconds and the impressions it went through."""
    from lrm.config import DedupConfig, LoaderConfig, ModelConfig, TrainConfig
    from lrm.data import dedup, synthetic
    from lrm.dist import quiet_libraries
    from lrm.train import TrainJob, train
    from lrm.train.evaluate import evaluate

    quiet_libraries()
    t0 = time.perf_counter()
    if name == "generate":
        rows = synthetic.generate(_world(_sessions(size)), root / "raw")["rows"]
    elif name == "dedup":
        rows = dedup.dedup_dataset(root / "raw", root / "sessions", DedupConfig())["rows"]
    elif name == "train":
        # the day itself as the held-out day, hard-linked (no bytes): train refuses to hold
        # out its own train data
        held = root / "held_out"
        if not held.exists():
            shutil.copytree(root / "sessions", held, copy_function=os.link)
        t0 = time.perf_counter()
        r = train(TrainJob(kind="student", train=TrainConfig(val_fraction=0.0),
                           model=ModelConfig(), data=root / "sessions", loader=LoaderConfig(),
                           out=root / "model", eval_data=held))
        rows = r.samples
    elif name == "evaluate":
        rows = evaluate(root / "model", root / "sessions", day=0)["rows"]
    else:
        raise ValueError(name)
    return {"seconds": time.perf_counter() - t0, "rows": rows}


def _child(name: str, size: int, root: Path) -> dict[str, Any]:
    """`stage` in a child process: its result and the child's peak RSS (MB)."""
    cmd = [sys.executable, __file__, "--stage", name, "--size", str(size), "--root", str(root)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        raise SystemExit(f"scale: stage {name} at {size} impressions exited {p.returncode}")
    return {**json.loads(out.strip().splitlines()[-1]), "peak_mb": usage.ru_maxrss / 1024,
            "cpu_seconds": usage.ru_utime + usage.ru_stime}  # the whole process's


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="0.05M and 0.2M: under a minute")
    mode.add_argument("--full", action="store_true", help="1M, 10M and 50M impressions")
    ap.add_argument("--stage", choices=STAGES, help=argparse.SUPPRESS)  # a child's work
    ap.add_argument("--size", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.stage:
        print(json.dumps(stage(args.stage, args.size, args.root)), flush=True)
        return
    sizes = SIZES["quick" if args.quick else "full" if args.full else "default"]
    results: dict[int, dict[str, dict[str, Any]]] = {}
    load = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="lrm-bench-scale-") as tmp:
        for size in sizes:
            root = Path(tmp) / f"day-{size}"
            root.mkdir()
            results[size] = {name: _child(name, size, root) for name in STAGES}
            subprocess.run(["rm", "-rf", str(root)], check=True)  # the next day's disk
    base = sizes[0]
    common = {"sizes": list(sizes), "load_avg": [load, [round(x, 2) for x in os.getloadavg()]],
              "cpus": os.cpu_count(), "arrow_pool": pa.default_memory_pool().backend_name}
    for name in STAGES:
        b = results[base][name]
        b_per = b["seconds"] / (b["rows"] / 1e6)
        for size in sizes:
            r = results[size][name]
            per = r["seconds"] / (r["rows"] / 1e6)
            emit(f"scale.{name}", f"{size / 1e6:g}M impressions vs {base / 1e6:g}M: seconds "
                 f"per million impressions", "s/M impressions", per, b_per, "lower",
                 aim=round(1 / 1.2, 4), rows=r["rows"], seconds=r["seconds"],
                 process_cpu_s_per_m=round(r["cpu_seconds"] / (r["rows"] / 1e6), 3),
                 **common)
            emit(f"scale.{name}", f"{size / 1e6:g}M impressions vs {base / 1e6:g}M: peak "
                 f"resident memory", "MB", r["peak_mb"], b["peak_mb"], "lower", rows=r["rows"],
                 **common)


if __name__ == "__main__":
    main()

"""Issue 30/49's GPU section in one call: `python bench/gpu.py --out DIR [--budget S]`.

A lent GPU machine comes with minutes, not hours (one call of at most 10 minutes; the
machine's start counts too), so every GPU figure the project asks for is one step of this
script, run one after another in one process tree, each killed at its own limit and the
steps that no longer fit the budget skipped (said, not silent):

    train_2048       bench/train.py --device cuda --only vs_torchrec --batch 2048
    train_16384      the same at 16384 (the GPU aims of vs_torchrec are at 2048 and 16384)
    train_65536      the same at 65536, where the device's work, not the host's, sets the step
    dedup_65536      bench/train.py --device cuda --only dedup --batch 65536 (RecD's saving)
    fp8              bench/fp8.py --quick: the per-layer probe on the GPU's real FP8 kernels
                     and FP8 end to end on the student and the FM (dispatched vs not, NE)
    calibrate        python -m lrm.sharding.calibrate --device cuda --quick: the sharding
                     cost model's kernel terms timed on this GPU (DIR/calibration-cuda.json;
                     copy it to lrm/sharding/calibration/cuda.json to plan with it)

DIR gets gpu.jsonl (every benchmark line, each naming the machine), gpu.log (the steps'
stderr) and summary.json (per step: status, lines, seconds); the summary is printed too.
The exit status is 1 when a step failed or did not fit the budget. Before any step the
script checks that the packages the steps import are there and names the missing ones (the
GPU machine has no torchrec, fbgemm-gpu or polars: ../shared/gpu/README.md says how they
travel, and docs/performance.md the device call).

`--smoke` runs the same steps on the CPU at tiny sizes (seconds each): tests/bench does so,
so that a flag a step passes cannot rot unseen while no GPU is lent.

Not a benchmark of its own (`python -m bench` skips it): it runs the others.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
# what the steps import beyond torch (the GPU machine's image has pyarrow, yaml and rich)
NEEDS = ("fbgemm_gpu", "torchrec", "polars", "pyarrow", "yaml", "rich")


class Step(NamedTuple):
    name: str
    argv: tuple[str, ...]  # after the interpreter
    limit_s: float  # killed after this long (failed)


def steps(device: str, out: Path, smoke: bool) -> list[Step]:
    """The GPU section's steps, on `device`; `smoke`: tiny sizes (a CPU check)."""
    mode = ("--smoke",) if smoke else ()
    train = ("bench/train.py", "--device", device, *mode)
    batch = (lambda b: str(min(b, 256))) if smoke else str  # smoke: the rows stay tiny
    return [
        Step("train_2048", (*train, "--only", "vs_torchrec", "--batch", batch(2048)), 120),
        Step("train_16384", (*train, "--only", "vs_torchrec", "--batch", batch(16384)), 120),
        Step("train_65536", (*train, "--only", "vs_torchrec", "--batch", batch(65536)), 120),
        Step("dedup_65536", (*train, "--only", "dedup", "--batch", batch(65536)), 90),
        Step("fp8", ("bench/fp8.py", *(mode or ("--quick",))), 150),
        Step("calibrate", ("-m", "lrm.sharding.calibrate", "--device", device, "--quick",
                           "--repeat", "1" if smoke else "3",
                           "--out", str(out / f"calibration-{device}.json")), 90),
    ]


def missing() -> list[str]:
    """The packages of NEEDS this interpreter cannot import."""
    return [m for m in NEEDS if importlib.util.find_spec(m) is None]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/gpu.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for the results")
    ap.add_argument("--budget", type=float, default=540.0,
                    help="seconds for all steps; a step whose limit no longer fits is "
                         "skipped (default 540: one device call of 10 minutes)")
    ap.add_argument("--smoke", action="store_true",
                    help="the same steps on the CPU at tiny sizes (that they still run)")
    ap.add_argument("--only", nargs="+", default=None, metavar="STEP", help="these steps")
    args = ap.parse_args(argv)
    from bench.__main__ import run_one  # the runner `python -m bench` uses: lines checked

    device = "cpu" if args.smoke else "cuda"
    lacking = missing()
    if lacking:
        print(f"error: bench/gpu.py: missing {', '.join(lacking)}: install them first "
              "(../shared/gpu/README.md; docs/performance.md, 'On a GPU')", file=sys.stderr)
        return 2
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("error: bench/gpu.py: torch sees no CUDA device here (--smoke runs the "
                  "steps on the CPU)", file=sys.stderr)
            return 2
    chosen = steps(device, args.out, args.smoke)
    known = {s.name for s in chosen}
    for n in args.only or ():
        if n not in known:
            ap.error(f"no step {n!r} (known: {', '.join(sorted(known))})")
    chosen = [s for s in chosen if not args.only or s.name in args.only]
    args.out.mkdir(parents=True, exist_ok=True)
    t0, summary = time.perf_counter(), []
    lines_f = (args.out / "gpu.jsonl").open("w")
    log_f = (args.out / "gpu.log").open("w")
    real_stdout, real_stderr = sys.stdout, sys.stderr
    os.chdir(ROOT)
    try:
        for s in chosen:
            left = args.budget - (time.perf_counter() - t0)
            if s.limit_s > left:
                summary.append({"step": s.name, "status": "skipped",
                                "why": f"{left:.0f} s of the budget left, its limit "
                                       f"{s.limit_s:.0f} s"})
                continue
            # run_one echoes the step's stdout / stderr: into the files, not the terminal
            sys.stdout, sys.stderr = lines_f, log_f
            try:
                if s.argv[0] == "-m":  # a module, not a benchmark: no result lines to check
                    o = _run_module(s)
                else:
                    o = run_one(s.name, ROOT / s.argv[0], list(s.argv[1:]), s.limit_s)
            finally:
                sys.stdout, sys.stderr = real_stdout, real_stderr
                lines_f.flush()
                log_f.flush()
            summary.append({"step": s.name, "status": "failed" if o.problem else "ok",
                            "lines": o.lines, "seconds": round(o.seconds, 1),
                            **({"why": o.problem} if o.problem else {})})
            print(json.dumps(summary[-1]), file=sys.stderr, flush=True)
    finally:
        lines_f.close()
        log_f.close()
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({"steps": summary, "seconds": round(time.perf_counter() - t0, 1)},
                     indent=1))
    return 1 if any(x["status"] != "ok" for x in summary) else 0


def _run_module(s: Step):  # noqa: ANN202 (bench.__main__.Outcome)
    """A `python -m MODULE` step (the calibration): its exit status and time."""
    import subprocess

    from bench.__main__ import Outcome

    t = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, *s.argv], cwd=ROOT, capture_output=True,
                           text=True, timeout=s.limit_s)
        rc, err, problem = r.returncode, r.stderr, f"exit status {r.returncode}"
    except subprocess.TimeoutExpired as e:
        rc, err, problem = -9, str(e.stderr or ""), f"killed after {s.limit_s:.0f} s"
    sys.stderr.write(err)
    return Outcome(s.name, rc, 0, time.perf_counter() - t, problem if rc else "", err[-3000:])


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())

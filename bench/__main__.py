"""Every benchmark, one after the other: `python -m bench [--quick | --smoke] [NAME ...]`.

Each bench/NAME.py runs in a process of its own (as `python bench/NAME.py`), its JSON lines
passed through to stdout as they come and checked (bench.common.check_line); a benchmark
that exits non-zero, prints a line a reader cannot use, or prints none has failed. The
others still run: the summary at the end (stderr) says which failed and why, with the tail
of each failure's stderr, and the exit status is 1 when any did. `make bench` is
`python -m bench --quick`; `--smoke` runs them all at tiny sizes (tests/bench does so one
by one).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, NamedTuple

BENCH_DIR = Path(__file__).resolve().parent
NOT_BENCHMARKS = {"__init__", "__main__", "common", "gpu"}  # gpu.py runs the others on a GPU


def benchmarks() -> dict[str, Path]:
    """name -> bench/NAME.py, every benchmark of this folder."""
    return {p.stem: p for p in sorted(BENCH_DIR.glob("*.py")) if p.stem not in NOT_BENCHMARKS}


class Outcome(NamedTuple):
    name: str
    returncode: int
    lines: int
    seconds: float
    problem: str  # "" when it passed
    stderr_tail: str


def run_one(name: str, path: Path, flags: list[str], timeout: float | None) -> Outcome:
    """Run one benchmark, echo its lines, and judge it."""
    from bench.common import check_line

    from_root = Path(__file__).resolve().parents[1]
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, str(path), *flags], cwd=from_root,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tail: deque[str] = deque(maxlen=30)

    def drain() -> None:  # stderr: the benchmark's progress, shown as it comes
        assert p.stderr is not None
        for line in p.stderr:
            tail.append(line)
            sys.stderr.write(line)

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    lines, bad = 0, ""
    assert p.stdout is not None
    try:
        for line in p.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if not line.startswith("{"):
                continue  # a benchmark's own note, not a result line
            lines += 1
            try:
                rec: dict[str, Any] = json.loads(line)
                check_line(rec)
            except ValueError as e:  # JSONDecodeError is one
                bad = bad or f"line {lines}: {e}"[:500]
        rc = p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
        bad = f"killed after {timeout:.0f} s"
    t.join(timeout=10)
    problem = (f"exit status {rc}" if rc else bad if bad else
               "printed no result line" if lines == 0 else "")
    return Outcome(name, rc, lines, time.perf_counter() - t0, problem, "".join(tail))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="each benchmark's --quick")
    mode.add_argument("--smoke", action="store_true", help="each benchmark's --smoke")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds a benchmark may take before it is killed (failed)")
    ap.add_argument("names", nargs="*", metavar="NAME",
                    help="benchmarks to run (bench/NAME.py, or a path to one; default: all)")
    args = ap.parse_args(argv)
    known = benchmarks()
    chosen: dict[str, Path] = {}
    for n in args.names or list(known):
        path = known.get(n) or (Path(n) if n.endswith(".py") and Path(n).is_file() else None)
        if path is None:
            ap.error(f"no benchmark {n!r} (known: {', '.join(known)})")
        chosen[path.stem] = path.resolve()
    flags = ["--smoke"] if args.smoke else ["--quick"] if args.quick else []
    outcomes = [run_one(n, p, flags, args.timeout) for n, p in chosen.items()]
    failed = [o for o in outcomes if o.problem]
    out = sys.stderr
    print(f"\n== bench {' '.join(flags) or '(full)'}: {len(outcomes) - len(failed)} passed, "
          f"{len(failed)} failed", file=out)
    for o in outcomes:
        print(f"  {'FAIL' if o.problem else 'ok  '} {o.name:<12} {o.lines:>3} lines "
              f"{o.seconds:7.1f} s  {o.problem}", file=out)
    for o in failed:
        print(f"\n-- {o.name}: {o.problem}; the end of its stderr:\n{o.stderr_tail}", file=out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    raise SystemExit(main())

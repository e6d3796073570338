"""python -m bench: every benchmark runs, and the end says which failed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.__main__ import benchmarks
from tests.bench._smoke import REPO

GOOD = """
import sys
sys.path.insert(0, {repo!r})
from bench.common import emit
emit("fake.good", "case", "s", 1.0, 2.0, "lower")
"""
FAILS = """
import sys
sys.path.insert(0, {repo!r})
from bench.common import emit
emit("fake.fails", "case", "s", 1.0, 2.0, "lower")
raise SystemExit(3)
"""
SILENT = "print('a note, no result')\n"
MALFORMED = 'print(\'{"bench": "fake.malformed", "case": "c"}\')\n'


def test_every_benchmark_runs_and_the_summary_names_the_failures(tmp_path: Path) -> None:
    files = {}
    for name, text in (("fails", FAILS), ("good", GOOD), ("silent", SILENT),
                       ("malformed", MALFORMED)):
        files[name] = tmp_path / f"{name}.py"
        files[name].write_text(text.replace("{repo!r}", repr(str(REPO))))
    # the failing one first: the ones after it still run
    r = subprocess.run([sys.executable, "-m", "bench", "--smoke",
                        *(str(files[n]) for n in ("fails", "good", "silent", "malformed"))],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr
    assert '"fake.good"' in r.stdout and '"fake.fails"' in r.stdout
    summary = r.stderr[r.stderr.index("== bench"):]
    assert "1 passed, 3 failed" in summary
    rows = {line.split()[1]: line for line in summary.splitlines()
            if line.startswith(("  ok", "  FAIL"))}
    assert rows["good"].startswith("  ok")
    assert "exit status 3" in rows["fails"]
    assert "no result line" in rows["silent"]
    assert "lacks" in rows["malformed"]


def test_all_pass_exit_zero(tmp_path: Path) -> None:
    f = tmp_path / "good.py"
    f.write_text(GOOD.replace("{repo!r}", repr(str(REPO))))
    r = subprocess.run([sys.executable, "-m", "bench", "--smoke", str(f)], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "1 passed, 0 failed" in r.stderr


def test_every_benchmark_has_a_smoke_test() -> None:
    """A benchmark added without its smoke run here would rot unseen."""
    names = set(benchmarks())
    assert {"data", "train", "checkpoint"} <= names
    here = Path(__file__).parent
    assert {n for n in names if not (here / f"test_{n}.py").exists()} == set()

"""data.logs: `lrm ingest logs` (lrm.data.logs) against polars' bare read of the same file.

The log: a click log of the shape the mapping is for (`_write_log`): one row per impression,
in time order, CSV with a header; a user id (~1 per 50 rows), a time over six days (sessions
of ~5 impressions), an item id (~1 per 200 rows, Zipf-popular), a 0/1 click (4%), two
categoricals and two dense columns (one heavy-tailed). The mapping: sessions by a 30-minute
gap, histories from the log (`auto`), days from the time, both categoricals and both dense
columns.

* speed (`logs_csv_N_rows`, rows/s): the whole ingest (read and check every column, spill by
  day and user bucket, vocabularies, sessions, positions, histories, scaled dense columns,
  zstd Parquet per day; into an atomic folder, no MLflow) against `pl.read_csv` of the same
  file, which parses it into memory and does nothing else: the ceiling, so the ratio is
  below 1 (the aim: 0.5). Alternating, the best of a few runs each.
* floor (`logs_csv_N_rows_vs_floor`, rows/s): the ingest against the least work any
  session-level ingest into Parquet does: `pl.read_csv`, a sort by user and time (sessions
  and histories are per user, in time order) and one zstd Parquet file, polars on every core.
  The main line's `ceiling` is that floor against the bare read: the most its ratio could be.
  The aim (`aim`): 0.8 of the floor.
* convert (`logs_csv_N_rows_convert`, rows/s): polars' own streaming CSV -> Parquet of the
  same file (`scan_csv(...).sink_parquet(zstd)`: no sort, no check, nothing of an ingest's
  own) against the bare read, with the same aim: where polars itself stands against it.
* memory (`logs_peak_rss_N_rows`, bytes): the peak RSS (VmHWM) of a fresh process that
  ingests the file, against one that reads it with `pl.read_csv`: ratio = read / ingest (> 1:
  the ingest holds less than the file). A second line puts the ingest's peak at N rows against its
  peak at N / 10 rows: bounded by a chunk, the ratio stays near 1 as the file grows.

Default: 1M rows (speed and memory); without --quick also 10M rows (memory; ~450 MB CSV).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from bench.common import emit, smoke
from lrm import io
from lrm.config import LogsConfig
from lrm.data.logs import ingest as logs

ROWS = 1_000_000
MAPPING = LogsConfig(label="clicked", user="user_id", item="item_id", time="ts",
                     session_gap="30m", categorical=["surface", "device"],
                     dense=["price", "dwell"])
CHUNK = 200_000
FLOOR_AIM = 0.8  # the ingest's rows/s against the floor's (issue 49)
SMOKE_ROWS, SMOKE_CHUNK = 20_000, 5_000  # --smoke: a file of several chunks all the same
REPO = Path(__file__).resolve().parents[2]


def _write_log(path: Path, rows: int, seed: int = 0) -> None:
    """The log, in time order, written a million rows at a time (bounded memory): sessions of
    ~5 impressions 20 s apart, each of a user drawn from rows / 50 (~10 sessions each over
    the six days), items Zipf-popular among rows / 200."""
    rng = np.random.default_rng(seed)
    t0, users, items = 1_573_257_600, max(1, rows // 50), max(1, rows // 200)
    per_block = 1_000_000
    with open(path, "wb") as f:
        for start in range(0, rows, per_block):
            n = min(per_block, rows - start)
            lens = rng.geometric(0.2, n // 2)
            lens = lens[:np.searchsorted(np.cumsum(lens), n) + 1]
            lens[-1] -= lens.sum() - n
            day0 = t0 + 6 * 86_400 * start // rows  # blocks follow each other in time
            begin = np.sort(rng.integers(day0, day0 + 6 * 86_400 * n // rows, len(lens)))
            at = np.repeat(begin, lens) + 20 * (np.arange(n) - np.repeat(np.cumsum(lens) - lens,
                                                                         lens))
            df = pl.DataFrame({
                "user_id": np.repeat(rng.integers(0, users, len(lens)), lens),
                "ts": at,
                "item_id": [f"i{x}" for x in rng.zipf(1.2, n) % items],
                "clicked": (rng.random(n) < 0.04).astype(np.int8),
                "surface": np.repeat(rng.choice(["home", "search", "feed", "related"],
                                                len(lens)), lens),
                "device": rng.integers(0, 12, n),
                "price": np.round(rng.normal(20, 5, n), 2),
                "dwell": np.round(rng.pareto(1.5, n) * 10, 1),
            }).sort("ts")
            f.write(df.write_csv(include_header=start == 0).encode())


def _chunk() -> int:
    return SMOKE_CHUNK if smoke() else CHUNK


def _ingest(path: Path, out: Path, chunk_rows: int = 0) -> dict:
    with io.atomic_dir(out) as d:
        return logs.ingest([path], d, MAPPING, chunk_rows=chunk_rows or _chunk())


def _speed(tmp: Path, rows: int, repeat: int) -> None:
    f, out = tmp / f"log_{rows}.csv", tmp / "out"
    if not f.exists():
        _write_log(f, rows)
    best = {"ingest": float("inf"), "read": float("inf"), "floor": float("inf"),
            "convert": float("inf")}
    # CPU seconds too (every thread of this process): a shared machine's load stretches
    # the wall times, and the floor's (polars on every core) more than the ingest's
    cpu = {"ingest": float("inf"), "floor": float("inf")}
    m: dict = {}
    for _ in range(repeat):  # alternating: load that comes and goes hits all four
        t = time.perf_counter()
        df = pl.read_csv(f)
        best["read"] = min(best["read"], time.perf_counter() - t)
        assert df.height == rows
        del df
        t, c = time.perf_counter(), time.process_time()
        _floor(f, tmp / "floor.parquet")
        best["floor"] = min(best["floor"], time.perf_counter() - t)
        cpu["floor"] = min(cpu["floor"], time.process_time() - c)
        t = time.perf_counter()
        _convert(f, tmp / "convert.parquet")
        best["convert"] = min(best["convert"], time.perf_counter() - t)
        shutil.rmtree(out, ignore_errors=True)
        t, c = time.perf_counter(), time.process_time()
        m = _ingest(f, out)
        best["ingest"] = min(best["ingest"], time.perf_counter() - t)
        cpu["ingest"] = min(cpu["ingest"], time.process_time() - c)
    assert m["rows"] == rows
    emit("data.logs", f"logs_csv_{rows}_rows", "rows/s", rows / best["ingest"],
         rows / best["read"], "higher", rows=rows, aim=0.5, csv_mb=round(f.stat().st_size / 1e6),
         parquet_mb=round(io.dir_bytes(out) / 1e6, 1), sessions=m["sessions"],
         days=m["days"], buckets=m["buckets"], chunk_rows=_chunk(),
         seconds=round(best["ingest"], 3), baseline_seconds=round(best["read"], 3),
         baseline_is="pl.read_csv of the same file (parse into memory, nothing else)",
         ceiling=round(best["read"] / best["floor"], 4))
    emit("data.logs", f"logs_csv_{rows}_rows_vs_floor", "rows/s", rows / best["ingest"],
         rows / best["floor"], "higher", rows=rows, aim=FLOOR_AIM,
         seconds=round(best["ingest"], 3),
         baseline_seconds=round(best["floor"], 3), cpu_seconds=round(cpu["ingest"], 3),
         baseline_cpu_seconds=round(cpu["floor"], 3),
         cpu_ratio=round(cpu["floor"] / cpu["ingest"], 4),
         baseline_is="pl.read_csv, sort by user and time, one zstd Parquet file: the least a "
                     "session-level ingest does")
    emit("data.logs", f"logs_csv_{rows}_rows_convert", "rows/s", rows / best["convert"],
         rows / best["read"], "higher", rows=rows, aim=0.5,
         seconds=round(best["convert"], 3), baseline_seconds=round(best["read"], 3),
         candidate_is="polars' streaming CSV -> zstd Parquet of the file, nothing else "
                      "(scan_csv(...).sink_parquet)",
         baseline_is="pl.read_csv of the same file (parse into memory, nothing else)")
    shutil.rmtree(out, ignore_errors=True)
    for name in ("floor.parquet", "convert.parquet"):
        (tmp / name).unlink(missing_ok=True)


def _floor(f: Path, out: Path) -> None:
    """The least work of any ingest of `f` into session-level Parquet (`_speed`'s floor)."""
    pl.read_csv(f).sort(MAPPING.user, MAPPING.time).write_parquet(out, compression="zstd")


def _convert(f: Path, out: Path) -> None:
    """polars' own CSV -> Parquet of `f`, streamed, and nothing else (`_speed`'s convert)."""
    pl.scan_csv(f).sink_parquet(out, compression="zstd")


_PEAK = """
import resource, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
what, f, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
if what == "read":
    import polars as pl
    assert pl.read_csv(f).height > 0
else:
    from bench.cases.data_logs import _ingest
    _ingest(f, out)
# VmHWM: this process image's own peak (ru_maxrss starts at the parent's RSS at fork)
hwm = [ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:")]
print(int(hwm[0].split()[1]) * 1024 if hwm else
      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def _peak(what: str, f: Path, out: Path) -> int:
    """Peak RSS (bytes) of a fresh process that reads or ingests `f`."""
    r = subprocess.run([sys.executable, "-c", _PEAK.format(repo=str(REPO)), what, str(f),
                        str(out)], capture_output=True, text=True, timeout=3600)
    if r.returncode:
        raise RuntimeError(r.stderr[-2000:])
    shutil.rmtree(out, ignore_errors=True)
    return int(r.stdout.strip().splitlines()[-1])


def _memory(tmp: Path, rows: int) -> None:
    small, big = tmp / f"log_{rows // 10}.csv", tmp / f"log_{rows}.csv"
    for f, n in ((small, rows // 10), (big, rows)):
        if not f.exists():
            _write_log(f, n)
    ingest_small = _peak("ingest", small, tmp / "o1")
    ingest_big = _peak("ingest", big, tmp / "o2")
    read_big = _peak("read", big, tmp / "o3")
    emit("data.logs", f"logs_peak_rss_{rows}_rows", "bytes", ingest_big, read_big, "lower",
         rows=rows, csv_mb=round(big.stat().st_size / 1e6), chunk_rows=_chunk(),
         baseline_is="peak RSS of pl.read_csv of the same file, in a fresh process",
         candidate_is="peak RSS of lrm.data.logs.ingest of the file, in a fresh process")
    emit("data.logs", f"logs_peak_rss_{rows}_vs_{rows // 10}_rows", "bytes", ingest_big,
         ingest_small, "lower", rows=rows, chunk_rows=_chunk(),
         baseline_is=f"peak RSS of the same ingest of a {rows // 10}-row file",
         candidate_is=f"peak RSS of the ingest of the {rows}-row file (bounded: ratio ~1)")


def run(quick: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="lrm-bench-logs-") as d:
        tmp = Path(d)
        if smoke():
            _speed(tmp, SMOKE_ROWS, repeat=1)
            _memory(tmp, SMOKE_ROWS)
            return
        _speed(tmp, ROWS, repeat=2 if quick else 3)
        _memory(tmp, ROWS)
        if not quick:
            _memory(tmp, ROWS * 10)

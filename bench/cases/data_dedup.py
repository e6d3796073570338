"""RecD benchmarks: storage of session Parquet vs impression Parquet, and loader throughput.

Data: the synthetic log at mean session length 8 with max_history 128, so the mean user
history is ~100 items (at the default 100 it is ~79). "default" is one day of the default
size (20,000 sessions, ~160k impressions), "10x" ten such days (skipped with --quick);
"history_heavy" one day of bench.cases.data_profiles.history_heavy (histories of ~840 ads). The impression file is the generator's log: sessions
in the order they happen. The sessions file is dedup's: a file's sessions sorted by user,
a user's sliding history stored once per run, an ad's attributes once per ad (the file's
item table, lrm.data.items).

Storage baselines, each written from the same rows: the impression file with the same
writer rules (lrm.data.parquet.write_options); with its own best rules ("tuned": no
dictionary on the history, so zstd finds its repeats); and tuned with its sessions sorted
by user like the sessions file ("tuned_clustered": zstd then also finds a user's shifted
histories, the strongest impression file we know). A case of several days also gives each
day's ratio (`day_ratios`): the same-rules impression file shrinks once its history
dictionary needs 14-bit indices (README, Data).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from bench.cases.data_profiles import history_heavy, tiny
from bench.common import best_time, emit, smoke
from lrm import io
from lrm.config import DedupConfig, GenerateConfig
from lrm.data import dedup, loader, parquet, synthetic
from lrm.data.loader import BatchLoader
from lrm.data.schema import day_files, part_path

SIZES = (("default", 1), ("10x", 10))  # case, days of the default size
BATCH = {"batch_size": 2048, "prefetch": 4, "num_workers": 1}  # LoaderConfig's defaults


def _config(days: int) -> GenerateConfig:
    if smoke():
        return tiny(days=days, max_history=128)
    return GenerateConfig(days=days, max_history=128)


def _plain_tuned_options(cfg: GenerateConfig) -> dict[str, Any]:
    """The plain layout's own best rules: no dictionary on the repeated history lists, so
    zstd's window finds each repeat (a dictionary's bit-packed indices hide them)."""
    sch = synthetic.schema(cfg)
    opts = parquet.write_options(sch.arrow("impressions"), "impressions")
    seq = {f"{c}.list.element" for c in sch.user_seq}
    return {**opts, "use_dictionary": [c for c in opts["use_dictionary"] if c not in seq]}


@contextmanager
def _dataset(cfg: GenerateConfig, tuned: bool = False) -> Iterator[tuple[Path, dict[str, Any]]]:
    """A temp folder with raw/ (impressions, one file per day), sessions/ (its dedup) and,
    if `tuned`, tuned/ (raw written with the plain layout's own best rules) and
    tuned_clustered/ (the same, in the sessions file's order)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rows = hist = 0
        for day in range(cfg.days):
            t = synthetic.generate_day(cfg, day)
            io.write_parquet(t, part_path(root / "raw", day),
                             **parquet.write_options(t.schema, "impressions"))
            if tuned:
                io.write_parquet(t, part_path(root / "tuned", day), **_plain_tuned_options(cfg))
            first = dedup.run_starts(t.column("session_id").to_numpy())
            lens = t.column("user_history").take(first).combine_chunks().value_lengths()
            rows, hist = rows + t.num_rows, hist + int(lens.to_numpy(zero_copy_only=False).sum())
            del t
        t0 = time.perf_counter()
        m = dedup.dedup_dataset(root / "raw", root / "sessions", DedupConfig())
        seconds = time.perf_counter() - t0
        if tuned:
            for day, files in day_files(root / "sessions").items():
                t = pa.concat_tables(dedup.flatten_sessions(parquet.read_table(f)) for f in files)
                io.write_parquet(t, part_path(root / "tuned_clustered", day),
                                 **_plain_tuned_options(cfg))
                del t
        sessions = m["sessions"]
        yield root, {"rows": rows, "sessions": sessions,
                     "mean_session_length": round(rows / sessions, 3),
                     "mean_history_length": round(hist / sessions, 1),
                     "history_stored_once_per": round(m["history_ratio"], 2),
                     "item_columns": m["item_columns"],
                     "dedup_s": round(seconds, 2)}


def run_storage(quick: bool = False) -> None:
    cases = [(case, _config(days)) for case, days in (SIZES[:1] if quick else SIZES)]
    for case, cfg in [*cases, ("history_heavy", history_heavy(quick))]:
        with _dataset(cfg, tuned=True) as (root, info):
            recd = float(io.dir_bytes(root / "sessions"))
            info = {**info, "max_history": cfg.max_history}

            def per_day(baseline: str) -> dict[str, Any]:  # each day's ratio, where several
                if cfg.days == 1:
                    return {}
                return {"day_ratios": [round(io.dir_bytes(root / baseline / f"day={d}")
                                             / io.dir_bytes(root / "sessions" / f"day={d}"), 2)
                                       for d in range(cfg.days)]}

            emit("data.storage", case, "bytes", recd, float(io.dir_bytes(root / "raw")),
                 "lower", baseline_is="impression Parquet, the same writer rules "
                 "(zstd 3, dictionary on integer columns)", **info, **per_day("raw"))
            emit("data.storage", f"{case}_vs_plain_tuned", "bytes", recd,
                 float(io.dir_bytes(root / "tuned")), "lower",
                 baseline_is="impression Parquet with its own best rules (no dictionary on "
                 "user_history: zstd then dedups the repeats itself)", **info,
                 **per_day("tuned"))
            emit("data.storage", f"{case}_vs_plain_tuned_clustered", "bytes", recd,
                 float(io.dir_bytes(root / "tuned_clustered")), "lower",
                 baseline_is="impression Parquet with its own best rules, its sessions sorted "
                 "by user like the sessions file (zstd also finds a user's shifted histories)",
                 **info, **per_day("tuned_clustered"))


def _pyarrow_read(ld: BatchLoader) -> int:
    """pyarrow's bare streaming read of the loader's files: the same columns as stored
    (an item table's stay in the footer), same chunks."""
    rows = loader.CHUNK_SESSIONS if ld.layout == "sessions" else loader.CHUNK_IMPRESSIONS
    n = 0
    for _, f in ld.files:
        pf = pq.ParquetFile(f)
        cols = [c for c in ld.columns if c in pf.schema_arrow.names]
        for rb in pf.iter_batches(batch_size=rows, columns=cols):
            n += rb.num_rows
    return n


def _drain(ld: BatchLoader) -> int:
    return sum(b.size for b in ld)


def run_loader(quick: bool = False) -> None:
    for case, days in SIZES[:1] if quick else SIZES:
        with _dataset(_config(days)) as (root, info):
            raw, ses = root / "raw", root / "sessions"
            n, repeat = info["rows"], (1 if smoke() else 3 if days == 1 else 2)
            recd = BatchLoader(ses, dedup=True, **BATCH)
            plain = BatchLoader(raw, dedup=False, **BATCH)
            recd_raw = BatchLoader(raw, dedup=True, **BATCH)
            assert _drain(recd) == _drain(plain) == n  # also warms the page cache
            t_recd = best_time(lambda: _drain(recd), repeat)
            t_plain = best_time(lambda: _drain(plain), repeat)
            t_recd_raw = best_time(lambda: _drain(recd_raw), repeat)
            t_read_ses = best_time(lambda: _pyarrow_read(recd), repeat)
            t_read_raw = best_time(lambda: _pyarrow_read(plain), repeat)
            extra = {**BATCH, **info}
            emit("data.loader", case, "samples/s", n / t_recd, n / t_plain, "higher",
                 candidate_is="dedup loader on the sessions layout",
                 baseline_is="plain loader on the impressions layout", **extra)
            emit("data.loader", f"{case}_dedup_vs_pyarrow_read", "samples/s", n / t_recd,
                 n / t_read_ses, "higher", baseline_is="pyarrow's streaming read (iter_batches) "
                 "of the session files, same columns and chunks (the ceiling)", **extra)
            emit("data.loader", f"{case}_plain_vs_pyarrow_read", "samples/s", n / t_plain,
                 n / t_read_raw, "higher", baseline_is="pyarrow's streaming read (iter_batches) "
                 "of the impression files, same columns and chunks (the ceiling)", **extra)
            emit("data.loader", f"{case}_dedup_from_impressions", "samples/s", n / t_recd_raw,
                 n / t_plain, "higher", candidate_is="dedup loader on the impressions layout",
                 baseline_is="plain loader on the impressions layout", **extra)

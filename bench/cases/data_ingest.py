"""data.ingest: Criteo TSV -> Parquet rows/s of lrm's ingest vs polars' bare read of the TSV.

The baseline is `pl.read_csv(tsv, separator="\\t", has_header=False)`: it parses the same
bytes into memory and does nothing else, so it is the ceiling and the ratio is below 1. The
candidate is the whole conversion the stage does (streamed chunks, validation of every field,
hex and DLRM transforms, zstd Parquet written through an atomic directory), without MLflow.

Input: the real sample's rows (../shared/data/criteo_sample) repeated to the size wanted, or,
where the sample is absent, synthetic rows in the Criteo format (said in the `source` field).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from bench.common import emit, shared_data, smoke
from lrm import io
from lrm.config import IngestConfig
from lrm.data import criteo

ROWS = 160_000  # default size (20 copies of the 8,000-row sample); 10x without --quick


def _synthetic_lines(n: int, seed: int = 0) -> list[str]:
    """Rows in the Criteo layout with the sample's rough profile (CTR, missing rates)."""
    rng = np.random.default_rng(seed)
    labels = (rng.random(n) < 0.22).astype(int)
    ints = np.minimum(rng.geometric(0.02, size=(n, 13)) - 2, 100_000)
    cats = rng.integers(0, 2**32, size=(n, 26)) % np.geomspace(10, 2**32, 26).astype(np.int64)
    int_missing, cat_missing = rng.random((n, 13)) < 0.3, rng.random((n, 26)) < 0.15
    out = []
    for r in range(n):
        i = ["" if int_missing[r, k] else str(ints[r, k]) for k in range(13)]
        c = ["" if cat_missing[r, k] else f"{cats[r, k]:08x}" for k in range(26)]
        out.append("\t".join([str(labels[r]), *i, *c]))
    return out


def _base_lines() -> tuple[list[str], str]:
    sample = shared_data() / "criteo_sample"
    if all((sample / f"{n}.tsv").exists() for n in ("train", "dev", "test")):
        lines = [x for n in ("train", "dev", "test")
                 for x in (sample / f"{n}.tsv").read_text().splitlines()]
        return lines, "criteo_sample"
    print(f"data.ingest: {sample} absent; using synthetic Criteo-format rows", file=sys.stderr)
    return _synthetic_lines(8000), "synthetic"


def _write_tsv(path: Path, base: list[str], rows: int) -> None:
    block = "\n".join(base) + "\n"
    with open(path, "w") as f:
        for _ in range(rows // len(base)):
            f.write(block)
        rest = rows % len(base)
        if rest:
            f.write("\n".join(base[:rest]) + "\n")


def _best(fn, setup, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        setup()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _case(tmp: Path, base: list[str], source: str, rows: int, repeat: int) -> None:
    tsv, out = tmp / f"criteo_{rows}.tsv", tmp / "out"
    _write_tsv(tsv, base, rows)
    cfg = IngestConfig()

    def bare() -> None:
        df = pl.read_csv(tsv, separator="\t", has_header=False)
        assert df.height == rows

    def ingest() -> None:
        with io.atomic_dir(out) as d:
            m = criteo.ingest([tsv], d, cfg)
        assert m["rows"] == rows

    t_bare = _best(bare, lambda: None, repeat)
    t_ingest = _best(ingest, lambda: shutil.rmtree(out, ignore_errors=True), repeat)
    emit("data.ingest", f"criteo_tsv_{rows}_rows", "rows/s", rows / t_ingest, rows / t_bare,
         better="higher", rows=rows, source=source, tsv_mb=round(tsv.stat().st_size / 1e6, 1),
         parquet_mb=round(io.dir_bytes(out) / 1e6, 1), chunk_rows=cfg.chunk_rows,
         seconds=round(t_ingest, 3), baseline_seconds=round(t_bare, 3))
    tsv.unlink()
    shutil.rmtree(out, ignore_errors=True)


def run(quick: bool) -> None:
    base, source = _base_lines()
    with tempfile.TemporaryDirectory(prefix="lrm-bench-ingest-") as d:
        if smoke():  # the sample once
            _case(Path(d), base, source, len(base), repeat=1)
            return
        _case(Path(d), base, source, ROWS, repeat=3)
        if not quick:
            _case(Path(d), base, source, ROWS * 10, repeat=2)

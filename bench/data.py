"""Data benchmarks: `python bench/data.py [--quick]` prints one JSON line per case.

data.storage  bytes of RecD session Parquet vs plain impression Parquet of the same data
data.loader   samples/s of the dedup loader vs the plain loader, and both vs pyarrow's bare read
data.ingest   Criteo rows/s vs polars' bare read of the same TSV
data.logs     `lrm ingest logs` rows/s vs polars' bare read of the same CSV, and its peak
              memory (a fresh process) vs the read's, at 1M and 10M rows
data.generate rows/s of the synthetic generator
Each at the default size and at 10x (the 10x case is skipped with --quick; --smoke: every
case once at tiny sizes, seconds, to check that it runs).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common  # noqa: E402
from bench.cases import data_dedup, data_generate, data_ingest, data_logs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    common.add_mode_flags(ap)
    ap.add_argument("--only", choices=["generate", "storage", "loader", "ingest", "logs"],
                    default=None)
    args = ap.parse_args()
    quick = common.use_mode(args)
    cases = {
        "generate": data_generate.run,
        "storage": data_dedup.run_storage,
        "loader": data_dedup.run_loader,
        "ingest": data_ingest.run,
        "logs": data_logs.run,
    }
    for name, fn in cases.items():
        if args.only in (None, name):
            fn(quick=quick)


if __name__ == "__main__":
    main()

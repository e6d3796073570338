"""Stage `ingest` (criteo): Criteo TSV files -> the impressions layout (DIR/day=D/*.parquet).

    lrm ingest criteo FILE_OR_FOLDER... --out data/criteo/raw [--skip-bad] [--days one]
    python -m stages.ingest criteo FILE_OR_FOLDER... --out data/criteo/raw

Without FILE they come from `ingest.files`; a folder stands for its *.tsv files and its
subfolders' (in order: day2 before day10), which is how the Criteo pipeline
(pipelines/criteo/dvc.yaml) reads `data/criteo/tsv/`. Any other click log: stage `ingest
logs` (stages/ingest_logs.py).

Bad input exits with status 2 and one line naming the file, line or row, and field.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from lrm import io
from lrm.config import IngestConfig
from stagekit import Arg, Metrics, Stage, main
from stages._inputs import expand, given

NAME = "ingest"


def input_files(paths: list[Path]) -> list[Path]:
    """Files as given; a folder expands to its *.tsv files, in order (`lrm.io.in_order`)."""
    return expand(paths, (".tsv",), patterns=False)


def run(*, listed: list[str], skip_bad: bool, days: str, chunk_rows: int,
        files: list[Path] | None = None, out: Path = Path("data/criteo/raw"),
        metrics: Path | None = Path("metrics/ingest.json"), force: bool = False
        ) -> Metrics:
    """Convert Criteo display-ads TSV files (label, I1..I13, C1..C26) to Parquet days."""
    from lrm.data import criteo  # polars import: only when the stage runs

    cfg = IngestConfig(files=listed, skip_bad=skip_bad, days=days, chunk_rows=chunk_rows)
    paths = input_files(given(files, cfg.files, "ingest", "ingest.files"))
    io.check_paths(paths, [out])
    with io.atomic_dir(out, stage=NAME, force=force) as tmp:
        return Metrics(criteo.ingest(paths, tmp, cfg))


STAGE = Stage(
    name=NAME, run=run, short=("ingest",), group="criteo",
    reads={"listed": "ingest.files", "skip_bad": "ingest.skip_bad", "days": "ingest.days",
           "chunk_rows": "ingest.chunk_rows"},
    args={"files": Arg("", "Criteo TSV files or folders of them (params: ingest.files)", "in"),
          "out": Arg("--out", "output dataset folder", "out"),
          "metrics": Arg("--metrics", "stage metrics file", "metrics")},
)

if __name__ == "__main__":
    if sys.argv[1:2] == ["logs"]:  # `python -m stages.ingest logs`, as before the stages split
        runpy.run_module("stages.ingest_logs", run_name="__main__", alter_sys=True)
    else:
        main(STAGE)

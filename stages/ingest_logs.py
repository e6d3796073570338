"""Stage `ingest logs`: any click log -> the impressions layout (DIR/day=D/*.parquet).

    lrm ingest logs FILE_OR_GLOB... --out data/logs/raw --label clicked --user uid ...
    lrm ingest logs FILE_OR_GLOB... --out data/logs/raw --map mapping.yaml
    python -m stages.ingest_logs logs FILE_OR_GLOB... --out data/logs/raw ...

Any click log (Parquet, CSV/TSV, JSON lines; also .gz) through a column mapping:
the `ingest.logs` params, a mapping file (`--map FILE`, YAML with the same keys, laid over
them) and the flags (`--label COL --user COL --session-gap 30m ...`, laid over both).
Without FILE they come from `ingest.logs.files`; a folder stands for its log files (its
subfolders' too), a pattern with *, ? or ** for the files it matches, in order with numbers
read as numbers (day2 before day10: with `--days file`, file k is day k). See lrm.data.logs.

Bad input exits with status 2 and one line naming the file, line or row, and field.
"""

from __future__ import annotations

from pathlib import Path

from lrm import io
from lrm.config import LogsConfig
from lrm.data.logs import LOG_SUFFIXES
from stagekit import Arg, Metrics, Stage, main
from stages._inputs import expand, given

NAME = "ingest_logs"


def log_files(paths: list[Path]) -> list[Path]:
    """Files as given; a folder expands to its log files, a pattern to its matches (in order)."""
    return expand(paths, LOG_SUFFIXES, patterns=True)


def run(*, cfg: LogsConfig, chunk_rows: int, max_history: int,
        files: list[Path] | None = None, out: Path = Path("data/logs/raw"),
        metrics: Path | None = Path("metrics/ingest_logs.json"), force: bool = False
        ) -> Metrics:
    """Convert a click log (Parquet, CSV/TSV, JSON lines) to Parquet days, by a column mapping."""
    from lrm.data.logs import ingest  # polars import: only when the stage runs

    paths = log_files(given(files, cfg.files, "ingest logs", "ingest.logs.files"))
    io.check_paths(paths, [out])
    with io.atomic_dir(out, stage=NAME, force=force) as tmp:
        return Metrics(ingest.ingest(paths, tmp, cfg, chunk_rows=chunk_rows,
                                     max_history=max_history))


STAGE = Stage(
    name=NAME, run=run, cli_name="ingest", group="logs", short=("ingest.logs",),
    config_file=("--map", "ingest.logs"),
    reads={"cfg": "ingest.logs", "chunk_rows": "ingest.chunk_rows",
           "max_history": "generate.max_history"},
    args={"files": Arg("", "log files, folders or patterns (params: ingest.logs.files)", "in"),
          "out": Arg("--out", "output dataset folder", "out"),
          "metrics": Arg("--metrics", "stage metrics file", "metrics")},
)

if __name__ == "__main__":
    main(STAGE)

"""Stage `ingest`: external datasets -> the impressions layout (data/criteo/raw/day=D/*.parquet).

    lrm ingest criteo [FILE...] --out DIR [--skip-bad]
    python -m stages.ingest criteo [FILE...] --out DIR [--skip-bad]

Without FILE, the files come from `ingest.files` in params.yaml (relative to the cwd).
Bad input exits with status 2 and one line on stderr naming the file, line and field;
`--out` is then left exactly as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer

from lrm import io
from lrm.config import IngestConfig
from lrm.data import criteo
from lrm.errors import ConfigError
from stages._common import ParamsOption, fail, load_config, stage

OUT = Path("data/criteo/raw")
METRICS = Path("metrics/ingest.json")

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Ingest external datasets into the impressions layout.")


@app.callback()
def _group() -> None:
    """Ingest external datasets into the impressions layout (day=D/part-NNNNN.parquet)."""


def run(cfg: IngestConfig, files: Sequence[Path], out: Path = OUT) -> dict[str, Any]:
    """Ingest Criteo TSV `files` into `out` (replaced atomically); return the stage metrics."""
    with io.atomic_dir(out) as tmp:
        return criteo.ingest(files, tmp, cfg)


@app.command("criteo")
def criteo_command(
    files: list[Path] | None = typer.Argument(
        None, show_default=False,
        help="Criteo TSV files, one day each unless --rows-per-day (params: ingest.files)"),
    out: Path = typer.Option(OUT, "--out", help="output dataset folder"),
    skip_bad: bool | None = typer.Option(
        None, "--skip-bad/--no-skip-bad", show_default=False,
        help="skip and count bad rows instead of failing on the first (params: ingest.skip_bad)"),
    rows_per_day: int | None = typer.Option(
        None, show_default=False,
        help="split the row stream into days of this many rows; 0: a day per file "
             "(params: ingest.rows_per_day)"),
    chunk_rows: int | None = typer.Option(
        None, show_default=False, help="rows per streamed chunk (params: ingest.chunk_rows)"),
    params: Path = ParamsOption,
    metrics: Path = typer.Option(METRICS, help="where to write the stage metrics"),
) -> None:
    """Convert Criteo display-ads TSV files (label, I1..I13, C1..C26) to Parquet days."""
    overrides = dict(files=[str(f) for f in files] if files else None, skip_bad=skip_bad,
                     rows_per_day=rows_per_day, chunk_rows=chunk_rows)
    cfg, p = load_config(params, "ingest", IngestConfig, overrides)
    if not cfg.files:
        raise fail(ConfigError("ingest.files: no input files; pass FILE... or set "
                               "ingest.files in params.yaml"))
    with stage("ingest", cfg, p, metrics) as m:
        m.update(run(cfg, [Path(f) for f in cfg.files], out))


if __name__ == "__main__":
    app()

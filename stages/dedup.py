"""Stage `dedup` (RecD): data/raw (one row per impression) -> data/sessions (one per session)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from lrm import io
from lrm.config import DedupConfig
from lrm.data import dedup
from lrm.errors import ConfigError, LrmError
from stages._common import ParamsOption, fail, load_config, stage

SRC = Path("data/raw")
OUT = Path("data/sessions")
METRICS = Path("metrics/dedup.json")


def run(cfg: DedupConfig, src: Path = SRC, out: Path = OUT) -> dict[str, Any]:
    """Dedup every day of `src` into `out` (replaced atomically); return the stage metrics."""
    if Path(src).resolve() == Path(out).resolve():
        raise ConfigError(f"--in and --out are the same folder ({src})")
    dedup.check_source(src)  # fail before touching anything
    with io.atomic_dir(out) as tmp:
        return dedup.dedup_dataset(src, tmp, cfg)


def command(
    src: Path = typer.Option(SRC, "--in", help="impressions-layout dataset folder"),
    out: Path = typer.Option(OUT, "--out", help="output dataset folder (sessions layout)"),
    rows_per_file: int = typer.Option(
        None, help="sessions per output file (params: dedup.rows_per_file)"),
    params: Path = ParamsOption,
    metrics: Path = typer.Option(METRICS, help="where to write the stage metrics"),
) -> None:
    """Deduplicate impressions into sessions: user features stored once per session (RecD)."""
    cfg, p = load_config(params, "dedup", DedupConfig, {"rows_per_file": rows_per_file})
    try:  # bad input fails fast, before the MLflow run starts
        dedup.check_source(src)
    except LrmError as e:
        raise fail(e) from None
    with stage("dedup", cfg, p, metrics, extra_params={"src": str(src), "out": str(out)}) as m:
        m.update(run(cfg, src, out))


if __name__ == "__main__":
    typer.run(command)

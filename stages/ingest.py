"""Stage `ingest`: Criteo TSV files -> the impressions layout (DIR/day=D/*.parquet).

    lrm ingest criteo FILE_OR_FOLDER... --out data/criteo/raw [--skip-bad]

Without FILE the files come from `ingest.files`. A folder stands for its *.tsv files (sorted),
which is how the Criteo pipeline (pipelines/criteo/dvc.yaml) reads `data/criteo/tsv/`.
Bad input exits with status 2 and one line naming the file, line and field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lrm import io
from lrm.config import IngestConfig
from lrm.errors import ConfigError
from stagekit import Arg, Stage, main

NAME = "ingest"


def input_files(paths: list[Path]) -> list[Path]:
    """Files as given; a folder expands to its *.tsv files, sorted."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.glob("*.tsv"))
            if not found:
                raise ConfigError(f"{p}: no *.tsv files in this folder")
            out += found
        else:
            out.append(p)
    return out


def run(*, cfg: IngestConfig, files: list[Path] | None = None,
        out: Path = Path("data/criteo/raw"), metrics: Path | None = Path("metrics/ingest.json"),
        force: bool = False) -> dict[str, Any]:
    """Convert Criteo display-ads TSV files (label, I1..I13, C1..C26) to Parquet days."""
    from lrm.data import criteo  # polars import: only when the stage runs

    chosen = list(files or []) or [Path(f) for f in cfg.files]
    if not chosen:
        raise ConfigError("ingest: no input files; pass FILE... or set ingest.files")
    paths = input_files(chosen)
    io.check_paths(paths, [out])
    with io.atomic_dir(out, stage=NAME, force=force) as tmp:
        return criteo.ingest(paths, tmp, cfg)


STAGE = Stage(
    name=NAME, run=run, reads={"cfg": "ingest"}, short=("ingest",), group="criteo",
    args={"files": Arg("", "Criteo TSV files or folders of them (params: ingest.files)", "in"),
          "out": Arg("--out", "output dataset folder", "out"),
          "metrics": Arg("--metrics", "stage metrics file", "metrics")},
)

if __name__ == "__main__":
    main(STAGE)

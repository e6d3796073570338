"""Stage `dedup` (RecD): data/raw (one row per impression) -> data/sessions (one per session).

    lrm dedup --in data/raw --out data/sessions
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lrm import io
from lrm.config import DedupConfig
from lrm.data import dedup
from stages._common import Arg, Stage, main

NAME = "dedup"


def run(*, cfg: DedupConfig, src: Path = Path("data/raw"), out: Path = Path("data/sessions"),
        metrics: Path | None = Path("metrics/dedup.json"), force: bool = False
        ) -> dict[str, Any]:
    """Deduplicate impressions into sessions: user features stored once per session (RecD)."""
    dedup.check_source(src)  # bad input fails before anything is written
    with io.atomic_dir(out, stage=NAME, force=force) as tmp:
        return dedup.dedup_dataset(src, tmp, cfg)


STAGE = Stage(
    name=NAME, run=run, reads={"cfg": "dedup"}, short=("dedup",),
    args={"src": Arg("--in", "impressions-layout dataset folder", "in"),
          "out": Arg("--out", "output dataset folder (sessions layout)", "out"),
          "metrics": Arg("--metrics", "stage metrics file", "metrics")},
)

if __name__ == "__main__":
    main(STAGE)

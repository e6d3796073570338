"""Stage `dedup` (RecD): data/raw (one row per impression) -> data/sessions (one per session).

    lrm dedup --in data/raw --out data/sessions [--days 3,4]

Day by day (lrm.data.dedup.update): a day whose sessions were made from the same raw files
with the same settings is kept, every other is deduplicated again, atomically; `--days`
limits the run to those days (the streaming flow's new day). dvc.yaml keeps the folder
(`persist: true`) so that this matters; without `--days` the folder ends holding exactly
the raw data's days.
"""

from __future__ import annotations

from pathlib import Path

from lrm.config import DedupConfig
from lrm.data import dedup
from stagekit import Arg, Metrics, Stage, main

NAME = "dedup"


def run(*, cfg: DedupConfig, src: Path = Path("data/raw"), out: Path = Path("data/sessions"),
        days: list[int] | None = None, metrics: Path | None = Path("metrics/dedup.json"),
        force: bool = False) -> Metrics:
    """Deduplicate impressions into sessions: user features stored once per session (RecD)."""
    dedup.check_source(src)  # bad input fails before anything is written
    return Metrics(dedup.update(src, out, cfg, days or None, force=force))


STAGE = Stage(
    name=NAME, run=run, reads={"cfg": "dedup"}, short=("dedup",),
    args={"src": Arg("--in", "impressions-layout dataset folder", "in"),
          "out": Arg("--out", "output dataset folder (sessions layout)", "out", persist=True),
          "days": Arg("--days", "only these days, e.g. 3,4 [default: every day of --in]"),
          "metrics": Arg("--metrics", "stage metrics file", "metrics")},
)

if __name__ == "__main__":
    main(STAGE)

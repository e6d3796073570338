"""Stage `generate`: synthetic session-level ads logs -> data/raw/day=D/*.parquet.

    lrm generate --out data/raw [--generate.days 8 ...]
"""

from __future__ import annotations

from pathlib import Path

from lrm import io
from lrm.config import GenerateConfig
from stagekit import Arg, Metrics, Stage, main

NAME = "generate"


def run(*, cfg: GenerateConfig, out: Path = Path("data/raw"),
        metrics: Path | None = Path("metrics/generate.json"), force: bool = False
        ) -> Metrics:
    """Generate synthetic session-level ads-click logs (Parquet, one folder per day)."""
    from lrm.data import synthetic  # numpy/pyarrow work: only when the stage runs

    with io.atomic_dir(out, stage=NAME, force=force) as tmp:
        return Metrics(synthetic.generate(cfg, tmp))


STAGE = Stage(
    name=NAME, run=run, reads={"cfg": "generate"}, short=("generate",),
    args={"out": Arg("--out", "output dataset folder", "out"),
          "metrics": Arg("--metrics", "stage metrics file", "metrics")},
)

if __name__ == "__main__":
    main(STAGE)

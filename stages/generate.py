"""Stage `generate`: synthetic session-level ads logs -> data/raw/day=D/*.parquet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from lrm import io
from lrm.config import GenerateConfig
from lrm.data import synthetic
from stages._common import ParamsOption, load_config, stage

OUT = Path("data/raw")
METRICS = Path("metrics/generate.json")


def run(cfg: GenerateConfig, out: Path = OUT) -> dict[str, Any]:
    """Generate every day into `out` (replaced atomically); return the stage metrics."""
    with io.atomic_dir(out) as tmp:
        return synthetic.generate(cfg, tmp)


def command(
    out: Path = typer.Option(OUT, "--out", help="output dataset folder"),
    users: int = typer.Option(None, help="user id space (params: generate.users)"),
    ads: int = typer.Option(None, help="ad id space (params: generate.ads)"),
    days: int = typer.Option(None, help="number of days (params: generate.days)"),
    sessions_per_day: int = typer.Option(None, help="(params: generate.sessions_per_day)"),
    mean_session_length: float = typer.Option(None, help="(params: generate.mean_session_length)"),
    drift: float = typer.Option(None, help="interest drift per day (params: generate.drift)"),
    churn: float = typer.Option(None, help="user/ad churn per day (params: generate.churn)"),
    seed: int = typer.Option(None, help="(params: generate.seed)"),
    params: Path = ParamsOption,
    metrics: Path = typer.Option(METRICS, help="where to write the stage metrics"),
) -> None:
    """Generate synthetic session-level ads-click logs (Parquet, one folder per day)."""
    overrides = dict(users=users, ads=ads, days=days, sessions_per_day=sessions_per_day,
                     mean_session_length=mean_session_length, drift=drift, churn=churn,
                     seed=seed)
    cfg, p = load_config(params, "generate", GenerateConfig, overrides)
    with stage("generate", cfg, p, metrics) as m:
        m.update(run(cfg, out))


if __name__ == "__main__":
    typer.run(command)

"""The whole DAG as a Prefect flow: `python -m flows.pipeline` (what `make run` does).

Runs on Prefect's ephemeral server with no set-up; set PREFECT_API_URL to use a real one.
Same stages, same outputs as `dvc repro` (which additionally skips up-to-date stages).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from prefect import flow, get_run_logger

from flows.tasks import stage_task
from stages._common import load_params


@flow(name="lrm-pipeline", log_prints=True)
def pipeline(params: str = "params.yaml", criteo: bool | None = None) -> dict[str, Any]:
    """The DAG of dvc.yaml on synthetic data; Criteo ingest when its files are present.

    criteo: True forces the ingest branch, False skips it, None runs it when every file
    named in `ingest.files` exists.
    """
    logger = get_run_logger()
    p = ["--params", params]
    out: dict[str, Any] = {}
    out["generate"] = stage_task("generate", ["--out", "data/raw", *p],
                                 metrics="metrics/generate.json")
    out["dedup"] = stage_task("dedup", ["--in", "data/raw", "--out", "data/sessions", *p],
                              metrics="metrics/dedup.json")
    for kind in ("student", "teacher"):  # baselines on every day but the last
        out[f"train_{kind}"] = stage_task(
            "train", ["--model", kind, "--data", "data/sessions", "--out", f"models/baseline/{kind}",
                      "--checkpoints", f"checkpoints/baseline/{kind}",
                      "--metrics", f"metrics/train_{kind}.json", *p],
            metrics=f"metrics/train_{kind}.json")
    out["evaluate"] = stage_task(
        "evaluate", ["--model", "student=models/baseline/student",
                     "--model", "teacher=models/baseline/teacher", "--data", "data/sessions",
                     "--out", "metrics/eval.json", *p], metrics="metrics/eval.json")
    # ExFM: teacher on days [0, T) -> augment the students' days -> students day by day.
    out["teacher"] = stage_task("teacher", ["--data", "data/sessions", "--out", "models/teacher",
                                            "--metrics", "metrics/teacher.json", *p],
                                metrics="metrics/teacher.json")
    out["augment"] = stage_task("augment", ["--data", "data/sessions", "--teacher",
                                            "models/teacher", "--out", "data/augmented",
                                            "--metrics", "metrics/augment.json", *p],
                                metrics="metrics/augment.json")
    out["student"] = stage_task("student", ["--data", "data/augmented", "--out", "models/students",
                                            "--metrics", "metrics/exfm.json",
                                            "--plot", "plots/exfm_ne.csv", *p],
                                metrics="metrics/exfm.json")
    files = (load_params(Path(params)).get("ingest") or {}).get("files") or []
    if criteo is None:
        criteo = bool(files) and all(Path(f).exists() for f in files)
        if not criteo:
            logger.info("Criteo files %s not all present: skipping the ingest branch", files)
    if criteo:
        out["ingest"] = stage_task("ingest", ["criteo", "--out", "data/criteo/raw", *p],
                                   metrics="metrics/ingest.json")
    return out


def main(params: str = typer.Option("params.yaml", help="params file"),
         criteo: bool = typer.Option(None, "--criteo/--no-criteo",
                                     help="force or skip the Criteo branch")) -> None:
    pipeline(params=params, criteo=criteo)


if __name__ == "__main__":
    typer.run(main)

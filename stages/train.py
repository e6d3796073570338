"""Stage `train`: a teacher or student on a dataset -> the model folder, checkpoints, MLflow.

Launch it any of these ways (the same function underneath):

    lrm train --model student --data data/sessions --out models/student
    python -m stages.train --model student --data data/sessions --out models/student
    torchrun --nproc_per_node=2 -m stages.train --model student --data data/sessions ...

One process initializes a 1-rank gloo group itself; under torchrun every process trains
its share of each batch (gloo on CPU, nccl with one GPU per process). Values come from the
`train`, `model` and `loader` sections of params.yaml; every option overrides one key.
Periodic checkpoints go to `--checkpoints` (default checkpoints/KIND, kept outside the
DVC outs); `--resume` continues from the latest complete one. Only rank 0 logs to MLflow
(params, per-step metrics, the final model as a pyfunc) and writes the metrics file.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import typer

from lrm import tracking
from lrm.config import LoaderConfig, ModelConfig, TrainConfig
from lrm.errors import ConfigError, LrmError
from stages._common import ParamsOption, fail, load_config, section, setup_logging, stage

CHECKPOINTS = Path("checkpoints")
KINDS = ("teacher", "student")  # lrm.models.KINDS, without importing torch to parse options


def _csv_days(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(d) for d in text.split(",") if d.strip()]
    except ValueError:
        raise ConfigError(f"--days: expected comma-separated day numbers, got {text!r}") from None


def run(kind: str, cfg: TrainConfig, model_cfg: ModelConfig, data: Path, out: Path, *,
        loader_cfg: LoaderConfig | None = None, checkpoints: Path | None = None,
        resume: bool = False, log_mlflow: bool = False) -> dict[str, Any]:
    """Train `kind`; return the stage metrics (final eval, steps, throughput).

    log_mlflow: rank 0 logs per-step metrics and the final pyfunc model to the active run.
    """
    if kind not in KINDS:
        raise ConfigError(f"--model: {kind!r} is not one of {KINDS}")
    from lrm.train import train  # torch/torchrec import: only when a stage runs

    main = int(os.environ.get("RANK", "0")) == 0
    log_fn = (lambda m, step: tracking.log_metrics(m, step=step)) if log_mlflow and main \
        else None
    result = train(kind, cfg, model_cfg, data, loader_cfg=loader_cfg, out=out,
                   checkpoints=checkpoints, resume=resume, log_fn=log_fn)
    if log_mlflow and main:
        from lrm.serving import pyfunc

        pyfunc.log_model(out, data, result.eval_day)
    return {
        "kind": kind, "steps": result.steps, "samples": result.samples,
        "samples_per_s": result.samples_per_s, "world_size": result.world_size,
        "train_days": result.train_days, "eval_day": result.eval_day,
        "resumed_from": result.resumed_from, "eval": result.eval,
    }


def command(
    model: str = typer.Option(..., "--model", help=f"which model: {' | '.join(KINDS)}"),
    data: Path = typer.Option(Path("data/sessions"), "--data", help="dataset folder"),
    out: Path = typer.Option(None, "--out", help="final model folder (models/KIND)"),
    checkpoints: Path = typer.Option(None, help="checkpoint folder (checkpoints/KIND)"),
    resume: bool = typer.Option(False, "--resume", help="go on from the latest checkpoint"),
    days: str = typer.Option(None, help="train days, e.g. 0,1,2 (train.days)"),
    eval_day: int = typer.Option(None, help="held-out day, <0: from the end (train.eval_day)"),
    batch_size: int = typer.Option(None, help="impressions a step, all ranks (train.batch_size)"),
    epochs: int = typer.Option(None, help="(train.epochs)"),
    steps: int = typer.Option(None, help="optimizer steps, 0: epochs (train.steps)"),
    lr: float = typer.Option(None, help="dense AdamW lr (train.lr)"),
    weight_decay: float = typer.Option(None, help="dense AdamW decay (train.weight_decay)"),
    embedding_lr: float = typer.Option(None, help="row-wise Adagrad lr (train.embedding_lr)"),
    seed: int = typer.Option(None, help="(train.seed)"),
    eval_every: int = typer.Option(None, help="steps between evals (train.eval_every)"),
    eval_batches: int = typer.Option(None, help="(train.eval_batches)"),
    checkpoint_every: int = typer.Option(None, help="(train.checkpoint_every)"),
    keep_checkpoints: int = typer.Option(None, help="(train.keep_checkpoints)"),
    log_every: int = typer.Option(None, help="steps between metrics (train.log_every)"),
    ne_window: int = typer.Option(None, help="rows in the running NE (train.ne_window)"),
    device: str = typer.Option(None, help="auto | cpu | cuda (train.device)"),
    amp: bool = typer.Option(None, "--amp/--no-amp", help="bf16 autocast on GPU (train.amp)"),
    threads: int = typer.Option(None, help="intra-op threads per process (train.threads)"),
    dedup: bool = typer.Option(None, "--dedup/--no-dedup", help="RecD batches (loader.dedup)"),
    params: Path = ParamsOption,
    metrics: Path = typer.Option(None, help="stage metrics file (metrics/train_KIND.json)"),
) -> None:
    """Train the teacher or the student (DMP, fused row-wise Adagrad, DCP checkpoints)."""
    overrides = dict(eval_day=eval_day, batch_size=batch_size, epochs=epochs, steps=steps,
                     lr=lr, weight_decay=weight_decay, embedding_lr=embedding_lr, seed=seed,
                     eval_every=eval_every, eval_batches=eval_batches,
                     checkpoint_every=checkpoint_every, keep_checkpoints=keep_checkpoints,
                     log_every=log_every, ne_window=ne_window, device=device, amp=amp,
                     threads=threads)
    try:
        overrides["days"] = _csv_days(days)
        if model not in KINDS:
            raise ConfigError(f"--model: {model!r} is not one of {KINDS}")
    except ConfigError as e:
        raise fail(e) from None
    cfg, p = load_config(params, "train", TrainConfig, overrides)
    try:
        model_cfg = section(p, "model", ModelConfig)
        loader_cfg = section(p, "loader", LoaderConfig, {"dedup": dedup})
    except LrmError as e:
        raise fail(e) from None
    out = out or Path("models") / model
    checkpoints = checkpoints or CHECKPOINTS / model
    metrics = metrics or Path("metrics") / f"train_{model}.json"

    def body(log_mlflow: bool) -> dict[str, Any]:
        return run(model, cfg, model_cfg, data, out, loader_cfg=loader_cfg,
                   checkpoints=checkpoints, resume=resume, log_mlflow=log_mlflow)

    if int(os.environ.get("RANK", "0")) != 0:  # only rank 0 logs (MLflow, metrics file)
        setup_logging()
        try:
            body(log_mlflow=False)
        except LrmError as e:
            raise fail(e) from None
        return
    extra = {"kind": model, "data": str(data), "model": dataclasses.asdict(model_cfg),
             "loader": dataclasses.asdict(loader_cfg), "resume": resume}
    with stage(f"train_{model}", cfg, p, metrics, extra_params=extra) as m:
        m.update(body(log_mlflow=True))


if __name__ == "__main__":
    typer.run(command)

"""Stage `evaluate`: score saved models on a held-out day -> NE, AUC, calibration as JSON.

    lrm evaluate --model models/student --data data/sessions --out metrics/student_eval.json
    lrm evaluate --model student=models/student --model teacher=models/teacher \\
        --data data/sessions --out metrics/eval.json
    lrm evaluate --model models/student --name student --out metrics/eval.json

One unnamed model writes its metrics as the whole file: {ne, auc, calibration, rows, ...}.
Named models (NAME=DIR, or --name for a single one) are merged into the file under their
names, keeping the entries of other models: {"student": {...}, "teacher": {...}}.
The day is `--day` / evaluate.day (default -1: the last day of the data).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from lrm import io
from lrm.config import EvalConfig
from lrm.errors import ConfigError, DataError, LrmError
from stages._common import ParamsOption, fail, load_config, stage

OUT = Path("metrics/eval.json")


def parse_models(models: list[str], name: str | None) -> list[tuple[str | None, Path]]:
    """[(name or None, folder)] from `--model` values (DIR or NAME=DIR) and `--name`."""
    parsed: list[tuple[str | None, Path]] = []
    for m in models:
        key, sep, path = m.partition("=")
        parsed.append((key, Path(path)) if sep and key else (None, Path(m)))
    if name is not None:
        if len(parsed) != 1 or parsed[0][0] is not None:
            raise ConfigError("--name: give one --model DIR with it (or use --model NAME=DIR)")
        parsed = [(name, parsed[0][1])]
    names = [n for n, _ in parsed]
    if None in names and len(parsed) > 1:
        raise ConfigError("--model: name every model (NAME=DIR) when evaluating several")
    if len(set(names)) != len(names):
        raise ConfigError(f"--model: repeated names {names}")
    return parsed


def run(models: list[tuple[str | None, Path]], data: Path, cfg: EvalConfig,
        out: Path = OUT) -> dict[str, Any]:
    """Evaluate every model; write `out` (merging named entries); return this run's metrics."""
    from lrm.train.evaluate import evaluate  # torch import: only when a stage runs

    results = {name: evaluate(path, data, day=cfg.day, batch_size=cfg.batch_size)
               for name, path in models}
    if list(results) == [None]:
        io.write_json(results[None], out)
        return results[None]
    doc: dict[str, Any] = {}
    if out.exists():
        try:
            doc = json.loads(out.read_text())
        except json.JSONDecodeError as e:
            raise DataError(out, e.lineno, None, f"existing metrics are not JSON: {e.msg}")
        if not isinstance(doc, dict) or "ne" in doc:  # a single model's flat metrics: replace
            doc = {}
    doc.update(results)
    io.write_json(doc, out)
    return results


def command(
    model: list[str] = typer.Option(..., "--model", help="model folder, or NAME=DIR; repeat"),
    data: Path = typer.Option(Path("data/sessions"), "--data", help="dataset folder"),
    out: Path = typer.Option(OUT, "--out", help="metrics JSON to write (or merge into)"),
    name: str = typer.Option(None, "--name", help="entry name for a single --model DIR"),
    day: int = typer.Option(None, help="held-out day, <0 from the end (evaluate.day)"),
    batch_size: int = typer.Option(None, help="(evaluate.batch_size)"),
    params: Path = ParamsOption,
) -> None:
    """Score saved models on a held-out day: NE, AUC, calibration, rows."""
    cfg, p = load_config(params, "evaluate", EvalConfig, dict(day=day, batch_size=batch_size))
    try:
        models = parse_models(model, name)
    except LrmError as e:
        raise fail(e) from None
    extra = {"models": {str(n): str(d) for n, d in models}, "data": str(data)}
    with stage("evaluate", cfg, p, None, extra_params=extra) as m:
        m.update(run(models, data, cfg, out))


if __name__ == "__main__":
    typer.run(command)

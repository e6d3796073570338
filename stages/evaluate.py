"""Stage `evaluate`: score saved models on a held-out day -> NE, AUC, calibration as JSON.

    lrm evaluate --model-dir models/student --data data/sessions --out metrics/student_eval.json
    lrm evaluate --model-dir student=models/student --model-dir teacher=models/teacher \\
        --data data/sessions --out metrics/eval.json

One unnamed model writes its metrics as the whole file: {ne, auc, calibration, rows, ...},
each metric with its 95% bootstrap interval (`ne_ci`: [low, high], ...). Named models
(NAME=DIR) are merged into the file under their names, keeping the entries of other models:
{"student": {...}, "teacher": {...}}. The day is `evaluate.day` (default -1: the last day
of the data); every row of it is scored unless `evaluate.rows` says otherwise, and a line
per model on stdout says how many rows were scored. `--model` is the old name of
`--model-dir`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lrm import io
from lrm.config import EvalConfig
from lrm.errors import ConfigError, DataError
from stagekit import Arg, Stage, main, split_named

NAME = "evaluate"


def parse_models(models: list[str], name: str | None = None) -> list[tuple[str | None, Path]]:
    """[(name or None, folder)] from `--model-dir` values (DIR or NAME=DIR) and `--name`."""
    parsed = [split_named(m) for m in models]
    if name is not None:
        if len(parsed) != 1 or parsed[0][0] is not None:
            raise ConfigError("--name: give one --model-dir DIR with it (or NAME=DIR)")
        parsed = [(name, parsed[0][1])]
    names = [n for n, _ in parsed]
    if None in names and len(parsed) > 1:
        raise ConfigError("--model-dir: name every model (NAME=DIR) when evaluating several")
    if len(set(names)) != len(names):
        raise ConfigError(f"--model-dir: repeated names {names}")
    return parsed


def describe(name: str, m: dict[str, Any]) -> str:
    """One line: what was scored and the metrics, with their intervals when present."""
    def metric(k: str, label: str, digits: int) -> str:
        ci = m.get(f"{k}_ci")
        return f"{label} {m[k]:.{digits}f}" + (f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"
                                                if ci else "")
    which = "every row" if m["rows"] == m["day_rows"] else f"of {m['day_rows']}"
    return (f"{name}: scored {m['rows']} rows of day {m['day']} ({which}): "
            f"{metric('ne', 'NE', 4)}, {metric('auc', 'AUC', 4)}, "
            f"{metric('calibration', 'calibration', 3)}"
            + (f" (95% bootstrap intervals, {m['ci_resamples']} resamples)"
               if "ci_resamples" in m else ""))


def run(*, cfg: EvalConfig, models: list[str], data: Path = Path("data/sessions"),
        out: Path = Path("metrics/eval.json"), name: str | None = None, force: bool = False
        ) -> dict[str, Any]:
    """Score saved models on a held-out day: NE, AUC, calibration, rows."""
    from lrm.train.evaluate import evaluate  # torch import: only when the stage runs

    parsed = parse_models(models, name)
    results = {}
    for key, path in parsed:
        results[key] = m = evaluate(path, data, day=cfg.day, batch_size=cfg.batch_size,
                                    max_rows=cfg.rows, resamples=cfg.bootstrap)
        print(describe(key or str(path), m), flush=True)
    if list(results) == [None]:
        io.write_json(results[None], out, stage=NAME, force=force)
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
    io.write_json(doc, out, stage=NAME, force=force)
    return results


def headline(results: dict[str, Any]) -> dict[str, Any]:
    """NE and AUC per model scored (a pipeline run's headline)."""
    def pick(m: dict[str, Any]) -> dict[str, Any]:
        return {k: m[k] for k in ("ne", "auc") if k in m}

    return pick(results) if "ne" in results else \
        {k: pick(m) for k, m in results.items() if isinstance(m, dict)}


STAGE = Stage(
    name=NAME, run=run, reads={"cfg": "evaluate"}, short=("evaluate",), headline=headline,
    args={"models": Arg("--model-dir", "model folder, or NAME=DIR; repeat", "in",
                        aliases=("--model",), named=True),
          "data": Arg("--data", "dataset folder", "in"),
          "out": Arg("--out", "metrics JSON to write (or merge into)", "out", file=True,
                     cache=False),
          "name": Arg("--name", "entry name for a single --model-dir DIR")},
)

if __name__ == "__main__":
    main(STAGE)

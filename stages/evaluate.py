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

    lrm evaluate --model-dir models/student --data data/sessions --days 3..5 --out m.json

`--days A..B` (`evaluate.days`; inclusive, negatives count from the last day) scores each of
those days, every row, then all of them pooled: a model's metrics are the pooled ones (NE,
AUC, calibration with their intervals), `days`, and `per_day` {day: the same metrics}; a
line per day and one pooled on stdout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lrm import io
from lrm.config import EvalConfig
from lrm.errors import ConfigError, DataError
from stagekit import Arg, Metrics, Stage, main, split_named

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
    if "ne" in names:  # a file with a top-level "ne" is read as one model's flat metrics
        raise ConfigError("--model-dir: 'ne' names a metric of the file; name the model "
                          "otherwise")
    return parsed


def describe(name: str, m: dict[str, Any], what: str = "") -> str:
    """One line: what was scored (`what`: "day D") and the metrics, with their intervals."""
    def metric(k: str, label: str, digits: int) -> str:
        ci = m.get(f"{k}_ci")
        return f"{label} {m[k]:.{digits}f}" + (f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"
                                                if ci else "")
    which = "every row" if m["rows"] == m["day_rows"] else f"of {m['day_rows']}"
    what = what or f"day {m['day']}"
    return (f"{name}: scored {m['rows']} rows of {what} ({which}): "
            f"{metric('ne', 'NE', 4)}, {metric('auc', 'AUC', 4)}, "
            f"{metric('calibration', 'calibration', 3)}"
            + (f" (95% bootstrap intervals, {m['ci_resamples']} resamples)"
               if "ci_resamples" in m else ""))


def describe_days(name: str, m: dict[str, Any]) -> str:
    """A line per day, then the pooled line."""
    lines = [describe(name, {**d, "day_rows": d["rows"]}) for d in m["per_day"].values()]
    days = ", ".join(map(str, m["days"]))
    return "\n".join([*lines, describe(name, m, f"days {days} pooled")])


def run(*, cfg: EvalConfig, models: list[str], data: Path = Path("data/sessions"),
        out: Path = Path("metrics/eval.json"), name: str | None = None, force: bool = False
        ) -> Metrics:
    """Score saved models on a held-out day (or days): NE, AUC, calibration, rows."""
    from lrm.config import day_range
    from lrm.data.schema import day_files, pick_days
    from lrm.train.evaluate import evaluate, evaluate_days  # torch: only here

    parsed = parse_models(models, name)
    days = pick_days(list(day_files(data)), *day_range(cfg.days), "evaluate.days") \
        if cfg.days else None
    if days is not None and cfg.rows:
        raise ConfigError("evaluate: rows scores one day's first rows; with days every row "
                          "of each day is scored (leave rows at 0)")
    results = {}
    for key, path in parsed:
        if days is None:
            results[key] = m = evaluate(path, data, day=cfg.day, batch_size=cfg.batch_size,
                                        max_rows=cfg.rows, resamples=cfg.bootstrap)
            print(describe(key or str(path), m), flush=True)
        else:
            results[key] = m = evaluate_days(path, data, days, batch_size=cfg.batch_size,
                                             resamples=cfg.bootstrap)
            print(describe_days(key or str(path), m), flush=True)
    if list(results) == [None]:
        io.write_json(results[None], out, stage=NAME, force=force)
        return Metrics(results[None])
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
    return Metrics(results)


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

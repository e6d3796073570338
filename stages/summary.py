"""Stage `summary`: the headline numbers of a pipeline run in one small file.

    lrm summary [--eval metrics/eval.json --exfm metrics/exfm.json]

`metrics/summary.json` holds NE and AUC per model (the baselines; per vertical on the last
evaluation day the foundation model, and each student size's labels-only and served
variant) and is the one file `dvc metrics show` lists,
so its default view reads at a glance; `metrics/summary.md` is the same as a table, which
`make run` prints at the end. The stages' own metrics files keep every detail.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lrm import io
from lrm.errors import DataError
from stagekit import Arg, Stage, main

NAME = "summary"


def _read(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise DataError(path, None, None, "metrics file not found (run its stage first)") \
            from None
    except json.JSONDecodeError as e:
        raise DataError(path, e.lineno, None, f"not JSON: {e.msg}") from None
    if not isinstance(doc, dict):
        raise DataError(path, None, None, "expected a JSON object")
    return doc


def headline(evaluation: dict[str, Any], exfm: dict[str, Any]) -> dict[str, Any]:
    """{section: {model: {ne, auc}}} from the evaluate and student stages' metrics."""
    def pick(m: dict[str, Any]) -> dict[str, float]:
        return {k: round(float(m[k]), 4) for k in ("ne", "auc") if k in m}

    out: dict[str, Any] = {}
    out[f"baseline_day{next(iter(evaluation.values())).get('day', '')}"] = {
        name: pick(m) for name, m in evaluation.items() if isinstance(m, dict)}
    day = exfm.get("eval_day", "")
    for vertical, v in exfm.get("verticals", {}).items():  # the FM, each size's labels-only
        ex = {"teacher": pick(v.get("teacher", {}))}  # and served variant
        for size, s in v.get("students", {}).items():
            ex[f"{size}/labels_only"] = pick(s["variants"]["labels_only"])
            if s["serving"] != "labels_only":
                ex[f"{size}/{s['serving']} (served)"] = pick(s["variants"][s["serving"]])
        out[f"exfm_day{day}_{vertical}"] = ex
    return out


def markdown(doc: dict[str, Any]) -> str:
    lines = ["| run | model | NE | AUC |", "|---|---|---|---|"]
    for section, models in doc.items():
        for name, m in models.items():
            lines.append(f"| {section} | {name} | {m.get('ne', float('nan')):.4f} | "
                         f"{m.get('auc', float('nan')):.4f} |")
    return "\n".join(lines) + "\n"


def run(*, evaluation: Path = Path("metrics/eval.json"), exfm: Path = Path("metrics/exfm.json"),
        out: Path = Path("metrics/summary.json"), table: Path = Path("metrics/summary.md"),
        force: bool = False) -> dict[str, Any]:
    """Write the headline NE/AUC of every model the pipeline trained."""
    doc = headline(_read(evaluation), _read(exfm))
    io.write_json(doc, out, stage=NAME, force=force)
    io.write_text(markdown(doc), table, stage=NAME, force=force)
    return doc


STAGE = Stage(
    name=NAME, run=run, reads={},
    args={"evaluation": Arg("--eval", "the evaluate stage's metrics", "in"),
          "exfm": Arg("--exfm", "the student stage's metrics", "in"),
          "out": Arg("--out", "headline metrics (what `dvc metrics show` lists)", "summary"),
          "table": Arg("--table", "the same as a markdown table", "out", file=True,
                       cache=False)},
)

if __name__ == "__main__":
    main(STAGE)

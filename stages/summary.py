"""Stage `summary`: the headline numbers of a pipeline run in one small file.

    lrm summary [--eval metrics/eval.json --exfm metrics/exfm.json]

`metrics/summary.json` holds NE and AUC per model: the evaluated models (the baselines), the
ExFM teacher (`exfm_teacher`) and each student in its serving variant (`registry.variant`:
`exfm_NAME`). It is the file `dvc metrics show` lists, one short row (`dvc metrics show
--md` for a table); the same numbers head the pipeline's MLflow parent run. `metrics/summary.md` is the full table (every student
variant, the days scored), which `make run` prints at the end; the stages' own metrics
files keep every detail.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lrm import io
from lrm.errors import DataError
from stagekit import Arg, Stage, main

NAME = "summary"
EXFM = "exfm_"  # the headline's name of an ExFM model: exfm_teacher, exfm_NAME


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


def _pick(m: dict[str, Any]) -> dict[str, float]:
    return {k: round(float(m[k]), 4) for k in ("ne", "auc") if k in m}


def models(evaluation: dict[str, Any], exfm: dict[str, Any], variant: str
           ) -> list[tuple[str, str, str | None, dict[str, float]]]:
    """(what was scored, model, its name in the headline or None, {ne, auc}) of every
    model of the run: the evaluated ones, the ExFM teacher, every student variant (only
    the serving one in the headline)."""
    single = "ne" in evaluation  # one model's flat metrics
    evaluated = {"model": evaluation} if single else \
        {k: m for k, m in evaluation.items() if isinstance(m, dict)}
    out = [(f"day {m.get('day', '')}", name, name, _pick(m)) for name, m in evaluated.items()]
    day = f"ExFM, day {exfm.get('eval_day', '')}"
    out.append((day, "teacher", f"{EXFM}teacher", _pick(exfm.get("teacher", {}))))
    for student, per in exfm.get("students", {}).items():
        out += [(day, f"{student}/{v}" + (" (serving)" if v == variant else ""),
                 f"{EXFM}{student}" if v == variant else None, _pick(m))
                for v, m in per.items()]
    return out


def headline(evaluation: dict[str, Any], exfm: dict[str, Any], variant: str
             ) -> dict[str, dict[str, float]]:
    """{model: {ne, auc}} of the models `models` names in the headline."""
    return {name: m for _, _, name, m in models(evaluation, exfm, variant) if name}


def exfm_part(doc: dict[str, Any]) -> dict[str, Any]:
    """The ExFM models of a headline: what this stage adds to a pipeline run's parent (the
    evaluated models are the evaluate stage's headline)."""
    return {k: v for k, v in doc.items() if k.startswith(EXFM)}


def markdown(evaluation: dict[str, Any], exfm: dict[str, Any], variant: str) -> str:
    lines = ["| scored on | model | NE | AUC |", "|---|---|---|---|"]
    for scored, model, _, m in models(evaluation, exfm, variant):
        lines.append(f"| {scored} | {model} | {m.get('ne', float('nan')):.4f} | "
                     f"{m.get('auc', float('nan')):.4f} |")
    return "\n".join(lines) + "\n"


def run(*, variant: str, evaluation: Path = Path("metrics/eval.json"),
        exfm: Path = Path("metrics/exfm.json"),
        out: Path = Path("metrics/summary.json"), table: Path = Path("metrics/summary.md"),
        force: bool = False) -> dict[str, Any]:
    """Write the headline NE/AUC of every model the pipeline trained."""
    ev, ex = _read(evaluation), _read(exfm)
    doc = headline(ev, ex, variant)
    io.write_json(doc, out, stage=NAME, force=force)
    io.write_text(markdown(ev, ex, variant), table, stage=NAME, force=force)
    return doc


STAGE = Stage(
    name=NAME, run=run, reads={"variant": "registry.variant"}, headline=exfm_part,
    args={"evaluation": Arg("--eval", "the evaluate stage's metrics", "in"),
          "exfm": Arg("--exfm", "the student stage's metrics", "in"),
          "out": Arg("--out", "headline metrics (what `dvc metrics show` lists)", "summary"),
          "table": Arg("--table", "the same as a markdown table", "out", file=True,
                       cache=False)},
)

if __name__ == "__main__":
    main(STAGE)

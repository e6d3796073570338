"""Stage `summary`: the headline numbers of a pipeline run in one small file.

    lrm summary [--eval metrics/eval.json --exfm metrics/exfm.json]

`metrics/summary.json` holds NE and AUC per model: the evaluated models (the baselines) and,
per vertical on the last ExFM day, the foundation model (`exfm_VERTICAL_teacher`) and each
student size in the variant it serves (`exfm_VERTICAL_SIZE`; one vertical: `exfm_teacher`,
`exfm_SIZE`). It is the file `dvc metrics
show` lists, one short row (`dvc metrics show --md` for a table); the same numbers head the
pipeline's MLflow parent run. `metrics/summary.md` is the full table (every student variant,
the days scored), which `make run` prints at the end; the stages' own metrics files keep
every detail.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lrm import io
from lrm.errors import DataError
from stagekit import Arg, Metrics, Stage, main

NAME = "summary"
# an ExFM model's headline name: exfm_VERTICAL_teacher, exfm_VERTICAL_SIZE (with one
# vertical: exfm_teacher, exfm_SIZE)
EXFM = "exfm_"


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


def _object(doc: Any, path: Path, field: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise DataError(path, None, field, f"expected an object, got {json.dumps(doc)[:60]} "
                                           f"(not its stage's metrics?)")
    return doc


def _scores(m: dict[str, Any], path: Path, field: str) -> None:
    for k in ("ne", "auc"):
        v = m.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise DataError(path, None, f"{field}{k}", f"expected a number, got "
                            f"{json.dumps(v)[:60]} (not its stage's metrics?)")


def check(evaluation: dict[str, Any], exfm: dict[str, Any], eval_path: Path, exfm_path: Path
          ) -> None:
    """A DataError naming the file and field where a metrics file is not what its stage
    writes: an evaluated model without NE or AUC was a row of "nan" (rc 0), a `verticals`
    that is not an object a traceback."""
    if "ne" in evaluation:
        _scores(evaluation, eval_path, "")
    else:
        for name, m in evaluation.items():
            if isinstance(m, dict):
                _scores(m, eval_path, f"{name}.")
    verticals = _object(exfm.get("verticals", {}), exfm_path, "verticals")
    for vertical, v in verticals.items():
        at = f"verticals.{vertical}"
        _object(v, exfm_path, at)
        _object(v.get("teacher", {}), exfm_path, f"{at}.teacher")
        for size, st in _object(v.get("students", {}), exfm_path, f"{at}.students").items():
            _object(st, exfm_path, f"{at}.students.{size}")
            for name, m in _object(st.get("variants"), exfm_path,
                                   f"{at}.students.{size}.variants").items():
                _scores(_object(m, exfm_path, f"{at}.students.{size}.variants.{name}"),
                        exfm_path, f"{at}.students.{size}.variants.{name}.")


def _pick(m: dict[str, Any]) -> dict[str, float]:
    return {k: round(float(m[k]), 4) for k in ("ne", "auc") if k in m}


def _scored_on(m: dict[str, Any]) -> str:
    """"day D", or "days A-B pooled" for `lrm evaluate --days` (it was "day ")."""
    if "day" not in m and isinstance(m.get("days"), list) and m["days"]:
        return f"days {m['days'][0]}-{m['days'][-1]} pooled"
    return f"day {m.get('day', '')}"


def models(evaluation: dict[str, Any], exfm: dict[str, Any]
           ) -> list[tuple[str, str, str | None, dict[str, float]]]:
    """(what was scored, model, its name in the headline or None, {ne, auc}) of every
    model of the run: the evaluated ones; per vertical the foundation model and every
    student variant (only the one each size serves in the headline)."""
    single = "ne" in evaluation  # one model's flat metrics
    evaluated = {"model": evaluation} if single else \
        {k: m for k, m in evaluation.items() if isinstance(m, dict)}
    out = [(_scored_on(m), name, name, _pick(m)) for name, m in evaluated.items()]
    verticals = exfm.get("verticals", {})
    for vertical, v in verticals.items():
        day = f"ExFM, day {exfm.get('eval_day', '')}, {vertical}"
        pre = EXFM + (f"{vertical}_" if len(verticals) > 1 else "")  # one: no vertical's name
        out.append((day, "teacher", f"{pre}teacher", _pick(v.get("teacher", {}))))
        for size, s in v.get("students", {}).items():
            out += [(day, f"{size}/{name}" + (" (serving)" if name == s["serving"] else ""),
                     f"{pre}{size}" if name == s["serving"] else None, _pick(m))
                    for name, m in s["variants"].items()]
    return out


def headline(evaluation: dict[str, Any], exfm: dict[str, Any]
             ) -> dict[str, dict[str, float]]:
    """{model: {ne, auc}} of the models `models` names in the headline."""
    return {name: m for _, _, name, m in models(evaluation, exfm) if name}


def exfm_part(doc: dict[str, Any]) -> dict[str, Any]:
    """The ExFM models of a headline: what this stage adds to a pipeline run's parent (the
    evaluated models are the evaluate stage's headline)."""
    return {k: v for k, v in doc.items() if k.startswith(EXFM)}


def markdown(evaluation: dict[str, Any], exfm: dict[str, Any]) -> str:
    lines = ["| scored on | model | NE | AUC |", "|---|---|---|---|"]
    for scored, model, _, m in models(evaluation, exfm):
        lines.append(f"| {scored} | {model} | {m.get('ne', float('nan')):.4f} | "
                     f"{m.get('auc', float('nan')):.4f} |")
    return "\n".join(lines) + "\n"


def run(*, evaluation: Path = Path("metrics/eval.json"),
        exfm: Path = Path("metrics/exfm.json"),
        out: Path = Path("metrics/summary.json"), table: Path = Path("metrics/summary.md"),
        force: bool = False) -> Metrics:
    """Write the headline NE/AUC of every model the pipeline trained."""
    ev, ex = _read(evaluation), _read(exfm)
    check(ev, ex, evaluation, exfm)
    doc = headline(ev, ex)
    io.write_json(doc, out, stage=NAME, force=force)
    io.write_text(markdown(ev, ex), table, stage=NAME, force=force)
    return Metrics(doc)


STAGE = Stage(
    name=NAME, run=run, reads={}, headline=exfm_part,
    args={"evaluation": Arg("--eval", "the evaluate stage's metrics", "in"),
          "exfm": Arg("--exfm", "the student stage's metrics", "in"),
          "out": Arg("--out", "headline metrics (what `dvc metrics show` lists)", "summary"),
          "table": Arg("--table", "the same as a markdown table", "out", file=True,
                       cache=False)},
)

if __name__ == "__main__":
    main(STAGE)

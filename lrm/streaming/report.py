"""The day's report: champion and challenger on the same evaluation data, the decisions and
why, the teacher's step and the collision table (markdown: a file and the Prefect artifact)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lrm.data import collisions


def _f(x: Any, digits: int = 4) -> str:
    return "n/a" if x is None else f"{float(x):.{digits}f}"


def _outcome(d: Mapping[str, Any], short: bool = False) -> str:
    """What happened to a model's version on the day, in a few words."""
    if d.get("earlier"):
        return "unchanged (the same model was registered before)"
    if d["promoted"]:
        return "promoted" if short else "promoted to @champion"
    return "kept" if short else "kept as @challenger"


def _decisions(record: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The day's registry decisions: the teacher's (when it was retrained), each student's."""
    t = record["teacher"]
    return ([t["decision"]] if t.get("due") else []) + \
        [s["decision"] for s in record["students"].values() if s.get("decision")]


def summary(record: Mapping[str, Any]) -> str:
    """The day in one line (the artifact's description): every decision of the day."""
    parts = [f"{d['name']} v{d['version']} {_outcome(d, short=True)}"
             for d in _decisions(record)]
    if not record["teacher"].get("due"):
        parts.insert(0, "teacher not due")
    return f"lrm stream day {record['day']}: " + "; ".join(parts)


def _decision_rows(model: str, d: Mapping[str, Any]) -> list[str]:
    if d.get("earlier"):  # nothing was scored today: the version's old scores are not today's
        return [f"| {model} | v{d['version']} | {_outcome(d)} | | | |"]
    ch, champ = d["challenger"], d.get("champion")
    rows = [f"| {model} | v{d['version']} | challenger | {_f(ch.get('ne'))} | "
            f"{_f(ch.get('auc'))} | {_f(ch.get('calibration'), 3)} |"]
    if champ:
        rows.append(f"| {model} | v{d['champion_version']} | champion | {_f(champ.get('ne'))} | "
                    f"{_f(champ.get('auc'))} | {_f(champ.get('calibration'), 3)} |")
    else:
        rows.append(f"| {model} | - | champion | (none yet) | | |")
    return rows


def markdown(record: Mapping[str, Any]) -> str:
    """The report of one day from its record (see flows/streaming.py)."""
    day = record["day"]
    lines = [f"# lrm stream: day {day}", "",
             f"Students trained on day {day}{' (its first part)' if not record['next_day'] else ''}"
             f"; every model scored on **{record['evaluated_on']}**.", "",
             "| model | version | role | NE | AUC | calibration |", "|---|---|---|---|---|---|"]
    t = record["teacher"]
    for d in _decisions(record):
        lines += _decision_rows(d["name"], d)
    lines += ["", "## Decisions", ""]
    for d in _decisions(record):
        then = _outcome({**d, "earlier": False})
        if d.get("earlier"):
            lines.append(f"- **{d['name']} v{d['version']}: no new version**: the model "
                         f"trained today is the one registered as v{d['version']} before; "
                         f"nothing was decided today (its decision then, on "
                         f"{d['evaluated_on']}: {then}, {d['reason']})")
        else:
            lines.append(f"- **{d['name']} v{d['version']}: {then}**: {d['reason']} "
                         f"(margin {d['margin']:g}; scored on {d['evaluated_on']})")
    for name, s in record["students"].items():
        if not s.get("decision"):  # a surface's day too small to train on, said
            lines.append(f"- **{name}: nothing registered**: {s.get('skipped')}")
    champions = [(t["decision"]["name"], t.get("champion"))] if t.get("due") else []
    champions += [(s["decision"]["name"], s.get("champion")) for s in record["students"].values()
                  if s.get("decision")]
    lines += ["", "Champions after the day: " + ", ".join(
        f"{m} @champion = v{v}" for m, v in champions if v) + "."]
    lines += ["", "## Teacher", ""]
    if t.get("due"):
        w = t["window"]
        days = f"day {w[0]}" if len(w) == 1 else f"days {w[0]}..{w[-1]}"
        lines.append(f"Retrained on {days} and scored on day {day}; "
                     f"day {day} is augmented by the champion {record['augmented_by']}.")
    else:
        nxt = f"; next retrain on day {t['next']}" if t.get("next") is not None else ""
        lines.append(f"Not due (last window ended at day {t.get('until')}{nxt}); "
                     f"augmented by the champion {record['augmented_by']}.")
    lines += ["", "## Hashed ids: collisions", "",
              "Ids map to table rows by `id mod rows`; ids that share a row share an "
              "embedding.", "", collisions.markdown(record["collisions"])]
    return "\n".join(lines)

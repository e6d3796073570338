"""Write a figure's record for the docs (docs/records/NAME.*) from a run that measured it.

    python docs/hooks/record.py exfm_ne plots/exfm_ne.csv --command "make run"
    python docs/hooks/record.py scaling scaling.jsonl --command "python bench/scaling.py"
    python docs/hooks/record.py stream stream --command "python -m flows.streaming --days 5"

exfm_ne: the `student` stage's CSV as it wrote it. scaling: the JSON lines bench/scaling.py
printed. stream: a stream folder's day records (days/day=D.json) -> per day, each vertical
model's @champion NE after the day's decision and its @challenger's NE, on the day's
evaluation data. The record starts with `# key: value` lines: the date and commit of the run
(default: today and HEAD; pass --commit/--date when the run was of another commit), the
machine (bench.common.machine(): cores, CPU, GPU, torch) and the command; the docs print them
under the figure (docs/hooks/figures.py draws it).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

RECORDS = ROOT / "docs" / "records"


def stream_rows(root: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """Per recorded day of the stream in `root`: each vertical model's champion after the
    day's decision (the challenger's NE when it was promoted) and the challenger, by NE on
    the day's evaluation data."""
    from lrm.streaming import ledger
    from lrm.streaming.layout import StreamPaths

    paths = StreamPaths(root)
    rows: list[dict[str, Any]] = []
    names: list[str] = []
    for day in ledger.recorded_days(paths):
        rec = ledger.read(paths, day)
        if rec is None:
            continue
        row: dict[str, Any] = {"day": day}
        for name, s in rec["students"].items():
            d = s["decision"]
            if d.get("earlier"):  # nothing was scored that day
                continue
            ne = d["challenger"]["ne"]
            champ = ne if d["promoted"] else (d.get("champion") or {}).get("ne")
            row[f"challenger/{name}"], row[f"champion/{name}"] = ne, champ
            names += [n for n in (f"champion/{name}", f"challenger/{name}") if n not in names]
        rows.append(row)
    if not rows:
        raise SystemExit(f"error: {root}: no recorded stream day (days/day=D.json)")
    return ["day", *names], rows


def body(kind: str, src: Path) -> str:
    if kind == "exfm_ne":
        return src.read_text()
    if kind == "scaling":
        lines = [line for line in src.read_text().splitlines() if line.startswith("{")]
        if not any(json.loads(line).get("bench") == "scaling.fm" for line in lines):
            raise SystemExit(f"error: {src}: no scaling.fm JSON line")
        return "\n".join(lines) + "\n"
    columns, rows = stream_rows(src)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    return buf.getvalue()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=["exfm_ne", "scaling", "stream"])
    ap.add_argument("src", type=Path)
    ap.add_argument("--command", required=True, help="the command that measured it")
    ap.add_argument("--commit", help="the commit the run was of (default: HEAD)")
    ap.add_argument("--date", help="the day it ran (default: today, UTC)")
    ap.add_argument("--machine", help="default: this machine (bench.common.machine())")
    ap.add_argument("--note", default="", help="conditions: load, what else ran")
    args = ap.parse_args(argv)
    from bench.common import machine

    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                           capture_output=True, text=True,
                                           check=True).stdout.strip()
    head = {"date": args.date or dt.datetime.now(dt.UTC).date().isoformat(),
            "commit": commit[:7], "machine": args.machine or machine(),
            "command": args.command}
    if args.note:
        head["note"] = args.note
    text = "".join(f"# {k}: {v}\n" for k, v in head.items()) + body(args.kind, args.src)
    ext = ".jsonl" if args.kind == "scaling" else ".csv"
    RECORDS.mkdir(parents=True, exist_ok=True)
    out = RECORDS / f"{args.kind}{ext}"
    out.write_text(text)
    print(out)


if __name__ == "__main__":
    main()

"""Which days are done, and what "the same day" means: its inputs' content and the params.

A day's key is the sha256 of the raw days it reads (the `_source.json` of every day up to
D: each file's sha256, so paths do not matter) and of the params that shape its result
(`digest`). The day's record (`days/day=D.json`) is written last, with its key: a run for a
day whose record holds the same key does nothing; a day recorded with another key cannot
be redone in place (the checkpoint chains and the registry have moved on since), which is
a ConfigError saying what differs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lrm import io
from lrm.config import ParamsConfig
from lrm.errors import ConfigError, OutputError
from lrm.streaming import sources
from lrm.streaming.layout import STAGE, StreamPaths

# params sections whose values change what a day computes (not tracking, split, evaluate)
SECTIONS = ("generate", "ingest", "dedup", "loader", "model", "train", "checkpoint", "exfm",
            "teacher", "augment", "students", "registry")
STREAMING_KEYS = ("source", "holdout", "plan")  # not root, watch, days, cron, settle


def digest(cfg: ParamsConfig) -> dict[str, Any]:
    """The params a day's result depends on, as JSON-able values."""
    out = {s: dataclasses.asdict(getattr(cfg, s)) for s in SECTIONS}
    out["streaming"] = {k: getattr(cfg.streaming, k) for k in STREAMING_KEYS}
    return json.loads(json.dumps(out, sort_keys=True, default=str))


def day_key(paths: StreamPaths, day: int, params: Mapping[str, Any]) -> str:
    """The key of day `day`: the content of raw days 0..D and the params digest."""
    inputs = []
    for d in range(day + 1):
        src = sources.read_source(paths.raw, d)
        if src is None:
            raise ConfigError(f"stream: raw day {d} is missing from {paths.raw}; day {day} "
                              "needs every day before it")
        inputs.append([f["sha256"] for f in src["files"]])
    text = json.dumps({"inputs": inputs, "params": params}, sort_keys=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def read(paths: StreamPaths, day: int) -> dict[str, Any] | None:
    try:
        doc = json.loads(paths.record(day).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _differences(then: Any, now: Any, prefix: str = "") -> list[str]:
    if isinstance(then, dict) and isinstance(now, dict):
        out = []
        for k in sorted(set(then) | set(now)):
            out += _differences(then.get(k), now.get(k), f"{prefix}{k}.")
        return out
    return [] if then == now else [f"{prefix.rstrip('.')}: {then!r} then, {now!r} now"]


def done(paths: StreamPaths, day: int, key: str, params: Mapping[str, Any]
         ) -> dict[str, Any] | None:
    """The record of day `day` when it is done with this key; None when not done yet."""
    rec = read(paths, day)
    if rec is None:
        return None
    if rec.get("key") == key:
        return rec
    diff = _differences(rec.get("params", {}), dict(params))
    what = "; ".join(diff[:5]) if diff else "the content of its raw days differs"
    raise ConfigError(f"stream: day {day} was done with other inputs or params ({what}); a "
                      f"past day is not redone (its checkpoints and versions moved on): go on "
                      f"with the next day, or start a new stream (--root)")


def write(paths: StreamPaths, day: int, record: Mapping[str, Any]) -> None:
    """Mark the day done (the last write of a day)."""
    io.write_json(dict(record), paths.record(day), stage=STAGE)


def recorded_days(paths: StreamPaths) -> list[int]:
    if not paths.days.is_dir():
        return []
    return sorted(int(p.stem[4:]) for p in paths.days.glob("day=*.json")
                  if p.stem[4:].isdigit())


def next_days(paths: StreamPaths, first: int, n: int, available: list[int] | None
              ) -> list[int]:
    """The next `n` days to process: from the first day >= `first` without a record on.

    available: the raw days there are (a folder source: only those can be processed, in
    a row); None: any day can be had (the synthetic source makes it).
    """
    have = set(recorded_days(paths))
    start = first
    while start in have:
        start += 1
    days = list(range(start, start + n))
    if available is None:
        return days
    out = []
    for d in days:
        if d not in available:
            break
        out.append(d)
    return out


def check_in_order(paths: StreamPaths, first: int, day: int) -> None:
    """A ConfigError when day `day` may not run now: a day runs once the days before it
    are done (from `first` on), since it goes on from their models and is scored against
    their champions; a day ahead of them would train the champions on a day the earlier
    ones are then scored on. A done day (a no-op, or its key differs) may be asked for."""
    pending = next_days(paths, first, 1, None)[0]
    if day > pending and day not in recorded_days(paths):
        raise ConfigError(f"--day {day}: day {pending} is not done yet, and the stream's days "
                          f"run in order (each goes on from the day before's models): run "
                          f"--day {pending}, or --days N for the next N")


def claim(paths: StreamPaths) -> None:
    """Create (or check) the stream's own folders: lrm's, marked as the stream's."""
    root = Path(paths.root)
    if root.exists() and not root.is_dir():
        raise OutputError(f"{root}: the stream's folder is a file; give streaming.root "
                          "(--root) a folder")
    root.mkdir(parents=True, exist_ok=True)
    for p in paths.owned():
        io.claim_dir(p, STAGE)

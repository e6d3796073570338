"""Getting the stream's days: the synthetic world's next day, or files dropped in an inbox.

Each day lands in `raw/day=D/` (impressions layout) beside `_source.json`: where it came
from and the sha256 of every file, the content the day's key is made of (lrm.streaming.
ledger), so a day is the same day whatever path it was read from.

* synthetic: `lrm.data.synthetic.generate_day(generate, D)`: any day of the world the
  `generate` params describe, deterministic (the same params give the same bytes).
* folder: every file in the inbox that no day holds yet (by content, not by name: a .gz
  file's decompressed bytes count too, so a gzipped copy of a day's file is that day), in
  name order, becomes the next day: an impressions-layout Parquet file written by lrm
  (`lrm generate`, or an export with the lrm schema); or, where `ingest.logs` maps a click
  log (a label or an exploded column is named), a log file of any kind `lrm ingest logs`
  reads, through that mapping (the whole file is the day); else a Criteo TSV file (`lrm
  ingest criteo`'s reader). Its rows are renumbered to the day it becomes. The inbox's
  files are only read, never moved or removed.

  A file is taken whole, once it has settled: unchanged (size and mtime) for
  `streaming.settle` seconds before it is read, and while it is read. One still being
  written waits, and the files after it too (days keep the inbox's order). A writer that
  cannot pause writes under a name the inbox does not read (`.day2.csv`, `day2.csv.part`)
  and renames the file in when it is whole (a rename keeps the mtime of the last write).
  A day's file is read once: the same name with other bytes later is refused, named ("day2.csv
  changed since it became day 2"), not taken as another day.

A log day continues the one before it: its ids come from the vocabularies of the days
before (a value keeps its id; new ones are appended), its dense columns are scaled as day
0's were, and its histories reach back over every earlier day's clicks, so its times come
after theirs (lrm.data.logs.ingest.check_continues: a recompressed copy of a day is refused
there, though its bytes differ). That state lives
in each raw day's folder (``raw/day=D/_ingest/``: as it stands after day D). In the stream
the schema names no vocabulary (the tables keep `model.tables`' rows day after day, so an
id space that grows is hashed into them like Criteo's, not cut at day 0's size).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lrm import io
from lrm.config import GenerateConfig, IngestConfig, StreamingConfig
from lrm.data.logs import LOG_SUFFIXES
from lrm.data.logs.files import content_sha256
from lrm.data.schema import DAY, META_KEY, SESSION, FeatureSchema, day_files, part_path, \
    read_schema
from lrm.errors import DataError
from lrm.streaming.layout import STAGE

log = logging.getLogger("lrm")
SOURCE = "_source.json"
STATE = "_ingest"  # a log day's ingest state (lrm.data.logs.ingest.STATE)
SUFFIXES = (".parquet", ".tsv")
SESSION_BITS = 40  # a log day's session ids: day << 40 | n (lrm.data.logs.cells)


def read_source(raw: Path, day: int) -> dict[str, Any] | None:
    """The `_source.json` of raw day `day`, or None when the day is not there (complete)."""
    try:
        doc = json.loads((Path(raw) / f"day={day}" / SOURCE).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def raw_days(raw: Path) -> list[int]:
    """The complete raw days (those with their `_source.json`), in order."""
    if not Path(raw).is_dir():
        return []
    found = []
    for d in Path(raw).iterdir():
        if d.name.startswith("day=") and d.name[4:].isdigit() and (d / SOURCE).is_file():
            found.append(int(d.name[4:]))
    return sorted(found)


def _write_day(table: pa.Table, raw: Path, day: int, origin: dict[str, Any],
               state: Path | None = None) -> dict[str, Any]:
    """raw/day=D/part-00000.parquet and its `_source.json` (and a log day's ingest `state`
    folder), atomically."""
    with io.atomic_dir(Path(raw) / f"day={day}", stage=STAGE) as tmp:
        f = part_path(raw, day, 0).name
        io.write_parquet(table, tmp / f)
        if state is not None:
            shutil.copytree(state, tmp / STATE)
        doc = {"day": day, "origin": origin, "rows": table.num_rows,
               "files": [{"file": f, "sha256": io.read_sha256(tmp / f)}]}
        io.write_json(doc, tmp / SOURCE)
    return doc


def synthetic_day(cfg: GenerateConfig, day: int, raw: Path) -> dict[str, Any]:
    """Day `day` of the synthetic world in raw/day=D (generated once; then read back)."""
    from lrm.data import synthetic  # numpy work: only when a day is generated

    found = read_source(raw, day)
    if found is not None:
        return found
    table = synthetic.generate_day(cfg, day)
    log.info("stream: generated synthetic day %d (%d impressions)", day, table.num_rows)
    return _write_day(table, raw, day, {"source": "synthetic", "seed": cfg.seed})


def maps_logs(ingest: IngestConfig) -> bool:
    """Whether `ingest.logs` maps a click log (then inbox logs go through it)."""
    return bool(ingest.logs.label or ingest.logs.explode)


def _lrm_parquet(path: Path) -> bool:
    if path.suffix != ".parquet":
        return False
    try:
        read_schema(path)
    except DataError:
        return False
    return True


def _log_day(path: Path, ingest: IngestConfig, raw: Path, day: int, max_history: int,
             tmp: Path) -> tuple[pa.Table, Path]:
    """An inbox log through `ingest.logs`, continuing the newest earlier day's state: the
    day's impressions (renumbered, no vocabulary in the schema) and its state folder."""
    from lrm.data.logs import ingest as logs

    earlier = [d for d in raw_days(raw) if d < day and (raw / f"day={d}" / STATE).is_dir()]
    prior = raw / f"day={earlier[-1]}" if earlier else None
    cfg = dataclasses.replace(ingest.logs, days="one", files=[])
    logs.ingest([path], tmp / "raw", cfg, chunk_rows=ingest.chunk_rows,
                max_history=max_history, prior=prior)
    table = pa.concat_tables([pq.read_table(f) for fs in day_files(tmp / "raw").values()
                              for f in fs])
    schema = FeatureSchema.from_json(table.schema.metadata[META_KEY].decode())
    target = dataclasses.replace(schema, vocab={}).arrow("impressions")
    low = pc.bit_wise_and(table.column(SESSION), pa.scalar((1 << SESSION_BITS) - 1, pa.int64()))
    table = table.set_column(table.schema.get_field_index(SESSION), SESSION,
                             pc.add(low, pa.scalar(day << SESSION_BITS, pa.int64())))
    return table.cast(target), tmp / "raw" / STATE


def _dropped_table(path: Path, ingest: IngestConfig) -> pa.Table:
    """An inbox file as one impressions table (Parquet with the lrm schema, or Criteo TSV)."""
    if path.suffix == ".tsv":
        from lrm.data import criteo

        with io.scratch_dir("lrm-inbox-") as tmp:
            criteo.ingest([path], Path(tmp) / "raw", IngestConfig(
                skip_bad=ingest.skip_bad, days="one", chunk_rows=ingest.chunk_rows))
            files = [f for fs in day_files(Path(tmp) / "raw").values() for f in fs]
            return pa.concat_tables([pq.read_table(f) for f in files])
    _, layout = read_schema(path)
    if layout != "impressions":
        raise DataError(path, None, None, f"the inbox takes impressions-layout files (one row "
                                          f"per impression), found {layout}")
    return pq.read_table(path)


def _inbox(watch: Path, ingest: IngestConfig) -> list[Path]:
    logs = maps_logs(ingest)
    return io.in_order(p for p in watch.iterdir() if p.is_file() and not p.name.startswith(".")
                       and (p.suffix in SUFFIXES or logs and p.name.endswith(LOG_SUFFIXES)))


def _content_sha256(path: Path) -> str | None:
    """The sha256 of a .gz file's decompressed bytes (None for other files): a compressed
    copy of a day's file, or the plain copy of a compressed one, is the same day."""
    return content_sha256(path) if path.name.endswith(".gz") else None


def not_taken(watch: Path, ingest: IngestConfig) -> list[str]:
    """The names of the inbox's files that no source reads (said when no day is new)."""
    if not Path(watch).is_dir():
        return []
    taken = set(_inbox(watch, ingest))
    return sorted(p.name for p in Path(watch).iterdir() if p.is_file() and p not in taken
                  and not p.name.startswith("."))


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def _unsettled(path: Path, settle: float) -> str | None:
    """Why `path` is not taken yet (None: it has gone unchanged for `settle` seconds)."""
    age = time.time() - path.stat().st_mtime
    if age >= settle:
        return None
    return (f"{path.name} changed {max(age, 0):.0f} s ago: taken once it has not changed for "
            f"{settle:g} s (streaming.settle; or write it under another name and rename it "
            f"in whole); the files after it wait")


def settling(watch: Path, ingest: IngestConfig, settle: float) -> list[str]:
    """The names of the inbox's files a source reads that changed within `settle` seconds
    (not taken yet: said when no day is new)."""
    if not Path(watch).is_dir():
        return []
    return [p.name for p in _inbox(Path(watch), ingest) if _unsettled(p, settle)]


def folder_days(watch: Path, raw: Path, ingest: IngestConfig,
                max_history: int = GenerateConfig().max_history,
                unfit: Callable[[pa.Table], str | None] | None = None,
                settle: float = StreamingConfig().settle) -> list[int]:
    """Make every settled inbox file no day holds yet the next raw day; the new days, in
    order. max_history: a log's histories' longest (generate.max_history); unfit: why a
    file's impressions cannot be a day (None: they can), a DataError naming the file (it is no
    day; the days after it wait until it is removed or replaced); settle: the seconds a file
    must go unchanged before it is taken (streaming.settle: one still being written and the
    files after it wait for a later run). A day's file changed since it became that day is a
    DataError naming both."""
    watch = Path(watch)
    if not watch.is_dir():
        return []
    days = raw_days(raw)
    origins = {d: (read_source(raw, d) or {}).get("origin", {}) for d in days}
    held = {o.get(k) for o in origins.values() for k in ("sha256", "content_sha256")} - {None}
    became = {o["file"]: d for d, o in origins.items() if o.get("file")}  # the newest day's
    first = read_schema(raw)[0] if days else None
    nxt = days[-1] + 1 if days else 0
    new = []
    for f in _inbox(watch, ingest):
        if why := _unsettled(f, settle):
            log.warning("stream: %s", why)
            break
        stamp = _stamp(f)
        sha = io.read_sha256(f)
        if sha in held:
            continue
        content = _content_sha256(f)  # read again only when the bytes are new
        if content in held:
            continue
        if f.name in became:  # its day was made of other bytes: half a file, or appended to
            d = became[f.name]
            raise DataError(f, None, None, f"{f.name} changed since it became day {d} "
                                           f"(sha256 {origins[d]['sha256'][:12]} then, "
                                           f"{sha[:12]} now): a day's file is read once, "
                                           f"whole. Put later rows in a file of a new name, "
                                           f"and restore or remove this one")
        with io.scratch_dir("lrm-inbox-") as tmp:
            state = None
            if maps_logs(ingest) and not _lrm_parquet(f):
                table, state = _log_day(f, ingest, Path(raw), nxt, max_history, Path(tmp))
            else:
                table = _dropped_table(f, ingest)
            schema = FeatureSchema.from_json(table.schema.metadata[META_KEY].decode())
            if first is not None and schema.sparse_features != first.sparse_features:
                raise DataError(f, None, None, f"its features differ from the stream's "
                                               f"({first.name!r} schema); one stream, one "
                                               f"schema")
            why = unfit(table) if unfit is not None else None
            if why is not None:
                raise DataError(f, None, None, f"cannot be the stream's day {nxt}: {why}. "
                                               f"Join it to a bigger file, or remove it from "
                                               f"the inbox (no day is made of it)")
            if _stamp(f) != stamp:
                log.warning("stream: %s changed while it was read: taken once it has not "
                            "changed for %g s (streaming.settle); the files after it wait",
                            f.name, settle)
                break
            first = first or schema
            i = table.schema.get_field_index(DAY)
            table = table.set_column(i, table.schema.field(i),
                                     pa.array([nxt] * table.num_rows,
                                              table.schema.field(i).type))
            origin = {"source": "folder", "file": f.name, "sha256": sha}
            _write_day(table, raw, nxt, origin | ({"content_sha256": content} if content
                                                  else {}), state)
        log.info("stream: %s is day %d (%d impressions)", f, nxt, table.num_rows)
        held |= {sha, content} - {None}
        new.append(nxt)
        nxt += 1
    return new

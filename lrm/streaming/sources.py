"""Getting the stream's days: the synthetic world's next day, or files dropped in an inbox.

Each day lands in `raw/day=D/` (impressions layout) beside `_source.json`: where it came
from and the sha256 of every file, the content the day's key is made of (lrm.streaming.
ledger), so a day is the same day whatever path it was read from.

* synthetic: `lrm.data.synthetic.generate_day(generate, D)`: any day of the world the
  `generate` params describe, deterministic (the same params give the same bytes).
* folder: every file in the inbox that no day holds yet (by content, not by name), in
  name order, becomes the next day: an impressions-layout Parquet file written by lrm
  (`lrm generate`, or an export with the lrm schema), or a Criteo TSV file (`lrm ingest
  criteo`'s reader). Its rows are renumbered to the day it becomes. The inbox's files are
  only read, never moved or removed.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from lrm import io
from lrm.config import GenerateConfig, IngestConfig
from lrm.data.schema import DAY, day_files, part_path, read_schema
from lrm.errors import DataError
from lrm.streaming.layout import STAGE

log = logging.getLogger("lrm")
SOURCE = "_source.json"
SUFFIXES = (".parquet", ".tsv")


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


def _write_day(table: pa.Table, raw: Path, day: int, origin: dict[str, Any]) -> dict[str, Any]:
    """raw/day=D/part-00000.parquet and its `_source.json`, atomically."""
    with io.atomic_dir(Path(raw) / f"day={day}", stage=STAGE) as tmp:
        f = part_path(raw, day, 0).name
        io.write_parquet(table, tmp / f)
        doc = {"day": day, "origin": origin, "rows": table.num_rows,
               "files": [{"file": f, "sha256": io.sha256_file(tmp / f)}]}
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


def _dropped_table(path: Path, ingest: IngestConfig) -> pa.Table:
    """An inbox file as one impressions table (Parquet with the lrm schema, or Criteo TSV)."""
    if path.suffix == ".tsv":
        from lrm.data import criteo

        with tempfile.TemporaryDirectory(prefix="lrm-inbox-") as tmp:
            criteo.ingest([path], Path(tmp) / "raw", IngestConfig(
                skip_bad=ingest.skip_bad, days="one", chunk_rows=ingest.chunk_rows))
            files = [f for fs in day_files(Path(tmp) / "raw").values() for f in fs]
            return pa.concat_tables([pq.read_table(f) for f in files])
    _, layout = read_schema(path)
    if layout != "impressions":
        raise DataError(path, None, None, f"the inbox takes impressions-layout files (one row "
                                          f"per impression), found {layout}")
    return pq.read_table(path)


def folder_days(watch: Path, raw: Path, ingest: IngestConfig) -> list[int]:
    """Make every inbox file no day holds yet the next raw day; the new days, in order."""
    watch = Path(watch)
    if not watch.is_dir():
        return []
    days = raw_days(raw)
    held = {(read_source(raw, d) or {}).get("origin", {}).get("sha256") for d in days}
    first = read_schema(raw)[0] if days else None
    nxt = days[-1] + 1 if days else 0
    new = []
    for f in sorted(p for p in watch.iterdir() if p.is_file() and p.suffix in SUFFIXES
                    and not p.name.startswith(".")):
        sha = io.sha256_file(f)
        if sha in held:
            continue
        table = _dropped_table(f, ingest)
        schema = read_schema(f)[0] if f.suffix == ".parquet" else None
        if first is not None and schema is not None and schema.sparse_features != \
                first.sparse_features:
            raise DataError(f, None, None, f"its features differ from the stream's "
                                           f"({first.name!r} schema); one stream, one schema")
        i = table.schema.get_field_index(DAY)
        table = table.set_column(i, table.schema.field(i),
                                 pa.array([nxt] * table.num_rows, table.schema.field(i).type))
        _write_day(table, raw, nxt, {"source": "folder", "file": f.name, "sha256": sha})
        log.info("stream: %s is day %d (%d impressions)", f, nxt, table.num_rows)
        held.add(sha)
        new.append(nxt)
        nxt += 1
    return new

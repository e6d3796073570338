"""`lrm ingest logs`: any click log, through a column mapping, into the impressions layout.

Three steps, the first and last made of independent units (lrm.fanout: in this process
here, files one after the other and days two at a time; tasks of a Prefect flow's task
runner there):

1. **read** each file (a unit per file): stream it in chunks, check and parse every mapped
   column (lrm.data.logs.read), explode page views, take each row's day from its time, and
   spill the chunk to local Arrow files cut by (day, user bucket) (lrm.data.logs.spill);
   gather each vocabulary's distinct values and each dense column's moments.
2. **plan** (one step, small): the vocabularies' ids (lrm.data.logs.vocab), the dense
   scalings (lrm.data.logs.dense), the day numbers (the first day of the data is day 0),
   the schema; written to ``OUT/_ingest/``.
3. **write** each day (a unit per day): its cells one by one into sessions, positions and
   histories (lrm.data.logs.cells), as ``OUT/day=D/part-NNNNN.parquet``.

Memory holds chunks (`chunk_rows`) while reading and cells (user buckets of a day, packed
to about a chunk's rows) while writing, plus the vocabularies; never a file or a day. Each
step overlaps its input and output with its work (lrm.data.logs.ahead): the next chunk is
read while one is parsed and the one before is spilled, so memory holds three chunks at
most; one cell is built at a time (`_BUILDING`) while the cells before, of this day and of
the other day being written, are encoded (`_Parts`), so memory holds a cell and two tables.
Every check of a value happens in step 1, before anything is written into `out`; an
impression read twice (every mapped column equal: a copy, an overlapping export) is found
in step 3, where a user's rows meet in one cell; `out` is callers' `lrm.io.atomic_dir`, so
a failure leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import itertools
import json
import logging
import math
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from lrm import fanout, io
from lrm.config import LogsConfig
from lrm.data import parquet
from lrm.data.logs import blocks, cells, checks, culprits, frame, read, spill, vocab
from lrm.data.logs.ahead import Behind
from lrm.data.logs.dense import Stats
from lrm.data.logs.files import GZIP_ERRORS, Source, gzip_error, sources
from lrm.data.schema import SESSION as SESSION_COL
from lrm.data.schema import FeatureSchema, part_path
from lrm.errors import ConfigError, DataError

log = logging.getLogger("lrm")
STATE = "_ingest"  # OUT/_ingest/state.json and vocab/*.parquet
STATE_VERSION = 1
CLICKS = "clicks.parquet"  # in STATE: each user's recent clicks (history auto)
# days written at once by the default mapper, one cell built at a time (`_BUILDING`): a
# day's cell is built while the day before is still encoded (memory: a cell, two tables)
DAY_THREADS = 2
_BUILDING = threading.Lock()
PRIOR_DAY = -(2**31)  # the day of a prior ingest's clicks: before any of this one's
PART_ROWS = 1_000_000  # impressions per written part file (a part holds whole cells)
_MAPPING_FIELDS = [f.name for f in dataclasses.fields(LogsConfig)
                   if f.name not in ("files", "format", "columns")]


# -- the mapping's roles -------------------------------------------------------------------


def check_mapping(cfg: LogsConfig) -> LogsConfig:
    """The mapping as it will run (history auto off where the log cannot give one), or a
    ConfigError saying what a role needs."""
    if cfg.explode and cfg.label:
        raise ConfigError("ingest.logs: with explode the labels come from the shown items "
                          "(ITEM-LABEL); leave label out")
    if not cfg.explode and not cfg.label:
        raise ConfigError("ingest.logs.label: name the click column (--label COL)")
    if not frame.item_name(cfg) and not cfg.categorical and not cfg.item_attributes:
        raise ConfigError("ingest.logs: a log needs an item (--item) or categorical "
                          "columns: the model has nothing per impression otherwise")
    for key in ("item_attributes", "item_dense"):
        if getattr(cfg, key) and not frame.item_name(cfg):
            raise ConfigError(f"ingest.logs.{key}: they are a function of the item; "
                              "name it (--item)")
    if cfg.session_gap and not (cfg.user and cfg.time):
        raise ConfigError("ingest.logs.session_gap: sessions by gap need --user and --time")
    if cfg.days == "time" and not cfg.time:
        raise ConfigError("ingest.logs.days: days from the data's time need --time "
                          "(or --days file | one)")
    if cfg.history == "auto" and not (cfg.user and cfg.time and frame.item_name(cfg)):
        log.info("ingest logs: no history (history auto needs a user, an item and a time)")
        cfg = dataclasses.replace(cfg, history="none")
    if cfg.history not in ("auto", "none") and not frame.item_name(cfg):
        raise ConfigError("ingest.logs.history: a history column holds items; name the "
                          "item (--item)")
    reserved = {"day", "session_id", "position", "label"}
    names = feature_names(cfg)
    clash = sorted(set(names) & reserved)
    if clash or len(set(names)) != len(names):
        raise ConfigError(f"ingest.logs: feature names {clash or names} clash (day, "
                          f"session_id, position and label are the layout's own)")
    return cfg


def feature_names(cfg: LogsConfig) -> list[str]:
    return [n for n in (cfg.user, cfg.vertical, *cfg.sequence, frame.history_name(cfg),
                        frame.item_name(cfg), *cfg.item_attributes, *cfg.categorical,
                        *frame.dense_names(cfg)) if n]


def schema_of(cfg: LogsConfig, sizes: dict[str, int],
              vertical_names: tuple[str, ...] = ()) -> FeatureSchema:
    """The dataset's schema; `vertical_names`: the vertical column's raw values by id (its
    vocabulary's order), what the vertical models are named after (tab1-small, not
    v0-small)."""
    hist = frame.history_name(cfg)
    item = frame.item_name(cfg)
    return FeatureSchema(
        name="logs",
        user_sparse=tuple(c for c in (cfg.user, cfg.vertical) if c),
        user_seq=tuple([*cfg.sequence, *([hist] if hist else [])]),
        item_sparse=tuple([*([item] if item else []), *cfg.item_attributes, *cfg.categorical]),
        dense=tuple(frame.dense_names(cfg)),
        vocab=dict(sizes),
        user_key=cfg.user or None,
        item_key=item or None,
        vertical=cfg.vertical or None,
        vertical_names=vertical_names,
    )


def features(cfg: LogsConfig) -> dict[str, tuple[str, str]]:
    """feature -> (its typed column, its vocabulary); the history shares the item's."""
    item = frame.item_name(cfg)
    out = {}
    if cfg.user:
        out[cfg.user] = (frame.USER, cfg.user)
    for c in ([cfg.vertical] if cfg.vertical else []) + cfg.item_attributes + cfg.categorical:
        out[c] = (f"c:{c}", c)
    for c in cfg.sequence:
        out[c] = (f"q:{c}", c)
    if cfg.history == "auto":
        out["history"] = ("auto", item)
    elif cfg.history != "none":
        out[cfg.history] = (f"q:{cfg.history}", item)
    if item:
        out[item] = (frame.ITEM, item)
    return out


# -- sizes: how many buckets ---------------------------------------------------------------


def _head_bytes(path: Path, n: int = 1 << 20) -> tuple[bytes, float]:
    """The first `n` bytes of the file's text and the ratio of text to file bytes."""
    if path.name.endswith(".gz"):
        try:
            with open(path, "rb") as raw, gzip.open(raw) as f:
                data = f.read(n)
                used = max(raw.tell(), 1)
        except GZIP_ERRORS as e:  # not gzip, or cut short: exit 2, naming the file
            raise gzip_error(path, e) from None
        return data, len(data) / used
    with open(path, "rb") as f:
        return f.read(n), 1.0


def estimate_rows(src: Source, lf: pl.LazyFrame, cfg: LogsConfig) -> int:
    """About how many impressions the file holds (for the cell size only)."""
    per_row = 1.0
    head = None
    if cfg.explode:  # (reading it costs)
        try:
            head = lf.head(2_000).collect()
        except (pl.exceptions.PolarsError, OSError):
            head = None  # a bad row among the first: the read names it
    if head is not None and head.height:
        p = checks.id_list(src, cfg.explode, head.schema[cfg.explode], cfg.item_sep, "explode")
        per_row = max(1.0, float(head.select(p.value.list.len().mean()).item() or 1.0))
    if src.format == "parquet":
        rows = lf.select(pl.len()).collect().item()
    else:
        data, ratio = _head_bytes(src.path)
        lines = max(1, data.count(b"\n"))
        rows = int(src.path.stat().st_size * ratio / (len(data) / lines)) if data else 0
    return int(rows * per_row)


# -- step 1: read a file -------------------------------------------------------------------


@dataclass
class FileRead:
    """What reading one file gave: its spilled chunks, vocabularies' values, dense moments."""

    source: Source
    spilled: list[spill.Spilled] = field(default_factory=list)
    values: dict[str, pl.DataFrame] = field(default_factory=dict)
    dense: dict[str, Stats] = field(default_factory=dict)
    rows: int = 0  # input rows (page views, with explode)
    impressions: int = 0
    clicks: int = 0
    label_kind: str = "binary"
    days: set[int] = field(default_factory=set)
    times: tuple[int, int] | None = None  # the first and last time (us since the epoch)
    time_rows: tuple[int, int] = (0, 0)  # the rows (1-based) that hold them


def read_file(src: Source, cfg: LogsConfig, buckets: int, spill_dir: Path,
              chunk_rows: int) -> FileRead:
    """Step 1 for one file (a unit of `fanout`)."""
    lf = blocks.scan(src, cfg)
    types = blocks.check_columns(src, lf, cfg)
    parser = read.Parser(src, types, cfg, buckets)
    out = FileRead(src)
    values: dict[str, vocab.Values] = {}
    auto = cfg.history == "auto"
    spilling = Behind("lrm-ingest-spill")  # a chunk spilled while the next is parsed
    try:
        for k, chunk in enumerate(blocks.chunks(src, types, cfg, chunk_rows)):
            try:
                p = parser.parse(chunk)
            except read.TextNeeded:  # its error as the text shows it
                chunk = _text_chunk(src, types, cfg, chunk_rows, k)
                p = parser.parse(chunk)
            out.rows += chunk.height
            out.impressions += p.frame.height
            out.clicks += int(p.frame[frame.LABEL].sum())
            out.label_kind = p.label_kind
            out.days |= set(p.frame[frame.DAY].unique().to_list())
            if frame.TIME in p.frame.columns and p.frame.height:
                t, r = p.frame[frame.TIME], p.frame[frame.ROW]
                i, j = t.arg_min(), t.arg_max()
                (lo, hi), rows = out.times or (int(t[i]), int(t[j])), out.time_rows
                if out.times is None or t[i] < lo:
                    lo, rows = int(t[i]), (int(r[i]), rows[1])
                if out.times is None or t[j] > hi:
                    hi, rows = int(t[j]), (rows[0], int(r[j]))
                out.times, out.time_rows = (lo, hi), rows
            for name, piece in p.values.items():
                values.setdefault(name, vocab.Values()).add(piece)
            if p.frame.height:  # (its dense moments there too: a tenth of the read)
                before = spilling.submit(_spill, p.frame,
                                         spill_dir / f"f{src.index}-c{k}.arrow", auto, cfg)
                if before is not None:  # (the chunk before's)
                    _took(out, *before)
            else:
                _took(out, None, _moments(p.frame, cfg))
    except BaseException:
        spilling.close(quiet=True)  # (the error raised here says what went wrong first)
        raise
    if (last := spilling.close()) is not None:
        _took(out, *last)
    out.values = {n: v.flush() for n, v in values.items()}
    return out


def _spill(chunk: pl.DataFrame, path: Path, clicks: bool, cfg: LogsConfig
           ) -> tuple[spill.Spilled, dict[str, Stats]]:
    """A parsed chunk spilled (`spill.write`) and its dense columns' moments (`Stats`),
    on the thread beside the read."""
    return spill.write(chunk, path, clicks), _moments(chunk, cfg)


def _moments(chunk: pl.DataFrame, cfg: LogsConfig) -> dict[str, Stats]:
    return {c: Stats.of(chunk[f"d:{c}"]) for c in frame.dense_names(cfg)}


def _took(out: FileRead, spilled: spill.Spilled | None, moments: dict[str, Stats]) -> None:
    """A chunk's spill and moments into the file's read (in chunk order: the moments'
    merge is exact only in one order)."""
    if spilled is not None:
        out.spilled.append(spilled)
    for c, st in moments.items():
        out.dense[c] = out.dense[c].merge(st) if c in out.dense else st


def _text_chunk(src: Source, types: dict[str, pl.DataType], cfg: LogsConfig,
                chunk_rows: int, k: int) -> pl.DataFrame:
    """Chunk `k` of the file again, every column as text (the same rows: chunks are cut
    alike)."""
    again = blocks.chunks(src, types, cfg, chunk_rows, typed=False)
    try:
        return next(itertools.islice(again, k, None))
    finally:
        again.close()  # type: ignore[attr-defined]


# -- step 2: plan --------------------------------------------------------------------------


@dataclass(frozen=True)
class State:
    """What an ingest decided, kept with its dataset (`OUT/_ingest/`) so that a later ingest
    of more days (the stream) continues it: the mapping, vocabularies, scalings, days."""

    mapping: dict[str, Any]
    vocabs: dict[str, pl.DataFrame]
    dense: dict[str, dict[str, Any]]
    first_day: int  # the absolute day (days since the epoch, or file index) of day 0
    label_kind: str
    # history auto: each user's last max_history clicks (user, item: ids; time: us), the
    # history a later day continues from
    clicks: pl.DataFrame | None = None
    # the latest time read (us since the epoch) by this ingest and those it continues: a
    # later ingest's rows come after it (None: no time column, or a state written before)
    last_time: int | None = None

    def save(self, folder: Path) -> None:
        names = sorted(self.vocabs)
        files = {n: f"vocab/{i:03d}.parquet" for i, n in enumerate(names)}
        vocab.save({files[n][6:-8]: self.vocabs[n] for n in names}, folder / "vocab")
        if self.clicks is not None:
            io.write_parquet(self.clicks.to_arrow(), folder / CLICKS)
        io.write_json({"version": STATE_VERSION, "mapping": self.mapping,
                       "vocab": {n: {"file": files[n], "size": self.vocabs[n].height}
                                 for n in names},
                       "dense": self.dense, "first_day": self.first_day,
                       "label": self.label_kind, "last_time": self.last_time},
                      folder / "state.json")

    @classmethod
    def load(cls, folder: Path) -> State:
        f = Path(folder) / "state.json"
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError) as e:
            raise DataError(f, None, None, f"cannot read the ingest state: {e}") from None
        vocabs = {n: pl.read_parquet(Path(folder) / v["file"]) for n, v in doc["vocab"].items()}
        clicks = Path(folder) / CLICKS
        last = doc.get("last_time")
        return cls(doc["mapping"], vocabs, doc["dense"], int(doc["first_day"]), doc["label"],
                   pl.read_parquet(clicks) if clicks.exists() else None,
                   None if last is None else int(last))


def mapping_of(cfg: LogsConfig) -> dict[str, Any]:
    return {k: getattr(cfg, k) for k in _MAPPING_FIELDS}


def plan(reads: list[FileRead], cfg: LogsConfig, max_history: int,
         prior: State | None) -> tuple[State, cells.Plan]:
    """Step 2: vocabularies, scalings and day numbers from every file's read."""
    mapping = mapping_of(cfg)
    # a key the prior state lacks (written before the key was) held its default
    before = {**mapping_of(LogsConfig()), **prior.mapping} if prior is not None else mapping
    if before != mapping:
        diff = sorted(k for k in mapping if before.get(k) != mapping[k])
        raise ConfigError(f"ingest.logs: the mapping differs from the one the dataset was "
                          f"ingested with ({', '.join(diff)}); one dataset, one mapping")
    days = sorted(set().union(*(r.days for r in reads)))
    first_day = prior.first_day if prior is not None else (days[0] if days else 0)
    names = set(v for _, v in features(cfg).values())
    vocabs = {}
    for name in sorted(names):
        seen = vocab.Values()
        for r in reads:
            if name in r.values:
                seen.add(r.values[name])
        vocabs[name] = vocab.assign(seen.flush(), prior.vocabs.get(name) if prior else None,
                                    first_day)
    if prior is not None:
        dense = prior.dense
    else:
        dense = {}
        for c in frame.dense_names(cfg):
            st = None
            for r in reads:
                st = r.dense[c] if st is None else st.merge(r.dense[c])
            dense[c] = (st or Stats.of(pl.Series([], dtype=pl.Float64))).decide()
    kinds = {r.label_kind for r in reads if r.impressions}
    label_kind = "bool" if "bool" in kinds else ("count" if "count" in kinds else "binary")
    ends = [r.times[1] for r in reads if r.times is not None]
    if prior is not None and prior.last_time is not None:
        ends.append(prior.last_time)
    state = State(mapping, vocabs, dense, first_day, label_kind,
                  last_time=max(ends) if ends else None)
    feats = features(cfg)
    sizes = {f: vocabs[v].height for f, (_, v) in feats.items()}
    names = tuple(vocabs[cfg.vertical]["s"].to_list()) if cfg.vertical else ()
    schema = schema_of(cfg, sizes, names)
    lookups = {n: vocab.Lookup(v) for n, v in vocabs.items()}
    return state, cells.Plan(cfg, schema, feats, lookups, dense, max_history)


def prior_clicks(state: State, cfg: LogsConfig, buckets: int, path: Path) -> FileRead:
    """A dataset's recent clicks as a read of this ingest: spilled into its buckets, so that
    the histories of a continued ingest's first sessions reach back over earlier days."""
    c = state.clicks
    assert c is not None
    users = state.vocabs[cfg.user]["s"].gather(c["user"]).hash(frame.SEED)
    items = state.vocabs[frame.item_name(cfg)]["s"].gather(c["item"]).hash(frame.SEED)
    clicks = pl.DataFrame({frame.USER: users, frame.TIME: c["time"], frame.ITEM: items}).select(
        *spill.CLICK_COLUMNS[:3], pl.lit(-1, pl.Int32).alias(frame.FILE),
        pl.int_range(pl.len(), dtype=pl.UInt32).alias(frame.ROW),
        pl.lit(0, pl.Int32).alias(frame.POS), pl.lit(1, pl.Int8).alias(frame.LABEL),
        pl.lit(PRIOR_DAY, pl.Int32).alias(frame.DAY),  # before every day of this ingest
        frame.bucket_of(pl.col(frame.USER), buckets).alias(frame.BUCKET))
    return FileRead(Source(path, -1, "parquet"),
                    spilled=[spill.write(clicks, path, clicks=True, cells=False)])


def recent_clicks(reads: list[FileRead], p: cells.Plan, k: int) -> pl.DataFrame:
    """Each user's last `k` clicks (user, item: ids; time) over every read (the prior's too)."""
    c = spill.read_clicks([s for r in reads for s in r.spilled])
    user = p.lookups[p.cfg.user](c[frame.USER].to_numpy())
    item = p.lookups[frame.item_name(p.cfg)](c[frame.ITEM].to_numpy())
    df = c.select(frame.TIME, frame.FILE, frame.ROW, frame.POS).with_columns(
        pl.Series("user", user), pl.Series("item", item))
    return (df.sort(["user", frame.TIME, frame.FILE, frame.ROW, frame.POS])
            .group_by("user", maintain_order=True).tail(k)
            .select("user", "item", pl.col(frame.TIME).alias("time")))


def _field_metadata(schema: FeatureSchema, p: cells.Plan) -> Any:
    """The impressions schema with each dense column's scaling in its field metadata."""
    target = schema.arrow("impressions")
    for c, how in p.dense.items():
        i = target.get_field_index(c)
        target = target.set(i, target.field(i).with_metadata(
            {b"lrm.scaling": json.dumps(how, sort_keys=True).encode()}))
    return target


# -- step 3: write a day -------------------------------------------------------------------


@dataclass(frozen=True)
class DayUnit:
    """One day to write: its number in the data, in the dataset, and where its cells are."""

    day: int  # absolute (the spill's)
    out_day: int
    cell_rows: int  # its buckets are packed into cells of at most this many rows (but one)


def pack(rows: dict[int, int], limit: int) -> list[list[int]]:
    """Consecutive buckets (those with rows, in order) in groups of at most `limit` rows (a
    larger bucket alone): fewer, larger cells, each still about a chunk."""
    groups: list[list[int]] = []
    held = 0
    for b in sorted(rows):
        if not groups or held + rows[b] > limit:
            groups.append([])
            held = 0
        groups[-1].append(b)
        held += rows[b]
    return groups


class _Parts:
    """A day's part files, written by one background thread in the order given (pyarrow
    writes without the GIL: the next cell is built meanwhile); at most one write waits."""

    def __init__(self, out: Path, day: int, target: Any) -> None:
        self.out, self.day, self.target = out, day, target
        # every column a dictionary but the session id (unique and increasing: its
        # dictionary only costs; without, 9% less encode time and 12% smaller files)
        self.dictionary = [parquet.leaf(f)[0] for f in target if f.name != SESSION_COL]
        self.behind = Behind("lrm-ingest-write")
        self.writer: pq.ParquetWriter | None = None
        self.path: Path | None = None
        self.parts = self.bytes = 0
        self.in_part = 0

    def add(self, table: pa.Table) -> None:
        """Write `table` (a cell's rows: a part holds whole cells) as one row group."""
        path = None
        if self.parts == 0 or self.in_part >= PART_ROWS:
            path = part_path(self.out, self.day, self.parts)
            self.parts += 1
            self.in_part = 0
        self.in_part += table.num_rows
        self.behind.submit(self._write, table, path)

    def _write(self, table: pa.Table, path: Path | None) -> None:
        if path is not None:
            self._close()
            path.parent.mkdir(parents=True, exist_ok=True)
            self.writer = pq.ParquetWriter(path, self.target, compression="zstd",
                                           use_dictionary=self.dictionary)
            self.path = path
        assert self.writer is not None
        self.writer.write_table(table.cast(self.target), row_group_size=max(1, table.num_rows))

    def _close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
            self.bytes += self.path.stat().st_size  # type: ignore[union-attr]

    def close(self) -> None:
        """Wait for the writes and close the last part (also after an error: no file is
        left open)."""
        try:
            self.behind.close()
        finally:
            self._close()


def write_day(unit: DayUnit, reads: list[FileRead], p: cells.Plan, out: Path,
              one_build: bool = False) -> dict[str, int]:
    """Step 3 for one day (a unit of `fanout`): its cells, one after the other, into
    ``out/day=D/part-NNNNN.parquet``; returns the day's counts.

    one_build: one cell built at a time in this process (`_BUILDING`), where the days run on
    its threads (not where a task runner runs them: it decides what runs at once)."""
    spilled = [s for r in reads for s in r.spilled]
    totals = {"rows": 0, "sessions": 0, "clicks": 0, "history_values": 0}
    rows = spill.cell_rows(spilled, unit.day)
    groups = pack(rows, unit.cell_rows)
    io.unit_folder(part_path(out, unit.out_day).parent)  # a rerun unit starts afresh
    parts = _Parts(out, unit.out_day, _field_metadata(p.schema, p))
    try:
        for group in groups:
            with _BUILDING if one_build else contextlib.nullcontext():
                clicks = spill.read_clicks(spilled, group, through_day=unit.day) \
                    if p.cfg.history == "auto" else None
                try:  # (the cell only in build's hands: it lets it go once sorted)
                    table, st = cells.build(_cell(spilled, unit.day, group), clicks, p,
                                            unit.out_day, totals["sessions"])
                except cells.NotFinite as e:
                    bad = cells.first_unscalable(_cell(spilled, unit.day, group), p, e.column)
                    raise unscalable(bad, reads, p) from None
                except cells.Repeated as e:
                    raise repeated(e, reads) from None
                del clicks
            parts.add(table)  # a row group per cell (fewer, larger groups: 20% less to
            # encode than one per bucket, and smaller files)
            for k, v in st.items():
                totals[k] += v
    finally:
        parts.close()
    return {**totals, "parts": parts.parts, "bytes": parts.bytes}


def _cell(spilled: list[spill.Spilled], day: int, group: list[int]) -> pl.DataFrame:
    cell = spill.read_cell(spilled, day, group)
    assert cell is not None  # (`pack` groups buckets with rows)
    return cell


def repeated(e: cells.Repeated, reads: list[FileRead]) -> culprits.RowError:
    """The error for an impression read twice (`cells.first_repeat`)."""
    path = {r.source.index: r.source.path for r in reads}
    (fa, ra), (fb, rb) = e.first, e.again
    return culprits.RowError(path[fb], rb, None, (
        f"the same impression as {path[fa]}, row {ra} (every mapped column equal): it would "
        f"be read twice (a copy, an overlapping export, a repeated line?)"))


def unscalable(e: cells.Unscalable, reads: list[FileRead], p: cells.Plan) -> culprits.RowError:
    """The error for a dense value its column's scaling (a continued ingest's, decided on
    the days before) takes past float32."""
    path = next(r.source.path for r in reads if r.source.index == e.file)
    how = p.dense[e.column]
    return culprits.RowError(path, e.row, e.column, (
        f"{e.value:g} is beyond the scaling of the dataset this ingest continues "
        f"({how['transform']}, mean {how['mean']:g}, std {how['std']:g}): it would be "
        f"written as infinite; rescale the column, or ingest from the first day again"))


# -- the whole ingest ----------------------------------------------------------------------


def ingest(files: list[Path], out: Path, cfg: LogsConfig, *, chunk_rows: int = 200_000,
           max_history: int = 100, prior: Path | None = None) -> dict[str, Any]:
    """Ingest `files` into `out` (impressions layout, ``_ingest/`` state); the metrics.

    prior: a dataset folder whose ``_ingest/`` state this ingest continues (its vocabularies
    grow, its scalings and day numbers hold), e.g. the stream's previous day.
    """
    cfg = check_mapping(cfg)
    srcs = sources(files, cfg.format)
    scans = [blocks.scan(s, cfg) for s in srcs]
    for s, lf in zip(srcs, scans, strict=True):  # every file's columns, before any rows
        blocks.check_columns(s, lf, cfg)
    rows = sum(estimate_rows(s, lf, cfg) for s, lf in zip(srcs, scans, strict=True))
    buckets = max(1, math.ceil(rows / chunk_rows))
    prior_state = State.load(Path(prior) / STATE) if prior is not None else None
    # the spill inside `out` (a stage's atomic_dir temporary folder): a killed ingest's spill
    # goes with that folder when the next run takes the lock (lrm.io.remove_leftovers)
    Path(out).mkdir(parents=True, exist_ok=True)
    spill_dir = Path(tempfile.mkdtemp(prefix=".lrm-ingest-spill-", dir=out))
    try:
        reads = fanout.map_units(
            "ingest file", partial(_read_unit, cfg=cfg, buckets=buckets, spill_dir=spill_dir,
                                   chunk_rows=chunk_rows), srcs, [s.path.name for s in srcs])
        impressions = sum(r.impressions for r in reads)
        if impressions == 0:
            raise DataError(srcs[0].path, None, None, "no impressions to ingest")
        check_time_units(reads, cfg)
        if prior_state is not None:
            check_continues(reads, prior_state, cfg)
        state, p = plan(reads, cfg, max_history, prior_state)
        if cfg.history == "auto":
            if prior_state is not None and prior_state.clicks is not None:
                reads.append(prior_clicks(prior_state, cfg, buckets,
                                          spill_dir / "prior.arrow"))
            state = dataclasses.replace(state, clicks=recent_clicks(reads, p, max_history))
        state.save(Path(out) / STATE)
        abs_days = sorted(set().union(*(r.days for r in reads)))
        units = [DayUnit(d, d - state.first_day, chunk_rows) for d in abs_days]
        if any(u.out_day < 0 for u in units):
            raise DataError(srcs[0].path, None, cfg.time, "rows before the dataset's first "
                                                          "day (a continued ingest)")
        per_day = fanout.map_units("ingest day", partial(
            write_day, reads=reads, p=p, out=Path(out), one_build=fanout.in_process()),
            units, [str(u.out_day) for u in units], threads=DAY_THREADS)
    finally:
        shutil.rmtree(spill_dir, ignore_errors=True)
    if state.label_kind != "binary":
        log.info("ingest logs: label %s read as %s (%s)", cfg.label or cfg.explode,
                 state.label_kind, "true -> 1, false -> 0" if state.label_kind == "bool"
                 else "a count > 0 -> 1")
    total = {k: sum(d[k] for d in per_day) for k in per_day[0]}
    day_rows = {u.out_day: d["rows"] for u, d in zip(units, per_day, strict=True)}
    say_partial_days(day_rows)
    spans = [r.times for r in reads if r.times is not None]
    times = (min(a for a, _ in spans), max(b for _, b in spans)) if spans else None
    if times is not None:
        check_time_span(times, cfg)
    return {
        "rows": total["rows"], "input_rows": sum(r.rows for r in reads),
        "sessions": total["sessions"], "files": len(srcs),
        "days": len(units), "day_rows": day_rows,
        "ctr": total["clicks"] / max(1, total["rows"]),
        "time_span": [checks.iso_time(t) for t in times] if times else None,
        "label_mapping": state.label_kind, "buckets": buckets,
        "impressions_per_session": total["rows"] / max(1, total["sessions"]),
        "history_mean": total["history_values"] / max(1, total["sessions"]),
        "vocab": {n: v.height for n, v in state.vocabs.items()},
        "dense_scaling": state.dense, "bytes": total["bytes"],
        "parts": total["parts"],
    }


PARTIAL_DAY = 0.25  # a first or last day under this share of the median day's rows


def say_partial_days(day_rows: dict[int, int]) -> None:
    """A line for a first or last day much smaller than the others (an export that starts
    or ends mid-day): each is a day of the dataset, and a stage that trains on it says how
    it takes it."""
    if len(day_rows) < 3:
        return
    median = sorted(day_rows.values())[len(day_rows) // 2]
    days = sorted(day_rows)
    for d, which in ((days[0], "first"), (days[-1], "last")):
        if day_rows[d] < PARTIAL_DAY * median:
            log.info("ingest logs: the %s day (%d) holds %d rows, %.0f%% of a median day's "
                     "%d: the export %s mid-day?", which, d, day_rows[d],
                     100 * day_rows[d] / median, median,
                     "starts" if which == "first" else "ends")


# A click log's times lie in this range; outside it a numeric time is most likely in other
# units than `time_unit` says (seconds read as ms put a week of 2019 into 1970-01-19).
PLAUSIBLE_US = (946_684_800_000_000, 4_102_444_800_000_000)  # 2000-01-01, 2100-01-01 UTC


# Numeric times in one unit from 1970-07 on are within 100x of each other (counted from
# the epoch); a column mixing units (s and ms: 1000x) is not
MIXED_UNITS = 100


def check_time_units(reads: list[FileRead], cfg: LogsConfig) -> None:
    """A RowError at the last time when a numeric time column's times are so far apart
    (`MIXED_UNITS`) that they must mix units: else their days would be cut centuries
    apart."""
    spans = [(r.times, r.time_rows, r.source.path) for r in reads if r.times is not None]
    if not spans or cfg.time_unit not in checks.UNIT_US or cfg.time_format:
        return
    (lo, lo_row, lo_path) = min((t[0], rows[0], p) for t, rows, p in spans)
    (hi, hi_row, hi_path) = max((t[1], rows[1], p) for t, rows, p in spans)
    if lo > 0 and hi / lo >= MIXED_UNITS:
        first = f"row {lo_row}" + (f" of {lo_path}" if lo_path != hi_path else "")
        raise culprits.RowError(hi_path, hi_row, cfg.time, (
            f"time {checks.iso_time(hi)} is {hi / lo:.0f}x as far from 1970 as the first, "
            f"{checks.iso_time(lo)} ({first}): does the column mix units (s, ms, us)? It is "
            f"read with --time-unit {cfg.time_unit}"))


def check_continues(reads: list[FileRead], prior: State, cfg: LogsConfig) -> None:
    """A RowError at a continued ingest's first time that precedes the last time of the
    days it continues. Those days' clicks are every new session's past (their histories
    read them all), so a row before them would see later clicks as its history: an
    earlier, repeated or overlapping export (a recompressed copy of a day, too)."""
    if prior.last_time is None:
        return
    for r in reads:
        if r.times is not None and r.times[0] < prior.last_time:
            raise culprits.RowError(r.source.path, r.time_rows[0], cfg.time, (
                f"time {checks.iso_time(r.times[0])} precedes "
                f"{checks.iso_time(prior.last_time)}, the last time of the days this ingest "
                f"continues: its rows must come after them (an earlier, repeated or "
                f"overlapping export?)"))


def check_time_span(times: tuple[int, int], cfg: LogsConfig) -> None:
    """Warn (in words, with what other units would give) when the data's first or last time
    falls outside `PLAUSIBLE_US`."""
    lo, hi = PLAUSIBLE_US
    if lo <= times[0] and times[1] < hi:
        return
    span = " to ".join(checks.iso_time(t) for t in times)
    other = []
    if cfg.time_unit in checks.UNIT_US and not cfg.time_format:
        per = checks.UNIT_US[cfg.time_unit]
        for unit, us in checks.UNIT_US.items():
            a, b = (t // per * us for t in times)
            if unit != cfg.time_unit and lo <= a and b < hi:
                other.append(f"as {unit}: {checks.iso_time(a)} to {checks.iso_time(b)}")
    log.warning("ingest logs: column %s's times run from %s (UTC, read with --time-unit %s)"
                "%s; the days are cut from them", cfg.time, span, cfg.time_unit,
                f": are they in other units? ({'; '.join(other)})" if other else "")


def _read_unit(src: Source, *, cfg: LogsConfig, buckets: int, spill_dir: Path,
               chunk_rows: int) -> FileRead:
    return read_file(src, cfg, buckets, spill_dir, chunk_rows)

"""The dataset schema, defined once for every producer (synthetic, Criteo) and consumer.

Two physical layouts share one logical schema:

* ``impressions`` (``data/raw``): one row per ad impression; session-level (user-side)
  columns repeat on every impression of the session.
* ``sessions`` (``data/sessions``, RecD): one row per session; user-side columns are
  stored once and every per-impression column is a list, one entry per impression.
  Sequence features (``user_seq``) are stored once per *run* of consecutive sessions whose
  histories are windows of one stream (a user's sessions, sorted together, each seeing
  the history shifted by what she browsed in between): the run's first row holds the
  run's items (most recent first) in the ``c`` column, every other row null; every row's
  window is ``c_offset`` / ``c_length`` (int32) into its run's items (a null history:
  offset -1). lrm.data.histories encodes and decodes it; files written before this
  (``lrm.layout_version`` absent: no window columns, a full list per row) still read.

Datasets are folders of ``day=D/part-NNNNN.parquet``; every file carries the schema as
JSON in its Arrow metadata (key ``lrm.schema``) so a consumer never has to be told
where the data came from.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow as pa

from lrm.data.parquet import open_file
from lrm.errors import ConfigError, DataError

DAY, SESSION, POSITION, LABEL = "day", "session_id", "position", "label"
META_KEY = b"lrm.schema"
VERSION_KEY = b"lrm.layout_version"
SESSIONS_VERSION = 2  # 2: sequence features stored once per run (window columns)
LAYOUTS = ("impressions", "sessions")
_DAY_DIR = re.compile(r"^day=(\d+)$")


@dataclass(frozen=True)
class FeatureSchema:
    """Which columns are user-side (constant in a session) and which are per impression.

    user_sparse: int64 categorical ids shared by a session (user id, user attributes,
        session context); null means missing.
    user_seq: list<int64> sequences shared by a session (e.g. the user's recent ad ids).
    item_sparse: int64 categorical ids of the impression (ad id, advertiser, ...).
    dense: float32 per-impression features.
    vocab: known id-space size per sparse feature (ids lie in [0, vocab)); features not
        listed are hashed (e.g. Criteo's 32-bit hashes) and must be hashed into a table.
    user_key: the user_sparse column naming the user: dedup sorts a file's sessions by it
        (stable), so a user's sessions lie together and share their history (None: kept
        in input order).
    item_key: the item_sparse column naming the item (the ad): a sessions file stores the
        item-side columns that are a function of it once per item (lrm.data.items; None:
        every column per impression).
    vertical: the user_sparse column naming a session's vertical (the surface it is on:
        a feed, search, a tab); ExFM's vertical models each train on one (None: the data
        is one vertical).
    vertical_names: the verticals' names by id, what metrics and models are named after
        (empty: "v0", "v1", ...).
    """

    name: str
    user_sparse: tuple[str, ...]
    user_seq: tuple[str, ...]
    item_sparse: tuple[str, ...]
    dense: tuple[str, ...]
    vocab: dict[str, int] = field(default_factory=dict)
    user_key: str | None = None
    item_key: str | None = None
    vertical: str | None = None
    vertical_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.user_key is not None and self.user_key not in self.user_sparse:
            raise ValueError(f"user_key {self.user_key!r} is not a user_sparse feature")
        if self.vertical is not None and self.vertical not in self.user_sparse:
            raise ValueError(f"vertical {self.vertical!r} is not a user_sparse feature")
        if self.item_key is not None and self.item_key not in self.item_sparse:
            raise ValueError(f"item_key {self.item_key!r} is not an item_sparse feature")
        taken = set(self.sparse_features) | set(self.dense)
        clash = [c for f in self.user_seq for c in window_columns(f) if c in taken]
        if clash:
            raise ValueError(f"features {clash} clash with the sessions layout's window "
                             "columns")

    @property
    def user_features(self) -> tuple[str, ...]:
        """Keys of the user-side KJT, in order."""
        return self.user_sparse + self.user_seq

    @property
    def sparse_features(self) -> tuple[str, ...]:
        return self.user_features + self.item_sparse

    def arrow(self, layout: str) -> pa.Schema:
        """The Arrow schema of a table in `layout` ('impressions' or 'sessions')."""
        if layout not in LAYOUTS:
            raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")
        per_imp: list[tuple[str, pa.DataType]] = (
            [(POSITION, pa.int16()), (LABEL, pa.int8())]
            + [(c, pa.int64()) for c in self.item_sparse]
            + [(c, pa.float32()) for c in self.dense]
        )
        if layout == "sessions":
            per_imp = [(c, pa.list_(t)) for c, t in per_imp]
        windows: list[tuple[str, pa.DataType]] = []
        meta = {META_KEY: self.to_json().encode(), b"lrm.layout": layout.encode()}
        if layout == "sessions":
            windows = [(c, pa.int32()) for f in self.user_seq for c in window_columns(f)]
            meta[VERSION_KEY] = str(SESSIONS_VERSION).encode()
        fields = (
            [(DAY, pa.int32()), (SESSION, pa.int64())]
            + [(c, pa.int64()) for c in self.user_sparse]
            + [(c, pa.list_(pa.int64())) for c in self.user_seq]
            + windows
            + per_imp
        )
        return pa.schema([pa.field(n, t) for n, t in fields], metadata=meta)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> FeatureSchema:
        d = json.loads(text)
        return cls(
            name=d["name"],
            user_sparse=tuple(d["user_sparse"]),
            user_seq=tuple(d["user_seq"]),
            item_sparse=tuple(d["item_sparse"]),
            dense=tuple(d["dense"]),
            vocab={k: int(v) for k, v in d.get("vocab", {}).items()},
            user_key=d.get("user_key"),
            item_key=d.get("item_key"),
            vertical=d.get("vertical"),
            vertical_names=tuple(d.get("vertical_names", ())),
        )

    def verticals(self) -> dict[int, str]:
        """id -> name of every vertical ({} without a vertical column): the ids of its
        vocab (or of `vertical_names`), named by `vertical_names` where given."""
        if self.vertical is None:
            return {}
        n = self.vocab.get(self.vertical, len(self.vertical_names))
        return {i: self.vertical_names[i] if i < len(self.vertical_names) else f"v{i}"
                for i in range(n)}


def window_columns(feature: str) -> tuple[str, str]:
    """(offset, length) columns of a sequence feature's window in the sessions layout."""
    return f"{feature}_offset", f"{feature}_length"


def sessions_version(meta: dict[bytes, bytes] | None) -> int:
    """The sessions layout version of a file's Arrow metadata (1: before window columns)."""
    return int((meta or {}).get(VERSION_KEY, b"1").decode())


def synthetic_schema(vocab: dict[str, int] | None = None,
                     vertical_names: tuple[str, ...] = ()) -> FeatureSchema:
    """The session-level synthetic ads log (lrm.data.synthetic)."""
    return FeatureSchema(
        name="synthetic",
        user_sparse=("user_id", "user_age", "user_gender", "user_geo", "user_device",
                     "session_hour", "vertical"),
        user_seq=("user_history",),
        item_sparse=("ad_id", "advertiser_id", "ad_category", "ad_format"),
        dense=("d_position", "d_user_activity", "d_ad_age", "d_bid"),
        vocab=dict(vocab or {}),
        user_key="user_id",
        item_key="ad_id",
        vertical="vertical",
        vertical_names=tuple(vertical_names),
    )


CRITEO_INT = tuple(f"I{i}" for i in range(1, 14))
CRITEO_CAT = tuple(f"C{i}" for i in range(1, 27))


def criteo_schema() -> FeatureSchema:
    """Criteo display-ads TSV: every row is its own session, so nothing is user-side."""
    return FeatureSchema(name="criteo", user_sparse=(), user_seq=(), item_sparse=CRITEO_CAT,
                         dense=CRITEO_INT)


def part_path(root: Path, day: int, part: int = 0) -> Path:
    return Path(root) / f"day={day}" / f"part-{part:05d}.parquet"


def _hidden(path: Path) -> bool:
    """A name a dataset reader passes over by convention (pyarrow.dataset's ignore_prefixes,
    Spark's _SUCCESS): lrm's own state (`day=N/_ingest/`, a stream's), hidden files."""
    return path.name.startswith(("_", "."))


def day_files(root: Path) -> dict[int, list[Path]]:
    """Map day -> its Parquet files (sorted), for a dataset folder."""
    root = Path(root)
    if root.exists() and not root.is_dir():  # (it said "does not exist")
        raise DataError(root, None, None, "a file, not a dataset folder (day=N/*.parquet)")
    if not root.is_dir():
        raise DataError(root, None, None, "dataset folder does not exist")
    if _DAY_DIR.match(root.name) and next(root.glob("*.parquet"), None) is not None:
        # one day's folder given for the dataset (it said to move its files out)
        raise DataError(root, None, None, f"a day's folder, not a dataset: give the folder "
                                          f"that holds it, {root.parent}")
    out: dict[int, list[Path]] = {}
    for d in sorted(root.iterdir()):
        m = _DAY_DIR.match(d.name)
        if m is None and d.name.startswith("day=") and d.is_dir():  # never skipped silently
            raise DataError(d, None, None, "not a day folder: its name must be day=N, N a "
                            "whole number of days (0, 1, ...)")
        if m is None and d.suffix == ".parquet" and not _hidden(d):  # never skipped silently
            raise DataError(d, None, None, "a Parquet file outside the day=N folders is not "
                            "read: move it into its day's folder, or out of the dataset")
        if m and d.is_dir():
            files = sorted(d.glob("*.parquet"))
            nested = next((f for sub in sorted(d.iterdir()) if sub.is_dir() and not _hidden(sub)
                           for f in sorted(sub.rglob("*.parquet"))), None)
            if nested is not None:
                raise DataError(nested, None, None, f"a Parquet file in a subfolder of "
                                f"{d.name} is not read (a day's files lie in its folder "
                                f"itself): move it up into {d.name}, or out of the dataset")
            if files:
                out[int(m.group(1))] = files
    if not out:
        raise DataError(root, None, None, "no day=D/*.parquet partitions found")
    return dict(sorted(out.items()))


def pick_day(available: Sequence[int], day: int, key: str = "day") -> int:
    """`day` itself, or counted from the end when negative (-1: the last day)."""
    days = sorted(available)
    if day < 0:
        if -day > len(days):
            raise ConfigError(f"{key}: {day} counts back past the first of {len(days)} days")
        return days[day]
    if day not in days:
        raise ConfigError(f"{key}: no day {day} in the data (days: {days})")
    return day


def pick_days(available: Sequence[int], lo: int, hi: int, key: str = "days") -> list[int]:
    """The days of `available` from `lo` to `hi` (inclusive; negatives count from the end)."""
    days = sorted(available)
    first, last = (pick_day(days, d, key) if d < 0 else d for d in (lo, hi))
    chosen = [d for d in days if first <= d <= last]
    if first > last or not chosen:
        raise ConfigError(f"{key}: no days in {lo}..{hi} (days: {days})")
    if first < days[0] or last > days[-1]:  # a typo, not "to the end" (that is A..-1)
        raise ConfigError(f"{key}: {lo}..{hi} runs outside the data's days {days[0]}.."
                          f"{days[-1]} (-1 is the last day)")
    if missing := sorted(set(range(first, last + 1)) - set(chosen)):  # scored, not skipped
        raise ConfigError(f"{key}: the data has no day {', '.join(map(str, missing))} of "
                          f"{lo}..{hi} (days: {days})")
    return chosen


def read_schema(root_or_file: Path) -> tuple[FeatureSchema, str]:
    """Return (schema, layout) stored in a dataset's Parquet metadata."""
    p = Path(root_or_file)
    f = p if p.is_file() else next(iter(day_files(p).values()))[0]
    meta = open_file(f).schema_arrow.metadata or {}
    if META_KEY not in meta or b"lrm.layout" not in meta:
        raise DataError(f, None, None, "Parquet file carries no lrm.schema / lrm.layout metadata")
    return FeatureSchema.from_json(meta[META_KEY].decode()), meta[b"lrm.layout"].decode()

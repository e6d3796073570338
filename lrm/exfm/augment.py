"""ExFM's data augmentation system: the teacher's logit logged beside every impression.

    augment_dataset(teachers, src, dst, days)    data/sessions -> data/augmented

For each requested day its teacher (a saved model folder, lrm.models.saved: the one model
given, or per day the foundation model's version that served it, lrm.exfm.schedule) scores
every impression of `src/day=D` and `dst/day=D/` receives the same files (same names, same
session rows in the same order, every column as it was) plus `teacher_logit`, a
list<float32> with one entry per impression, like the other per-impression columns. The
output is row-aligned with its input: flatten both and impression i is the same row. The
manifest holds the teacher's NE, AUC and calibration on the day, over every row and per
vertical (the schema's vertical column).

Versioning: the teacher's version is the content hash of its saved model (the card
without its training summary, and the weights file), plus its MLflow registry version when
the caller knows it. It is in every file's Parquet metadata (key `lrm.teacher_version`,
JSON) and in the day's manifest `dst/day=D/_manifest.json`, written last: {day, teacher
version, source fingerprint (file names, sizes, sha256), rows, sessions, files, teacher
NE/AUC on the day}. A day whose manifest names the same teacher hash and the same source
fingerprint is skipped, so a rerun (or a second student asking) costs only the hashing.

Streaming: the teacher reads the day through the training BatchLoader (so its features
are hashed exactly as in training) in batches of `batch_size` impressions, while the
source files are re-read in chunks of session rows (one output row group each); each chunk
takes the next logits of the stream. Memory is bounded by a chunk and the loader's
prefetch (plus 5 bytes an impression for the day's teacher AUC), not by a day's data. Each day is written into a temporary folder that replaces
`dst/day=D` only when complete (lrm.io.atomic_dir), with Parquet's own writer streaming
the chunks into each file.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from torch import nn

from lrm import io
from lrm.data import items, parquet
from lrm.data.parquet import write_options
from lrm.data.loader import BatchLoader
from lrm.data.dataset import Dataset
from lrm.data.schema import LABEL, day_files, read_schema
from lrm.errors import ConfigError, DataError
from lrm.metrics import StreamingMetrics
from lrm.models.saved import ModelCard, load_model, model_hash, read_card
from lrm.progress import Reporter

log = logging.getLogger("lrm")

TEACHER_COLUMN = "teacher_logit"
MANIFEST = "_manifest.json"
META_VERSION = b"lrm.teacher_version"


@dataclass(frozen=True)
class TeacherVersion:
    """Which teacher produced the logits: its content hash, and its registry version."""

    hash: str  # "sha256:<hex>" of the saved model (lrm.models.saved.model_hash)
    registry: str | None = None  # e.g. "lrm-teacher/3" when known

    @property
    def label(self) -> str:
        short = self.hash.removeprefix("sha256:")[:12]
        return short + (f" ({self.registry})" if self.registry else "")


def read_manifest(day_dir: Path) -> dict[str, Any] | None:
    """The manifest of an augmented day folder, or None when absent or unreadable."""
    try:
        doc = json.loads((Path(day_dir) / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def is_current(day_dir: Path, version: TeacherVersion, fingerprint: list[dict[str, Any]]
               ) -> bool:
    """Whether `day_dir` already holds this day augmented by this teacher from this input."""
    m = read_manifest(day_dir)
    if m is None or m.get("teacher", {}).get("hash") != version.hash:
        return False
    if m.get("source") != fingerprint:
        return False
    return all((Path(day_dir) / f["file"]).is_file() for f in fingerprint)


# ------------------------------------------------------------------------- scoring

@torch.no_grad()
def teacher_logits(model: nn.Module, loader: BatchLoader) -> Iterator[np.ndarray]:
    """The teacher's logits of every impression the loader yields, batch by batch."""
    model.eval()
    for batch in loader:
        yield model(batch).float().numpy()


class _Take:
    """Cuts a stream of arrays into pieces of requested lengths, in order."""

    def __init__(self, stream: Iterator[np.ndarray]) -> None:
        self.stream = stream
        self.buf: deque[np.ndarray] = deque()
        self.held = 0

    def take(self, n: int, where: str) -> np.ndarray:
        while self.held < n:
            nxt = next(self.stream, None)
            if nxt is None:
                raise DataError(where, None, None, f"the teacher scored fewer impressions than "
                                                   f"the file holds (short by {n - self.held})")
            self.buf.append(nxt)
            self.held += len(nxt)
        out, need = [], n
        while need:
            a = self.buf.popleft()
            if len(a) > need:
                self.buf.appendleft(a[need:])
                a = a[:need]
            out.append(a)
            need -= len(a)
        self.held -= n
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def left(self) -> int:
        return self.held + sum(len(a) for a in self.stream)


def _with_logits(rb: pa.RecordBatch, logits: np.ndarray) -> pa.Table:
    lens = pc.fill_null(pc.list_value_length(rb.column(rb.schema.get_field_index(LABEL))), 0)
    offsets = np.zeros(len(rb) + 1, dtype=np.int32)
    np.cumsum(lens.to_numpy(zero_copy_only=False), out=offsets[1:])
    col = pa.ListArray.from_arrays(pa.array(offsets), pa.array(logits, type=pa.float32()))
    return pa.Table.from_batches([rb]).append_column(TEACHER_COLUMN, col)


def _per_impression(rb: pa.RecordBatch, column: str | None, lists: pa.Array) -> np.ndarray:
    """A session-level column's value for each impression (sessions layout)."""
    assert column is not None
    values = rb.column(rb.schema.get_field_index(column)).to_numpy(zero_copy_only=False)
    lens = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False)
    return np.repeat(values, lens)


def _check_teacher(card: ModelCard, src: Path) -> None:
    schema, layout = read_schema(src)
    if layout != "sessions":
        raise DataError(src, None, None, f"augment reads the sessions layout (dedup's output), "
                                         f"found {layout}")
    if (schema.sparse_features, schema.dense) != (card.schema.sparse_features,
                                                  card.schema.dense):
        raise ConfigError(f"augment: the teacher was trained on schema {card.schema.name!r}, "
                          f"whose features differ from {src}'s ({schema.name!r})")


def augment_day(model: nn.Module, card: ModelCard, version: TeacherVersion, src: Path,
                day: int, dst: Path, *, batch_size: int = 8192,
                reporter: Reporter | None = None,
                fingerprint: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Write `dst/day=D/` (module docstring); return its manifest.

    fingerprint: the day's `source_fingerprint`, when the caller already hashed the files.
    """
    files = day_files(src)[day]
    if fingerprint is None:
        fingerprint = io.source_fingerprint(files)
    loader = BatchLoader(src, batch_size, days=[day], dedup=True, hash_sizes=card.hash_sizes)
    stream = _Take(teacher_logits(model, loader))
    meter = StreamingMetrics(window=1)
    names = loader.schema.verticals()  # the teacher's NE per vertical too
    by_vertical = {v: StreamingMetrics(window=1) for v in names}
    rows = sessions = 0
    t0 = time.perf_counter()
    meta_version = json.dumps(asdict(version), sort_keys=True).encode()
    with io.atomic_dir(Path(dst) / f"day={day}") as tmp:
        for f in files:
            pf = parquet.open_file(f)
            schema = pf.schema_arrow.append(pa.field(TEACHER_COLUMN, pa.list_(pa.float32())))
            schema = schema.with_metadata({**(schema.metadata or {}), META_VERSION: meta_version})
            opts = write_options(schema, "sessions")
            group = opts.pop("row_group_size")  # a chunk is (at most) one row group
            file_rows = 0
            with pq.ParquetWriter(tmp / f.name, schema, **opts) as writer:
                if kv := items.file_metadata(pf):  # still true: the same impressions
                    writer.add_key_value_metadata(kv)
                # the stored columns (the item table goes over as it is)
                for rb in parquet.iter_batches(f, group, pf.schema_arrow.names, file=pf):
                    label_lists = rb.column(rb.schema.get_field_index(LABEL))
                    labels = pc.list_flatten(label_lists)
                    n = len(labels)
                    logits = stream.take(n, str(f))
                    writer.write_table(_with_logits(rb, logits).cast(schema))
                    x = torch.from_numpy(logits)
                    y = torch.from_numpy(labels.to_numpy(zero_copy_only=False)
                                         .astype(np.float32))
                    meter.update(x, y)
                    if by_vertical:
                        v = _per_impression(rb, loader.schema.vertical, label_lists)
                        for k, m in by_vertical.items():
                            if (rows_k := torch.from_numpy(v == k)).any():
                                m.update(x[rows_k], y[rows_k])
                    rows += n
                    sessions += len(rb)
                    file_rows += len(rb)
                    if reporter is not None:
                        reporter.update(n)
            written = parquet.read_metadata(tmp / f.name).num_rows
            if written != file_rows:
                raise OSError(f"{tmp / f.name}: wrote {written} session rows, "
                              f"expected {file_rows}")
        extra = stream.left()
        if extra:
            raise DataError(src, None, None, f"day {day}: the teacher scored {extra} more "
                                             "impressions than the files hold")
        m = meter.compute()
        keys = ("ne", "auc", "calibration", "ctr", "rows")
        manifest = {
            "day": day, "teacher": asdict(version), "source": fingerprint,
            "files": [f.name for f in files], "rows": rows, "sessions": sessions,
            "column": TEACHER_COLUMN,
            "teacher_metrics": {k: m[k] for k in keys},
            "teacher_metrics_by_vertical": {
                names[k]: {key: v[key] for key in keys}
                for k, mv in by_vertical.items() if mv.rows for v in [mv.compute()]},
            "seconds": round(time.perf_counter() - t0, 3),
        }
        io.write_json(manifest, tmp / MANIFEST)  # last: the day is complete
    return manifest


def _prune(dst: Path, keep: set[int]) -> list[int]:
    """Remove the augmented day folders of `dst` not in `keep` that lrm wrote (marked, with
    an augment manifest); returns their days."""
    removed = []
    for p in sorted(dst.glob("day=*")) if dst.is_dir() else ():
        day = p.name[4:]
        if (day.isdigit() and int(day) not in keep and io.owned_by_lrm(p) is not None
                and read_manifest(p) is not None):
            log.info("augment: day %s is not served by this teacher: removed (a previous "
                     "schedule's)", day)
            shutil.rmtree(p)
            removed.append(int(day))
    return removed


def augment_dataset(teachers: Path | Mapping[int, Path], src: Path, dst: Path,
                    days: Sequence[int] | None = None, *, batch_size: int = 8192,
                    registry: Callable[[str], str | None] | None = None,
                    force: bool = False, prune: bool = False) -> dict[str, Any]:
    """Augment `days` of `src` (default: every day, or the days `teachers` maps) into `dst`;
    skip days already current.

    prune: the days augmented here are the whole dataset (a foundation model's schedule):
    other augmented days in `dst` (a previous schedule's, which the students would take for
    this teacher's) are removed, lrm's own only (a marked day folder with a manifest).

    teachers: one model folder for every day, or day -> the model folder that logs it (the
    foundation model's version that served the day, lrm.exfm.schedule).
    registry: content hash -> the teacher's registry version ("lrm-teacher/3") or None,
    recorded when given.
    Returns metrics: the teacher version of each day, days written and skipped, rows,
    rows/s, and the per-day manifests' teacher NE/AUC (over the day and per vertical).
    """
    src, dst = Path(src), Path(dst)
    source = Dataset.open(src)
    available = source.files
    if isinstance(teachers, Mapping):
        days = sorted(teachers) if days is None else sorted(set(days))
        unknown = [d for d in days if d not in teachers]
        if unknown:
            raise ConfigError(f"augment: no teacher version logs days {unknown} (the first "
                              f"version's first day is {min(teachers, default='none')})")
        by_day = {d: Path(teachers[d]) for d in days}
    else:
        days = sorted(available) if days is None else sorted(set(days))
        by_day = dict.fromkeys(days, Path(teachers))
    missing = [d for d in days if d not in available]
    if missing:
        raise ConfigError(f"augment.days: no data for days {missing} in {src} "
                          f"(days: {sorted(available)})")
    versions: dict[Path, TeacherVersion] = {}
    for folder in dict.fromkeys(by_day.values()):  # each teacher hashed once
        h = model_hash(folder)
        versions[folder] = TeacherVersion(hash=h, registry=registry(h) if registry else None)
        _check_teacher(read_card(folder), src)
    prints = {d: io.source_fingerprint(available[d]) for d in days}  # hashed once per day
    todo = [d for d in days
            if force or not is_current(dst / f"day={d}", versions[by_day[d]], prints[d])]
    skipped = [d for d in days if d not in todo]
    source.check_foreign(todo)  # a bad value is an error before a day is written
    for d in skipped:
        log.info("augment: day %d already augmented by teacher %s: skipped", d,
                 versions[by_day[d]].label)
    written: dict[int, dict[str, Any]] = {}
    seconds = 0.0
    if todo:
        total = BatchLoader(src, batch_size, days=todo).num_rows()
        loaded: tuple[Path, Any] | None = None
        with Reporter("augment", total=total, unit="rows") as rep:
            for d in todo:
                if loaded is None or loaded[0] != by_day[d]:  # days in order: each version
                    loaded = (by_day[d], load_model(by_day[d]))  # loaded once
                model, card = loaded[1]
                written[d] = augment_day(model, card, versions[by_day[d]], src, d, dst,
                                         batch_size=batch_size, reporter=rep,
                                         fingerprint=prints[d])
                seconds += written[d]["seconds"]
    removed = _prune(dst, set(days)) if prune else []
    per_day = {d: (written.get(d) or read_manifest(dst / f"day={d}") or {}) for d in days}
    rows = sum(written[d]["rows"] for d in written)
    return {
        "teacher_version": {str(d): asdict(versions[by_day[d]]) for d in days},
        "days": days, "written": sorted(written), "skipped": skipped, "removed": removed,
        "rows": rows, "rows_per_s": rows / seconds if seconds else 0.0,
        "teacher": {str(d): m.get("teacher_metrics", {}) for d, m in per_day.items()},
        "teacher_by_vertical": {str(d): m.get("teacher_metrics_by_vertical", {})
                                for d, m in per_day.items()},
    }

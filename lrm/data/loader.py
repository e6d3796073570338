"""Parquet (either layout) -> `Batch`es of KJTs, in a fixed order, prefetched in the background.

The stream is every impression of the chosen days, in order (days ascending, files in
order, rows in order), cut into batches of exactly `batch_size` impressions; a session may
straddle two batches (its user row then appears in both). From the sessions layout, whose
sequence features are stored once per run of a user's sessions, the RecD form can share
them too (`Batch.windows`: a user's history looked up once per batch) where histories are
long enough for that to pay; chunks of that layout are cut at run starts, so a run never
spans two chunks.

The loader plans: it reads each file in chunks (lrm.data.parquet: one row group at a time),
decides which impressions of which chunks make each of this rank's batches, and hands the
work to threads. Normalizing a chunk and assembling a batch from chunk slices are
lrm.data.chunks.

Worker threads normalize chunks and assemble batches (pyarrow, numpy and torch release the
GIL); the batch futures are consumed in submission order, so the output does not depend on
`num_workers` or `prefetch`. A failure anywhere (a damaged file, a bad value) reaches the
consumer as the error it was raised as (a DataError naming the file), in stream order.
Every value read is checked as it is read (lrm.data.values: labels 0 or 1, ids >= 0 and in
their vocab, finite dense values): a bad one is a DataError naming the file, row group, row
and column, before any batch holding it is made.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lrm.data import parquet, values
from lrm.data.batch import Batch
from lrm.data.chunks import Chunk, ChunkSpec, assemble, normalize
from lrm.data.dataset import Dataset
from lrm.data.schema import (
    LABEL,
    META_KEY,
    SESSION,
    FeatureSchema,
    sessions_version,
    window_columns,
)
from lrm.errors import DataError

CHUNK_IMPRESSIONS = 64 * 1024  # impressions per chunk read from the impressions layout
CHUNK_SESSIONS = 8 * 1024  # sessions per chunk read from the sessions layout
# Shared histories pay from about this many sequence values per session. Measured on CPU
# (student, batch 2048): at ~80 the segments' extra rows and ops cost more than the lookups
# they save (+8% step time against one history per session); at ~420 and ~840 they save
# 15-20%.
WINDOWS_MIN_HISTORY = 128


def keep_verticals(schema: FeatureSchema, verticals: Sequence[int] | None,
                   where: Path) -> pa.Array | None:
    """The verticals to keep as an Arrow value set (None: every row); a dataset without a
    vertical column has none to choose."""
    if verticals is None:
        return None
    if schema.vertical is None:
        raise DataError(where, None, None, f"no vertical column in its schema "
                        f"({schema.name!r}) to keep verticals {list(verticals)} of")
    return pa.array(sorted(set(int(v) for v in verticals)), pa.int64())


def impressions(schema: FeatureSchema, layout: str, path: Path,
                keep: pa.Array | None = None) -> int:
    """Impressions of a file (those on the `keep` verticals): its label column's lengths
    in the sessions layout, its rows in the impressions layout."""
    cols = [LABEL] + ([schema.vertical] if keep is not None and schema.vertical else [])
    t = parquet.read_table(path, columns=cols)
    if keep is not None:
        assert schema.vertical is not None
        t = t.filter(pc.fill_null(pc.is_in(t.column(schema.vertical), value_set=keep), False))
    if layout == "impressions":
        return t.num_rows
    return sum(int(pc.sum(pc.list_value_length(ch)).as_py() or 0)
               for ch in t.column(LABEL).chunks)


class _Now(Future):  # type: ignore[type-arg]
    """A future that is already done: the synchronous path (num_workers=0 or prefetch=0)."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        super().__init__()
        try:
            self.set_result(fn(*args))
        except BaseException as e:  # re-raised by result(), like a pool future
            self.set_exception(e)


_DONE = object()


def _pinned(batch: Batch, pin: bool) -> Batch:
    return batch.pin_memory() if pin else batch


@dataclass
class _Pending:
    """A chunk read but maybe not yet normalized; impressions [g0, g1) of the stream."""

    g0: int
    g1: int
    day: int
    path: Path
    rb: pa.RecordBatch | None
    fut: Future[Chunk] | None = None

    def future(self, submit: Callable[..., Future], spec: ChunkSpec) -> Future[Chunk]:
        if self.fut is None:
            self.fut = submit(normalize, self.rb, self.day, self.path, spec)
            self.rb = None
        return self.fut


class BatchLoader:
    """Iterable of `Batch` over a dataset folder in either layout (see the module docstring).

    root: the folder, or its `Dataset` (lrm.data.dataset) when the caller has looked at it.

    dedup: user-side features once per session in the batch (`user` stride U, `inverse`)
        or once per impression (stride B, inverse None).
    hash_sizes: feature -> table size; its ids are mapped into [0, size) (modulo); other
        features keep their raw ids (every id is >= 0: lrm.data.values).
    rank, world_size: rank r gets global batches r, r + W, ...; every rank gets the same
        number (the tail that not every rank can have is dropped).
    prefetch: batches prepared ahead by `num_workers` background threads (0 for either:
        everything in the calling thread). The output never depends on them.
    teacher_column: per-impression float column returned as `teacher_logits`.
    pin_memory: batches come in page-locked memory (by the worker threads), so that a copy
        to the GPU can overlap compute (torchrec's train pipeline copies on its own stream).
    windows: in the RecD form from a sessions layout that stores histories in runs, give
        sequence features as segments shared by a user's sessions (`Batch.windows`);
        False: one list per session (`Batch.session_form()` of the same batch); None: where
        the first row group's sessions hold WINDOWS_MIN_HISTORY sequence values or more on
        average.
    verticals: only the sessions on these verticals (the schema's vertical column: a
        vertical model's rows); None: every row.
    """

    def __init__(self, root: Path | Dataset, batch_size: int, *, days: Sequence[int] | None = None,
                 dedup: bool = True, hash_sizes: Mapping[str, int] | None = None,
                 rank: int = 0, world_size: int = 1, prefetch: int = 4, num_workers: int = 1,
                 drop_last: bool = False, teacher_column: str | None = None,
                 pin_memory: bool = False, windows: bool | None = None,
                 verticals: Sequence[int] | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, "
                             f"world_size={world_size}")
        if prefetch < 0 or num_workers < 0:
            raise ValueError("prefetch and num_workers must be >= 0")
        ds = Dataset.open(root)  # a Dataset given is not looked at again
        self.root, self.schema, self.layout = ds.root, ds.schema, ds.layout
        self.batch_size, self.dedup, self.drop_last = batch_size, dedup, drop_last
        self.rank, self.world_size = rank, world_size
        self.prefetch, self.num_workers = prefetch, num_workers
        files = ds.files
        if days is not None:
            missing = sorted(set(days) - set(files))
            if missing:
                raise DataError(self.root, None, None, f"no data for days {missing}")
            files = {d: f for d, f in files.items() if d in set(days)}
        self.files: list[tuple[int, Path]] = [(d, f) for d, fs in files.items() for f in fs]
        self.hash_sizes = dict(hash_sizes or {})
        unknown = sorted(set(self.hash_sizes) - set(self.schema.sparse_features))
        if unknown:
            raise ValueError(f"hash_sizes names features not in the schema: {unknown}")
        bad = {k: v for k, v in self.hash_sizes.items() if v < 1}
        if bad:
            raise ValueError(f"hash sizes must be >= 1: {bad}")
        self.teacher_column = teacher_column
        self.pin_memory = pin_memory
        self.keep = keep_verticals(self.schema, verticals, self.root)
        self.runs = False  # sequence features stored in runs (sessions layout version 2)
        self.columns = self._check_files()  # the Parquet columns read
        if windows is None:
            windows = self.runs and self._mean_history() >= WINDOWS_MIN_HISTORY
        self.windows = bool(windows and dedup and self.runs)
        self._num_rows: int | None = None
        self._start = self._next_start = self._done = 0  # resume state (state_dict)

    def _check_files(self) -> list[str]:
        """Every file has this dataset's layout and schema (footers only); the columns to read."""
        s = self.schema
        cols = [SESSION, LABEL, *s.user_features, *s.item_sparse, *s.dense]
        if self.layout == "sessions" and s.user_seq and self.files:
            first = parquet.open_file(self.files[0][1]).schema_arrow.metadata
            self.runs = sessions_version(first) >= 2
        if self.runs:
            cols += [c for f in s.user_seq for c in window_columns(f)]
        if self.teacher_column is not None:
            cols.append(self.teacher_column)
        for _, f in self.files:
            pf = parquet.open_file(f)
            arrow, names = pf.schema_arrow, parquet.column_names(pf, f)
            meta = arrow.metadata or {}
            layout = meta.get(b"lrm.layout", b"").decode()
            if layout != self.layout or (
                    META_KEY in meta and FeatureSchema.from_json(meta[META_KEY].decode()) != s):
                raise DataError(f, None, None, f"layout or schema differs from {self.root}'s "
                                f"first file (expected the {self.layout} layout)")
            if self.layout == "sessions" and s.user_seq and (
                    sessions_version(meta) >= 2) != self.runs:
                raise DataError(f, None, None, f"sessions layout version differs from "
                                f"{self.root}'s first file (re-run dedup on the whole dataset)")
            missing = [c for c in cols if c not in names]
            if missing:
                raise DataError(f, None, missing[0], "column not found"
                                + (" (teacher_column: is this augmented data?)"
                                   if missing[0] == self.teacher_column else ""))
        return cols

    def _mean_history(self) -> float:
        """Sequence values per session in the first row group (its window lengths)."""
        cols = [window_columns(c)[1] for c in self.schema.user_seq]
        pf = parquet.open_file(self.files[0][1])
        if pf.num_row_groups == 0:
            return 0.0
        with parquet.reading(self.files[0][1], 0):
            t = pf.read_row_group(0, columns=cols)
        total = sum(int(pc.sum(t.column(c)).as_py() or 0) for c in cols)
        return total / max(t.num_rows, 1)

    # -- sizes ------------------------------------------------------------------------

    def num_rows(self) -> int:
        """Impressions in the chosen days (and verticals): read from footers, or the label
        lists (and the vertical column)."""
        if self._num_rows is None:
            if self.layout == "impressions" and self.keep is None:
                self._num_rows = sum(parquet.read_metadata(f).num_rows for _, f in self.files)
            else:
                self._num_rows = sum(impressions(self.schema, self.layout, f, self.keep)
                                     for _, f in self.files)
        return self._num_rows

    def _global_batches(self) -> int:
        n, B = self.num_rows(), self.batch_size
        return n // B if self.drop_last else -(-n // B)

    def __len__(self) -> int:
        return self._global_batches() // self.world_size

    # -- iteration ----------------------------------------------------------------------

    def _chunks(self) -> Iterator[tuple[int, Path, pa.RecordBatch, int]]:
        """(day, file, record batch, impressions in it), in stream order."""
        rows = CHUNK_SESSIONS if self.layout == "sessions" else CHUNK_IMPRESSIONS
        for day, f in self.files:
            batches = parquet.iter_batches(f, rows, self.columns,
                                           check=values.checker(self.schema, f))
            for rb in (self._whole_runs(batches) if self.runs else batches):
                if self.keep is not None:
                    rb = self._on_verticals(rb, f)
                if self.layout == "sessions":
                    lab = rb.column(rb.schema.get_field_index(LABEL))
                    n = int(pc.sum(pc.list_value_length(lab)).as_py() or 0)
                else:
                    n = rb.num_rows
                if n:
                    yield day, f, rb, n

    def _on_verticals(self, rb: pa.RecordBatch, path: Path) -> pa.RecordBatch:
        """The rows of `rb` on the kept verticals; dedup keeps a run of shared histories on
        one vertical, so the rows kept are whole runs (checked: a file whose runs span
        verticals was deduplicated before lrm knew of verticals)."""
        assert self.keep is not None and self.schema.vertical is not None
        mask = pc.fill_null(pc.is_in(rb.column(rb.schema.get_field_index(self.schema.vertical)),
                                     value_set=self.keep), False)
        out = rb.filter(mask)
        if self.runs and out.num_rows:
            for c in self.schema.user_seq:
                items = out.column(out.schema.get_field_index(c))
                off = out.column(out.schema.get_field_index(window_columns(c)[0]))
                if not (items[0].is_valid or off[0].as_py() == -1):
                    raise DataError(path, None, c, "its shared histories span verticals "
                                    "(written before lrm kept a vertical's runs apart): "
                                    "run dedup on its raw data again")
        return out

    def _whole_runs(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The record batches re-cut where every sequence feature starts a run (a run
        that reaches past a batch is carried into the next)."""
        carry: pa.RecordBatch | None = None
        for rb in batches:
            if carry is not None:
                rb = pa.concat_batches([carry, rb])
            starts = np.ones(rb.num_rows, bool)
            for c in self.schema.user_seq:  # a run starts where its items are stored ...
                items = rb.column(rb.schema.get_field_index(c))
                off = rb.column(rb.schema.get_field_index(window_columns(c)[0]))
                starts &= (items.is_valid().to_numpy(zero_copy_only=False)  # ... or at a null
                           | pc.fill_null(pc.equal(off, -1), False).to_numpy(zero_copy_only=False))
            cut = int(np.flatnonzero(starts)[-1]) if starts.any() else 0  # (a file that
            # starts inside a run fails in normalize, naming the file)
            if cut:
                yield rb.slice(0, cut)
            carry = rb.slice(cut)
        if carry is not None and carry.num_rows:
            yield carry

    def _jobs(self, submit: Callable[..., Future]) -> Iterator[Callable[[], Batch]]:
        """This rank's batches, from batch `self._start` on, as assembly jobs.

        Chunks are normalized through `submit` when a job first needs one (so a resumed
        or multi-rank iteration skips the work of batches it does not yield); that is
        always before the job itself is submitted.
        """
        B, W, r = self.batch_size, self.world_size, self.rank
        limit = len(self) * W  # global batches to cut (every rank the same count)
        first = self._start * W + r  # the first global batch this iteration yields
        if first >= limit:
            return
        spec = ChunkSpec(self.schema, self.layout, self.dedup, self.hash_sizes,
                         self.teacher_column, runs=self.runs, windows=self.windows)
        window: deque[_Pending] = deque()
        k = 0  # next global batch
        end = 0  # impressions seen so far

        def job(g0: int, g1: int) -> Callable[[], Batch]:
            pieces = [(c.future(submit, spec), max(g0, c.g0) - c.g0, min(g1, c.g1) - c.g0)
                      for c in window if c.g0 < g1 and c.g1 > g0]
            schema, dedup, pin = self.schema, self.dedup, self.pin_memory
            return lambda: _pinned(assemble([(f.result(), a, b) for f, a, b in pieces], schema,
                                            dedup), pin)

        for day, f, rb, n in self._chunks():
            window.append(_Pending(end, end + n, day, f, rb))
            end += n
            while k < limit and (k + 1) * B <= end:
                if k % W == r and k >= first:
                    yield job(k * B, (k + 1) * B)
                k += 1
                while window and window[0].g1 <= k * B:
                    window.popleft()
            if k >= limit:
                return
        if k < limit and k % W == r and k >= first:  # the last, partial batch
            yield job(k * B, end)

    def __iter__(self) -> Iterator[Batch]:
        self._start, self._next_start = self._next_start, 0
        self._done = self._start
        if self.num_workers == 0 or self.prefetch == 0:
            batches = (job() for job in self._jobs(_Now))
        else:
            batches = self._iter_background()
        try:
            for b in batches:
                self._done += 1
                yield b
        finally:
            batches.close()  # stops the background threads when the consumer stops early

    def state_dict(self) -> dict[str, int]:
        """Where the current (or last) iteration is: this rank's batches handed out."""
        return {"batch": self._done, "batch_size": self.batch_size,
                "world_size": self.world_size}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """The next iteration resumes after the `state["batch"]` batches already handed out."""
        if (state.get("batch_size"), state.get("world_size")) != (self.batch_size,
                                                                  self.world_size):
            raise ValueError(f"cannot resume {dict(state)}: this loader has batch_size="
                             f"{self.batch_size}, world_size={self.world_size}")
        self._next_start = int(state["batch"])

    def _iter_background(self) -> Iterator[Batch]:
        pool = ThreadPoolExecutor(self.num_workers, thread_name_prefix="lrm-loader")
        out: queue.Queue[Any] = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    out.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        def produce() -> None:
            try:
                # FIFO pool: a chunk's normalization is queued before any job that waits
                # on it, so a job never waits on work that no thread will start.
                for job in self._jobs(pool.submit):
                    if not put(pool.submit(job)):
                        return
                put(_DONE)
            except BaseException as e:  # reported to the consumer in order
                put(e)

        producer = threading.Thread(target=produce, name="lrm-loader-plan", daemon=True)
        producer.start()
        try:
            while True:
                item = out.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item.result()
        finally:
            stop.set()
            while True:  # unblock the producer, cancel what is queued
                try:
                    item = out.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, Future):
                    item.cancel()
            producer.join()
            pool.shutdown(wait=True, cancel_futures=True)

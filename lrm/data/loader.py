"""Parquet (either layout) -> `Batch`es of KJTs, in a fixed order, prefetched in the background.

The stream is every impression of the chosen days, in order (days ascending, files in
order, rows in order), cut into batches of exactly `batch_size` impressions; a session may
straddle two batches (its user row then appears in both).

Each file is read in chunks, and each chunk is normalized once into numpy arrays:
impression-side columns (labels, dense, item features) per impression, user-side features
per *user row* plus `row_of`, the user row of every impression. In the RecD form a user row
is a session (from the sessions layout: the list offsets; from the impressions layout: the
run starts of session_id); in the plain form it is the impression itself. Every sparse
feature is kept jagged (lengths, offsets, values; a null is length 0), so cutting a batch
out of a chunk is slicing, and a batch is built with a handful of concatenations.

Worker threads normalize chunks and assemble batches (pyarrow, numpy and torch release the
GIL); the batch futures are consumed in submission order, so the output does not depend on
`num_workers` or `prefetch`.
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
import pyarrow.parquet as pq
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lrm.config import LoaderConfig
from lrm.data.batch import Batch
from lrm.data.schema import LABEL, META_KEY, SESSION, FeatureSchema, day_files, read_schema
from lrm.errors import DataError

CHUNK_IMPRESSIONS = 64 * 1024  # impressions per chunk read from the impressions layout
CHUNK_SESSIONS = 8 * 1024  # sessions per chunk read from the sessions layout


# ---------------------------------------------------------------------------------------
# Normalized chunks


@dataclass
class _Jagged:
    """One sparse feature over some rows: row i holds values[offsets[i]:offsets[i+1]]."""

    lengths: np.ndarray  # int32 [rows]
    offsets: np.ndarray  # int64 [rows + 1]
    values: np.ndarray  # int64

    @classmethod
    def from_lengths(cls, lengths: np.ndarray, values: np.ndarray) -> _Jagged:
        offsets = np.zeros(lengths.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(lengths.astype(np.int32, copy=False), offsets, values)

    def rows(self, r0: int, r1: int) -> tuple[np.ndarray, np.ndarray]:
        """(lengths, values) of rows [r0, r1), as views."""
        return self.lengths[r0:r1], self.values[self.offsets[r0]:self.offsets[r1]]

    def take(self, rows: np.ndarray) -> _Jagged:
        """Rows gathered by index (vectorized: one repeat + arange over the values)."""
        lens = self.lengths[rows].astype(np.int64)
        starts = self.offsets[:-1][rows]
        out_offs = np.zeros(rows.size + 1, dtype=np.int64)
        np.cumsum(lens, out=out_offs[1:])
        idx = np.repeat(starts - out_offs[:-1], lens)
        idx += np.arange(idx.size, dtype=np.int64)
        return _Jagged(lens.astype(np.int32), out_offs, self.values[idx])


def _hash(values: np.ndarray, size: int | None) -> np.ndarray:
    # np.remainder follows the divisor's sign, so negative ids land in [0, size) too.
    return values if size is None else np.remainder(values, size)


def _jagged(arr: pa.Array, size: int | None) -> _Jagged:
    """An int64 column (null -> length 0) or a list<int64> column as a jagged feature."""
    n = len(arr)
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        lens = pc.fill_null(pc.list_value_length(arr), 0).to_numpy().astype(np.int64)
        flat = pc.list_flatten(arr)
        if flat.null_count:  # null elements inside lists carry no value either
            keep = flat.is_valid().to_numpy(zero_copy_only=False)
            row = np.repeat(np.arange(n), lens)
            lens = np.bincount(row[keep], minlength=n)
            flat = flat.filter(pa.array(keep))
        vals = flat.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    elif arr.null_count:
        lens = arr.is_valid().to_numpy(zero_copy_only=False).astype(np.int64)
        vals = pc.drop_null(arr).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    else:
        lens = np.ones(n, dtype=np.int64)
        vals = arr.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return _Jagged.from_lengths(lens, _hash(vals, size))


def _floats(arr: pa.Array) -> np.ndarray:
    return pc.fill_null(arr, 0).to_numpy(zero_copy_only=False).astype(np.float32, copy=False)


@dataclass
class _Chunk:
    """Consecutive impressions of one file, normalized (see the module docstring)."""

    day: int
    n: int  # impressions
    labels: np.ndarray  # float32 [n]
    dense: np.ndarray  # float32 [n, n_dense]
    teacher: np.ndarray | None  # float32 [n]
    item: list[_Jagged]  # rows = impressions
    user: list[_Jagged]  # rows = user rows
    row_of: np.ndarray  # int64 [n], nondecreasing: the user row of each impression
    session: np.ndarray  # int64 [user rows]: session id per user row


@dataclass(frozen=True)
class _Spec:
    """What a chunk is normalized with."""

    schema: FeatureSchema
    layout: str
    dedup: bool
    hash_sizes: Mapping[str, int]
    teacher: str | None


def _col(t: pa.Table, name: str) -> pa.Array:
    c = t.column(name)
    return c.chunk(0) if c.num_chunks == 1 else pa.concat_arrays(c.chunks)


def _normalize(rb: pa.RecordBatch, day: int, path: Path, spec: _Spec) -> _Chunk:
    """One chunk of a file as numpy: impression side per impression, user side per user row."""
    s, hs = spec.schema, spec.hash_sizes
    t = pa.Table.from_batches([rb])
    if spec.layout == "sessions":
        if _col(t, LABEL).null_count:
            raise DataError(path, None, LABEL, "null impression list in a session row")
        lens = pc.list_value_length(_col(t, LABEL)).to_numpy().astype(np.int64)
        if (lens == 0).any():  # a session without impressions has no row in any batch
            keep = np.flatnonzero(lens)
            t, lens = t.take(pa.array(keep)), lens[keep]

        def imp(name: str) -> pa.Array:
            return pc.list_flatten(_col(t, name))
    else:
        def imp(name: str) -> pa.Array:
            return _col(t, name)

    labels_arr = imp(LABEL)
    if labels_arr.null_count:
        raise DataError(path, None, LABEL, "null label")
    n = len(labels_arr)
    labels = labels_arr.to_numpy(zero_copy_only=False).astype(np.float32)
    dense = np.zeros((n, len(s.dense)), dtype=np.float32)
    for j, c in enumerate(s.dense):
        dense[:, j] = _floats(imp(c))
    teacher = None
    if spec.teacher is not None:
        ta = imp(spec.teacher)
        if ta.null_count:
            raise DataError(path, None, spec.teacher, "null teacher logit")
        teacher = _floats(ta)
    item = [_jagged(imp(c), hs.get(c)) for c in s.item_sparse]

    sid = _col(t, SESSION).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    if spec.layout == "sessions":  # user rows = session rows: the list offsets
        user = [_jagged(_col(t, c), hs.get(c)) for c in s.user_features]
        row_of = np.repeat(np.arange(t.num_rows, dtype=np.int64), lens)
        if not spec.dedup:  # plain form: every impression gets its session's row
            user = [f.take(row_of) for f in user]
            row_of, sid = np.arange(n, dtype=np.int64), sid[row_of]
    elif spec.dedup:  # RecD from the impressions layout: run-length of session_id
        change = np.empty(n, dtype=bool)
        change[:1] = True
        np.not_equal(sid[1:], sid[:-1], out=change[1:])
        starts = np.flatnonzero(change)
        heads = t.select(list(s.user_features)).take(pa.array(starts))
        user = [_jagged(_col(heads, c), hs.get(c)) for c in s.user_features]
        row_of, sid = np.cumsum(change, dtype=np.int64) - 1, sid[starts]
    else:  # plain form from the impressions layout: every impression is its own user row
        user = [_jagged(_col(t, c), hs.get(c)) for c in s.user_features]
        row_of = np.arange(n, dtype=np.int64)
    return _Chunk(day, n, labels, dense, teacher, item, user, row_of, sid)


# ---------------------------------------------------------------------------------------
# Batches


def _kjt(keys: Sequence[str], parts: list[list[tuple[np.ndarray, np.ndarray]]],
         stride: int) -> KeyedJaggedTensor:
    """KJT from, per key, a list of (lengths, values) pieces."""
    if not keys:
        return KeyedJaggedTensor(keys=[], values=torch.zeros(0, dtype=torch.int64),
                                 lengths=torch.zeros(0, dtype=torch.int32), stride=stride)
    lengths = np.concatenate([p[0] for per_key in parts for p in per_key])
    values = np.concatenate([p[1] for per_key in parts for p in per_key])
    return KeyedJaggedTensor(keys=list(keys), values=torch.from_numpy(values),
                             lengths=torch.from_numpy(lengths), stride=stride)


def _assemble(pieces: list[tuple[Future[_Chunk], int, int]], schema: FeatureSchema,
              dedup: bool) -> Batch:
    """The batch made of impressions [a, b) of each chunk, in order."""
    n_user, n_item = len(schema.user_features), len(schema.item_sparse)
    user_parts: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(n_user)]
    item_parts: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(n_item)]
    dense, labels, teacher, inverse = [], [], [], []
    U = 0
    last: tuple[int, int] | None = None  # (day, session id) of the last user row so far
    for fut, a, b in pieces:
        c = fut.result()
        r0, r1 = int(c.row_of[a]), int(c.row_of[b - 1]) + 1
        base = U - r0
        if dedup and last == (c.day, int(c.session[r0])):  # a session straddling chunks
            r0 += 1
            base -= 1
        if dedup:
            inverse.append(c.row_of[a:b] + base)
        for j, f in enumerate(c.user):
            user_parts[j].append(f.rows(r0, r1))
        for j, f in enumerate(c.item):
            item_parts[j].append(f.rows(a, b))
        dense.append(c.dense[a:b])
        labels.append(c.labels[a:b])
        if c.teacher is not None:
            teacher.append(c.teacher[a:b])
        U += r1 - r0
        last = (c.day, int(c.session[r1 - 1])) if r1 > r0 else last
    B = sum(b - a for _, a, b in pieces)
    return Batch(
        dense=torch.from_numpy(np.concatenate(dense)),
        item=_kjt(schema.item_sparse, item_parts, B),
        user=_kjt(schema.user_features, user_parts, U if dedup else B),
        labels=torch.from_numpy(np.concatenate(labels)),
        inverse=torch.from_numpy(np.concatenate(inverse)) if dedup else None,
        teacher_logits=torch.from_numpy(np.concatenate(teacher)) if teacher else None,
    )


class _Now(Future):  # type: ignore[type-arg]
    """A future that is already done: the synchronous path (num_workers=0 or prefetch=0)."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        super().__init__()
        try:
            self.set_result(fn(*args))
        except BaseException as e:  # re-raised by result(), like a pool future
            self.set_exception(e)


_DONE = object()


@dataclass
class _Pending:
    """A chunk read but maybe not yet normalized; impressions [g0, g1) of the stream."""

    g0: int
    g1: int
    day: int
    path: Path
    rb: pa.RecordBatch | None
    fut: Future[_Chunk] | None = None

    def future(self, submit: Callable[..., Future], spec: _Spec) -> Future[_Chunk]:
        if self.fut is None:
            self.fut = submit(_normalize, self.rb, self.day, self.path, spec)
            self.rb = None
        return self.fut


class BatchLoader:
    """Iterable of `Batch` over a dataset folder in either layout (see the module docstring).

    dedup: user-side features once per session in the batch (`user` stride U, `inverse`)
        or once per impression (stride B, inverse None).
    hash_sizes: feature -> table size; its ids are mapped into [0, size) (floor modulo, so
        negative ids too); other features keep their raw ids.
    rank, world_size: rank r gets global batches r, r + W, ...; every rank gets the same
        number (the tail that not every rank can have is dropped).
    prefetch: batches prepared ahead by `num_workers` background threads (0 for either:
        everything in the calling thread). The output never depends on them.
    teacher_column: per-impression float column returned as `teacher_logits`.
    """

    def __init__(self, root: Path, batch_size: int, *, days: Sequence[int] | None = None,
                 dedup: bool = True, hash_sizes: Mapping[str, int] | None = None,
                 rank: int = 0, world_size: int = 1, prefetch: int = 4, num_workers: int = 1,
                 drop_last: bool = False, teacher_column: str | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, "
                             f"world_size={world_size}")
        if prefetch < 0 or num_workers < 0:
            raise ValueError("prefetch and num_workers must be >= 0")
        self.root = Path(root)
        self.batch_size, self.dedup, self.drop_last = batch_size, dedup, drop_last
        self.rank, self.world_size = rank, world_size
        self.prefetch, self.num_workers = prefetch, num_workers
        self.schema, self.layout = read_schema(self.root)
        files = day_files(self.root)
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
        self.columns = self._check_files()  # the Parquet columns read
        self._num_rows: int | None = None
        self._start = self._next_start = self._done = 0  # resume state (state_dict)

    @classmethod
    def from_config(cls, root: Path, cfg: LoaderConfig, **kwargs: Any) -> BatchLoader:
        """A loader with params.yaml's `loader` section (batch size, form, prefetching)."""
        return cls(root, cfg.batch_size, dedup=cfg.dedup, prefetch=cfg.prefetch,
                   num_workers=cfg.num_workers, **kwargs)

    def _check_files(self) -> list[str]:
        """Every file has this dataset's layout and schema (footers only); the columns to read."""
        s = self.schema
        cols = [SESSION, LABEL, *s.user_features, *s.item_sparse, *s.dense]
        if self.teacher_column is not None:
            cols.append(self.teacher_column)
        for _, f in self.files:
            arrow = pq.read_schema(f)
            meta = arrow.metadata or {}
            layout = meta.get(b"lrm.layout", b"").decode()
            if layout != self.layout or (
                    META_KEY in meta and FeatureSchema.from_json(meta[META_KEY].decode()) != s):
                raise DataError(f, None, None, f"layout or schema differs from {self.root}'s "
                                f"first file (expected the {self.layout} layout)")
            missing = [c for c in cols if c not in arrow.names]
            if missing:
                raise DataError(f, None, missing[0], "column not found"
                                + (" (teacher_column: is this augmented data?)"
                                   if missing[0] == self.teacher_column else ""))
        return cols

    # -- sizes ------------------------------------------------------------------------

    def num_rows(self) -> int:
        """Impressions in the chosen days (read from footers, or the label lists)."""
        if self._num_rows is None:
            if self.layout == "impressions":
                self._num_rows = sum(pq.read_metadata(f).num_rows for _, f in self.files)
            else:
                total = 0
                for _, f in self.files:
                    lab = pq.read_table(f, columns=[LABEL]).column(LABEL)
                    total += sum(int(pc.sum(pc.list_value_length(ch)).as_py() or 0)
                                 for ch in lab.chunks)
                self._num_rows = total
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
            pf = pq.ParquetFile(f)
            for rb in pf.iter_batches(batch_size=rows, columns=self.columns):
                if self.layout == "sessions":
                    lab = rb.column(rb.schema.get_field_index(LABEL))
                    n = int(pc.sum(pc.list_value_length(lab)).as_py() or 0)
                else:
                    n = rb.num_rows
                if n:
                    yield day, f, rb, n

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
        spec = _Spec(self.schema, self.layout, self.dedup, self.hash_sizes,
                     self.teacher_column)
        window: deque[_Pending] = deque()
        k = 0  # next global batch
        end = 0  # impressions seen so far

        def job(g0: int, g1: int) -> Callable[[], Batch]:
            pieces = [(c.future(submit, spec), max(g0, c.g0) - c.g0, min(g1, c.g1) - c.g0)
                      for c in window if c.g0 < g1 and c.g1 > g0]
            schema, dedup = self.schema, self.dedup
            return lambda: _assemble(pieces, schema, dedup)

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

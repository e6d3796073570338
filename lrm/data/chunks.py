"""Normalized chunks of a dataset file, and the batches cut from them.

A chunk is consecutive impressions of one file, normalized once into numpy arrays:
impression-side columns (labels, dense, item features) per impression, user-side features
per *user row* plus `row_of`, the user row of every impression. In the RecD form a user row
is a session (from the sessions layout: the list offsets; from the impressions layout: the
run starts of session_id); in the plain form it is the impression itself. Every sparse
feature is kept jagged (lengths, offsets, values; a null is length 0), so cutting a batch
out of chunks is slicing, and a batch is built with a handful of concatenations
(`assemble`). Which chunks and slices make a batch is the loader's business
(lrm.data.loader).

Shared histories (the sessions layout's runs, lrm.data.histories): in the RecD form with
`windows` on, a sequence feature stays as its runs' items plus every session's window
(`Windows`); a batch then looks each run's items up once, cut into *segments* at every
window boundary of its sessions in the batch, and each session's window is a contiguous
range of segments (`Batch.windows`). A user's sessions in a batch thus share one lookup of
their history. Elsewhere (plain form, or windows off) every session gets its own list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lrm.data import histories
from lrm.data.batch import Batch, Windows
from lrm.data.schema import LABEL, SESSION, FeatureSchema, window_columns
from lrm.errors import DataError


# ---------------------------------------------------------------------------------------
# Chunks: one file's consecutive impressions, normalized


@dataclass
class Jagged:
    """One sparse feature over some rows: row i holds values[offsets[i]:offsets[i+1]]."""

    lengths: np.ndarray  # int32 [rows]
    offsets: np.ndarray  # int64 [rows + 1]
    values: np.ndarray  # int64

    @classmethod
    def from_lengths(cls, lengths: np.ndarray, values: np.ndarray) -> Jagged:
        offsets = np.zeros(lengths.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(lengths.astype(np.int32, copy=False), offsets, values)

    def rows(self, r0: int, r1: int) -> tuple[np.ndarray, np.ndarray]:
        """(lengths, values) of rows [r0, r1), as views."""
        return self.lengths[r0:r1], self.values[self.offsets[r0]:self.offsets[r1]]

    def take(self, rows: np.ndarray) -> Jagged:
        """Rows gathered by index (vectorized: histories.gather's one repeat + arange)."""
        lens = self.lengths[rows].astype(np.int64)
        out_offs = np.zeros(rows.size + 1, dtype=np.int64)
        np.cumsum(lens, out=out_offs[1:])
        idx = histories.gather(self.offsets[:-1][rows], lens)
        return Jagged(lens.astype(np.int32), out_offs, self.values[idx])


@dataclass
class Runs:
    """A sequence feature over user rows as windows into runs' items (ids hashed).

    Row r's list is values[start[r]:start[r] + length[r]]; rows of one run share `head`
    (the row holding the run's items, values[items_at[head]:items_at[head + 1]]).
    """

    values: np.ndarray  # int64: every run's items, one run after another
    items_at: np.ndarray  # int64 [rows + 1]: a run's items start at items_at[head]
    head: np.ndarray  # int64 [rows]
    start: np.ndarray  # int64 [rows]
    length: np.ndarray  # int64 [rows]

    def expand(self) -> Jagged:
        """Every row's own list."""
        return Jagged.from_lengths(self.length, self.values[histories.gather(self.start,
                                                                             self.length)])

    def take(self, rows: np.ndarray) -> Runs:
        """Rows by index (the runs' items stay where they are)."""
        return Runs(self.values, self.items_at, self.head[rows], self.start[rows],
                    self.length[rows])


def _runs(col: pa.Array, offset: pa.Array | None, length: pa.Array | None, size: int | None,
          path: Path, field: str) -> Runs:
    """A sequence column (with its window columns, if stored in runs) as Runs; null
    elements inside the lists are dropped like every other null."""
    r = histories.decode(col, offset, length, source=path, field=field)
    flat = r.values
    start, end, at = r.start, r.start + r.length, r.item_offsets
    if flat.null_count:  # positions move down past the dropped nulls
        valid = flat.is_valid().to_numpy(zero_copy_only=False)
        before = np.zeros(len(valid) + 1, np.int64)
        np.cumsum(valid, out=before[1:])
        start, end, at = before[start], before[end], before[at]
        flat = flat.filter(pa.array(valid))
    vals = flat.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return Runs(_hash(vals, size), at, r.head, start, end - start)


def _hash(values: np.ndarray, size: int | None) -> np.ndarray:
    # np.remainder follows the divisor's sign, so negative ids land in [0, size) too.
    return values if size is None else np.remainder(values, size)


def _jagged(arr: pa.Array, size: int | None) -> Jagged:
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
    return Jagged.from_lengths(lens, _hash(vals, size))


def _floats(arr: pa.Array) -> np.ndarray:
    return pc.fill_null(arr, 0).to_numpy(zero_copy_only=False).astype(np.float32, copy=False)


@dataclass
class Chunk:
    """Consecutive impressions of one file, normalized (see the module docstring)."""

    day: int
    n: int  # impressions
    labels: np.ndarray  # float32 [n]
    dense: np.ndarray  # float32 [n, n_dense]
    teacher: np.ndarray | None  # float32 [n]
    item: list[Jagged]  # rows = impressions
    user: list[Jagged | Runs]  # rows = user rows; Runs only in the windows form
    row_of: np.ndarray  # int64 [n], nondecreasing: the user row of each impression
    session: np.ndarray  # int64 [user rows]: session id per user row


@dataclass(frozen=True)
class ChunkSpec:
    """What a chunk is normalized with.

    runs: the sessions layout stores sequence features in runs (window columns).
    windows: keep them as runs (the windows form of RecD batches; needs dedup and runs).
    """

    schema: FeatureSchema
    layout: str
    dedup: bool
    hash_sizes: Mapping[str, int]
    teacher: str | None
    runs: bool = False
    windows: bool = False


def _col(t: pa.Table, name: str) -> pa.Array:
    c = t.column(name)
    return c.chunk(0) if c.num_chunks == 1 else pa.concat_arrays(c.chunks)


def normalize(rb: pa.RecordBatch, day: int, path: Path, spec: ChunkSpec) -> Chunk:
    """One chunk of a file as numpy: impression side per impression, user side per user row."""
    s, hs = spec.schema, spec.hash_sizes
    t = pa.Table.from_batches([rb])
    if spec.layout == "sessions":
        if _col(t, LABEL).null_count:
            raise DataError(path, None, LABEL, "null impression list in a session row")
        lens = pc.list_value_length(_col(t, LABEL)).to_numpy().astype(np.int64)
        # decoded before empty sessions go: one may hold its run's items
        seq = {c: _runs(_col(t, c), *((_col(t, w) for w in window_columns(c)) if spec.runs
                                      else (None, None)), hs.get(c), path, c)
               for c in s.user_seq}
        if (lens == 0).any():  # a session without impressions has no row in any batch
            keep = np.flatnonzero(lens)
            t, lens = t.take(pa.array(keep)), lens[keep]
            seq = {c: r.take(keep) for c, r in seq.items()}

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
        user: list[Jagged | Runs] = [_jagged(_col(t, c), hs.get(c)) for c in s.user_sparse]
        user += [r if spec.windows and spec.dedup else r.expand() for r in seq.values()]
        row_of = np.repeat(np.arange(t.num_rows, dtype=np.int64), lens)
        if not spec.dedup:  # plain form: every impression gets its session's row
            user = [f.take(row_of) for f in user]  # type: ignore[union-attr]
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
    return Chunk(day, n, labels, dense, teacher, item, user, row_of, sid)


# ---------------------------------------------------------------------------------------
# Batches: slices of chunks, concatenated


def _kjt(keys: Sequence[str], parts: list[list[tuple[np.ndarray, np.ndarray]]],
         stride: int) -> KeyedJaggedTensor:
    """KJT from, per key, a list of (lengths, values) pieces."""
    if not keys:
        return KeyedJaggedTensor(keys=[], values=torch.zeros(0, dtype=torch.int64),
                                 lengths=torch.zeros(0, dtype=torch.int32), stride=stride)
    lengths = np.concatenate([p[0] for per_key in parts for p in per_key])
    values = np.concatenate([p[1] for per_key in parts for p in per_key])
    # the values per key, counted here on the host: torchrec reads them in every input
    # dist, split and permute, and would otherwise sum the lengths on the device and copy
    # them back (a host sync each time on a GPU); `KeyedJaggedTensor.to` keeps them
    counts = [sum(int(p[0].sum()) for p in pieces) for pieces in parts]
    return KeyedJaggedTensor(keys=list(keys), values=torch.from_numpy(values),
                             lengths=torch.from_numpy(lengths), stride=stride,
                             length_per_key=counts)


def _segments(parts: Sequence[tuple[Runs, int, int]]
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """User rows [r0, r1) of each part as segments of their runs' items.

    Within a run, the boundaries of every window in the batch cut the run's items into
    segments; each item a window covers is in exactly one segment, and a window is a
    contiguous range of segments. Returns (segment lengths, segment values, per row: first
    segment, end segment, window length).
    """
    seg_len, seg_val, first, end, length = [], [], [], [], []
    G = 0
    for runs, r0, r1 in parts:
        head, ln = runs.head[r0:r1], runs.length[r0:r1]
        rel = runs.start[r0:r1] - runs.items_at[head]  # the window's start within its run
        new_run = np.empty(len(head), bool)
        new_run[:1] = True
        np.not_equal(head[1:], head[:-1], out=new_run[1:])
        run = np.cumsum(new_run) - 1
        span = int(runs.items_at[-1]) + 1  # positions in a run lie below it
        lo = run * span + rel
        hi = lo + ln
        has = ln > 0
        pts = np.unique(np.concatenate([lo[has], hi[has]]))
        i_lo, i_hi = np.searchsorted(pts, lo), np.searchsorted(pts, hi)
        # the gap after point i is a segment when some window covers it
        cover = (np.bincount(i_lo[has], minlength=len(pts) + 1)
                 - np.bincount(i_hi[has], minlength=len(pts) + 1))
        covered = np.cumsum(cover)[:max(len(pts) - 1, 0)] > 0
        before = np.zeros(len(pts) + 1, np.int64)  # covered gaps before point i
        np.cumsum(covered, out=before[1:len(pts)])
        gaps = np.flatnonzero(covered)
        run_head = head[new_run]
        starts = runs.items_at[run_head[pts[gaps] // span]] + pts[gaps] % span
        lens = pts[gaps + 1] - pts[gaps]
        seg_len.append(lens)
        seg_val.append(runs.values[histories.gather(starts, lens)])
        first.append(np.where(has, before[np.minimum(i_lo, len(pts))], 0) + G)
        end.append(np.where(has, before[np.minimum(i_hi, len(pts))], 0) + G)
        length.append(ln)
        G += len(gaps)
    return tuple(np.concatenate(x) if x else np.zeros(0, np.int64)  # type: ignore[return-value]
                 for x in (seg_len, seg_val, first, end, length))


def assemble(pieces: Sequence[tuple[Chunk, int, int]], schema: FeatureSchema,
             dedup: bool) -> Batch:
    """The batch made of impressions [a, b) of each chunk, in order.

    In the RecD form a session that straddles two consecutive chunks (same day and
    session id) gets one user row. Sequence features kept as runs (the windows form) come
    out as segments: `user` then has U + G rows (sessions, then segments) and `windows`
    says which segments make each session's window.
    """
    n_user, n_item = len(schema.user_features), len(schema.item_sparse)
    user_parts: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(n_user)]
    run_parts: list[list[tuple[Runs, int, int]]] = [[] for _ in range(n_user)]
    item_parts: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(n_item)]
    dense, labels, teacher, inverse = [], [], [], []
    U = 0
    last: tuple[int, int] | None = None  # (day, session id) of the last user row so far
    for c, a, b in pieces:
        r0, r1 = int(c.row_of[a]), int(c.row_of[b - 1]) + 1
        base = U - r0
        if dedup and last == (c.day, int(c.session[r0])):  # a session straddling chunks
            r0 += 1
            base -= 1
        if dedup:
            inverse.append(c.row_of[a:b] + base)
        for j, f in enumerate(c.user):
            if isinstance(f, Runs):
                run_parts[j].append((f, r0, r1))
            else:
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
    windows = None
    rows = U if dedup else B
    seq = [j for j in range(n_user) if run_parts[j]]
    if seq:  # the windows form: sessions on rows [0, U), segments on rows [U, U + G)
        segs = {j: _segments(run_parts[j]) for j in seq}
        G = max(len(segs[j][0]) for j in seq)
        for j in range(n_user):
            if j in segs:
                lens, vals = segs[j][0].astype(np.int32), segs[j][1]
                user_parts[j] = [(np.zeros(U, np.int32), vals[:0]), (lens, vals),
                                 (np.zeros(G - len(lens), np.int32), vals[:0])]
            else:
                user_parts[j].append((np.zeros(G, np.int32), np.zeros(0, np.int64)))

        def stack(k: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.from_numpy(np.stack([segs[j][k] for j in seq])).to(dtype)

        windows = Windows(
            sessions=U, keys=[schema.user_features[j] for j in seq],
            first=stack(2, torch.int64), end=stack(3, torch.int64),
            lengths=stack(4, torch.float32),
            segment_lengths=torch.from_numpy(np.stack([
                np.pad(segs[j][0], (0, G - len(segs[j][0]))) for j in seq])).float())
        rows = U + G
    return Batch(
        dense=torch.from_numpy(np.concatenate(dense)),
        item=_kjt(schema.item_sparse, item_parts, B),
        user=_kjt(schema.user_features, user_parts, rows),
        labels=torch.from_numpy(np.concatenate(labels)),
        inverse=torch.from_numpy(np.concatenate(inverse)) if dedup else None,
        teacher_logits=torch.from_numpy(np.concatenate(teacher)) if teacher else None,
        windows=windows,
    )

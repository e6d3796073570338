"""Shared histories: a sequence feature stored once per run of sessions that slide over it.

A user's sessions, sorted together, see windows of one history stream: each later session
sees the earlier one's items shifted by the few ads she browsed in between. A *run* is a
maximal stretch of consecutive rows where every row's list W_k is the previous row's
list W_{k-1} shifted: W_k = new items + W_{k-1}[:len(W_k) - s_k] for some s_k >= 0. The
run's items U (most recent first) are then

    U = W_last[:s_last] + ... + W_{h+1}[:s_{h+1}] + W_h        (h: the run's first row)

and row k's list is U[o_k : o_k + len(W_k)], with o_k the sum of the shifts after row k.
The sessions layout stores U on the run's first row (null on the others) and (o_k,
len(W_k)) on every row; a null list is its own run with offset -1. Lossless whatever the
data: rows that do not chain (different users, lists with null elements, a longer list
than its predecessor's overlap) simply start new runs.

Everything is vectorized over the flattened values: a shift candidate is a position of
the previous list's first item in the next list, verified by one gather and compare.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lrm.errors import DataError

_VERIFY_ELEMENTS = 1 << 24  # compared elements per verification pass (bounds memory)


def _np(arr: pa.Array, fill: int | float = 0) -> np.ndarray:
    if arr.null_count:
        arr = pc.fill_null(arr, fill)
    return arr.to_numpy(zero_copy_only=False)


def _list_array(col: pa.Array | pa.ChunkedArray) -> pa.ListArray:
    if isinstance(col, pa.ChunkedArray):
        col = col.chunk(0) if col.num_chunks == 1 else pa.concat_arrays(col.chunks)
    return col


def gather(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Indices start[i] + 0..length[i]-1, for every i, concatenated."""
    lengths = lengths.astype(np.int64, copy=False)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    out_off = np.cumsum(lengths) - lengths
    idx = np.repeat(starts.astype(np.int64) - out_off, lengths)
    idx += np.arange(total, dtype=np.int64)
    return idx


@dataclass
class Encoded:
    """A sequence column encoded in runs (see the module docstring)."""

    items: pa.ListArray  # U on a run's first row, null on the others
    offset: np.ndarray  # int32 per row: o_k (-1: a null list)
    length: np.ndarray  # int32 per row: len(W_k)

    @property
    def values_stored(self) -> int:
        return int(_np(pc.list_value_length(self.items)).sum())

    @property
    def values_carried(self) -> int:
        return int(self.length.sum())


def shifts(arr: pa.ListArray, heads: np.ndarray | None = None) -> np.ndarray:
    """Per row, the smallest s with W_k[s:] == W_{k-1}[:len(W_k) - s], or -1 (a new run).

    heads: rows forced to start a run (e.g. row-group starts). Row 0 always starts one.
    """
    n = len(arr)
    out = np.full(n, -1, np.int64)
    if n < 2:
        return out
    valid = arr.is_valid().to_numpy(zero_copy_only=False)
    lens = _np(pc.list_value_length(arr)).astype(np.int64)
    flat = pc.list_flatten(arr)  # values of the valid lists, in row order
    has_null = np.zeros(n, bool)
    if flat.null_count:
        row = np.repeat(np.arange(n), lens)
        has_null[row[~flat.is_valid().to_numpy(zero_copy_only=False)]] = True
    vals = _np(flat)
    offs = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offs[1:])
    ok = valid & (lens > 0) & ~has_null
    chain = np.zeros(n, bool)
    chain[1:] = ok[1:] & ok[:-1]
    if heads is not None:
        chain[heads] = False
    if not chain.any():
        return out
    # candidates: where the previous list's first item occurs in this list
    rows = np.flatnonzero(chain)
    first_prev = np.zeros(n, vals.dtype)
    first_prev[rows] = vals[offs[rows - 1]]
    elem_row = np.repeat(np.arange(n), lens)
    cand = np.flatnonzero(chain[elem_row] & (vals == first_prev[elem_row]))
    c_row = elem_row[cand]
    c_s = cand - offs[c_row]
    c_n = lens[c_row] - c_s  # overlap: must lie within the previous list
    keep = c_n <= lens[c_row - 1]
    cand, c_row, c_s, c_n = cand[keep], c_row[keep], c_s[keep], c_n[keep]
    good = np.zeros(len(cand), bool)
    i = 0
    while i < len(cand):  # verify in passes of at most _VERIFY_ELEMENTS compared values
        j = i + max(1, int(np.searchsorted(np.cumsum(c_n[i:]), _VERIFY_ELEMENTS)))
        a = gather(cand[i:j], c_n[i:j])
        b = gather(offs[c_row[i:j] - 1], c_n[i:j])
        bad = np.bincount(np.repeat(np.arange(j - i), c_n[i:j]), weights=vals[a] != vals[b],
                          minlength=j - i)
        good[i:j] = bad == 0
        i = j
    c_row, c_s = c_row[good], c_s[good]
    row_first, at = np.unique(c_row, return_index=True)  # candidates ascend: smallest s
    out[row_first] = c_s[at]
    return out


def encode(col: pa.Array | pa.ChunkedArray, group: int | None = None,
           breaks: np.ndarray | None = None) -> Encoded:
    """Encode a list<int64> column in runs; a new run starts at every multiple of `group`
    rows (so every row group of that size reads on its own) and at every row of `breaks`
    (e.g. where the sessions' vertical changes, so a reader of one vertical gets whole
    runs)."""
    arr = _list_array(col)
    n = len(arr)
    heads_forced = np.arange(0, n, group) if group else None
    if breaks is not None and len(breaks):
        heads_forced = np.union1d(heads_forced if heads_forced is not None else [],
                                  breaks).astype(np.int64)
    s = shifts(arr, heads_forced)
    head = s < 0
    valid = arr.is_valid().to_numpy(zero_copy_only=False)
    lens = _np(pc.list_value_length(arr)).astype(np.int64)
    offs = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offs[1:])
    run = np.cumsum(head) - 1
    t = np.where(head, 0, s)  # a row's shift (0 on a run's first row)
    cum = np.cumsum(t)
    total = np.bincount(run, weights=t, minlength=int(head.sum())).astype(np.int64)
    # o_k: the shifts after row k in its run = the run's total - those up to k
    offset = total[run] - (cum - cum[np.flatnonzero(head)][run])
    # items of each run: rows in descending order, each contributing its first c_k values
    contrib = np.where(head, lens, t)
    order = np.lexsort((-np.arange(n), run))
    flat = pc.list_flatten(arr)
    idx = gather(offs[:-1][order], contrib[order])
    items_values = flat.take(pa.array(idx))
    run_len = np.bincount(run, weights=contrib, minlength=int(head.sum())).astype(np.int64)
    item_offsets = np.zeros(n + 1, np.int64)  # per row: a run's items on its first row
    per_row = np.zeros(n, np.int64)
    per_row[head] = run_len
    np.cumsum(per_row, out=item_offsets[1:])
    items = pa.ListArray.from_arrays(pa.array(item_offsets.astype(np.int32)), items_values,
                                     mask=pa.array(~(head & valid)))
    offset = np.where(valid, offset, -1).astype(np.int32)
    return Encoded(items=items, offset=offset, length=lens.astype(np.int32))


@dataclass
class Runs:
    """A decoded sequence column: each row's window into its run's items."""

    head: np.ndarray  # int64 per row: the row holding the run's items
    start: np.ndarray  # int64 per row: the window's first value in `values`
    length: np.ndarray  # int64 per row (0 for a null list)
    valid: np.ndarray  # bool per row: False for a null list
    values: pa.Array  # the items of every run, flattened (row order of the heads)
    item_offsets: np.ndarray  # int64 [rows + 1]: row r's items are values[o[r]:o[r + 1]]

    def expand(self) -> pa.ListArray:
        """Every row's own list (null where the history is null)."""
        offsets = np.zeros(len(self.length) + 1, np.int64)
        np.cumsum(self.length, out=offsets[1:])
        vals = self.values.take(pa.array(gather(self.start, self.length)))
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), vals,
                                        mask=pa.array(~self.valid))


def decode(items: pa.Array | pa.ChunkedArray, offset: pa.Array | pa.ChunkedArray | None,
           length: pa.Array | pa.ChunkedArray | None, *, source: Path | str = "<table>",
           field: str = "", first_row: int = 0) -> Runs:
    """Windows of an encoded column; `offset`/`length` None: every row holds its own list
    (sessions layout version 1). DataError (naming `source`, `field` and the row) when a
    window has no run to read from or reaches past its run's items."""
    arr = _list_array(items)
    n = len(arr)
    stored = arr.is_valid().to_numpy(zero_copy_only=False)
    ilen = _np(pc.list_value_length(arr)).astype(np.int64)
    item_offsets = np.zeros(n + 1, np.int64)
    np.cumsum(ilen, out=item_offsets[1:])
    values = pc.list_flatten(arr)
    if offset is None or length is None:
        return Runs(np.arange(n), item_offsets[:-1], ilen, stored, values, item_offsets)
    off = _np(_list_array(offset), -2).astype(np.int64)
    ln = _np(_list_array(length), -1).astype(np.int64)
    null_list = off == -1
    starts_run = stored | null_list
    head = np.maximum.accumulate(np.where(starts_run, np.arange(n), -1))
    bad = (~starts_run & ((off < 0) | (head < 0))) | (off < -1) | (ln < 0) | (null_list & (ln != 0))
    if n:
        bad |= ~starts_run & null_list[np.maximum(head, 0)]  # a window into a null list
        bad |= ~null_list & (off + ln > ilen[np.maximum(head, 0)])
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        raise DataError(source, None, field,
                        f"row {first_row + r}: window (offset {off[r]}, length {ln[r]}) has no "
                        "run items to read (the file is damaged or was cut inside a run; "
                        "re-run dedup)")
    start = item_offsets[np.maximum(head, 0)] + np.maximum(off, 0)
    return Runs(head, start, np.where(null_list, 0, ln), ~null_list, values, item_offsets)

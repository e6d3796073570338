"""A frame's order by several columns, as one sort of one 64-bit key where the columns fit.

polars sorts by several columns through a row encoding: a 170k-row cell sorted by (bucket,
user, time, file, row, pos) costs ~45 ms, its codes and a stable sort of one integer ~15 ms
(measured on 2 cores; the gather of the rows after costs the same either way). Each column
becomes a small integer of the same order (a dense rank of its values, or its offset from
its least value) and the integers are packed, most significant first, into one key. The
tie-breaking columns (the rows' place in the input) need no bits when the frame is already
in their order: a stable sort keeps it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

_BITS = 64
_OFFSET = 2**40  # an integer column spanning less: its offset from its least value (else
# its dense rank, which costs a sort of its distinct values but needs fewer bits)


def _code(s: pl.Series) -> tuple[np.ndarray, int]:
    """`s` (no nulls) as unsigned integers of the same order, and their bits."""
    if s.dtype.is_integer():
        lo, hi = int(s.min()), int(s.max())  # type: ignore[arg-type]
        if hi - lo < _OFFSET:
            off = s - lo if s.dtype.is_unsigned_integer() else s.cast(pl.Int64) - lo
            return off.cast(pl.UInt64).to_numpy(), (hi - lo).bit_length()
    values = s.unique().sort()  # a dense rank, in polars' own order of the values
    ranks = pl.Series(np.arange(len(values), dtype=np.uint64))
    return s.replace_strict(values, ranks).to_numpy(), (len(values) - 1).bit_length()


def _sorted_by(df: pl.DataFrame, cols: Sequence[str]) -> bool:
    """Whether `df` is in the (ascending, lexicographic) order of `cols`."""
    if df.height < 2:
        return True
    later = np.zeros(df.height - 1, bool)  # a row already after the one before it
    for c in cols:
        v = df[c].to_numpy()
        if (v[1:] < v[:-1])[~later].any():
            return False
        later |= v[1:] > v[:-1]
    return True


def _in_runs(df: pl.DataFrame, keys: Sequence[str], tie: Sequence[str]) -> bool:
    """Whether `df` (keys: first, middle, last) is in the order of (first, last, tie) with
    one integer middle key: a time-ordered log's cell (its buckets, each in time order),
    whose order by (bucket, user, time) is a stable sort of each bucket by the user."""
    return (len(keys) == 3 and df.height > 1 and df[keys[1]].dtype.is_integer()
            and not any(df[k].null_count() for k in keys) and _sorted_by(df, [keys[0],
                                                                              keys[2], *tie]))


def _sort_runs(df: pl.DataFrame, keys: Sequence[str]) -> pl.Series:
    """The order of a frame `_in_runs`: each run of the first key sorted stably by the
    middle one (no ranks, no packing: a third of the one-key sort's time)."""
    first, mid = df[keys[0]].to_numpy(), df[keys[1]].to_numpy()
    cuts = np.flatnonzero(np.r_[True, first[1:] != first[:-1], True])
    out = np.empty(df.height, np.int64)
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        out[a:b] = np.argsort(mid[a:b], kind="stable") + a
    return pl.Series(out)


def arg_sort(df: pl.DataFrame, keys: Sequence[str], tie: Sequence[str]) -> pl.Series:
    """The permutation that sorts `df` by `keys`, then `tie` (no nulls in `tie`; unique
    together): that of ``df.sort([*keys, *tie])``, faster where `df` is in runs (`_in_runs`),
    or where the keys pack into 64 bits and `df` is already in the order of `tie` (or of
    the first key, then `tie`: a stable sort then leaves rows equal in every key in the
    order of `tie`)."""
    if _in_runs(df, keys, tie):
        return _sort_runs(df, keys)
    in_tie_order = _sorted_by(df, tie) or bool(keys) and _sorted_by(df, [keys[0], *tie])
    if df.height > 1 and in_tie_order and not any(df[k].null_count() for k in keys):
        codes = [_code(df[k]) for k in keys]
        if sum(b for _, b in codes) <= _BITS:
            key = np.zeros(df.height, np.uint64)
            for c, bits in codes:
                if bits:  # (a constant column: no bits)
                    key = (key << np.uint64(bits) if bits < _BITS else key) | c
            return pl.Series(np.argsort(key, kind="stable"))
    return df.select(pl.arg_sort_by([*keys, *tie])).to_series()


def sort(df: pl.DataFrame, keys: Sequence[str], tie: Sequence[str]) -> pl.DataFrame:
    """`df` sorted by `keys`, then `tie` (see `arg_sort`)."""
    return df[arg_sort(df, keys, tie)]

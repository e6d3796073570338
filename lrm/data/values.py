"""What the values of lrm's own datasets may be, checked wherever they are read.

The schema says what every column is (lrm.data.schema); a file whose footer and types fit
may still hold values no model should see. Checked on every record batch lrm reads from a
dataset (dedup's input, the loader's train, validation and held-out reads, the stats scan),
in either layout (a sessions file's per-impression lists are checked element by element):

    label       0 or 1, never null
    sparse ids  >= 0; below the feature's vocab where the schema knows it (null: missing)
    dense       finite (null: missing; NaN and inf are not values a model can learn from)

A value outside these is a DataError naming the file, the row group, the row within it and
the column, raised before the batch goes any further: dedup writes nothing (its days are
renamed into place only once all are written), training stops before the bad batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lrm.data.schema import LABEL, FeatureSchema
from lrm.errors import DataError

Check = Callable[[pa.RecordBatch, int, int], None]  # (batch, row group, its first row there)


@dataclass(frozen=True)
class Rules:
    label: str
    ids: Mapping[str, int | None]  # sparse column -> its vocab (None: hashed, any id >= 0)
    dense: tuple[str, ...]

    @classmethod
    def of(cls, schema: FeatureSchema) -> Rules:
        return cls(LABEL, {c: schema.vocab.get(c) for c in schema.sparse_features},
                   tuple(schema.dense))


def _values(col: pa.Array) -> tuple[pa.Array, np.ndarray | None]:
    """(the column's values, flattened when it holds lists; each value's row, for lists)."""
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
        lengths = pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False)
        return pc.list_flatten(col), np.repeat(np.arange(len(col)), lengths)
    return col, None


def _numbers(batch: pa.RecordBatch, column: str) -> tuple[pa.Array, np.ndarray | None] | None:
    """`_values` of a numeric column of the batch (None: absent, or not numbers: a type
    the layout check names)."""
    if column not in batch.schema.names:
        return None
    vals, rows = _values(batch.column(batch.schema.get_field_index(column)))
    return (vals, rows) if pa.types.is_integer(vals.type) or pa.types.is_floating(vals.type) \
        else None


def _first(mask: pa.Array | np.ndarray) -> int:
    m = mask.to_numpy(zero_copy_only=False) if isinstance(mask, pa.Array) else mask
    return int(np.flatnonzero(m)[0])


def check(batch: pa.RecordBatch, rules: Rules, path: Path | str, row_group: int,
          first_row: int = 0) -> None:
    """Raise a DataError at the first value `rules` do not allow (see the module docstring);
    `first_row`: the batch's first row within its row group."""
    def bad(column: str, i: int, rows: np.ndarray | None, what: str) -> DataError:
        row = first_row + (int(rows[i]) if rows is not None else i)
        return DataError(path, None, column, f"row group {row_group}, row {row}: {what}")

    if (found := _numbers(batch, rules.label)) is not None:
        vals, rows = found
        if vals.null_count:
            raise bad(rules.label, _first(vals.is_null()), rows, "null label")
        lo, hi = pc.min_max(vals).values()
        if len(vals) and (lo.as_py() < 0 or hi.as_py() > 1):
            i = _first(pc.or_(pc.less(vals, 0), pc.greater(vals, 1)))
            raise bad(rules.label, i, rows, f"label {vals[i].as_py()} (a label is 0 or 1)")
    for c, vocab in rules.ids.items():
        if (found := _numbers(batch, c)) is None:
            continue
        vals, rows = found
        lo, hi = pc.min_max(vals).values()
        if lo.as_py() is not None and lo.as_py() < 0:
            i = _first(pc.fill_null(pc.less(vals, 0), False))
            raise bad(c, i, rows, f"negative id {vals[i].as_py()} (ids are >= 0)")
        if vocab is not None and hi.as_py() is not None and hi.as_py() >= vocab:
            i = _first(pc.fill_null(pc.greater_equal(vals, vocab), False))
            raise bad(c, i, rows, f"id {vals[i].as_py()} outside the feature's vocabulary "
                                  f"[0, {vocab}) that the dataset's schema states")
    for c in rules.dense:
        if (found := _numbers(batch, c)) is None or not pa.types.is_floating(found[0].type):
            continue
        vals, rows = found
        finite = pc.fill_null(pc.is_finite(vals), True)
        if not pc.all(finite).as_py():
            i = _first(pc.invert(finite))
            raise bad(c, i, rows, f"{vals[i].as_py()} is not a finite value (missing values "
                                  f"are null)")


def checker(schema: FeatureSchema, path: Path | str) -> Check:
    """`check` with the schema's rules, for one file (lrm.data.parquet.iter_batches)."""
    rules = Rules.of(schema)
    return lambda batch, row_group, first_row: check(batch, rules, path, row_group, first_row)

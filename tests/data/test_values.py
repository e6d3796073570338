"""Bad values inside lrm's own Parquet: each is a DataError naming the file, the row group,
the row and the column, from every reader (dedup's input, the loader in either layout, the
stats scan), and a folder named like a day that is not one is never skipped."""

from __future__ import annotations

import math
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lrm.config import DedupConfig
from lrm.data import dedup, parquet
from lrm.data.loader import BatchLoader
from lrm.data.schema import day_files, part_path
from lrm.errors import DataError
from lrm.train.data import scan_days
from tests.data.test_dedup import SCHEMA, make_impressions

VOCAB = 1000
SCHEMA_V = type(SCHEMA)(**{**SCHEMA.__dict__, "vocab": {"user_id": VOCAB}})
# (column, the bad value, what the message says): the value goes into row 7 of row group 1
BAD = {
    "label 2": ("label", 2, "label 2 (a label is 0 or 1)"),
    "label -1": ("label", -1, "label -1"),
    "negative id": ("ad_id", -5, "negative id -5"),
    "id past the vocab": ("user_id", VOCAB, f"id {VOCAB} outside the feature's vocabulary"),
    "NaN dense": ("d_bid", math.nan, "nan is not a finite value"),
    "inf dense": ("d_bid", math.inf, "inf is not a finite value"),
}
ROW_GROUP_ROWS = 40


def _raw(root, case=None):
    """A one-day impressions dataset in row groups of 40 rows, with `case`'s bad value at
    row 7 of row group 1 (row 47 of the file)."""
    t = make_impressions(40, seed=5, schema=SCHEMA_V)
    if case is not None:
        col, value, _ = BAD[case]
        i = t.schema.get_field_index(col)
        vals = t.column(col).to_pylist()
        vals[ROW_GROUP_ROWS + 7] = value
        t = t.set_column(i, t.schema.field(i), pa.array(vals, t.schema.field(i).type))
    path = part_path(root, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(t, path, row_group_size=ROW_GROUP_ROWS)
    return path


def set_value(path, column: str, value: object, row: int = 0) -> None:
    """Rewrite a dataset file (either layout) with `value` as row `row`'s value of `column`
    (the first of its list in the sessions layout); the file's metadata kept."""
    t = parquet.read_table(path)
    i = t.schema.get_field_index(column)
    arr = t.column(column).combine_chunks()
    if pa.types.is_list(arr.type):
        flat = arr.flatten().to_pylist()
        flat[arr.offsets[row].as_py()] = value
        arr = pa.ListArray.from_arrays(arr.offsets, pa.array(flat, arr.type.value_type))
    else:
        vals = arr.to_pylist()
        vals[row] = value
        arr = pa.array(vals, arr.type)
    pq.write_table(t.set_column(i, t.schema.field(i), arr).replace_schema_metadata(
        pq.read_schema(path).metadata), path)


@pytest.mark.parametrize("case", list(BAD))
def test_dedup_names_file_row_group_row_and_column_and_writes_nothing(tmp_path, case):
    bad = _raw(tmp_path / "raw", case)
    with pytest.raises(DataError) as err:
        dedup.update(tmp_path / "raw", tmp_path / "sessions", DedupConfig())
    col, _, says = BAD[case]
    msg = str(err.value)
    assert msg.startswith(f"{bad}, field {col}: row group 1, row 7: ") and says in msg, msg
    assert not (tmp_path / "sessions").exists() or not any((tmp_path / "sessions").iterdir())


@pytest.mark.parametrize("layout", ["raw", "sessions"])
@pytest.mark.parametrize("case", list(BAD))
def test_the_loader_and_the_scan_name_the_bad_value(tmp_path, case, layout):
    """In the sessions layout the per-impression columns are lists: the row named is the
    session row holding the bad impression."""
    _raw(tmp_path / "raw")
    dedup.update(tmp_path / "raw", tmp_path / "sessions", DedupConfig(rows_per_file=1000))
    path = day_files(tmp_path / layout)[0][0]
    col, value, says = BAD[case]
    if layout == "raw":
        _raw(tmp_path / "raw", case)
        row_group, row = 1, 7
    else:  # the first impression of session row 3 of row group 0 (every row group: 128)
        set_value(path, col, value, row=3)
        row_group, row = 0, 3
    where = f"{path}, field {col}: row group {row_group}, row {row}: "
    with pytest.raises(DataError) as err:
        list(BatchLoader(tmp_path / layout, 16, num_workers=1, prefetch=2))
    assert str(err.value).startswith(where) and says in str(err.value), str(err.value)
    if col == "label":  # the scan that sizes a run reads the labels: caught before a step
        with pytest.raises(DataError, match=f"^{where}"):
            scan_days(tmp_path / layout, [0])


def test_good_data_passes_every_check(tmp_path):
    rows = pq.read_metadata(_raw(tmp_path / "raw")).num_rows
    dedup.update(tmp_path / "raw", tmp_path / "sessions", DedupConfig())
    for layout in ("raw", "sessions"):
        n = sum(b.size for b in BatchLoader(tmp_path / layout, 16))
        assert n == scan_days(tmp_path / layout, [0]).rows == rows


def test_a_folder_named_like_a_day_that_is_not_one_is_an_error(tmp_path):
    _raw(tmp_path / "raw")
    shutil.copytree(tmp_path / "raw" / "day=0", tmp_path / "raw" / "day=two")
    with pytest.raises(DataError, match=r"day=two: not a day folder"):
        day_files(tmp_path / "raw")
    with pytest.raises(DataError, match=r"day=two: not a day folder"):
        dedup.update(tmp_path / "raw", tmp_path / "sessions", DedupConfig())
    assert not (tmp_path / "sessions").exists()


def test_a_day_folder_or_a_file_given_for_the_dataset_is_said_so(tmp_path):
    """The ops probe: `--data raw/day=0` said to move its Parquet file out of the dataset,
    `--data FILE` that the folder does not exist. Red without the two checks."""
    _raw(tmp_path / "raw")
    with pytest.raises(DataError, match=r"raw/day=0: a day's folder, not a dataset: give "
                                        r"the folder that holds it, \S+/raw$"):
        day_files(tmp_path / "raw" / "day=0")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(DataError, match=r"notes.txt: a file, not a dataset folder"):
        day_files(tmp_path / "notes.txt")
    with pytest.raises(DataError, match=r"nowhere: dataset folder does not exist"):
        day_files(tmp_path / "nowhere")


def test_a_run_checks_every_value_of_files_lrm_did_not_write_before_it_starts(tmp_path):
    """A file changed since lrm wrote it (or from elsewhere) is checked whole when a run
    opens its data, wherever the bad value lies: a DataError before a step or a checkpoint,
    even far past where a short run would read. lrm's own unchanged files are not reread."""
    from lrm.config import SplitConfig
    from lrm.train.data import TrainData

    _raw(tmp_path / "raw")
    more = make_impressions(40, seed=6, day=1, first_session=10**6, schema=SCHEMA_V)
    part_path(tmp_path / "raw", 1).parent.mkdir()
    pq.write_table(more, part_path(tmp_path / "raw", 1), row_group_size=ROW_GROUP_ROWS)
    dedup.update(tmp_path / "raw", tmp_path / "sessions", DedupConfig())
    split = SplitConfig(days=[0], eval_day=1)
    TrainData.open(tmp_path / "sessions", split)  # lrm's own files: fine, none reread
    path = day_files(tmp_path / "sessions")[1][0]  # the held-out day, read only at the end
    set_value(path, "d_bid", float("nan"), row=5)
    with pytest.raises(DataError, match=rf"^{path}, field d_bid: row group 0, row 5: nan"):
        TrainData.open(tmp_path / "sessions", split)

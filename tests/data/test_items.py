"""A sessions file's item table (lrm.data.items): an ad's attributes stored once per ad,
read back exactly as they were, by every reader and the loader; damaged tables named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

from lrm import io
from lrm.config import DedupConfig, GenerateConfig
from lrm.data import dedup, items, parquet, synthetic
from lrm.data.loader import BatchLoader
from lrm.data.schema import day_files, synthetic_schema
from lrm.errors import DataError

WORLD = GenerateConfig(users=500, ads=100, advertisers=20, categories=8, days=2,
                       sessions_per_day=600, mean_session_length=6.0, max_history=20, seed=5)
SCHEMA = synthetic_schema()
ATTRIBUTES = {"advertiser_id", "ad_category", "ad_format", "d_ad_age"}  # of an ad, on a day


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """(root, dedup metrics): the same log deduped with item tables ("with") and without
    ("without"), 300 sessions a file (two files a day, each with its own table); the same
    at 25 sessions a file ("small", "small_without": too small for most tables to pay)."""
    root = tmp_path_factory.mktemp("items")
    synthetic.generate(WORLD, root / "raw")
    m = dedup.dedup_dataset(root / "raw", root / "with", DedupConfig(rows_per_file=300))
    dedup.dedup_dataset(root / "raw", root / "without",
                        DedupConfig(rows_per_file=300, item_table=False))
    for name, on in (("small", True), ("small_without", False)):
        dedup.dedup_dataset(root / "raw", root / name,
                            DedupConfig(rows_per_file=25, item_table=on))
    return root, m


def _pairs(root: Path) -> list[tuple[Path, Path]]:
    a, b = day_files(root / "with"), day_files(root / "without")
    assert a.keys() == b.keys()
    return [(x, y) for d in a for x, y in zip(a[d], b[d], strict=True)]


def test_ad_attributes_are_stored_once_per_ad_and_read_back_as_they_were(sets):
    root, m = sets
    # per file: what is a function of the ad there (the bid carries per-impression noise)
    pairs, seen = _pairs(root), set()
    assert len(pairs) == 4
    for with_, without in pairs:
        moved = set(items.moved(pq.ParquetFile(with_), with_))
        stored = pq.read_table(with_)  # the file as pyarrow sees it: the key, not those
        assert moved <= ATTRIBUTES and "ad_id" in stored.column_names
        assert not moved & set(stored.column_names)
        seen |= moved
        assert parquet.read_table(with_).equals(parquet.read_table(without),
                                                check_metadata=True)
        cols = ["d_ad_age", "label", "advertiser_id"]  # moved columns without their key
        assert parquet.read_table(with_, cols).equals(parquet.read_table(without, cols))
        batches = [pa.Table.from_batches(list(parquet.iter_batches(f, 37, cols)))
                   for f in (with_, without)]
        assert batches[0].equals(batches[1]) and batches[0].column_names == cols
    assert seen == set(m["item_columns"]) == ATTRIBUTES
    assert io.dir_bytes(root / "with") < io.dir_bytes(root / "without")


def test_an_item_table_is_kept_only_where_it_saves_bytes(sets):
    """Files of 25 sessions: a table and its schema often outweigh the columns they
    replace; those files keep their columns, and no file grows."""
    root, _ = sets
    files = [f for fs in day_files(root / "small").values() for f in fs]
    assert len(files) == 48
    for f in files:
        twin = root / "small_without" / f.relative_to(root / "small")
        assert f.stat().st_size <= twin.stat().st_size, f
        assert parquet.read_table(f).equals(parquet.read_table(twin))


@pytest.mark.parametrize("recd", [True, False])
def test_the_loader_gives_the_same_batches_either_way(sets, recd):
    root, _ = sets
    ld = [BatchLoader(root / name, 64, dedup=recd, num_workers=2)
          for name in ("with", "without")]
    n = 0
    for x, y in zip(*ld, strict=True):
        for side in ("item", "user"):
            a, b = getattr(x, side), getattr(y, side)
            assert a.keys() == b.keys()
            assert torch.equal(a.values(), b.values()) and torch.equal(a.lengths(), b.lengths())
        assert torch.equal(x.dense, y.dense) and torch.equal(x.labels, y.labels)
        n += 1
    assert n > 10


def _with_one_value(table: pa.Table, column: str, at: int, value) -> pa.Table:  # noqa: ANN001
    """`table` with impression `at` of a per-impression list column set to `value`."""
    col = table.column(column).combine_chunks()
    flat = pc.list_flatten(col).to_numpy(zero_copy_only=False).copy()
    flat[at] = value
    new = pa.ListArray.from_arrays(col.offsets, pa.array(flat), type=col.type)
    return table.set_column(table.schema.get_field_index(column), column, new)


def test_a_column_that_varies_for_one_item_stays_per_impression(sets):
    """Exact: one ad's advertiser changed on one impression, or its age moved by one ulp,
    keeps that column per impression; the others still move."""
    root, _ = sets
    t = parquet.read_table(_pairs(root)[0][1])
    def opts(schema: pa.Schema) -> dict:
        return parquet.write_options(schema, "sessions")

    ads = pc.list_flatten(t.column("ad_id")).to_numpy()
    _, first, counts = np.unique(ads, return_index=True, return_counts=True)
    at = int(first[np.flatnonzero(counts > 1)[0]])  # an ad shown more than once
    _, kv = items.split(t, "ad_id", SCHEMA.item_sparse + SCHEMA.dense, opts)
    assert kv  # as written: every attribute moves
    adv = int(pc.list_flatten(t.column("advertiser_id"))[at].as_py())
    age = np.float32(pc.list_flatten(t.column("d_ad_age"))[at].as_py())
    for column, value in (("advertiser_id", adv + 1),
                          ("d_ad_age", np.nextafter(age, np.float32(np.inf)))):
        changed = _with_one_value(t, column, at, value)
        out, kv = items.split(changed, "ad_id", SCHEMA.item_sparse + SCHEMA.dense, opts)
        assert column in out.column_names, column
        assert set(changed.column_names) - set(out.column_names) == ATTRIBUTES - {column}
        assert items.ItemTable(kv, "x").columns == tuple(
            c for c in SCHEMA.item_sparse + SCHEMA.dense if c in ATTRIBUTES - {column})


def _rewrite(src: Path, dst: Path, table_bytes: bytes) -> Path:
    """`src` as stored, its item table replaced by `table_bytes`."""
    kv = items.file_metadata(pq.ParquetFile(src))
    dst.parent.mkdir(parents=True)
    io.write_parquet(pq.read_table(src), dst, file_metadata={**kv, items.TABLE_KEY: table_bytes})
    return dst


@pytest.fixture(params=["lookup", "search"])
def finder(request, monkeypatch):
    """How a read finds an ad's row: a lookup array (dense keys, as ad ids are) or a
    binary search (the keys forced sparse)."""
    if request.param == "search":
        monkeypatch.setattr(items, "LUT_MIN", 0)
        monkeypatch.setattr(items, "LUT_PER_KEY", 0)
    return request.param


def test_either_finder_reads_back_the_same_rows(sets, finder):
    root, _ = sets
    for with_, without in _pairs(root):
        it = items.of(pq.ParquetFile(with_), with_)
        assert it is not None and (it._lut is not None) == (finder == "lookup")
        assert parquet.read_table(with_).equals(parquet.read_table(without))


def test_a_damaged_item_table_names_the_file(sets, tmp_path, finder):
    root, _ = sets
    src = _pairs(root)[0][0]
    bad = _rewrite(src, tmp_path / "garbage" / "day=0" / src.name, b"not parquet")
    for read in (lambda: parquet.read_table(bad),  # a read, and the loader's first look
                 lambda: BatchLoader(tmp_path / "garbage", 64)):
        with pytest.raises(DataError) as e:
            read()
        assert e.value.file == bad and "item table" in e.value.message

    kv = items.file_metadata(pq.ParquetFile(src))
    table = pq.read_table(pa.BufferReader(kv[items.TABLE_KEY]))
    buf = pa.BufferOutputStream()
    pq.write_table(table.slice(1), buf)  # the first ad gone
    short = _rewrite(src, tmp_path / "short" / "day=0" / src.name, buf.getvalue().to_pybytes())
    with pytest.raises(DataError) as e:
        list(BatchLoader(tmp_path / "short", 64))
    assert e.value.file == short and e.value.field == "ad_id"
    assert "not in the file's item table" in e.value.message


def test_a_slice_of_what_was_read_is_restored_as_the_slice_of_the_whole(sets):
    """A batch sliced before its columns are put back (its lists then start mid-buffer)."""
    root, _ = sets
    f = _pairs(root)[0][0]
    pf = pq.ParquetFile(f)
    it = items.of(pf, f)
    assert it is not None
    rb = next(pf.iter_batches(batch_size=100))
    part = it.restore(rb.slice(7, 30), None)
    assert part.equals(it.restore(rb, None).slice(7, 30))
    assert part.column_names == parquet.read_table(f).column_names

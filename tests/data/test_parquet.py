"""lrm.data.parquet: streaming by row group, and damaged files named in one line by every
reader (schema, loader and its threads, dedup, the serving example).

`corrupt` and `tiny_world` are shared with tests/stages/test_bad_parquet.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import traceback
from itertools import accumulate
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lrm.config import DedupConfig, GenerateConfig
from lrm.data import dedup, parquet, synthetic
from lrm.data.loader import BatchLoader
from lrm.data.schema import LABEL, day_files, read_schema
from lrm.errors import DataError

WORLD = GenerateConfig(users=500, ads=100, advertisers=20, categories=8, days=2,
                       sessions_per_day=600, mean_session_length=6.0, max_history=20, seed=3)
ROW_GROUP = {"raw": 900, "sessions": 150}  # rows per row group: 4-5 groups a file
NOT_PARQUET = ("truncated", "empty", "text")  # fail when the footer is read
MODES = ("flipped", *NOT_PARQUET)  # flipped: a row group's data, found when decoded
FLIP_BYTES = 4096


def tiny_world(root: Path) -> dict[str, Path]:
    """{"raw", "sessions"}: 2 days of synthetic data, one file a day, small row groups."""
    synthetic.generate(WORLD, root / "gen")
    dedup.dedup_dataset(root / "gen", root / "dedup", DedupConfig())
    out = {}
    for name, src in (("raw", root / "gen"), ("sessions", root / "dedup")):
        for fs in day_files(src).values():
            for f in fs:
                dst = root / name / f.relative_to(src)
                dst.parent.mkdir(parents=True, exist_ok=True)
                pq.write_table(parquet.read_table(f), dst, row_group_size=ROW_GROUP[name],
                               compression="zstd")
        out[name] = root / name
    shutil.rmtree(root / "gen")
    shutil.rmtree(root / "dedup")
    return out


def _chunk_span(c: pq.ColumnChunkMetaData) -> tuple[int, int]:
    start = c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset
    return start, start + c.total_compressed_size


def flip(path: Path, row_group: int = 1, column: str = LABEL) -> None:
    """Invert FLIP_BYTES bytes from the start of `column`'s data in `row_group` (its first
    page header, then its data), kept inside that row group: the footer is intact, so the
    file opens and fails when the row group is decoded. (A flip inside the data alone can
    go unseen: zstd stores incompressible floats as raw blocks, and these pages carry no
    checksum.)"""
    rg = pq.read_metadata(path).row_group(row_group)
    chunks = [rg.column(i) for i in range(rg.num_columns)]
    spans = [_chunk_span(c) for c in chunks]
    lo, hi = min(s for s, _ in spans), max(e for _, e in spans)
    assert hi - lo >= FLIP_BYTES, f"row group {row_group} is too small to flip {FLIP_BYTES} B"
    start = next(s for c, (s, _) in zip(chunks, spans, strict=True)
                 if c.path_in_schema.split(".")[0] == column)
    a = min(start, hi - FLIP_BYTES)  # the column's first page header is always flipped
    data = bytearray(path.read_bytes())
    data[a:a + FLIP_BYTES] = bytes(b ^ 0xFF for b in data[a:a + FLIP_BYTES])
    path.write_bytes(bytes(data))


def corrupt(path: Path, mode: str, *, row_group: int = 1, column: str = LABEL) -> None:
    """Damage one Parquet file in place, one of MODES."""
    if mode == "flipped":
        flip(path, row_group, column)
    elif mode == "truncated":
        path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
    elif mode == "empty":
        path.write_bytes(b"")
    elif mode == "text":  # e.g. a CSV renamed .parquet
        path.write_text("session_id,label\n1,0\n2,1\n")
    else:
        raise ValueError(mode)


def assert_names(err: DataError, path: Path, mode: str, row_group: int = 1) -> None:
    """One line naming `path`, and the row group when the data (not the footer) is bad."""
    msg = str(err)
    assert Path(err.file) == path and msg.startswith(f"{path}: "), msg
    assert "\n" not in msg, msg
    if mode == "flipped":
        assert f"row group {row_group}: " in msg and "truncated or corrupt" in msg, msg
    else:
        assert "not a readable Parquet file" in msg and "row group" not in msg, msg


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return tiny_world(tmp_path_factory.mktemp("parquet-world"))


def _copy(world: dict[str, Path], layout: str, dst: Path) -> tuple[Path, Path]:
    """A copy of a layout and its day-1 file (the one to damage)."""
    root = Path(shutil.copytree(world[layout], dst / layout))
    return root, day_files(root)[1][0]


# --------------------------------------------------------------------- the helpers


def test_iter_batches_streams_every_row_group_in_order(world):
    f = day_files(world["sessions"])[0][0]
    md = pq.read_metadata(f)
    assert md.num_row_groups >= 3
    cols = ["session_id", LABEL]
    batches = list(parquet.iter_batches(f, 64, cols))
    assert all(0 < len(b) <= 64 and b.schema.names == cols for b in batches)
    assert pa.Table.from_batches(batches).equals(pq.read_table(f, columns=cols))
    # no batch spans two row groups: every row group boundary is a batch boundary
    ends = set(accumulate(len(b) for b in batches))
    assert set(accumulate(md.row_group(k).num_rows for k in range(md.num_row_groups))) <= ends


def test_read_table_reads_the_whole_file(world):
    f = day_files(world["raw"])[1][0]
    cols = [LABEL, "ad_id"]
    assert parquet.read_table(f, cols).equals(pq.read_table(f, columns=cols))
    assert parquet.read_table(f).equals(pq.read_table(f))
    assert parquet.read_metadata(f).num_rows == pq.read_metadata(f).num_rows


@pytest.mark.parametrize("mode", NOT_PARQUET)
@pytest.mark.parametrize("read", ["open_file", "read_metadata", "iter_batches", "read_table",
                                  "read_schema"])
def test_a_file_that_is_not_parquet_is_named(world, tmp_path, mode, read):
    _, f = _copy(world, "sessions", tmp_path)
    corrupt(f, mode)
    calls = {"open_file": lambda: parquet.open_file(f),
             "read_metadata": lambda: parquet.read_metadata(f),
             "iter_batches": lambda: list(parquet.iter_batches(f, 100)),
             "read_table": lambda: parquet.read_table(f, [LABEL]),
             "read_schema": lambda: read_schema(f)}
    with pytest.raises(DataError) as e:
        calls[read]()
    assert_names(e.value, f, mode)


def test_a_damaged_row_group_is_named_after_the_good_ones(world, tmp_path):
    _, f = _copy(world, "sessions", tmp_path)
    corrupt(f, "flipped", row_group=2)
    good = pq.read_metadata(f).row_group(0).num_rows + pq.read_metadata(f).row_group(1).num_rows
    got = 0
    with pytest.raises(DataError) as e:
        for b in parquet.iter_batches(f, 64, [LABEL]):
            got += len(b)
    assert got == good  # row groups 0 and 1 streamed before the error
    assert_names(e.value, f, "flipped", row_group=2)
    with pytest.raises(DataError) as e:
        parquet.read_table(f, [LABEL])
    assert_names(e.value, f, "flipped", row_group=2)


def test_a_missing_file_is_named(tmp_path):
    f = tmp_path / "nope.parquet"
    with pytest.raises(DataError, match=r"nope\.parquet: cannot open: .*No such file"):
        parquet.open_file(f)


# --------------------------------------------------------------------- the readers


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("workers", [0, 1], ids=["inline", "threads"])
@pytest.mark.parametrize("layout", ["sessions", "raw"])
def test_loader_names_the_damaged_file(world, tmp_path, mode, workers, layout):
    """From the background threads too: the consumer gets the DataError the reader raised.

    d_bid is read only while streaming (the sessions layout's row count reads the labels
    up front), so the flipped case fails inside the loader's planning thread."""
    root, f = _copy(world, layout, tmp_path)
    corrupt(f, mode, column="d_bid")
    with pytest.raises(DataError) as e:
        ld = BatchLoader(root, 128, num_workers=workers, prefetch=2)
        for _ in ld:
            pass
    assert_names(e.value, f, mode)
    if mode == "flipped" and workers:
        frames = [fr.name for fr in traceback.extract_tb(e.value.__traceback__)]
        assert "produce" in frames  # raised in the planning thread, re-raised here


@pytest.mark.parametrize("mode", MODES)
def test_loader_row_count_names_the_damaged_file(world, tmp_path, mode):
    root, f = _copy(world, "sessions", tmp_path)
    corrupt(f, mode)  # the labels: read by num_rows in the sessions layout
    with pytest.raises(DataError) as e:
        BatchLoader(root, 128, days=[1]).num_rows()
    assert_names(e.value, f, mode)


@pytest.mark.parametrize("mode", MODES)
def test_dedup_names_the_damaged_file(world, tmp_path, mode):
    root, f = _copy(world, "raw", tmp_path)
    corrupt(f, mode, column="user_history")
    with pytest.raises(DataError) as e:
        dedup.dedup_dataset(root, tmp_path / "out", DedupConfig())
    assert_names(e.value, f, mode)


@pytest.mark.parametrize("mode", MODES)
def test_example_frame_names_the_damaged_file(world, tmp_path, mode):
    from lrm.serving.pyfunc import example_frame

    root, f = _copy(world, "sessions", tmp_path)
    corrupt(f, mode, row_group=0)  # the example is the first rows
    with pytest.raises(DataError) as e:
        example_frame(root, 1)
    assert_names(e.value, f, mode, row_group=0)


def test_example_frame_reads_past_small_row_groups(world, tmp_path):
    from lrm.serving.pyfunc import example_frame

    root, f = _copy(world, "raw", tmp_path)
    pq.write_table(pq.read_table(f), f, row_group_size=2)  # fewer rows a group than asked
    assert len(example_frame(root, 1, rows=5)) == 5


@pytest.mark.parametrize("chosen, first", [(None, "lrm.data.parquet"), (None, "pyarrow"),
                                           ("jemalloc", "lrm.data.parquet")])
def test_arrow_buffers_come_from_the_system_allocator_unless_the_user_chose(chosen, first):
    """A process that reads through lrm allocates Arrow's buffers with malloc (mimalloc's
    resident memory grew with the length of a streamed day: parquet.ARROW_POOL): Arrow's
    C++ default pool, chosen from the environment when pyarrow is imported after lrm, and
    pyarrow's, even where pyarrow came first; a pool the user chose stays."""
    env = {k: v for k, v in os.environ.items() if k != parquet.ARROW_POOL}
    if chosen:
        env[parquet.ARROW_POOL] = chosen
    code = (f"import {first}, lrm.data.parquet, os, pyarrow as pa; "
            f"print(pa.default_memory_pool().backend_name, os.environ.get('{parquet.ARROW_POOL}'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == [chosen or "system"] * 2

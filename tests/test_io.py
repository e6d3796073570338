"""Atomic outputs: a failed write leaves the destination exactly as it was."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lrm import io


def test_atomic_dir_replaces_on_success(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with io.atomic_dir(out) as tmp:
        assert tmp != out and tmp.parent == out.parent
        (tmp / "new.txt").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temp or backup left


@pytest.mark.parametrize("existed", [False, True])
def test_atomic_dir_leaves_out_untouched_on_error(tmp_path, existed):
    out = tmp_path / "out"
    if existed:
        out.mkdir()
        (out / "keep.txt").write_text("keep")
    with pytest.raises(RuntimeError), io.atomic_dir(out) as tmp:
        (tmp / "half.txt").write_text("half")
        raise RuntimeError("boom")
    if existed:
        assert [p.name for p in out.iterdir()] == ["keep.txt"]
    else:
        assert not out.exists()
    assert len(list(tmp_path.iterdir())) == int(existed)


def test_write_parquet_roundtrip_and_no_temp_left(tmp_path):
    t = pa.table({"a": [1, 2, 3]})
    path = tmp_path / "d" / "x.parquet"
    n = io.write_parquet(t, path)
    assert n == path.stat().st_size > 0
    assert pq.read_table(path).equals(t)
    assert [p.name for p in path.parent.iterdir()] == ["x.parquet"]


def test_write_parquet_failure_keeps_previous_file(tmp_path):
    path = tmp_path / "x.parquet"
    io.write_parquet(pa.table({"a": [1]}), path)
    with pytest.raises(Exception):
        io.write_parquet(pa.table({"a": [1]}), path, compression="no-such-codec")
    assert pq.read_table(path).column("a").to_pylist() == [1]
    assert [p.name for p in tmp_path.iterdir()] == ["x.parquet"]


def test_write_json(tmp_path):
    io.write_json({"b": 1, "a": 2}, tmp_path / "m" / "x.json")
    assert json.loads((tmp_path / "m" / "x.json").read_text()) == {"a": 2, "b": 1}

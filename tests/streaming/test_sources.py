"""The stream's sources: the synthetic world's days, and files dropped in an inbox (Parquet
with the lrm schema, Criteo TSV), each the next day, by content; one schema per stream."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from lrm.config import GenerateConfig, IngestConfig
from lrm.data import synthetic
from lrm.data.schema import DAY, read_schema
from lrm.errors import DataError
from lrm.streaming import sources
from tests.data.test_criteo import random_lines

WORLD = GenerateConfig(users=500, ads=100, advertisers=10, categories=4, sessions_per_day=20,
                       max_history=5)


def test_synthetic_days_are_made_once_and_the_same_every_time(tmp_path):
    a = sources.synthetic_day(WORLD, 4, tmp_path / "a")
    b = sources.synthetic_day(WORLD, 4, tmp_path / "b")
    assert a["files"] == b["files"] and a["origin"] == {"source": "synthetic", "seed": 0}
    mtime = (tmp_path / "a" / "day=4" / "part-00000.parquet").stat().st_mtime_ns
    assert sources.synthetic_day(WORLD, 4, tmp_path / "a") == a  # read back, not made again
    assert (tmp_path / "a" / "day=4" / "part-00000.parquet").stat().st_mtime_ns == mtime
    assert sources.raw_days(tmp_path / "a") == [4]


def test_inbox_files_become_days_by_content_and_keep_one_schema(tmp_path):
    inbox, raw = tmp_path / "inbox", tmp_path / "raw"
    inbox.mkdir()
    (inbox / "a.tsv").write_text("\n".join(random_lines(30)) + "\n")
    (inbox / "b.tsv").write_text("\n".join(random_lines(20, seed=1)) + "\n")
    assert sources.folder_days(inbox, raw, IngestConfig()) == [0, 1]
    t = pq.read_table(raw / "day=1" / "part-00000.parquet")
    assert t.num_rows == 20 and set(t.column(DAY).to_pylist()) == {1}  # renumbered
    assert read_schema(raw / "day=1" / "part-00000.parquet")[0].name == "criteo"
    assert sources.read_source(raw, 1)["origin"]["file"] == "b.tsv"
    (inbox / "c-same-as-a.tsv").write_bytes((inbox / "a.tsv").read_bytes())
    assert sources.folder_days(inbox, raw, IngestConfig()) == []  # the same content: no day
    pq.write_table(synthetic.generate_day(WORLD, 0), inbox / "d.parquet")
    with pytest.raises(DataError, match="d.parquet: its features differ"):
        sources.folder_days(inbox, raw, IngestConfig())
    assert sources.raw_days(raw) == [0, 1]  # nothing half-written

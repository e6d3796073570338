"""Criteo TSV ingest: parsing, the DLRM transform, days, bad rows, chunking, the real sample."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

from lrm.config import IngestConfig
from lrm.data import criteo
from lrm.data.schema import CRITEO_CAT, CRITEO_INT, criteo_schema, day_files
from lrm.errors import ConfigError, DataError

INTS = [str(i) for i in range(13)]
CATS = [f"{i:08x}" for i in range(26)]


def line(label: str = "0", ints: dict[int, str] | None = None,
         cats: dict[int, str] | None = None) -> str:
    """One 40-field row; `ints`/`cats` override I<k>/C<k> (1-based like Criteo's names)."""
    i = list(INTS)
    c = list(CATS)
    for k, v in (ints or {}).items():
        i[k - 1] = v
    for k, v in (cats or {}).items():
        c[k - 1] = v
    return "\t".join([label, *i, *c])


def random_lines(n: int, seed: int = 0) -> list[str]:
    """Valid rows in the Criteo format with missing values and negatives."""
    rng = np.random.default_rng(seed)
    labels = rng.random(n) < 0.25
    ints = rng.integers(-3, 5000, size=(n, 13))
    int_missing = rng.random((n, 13)) < 0.3
    cats = rng.integers(0, 2**32, size=(n, 26))
    cat_missing = rng.random((n, 26)) < 0.2
    out = []
    for r in range(n):
        i = ["" if int_missing[r, k] else str(ints[r, k]) for k in range(13)]
        c = ["" if cat_missing[r, k] else f"{cats[r, k]:08x}" for k in range(26)]
        out.append("\t".join([str(int(labels[r])), *i, *c]))
    return out


def write(path: Path, lines: list[str], end: str = "\n") -> Path:
    path.write_text("".join(f"{x}{end}" for x in lines))
    return path


def read(out: Path) -> pl.DataFrame:
    files = [f for fs in day_files(out).values() for f in fs]
    return pl.concat([pl.read_parquet(f) for f in files]).sort("session_id")


def test_parses_values_nulls_and_dlrm_transform(tmp_path):
    rows = [
        line("1", ints={1: "5", 2: "-3", 3: ""}, cats={1: "68fd1e64", 2: "", 26: "FFFFFFFF"}),
        line("0", ints={13: "0"}, cats={3: "00000000"}),
    ]
    f = write(tmp_path / "a.tsv", rows)
    m = criteo.ingest([f], tmp_path / "out", IngestConfig())

    assert m["rows"] == 2 and m["bad_rows"] == 0 and m["files"] == 1 and m["days"] == 1
    assert m["ctr"] == 0.5 and m["bytes"] > 0
    part = tmp_path / "out" / "day=0" / "part-00000.parquet"
    assert pq.read_schema(part) == criteo_schema().arrow("impressions")
    assert pq.read_schema(part).metadata == criteo_schema().arrow("impressions").metadata

    df = read(tmp_path / "out")
    assert df["day"].to_list() == [0, 0]
    assert df["session_id"].to_list() == [0, 1]
    assert df["position"].to_list() == [0, 0]
    assert df["label"].to_list() == [1, 0]
    r0, r1 = df.row(0, named=True), df.row(1, named=True)
    assert r0["C1"] == 0x68FD1E64 and r0["C2"] is None and r0["C26"] == 0xFFFFFFFF
    assert r1["C3"] == 0 and r1["C2"] == 1  # CATS: C<k> = k - 1
    # log(1 + max(x, 0)) as float32; missing -> 0
    assert r0["I1"] == pytest.approx(math.log1p(5), rel=1e-6)
    assert r0["I2"] == 0.0  # negative
    assert r0["I3"] == 0.0  # missing
    assert r0["I13"] == pytest.approx(math.log1p(12), rel=1e-6)
    assert r1["I13"] == 0.0
    assert df.schema["I1"] == pl.Float32 and df.schema["C1"] == pl.Int64


def test_a_day_per_file_or_one_day(tmp_path):
    a = write(tmp_path / "a.tsv", random_lines(5, seed=1))
    b = write(tmp_path / "b.tsv", random_lines(7, seed=2))
    m = criteo.ingest([a, b], tmp_path / "by_file", IngestConfig(chunk_rows=3))
    df = read(tmp_path / "by_file")
    assert m["days"] == 2 and df["day"].to_list() == [0] * 5 + [1] * 7
    assert df["session_id"].to_list() == list(range(12))

    m = criteo.ingest([a, b], tmp_path / "one", IngestConfig(days="one", chunk_rows=3))
    df = read(tmp_path / "one")
    assert m["days"] == 1 and df["day"].to_list() == [0] * 12
    assert df["session_id"].to_list() == list(range(12))
    assert list(day_files(tmp_path / "one")) == [0]  # every part of both files in day 0
    assert len(day_files(tmp_path / "one")[0]) == 2 + 3  # chunks of 3: 2 parts + 3 parts
    with pytest.raises(ConfigError, match="days"):
        IngestConfig(days="rows")


def test_crlf_line_endings_and_missing_final_newline(tmp_path):
    rows = random_lines(3, seed=3)
    unix = write(tmp_path / "unix.tsv", rows)
    dos = write(tmp_path / "dos.tsv", rows, end="\r\n")
    (tmp_path / "nonl.tsv").write_text("\n".join(rows))
    ref = (criteo.ingest([unix], tmp_path / "o1", IngestConfig()), read(tmp_path / "o1"))
    for i, f in enumerate([dos, tmp_path / "nonl.tsv"]):
        criteo.ingest([f], tmp_path / f"o{i + 2}", IngestConfig())
        assert read(tmp_path / f"o{i + 2}").equals(ref[1])


@pytest.mark.parametrize("rows", [50, 70])  # the empty lines a chunk of their own, or not
@pytest.mark.parametrize("end", ["\n\n", "\r\n\r\n", "\n\n\n\n"])
def test_empty_lines_that_end_a_file_are_no_rows(tmp_path, rows, end):
    """A file whose last line ends twice was refused ('line 101, field fields: expected 40
    tab-separated fields, got 1'), and --skip-bad counted the empty line as a bad row."""
    lines = random_lines(rows, seed=4)
    ref = write(tmp_path / "ref.tsv", lines)
    criteo.ingest([ref], tmp_path / "ref", IngestConfig(chunk_rows=50))
    f = tmp_path / "a.tsv"
    f.write_bytes(ref.read_bytes().rstrip(b"\n") + end.encode())
    for skip_bad in (False, True):
        out = tmp_path / f"out{skip_bad}"
        m = criteo.ingest([f], out, IngestConfig(chunk_rows=50, skip_bad=skip_bad))
        assert (m["rows"], m["bad_rows"]) == (rows, 0)
        assert read(out).equals(read(tmp_path / "ref"))


@pytest.mark.parametrize("at", [49, 50])  # a chunk's last line, or the next one's first
def test_an_empty_line_that_more_lines_follow_is_a_bad_row(tmp_path, at):
    """(Where a chunk ends with it, too: the chunk's empty lines wait for the next.)"""
    lines = random_lines(100, seed=4)
    f = tmp_path / "a.tsv"
    f.write_text("".join(x + "\n" for x in lines[:at]) + "\n"
                 + "".join(x + "\n" for x in lines[at:]))
    with pytest.raises(DataError) as e:
        criteo.ingest([f], tmp_path / "out", IngestConfig(chunk_rows=50))
    assert (e.value.line, e.value.field) == (at + 1, "fields"), str(e.value)


def test_a_bzip2_file_says_so_and_zstd_reads(tmp_path):
    """A bzip2 file was refused as polars' 'CSV file contained column names not specified in
    schema (n_extra = 4)'; polars' line scan reads zstd as it reads gzip."""
    import bz2

    import pyarrow as pa

    plain = write(tmp_path / "plain.tsv", random_lines(20, seed=6))
    criteo.ingest([plain], tmp_path / "ref", IngestConfig())
    f = tmp_path / "day.tsv"
    f.write_bytes(bz2.compress(plain.read_bytes()))
    with pytest.raises(DataError) as e:
        criteo.ingest([f], tmp_path / "out", IngestConfig())
    assert e.value.file == f and "bzip2-compressed: lrm reads gzip and zstd only; " \
        "decompress it (bunzip2)" in str(e.value), str(e.value)
    f.write_bytes(pa.compress(plain.read_bytes(), codec="zstd", asbytes=True))
    criteo.ingest([f], tmp_path / "zstd", IngestConfig())
    assert read(tmp_path / "zstd").equals(read(tmp_path / "ref"))


HEADER = "\t".join(["label", *(f"I{k}" for k in range(1, 14)), *(f"C{k}" for k in range(1, 27))])


@pytest.mark.parametrize(("first", "field", "words"), [
    (HEADER, "label", "got 'label' (a header line? Criteo's TSV has none: remove it)"),
    ("", "fields", "expected 40 tab-separated fields, got 1 (an empty line)"),
    (line("2"), "label", "got '2'"),  # (a bad row, not a header)
])
def test_a_header_or_an_empty_line_is_named_as_one(tmp_path, first, field, words):
    """Both were only their first bad field: "label must be 0 or 1, got 'label'", "expected
    40 tab-separated fields, got 1"."""
    f = write(tmp_path / "a.tsv", [first, *random_lines(3)])
    with pytest.raises(DataError) as e:
        criteo.ingest([f], tmp_path / "out", IngestConfig())
    assert (e.value.line, e.value.field) == (1, field), str(e.value)
    assert str(e.value).endswith(words), str(e.value)


BAD = {
    "fewer_fields": ("\t".join(line().split("\t")[:39]), "fields",
                     "expected 40 tab-separated fields, got 39"),
    "more_fields": (line() + "\t0", "fields", "expected 40 tab-separated fields, got 41"),
    "blank_line": ("", "fields", "got 1"),
    "non_integer": (line(ints={5: "abc"}), "I5", "not an integer: 'abc'"),
    "float_integer": (line(ints={1: "1.5"}), "I1", "not an integer"),
    "bad_hex": (line(cats={3: "12345g78"}), "C3", "not an 8-hex-digit hash: '12345g78'"),
    "prefixed_hex": (line(cats={4: "0x123456"}), "C4", "not an 8-hex-digit hash"),
    "negative_hex": (line(cats={5: "-1234567"}), "C5", "not an 8-hex-digit hash"),
    "spaced_hex": (line(cats={6: " 1234567"}), "C6", "not an 8-hex-digit hash"),
    "long_hex": (line(cats={8: "123456789"}), "C8", "not an 8-hex-digit hash"),
    "short_hex": (line(cats={7: "1234567"}), "C7", "not an 8-hex-digit hash"),
    "signed_hex": (line(cats={26: "+1234567"}), "C26", "not an 8-hex-digit hash"),
    "label_2": (line("2"), "label", "label must be 0 or 1, got '2'"),
    "label_empty": (line(""), "label", "label must be 0 or 1"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_first_bad_row_raises_with_file_line_field(tmp_path, case):
    bad, field, message = BAD[case]
    # good, good, BAD (line 3), good, another bad (line 5): the first one is reported
    f = write(tmp_path / "in.tsv", [line(), line("1"), bad, line(), line(ints={2: "x"})])
    with pytest.raises(DataError) as e:
        criteo.ingest([f], tmp_path / "out", IngestConfig())
    assert (e.value.file, e.value.line, e.value.field) == (f, 3, field)
    assert message in e.value.message
    assert str(e.value).startswith(f"{f}, line 3, field {field}: ")


def test_first_failing_field_of_a_row_is_reported(tmp_path):
    f = write(tmp_path / "in.tsv", [line("7", ints={4: "z"}, cats={1: "q"})])
    with pytest.raises(DataError) as e:
        criteo.ingest([f], tmp_path / "out", IngestConfig())
    assert e.value.field == "label"


@pytest.mark.parametrize("skip_bad", [False, True])
def test_empty_or_missing_file_is_always_an_error(tmp_path, skip_bad):
    good = write(tmp_path / "good.tsv", [line()])
    empty = tmp_path / "empty.tsv"
    empty.write_text("")
    cfg = IngestConfig(skip_bad=skip_bad)
    with pytest.raises(DataError, match="empty") as e:
        criteo.ingest([good, empty], tmp_path / "o1", cfg)
    assert e.value.file == empty
    with pytest.raises(DataError, match="not found") as e:
        criteo.ingest([good, tmp_path / "nope.tsv"], tmp_path / "o2", cfg)
    assert e.value.file == tmp_path / "nope.tsv"
    # checked before anything is read or written
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_binary_bytes(tmp_path):
    nul = tmp_path / "nul.tsv"
    nul.write_bytes(line().encode() + b"\n0\t1\x00\n")
    with pytest.raises(DataError, match="NUL") as e:
        criteo.ingest([nul], tmp_path / "o1", IngestConfig(skip_bad=True))
    assert e.value.file == nul
    latin = tmp_path / "latin.tsv"  # not UTF-8: replaced, then the field fails its check
    latin.write_bytes(line().encode() + b"\n" + line(ints={2: "\xe9"}).encode("latin-1") + b"\n")
    with pytest.raises(DataError) as e:
        criteo.ingest([latin], tmp_path / "o2", IngestConfig())
    assert (e.value.line, e.value.field) == (2, "I2")


def test_skip_bad_skips_and_counts_per_reason(tmp_path):
    rows = [line("1"), BAD["fewer_fields"][0], BAD["more_fields"][0], line(),
            BAD["label_2"][0], BAD["non_integer"][0], BAD["bad_hex"][0], BAD["short_hex"][0],
            line("1")]
    a = write(tmp_path / "a.tsv", rows)
    b = write(tmp_path / "b.tsv", ["", line()])  # (an empty line that ends a file: no row)
    m = criteo.ingest([a, b], tmp_path / "out", IngestConfig(skip_bad=True))
    assert m["rows"] == 4 and m["bad_rows"] == 7
    assert m["bad_by_reason"] == {"field_count": 3, "label": 1, "not_integer": 1,
                                  "not_hex_hash": 2}
    assert m["ctr"] == 0.5
    df = read(tmp_path / "out")
    assert df["session_id"].to_list() == [0, 3, 8, 10]  # line numbers (from 0) across files
    assert df["day"].to_list() == [0, 0, 0, 1]
    assert df["label"].to_list() == [1, 0, 1, 0]


def test_skip_bad_with_no_good_row_is_an_error(tmp_path):
    f = write(tmp_path / "a.tsv", [line("3"), ""])
    with pytest.raises(DataError, match="no valid rows"):
        criteo.ingest([f], tmp_path / "out", IngestConfig(skip_bad=True))


def test_chunked_stream_equals_one_chunk(tmp_path):
    rows = random_lines(1000, seed=4)
    a = write(tmp_path / "a.tsv", rows[:700])
    b = write(tmp_path / "b.tsv", rows[700:])
    for days in ("file", "one"):
        one = criteo.ingest([a, b], tmp_path / f"one{days}",
                            IngestConfig(chunk_rows=10**6, days=days))
        many = criteo.ingest([a, b], tmp_path / f"many{days}",
                             IngestConfig(chunk_rows=64, days=days))
        assert {k: v for k, v in one.items() if k != "bytes"} == {
            k: v for k, v in many.items() if k != "bytes"}
        assert read(tmp_path / f"many{days}").equals(read(tmp_path / f"one{days}"))
        # chunks went to separate parts, each within the bound
        parts = [f for fs in day_files(tmp_path / f"many{days}").values() for f in fs]
        assert len(parts) >= 1000 // 64
        assert max(pq.read_metadata(p).num_rows for p in parts) <= 64


def test_line_numbers_hold_across_chunks(tmp_path):
    rows = random_lines(300, seed=5)
    rows[276] = line(cats={9: "zzzzzzzz"})
    f = write(tmp_path / "a.tsv", rows)
    with pytest.raises(DataError) as e:
        criteo.ingest([f], tmp_path / "out", IngestConfig(chunk_rows=50))
    assert (e.value.line, e.value.field) == (277, "C9")


def test_real_sample(tmp_path, criteo_dir):
    files = [criteo_dir / f"{n}.tsv" for n in ("train", "dev", "test")]
    m = criteo.ingest(files, tmp_path / "out", IngestConfig())
    assert m["rows"] == 8000 and m["bad_rows"] == 0 and m["days"] == 3 and m["files"] == 3
    assert m["ctr"] == pytest.approx(0.216, abs=1e-3)
    df = read(tmp_path / "out")
    assert df.group_by("day").len().sort("day")["len"].to_list() == [7200, 409, 391]
    # the first row of train.tsv: 0 1 1 5 0 1382 4 15 2 181 1 2 _ 2 68fd1e64 80e26c9b ...
    first = df.row(0, named=True)
    assert first["label"] == 0 and first["C1"] == 0x68FD1E64 and first["C2"] == 0x80E26C9B
    assert first["I5"] == pytest.approx(math.log1p(1382), rel=1e-6) and first["I12"] == 0.0
    assert first["C22"] is None
    # known missing-value profile of the sample (SOURCE.md): C22 is missing in ~82% of rows
    assert 0.75 < df["C22"].null_count() / df.height < 0.9
    assert set(df.columns) >= set(CRITEO_INT) | set(CRITEO_CAT)

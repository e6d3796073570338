"""Bad input logs: each bad value is one DataError naming the file, the row and the column,
raised before anything is written; and each format reads the same.

Planted bugs that turn these red (each tried): the missing-id check dropped, the finite
check of dense values dropped, the label check accepting 2, the
missing-column check dropped, a time that does not parse read as null.
"""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest

from lrm.data.logs.culprits import RowError
from lrm.errors import DataError
from tests.data._logs import T0, frame, run, write

BASE = dict(label="clicked", user="user", item="item", time="ts", dense=["price"],
            categorical=["cat"], session_gap="30m")


def _log(n: int = 6, **bad: object) -> list[dict]:
    rows = [{"user": f"u{i % 2}", "ts": T0 + 60 * i, "item": f"i{i}", "clicked": i % 2,
             "price": float(i), "cat": "c"} for i in range(n)]
    rows[3] = {**rows[3], **bad}  # the 4th data row
    return rows


CASES = {  # case -> (the bad row's values, the column named, words of the message)
    "label_2": ({"clicked": 2}, "clicked", "0 or 1"),
    "label_text": ({"clicked": "yes"}, "clicked", "0 or 1"),
    "empty_item": ({"item": ""}, "item", "missing id"),
    "time_text": ({"ts": "yesterday"}, "ts", "does not parse"),
    "time_in_ns": ({"ts": T0 * 10**9}, "ts", "as a number of s"),  # past int64 in us
    "dense_text": ({"price": "cheap"}, "price", "not a finite number"),
    "dense_inf": ({"price": "inf"}, "price", "not a finite"),
    "dense_nan": ({"price": "NaN"}, "price", "not a finite"),
    "missing_user": ({"user": None}, "user", "missing"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("suffix", [".csv", ".tsv.gz"])
def test_a_bad_text_value_names_file_row_and_column(tmp_path, case, suffix):
    values, column, words = CASES[case]
    rows = [{k: (None if v is None else str(v)) for k, v in r.items()} for r in _log(**values)]
    f = write(frame(rows), tmp_path / f"log{suffix}")
    with pytest.raises(RowError) as e:
        run([f], tmp_path / "out", **BASE)
    assert (e.value.file, e.value.line, e.value.field) == (f, 4, column), str(e.value)
    assert words in str(e.value) and str(e.value).startswith(f"{f}, row 4, column {column}: ")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


TYPED = {  # typed files: the wrong type, missing ids, non-finite floats
    "missing_id_int": (pl.Series("user", [1, 2, 3, None, 5, 6]), "user", "missing id"),
    "label_int_2": (pl.Series("clicked", [0, 1, 0, 2, 1, 0]), "clicked", "0 or 1"),
    "time_in_ns": (pl.Series("ts", [T0 + i if i != 3 else T0 * 10**9 for i in range(6)]), "ts",
                   "does not parse as a number of s"),
    "dense_inf": (pl.Series("price", [0.0, 1.0, 2.0, float("inf"), 4.0, 5.0]), "price",
                  "not finite"),
    "dense_nan": (pl.Series("price", [0.0, 1.0, 2.0, float("nan"), 4.0, 5.0]), "price",
                  "not finite"),
    "empty_id": (pl.Series("item", ["i0", "i1", "i2", "", "i4", "i5"]), "item", "missing"),
}


@pytest.mark.parametrize("case,suffix", [(c, ".parquet") for c in sorted(TYPED)] + [
    (c, ".jsonl") for c in sorted(TYPED) if not c.startswith("dense")])  # JSON: no NaN, inf
def test_a_bad_typed_value_names_file_row_and_column(tmp_path, case, suffix):
    series, column, words = TYPED[case]
    f = write(frame(_log()).with_columns(series), tmp_path / f"log{suffix}")
    with pytest.raises(RowError) as e:
        run([f], tmp_path / "out", **BASE)
    assert (e.value.line, e.value.field) == (4, column) and words in str(e.value), str(e.value)


def test_a_column_of_the_wrong_type_and_a_missing_column(tmp_path):
    df = frame(_log()).with_columns(pl.col("user").str.len_bytes().cast(pl.Float64))
    f = write(df, tmp_path / "float_user.parquet")
    with pytest.raises(RowError) as e:
        run([f], tmp_path / "o1", **BASE)
    assert (e.value.line, e.value.field) == (1, "user"), str(e.value)  # its first value
    assert "ids (text or integers)" in str(e.value) and "Float64: 2.0" in str(e.value)
    f = write(frame(_log()).drop("price"), tmp_path / "no_price.csv")
    with pytest.raises(RowError) as e:
        run([f], tmp_path / "o2", **BASE)
    assert e.value.field == "price" and "column missing" in str(e.value)
    assert "user, ts, item, clicked, cat" in str(e.value)  # what the file has



JSON_LINES = {  # case -> (the 4th row's bad values, the column named, words of the message)
    "list_for_number": ({"price": [3.0]}, "price", "a list ([3.0]) where"),
    "text_for_time": ({"ts": "noon"}, "ts", "noon"),  # (typed as text: does not parse)
    "object_for_label": ({"clicked": {"n": 1}}, "clicked", "an object"),
    "broken_line": (None, None, "not a JSON line"),
}


@pytest.mark.parametrize("at", [4, 1500])  # in the first block read, or a later one
@pytest.mark.parametrize("infer_rows", [10_000, 2])  # among the rows polars types the
@pytest.mark.parametrize("case", sorted(JSON_LINES))  # columns by, or after them
def test_a_json_line_of_another_kind_names_its_row_and_column(tmp_path, monkeypatch, case,
                                                              infer_rows, at):
    """polars' JSON reader fails a block without saying where: the row and column are found.
    Planted bugs that turn this red (each tried): blank lines counted as rows; the block's
    first row not passed on; the inferred schema's types not checked."""
    from lrm.data.logs import files

    monkeypatch.setattr(files, "JSON_INFER_ROWS", infer_rows)
    bad, column, words = JSON_LINES[case]
    rows = _log(2000)  # ~200 kB: blocks of 64 kB, then of `chunk_rows` rows
    rows[at - 1] = {**rows[at - 1], **(bad or {})}
    lines = [json.dumps(r) for r in rows]
    if bad is None:
        lines[at - 1] = lines[at - 1][:-1] + ",}"
    lines.insert(1, "")  # a blank line is not a row
    f = tmp_path / "log.jsonl"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(RowError) as e:
        run([f], tmp_path / "out", chunk_rows=200, **BASE)
    assert (e.value.file, e.value.line, e.value.field) == (f, at, column), str(e.value)
    assert words in str(e.value), str(e.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize("at", [4, 4000])  # in the first block read, or a later one
@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_a_row_with_more_fields_than_the_header_names_its_row(tmp_path, suffix, at):
    """polars' CSV reader fails a block with a long row without saying which. Planted bugs
    that turn this red (each tried): the block's first row not passed on; quotes ignored (a
    quoted separator counted as a field)."""
    sep = "\t" if suffix == ".tsv" else ","
    rows = _log(6000)  # ~170 kB: blocks of 64 kB, then of `chunk_rows` rows
    if suffix == ".csv":  # a quoted separator and newline earlier: one field, one row
        rows[1] = {**rows[1], "cat": "a,\nb"}
    lines = write(frame(rows), tmp_path / f"ok{suffix}").read_text().splitlines(True)
    k = at + (1 if suffix == ".csv" else 0)  # the physical line of data row `at`
    lines[k] = lines[k].rstrip("\n") + f"{sep}extra\n"
    f = tmp_path / f"log{suffix}"
    f.write_text("".join(lines))
    with pytest.raises(RowError) as e:
        run([f], tmp_path / "out", chunk_rows=200, **BASE)
    assert (e.value.file, e.value.line, e.value.field) == (f, at, None), str(e.value)
    assert "7 fields where the header has 6" in str(e.value), str(e.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())

@pytest.mark.parametrize("unit", ["iso", "format"])
def test_a_text_time_that_does_not_parse(tmp_path, unit):
    times = ["2019-11-09T10:00:00Z", "2019-11-09 10:01:00", "2019-11-09T10:02:00+01:00",
             "Nov 9", "2019-11-09", "2019-11-09T10:05"]
    if unit == "format":
        times = ["11/9/2019 10:00:00 AM", "11/9/2019 10:01:00 AM", "11/9/2019 1:02:00 PM",
                 "2019-11-09 10:03:00", "11/9/2019 10:04:00 AM", "11/9/2019 10:05:00 AM"]
    mapping = {**BASE, **({"time_unit": "iso"} if unit == "iso" else
                          {"time_format": "%m/%d/%Y %I:%M:%S %p"})}
    df = frame(_log()).with_columns(pl.Series("ts", times))
    with pytest.raises(RowError) as e:
        run([write(df, tmp_path / "log.csv")], tmp_path / "o1", **mapping)
    assert (e.value.line, e.value.field) == (4, "ts") and "does not parse" in str(e.value)
    good = df.with_columns(pl.Series("ts", times[:3] + times[4:5] * 3))
    _, rows = run([write(good, tmp_path / "ok.csv")], tmp_path / "o2", **mapping)
    assert len(rows) == 6


def test_every_file_is_checked_before_any_is_read(tmp_path, monkeypatch):
    from lrm.data.logs import blocks

    good = write(frame(_log()), tmp_path / "a.csv")
    bad = write(frame(_log()).drop("cat"), tmp_path / "b.csv")
    chunks = []
    monkeypatch.setattr(blocks, "chunks", lambda *a, **k: chunks.append(a) or iter(()))
    with pytest.raises(DataError) as e:
        run([good, bad], tmp_path / "out", **BASE)
    assert e.value.file == bad and e.value.field == "cat" and chunks == []


def test_every_format_reads_the_same_rows(tmp_path):
    df = frame(_log(12))
    ref = None
    for suffix in (".parquet", ".csv", ".tsv", ".jsonl", ".csv.gz", ".jsonl.gz"):
        m, rows = run([write(df, tmp_path / f"log{suffix}")], tmp_path / f"out{suffix}",
                      **BASE)
        ref = ref if ref is not None else rows
        assert rows.equals(ref), suffix
        assert m["rows"] == 12 and m["vocab"]["item"] == 12


def test_a_headerless_tsv_takes_its_column_names_from_the_mapping(tmp_path):
    df = frame(_log())
    f = tmp_path / "log.tsv"
    f.write_text(df.write_csv(separator="\t", include_header=False))
    _, rows = run([f], tmp_path / "out", columns=df.columns, **BASE)
    _, ref = run([write(df, tmp_path / "ref.tsv")], tmp_path / "ref", **BASE)
    assert rows.equals(ref)


def test_chunks_are_bounded_and_a_quoted_newline_never_splits_a_row(tmp_path):
    """Planted bugs that turn this red (each tried): a block cut inside a quoted field;
    the first block not cut to the chunk's rows."""
    from lrm.config import LogsConfig
    from lrm.data.logs import blocks, files

    rows = _log(4000)  # ~240 kB: blocks of 64 kB, then of ~3 rows
    for r in rows:  # quoted fields across line breaks: block ends fall inside some
        r["cat"] = f'two\nlines, "{r["item"]}"'
    f = write(frame(rows), tmp_path / "log.csv")
    cfg = LogsConfig(**BASE)
    src = files.sources([f], "auto")[0]
    types = blocks.check_columns(src, blocks.scan(src, cfg), cfg)
    got = list(blocks.chunks(src, types, cfg, 3))
    assert max(c.height for c in got) <= 3 and sum(c.height for c in got) == 4000
    whole = pl.concat(got)
    assert whole["_row"].to_list() == list(range(1, 4001))
    assert whole["cat"].to_list() == [r["cat"] for r in rows]


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
@pytest.mark.parametrize("column", ["clicked", "user", "item", "ts"])
def test_an_all_null_column_is_a_missing_value_at_its_first_row(tmp_path, column, suffix):
    """A column with no value at all has the null type (Parquet's, JSON's), which no role's
    check read: labels became 0, ids null, a time crashed the day cut."""
    df = frame(_log()).with_columns(pl.lit(None).alias(column))
    f = write(df, tmp_path / f"log{suffix}")
    with pytest.raises(RowError) as e:
        run([f], tmp_path / "out", **BASE)
    assert (e.value.file, e.value.line, e.value.field) == (f, 1, column), str(e.value)
    assert "missing" in str(e.value), str(e.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    if column == "clicked":  # where a missing value is no error, an all-null column is none
        opt = df.with_columns(pl.lit(1).alias("clicked"), pl.lit(None).alias("price"),
                              pl.lit(None).alias("cat"), pl.lit(None).alias("seq"))
        _, rows = run([write(opt, tmp_path / f"opt{suffix}")], tmp_path / "o2",
                      sequence=["seq"], **BASE)
        assert rows.height == 6 and rows["seq"].to_list() == [[]] * 6


@pytest.mark.parametrize("at", [4, 1500])  # in the first block read, or a later one
@pytest.mark.parametrize("case", ["list_after_text", "text_after_list", "object_for_id"])
def test_a_list_or_object_in_a_json_text_column_names_its_line(tmp_path, case, at):
    """polars reads a list or an object in a column of text as its JSON text (the list's
    fragments became ids), without a word."""
    rows = [{**r, "seq": "x y"} for r in _log(2000)]
    if case == "object_for_id":
        bad, column, words = {"user": {"id": 1}}, "user", 'an object ({"id": 1})'
    else:
        bad, column, words = {"seq": ["x", "z"]}, "seq", 'a list (["x", "z"])'
    if case == "text_after_list":  # the list first: the rows before it hold none
        rows = [{**r, "seq": None} for r in rows[:at - 1]] + rows[at - 1:]
    rows[at - 1] = {**rows[at - 1], **bad}
    f = tmp_path / "log.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(RowError) as e:
        run([f], tmp_path / "out", chunk_rows=200, sequence=["seq"], **BASE)
    assert (e.value.file, e.value.line, e.value.field) == (f, at, column), str(e.value)
    assert words in str(e.value) and "column of text" in str(e.value), str(e.value)


@pytest.mark.parametrize("case", ["dense", "label", "json_user", "label_sep"])
def test_a_message_with_braces_in_it_is_still_the_error(tmp_path, case):
    """A struct's type text (Struct({'id': Int64})), or a separator "{", went into a message
    template whose .format read its braces: a KeyError, exit 1."""
    if case == "label_sep":
        log = frame([{"user": "U1", "shown": "N1{0 N2{1"}, {"user": "U2", "shown": "N1{0 N2"}])
        with pytest.raises(RowError) as e:
            run([write(log, tmp_path / "b.csv")], tmp_path / "out", explode="shown",
                user="user", label_sep="{")
        assert (e.value.line, e.value.field) == (2, "shown") and "ITEM{LABEL" in str(e.value)
        return
    column = {"dense": "price", "label": "clicked", "json_user": "user"}[case]
    df = frame(_log()).with_columns(pl.struct(id=pl.col("ts")).alias(column))
    f = write(df, tmp_path / ("log.jsonl" if case == "json_user" else "log.parquet"))
    with pytest.raises(RowError) as e:
        run([f], tmp_path / "out", **BASE)
    assert (e.value.line, e.value.field) == (1, column), str(e.value)
    assert f"this one holds Struct({{'id': Int64}}): {{'id': {T0}}}" in str(e.value)


@pytest.mark.parametrize("size", [6, 60_000])  # failing polars' read, or a later block's
@pytest.mark.parametrize("suffix", [".csv.gz", ".jsonl.gz"])
@pytest.mark.parametrize("case", ["truncated", "not_gzip", "corrupt"])
def test_a_broken_gzip_names_the_file(tmp_path, case, suffix, size):
    """Python's gzip raised EOFError (click: a bare "Aborted.", exit 1) on a truncated
    file, BadGzipFile (a traceback) on text named .gz."""
    text = write(frame(_log(size)), tmp_path / f"log{suffix[:-3]}").read_bytes()
    data = gzip.compress(text)
    data = {"truncated": data[:len(data) // 2], "not_gzip": text,
            "corrupt": data[:20] + bytes(b ^ 0x55 for b in data[20:-20]) + data[-20:]}[case]
    f = tmp_path / f"bad{suffix}"
    f.write_bytes(data)
    with pytest.raises(DataError) as e:
        run([f], tmp_path / "out", chunk_rows=5_000, **BASE)
    words = "truncated gzip" if case == "truncated" else "not a valid gzip file"
    assert e.value.file == f and words in str(e.value), str(e.value)


def test_an_empty_item_in_a_page_view_is_a_missing_id(tmp_path):
    """ "-1" (MIND: item, "-", label) became an impression of the item ""."""
    log = frame([{"user": "U1", "shown": "N1-0 N2-1"}, {"user": "U2", "shown": "N1-0 -1"}])
    with pytest.raises(RowError) as e:
        run([write(log, tmp_path / "b.tsv")], tmp_path / "out", explode="shown",
            item="news", user="user")
    assert (e.value.line, e.value.field) == (2, "shown"), str(e.value)
    assert "missing id in '-1'" in str(e.value), str(e.value)


@pytest.mark.parametrize("suffix", [".csv", ".tsv.gz", ".jsonl"])
def test_a_column_named_twice_is_an_error(tmp_path, suffix):
    """polars renames a header's second `clicked` clicked_duplicated_0 (and JSON keeps one
    of a key's two values): the mapping read one of the two silently."""
    df = frame(_log()).with_columns(pl.col("clicked").alias("clicked_duplicated_0"))
    f = write(df, tmp_path / f"ok{suffix}")  # a column may be called that: no error
    run([f], tmp_path / "o1", **BASE)
    text = gzip.decompress(f.read_bytes()) if suffix.endswith(".gz") else f.read_bytes()
    f = tmp_path / f"log{suffix}"
    text = text.replace(b'"clicked_duplicated_0"', b'"clicked"').replace(
        b"clicked_duplicated_0", b"clicked", 1)
    f.write_bytes(gzip.compress(text) if suffix.endswith(".gz") else text)
    with pytest.raises(DataError) as e:
        run([f], tmp_path / "o2", **BASE)
    assert e.value.file == f and e.value.field == "clicked", str(e.value)
    assert "twice" in str(e.value), str(e.value)


def test_a_float_among_integer_json_ids_names_its_line(tmp_path):
    """One 1.0 among integer ids types the column Float64: the error named row 1 (its 0.0),
    not the line that holds the float."""
    rows = [{**r, "user": i} for i, r in enumerate(_log(12))]
    rows[7]["user"] = 1.0
    f = tmp_path / "log.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(RowError) as e:
        run([f], tmp_path / "out", **BASE)
    assert (e.value.line, e.value.field) == (8, "user"), str(e.value)
    assert "holds Float64: 1.0" in str(e.value), str(e.value)


def test_dictionary_encoded_text_in_parquet_reads_as_its_text(tmp_path):
    """pandas' `category` columns (Arrow's dictionary type, polars' Categorical) were
    refused: 'a user column must hold ids (text or integers), this one holds Categorical'."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    df = frame(_log(12))
    plain = write(df, tmp_path / "plain.parquet")
    table = df.to_arrow()
    for col in ("user", "item", "cat"):
        i = table.schema.get_field_index(col)
        table = table.set_column(i, col, pa.compute.cast(table[col], pa.string())
                                 .dictionary_encode())
    f = tmp_path / "dict.parquet"
    pq.write_table(table, f, row_group_size=5)
    assert pq.read_schema(f).field("user").type == pa.dictionary(pa.int32(), pa.string())
    _, ref = run([plain], tmp_path / "ref", chunk_rows=4, **BASE)
    _, rows = run([f], tmp_path / "out", chunk_rows=4, **BASE)
    assert rows.equals(ref)


@pytest.mark.parametrize("suffix", [".csv", ".tsv.gz"])
@pytest.mark.parametrize("end", ["\n\n", "\r\n\r\n\r\n", "\n\n\n\n"])
def test_empty_lines_that_end_a_text_file_are_no_rows(tmp_path, suffix, end):
    """An export whose last line ends twice was refused: 'row 7: 0 fields where the header
    has 6 (a line cut short?)'."""
    df = frame(_log())
    ref_file = write(df, tmp_path / f"ref{suffix}")
    text = gzip.decompress(ref_file.read_bytes()) if suffix.endswith(".gz") else \
        ref_file.read_bytes()
    text = text.rstrip(b"\n") + end.encode()
    if "\r" in end:
        text = text.replace(b"\n", b"\r\n").replace(b"\r\r\n", b"\r\n")
    f = tmp_path / f"log{suffix}"
    f.write_bytes(gzip.compress(text) if suffix.endswith(".gz") else text)
    _, ref = run([ref_file], tmp_path / "ref", **BASE)
    m, rows = run([f], tmp_path / "out", **BASE)
    assert rows.equals(ref) and m["rows"] == 6


BLOCK_BYTES = 65536  # the first text block's bytes (lrm.data.logs.blocks: then fitted)


@pytest.mark.parametrize("shift", [-1, 0, 1])  # before, at and after a block's first line
def test_an_empty_line_between_rows_names_its_row(tmp_path, shift):
    """An empty line that began a block (and not the file) failed polars' read of the block
    as one column: 'cannot read as csv: provided `new_columns` does not match ...'."""
    head = "user,ts,item,clicked\n"
    lines = [f"u{i % 7:03d},{T0 + i},i{i:05d},{i % 2}\n" for i in range(4000)]
    at = -(-BLOCK_BYTES // len(lines[0])) + shift  # the first block ends at line `at`
    f = tmp_path / "log.csv"
    f.write_text(head + "".join(lines[:at]) + "\n" + "".join(lines[at:]))
    with pytest.raises(RowError) as e:
        run([f], tmp_path / "out", chunk_rows=1000, label="clicked", user="user",
            item="item", time="ts")
    assert e.value.line == at + 1, str(e.value)
    assert "0 fields where the header has 4 (an empty line)" in str(e.value), str(e.value)


@pytest.mark.parametrize("suffix", [".csv", ".tsv.gz"])
def test_a_header_line_among_the_rows_is_named_as_one(tmp_path, suffix):
    """Two exports joined with their headers: the second header line was refused as its
    label, 'got 'clicked' (a count of clicks? ...)'."""
    df = frame(_log())
    a = write(df.head(3), tmp_path / f"a{suffix}").read_bytes()
    b = write(df.tail(3), tmp_path / f"b{suffix}").read_bytes()
    if suffix.endswith(".gz"):
        a, b = gzip.decompress(a), gzip.decompress(b)
    f = tmp_path / f"log{suffix}"
    for second, named in ((b, True), (b.replace(b"clicked", b"Clicked"), False)):
        # (one value that is not its column's name: a row, if a bad one)
        f.write_bytes(gzip.compress(a + second) if suffix.endswith(".gz") else a + second)
        with pytest.raises(RowError) as e:
            run([f], tmp_path / "out", **BASE)
        assert (e.value.file, e.value.line) == (f, 4), str(e.value)
        assert ("the header line again" in str(e.value)) == named, str(e.value)


def _compressed(how: str, data: bytes) -> bytes:
    import bz2
    import io
    import lzma
    import zipfile

    import pyarrow as pa

    if how == "zip":
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("log.csv", data)
        return buf.getvalue()
    return {"bzip2": bz2.compress, "xz": lzma.compress,
            "zstd": lambda d: pa.compress(d, codec="zstd", asbytes=True)}[how](data)


@pytest.mark.parametrize("name", ["log.csv", "log.csv.{suffix}"])
@pytest.mark.parametrize("how", ["bzip2", "xz", "zip", "zstd"])
def test_a_log_in_another_compression_than_gzip_says_which(tmp_path, how, name):
    """A bzip2 log named .csv was refused as 'column missing (... the file has: BZh91AY&SY...)'
    and a zstd one as '1 fields where the header has 6': its bytes read as text."""
    suffix = {"bzip2": "bz2", "zstd": "zst"}.get(how, how)
    f = tmp_path / name.format(suffix=suffix)
    f.write_bytes(_compressed(how, write(frame(_log()), tmp_path / "ref.csv").read_bytes()))
    with pytest.raises(DataError) as e:
        run([f], tmp_path / "out", **BASE)
    assert e.value.file == f and f"{how}-compressed: lrm reads gzip only" in str(e.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("name", "sep", "words"), [
    ("log.csv", "\t", "tabs separate its header, give --format tsv"),
    ("log.tsv", ",", "commas separate its header, give --format csv"),
    ("log.csv", ";", "';' separates its header; lrm reads commas (csv) and tabs (tsv)"),
    ("log.csv", "|", "'|' separates its header"),
])
def test_a_header_of_another_separator_says_which(tmp_path, name, sep, words):
    """A TSV named .csv (or a ';'-separated export) read as one column: only 'column
    missing (... the file has: user;ts;item;...)'."""
    f = tmp_path / name
    f.write_text(frame(_log()).write_csv(separator=sep))
    with pytest.raises(RowError) as e:
        run([f], tmp_path / "out", **BASE)
    assert "column missing" in str(e.value) and words in str(e.value), str(e.value)
    if sep in ",\t":  # and the option it names reads it
        run([f], tmp_path / "ok", format="tsv" if sep == "\t" else "csv", **BASE)


@pytest.mark.parametrize("suffix", [".csv", ".tsv.gz", ".jsonl", ".jsonl.gz"])
def test_a_byte_order_mark_is_no_part_of_the_first_row(tmp_path, suffix):
    """A JSON-lines file from a Windows tool (UTF-8 with a BOM) was refused as 'cannot read
    as jsonl: InternalError(TapeError) at character 0'."""
    rows = _log()
    ref = write(frame(rows), tmp_path / f"ref{suffix}")
    bad_ref = write(frame([{**rows[0], "clicked": 2}, *rows[1:]]), tmp_path / f"bad{suffix}")
    f = tmp_path / f"log{suffix}"
    for g, bad in ((ref, False), (bad_ref, True)):
        data = gzip.decompress(g.read_bytes()) if suffix.endswith(".gz") else g.read_bytes()
        data = b"\xef\xbb\xbf" + data
        f.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
        if bad:  # (its first row's error names that row)
            with pytest.raises(RowError) as e:
                run([f], tmp_path / "bad", **BASE)
            assert (e.value.line, e.value.field) == (1, "clicked"), str(e.value)
            continue
        _, rows = run([f], tmp_path / "out", **BASE)
        _, want = run([ref], tmp_path / "ref", **BASE)
        assert rows.equals(want)


@pytest.mark.parametrize(("case", "words"), [
    ("array", "a JSON array, not JSON lines (one object a line): jq -c '.[]' writes them"),
    ("array_indented", "a JSON array, not JSON lines"),
    ("objects_indented", "an object over several lines, not JSON lines"),
])
def test_json_that_is_not_json_lines_says_what_it_is(tmp_path, case, words):
    """An exported JSON array was refused as 'row 1: not a JSON object: b'[{"user": ...'."""
    rows = _log()
    text = {"array": json.dumps(rows), "array_indented": json.dumps(rows, indent=2),
            "objects_indented": "".join(json.dumps(r, indent=1) + "\n" for r in rows)}[case]
    f = tmp_path / "log.json"
    f.write_text(text)
    with pytest.raises(RowError) as e:
        run([f], tmp_path / "out", **BASE)
    assert e.value.line == 1 and words in str(e.value), str(e.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("ts", "words"), [
    ("2019-11-09T10:00:00+01:00", " (ISO 8601 text: give --time-unit iso)"),
    ("2019-11-09 10:00:00Z", " (ISO 8601 text: give --time-unit iso)"),
    ("11/09/2019 10:00:00 AM",
     " (text: give its --time-format, e.g. '%m/%d/%Y %I:%M:%S %p')"),
    ("NULL", ""),
])
@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_text_time_read_as_a_number_names_the_option_that_reads_it(tmp_path, ts, words,
                                                                    suffix):
    """ISO times with the default --time-unit s said only 'time does not parse as a number
    of s since 1970 (UTC): '2019-11-09T10:00:00+01:00''."""
    rows = [{**r, "ts": str(r["ts"])} for r in _log()]
    rows[3]["ts"] = ts
    with pytest.raises(RowError) as e:
        run([write(frame(rows), tmp_path / f"log{suffix}")], tmp_path / "out", **BASE)
    assert (e.value.line, e.value.field) == (4, "ts"), str(e.value)
    assert str(e.value).endswith(f"since 1970 (UTC): {ts!r}{words}"), str(e.value)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_blanks_around_a_text_label_are_no_part_of_it(tmp_path, suffix):
    """`1, 0` (a blank after the separator) read the time and dense values (blanks are
    stripped there) but refused the label: "label must be 0 or 1 ..., got ' 1'"."""
    rows = [{**r, "clicked": str(r["clicked"])} for r in _log()]
    _, ref = run([write(frame(rows), tmp_path / f"ref{suffix}")], tmp_path / "ref", **BASE)
    blank = [{**r, "clicked": f" {r['clicked']}" if i % 2 else f"{r['clicked']} "}
             for i, r in enumerate(rows)]
    blank[1]["clicked"] = " true "  # (and a boolean's text, as with the others)
    blank[4]["clicked"] = "\tFALSE"
    _, got = run([write(frame(blank), tmp_path / f"log{suffix}")], tmp_path / "out", **BASE)
    assert got.equals(ref)
    blank[3]["clicked"] = " 2"
    with pytest.raises(RowError) as e:
        run([write(frame(blank), tmp_path / f"bad{suffix}")], tmp_path / "bad", **BASE)
    assert (e.value.line, e.value.field) == (4, "clicked") and "got ' 2'" in str(e.value)


def test_a_header_name_with_blanks_around_it_is_shown_so(tmp_path):
    """`user, ts, item` names the columns ' ts', ' item': 'column missing (... the file has:
    user,  ts,  item, ...)' hid the blanks in its own separators."""
    f = tmp_path / "log.csv"
    f.write_text(frame(_log()).write_csv(separator=",").replace(",", ", "))
    with pytest.raises(RowError) as e:
        run([f], tmp_path / "out", **BASE)
    col = e.value.field
    assert col in BASE.values() and col != "user", str(e.value)  # (user: its name as is)
    assert f"the file has: user, ' ts', ' item'" in str(e.value), str(e.value)
    assert str(e.value).endswith(f"the file's is ' {col}', with blanks"), str(e.value)


def test_iso_times_with_their_zone_as_exports_write_it(tmp_path):
    """BigQuery writes a TIMESTAMP to CSV as '2019-11-09 10:00:00 UTC': refused as 'time
    does not parse'. Each zone's time reads as its UTC instant."""
    from datetime import datetime, timedelta, timezone

    rows = _log()
    utc = [datetime.fromtimestamp(r["ts"], timezone.utc) for r in rows]
    forms = [lambda t: t.strftime("%Y-%m-%d %H:%M:%S UTC"),
             lambda t: t.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
             lambda t: t.astimezone(timezone(timedelta(hours=1))).isoformat(),
             lambda t: t.strftime("%Y-%m-%d %H:%M:%S GMT"),
             lambda t: t.astimezone(timezone(timedelta(hours=-5))).strftime(
                 "%Y-%m-%dT%H:%M:%S%z"),
             lambda t: t.strftime("%Y-%m-%dT%H:%M:%SZ")]
    text = [{**r, "ts": forms[i](t)} for i, (r, t) in enumerate(zip(rows, utc))]
    _, want = run([write(frame(rows), tmp_path / "ref.csv")], tmp_path / "ref", **BASE)
    _, got = run([write(frame(text), tmp_path / "log.csv")], tmp_path / "out",
                 **{**BASE, "time_unit": "iso"})
    assert got.equals(want)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be"])
@pytest.mark.parametrize("suffix", [".tsv", ".csv.gz", ".jsonl"])
def test_utf16_text_says_so(tmp_path, encoding, suffix):
    """Excel's "Unicode text" (UTF-16 with its BOM) was read as UTF-8: 'column missing (...
    the file has: \\ufffd\\ufffdu s e r ...)'."""
    text = write(frame(_log()), tmp_path / f"ref{suffix.removesuffix('.gz')}").read_text()
    data = text.encode(encoding)
    if encoding == "utf-16-be":
        data = b"\xfe\xff" + data
    f = tmp_path / f"log{suffix}"
    f.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    with pytest.raises(DataError) as e:
        run([f], tmp_path / "out", **BASE)
    assert e.value.file == f and "UTF-16 text, and lrm reads UTF-8: convert it (iconv -f " \
        "UTF-16 -t UTF-8)" in str(e.value), str(e.value)


@pytest.mark.parametrize("suffix", [".csv", ".tsv.gz"])
def test_bytes_that_are_not_utf8_are_said_with_their_row(tmp_path, suffix, caplog):
    """A cp1252 export (Excel's CSV on Windows) made 'Müller' and 'Möller' one user, each
    'M\\ufffdller', without a word."""
    rows = _log()
    rows[2]["user"], rows[4]["user"] = "Müller", "Möller"
    ref = write(frame(rows), tmp_path / f"ref{suffix}")
    text = gzip.decompress(ref.read_bytes()) if suffix.endswith(".gz") else ref.read_bytes()
    data = text.decode().encode("cp1252")
    f = tmp_path / f"log{suffix}"
    f.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    with caplog.at_level("WARNING", logger="lrm"):
        run([ref], tmp_path / "ref", **BASE)
    assert "not UTF-8" not in caplog.text
    with caplog.at_level("WARNING", logger="lrm"):
        m, _ = run([f], tmp_path / "out", **BASE)
    assert f"{f}, row 3: bytes that are not UTF-8" in caplog.text, caplog.text
    assert "iconv -f cp1252 -t utf-8" in caplog.text and caplog.text.count("not UTF-8") == 1
    assert m["rows"] == 6

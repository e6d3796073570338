"""A hostile probe of `lrm ingest logs` (and `ingest criteo`), as a user runs it: each bad
input exits 2 with one line naming the file (and the row and column where there is one),
never a traceback, and leaves no --out; what is not bad (files in subfolders, a field of
megabytes) goes in. In-process through the stage's typer app (the command, the stage and
its atomic output folder), a small file each.

Planted bugs that turn these red (each tried): the content check of the inputs dropped
(a copy, a gzip copy read twice); the repeat check of the cells dropped (an overlapping
export, a repeated page view); the field count of a block not checked (without quotes, and
with); a folder's subfolders not walked; the check of times before 1970 dropped; numbers in
a JSON text id column not looked for; the block size uncapped (MemoryError); the file's
first bytes not read (a Parquet file named .csv); `estimate_rows` without its fallback
(polars' ComputeError); criteo's reader not asking gzip why a .gz ended (OSError).
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from flows.cli import app as lrm_app
from stages import ingest
from stagekit.cli import app
from tests.data._logs import T0, write

FLAGS = ["--label", "clicked", "--user", "user", "--item", "item", "--time", "ts",
         "--session-gap", "30m", "--categorical", "cat"]
MIND = ["--format", "tsv", "--columns", "pv,user,time,history,impressions", "--user", "user",
        "--time", "time", "--time-format", "%m/%d/%Y %I:%M:%S %p", "--session", "pv",
        "--explode", "impressions", "--item", "news", "--history", "history"]
PAGE = "p1\tU1\t11/9/2019 10:00:00 AM\tN9 N8\tN3-0 N1-1"


def _log(n: int = 300) -> pl.DataFrame:
    return pl.DataFrame([{"user": f"u{i % 7}", "ts": T0 + 37 * i, "item": f"i{i % 11}",
                          "clicked": int(i % 3 == 0), "cat": f"c{i % 4}"} for i in range(n)])


def _copy(d: Path) -> tuple[list[str], str]:
    a = write(_log(), d / "a.csv")
    shutil.copy(a, d / "b.csv")
    return [str(a), str(d / "b.csv"), *FLAGS], f"{d / 'b.csv'}: the same content as {a}"


def _gzip_copy(d: Path) -> tuple[list[str], str]:
    a = write(_log(), d / "a.csv")
    (d / "a.csv.gz").write_bytes(gzip.compress(a.read_bytes()))
    return [str(a), str(d / "a.csv.gz"), *FLAGS], f"{d / 'a.csv.gz'}: the same content as {a}"


def _overlap(d: Path) -> tuple[list[str], str]:
    a = write(_log(), d / "a.csv")
    b = write(_log().slice(200), d / "b.csv")  # the next export starts 100 rows early
    return [str(a), str(b), *FLAGS], f"{b}, row 1: the same impression as {a}, row 201"


def _page_twice(d: Path) -> tuple[list[str], str]:
    f = d / "behaviors.tsv"
    f.write_text(f"{PAGE}\np2\tU2\t11/9/2019 11:00:00 AM\t\tN1-0 N2-1\n{PAGE}\n")
    return [str(f), *MIND], f"{f}, row 3: the same impression as {f}, row 1"


def _cut_short(d: Path, quoted: bool) -> tuple[list[str], str]:
    df = _log()
    if quoted:  # a quote in the block: the reader's quoted path
        df = df.with_columns(pl.col("item").str.replace("i1", 'i"1'))
    text = df.write_csv().rstrip("\n")
    f = d / "cut.csv"
    f.write_text(text[:text.rindex(",")] + "\n")  # the last line loses its last field
    return [str(f), *FLAGS], f"{f}, row 300: 4 fields where the header has 5"


def _negative_time(d: Path) -> tuple[list[str], str]:
    f = write(_log().with_columns(
        pl.when(pl.int_range(pl.len()) == 5).then(-3600).otherwise(pl.col("ts")).alias("ts")),
        d / "neg.csv")
    return [str(f), *FLAGS], f"{f}, row 6, column ts: time before 1970"


def _number_in_text_id(d: Path) -> tuple[list[str], str]:
    rows = _log(20).to_dicts()
    rows[7]["user"] = 123
    f = d / "log.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [str(f), *FLAGS], f"{f}, row 8, column user: a number (123)"


def _parquet_named_csv(d: Path) -> tuple[list[str], str]:
    f = d / "log.csv"
    _log().write_parquet(f)
    return [str(f), *FLAGS], f"{f}: a Parquet file, read as csv"


def _headerless_extra_field(d: Path) -> tuple[list[str], str]:
    f = d / "behaviors.tsv"
    f.write_text(f"{PAGE}\np2\tU2\t11/9/2019 11:00:00 AM\t\tN1-0 N2-1\textra\n")
    return [str(f), *MIND], f"{f}, row 2: 6 fields where --columns has 5"


CASES = {
    "a copy": _copy, "a gzip copy": _gzip_copy, "an overlapping export": _overlap,
    "a repeated page view": _page_twice,
    "a line cut short": lambda d: _cut_short(d, quoted=False),
    "a quoted line cut short": lambda d: _cut_short(d, quoted=True),
    "a time before 1970": _negative_time, "a number in a JSON text id": _number_in_text_id,
    "Parquet named .csv": _parquet_named_csv,
    "a headerless TSV row with an extra field": _headerless_extra_field,
}


def _run(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(lrm_app, ["ingest", "logs", *args])
    return r.exit_code, r.stderr


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_exit_2_and_no_out(tmp_path, case):
    args, said = CASES[case](tmp_path)
    rc, err = _run(*args, "--out", str(tmp_path / "out"))
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith(f"error: {said}"), err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_files_in_subfolders_of_a_folder_are_read(tmp_path):
    """A folder an export writes a subfolder a day into is taken whole (not its top level
    only, without a word), in order."""
    log = _log()
    for k, (sub, rows) in enumerate([("day1", log.head(100)), ("day2", log.slice(100, 50)),
                                     (".hidden", log.slice(150))]):
        (tmp_path / "in" / sub).mkdir(parents=True)
        write(rows, tmp_path / "in" / sub / f"part{k}.csv")
    write(log.slice(150, 10), tmp_path / "in" / "top.csv")
    rc, err = _run(str(tmp_path / "in"), *FLAGS, "--out", str(tmp_path / "out"),
                   "--metrics", str(tmp_path / "m.json"))
    assert rc == 0, err
    m = json.loads((tmp_path / "m.json").read_text())
    assert (m["rows"], m["files"]) == (160, 3)  # day1/, day2/ and top.csv; .hidden/ is not


def test_a_spark_output_folder_is_read_without_its_work_files(tmp_path, caplog):
    """A folder as Spark writes it (`df.write.csv(DIR)`): its part files are the log; its
    `_SUCCESS` marker and a task's attempt left in `_temporary/` (here cut mid-line, as a
    killed task leaves it) are not, and the attempt not read is said. Red with names that
    start with _ walked like any other (the attempt's rows read: a bad row, or the rows
    twice)."""
    log = _log()
    (tmp_path / "in" / "_temporary" / "0" / "_temporary" / "attempt_0").mkdir(parents=True)
    write(log.head(150), tmp_path / "in" / "part-00000.csv")
    write(log.slice(150), tmp_path / "in" / "part-00001.csv")
    (tmp_path / "in" / "_SUCCESS").write_bytes(b"")
    attempt = tmp_path / "in" / "_temporary" / "0" / "_temporary" / "attempt_0" / "part-00001.csv"
    text = write(log.slice(150), attempt).read_bytes()
    attempt.write_bytes(text[:len(text) // 2])
    with caplog.at_level("WARNING", logger="lrm"):
        rc, err = _run(str(tmp_path / "in"), *FLAGS, "--out", str(tmp_path / "out"),
                       "--metrics", str(tmp_path / "m.json"))
    assert rc == 0, err
    m = json.loads((tmp_path / "m.json").read_text())
    assert (m["rows"], m["files"]) == (300, 2)
    said = [r.getMessage() for r in caplog.records if "_temporary" in r.getMessage()]
    assert said and "1 file(s) under a name that starts with _ not read" in said[0], said


def test_a_field_of_megabytes_is_read(tmp_path):
    """A 2 MB value (a history export gone long): the next block was sized for a chunk of
    rows like it (~400 GB: MemoryError); it is capped, and the value goes in."""
    log = _log(50).with_columns(pl.when(pl.int_range(pl.len()) == 3).then(pl.lit("x" * 2**21))
                                .otherwise(pl.col("cat")).alias("cat"))
    rc, err = _run(str(write(log, tmp_path / "long.csv")), *FLAGS, "--out",
                   str(tmp_path / "out"), "--metrics", str(tmp_path / "m.json"))
    assert rc == 0, err
    assert json.loads((tmp_path / "m.json").read_text())["vocab"]["cat"] == 5


def test_criteo_on_a_truncated_gz_is_one_line(tmp_path):
    from tests.data.test_criteo import random_lines

    data = gzip.compress(("\n".join(random_lines(2000, seed=1)) + "\n").encode())
    f = tmp_path / "day0.tsv.gz"
    f.write_bytes(data[: len(data) // 2])
    r = CliRunner().invoke(app(ingest.STAGE), ["criteo", str(f), "--out",
                                                str(tmp_path / "out"), "--metrics",
                                                str(tmp_path / "m.json")])
    last = r.stderr.strip().splitlines()[-1]  # (after the progress line)
    assert r.exit_code == 2 and "Traceback" not in r.stderr, r.stderr
    assert last.startswith(f"error: {f}: truncated gzip"), r.stderr
    assert not (tmp_path / "out").exists()


def _ingest_then_hang(args: list[str]) -> None:
    """A child from the fault suite's forkserver (polars hangs in a plain fork of a process
    that has used it): the ingest, in-process; the parent SIGKILLs it mid-way."""
    import os

    CliRunner().invoke(lrm_app, ["ingest", "logs", *args])
    os._exit(0)


def test_a_killed_ingest_leaves_nothing_after_the_rerun(tmp_path):
    """The issue-45 probe: a SIGKILLed `ingest logs` left `.lrm-ingest-spill-*` (22 MB for
    400k rows) and `.out.tmp-*` beside --out, and the rerun took the lock but never removed
    them. The spill now lies inside the output's temporary folder, and a run that takes the
    lock removes the temporary folders of its outputs a killed run left (named so, holding
    lrm's record; lrm.io.remove_leftovers). Red with the stage runner's remove_leftovers
    dropped, or the spill back beside --out. A few seconds once the forkserver is up."""
    import time

    src = write(_log(12_000), tmp_path / "big.csv")
    (tmp_path / "keep.tmp-0123abcd").mkdir()  # not lrm's: a name alike, no record
    (tmp_path / ".out.tmp-0123abcd").mkdir()  # named like lrm's, without its record
    args = [str(src), *FLAGS, "--out", str(tmp_path / "out"), "--ingest.chunk_rows", "1000"]
    from tests.faults.kills import forkserver

    child = forkserver().Process(target=_ingest_then_hang, args=(args,))
    child.start()
    deadline = time.monotonic() + 120
    while child.is_alive() and time.monotonic() < deadline and not any(
            tmp_path.glob(".out.tmp-*/.lrm-ingest-spill-*/*")):
        time.sleep(0.01)
    child.kill()
    child.join()
    assert child.exitcode == -9, "the ingest ended before it was killed: a bigger input"
    decoys = {tmp_path / "keep.tmp-0123abcd", tmp_path / ".out.tmp-0123abcd"}
    killed = set(tmp_path.glob(".out.tmp-*")) - decoys
    assert len(killed) == 1 and list(next(iter(killed)).glob(".lrm-ingest-spill-*/*"))
    rc, err = _run(*args)
    assert rc == 0, err
    assert set(tmp_path.glob(".out.tmp-*")) | set(tmp_path.glob("keep*")) == decoys
    assert not list(tmp_path.rglob(".lrm-ingest-spill-*")) and (tmp_path / "out").is_dir()

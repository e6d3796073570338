"""The stream's ledger: a day's key is its raw content and the params (not paths); a day done
with the same key is found, one done with other params is refused naming them; which days
come next."""

from __future__ import annotations

import dataclasses
import json

import pytest

from lrm.config import ParamsConfig, TrainConfig
from lrm.errors import ConfigError
from lrm.streaming import ledger
from lrm.streaming.layout import StreamPaths


def _raw(paths: StreamPaths, day: int, sha: str) -> None:
    d = paths.raw / f"day={day}"
    d.mkdir(parents=True)
    (d / "_source.json").write_text(json.dumps({"day": day, "files": [
        {"file": "part-00000.parquet", "sha256": sha}]}))


def test_the_key_is_the_content_and_the_params_not_the_paths(tmp_path):
    a, b = StreamPaths(tmp_path / "a"), StreamPaths(tmp_path / "b")
    for p in (a, b):
        _raw(p, 0, "x0")
        _raw(p, 1, "x1")
    params = ledger.digest(ParamsConfig())
    assert ledger.day_key(a, 1, params) == ledger.day_key(b, 1, params)
    (b.raw / "day=0" / "_source.json").write_text(json.dumps({"files": [{"sha256": "y"}]}))
    assert ledger.day_key(a, 1, params) != ledger.day_key(b, 1, params)  # day 0 changed
    other = ledger.digest(dataclasses.replace(ParamsConfig(), train=TrainConfig(lr=0.01)))
    assert ledger.day_key(a, 1, params) != ledger.day_key(a, 1, other)
    # where the stream lives, when it runs and how many days a run takes do not matter
    moved = ParamsConfig()
    moved.streaming = dataclasses.replace(moved.streaming, root="elsewhere", days=5,
                                          cron="0 4 * * *")
    assert ledger.day_key(a, 1, ledger.digest(moved)) == ledger.day_key(a, 1, params)
    with pytest.raises(ConfigError, match="raw day 2 is missing"):
        ledger.day_key(a, 2, params)


def test_a_day_done_is_found_and_one_done_otherwise_is_refused(tmp_path):
    paths = StreamPaths(tmp_path / "s")
    ledger.claim(paths)
    _raw(paths, 0, "x0")
    params = ledger.digest(ParamsConfig())
    key = ledger.day_key(paths, 0, params)
    assert ledger.done(paths, 0, key, params) is None
    ledger.write(paths, 0, {"day": 0, "key": key, "params": params})
    assert ledger.done(paths, 0, key, params)["day"] == 0
    changed = ledger.digest(dataclasses.replace(ParamsConfig(), train=TrainConfig(lr=0.01)))
    before = TrainConfig().lr
    with pytest.raises(ConfigError, match=rf"train\.lr: {before} then, 0\.01 now"):
        ledger.done(paths, 0, ledger.day_key(paths, 0, changed), changed)


def test_next_days(tmp_path):
    paths = StreamPaths(tmp_path / "s")
    ledger.claim(paths)
    assert ledger.next_days(paths, 3, 2, None) == [3, 4]  # synthetic: any day can be had
    for d in (3, 4):
        ledger.write(paths, d, {"day": d})
    assert ledger.next_days(paths, 3, 2, None) == [5, 6]
    assert ledger.next_days(paths, 3, 3, [0, 1, 2, 3, 4, 5, 7]) == [5]  # folder: in a row
    assert ledger.next_days(paths, 3, 1, [0, 1, 2, 3, 4]) == []


def test_a_day_runs_only_after_the_days_before_it(tmp_path):
    """`--day 5` before day 4 trained the champions on day 5, and day 4 was then scored with
    them; `--day 99` generated 95 days and failed in tracebacks. Red with the check gone."""
    paths = StreamPaths(tmp_path / "s")
    ledger.claim(paths)
    ledger.check_in_order(paths, 3, 3)  # the first day
    with pytest.raises(ConfigError, match=r"--day 99: day 3 is not done yet.*run --day 3"):
        ledger.check_in_order(paths, 3, 99)
    for d in (3, 4):
        ledger.write(paths, d, {"day": d})
    for d in (3, 4, 5):  # done days (a no-op, or refused by their key), and the next
        ledger.check_in_order(paths, 3, d)
    with pytest.raises(ConfigError, match="--day 6: day 5 is not done yet"):
        ledger.check_in_order(paths, 3, 6)

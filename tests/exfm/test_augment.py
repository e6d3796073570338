"""The data augmentation system: row-aligned with its input, the teacher's own prediction,
versioned, idempotent per day, atomic, and strict about what it reads."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

from lrm.data.dedup import flatten_sessions
from lrm.data.loader import BatchLoader
from lrm.data.schema import day_files
from lrm.errors import ConfigError, DataError
from lrm.exfm import augment
from lrm.exfm.augment import MANIFEST, META_VERSION, TEACHER_COLUMN, augment_dataset
from lrm.models.saved import load_model, load_weights, model_hash, read_card, save_model
from lrm.train.evaluate import predict
from lrm.data import parquet
from tests.data.test_parquet import assert_names, corrupt
from tests.conftest import other_weights
from tests.exfm.conftest import random_teacher


@pytest.fixture(scope="module")
def teacher(datasets, tmp_path_factory):  # noqa: F811
    return random_teacher(datasets["sessions"], tmp_path_factory.mktemp("teacher") / "t")


def _table(path):
    return parquet.read_table(path)


def _day(files):
    return pa.concat_tables([parquet.read_table(f) for f in files])


def test_output_is_row_aligned_and_holds_the_teachers_prediction(datasets, teacher,  # noqa: F811
                                                                 tmp_path):
    src, dst = datasets["sessions"], tmp_path / "aug"
    m = augment_dataset(teacher, src, dst, days=[1, 2], batch_size=1000)
    assert m["written"] == [1, 2] and m["skipped"] == []
    assert sorted(day_files(dst)) == [1, 2]
    model, card = load_model(teacher)
    for day in (1, 2):
        src_files, dst_files = day_files(src)[day], day_files(dst)[day]
        assert [f.name for f in src_files] == [f.name for f in dst_files]
        for a, b in zip(src_files, dst_files, strict=True):
            ta, tb = _table(a), _table(b)
            # every input column unchanged, same session rows, same order
            assert tb.drop_columns([TEACHER_COLUMN]).equals(ta)
            assert tb.schema.metadata[b"lrm.schema"] == ta.schema.metadata[b"lrm.schema"]
            lens = pc.list_value_length(tb.column("label"))
            assert pc.all(pc.equal(lens, pc.list_value_length(tb.column(TEACHER_COLUMN)))).as_py()
            version = json.loads(tb.schema.metadata[META_VERSION])
            assert version["hash"] == model_hash(teacher)
        # flattened, impression i is the same impression: labels and the teacher's logit
        flat = flatten_sessions(_day(dst_files).drop_columns([TEACHER_COLUMN]))
        orig = flatten_sessions(_day(src_files))
        assert flat.equals(orig)
        logits = pc.list_flatten(_day(dst_files).column(TEACHER_COLUMN)).to_numpy()
        expect, labels = predict(model, BatchLoader(src, 1000, days=[day],
                                                    hash_sizes=card.hash_sizes),
                                 torch.device("cpu"))
        np.testing.assert_allclose(logits, expect.numpy(), rtol=0, atol=1e-6)
        assert np.array_equal(orig.column("label").to_numpy(), labels.numpy().astype(np.int8))
        man = json.loads((dst / f"day={day}" / MANIFEST).read_text())
        assert man["rows"] == len(logits) and man["teacher"]["hash"] == model_hash(teacher)
        assert 0 < man["teacher_metrics"]["ne"] < 10
    # the students' loader reads it
    b = next(iter(BatchLoader(dst, 64, days=[1], teacher_column=TEACHER_COLUMN)))
    assert b.teacher_logits is not None and b.teacher_logits.shape == (64,)


def test_second_run_skips_days_done_by_the_same_teacher(datasets, teacher, tmp_path):  # noqa: F811
    src, dst = datasets["sessions"], tmp_path / "aug"
    first = augment_dataset(teacher, src, dst, days=[2], registry=lambda h: "lrm-teacher/1")
    stamp = {f: f.stat().st_mtime_ns for f in (dst / "day=2").iterdir()}
    again = augment_dataset(teacher, src, dst, days=[2])
    assert again["written"] == [] and again["skipped"] == [2] and again["rows"] == 0
    assert again["teacher_version"]["2"]["hash"] == first["teacher_version"]["2"]["hash"]
    assert first["teacher_version"]["2"]["registry"] == "lrm-teacher/1"
    assert {f: f.stat().st_mtime_ns for f in (dst / "day=2").iterdir()} == stamp
    assert again["teacher"]["2"] == first["teacher"]["2"]  # from the manifest
    # a new day is written, the old one still skipped
    more = augment_dataset(teacher, src, dst, days=[1, 2])
    assert more["written"] == [1] and more["skipped"] == [2]
    # force rewrites
    assert augment_dataset(teacher, src, dst, days=[2], force=True)["written"] == [2]


def test_a_new_schedule_removes_the_days_it_does_not_serve(datasets, teacher,  # noqa: F811
                                                             tmp_path):
    """A foundation model whose schedule changed (exfm.teacher_days 1 -> 2) serves fewer
    days: the old schedule's days would pass for this FM's with the students (their first
    served day is the first augmented one). They go; a folder lrm did not write stays."""
    src, dst = datasets["sessions"], tmp_path / "aug"
    augment_dataset({1: teacher, 2: teacher}, src, dst, prune=True)
    (dst / "day=0").mkdir()  # the user's own folder, unmarked
    (dst / "day=0" / "notes.txt").write_text("mine")
    r = augment_dataset({2: teacher}, src, dst, prune=True)
    assert r["removed"] == [1] and r["skipped"] == [2]
    assert sorted(p.name for p in dst.iterdir() if p.name.startswith("day=")) == \
        ["day=0", "day=2"]
    # one model for the days asked for (the stream's champion): the others' days stay
    augment_dataset(teacher, src, dst, days=[1])
    assert augment_dataset(teacher, src, dst, days=[2])["removed"] == []
    assert (dst / "day=1").is_dir()


def test_another_teacher_or_changed_input_reaugments(datasets, teacher, tmp_path):  # noqa: F811
    src = tmp_path / "src"
    shutil.copytree(datasets["sessions"], src)
    dst = tmp_path / "aug"
    augment_dataset(teacher, src, dst, days=[1, 2])
    other = random_teacher(src, tmp_path / "other", seed=1)
    assert model_hash(other) != model_hash(teacher)
    # the training summary is not part of the version
    same = save_model(tmp_path / "same", dataclasses.replace(
        read_card(teacher), info={"note": "retrained"}), load_weights(teacher))
    assert model_hash(same) == model_hash(teacher)
    assert augment_dataset(same, src, dst, days=[1, 2])["written"] == []
    r = augment_dataset(other, src, dst, days=[1, 2])
    assert r["written"] == [1, 2]
    # a changed input day is redone, the others not
    f = day_files(src)[1][0]
    t = parquet.read_table(f)
    pq.write_table(t.slice(0, t.num_rows - 1).replace_schema_metadata(t.schema.metadata), f)
    r = augment_dataset(other, src, dst, days=[1, 2])
    assert r["written"] == [1] and r["skipped"] == [2]


def test_a_teacher_whose_weights_were_swapped_is_refused(datasets, teacher, tmp_path):  # noqa: F811
    """A teacher folder holding other weights than lrm wrote (copied over) augments nothing:
    its logits would be recorded under its card's version. Red with load_weights' check
    dropped."""
    swapped = Path(shutil.copytree(teacher, tmp_path / "teacher"))
    other_weights(swapped)
    with pytest.raises(DataError, match=r"teacher/state_dict\.pt: changed since lrm wrote it"):
        augment_dataset(swapped, datasets["sessions"], tmp_path / "aug", days=[2])
    assert not (tmp_path / "aug").exists()


def test_failure_midway_leaves_the_previous_day_in_place(datasets, teacher, tmp_path,  # noqa: F811
                                                         monkeypatch):
    src, dst = datasets["sessions"], tmp_path / "aug"
    augment_dataset(teacher, src, dst, days=[2])
    before = {p.name: p.read_bytes() for p in (dst / "day=2").iterdir()}
    other = random_teacher(src, tmp_path / "other", seed=1)

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(augment, "_with_logits", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        augment_dataset(other, src, dst, days=[2])
    assert {p.name: p.read_bytes() for p in (dst / "day=2").iterdir()} == before
    assert [p.name for p in dst.iterdir()] == ["day=2"]  # no temporary left behind


def test_bad_inputs(datasets, teacher, tmp_path):  # noqa: F811
    with pytest.raises(DataError, match="sessions layout"):
        augment_dataset(teacher, datasets["raw"], tmp_path / "a")
    with pytest.raises(ConfigError, match="no data for days"):
        augment_dataset(teacher, datasets["sessions"], tmp_path / "a", days=[7])
    with pytest.raises(DataError, match="not a model folder"):
        augment_dataset(tmp_path, datasets["sessions"], tmp_path / "a")


@pytest.mark.parametrize("mode", ["flipped", "truncated"])
def test_a_damaged_source_file_is_named(datasets, teacher, tmp_path, mode):  # noqa: F811
    """d_bid is read by the teacher's loader (in its threads) and by the copy of the rows."""
    src = Path(shutil.copytree(datasets["sessions"], tmp_path / "src"))
    f = day_files(src)[2][0]
    corrupt(f, mode, row_group=0, column="d_bid")
    with pytest.raises(DataError) as e:
        augment_dataset(teacher, src, tmp_path / "aug", days=[1, 2], batch_size=1000)
    assert_names(e.value, f, mode, row_group=0)

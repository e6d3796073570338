"""The held-out batch cut, what the train days hold (rows, clicks, distinct ids) and the
tables fitted to them, the epoch stream's position, and the windowed NE of the meter."""

from __future__ import annotations

import dataclasses
from itertools import islice

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

from lrm.config import SplitConfig, TableConfig
from lrm.data.loader import BatchLoader
from lrm.data.schema import criteo_schema, day_files, synthetic_schema
from lrm.errors import ConfigError
from lrm.models import embedding_tables, hash_sizes
from lrm.data.dataset import Dataset
from lrm.train import data as train_data
from lrm.train.data import EpochStream, eval_batch
from lrm.train.meter import WindowNE
from tests.conftest import only_days


def test_eval_batch_leaves_no_tail_for_any_rank_to_drop():
    for rows in (1, 7, 999, 9020, 11_860, 1_000_003):
        for world in (1, 2, 3, 8):
            for batch in (64, 500, 4096):
                b = eval_batch(rows, world, batch)
                steps = -(-rows // b)
                assert b <= batch or rows < world
                if b > world * -(-rows // (world * batch)):
                    assert steps % world == 0, (rows, world, batch, b)


def test_window_ne_spans_the_latest_periods():
    w = WindowNE(rows=1000)
    w.push(700.0, 30.0, 1000.0)  # a bad first period
    w.push(100.0, 30.0, 1000.0)
    assert len(w.periods) == 1  # the first one left the window
    c = 0.03
    h = -(c * torch.log(torch.tensor(c)) + (1 - c) * torch.log(torch.tensor(1 - c)))
    assert abs(w.ne() - 0.1 / float(h)) < 1e-6


def test_scan_counts_rows_clicks_and_the_distinct_ids_of_hashed_features(datasets,
                                                                         monkeypatch):
    raw = datasets["raw"]  # the impressions layout: one row per impression
    t = pa.concat_tables([pq.read_table(f) for d in (0, 1) for f in day_files(raw)[d]])
    want = {f: len(pc.unique(t.column(f).drop_null())) for f in ("ad_id", "user_geo")}
    s = train_data.scan_days(datasets["sessions"], [0, 1], ["ad_id", "user_geo"], cap=10**6)
    assert s.rows == t.num_rows and s.positives == pc.sum(t.column("label")).as_py()
    assert s.distinct == want  # the sessions layout's lists count like the rows they hold
    capped = train_data.scan_days(raw, [0, 1], ["ad_id", "user_geo"], cap=want["ad_id"] - 1)
    assert capped.distinct == {"user_geo": want["user_geo"]}  # more ids than the cap: absent
    monkeypatch.setattr(train_data, "SCAN_ROWS", 10)  # a dataset too big to scan whole
    assert train_data.scan_days(raw, [0, 1], ["user_geo"], cap=10**6).distinct == {}


def test_hashed_tables_get_the_rows_their_ids_warrant():
    schema = criteo_schema()  # every feature hashed
    assert train_data.hashed_features(schema) == list(schema.sparse_features)
    fitted = train_data.fit_tables(schema, train_data.DataStats(9, 1, {"C1": 17, "C2": 0}))
    rows = hash_sizes(embedding_tables(fitted, TableConfig(hash_size=1000), 4))
    assert rows["C1"] == 17 and rows["C2"] == 1 and rows["C3"] == 1000  # C3: not counted
    assert fitted.sparse_features == schema.sparse_features


def test_epoch_stream_position_counts_steps_and_each_epoch_stops_before_validation(datasets):
    ld = BatchLoader(datasets["sessions"], 1000, days=[0], drop_last=True, prefetch=0)
    first = [b.labels.clone() for b in ld][:4]  # this epoch's 4 train batches, in order
    s = EpochStream(ld, batches=4)
    it = iter(s)
    got = [next(it).labels for _ in range(6)]  # read ahead, as the pipeline does
    assert all(torch.equal(a, b) for a, b in zip(got, first + first[:2], strict=True))
    for _ in range(5):
        s.advance()  # five steps consumed five of the six batches read
    assert {k: int(v) for k, v in s.state_dict().items()} == {"epoch": 1, "batch": 1}
    it.close()

    resumed = EpochStream(ld, batches=4)
    resumed.load_state_dict(s.state_dict())
    again = [b.labels for b in islice(iter(resumed), 5)]  # on from epoch 1, batch 1
    assert all(torch.equal(a, b) for a, b in zip(again, first[1:] + first[:2], strict=True))


def test_fitted_tables_keep_every_other_field_of_the_schema():
    schema = synthetic_schema({"user_age": 8})  # user_key names the user (dedup sorts by it)
    fitted = train_data.fit_tables(schema, train_data.DataStats(9, 1, {"ad_id": 40}))
    assert fitted.vocab == {"user_age": 8, "ad_id": 40}
    assert dataclasses.replace(fitted, vocab=schema.vocab) == schema


def test_a_held_out_dataset_lets_every_day_of_the_data_train(datasets, tmp_path):
    """A file ingested on its own is one day; with it as the data there is nothing to train
    on before its held-out day, and the error says what to do. With another dataset held out
    (eval_from: a test file ingested on its own), every day of the data trains."""
    one = Dataset.open(only_days(datasets["sessions"], tmp_path / "one", [2]))
    data = Dataset.open(datasets["sessions"])
    with pytest.raises(ConfigError, match="--eval-data DIR"):
        train_data.split_days(one, SplitConfig())
    assert train_data.split_days(data, SplitConfig(), held=one) == ([0, 1, 2], 2)
    assert train_data.split_days(data, SplitConfig(days=[1]), held=one) == ([1], 2)
    with pytest.raises(ConfigError, match="the held-out dataset is the train data"):
        train_data.split_days(one, SplitConfig(), held=Dataset.open(tmp_path / "." / "one"))


def test_a_run_reads_its_validation_slice_once_and_scores_the_same_batches(datasets,
                                                                          monkeypatch):
    """A run validates ten times an epoch; the slice is read from the data once (the seek
    past the train batches, then its batches), every later pass scores the same batches
    from memory: the run's validation NEs are those of a run that reads the slice every
    time. Red when the batches read are not kept (a seek a validation), and when what is
    kept is not the whole slice (other NEs)."""
    from lrm.train import TrainJob, train
    from tests.conftest import LOADER, SMALL_MODEL, tiny_train

    job = TrainJob(kind="student", train=tiny_train(epochs=2, log_every=8), model=SMALL_MODEL,
                   data=datasets["sessions"], loader=LOADER)
    seeks = []
    seek = train_data.seek
    monkeypatch.setattr(train_data, "seek", lambda ld, b: (seeks.append(b), seek(ld, b)))
    r = train(job)
    vals = [h["val_ne"] for h in r.history if "val_ne" in h]
    # the validation loader's seeks (the train stream's start at batch 0 each epoch)
    assert len(vals) > 3 and seeks.count(r.schedule["epoch_batches"]) == 1

    def every_time(self):  # the slice read again for each pass, as before
        seek(self.validation, self.train_batches)
        return iter(self.validation)

    monkeypatch.setattr(train_data.Loaders, "validation_batches", every_time)
    again = train(job)
    assert [h["val_ne"] for h in again.history if "val_ne" in h] == vals

"""A vertical's rows: dedup keeps each vertical's shared histories in runs of their own, and the
loader, the stats and a training run read one vertical alone (split.verticals)."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pytest

from lrm.config import SplitConfig
from lrm.data import parquet
from lrm.data.loader import BatchLoader
from lrm.data.schema import LABEL, day_files, window_columns
from lrm.errors import DataError
from lrm.train import TrainJob, train
from lrm.train.data import scan_days
from tests.conftest import LOADER, SMALL_MODEL, tiny_train


def _raw_counts(raw, day):
    """(impressions, clicks) per vertical of a raw (impressions) day."""
    out: dict[int, list[int]] = {}
    for f in day_files(raw)[day]:
        t = parquet.read_table(f, columns=["vertical", LABEL])
        v, y = t.column("vertical").to_numpy(), t.column(LABEL).to_numpy()
        for k in np.unique(v):
            n, c = out.setdefault(int(k), [0, 0])
            out[int(k)] = [n + int((v == k).sum()), c + int(y[v == k].sum())]
    return out


def test_a_run_never_goes_on_across_a_vertical_change():
    """One user's sliding history on two verticals: without the break the third list
    would be a window of the first row's items (one run); a vertical model reading the
    second vertical alone would then miss them."""
    import pyarrow as pa

    from lrm.data import dedup, histories
    from lrm.data.schema import synthetic_schema

    lists = pa.array([[1, 2, 3], [0, 1, 2], [9, 0, 1]], pa.list_(pa.int64()))
    assert histories.encode(lists).items.is_valid().to_pylist() == [True, False, False]
    table = pa.table({"vertical": pa.array([0, 0, 1], pa.int64()), "user_history": lists})
    breaks = dedup.vertical_breaks(table, synthetic_schema())
    assert breaks.tolist() == [2]
    enc = histories.encode(lists, None, breaks)
    assert enc.items.is_valid().to_pylist() == [True, False, True]
    assert enc.offset.tolist() == [1, 0, 0]


def test_every_vertical_change_starts_a_run_of_shared_histories(datasets):
    """Else a vertical model's reader would get windows into items another vertical's row
    holds. The data must change vertical inside a row group, or nothing is checked."""
    checked = 0
    for f in day_files(datasets["sessions"])[0]:
        pf = parquet.open_file(f)
        for g in range(pf.num_row_groups):
            t = pf.read_row_group(g, columns=["vertical", "user_history",
                                              *window_columns("user_history")])
            v = t.column("vertical").to_numpy()
            changes = np.flatnonzero(v[1:] != v[:-1]) + 1
            stored = t.column("user_history").is_valid().to_numpy(zero_copy_only=False)
            empty = t.column(window_columns("user_history")[0]).to_numpy() == -1
            assert (stored | empty)[changes].all(), (f, g)
            checked += len(changes)
    assert checked > 0, "no row group changes vertical: the check above saw nothing"


@pytest.mark.parametrize("layout", ["raw", "sessions"])
def test_the_loader_reads_one_vertical_alone(datasets, layout):
    want = _raw_counts(datasets["raw"], 1)
    assert len(want) == 3  # the default world's three surfaces all have traffic
    for v, (n, clicks) in want.items():
        loader = BatchLoader(datasets[layout], 256, days=[1], verticals=[v], prefetch=0)
        assert loader.num_rows() == n
        batches = list(loader)
        assert sum(b.size for b in batches) == n
        assert int(sum(float(b.labels.sum()) for b in batches)) == clicks
        stats = scan_days(datasets[layout], [1], verticals=[v])
        assert (stats.rows, stats.positives) == (n, clicks)
    both = BatchLoader(datasets[layout], 256, days=[1], verticals=[0, 2], prefetch=0)
    assert both.num_rows() == want[0][0] + want[2][0]


def test_a_dataset_without_a_vertical_column_has_none_to_keep(datasets):
    import dataclasses

    from lrm.data.dataset import Dataset

    ds = Dataset.open(datasets["raw"])
    one = dataclasses.replace(ds, schema=dataclasses.replace(ds.schema, vertical=None))
    with pytest.raises(DataError, match="no vertical column"):
        BatchLoader(one, 8, verticals=[0])


def test_a_run_on_one_vertical_trains_and_is_scored_on_it_alone(datasets):
    want = _raw_counts(datasets["raw"], 2)
    r = train(TrainJob(kind="student", train=tiny_train(steps=4), model=SMALL_MODEL,
                       data=datasets["sessions"],
                       split=SplitConfig(days=[0, 1], eval_day=2, verticals=[1]),
                       loader=LOADER))
    assert r.eval["rows"] == want[1][0]
    assert r.eval["ctr"] == pytest.approx(want[1][1] / want[1][0])
    total = scan_days(datasets["sessions"], [0, 1], verticals=[1]).rows
    assert r.samples <= total < scan_days(datasets["sessions"], [0, 1]).rows


def test_a_model_on_every_vertical_is_calibrated_on_each(datasets, tmp_path):
    """A training pass reads a day in file order: with the day's sessions stored vertical
    after vertical, a model on every vertical (the FM, the baselines) ended each day fitted
    to the last one (the default world's FM predicted 0.44 of search's clicks). Stored
    interleaved (user, then vertical), it predicts each vertical's click rate."""
    from lrm.train.evaluate import evaluate

    out = tmp_path / "every"
    train(TrainJob(kind="student", train=tiny_train(epochs=1), model=SMALL_MODEL,
                   data=datasets["sessions"], split=SplitConfig(days=[0, 1], eval_day=2),
                   loader=LOADER, out=out))
    cals = {v: evaluate(out, datasets["sessions"], day=2, verticals=[v],
                        resamples=0)["calibration"] for v in range(3)}
    assert all(0.75 < c < 1.33 for c in cals.values()), cals

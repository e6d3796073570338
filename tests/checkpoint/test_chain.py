"""Chains on a small sharded model (one process): baselines and deltas, retention, exact
restore, quantized restore within bounds, and a chain read back into other layouts."""

from __future__ import annotations

import pytest
import torch

from lrm.checkpoint import CheckpointManager, Store
from lrm.checkpoint.snapshot import restore_tables
from lrm.checkpoint.tables import TableShard
from lrm.config import CheckpointConfig
from tests.checkpoint.conftest import FEATURES, TABLES, WEIGHT, batch, build, tables_and_state, \
    train_steps

ID = {"kind": "toy", "model": {"dim": 8}}


def _run(env, root, steps, layout="table", resume=False, **cfg):
    """Train the toy `steps` steps under a manager; (state at the end, result of start)."""
    dmp, parts = build(env, layout)
    with CheckpointManager(root, env, CheckpointConfig(**cfg), ID) as ck:
        start = ck.start(parts, resume)
        done = parts["train"].step
        train_steps(parts, range(done, steps), ck)
        ck.finish(parts["train"].step, parts)
    return tables_and_state(parts, env), start


def _kinds(root):
    return [(e.step, e.kind) for e in Store(root).entries()]


def test_baselines_deltas_and_retention(env, tmp_path):
    _run(env, tmp_path, 9, every=2, deltas=2, delta_budget=100.0, keep=2)
    assert _kinds(tmp_path) == [(2, "baseline"), (4, "delta"), (6, "delta"),
                                (8, "baseline"), (9, "delta")]
    entries = Store(tmp_path).entries()
    assert all(e.chain == "000001-step-2" for e in entries[:3])
    # a delta holds the rows looked up since its parent, per table
    looked = sum(len({i for s in range(2, 4) for f, t in FEATURES.items() if t == name
                      for i in batch(s)[0][f].values().tolist()}) for name in TABLES)
    assert entries[1].manifest["rows_written"] == looked < sum(TABLES.values())
    assert entries[0].manifest["rows_written"] == sum(TABLES.values())
    # a chain of the newest two survives a third baseline; the first goes
    _run(env, tmp_path / "k1", 9, every=2, deltas=1, keep=2)
    assert _kinds(tmp_path / "k1") == [(6, "baseline"), (8, "delta"), (9, "baseline")]


def test_delta_budget_starts_a_new_baseline(env, tmp_path):
    _run(env, tmp_path / "small", 6, every=2, deltas=10, delta_budget=1e-6, keep=5)
    assert [k for _, k in _kinds(tmp_path / "small")] == ["baseline"] * 3
    _run(env, tmp_path / "big", 6, every=2, deltas=10, delta_budget=10.0)
    assert [k for _, k in _kinds(tmp_path / "big")] == ["baseline", "delta", "delta"]


@pytest.mark.parametrize("background", [True, False])
def test_restore_is_exact_and_training_goes_on_identically(env, tmp_path, background):
    straight, _ = _run(env, tmp_path / "a", 12, every=3, background=background)
    _run(env, tmp_path / "b", 7, every=3, background=background)
    assert _kinds(tmp_path / "b") == [(3, "baseline"), (6, "delta"), (7, "delta")]
    resumed, start = _run(env, tmp_path / "b", 12, every=3, resume=True, background=background)
    assert start == 7
    assert straight.keys() == resumed.keys()
    for k in straight:  # tables, row-wise Adagrad, dense layer, AdamW: bit for bit
        assert torch.equal(straight[k], resumed[k]), k


@pytest.mark.parametrize("q, levels", [("int8", 255), ("int4", 15)])
def test_quantized_chain_restores_within_a_step_and_the_rest_exactly(env, tmp_path, q, levels):
    saved, _ = _run(env, tmp_path, 8, every=3, quantize=q)
    got, start = _run(env, tmp_path, 8, resume=True, quantize=q)
    assert start == 8
    assert [e.manifest["quantize"] for e in Store(tmp_path).entries()] == [q] * 3
    worst = 0.0
    for k, v in saved.items():
        if k in (WEIGHT.format(t) for t in TABLES):
            step = (v.max(1).values - v.min(1).values) / levels
            err = (got[k] - v).abs().max(1).values
            assert (err <= step / 2 + 2e-3 * v.abs().max(1).values + 1e-7).all(), k
            assert err.max() > 0  # quantized indeed
            worst = max(worst, float(err.max()))
        else:  # optimizer state and dense parameters are exact
            assert torch.equal(got[k], v), k
    print(f"{q}: largest weight error after restore {worst:.2e}")


def _full(state):
    return {t: (state[WEIGHT.format(t)], state[f"{WEIGHT.format(t)}/{t}.momentum1"])
            for t in TABLES}


def test_chain_restores_into_another_sharding(env, tmp_path):
    """Column-wise (2 shards) -> table-wise -> column-wise; row-wise at the storage level."""
    cw, _ = _run(env, tmp_path / "cw", 7, layout="column", every=3)
    tw, _ = _run(env, tmp_path / "cw", 7, layout="table", resume=True)
    for t, (w, m) in _full(cw).items():
        tw_w, tw_m = _full(tw)[t]
        assert torch.equal(tw_w, w)  # weights exactly
        rows = TABLES[t]  # the two shards' states merge into the row's mean: exact
        assert torch.allclose(tw_m, (m[:rows] + m[rows:]) / 2, rtol=1e-6, atol=0)
    back, _ = _run(env, tmp_path / "tw", 7, layout="table", every=3)
    again, _ = _run(env, tmp_path / "tw", 7, layout="column", resume=True)
    for t, (w, m) in _full(back).items():
        cw_w, cw_m = _full(again)[t]
        assert torch.equal(cw_w, w)
        assert torch.equal(cw_m, torch.cat([m, m]))  # each half: the whole row's mean

    # row-wise (no CPU kernel in torchrec 1.8): the chain read into row blocks x column
    # halves of plain tensors, as a row-wise plan's shards would receive it
    lineage, problems = Store(tmp_path / "tw").newest_restorable()
    assert not problems and [e.kind for e in lineage] == ["baseline", "delta", "delta"]
    for t, (w, m) in _full(back).items():
        key, rows = WEIGHT.format(t), TABLES[t]
        cut = rows // 3
        shards = [TableShard(key, rows, 8, torch.zeros(r1 - r0, c1 - c0), r0, c0,
                             {f"{t}.momentum1": torch.zeros(r1 - r0)})
                  for r0, r1 in ((0, cut), (cut, rows)) for c0, c1 in ((0, 8),)]
        n = restore_tables(lineage, {key: shards})
        assert n >= rows
        assert torch.equal(torch.cat([s.weight for s in shards]), w)
        assert torch.equal(torch.cat([s.states[f"{t}.momentum1"] for s in shards]), m)


def test_new_data_resumes_model_and_optimizers_only(env, tmp_path):
    """The streaming flow's next day: other data, same model. The model and optimizer
    state come back, the step count and data position start afresh, only the model's
    identity must match; the newest checkpoint says which run (day) wrote it."""
    from lrm.errors import ConfigError

    day1 = {"kind": "toy", "model": {"dim": 8}, "data": "day=1"}
    saved, _ = _run(env, tmp_path, 6, every=3)  # identity ID: no "data" key
    _, parts = build(env)
    cfg = CheckpointConfig(every=3, delta_budget=100.0)
    with CheckpointManager(tmp_path, env, cfg, day1) as ck:
        assert ck.start(parts, True, new_data=True) == 6
        assert parts["train"].step == 0  # this day counts its own steps
        got = tables_and_state(parts, env)
        assert all(torch.equal(got[k], v) for k, v in saved.items())
        train_steps(parts, range(6, 9), ck)  # steps 1..3 of the day: a save at 3
        ck.finish(parts["train"].step, parts)
    newest = CheckpointManager.latest(tmp_path)
    assert newest is not None and newest.manifest["identity"]["data"] == "day=1"
    assert newest.step == 3 and newest.kind == "delta" and newest.parent == "000002-step-6"
    other = {**day1, "model": {"dim": 16}}
    with CheckpointManager(tmp_path, env, CheckpointConfig(), other) as ck, \
            pytest.raises(ConfigError, match="model"):
        ck.start(build(env)[1], True, new_data=True)


def test_the_tracker_merges_at_log_points_and_at_most_compact_max_apart(env, tmp_path,
                                                                        monkeypatch):
    """A merge of the tracked ids reads them back (a host sync on a GPU): it waits for a log
    point once COMPACT_EVERY steps have passed, or COMPACT_MAX steps without one; a save
    takes the ids, which counts as a merge."""
    from lrm.checkpoint.manager import COMPACT_EVERY, COMPACT_MAX
    from lrm.checkpoint.tracker import RowTracker

    def first_log_point(after: int) -> int:  # every 10 steps
        return -(-(after + COMPACT_EVERY) // 10) * 10

    at, merged = [0], []
    monkeypatch.setattr(RowTracker, "compact", lambda self: merged.append(at[0]))
    _, parts = build(env)
    a, b = first_log_point(0), first_log_point(30)
    for case, (log_every, saves, want) in enumerate((
            (10, (), [a, first_log_point(a)]),
            (None, (), [COMPACT_MAX, 2 * COMPACT_MAX]),
            (10, (30,), [b, first_log_point(b)]))):
        merged.clear()
        with CheckpointManager(tmp_path / str(case), env, CheckpointConfig(every=0), ID) as ck:
            ck.start(parts, False)
            for at[0] in range(1, max(want) + 1):
                if at[0] in saves:
                    ck.save(at[0], parts)
                ck.step(at[0], parts, log_point=log_every is not None and at[0] % log_every == 0)
            ck.wait()
        assert merged == want, case


def test_a_fresh_start_refuses_another_runs_checkpoints_and_names_what_it_removes(
        env, tmp_path, caplog):
    """Without resume, the folder's checkpoints go only when they are this run's (its
    owner: the model folder it trains toward) or when forced; each removal is named."""
    import logging

    from lrm.errors import ConfigError

    def fresh(owner, force=False):
        _, parts = build(env)
        with CheckpointManager(tmp_path, env, CheckpointConfig(every=2), ID, owner=owner) as ck:
            ck.start(parts, False, force=force)
            train_steps(parts, range(4), ck)
            ck.finish(4, parts)

    fresh("../m_base")
    before = [e.name for e in Store(tmp_path).entries()]
    with pytest.raises(ConfigError) as err:
        fresh("../m_other")
    msg = str(err.value)
    assert "holds 2 verified checkpoint(s) of a run of" in msg and "m_base" in msg
    assert "--resume" in msg and "--force" in msg and "\n" not in msg
    assert [e.name for e in Store(tmp_path).entries()] == before  # kept, all of them
    caplog.set_level(logging.INFO, logger="lrm")
    fresh("../m_base")  # the same run started afresh: it says what it removed
    said = " ".join(r.getMessage() for r in caplog.records)
    assert f"removed 2 checkpoint(s) of an earlier run: {', '.join(before)}" in said
    fresh("../m_other", force=True)
    assert [e.manifest["owner"] for e in Store(tmp_path).entries()] == ["../m_other"] * 2

"""Chains on a small sharded model (one process): baselines and deltas, retention, exact
restore, quantized restore within bounds, and a chain read back into other layouts."""

from __future__ import annotations

import pytest
import torch

from lrm.checkpoint import CheckpointManager, Store, quantize
from lrm.checkpoint.snapshot import restore_tables
from lrm.checkpoint.tables import TableShard
from lrm.config import CheckpointConfig
from tests.checkpoint.conftest import DIM, FEATURES, TABLES, WEIGHT, batch, build, looked_up, \
    tables_and_state, train_steps

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


@pytest.mark.parametrize("q", ["int8", "int4"])
def test_quantized_chain_restores_its_baseline_plus_residuals(env, tmp_path, q):
    """An 8-bit baseline at step 3, then deltas at 6 and 8 holding residuals (each changed
    row minus what the chain restores it to so far): the restore is exactly that sum,
    replayed here by hand; the row-wise state comes back in bfloat16, the rest exactly."""
    saved, _ = _run(env, tmp_path, 8, every=3, quantize=q)
    got, start = _run(env, tmp_path, 8, resume=True, quantize=q)
    assert start == 8
    assert [e.manifest["quantize"] for e in Store(tmp_path).entries()] == [q] * 3
    base, delta = quantize.codecs(q)
    _, parts = build(env)
    expect: dict[str, torch.Tensor] = {}
    for s0, s1 in ((0, 3), (3, 6), (6, 8)):
        train_steps(parts, range(s0, s1))
        now = tables_and_state(parts, env)
        for t in TABLES:
            key = WEIGHT.format(t)
            if not s0:
                expect[key] = quantize.decode(quantize.encode(now[key], base), base, DIM)
                continue
            rows = sorted(looked_up(range(s0, s1))[t])
            residual = quantize.encode(now[key][rows] - expect[key][rows], delta)
            expect[key][rows] += quantize.decode(residual, delta, DIM)
    for k, v in saved.items():
        if k in expect:
            assert torch.equal(got[k], expect[k]), k
            # closer than 4-bit rows (what the deltas would hold without residuals), even
            # here, where Adagrad's first steps move a row as far as its values spread
            four = quantize.decode(quantize.encode(v, "n4"), "n4", DIM)
            assert 0 < (got[k] - v).abs().mean() < (four - v).abs().mean() / 2, k
        elif k.endswith("momentum1"):
            assert torch.equal(got[k], v.to(torch.bfloat16).float()), k
        else:  # dense parameters and AdamW's state are exact
            assert torch.equal(got[k], v), k


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


def test_a_file_lrm_did_not_write_in_a_checkpoint_is_never_removed(env, tmp_path):
    """The ops probe: a user's file inside a checkpoint folder went with it, on a fresh
    start (`lrm train` without --resume) and when retention dropped its chain. A fresh
    start now refuses naming it (--force removes it too); retention keeps that
    checkpoint. Red without Store's strays check in _choose, and in prune."""
    from lrm.errors import ConfigError

    _run(env, tmp_path, 4, every=2)
    first = Store(tmp_path).entries()[0].path
    (first / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"000001-step-2/notes.txt: a file lrm did not "
                                          r"write, in a checkpoint a fresh start would "):
        _run(env, tmp_path, 4, every=2)
    assert (first / "notes.txt").read_text() == "mine"
    # resumed and run on: new chains, keep=1 drops the first chain but this checkpoint
    _run(env, tmp_path, 12, every=2, deltas=1, keep=1, resume=True)
    kept = [e.name for e in Store(tmp_path).entries()]
    assert kept[0] == first.name and (first / "notes.txt").read_text() == "mine"
    assert "000002-step-4" not in kept  # (the chain's other checkpoint went)

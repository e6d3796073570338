"""Writes that did not finish: an unfinished write is removed and never read, a write that
fails stops training with the reason, a rank that cannot write stops the commit at once.
(Damage to finished checkpoints: tests/faults/test_checkpoint_matrix.py.)"""

from __future__ import annotations

import logging
import shutil
import time

import pytest
import torch

from lrm.checkpoint import CheckpointError, CheckpointManager, Store, listing, snapshot
from lrm.checkpoint.manager import _Job
from lrm.checkpoint.tables import table_shards
from lrm.dist import Dist
from tests.checkpoint.conftest import CFG, ID, NAMES, build, chain, train_steps  # noqa: F401

def _temp(root):  # a save killed half way: some files, no manifest
    tmp = root / ".tmp-000006-step-12-0badc0de"
    tmp.mkdir()
    (tmp / "rows-0.pt").write_bytes(b"PK\x03\x04 half a zip")
    (tmp / "part-0.json").write_text('{"nonce": "0badc0de", "rank": 0, "files": {}}')
    return tmp


def test_unfinished_write_is_removed_and_never_read(env, chain, tmp_path, caplog):
    src, states = chain
    root = tmp_path / "ck"
    shutil.copytree(src, root)
    tmp = _temp(root)
    (root / ".old-000001-step-2").mkdir()  # a removal cut short
    assert ".tmp-000006-step-12-0badc0de: unfinished" in listing.ls(root)
    listing.verify(root)  # an unfinished write is not damage
    _, parts = build(env)
    caplog.set_level(logging.INFO, logger="lrm")
    with CheckpointManager(root, env, CFG, ID) as ck:
        assert ck.start(parts, True) == 10
        assert not tmp.exists() and not (root / ".old-000001-step-2").exists()
        assert any(".tmp-000006-step-12-0badc0de" in r.getMessage() for r in caplog.records)
        train_steps(parts, range(10, 12), ck)  # the next save takes the next seq, cleanly
        ck.finish(12, parts)
    newest = Store(root).entries()[-1]
    assert newest.name == "000006-step-12" and newest.parent == NAMES[10]
    assert not Store(root).lineage(newest)[1]


def test_a_failed_write_stops_training_with_the_reason(env, tmp_path, monkeypatch):
    def full(*a, **k):
        raise OSError(28, "No space left on device")

    _, parts = build(env)
    with CheckpointManager(tmp_path, env, CFG, ID) as ck:
        ck.start(parts, False)
        train_steps(parts, range(2), ck)
        ck.wait()  # the baseline at step 2 is written
        monkeypatch.setattr(snapshot, "write_rows", full)
        with pytest.raises(CheckpointError, match="failed: .*No space left"):
            train_steps(parts, range(2, 6), ck)  # the save at 6 finds the one at 4 failed
    assert [e.step for e in Store(tmp_path).entries()] == [2]


def test_a_rank_that_cannot_write_stops_the_commit_at_once(env, tmp_path, monkeypatch):
    """Rank 1 of 2 fails to write its share: it says so in its part file, and rank 0's
    commit fails at once naming it (instead of waiting out the commit timeout)."""
    def full(*a, **k):
        raise OSError(28, "No space left on device")

    _, parts = build(env)
    state = {k: v.state_dict() for k, v in parts.items()}
    snap = snapshot.capture(state, table_shards(state["model"], state["optim"]), None,
                            dense=False)
    monkeypatch.setattr(snapshot, "write_rows", full)
    tmp = tmp_path / ".tmp-000001-step-2-0badc0de"
    rank1 = Dist(rank=1, world_size=2, local_rank=1, device=torch.device("cpu"))
    manifest = {"seq": 1, "step": 2, "kind": "baseline", "quantize": "none"}
    job = _Job(Store(tmp_path), tmp, manifest, snap, rank1, "0badc0de", keep=2)
    with pytest.raises(OSError, match="No space"):
        job.run()
    Store(tmp_path).write_part(tmp, 0, "0badc0de", {}, {"pieces": []})
    t0 = time.monotonic()
    with pytest.raises(CheckpointError, match="rank 1 could not write its share.*No space"):
        Store(tmp_path).commit(tmp, {"seq": 1, "step": 2}, 2, "0badc0de", lambda m, p: None,
                               timeout=20)
    assert time.monotonic() - t0 < 5
    assert not Store(tmp_path).entries()  # nothing committed

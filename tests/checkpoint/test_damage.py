"""Damaged checkpoint folders: each fault is detected and named, the restore falls back to
the newest checkpoint whose whole chain verifies (and restores it exactly), unfinished
writes are removed, and nothing in a checkpoint is ever unpickled."""

from __future__ import annotations

import logging
import shutil
import json
import time

import pytest
import torch

from lrm.checkpoint import CheckpointError, CheckpointManager, Store, listing, snapshot
from lrm.checkpoint.manager import _Job
from lrm.checkpoint.store import sha256_file
from lrm.checkpoint.tables import table_shards
from lrm.config import CheckpointConfig
from lrm.dist import Dist
from tests.checkpoint.conftest import build, tables_and_state, train_steps

ID = {"kind": "toy"}
CFG = CheckpointConfig(every=2, deltas=2, keep=5)
# the folder the fixture writes: chain 1 = steps 2 (baseline), 4, 6; chain 2 = 8 (baseline), 10
NAMES = {2: "000001-step-2", 4: "000002-step-4", 6: "000003-step-6", 8: "000004-step-8",
         10: "000005-step-10"}


@pytest.fixture(scope="module")
def chain(env, tmp_path_factory):
    """(folder, {step: full state at that step}) of one 10-step run."""
    root = tmp_path_factory.mktemp("chain") / "ck"
    _, parts = build(env)
    states = {}
    with CheckpointManager(root, env, CFG, ID) as ck:
        ck.start(parts, False)
        for s in range(10):
            train_steps(parts, range(s, s + 1), ck)
            if (s + 1) % 2 == 0:
                states[s + 1] = tables_and_state(parts, env)
        ck.finish(10, parts)
    assert [(e.step, e.kind) for e in Store(root).entries()] == [
        (2, "baseline"), (4, "delta"), (6, "delta"), (8, "baseline"), (10, "delta")]
    return root, states


def _flip(path, at=0.5, n=64):
    data = bytearray(path.read_bytes())
    i = int(len(data) * at)
    data[i:i + n] = bytes(b ^ 0xFF for b in data[i:i + n])
    path.write_bytes(bytes(data))


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _temp(root):  # a save killed half way: some files, no manifest
    tmp = root / ".tmp-000006-step-12-0badc0de"
    tmp.mkdir()
    (tmp / "rows-0.pt").write_bytes(b"PK\x03\x04 half a zip")
    (tmp / "part-0.json").write_text('{"nonce": "0badc0de", "rank": 0, "files": {}}')
    return tmp


FAULTS = {  # name: (damage, restored step, what the log and verify must name)
    "truncated": (lambda r: _truncate(r / NAMES[10] / "rows-0.pt"), 8,
                  f"{NAMES[10]}/rows-0.pt: "),
    "flipped": (lambda r: _flip(r / NAMES[8] / "state.pt"), 6,
                f"{NAMES[8]}/state.pt: sha256 differs"),
    "no manifest": (lambda r: (r / NAMES[10] / "manifest.json").unlink(), 8,
                    f"{NAMES[10]}/manifest.json: missing"),
    "delta gone": (lambda r: (shutil.rmtree(r / NAMES[4]), _flip(r / NAMES[8] / "rows-0.pt")),
                   2, f"its parent {'{root}'}/{NAMES[4]} is missing"),
    "bad manifest": (lambda r: (r / NAMES[10] / "manifest.json").write_text("{ not json"), 8,
                     f"{NAMES[10]}/manifest.json: unreadable"),
    "all bad": (lambda r: (_flip(r / NAMES[2] / "rows-0.pt"), _flip(r / NAMES[8] / "rows-0.pt")),
                None, f"{NAMES[8]}/rows-0.pt: sha256 differs"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_damage_is_named_and_the_newest_good_checkpoint_restored(env, chain, tmp_path,
                                                                 fault, caplog):
    src, states = chain
    root = tmp_path / "ck"
    shutil.copytree(src, root)
    damage, step, named = FAULTS[fault]
    named = named.replace("{root}", str(root))
    damage(root)
    with pytest.raises(CheckpointError) as err:
        listing.verify(root)
    assert named in str(err.value) and "\n" not in str(err.value)
    assert "NO: " in listing.ls(root)

    _, parts = build(env)
    caplog.set_level(logging.INFO, logger="lrm")
    with CheckpointManager(root, env, CFG, ID) as ck:
        assert ck.start(parts, True) == step
    said = [r.getMessage() for r in caplog.records if r.name == "lrm"]
    assert any(named in m for m in said), said  # one line names the bad file
    if step is None:
        assert parts["train"].step == 0  # nothing restorable: a fresh start
        return
    got = tables_and_state(parts, env)
    for k, v in states[step].items():
        assert torch.equal(got[k], v), k  # exactly the state of that step


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


def test_a_pickled_object_is_never_loaded(env, chain, tmp_path):
    """Even with a manifest that matches (someone else's folder), restore reads tensors
    only: an object in a file is refused, its code never runs."""
    src, _ = chain
    root = tmp_path / "ck"
    shutil.copytree(src, root)
    marker = tmp_path / "pwned"
    bad = root / NAMES[10] / "rows-0.pt"
    torch.save({"0/ids": _Evil(str(marker))}, bad)
    man = json.loads((root / NAMES[10] / "manifest.json").read_text())
    man["files"]["rows-0.pt"] = {"bytes": bad.stat().st_size, "sha256": sha256_file(bad)}
    (root / NAMES[10] / "manifest.json").write_text(json.dumps(man))
    listing.verify(root)  # the files match their manifest
    _, parts = build(env)
    with CheckpointManager(root, env, CFG, ID) as ck, \
            pytest.raises(CheckpointError, match="rows-0.pt: unreadable.*Weights only"):
        ck.start(parts, True)
    assert not marker.exists()


class _Evil:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):  # unpickling it would create a file
        return (open, (self.path, "w"))


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

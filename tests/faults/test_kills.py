"""SIGKILL training again and again, often in the middle of a checkpoint write (24 seeded
kills over two runs: one of literal steps, one that validates and stops early).

After every kill: each checkpoint folder verifies (a write is either all there, renamed
into place after its files, or an unfinished temporary folder that the next start
removes), a restorable checkpoint exists once one was committed, and at most the
checkpoint in flight is lost. The run that finally completes has exactly the weights (and,
stopping early, the same best validated state) of a run never killed. Bounded: the
forkserver imports torch once; a kill/restart cycle costs about a second.
"""

from __future__ import annotations

import json

import pytest
import torch

from lrm.checkpoint import Store
from tests.faults.kills import forkserver, kill_loop

pytestmark = pytest.mark.slow

EVERY = 4
RUNS = {  # name: (train config, kills, seed)
    "literal steps": ({"steps": 48}, 12, 9),
    # ~40 steps an epoch, validated every 6: kills land around validations, the saves of a
    # better state and the pinned checkpoint; it stops early and restores its best state
    "early stopping": ({"epochs": 3, "val_every": 6, "patience": 2, "embedding_lr": 0.5,
                        "lr": 0.03}, 12, 17),
}


def _progress(path) -> int:
    lines = path.read_text().split() if path.exists() else []
    return max((int(x) for x in lines if x.isdigit()), default=0)


def _writing(root) -> list:
    """Folders of checkpoints being written (no manifest yet)."""
    return [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".old-")
            and not (p / "manifest.json").exists()] if root.is_dir() else []


@pytest.mark.parametrize("run", list(RUNS))
def test_sigkill_anywhere_loses_at_most_the_checkpoint_in_flight(datasets, tmp_path,
                                                                 monkeypatch, run):
    # the runs are CPU runs on any machine: the forkserver starts with no GPU visible, so
    # neither it nor a child forked from it initializes CUDA (a forked child cannot,
    # once its parent has: seen on an H100 machine)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    ctx = forkserver()
    from tests.faults import _killable

    cfg, kills, seed = RUNS[run]
    ck, progress = tmp_path / "ck", tmp_path / "progress"
    spec = {"data": str(datasets["sessions"]), "train": cfg, "tmp": str(tmp_path),
            "fsync_s": 0.1, "progress": str(progress), "checkpoints": str(ck),
            "out": str(tmp_path / "model"),
            "checkpoint": {"every": EVERY, "deltas": 3, "keep": 2}}

    def start(**over):
        p = ctx.Process(target=_killable.run, args=({**spec, **over},), daemon=True)
        p.start()
        return p

    # the run never killed, beside the others (its own folders)
    ref = start(checkpoints=str(tmp_path / "ck-ref"), out=str(tmp_path / "ref"),
                progress=str(tmp_path / "p2"))
    state = {"stale": set(), "writing": [], "reached": 0, "mid_write": 0, "committed": False}

    def before(i):
        state["writing"] = [q for q in _writing(ck) if q.name not in state["stale"]]
        state["reached"] = _progress(progress)

    def check(i):
        state["mid_write"] += any(q.exists() and not (q / "manifest.json").exists()
                                  for q in state["writing"])
        store = Store(ck)
        for e in store.entries():  # nothing half-written under a checkpoint's name
            assert not store.verify(e), (i, store.verify(e))
        assert len(store.temps()) <= 1, (i, store.temps())  # earlier kills' are removed
        lineage, skipped = store.newest_restorable()
        assert not skipped, (i, skipped)
        state["committed"] = state["committed"] or lineage is not None
        if state["committed"]:
            assert lineage is not None, f"kill {i}: no restorable checkpoint left"
            # the save at step c waits for the write of c - EVERY: once step `reached` was
            # logged, every checkpoint up to the last save before it, minus one, is in
            floor = ((state["reached"] - 1) // EVERY) * EVERY - EVERY
            assert lineage[-1].step >= floor, (i, state["reached"], lineage[-1].step)
        state["stale"] = {q.name for q in _writing(ck)}  # removed by the next start

    stats = kill_loop(start, kills=kills, seed=seed, writes_in=ck, check=check, before=before)
    assert state["mid_write"] >= 3, f"only {state['mid_write']} of {kills} kills hit a write"
    print(f"{run}: {stats['kills']} kills, {state['mid_write']} mid-write, reached step "
          f"{_progress(progress)}")

    p = start()
    p.join(timeout=180)
    assert p.exitcode == 0 and progress.read_text().split()[-1] == "done"
    ref.join(timeout=180)
    assert ref.exitcode == 0
    got = torch.load(tmp_path / "model" / "state_dict.pt", weights_only=True)
    want = torch.load(tmp_path / "ref" / "state_dict.pt", weights_only=True)
    assert got.keys() == want.keys()
    for k in want:  # kills later, bit for bit the run that was never killed
        assert torch.equal(got[k], want[k]), k
    info = [json.loads((tmp_path / m / "model.json").read_text())["info"]
            for m in ("model", "ref")]
    assert info[0]["validation"] == info[1]["validation"]
    assert info[0]["steps"] == info[1]["steps"]
    if run == "early stopping":
        v = info[1]["validation"]
        assert v["stopped_early"] and v["restored"] == v["best_step"] < info[1]["steps"]

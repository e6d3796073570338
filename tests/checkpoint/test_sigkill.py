"""SIGKILL the training process again and again, often in the middle of a checkpoint write.

After every kill: each checkpoint folder verifies (a write is either all there, renamed
into place after its files, or an unfinished temporary folder that the next start
removes), a restorable checkpoint exists once one was committed, and at most the
checkpoint in flight is lost. The run that finally completes has exactly the weights of
a run never killed. Bounded: the forkserver imports torch once; a kill/restart cycle
costs about a second.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import time

import pytest
import torch

from lrm.checkpoint import Store

pytestmark = pytest.mark.slow

KILLS = 20
EVERY = 4
STEPS = 48


def _progress(path) -> int:
    lines = path.read_text().split() if path.exists() else []
    steps = [int(x) for x in lines if x.isdigit()]
    return max(steps, default=0)


def _new_write(root, seen: set[str], timeout: float) -> bool:
    """Wait until a folder this test has not seen appears in `root` (a write starting, or
    one just renamed into place)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in root.iterdir() if root.is_dir() else ():
            if p.is_dir() and not p.name.startswith(".old-") and p.name not in seen:
                seen.add(p.name)
                return True
        time.sleep(0.002)
    return False


def _writing(root) -> list:
    """Folders of checkpoints being written (no manifest yet)."""
    return [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".old-")
            and not (p / "manifest.json").exists()] if root.is_dir() else []


def test_sigkill_anywhere_loses_at_most_the_checkpoint_in_flight(datasets, tmp_path,
                                                                 monkeypatch):
    # the runs are CPU runs on any machine: the forkserver starts with no GPU visible, so
    # neither it nor a child forked from it initializes CUDA (a forked child cannot,
    # once its parent has: seen on an H100 machine)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["tests.checkpoint._killable"])
    from tests.checkpoint import _killable

    ck, progress = tmp_path / "ck", tmp_path / "progress"
    spec = {"data": str(datasets["sessions"]), "steps": STEPS, "tmp": str(tmp_path),
            "fsync_s": 0.02, "progress": str(progress), "checkpoints": str(ck),
            "out": str(tmp_path / "model"),
            "checkpoint": {"every": EVERY, "deltas": 3, "keep": 2}}

    def start(**over):
        p = ctx.Process(target=_killable.run, args=({**spec, **over},), daemon=True)
        p.start()
        return p

    # the run never killed, beside the others (its own folders)
    ref = start(checkpoints=None, out=str(tmp_path / "ref"), progress=str(tmp_path / "p2"))
    rng = random.Random(9)
    seen: set[str] = set()
    mid_write, committed = 0, False
    t0 = time.monotonic()
    for i in range(KILLS):
        stale = {q.name for q in _writing(ck)}  # an earlier kill's, removed by the start
        p = start()
        if i % 2 == 0:  # aim at a write: the first or second after this start
            for _ in range(1 + i // 2 % 2):
                if not _new_write(ck, seen, timeout=30):
                    break
            time.sleep(rng.uniform(0, 0.06))
        else:  # anywhere: imports, restore, training, a write, the final eval
            time.sleep(rng.uniform(0.05, 0.6))
        writing = [q for q in _writing(ck) if q.name not in stale]
        reached = _progress(progress)
        p.kill()
        p.join()
        assert p.exitcode == -9, f"kill {i}: the run ended by itself ({p.exitcode})"
        mid_write += any(q.exists() and not (q / "manifest.json").exists() for q in writing)

        store = Store(ck)
        for e in store.entries():  # nothing half-written under a checkpoint's name
            assert not store.verify(e), (i, store.verify(e))
        assert len(store.temps()) <= 1, (i, store.temps())  # earlier kills' are removed
        lineage, skipped = store.newest_restorable()
        assert not skipped, (i, skipped)
        committed = committed or lineage is not None
        if committed:
            assert lineage is not None, f"kill {i}: no restorable checkpoint left"
            # the save at step c waits for the write of c - EVERY: once step `reached` was
            # logged, every checkpoint up to the last save before it, minus one, is in
            floor = ((reached - 1) // EVERY) * EVERY - EVERY
            assert lineage[-1].step >= floor, (i, reached, lineage[-1].step)
    assert mid_write >= 5, f"only {mid_write} of {KILLS} kills hit a write in flight"
    print(f"{KILLS} kills, {mid_write} mid-write, reached step {_progress(progress)} "
          f"in {time.monotonic() - t0:.1f} s")

    p = start()
    p.join(timeout=120)
    assert p.exitcode == 0 and progress.read_text().split()[-1] == "done"
    ref.join(timeout=120)
    assert ref.exitcode == 0
    got = torch.load(tmp_path / "model" / "state_dict.pt", weights_only=True)
    want = torch.load(tmp_path / "ref" / "state_dict.pt", weights_only=True)
    assert got.keys() == want.keys()
    for k in want:  # 20 kills later, bit for bit the run that was never killed
        assert torch.equal(got[k], want[k]), k

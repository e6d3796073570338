"""A full disk: during a stage's output (exit 2, one line naming the file and the cause, the
earlier output kept whole, no temporary left) and during a checkpoint write (training stops
in one line that says no space is left, every committed checkpoint still verifies, no
model is written). On a small tmpfs where this machine lets the suite mount one (root),
else with ENOSPC injected into the writes."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from lrm.checkpoint import CheckpointError, Store
from lrm import io as lrm_io
from lrm.config import CheckpointConfig
from lrm.train import TrainJob, train
from tests.conftest import REPO
from tests.conftest import LOADER, SMALL_MODEL, tiny_train

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[bool]:
    """Mount a tmpfs of `size` at `path` (made); False when this machine does not allow it
    (or LRM_FAULTS_NO_MOUNT is set: the injected path, on a machine that could mount)."""
    path.mkdir(parents=True, exist_ok=True)
    ok = os.geteuid() == 0 and not os.environ.get("LRM_FAULTS_NO_MOUNT") and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True).returncode == 0
    try:
        yield ok
    finally:
        if ok:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _fill(folder: Path, leave: int) -> None:
    """Take all but about `leave` bytes left on the file system of `folder` (a write then
    runs out part way: torch's writer sees a short write, the case it reports worst)."""
    st = os.statvfs(folder)
    with open(folder / "filler", "wb") as f, contextlib.suppress(OSError):
        f.write(b"\0" * max(st.f_bavail * st.f_frsize - leave, 0))


def _tree(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def _generate(cwd: Path, out: Path, days: int, sessions: int, **env: str
              ) -> subprocess.CompletedProcess[str]:
    (cwd / "params.yaml").write_text(yaml.safe_dump(
        {"generate": {"users": 2000, "ads": 300, "max_history": 20, "seed": 3}}))
    return subprocess.run([sys.executable, "-m", "stages.generate", "--out", str(out),
                           "--days", str(days), "--sessions-per-day", str(sessions)],
                          cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env})


INJECT = '''
import errno, os, pyarrow.parquet as pq
real = pq.ParquetWriter.write_table
def full(self, *a, **k):  # the disk fills during the second run's third day
    if os.environ.get("LRM_TEST_FULL") and "day=2" in self.lrm_path:
        raise OSError(errno.ENOSPC, "No space left on device")
    return real(self, *a, **k)
pq.ParquetWriter.write_table = full
real_init = pq.ParquetWriter.__init__
def init(self, where, *a, **k):
    self.lrm_path = str(where)
    real_init(self, where, *a, **k)
pq.ParquetWriter.__init__ = init
'''


def test_a_full_disk_during_a_stage_output_is_one_line_and_keeps_the_last_output(tmp_path):
    fs = tmp_path / "fs"
    with _tmpfs(fs, "512k") as mounted:
        out = fs / "raw"
        env = {}
        if not mounted:  # inject: a sitecustomize that fails the writes of day 2
            site = tmp_path / "site"
            site.mkdir()
            (site / "sitecustomize.py").write_text(INJECT)
            env = {"PYTHONPATH": f"{site}{os.pathsep}{REPO}"}
        first = _generate(tmp_path, out, days=1, sessions=100, **env)
        assert first.returncode == 0, first.stderr[-2000:]
        before = _tree(fs)  # the output, and its metrics beside it (a run by hand)
        r = _generate(tmp_path, out, days=3, sessions=2000, LRM_TEST_FULL="1", **env)
        assert r.returncode == 2, r.stderr[-3000:]
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith("error: ") and "No space left on device" in last, last
        assert "nothing was replaced" in last and "Traceback" not in r.stderr
        assert _tree(fs) == before  # the earlier output and metrics, whole; no temporary
        print(f"disk full on {'a 512 KB tmpfs' if mounted else 'an injected ENOSPC'}")


def test_a_full_disk_during_a_checkpoint_stops_training_in_one_line(datasets, tmp_path,
                                                                  monkeypatch):
    fs = tmp_path / "fs"
    with _tmpfs(fs, "8m") as mounted:
        ck, out = fs / "ck", tmp_path / "model"
        full = {"now": False}

        def log_fn(point, step):
            if step == 6 and not full["now"]:  # after the checkpoints of steps 2 and 4
                full["now"] = True
                if mounted:
                    _fill(fs, leave=64 << 10)  # less than a checkpoint of this model

        if not mounted:
            real = lrm_io._Hashing.write

            def write(self, b):
                if full["now"]:
                    self.f.write(b"")  # nothing more fits
                    self.error = OSError(errno.ENOSPC, "No space left on device")
                    raise self.error
                return real(self, b)

            monkeypatch.setattr(lrm_io._Hashing, "write", write)
        with pytest.raises(CheckpointError) as err:
            train(TrainJob(kind="student", train=tiny_train(steps=12, log_every=1),
                           model=SMALL_MODEL, data=datasets["sessions"], loader=LOADER,
                           checkpoint=CheckpointConfig(every=2, deltas=0),  # all full: big
                           checkpoints=ck, out=out),
                  log_fn=log_fn)
        msg = str(err.value)
        assert "\n" not in msg and f"writing a checkpoint in {ck} failed" in msg, msg
        assert "No space left on device" in msg and "unexpected pos" not in msg, msg
        store = Store(ck)
        kept = [e.step for e in store.entries()]
        assert kept[:2] == [2, 4] and all(not store.verify(e) for e in store.entries())
        assert store.newest_restorable()[0] is not None
        assert not out.exists()

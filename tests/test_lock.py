"""lrm.lock: one run per output folder, across processes; a second run fails at once naming the
holder; the lock of a killed run is taken over; a lock is released however its block ends."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from lrm import lock
from lrm.errors import LockedError, LrmError

REPO = Path(__file__).resolve().parents[1]

_HOLDER = """
import sys
from pathlib import Path
from lrm import lock
with lock.exclusive(Path(sys.argv[1]), purpose="train --out models/teacher"):
    print("locked", flush=True)
    sys.stdin.readline()
"""


class Holder:
    """Another process holding the lock on `path` until released or killed."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(path)], cwd=REPO, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        line = self.proc.stdout.readline()
        assert line == "locked\n", f"holder did not take the lock (rc={self.proc.poll()})"
        self.pid = self.proc.pid

    def release(self) -> None:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        assert self.proc.wait(timeout=30) == 0

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        for f in (self.proc.stdin, self.proc.stdout):
            f.close()


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    started: list[Holder] = []
    yield started
    for h in started:
        h.close()


def try_lock(path: Path, wait: float = 30.0) -> BaseException | None:
    """Try to take the lock in a thread; fail the test if the attempt waits instead of failing
    at once. Returns the exception raised, or None if the lock was taken (then released)."""
    result: list[BaseException | None] = []

    def attempt() -> None:
        try:
            with lock.exclusive(path):
                result.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            result.append(e)

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(wait)
    assert not t.is_alive(), "exclusive() waited for the holder instead of failing at once"
    return result[0]


@pytest.mark.slow
def test_second_run_fails_at_once_naming_the_holder(tmp_path, holders):
    out = tmp_path / "models" / "teacher"
    holders.append(h := Holder(out))
    e = try_lock(out)
    assert isinstance(e, LockedError) and isinstance(e, LrmError)  # exit status 2
    msg = str(e)
    assert f"pid {h.pid} on {socket.gethostname()}" in msg
    assert str(out) in msg and "train --out models/teacher" in msg and "since" in msg
    # the holder's record is intact (a failed attempt must not truncate it)
    rec = json.loads(lock.lock_file(out).read_text())
    assert rec["pid"] == h.pid and rec["host"] == socket.gethostname()
    h.release()
    assert not lock.lock_file(out).exists()  # a clean release removes the file
    assert try_lock(out) is None


@pytest.mark.slow
def test_stale_lock_of_a_killed_holder_is_taken_over(tmp_path, holders, caplog):
    out = tmp_path / "ckpt"
    holders.append(h := Holder(out))
    h.kill()  # SIGKILL: no cleanup ran, the lock file still names it
    assert json.loads(lock.lock_file(out).read_text())["pid"] == h.pid
    with caplog.at_level(logging.WARNING, logger="lrm"), \
            lock.exclusive(out, purpose="resume") as me:
        rec = json.loads(lock.lock_file(out).read_text())
        assert rec["pid"] == os.getpid() == me.pid and rec["purpose"] == "resume"
    took = [r.getMessage() for r in caplog.records if "took over" in r.getMessage()]
    assert len(took) == 1
    assert f"took over the stale lock of pid {h.pid} on {socket.gethostname()}" in took[0]
    assert "dead" in took[0]
    assert not lock.lock_file(out).exists()


def test_clean_release_logs_no_takeover(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="lrm"):
        for _ in range(2):
            with lock.exclusive(tmp_path / "out"):
                pass
    assert not caplog.records


@pytest.mark.slow
def test_lock_released_on_exception(tmp_path, holders):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError), lock.exclusive(out):
        assert lock.lock_file(out).exists()
        raise RuntimeError("boom")
    assert not lock.lock_file(out).exists()
    holders.append(Holder(out))  # another process gets it (asserts inside)
    holders[0].release()
    with lock.exclusive(out):  # and so does this one again
        pass


def test_record_names_pid_host_start_purpose_argv(tmp_path):
    with lock.exclusive(tmp_path / "out", purpose="generate") as me:
        rec = json.loads((tmp_path / ".out.lock").read_text())
    assert rec == {"pid": os.getpid(), "host": socket.gethostname(), "started": me.started,
                   "purpose": "generate", "argv": sys.argv, "path": str(tmp_path / "out")}
    assert me.lock_file == tmp_path / ".out.lock"


def test_lock_file_is_a_sibling_and_the_parent_is_created(tmp_path):
    out = tmp_path / "new" / "out"
    with lock.exclusive(out):
        assert (tmp_path / "new" / ".out.lock").exists() and not out.exists()
        out.mkdir()  # the folder itself can be created or replaced while locked
        (out / "x").write_text("x")
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["out"]


def test_parents_made_for_the_lock_go_when_the_run_leaves_nothing_in_them(tmp_path):
    out = tmp_path / "a" / "b" / "out.json"
    with lock.exclusive(out):  # a run that fails before it writes
        assert out.parent.is_dir()
    assert not (tmp_path / "a").exists()
    with lock.exclusive(out):  # a run that writes its output
        out.write_text("{}")
    assert out.read_text() == "{}"
    (tmp_path / "keep").mkdir()
    with lock.exclusive(tmp_path / "keep" / "out.json"):  # a folder that was there stays
        pass
    assert (tmp_path / "keep").is_dir()


def test_same_path_twice_in_one_process_is_refused(tmp_path):
    out = tmp_path / "out"
    (tmp_path / "alias").symlink_to(out, target_is_directory=True)
    with lock.exclusive(out, purpose="train"):
        for again in (out, tmp_path / "alias"):  # a second name of the same folder too
            with pytest.raises(LockedError, match="already locked by this process"), \
                    lock.exclusive(again):
                pass
        assert isinstance(try_lock(out), LockedError)  # another thread is refused too
        with lock.exclusive(tmp_path / "ckpt"), lock.exclusive(out / "inner"):
            pass  # other paths nest freely
        assert lock.lock_file(out).exists()  # the refused attempts did not release it
    with lock.exclusive(out):
        pass


@pytest.mark.slow
def test_exclusive_all_releases_what_it_took_when_one_is_busy(tmp_path, holders):
    a, b = tmp_path / "a", tmp_path / "b"
    holders.append(h := Holder(b))
    with pytest.raises(LockedError, match=f"pid {h.pid}"), lock.exclusive_all([b, a], "train"):
        pass
    assert not lock.lock_file(a).exists()
    with lock.exclusive(a):
        pass
    h.release()
    with lock.exclusive_all([b, a, a], "train") as infos:
        assert [i.path for i in infos] == [a, b]  # sorted, duplicates once
        assert lock.lock_file(a).exists() and lock.lock_file(b).exists()
    assert not lock.lock_file(a).exists() and not lock.lock_file(b).exists()


@pytest.mark.slow
def test_release_leaves_a_lock_file_that_names_another_run(tmp_path, holders):
    out = tmp_path / "out"
    with lock.exclusive(out):
        lock.lock_file(out).unlink()  # someone removed it by hand; another run locked anew
        holders.append(h := Holder(out))
    assert json.loads(lock.lock_file(out).read_text())["pid"] == h.pid
    e = try_lock(out)
    assert isinstance(e, LockedError) and f"pid {h.pid}" in str(e)


def test_a_lock_file_that_is_a_symbolic_link_is_never_followed(tmp_path):
    """One line naming the link (LockedError: exit 2), and the file it points at untouched."""
    victim = tmp_path / "victim.txt"
    victim.write_text("not a lock file\n")
    (tmp_path / ".out.lock").symlink_to(victim)
    with pytest.raises(LockedError) as err, lock.exclusive(tmp_path / "out"):
        pass
    msg = str(err.value)
    assert "\n" not in msg and f"a symbolic link to {victim}" in msg and "remove it" in msg
    assert victim.read_text() == "not a lock file\n"


def test_a_folder_that_takes_no_files_is_named_without_advice_to_remove_a_lock(tmp_path,
                                                                               monkeypatch):
    """A read-only folder (here: the lock file's open fails with EROFS, as on a read-only
    mount, where root too is refused): the error names the folder, and does not tell the
    user to remove a lock file that is not there. Red with the old one message."""
    import errno

    real_open = os.open

    def read_only(path, flags, *a, **kw):
        if str(path).endswith(".out.lock"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *a, **kw)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(LockedError) as err, lock.exclusive(tmp_path / "out"):
        pass
    msg = str(err.value)
    assert f"cannot write its lock file in {tmp_path}" in msg and "Read-only" in msg
    assert "remove it" not in msg and not (tmp_path / ".out.lock").exists()

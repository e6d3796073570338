"""Exclusive run locks on output and checkpoint folders.

Two runs writing one folder destroy each other's work: each replaces the other's output, and a
checkpoint pruner deletes the other run's steps. `exclusive(path)` holds, for a run's length, a
kernel lock (flock, taken through filelock, which handles the open/flock/unlink races) on the
sibling file `PARENT/.NAME.lock`: a sibling, so that `path` itself can still be replaced
atomically while it is locked. The file records the holder (pid, host, start, purpose, argv) for
the message the next run gets; a second run fails at once, it never waits.

The kernel drops a lock when its holder dies, however it dies, so a lock file whose lock is free
but which still names a holder was left by a run that crashed (or was killed): it is taken over
with a warning on the "lrm" logger. Release removes the file only while it still names this run.

One process locks a path once. A second `exclusive` on a path this process already holds (nested
code, another thread) is a LockedError, not a re-entry: two parts of one run both believing they
own a folder is the very bug the lock is there to catch, so stages take the locks and library
code does not. Different paths nest freely; `exclusive_all` takes several in sorted order and
releases those it took if one is busy.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import filelock

from lrm.errors import LockedError

_log = logging.getLogger("lrm")


@dataclass(frozen=True)
class LockInfo:
    """Who holds a lock: what the lock file says while it is held."""

    path: Path  # the locked folder (resolved)
    lock_file: Path
    pid: int
    host: str
    started: str  # ISO time, UTC
    purpose: str
    argv: tuple[str, ...]

    def record(self) -> dict[str, Any]:
        """The lock file's content."""
        return {"pid": self.pid, "host": self.host, "started": self.started,
                "purpose": self.purpose, "argv": list(self.argv), "path": str(self.path)}


_held: dict[Path, LockInfo] = {}  # lock files this process holds
_guard = threading.Lock()


def _after_fork() -> None:
    # A forked child holds none of its parent's locks (it would fail on them like any process).
    global _guard
    _guard = threading.Lock()
    _held.clear()


os.register_at_fork(after_in_child=_after_fork)


def lock_file(path: Path) -> Path:
    """The lock file of `path`: `PARENT/.NAME.lock`, with `path` resolved (symlinks followed, so
    two names of one folder share one lock)."""
    p = Path(path).expanduser().resolve()
    if not p.name:
        raise ValueError(f"cannot lock {path}: it has no parent folder to hold a lock file")
    return p.parent / f".{p.name}.lock"


def _read_record(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_bytes() or b"null")
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _describe(rec: dict[str, Any]) -> str:
    purpose = f" ({rec['purpose']})" if rec.get("purpose") else ""
    return (f"pid {rec.get('pid', '?')} on {rec.get('host', '?')} since "
            f"{rec.get('started', '?')}{purpose}")


def _pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def exclusive(path: Path, *, purpose: str = "") -> Iterator[LockInfo]:
    """Hold the lock on `path` (a folder lrm writes) for the block; yield the holder record.

    Raises LockedError at once when another process holds it (naming its pid, host, start and
    purpose), or when this process already does. Creates the parent folder if needed, and
    removes what it created if it is still empty at the end (a failed run leaves no folder).
    """
    target = Path(path).expanduser().resolve()
    lf = lock_file(target)
    me = LockInfo(target, lf, os.getpid(), socket.gethostname(),
                  datetime.now(timezone.utc).isoformat(timespec="seconds"), purpose,
                  tuple(sys.argv))
    with _guard:
        mine = _held.get(lf)
        if mine is not None:
            raise LockedError(f"{target} is already locked by this process "
                              f"({_describe(mine.record())}); lock each folder once per run")
        _held[lf] = me
    made = [d for d in (lf.parent, *lf.parent.parents) if not d.exists()]  # innermost first
    try:
        lf.parent.mkdir(parents=True, exist_ok=True)
        found: dict[str, Any] = {}

        def on_acquired(fd: int) -> None:
            # what a holder that never released left, then our record in its place
            found["previous"] = os.pread(fd, os.fstat(fd).st_size, 0)
            data = (json.dumps(me.record(), sort_keys=True) + "\n").encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            st = os.fstat(fd)
            found["inode"] = (st.st_dev, st.st_ino)

        lock = filelock.FileLock(str(lf), blocking=False, thread_local=False,
                                 on_acquired=on_acquired)
        try:
            lock.acquire()
        except filelock.Timeout:
            rec = _read_record(lf)
            who = _describe(rec) if rec else "another process (it has not written its details yet)"
            raise LockedError(f"{target} is in use by {who}; wait for it or stop it "
                              f"(lock file {lf})") from None
        except OSError as e:  # filelock opens with O_NOFOLLOW: a symlink is never followed
            why = f"a symbolic link to {os.readlink(lf)}; lrm never follows one" \
                if lf.is_symlink() else e.strerror or str(e)
            if lf.is_symlink() or lf.exists():  # a file in the way: someone's, or stale
                raise LockedError(f"{target}: cannot take its lock file {lf} ({why}); remove "
                                  f"it if no run of lrm is using {target}") from None
            raise LockedError(f"{target}: cannot write its lock file in {lf.parent} ({why}); "
                              f"choose a folder lrm may write in, or fix its permissions"
                              ) from None
        try:
            if found["previous"].strip():
                _took_over(target, found["previous"])
            yield me
        finally:
            _remove_if_ours(lf, found["inode"], me)
            lock.release()
    finally:
        with _guard:
            _held.pop(lf, None)
        for d in made:  # the folders made for the lock file, unless the run left files there
            try:
                d.rmdir()
            except OSError:  # not empty (or already gone): it is no longer only ours
                break


def _took_over(target: Path, previous: bytes) -> None:
    try:
        rec = json.loads(previous)
    except ValueError:
        rec = None
    if not isinstance(rec, dict):
        _log.warning("%s: took over a stale lock file left by an unknown process", target)
        return
    here = rec.get("host") == socket.gethostname()
    state = ("dead" if not _pid_alive(rec.get("pid")) else "alive but not holding it") if here \
        else "on another host"
    _log.warning("took over the stale lock of pid %s on %s (%s; %s, since %s)",
                 rec.get("pid"), rec.get("host"), state, target, rec.get("started"))


def _remove_if_ours(lf: Path, inode: tuple[int, int], me: LockInfo) -> None:
    """Unlink the lock file while still holding the lock, only if it is the file we locked and
    still names us (a user may have deleted it and another run locked a new one meanwhile)."""
    try:
        st = os.stat(lf)
        if (st.st_dev, st.st_ino) == inode and _read_record(lf) == me.record():
            os.unlink(lf)
    except FileNotFoundError:
        pass


@contextlib.contextmanager
def exclusive_all(paths: Iterable[Path], purpose: str = "") -> Iterator[list[LockInfo]]:
    """Hold the locks on all `paths` (duplicates once) for the block, taken in sorted order;
    if one is busy, those already taken are released and the LockedError propagates."""
    targets = sorted({lock_file(p): Path(p) for p in paths}.items())
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(exclusive(p, purpose=purpose)) for _, p in targets]

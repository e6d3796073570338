"""Atomic, owned outputs: nothing half-written is ever visible under its final name, and nothing
lrm did not write is ever replaced.

Parquet has no transactions and `write_parquet` truncates in place, so every output is written
to a sibling temporary path, checked, and renamed into place.

Ownership: lrm replaces a path only when it can tell that lrm wrote what is there now.
- A folder written by `atomic_dir` carries MARKER (`.lrm-output.json`): the stage that wrote it,
  the lrm version, when, and the files it held, each with its size, sha256 and mtime. It may be
  replaced by the same stage (or, from a caller that names no stage, by any), and only while it
  holds no file lrm did not write: a user's notes dropped into a model folder, or a file of it
  the user replaced or edited (its hash differs; the hash is read again only when the size or
  mtime moved), stop the replace. An empty folder holds nothing to lose and may be replaced too.
- A writer that names no stage records the stage running (stagekit's runner says which, for
  the length of a stage's run: `running`), else "lrm".
- A file written by `write_text`/`write_json`/`write_parquet` is listed in its folder's LEDGER
  (`.lrm-written.json`) with the stage and its sha256. It may be overwritten only while it still
  has that hash (lrm wrote it and nobody changed it since) and, when the writer names a stage,
  only by that stage. Files written inside an `atomic_dir` temporary folder skip the ledger: the
  folder is lrm's until it is renamed into place, and hashing every Parquet part there would
  only cost time.
Anything else (a user's folder or file, another stage's output, a symbolic link) is an
OutputError, exit status 2, naming the path and `--force`. `force=True` replaces it: the user
asked for exactly that.

`check_paths` refuses outputs that are, lie inside or contain an input (or each other), before
anything is touched: no `--force` makes replacing one's own input safe.
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import hashlib
import itertools
import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

import lrm
from lrm.errors import DataError, OutputError

if TYPE_CHECKING:  # torch only where tensors are written (save_tensors)
    import torch

MARKER = ".lrm-output.json"
LEDGER = ".lrm-written.json"
ANY_STAGE = "lrm"  # what a writer that names no stage records

_log = logging.getLogger("lrm")
_TMP_DIR = re.compile(r"^\..+\.tmp-[0-9a-f]{8}$")  # atomic_dir's temporary folder names
_LOCK_FILE = re.compile(r"^\..+\.lock$")  # lrm.lock's files: PARENT/.NAME.lock

Stage = str | Iterable[str] | None
_running: contextvars.ContextVar[str | None] = contextvars.ContextVar("lrm_stage", default=None)


@contextlib.contextmanager
def running(stage: str) -> Iterator[None]:
    """Writers inside the block that name no stage record `stage` (the stage being run)."""
    token = _running.set(stage)
    try:
        yield
    finally:
        _running.reset(token)


def _recorded(names: tuple[str, ...] | None) -> str:
    """The stage a writer records: the first it names, else the one running, else "lrm"."""
    return names[0] if names else (_running.get() or ANY_STAGE)


def fsync_dir(path: Path) -> None:
    """fsync a folder, so that renames into it are durable (best effort)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _names(stage: Stage) -> tuple[str, ...] | None:
    """The accepted stage names; None accepts any lrm stage."""
    if stage is None:
        return None
    names = (stage,) if isinstance(stage, str) else tuple(stage)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"stage must be a name or names, got {stage!r}")
    return names


def _who(names: tuple[str, ...] | None) -> str:
    return "lrm" if names is None else f"lrm {' or '.join(names)}"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------- folders


def _read_marker(folder: Path) -> dict[str, Any] | None:
    m = _read_json(folder / MARKER)
    return m if isinstance(m, dict) and isinstance(m.get("stage"), str) else None


def _files(folder: Path) -> Iterator[str]:
    """Every non-folder entry under `folder` (relative POSIX paths) but the marker, symlinks
    not followed, as the walk finds them (a caller may stop at the first)."""
    def unreadable(e: OSError) -> None:
        raise e  # never take a folder we cannot list for an empty one

    for d, dirs, files in os.walk(folder, onerror=unreadable):
        rel = Path(d).relative_to(folder)
        for n in [*files, *(n for n in dirs if os.path.islink(os.path.join(d, n)))]:
            if (x := (rel / n).as_posix()) != MARKER:
                yield x


def _listing(folder: Path) -> list[str]:
    """Every non-folder entry under `folder`, sorted (see `_files`)."""
    return sorted(_files(folder))


def _record(path: Path) -> dict[str, Any]:
    """What a marker keeps of a file it lists: size, sha256 and mtime (a symlink: its target)."""
    st = os.lstat(path)
    if os.path.islink(path):
        return {"symlink": os.readlink(path)}
    return {"bytes": st.st_size, "sha256": read_sha256(path), "mtime_ns": st.st_mtime_ns}


def _changed(path: Path, rec: Any) -> bool:
    """Whether the file at `path` is no longer what lrm recorded (`_record`, or a ledger
    entry). The hash is read again only when the size or the mtime moved."""
    if not isinstance(rec, dict):
        return False  # a listing of names only (markers before hashes): the name is all
    if "symlink" in rec:
        return not (os.path.islink(path) and os.readlink(path) == rec["symlink"])
    st = os.lstat(path)
    if os.path.islink(path) or st.st_size != rec.get("bytes"):
        return True
    return st.st_mtime_ns != rec.get("mtime_ns") and read_sha256(path) != rec.get("sha256")


def _foreign(folder: Path, marker: dict[str, Any]) -> list[str]:
    """Files under an lrm folder that lrm did not write: not in its marker's listing (or
    changed since it was written), not in their folder's ledger, not lrm's own bookkeeping,
    and not accounted for by a nested folder's own marker (say a day folder written later
    by another atomic_dir)."""
    listed = marker.get("files")
    if isinstance(listed, list):  # a marker before hashes: names only
        listed = dict.fromkeys(listed)
    if not isinstance(listed, dict):
        return []  # a marker without a listing: everything in the folder counts as lrm's
    found: list[str] = []

    def scan(d: Path, rel: str) -> None:
        with os.scandir(d) as it:
            entries = sorted(it, key=lambda e: e.name)
        ledger = _read_ledger(d) if any(e.name == LEDGER for e in entries) else {}
        for e in entries:
            r = rel + e.name
            if e.is_dir(follow_symlinks=False):
                nested = _read_marker(Path(e.path))
                if nested is None:
                    scan(Path(e.path), r + "/")
                else:
                    found.extend(f"{r}/{x}" for x in _foreign(Path(e.path), nested))
            elif r in listed:
                if _changed(Path(e.path), listed[r]):
                    found.append(f"{r} (changed since lrm wrote it)")
            elif e.name in ledger:
                if _changed(Path(e.path), ledger[e.name]):
                    found.append(f"{r} (changed since lrm wrote it)")
            elif not (e.name in (MARKER, LEDGER) or _is_lock_file(Path(e.path))):
                found.append(r)

    scan(folder, "")
    return found


def _is_lock_file(path: Path) -> bool:
    """A lock file lrm.lock left (a run locking a folder inside this one was killed)."""
    if not _LOCK_FILE.match(path.name) or path.is_symlink():
        return False
    rec = _read_json(path) if path.stat().st_size < 65536 else None
    return isinstance(rec, dict) and {"pid", "host", "started"} <= rec.keys()


def _why_not_replaceable(out: Path, names: tuple[str, ...] | None) -> str | None:
    who = _who(names)
    if out.is_symlink():
        return f"not written by {who} (it is a symbolic link to {os.readlink(out)})"
    if not out.exists():
        return None
    if not out.is_dir():
        return f"not written by {who} (it is a file)"
    marker = _read_marker(out)
    if marker is None:  # a file or two are enough to refuse: never walk a stranger's tree
        seen = list(itertools.islice(_files(out), 2))
        shown = seen[0] + (" and more" if len(seen) > 1 else "") if seen else ""
        return None if not seen else f"not written by {who} (it holds {shown})"
    if names is not None and marker["stage"] not in names:
        return f"not written by {who} (it was written by stage {marker['stage']})"
    foreign = _foreign(out, marker)
    if foreign:
        return (f"not written by {who} (it holds {_plural(len(foreign), 'file')} lrm did not "
                f"write, e.g. {foreign[0]})")
    return None


def check_replaceable(out: Path, stage: Stage, *, force: bool = False,
                      option: str = "--out") -> None:
    """Raise OutputError unless lrm may replace `out` for `stage` (a name, several names, or
    None for any lrm stage).

    Replaceable: an absent path; an empty folder; a folder whose marker names one of the stages
    and which holds no file lrm did not write. Not replaceable: a folder without marker, or
    written by another stage, or with a user's files in it; a plain file; a symbolic link.
    `force=True` makes everything replaceable (the user asked to replace it). `option`: the
    command-line option that named `out`, said in the error.
    """
    names = _names(stage)
    if force:
        return
    out = Path(out)
    try:
        why = _why_not_replaceable(out, names)
    except OSError as e:
        why = f"lrm cannot tell what it holds ({e.strerror}: {e.filename})"
    if why is not None:
        raise OutputError(f"{out}: {why}; pass --force to replace it, or choose another "
                          f"{option}")


def _write_marker(folder: Path, stage: str, files: list[str] | None) -> None:
    doc: dict[str, Any] = {"stage": stage, "lrm": getattr(lrm, "__version__", "0"),
                           "written": _now()}
    if files is not None:
        doc["files"] = {f: _record(folder / f) for f in files}
    (folder / MARKER).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    if os.path.lexists(path):
        _log.warning("could not remove the replaced %s; delete it by hand", path)


@contextlib.contextmanager
def atomic_dir(out: Path, *, stage: Stage = None, force: bool = False) -> Iterator[Path]:
    """Yield a fresh temporary folder that replaces `out` only if the block succeeds.

    Before anything is created, `out` must be replaceable by `stage` (check_replaceable), and
    again before the rename (the block may run for hours). The folder gets MARKER naming the
    stage (the first name if several; "lrm" when none is given) and listing its files.
    `stage=None` is the default of the callers written before markers: it still writes a
    marker and replaces any lrm-marked folder, but never a folder without one.
    On any exception the temporary folder is removed and `out` is left exactly as it was
    (absent if it was absent).
    """
    out = Path(out)
    names = _names(stage)
    check_replaceable(out, names, force=force)
    recorded = _recorded(names)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        _write_marker(tmp, recorded, None)  # also tells the file writers they are in lrm's temp
        yield tmp
        _write_marker(tmp, recorded, _listing(tmp))
        check_replaceable(out, names, force=force)  # someone may have put something there since
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _named(e, out) from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if os.path.lexists(out):
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        os.replace(out, old)
    os.replace(tmp, out)
    fsync_dir(out.parent)
    if old is not None:
        _remove(old)


def remove_leftovers(out: Path) -> list[Path]:
    """Remove what a run writing `out` that was killed left beside it: atomic_dir's temporary
    folder (`.OUT.tmp-XXXXXXXX`, with the spill files of an ingest inside) and a replaced
    output not yet removed (`.OUT.old-XXXXXXXX`), each named so and holding lrm's MARKER
    (nothing else is touched). Call it holding `out`'s lock (lrm.lock): then no live run is
    writing them. Returns what was removed."""
    out = Path(out)
    ours = re.compile(rf"^\.{re.escape(out.name)}\.(tmp|old)-[0-9a-f]{{8}}$")
    gone = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in out.parent.iterdir():
            if ours.match(entry.name) and not entry.is_symlink() and entry.is_dir() \
                    and (entry / MARKER).is_file():
                shutil.rmtree(entry, ignore_errors=True)
                _log.info("removed %s, left by a run of %s that was stopped", entry, out)
                gone.append(entry)
    return gone


SCRATCH_TAG = ".lrm-scratch"  # in a scratch folder: the process that made it


def _stale_scratch(folder: Path) -> bool:
    """Whether `folder` is a scratch folder whose process is gone (or its pid reused since)."""
    try:
        pid = int((folder / SCRATCH_TAG).read_text())
        made = (folder / SCRATCH_TAG).stat().st_mtime
    except (OSError, ValueError):
        return False  # not one of ours, or being made
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # another user's process (a folder of ours would not be): leave it
    with contextlib.suppress(OSError):  # Linux: a process started after the folder was made
        return os.stat(f"/proc/{pid}").st_mtime > made + 1  # holds a reused pid
    return False


@contextlib.contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A temporary folder (the system's temp) removed after the block, like
    tempfile.TemporaryDirectory; and the ones of `prefix` that killed processes left behind
    (a SIGKILLed stream day left a 5-8 MB lrm-champion-* each time) are removed first. A
    folder is recognised by its name and the SCRATCH_TAG file naming its process."""
    import tempfile

    root = Path(tempfile.gettempdir())
    with contextlib.suppress(OSError):
        for entry in root.glob(f"{prefix}*"):
            if entry.is_dir() and not entry.is_symlink() and _stale_scratch(entry):
                shutil.rmtree(entry, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    try:
        (tmp / SCRATCH_TAG).write_text(str(os.getpid()))
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------- files


def unit_folder(folder: Path) -> Path:
    """`folder` emptied, where it is or lies inside an atomic_dir temporary folder (its marker
    kept): the folder a unit
    of lrm.fanout writes whole (a day). A unit run again (its worker process killed in the
    middle, its task rerun) starts from nothing, so no file of the killed try (a temporary
    file not yet renamed) is left in the output. Anywhere else it is left as it is."""
    folder = Path(folder)
    if not folder.exists():
        return folder
    if _TMP_DIR.match(folder.name) and (folder / MARKER).is_file():  # the temporary folder
        for entry in folder.iterdir():
            if entry.name != MARKER:
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() \
                    else entry.unlink()
    elif _in_atomic_tmp(folder):
        shutil.rmtree(folder)
    return folder


def _in_atomic_tmp(path: Path) -> bool:
    """Whether `path` lies inside an atomic_dir temporary folder (named so, with a marker)."""
    return any(_TMP_DIR.match(a.name) and (a / MARKER).is_file() for a in path.parents)


def _read_ledger(folder: Path) -> dict[str, dict[str, Any]]:
    path = folder / LEDGER
    if not path.exists():
        return {}
    doc = _read_json(path)
    if not isinstance(doc, dict):
        _log.warning("%s is unreadable; lrm treats the files there as not its own", path)
        return {}
    return {k: v for k, v in doc.items() if isinstance(v, dict)}


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Hold an flock on the folder itself while its ledger is read, changed and replaced, so that
    writers in several processes (stages writing metrics/) never lose each other's entries."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


def read_sha256(path: Path) -> str:
    """The file's sha256 (hex): its bytes read now, in blocks (recorded_sha256 takes lrm's
    record of a file it wrote instead)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class _Hashing:
    """A write-only file that hashes and counts what goes through it."""

    def __init__(self, f: Any) -> None:
        self.f, self.sha, self.size = f, hashlib.sha256(), 0
        self.error: OSError | None = None  # the first failed write (torch hides it)

    def write(self, b: bytes) -> int:
        self.sha.update(b)
        self.size += len(b)
        try:
            return self.f.write(b)
        except OSError as e:
            self.error = self.error or e
            raise

    def flush(self) -> None:
        self.f.flush()


def save_tensors(tensors: Mapping[str, torch.Tensor], path: Path) -> dict[str, Any]:
    """torch.save a flat {name: tensor} to `path`, fsynced; its {"bytes", "sha256"}.

    A write that fails (a full disk) raises the OSError itself: torch's zip writer would
    report it as `[enforce fail at inline_container.cc] unexpected pos`, which never says
    why."""
    import torch

    with open(path, "wb") as f:
        w = _Hashing(f)
        try:
            torch.save(dict(tensors), w)
        except RuntimeError:
            if w.error is not None:
                raise w.error from None
            raise
        f.flush()
        os.fsync(f.fileno())
    return {"bytes": w.size, "sha256": w.sha.hexdigest()}


def source_fingerprint(files: Sequence[Path]) -> list[dict[str, Any]]:
    """[{file, bytes, sha256}] of a day's input files: what a derived day records it was
    made from (augment's manifest, dedup's stamp), to redo it when they change."""
    return [{"file": Path(f).name, "bytes": Path(f).stat().st_size, "sha256": read_sha256(f)}
            for f in files]


def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


def _check_file(path: Path, names: tuple[str, ...] | None, force: bool) -> None:
    if path.is_dir() and not path.is_symlink():
        raise OutputError(f"{path}: is a folder, not a file; choose another path")
    if force:
        return
    how = "pass --force to replace it, or choose another path"
    if path.is_symlink():
        raise OutputError(f"{path}: not written by {_who(names)} (it is a symbolic link to "
                          f"{os.readlink(path)}); {how}")
    if not path.exists():
        return
    entry = _read_ledger(path.parent).get(path.name)
    if entry is None:
        raise OutputError(f"{path}: not written by {_who(names)} (lrm has no record of writing "
                          f"this file); {how}")
    if names is not None and entry.get("stage") not in names:
        raise OutputError(f"{path}: not written by {_who(names)} (it was written by stage "
                          f"{entry.get('stage')}); {how}")
    if _changed(path, entry):
        raise OutputError(f"{path}: changed since lrm {entry.get('stage')} wrote it; {how}")


def _write_file(path: Path, fill: Callable[[Path], str | None], stage: Stage,
                force: bool) -> int:
    """Write `path` through a sibling temporary that `fill` writes (returning its sha256, or
    None to have it hashed here), check that lrm may replace what is there, rename, record in the
    ledger. Returns the bytes written."""
    path = Path(path)
    names = _names(stage)
    path.parent.mkdir(parents=True, exist_ok=True)
    owned = _in_atomic_tmp(path)
    if not owned:
        _check_file(path, names, force)  # fail before the work
    seen = _signature(path)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        digest = fill(tmp)
        size = tmp.stat().st_size
        if owned:
            os.replace(tmp, path)
        else:
            digest = digest or read_sha256(tmp)
            with _locked(path.parent):
                if _signature(path) != seen:  # changed while we wrote: decide again
                    _check_file(path, names, force)
                os.replace(tmp, path)
                ledger = _read_ledger(path.parent)
                ledger[path.name] = {"stage": _recorded(names), "sha256": digest, "bytes": size,
                                     "mtime_ns": os.lstat(path).st_mtime_ns}
                _write_ledger(path.parent, ledger)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise _named(e, path) from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return size


def _named(err: OSError, path: Path) -> OSError:
    """`err` naming the output being written when it names no file (pyarrow's do not)."""
    if err.filename is not None or err.errno is None:
        return err
    return type(err)(err.errno, os.strerror(err.errno), str(path))


def _write_ledger(folder: Path, ledger: dict[str, dict[str, Any]]) -> None:
    tmp = folder / f"{LEDGER}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        tmp.write_text(json.dumps(ledger, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, folder / LEDGER)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_parquet(table: pa.Table, path: Path, *, stage: str | None = None, force: bool = False,
                  file_metadata: dict[bytes, bytes] | None = None, **kwargs: Any) -> int:
    """Write `table` to `path` atomically; return the bytes written.

    file_metadata: key-value pairs for the file's footer only (not its Arrow schema's
    metadata, which pyarrow also stores in the footer: a large value would be there twice).
    The footer is read back and its row count checked before the rename. An existing file is
    replaced only if lrm wrote it (see the module doc); inside an atomic_dir temporary folder
    there is no check and no hashing.
    """
    kwargs.setdefault("compression", "zstd")

    row_group_size = kwargs.pop("row_group_size", None)

    def fill(tmp: Path) -> None:
        with pq.ParquetWriter(tmp, table.schema, **kwargs) as w:  # pq.write_table's own path
            w.write_table(table, row_group_size=row_group_size)
            if file_metadata:
                w.add_key_value_metadata(file_metadata)
        rows = pq.read_metadata(tmp).num_rows
        if rows != table.num_rows:
            raise OSError(f"{tmp}: wrote {rows} rows, expected {table.num_rows}")

    return _write_file(path, fill, stage, force)


def write_text(text: str, path: Path, *, stage: str | None = None, force: bool = False) -> None:
    """Write a text file atomically (a sibling temporary, then a rename); an existing file is
    replaced only if lrm wrote it (see the module doc)."""
    data = text.encode()

    def fill(tmp: Path) -> str:
        tmp.write_bytes(data)
        return hashlib.sha256(data).hexdigest()

    _write_file(path, fill, stage, force)


def write_bytes(data: bytes, path: Path, *, stage: str | None = None,
                force: bool = False) -> None:
    """Write a binary file (e.g. a PNG) atomically, as write_text."""
    def fill(tmp: Path) -> str:
        tmp.write_bytes(data)
        return hashlib.sha256(data).hexdigest()

    _write_file(path, fill, stage, force)


def check_file_replaceable(path: Path, stage: Stage, *, force: bool = False) -> None:
    """Raise OutputError unless lrm may overwrite the file `path` for `stage` (the rule of
    write_text; for checking every output of a run before it starts)."""
    path = Path(path)
    if not _in_atomic_tmp(path):
        _check_file(path, _names(stage), force)


def claim_dir(path: Path, stage: Stage, *, force: bool = False, option: str = "--out"
              ) -> list[Path]:
    """Make `path` a folder `stage` keeps and adds to run after run (checkpoints, the
    augmented days): created with a marker that names the stage and lists no files (the
    stage manages what is inside), or checked to be one already (check_replaceable).
    Returns the folders this call created, `path` first, then its new parents ([] when
    `path` was there; see `release_claim`)."""
    path = Path(path)
    names = _names(stage)
    check_replaceable(path, names, force=force, option=option)
    marker = _read_marker(path) if path.is_dir() else None
    if marker is not None and (names is None or marker["stage"] in names):
        return []  # already the stage's (what it adds later carries its own markers)
    if path.is_symlink() or (path.exists() and not path.is_dir()):  # force: replace it
        _remove(path)
    created = [d for d in (path, *path.parents) if not d.exists()]  # innermost first
    path.mkdir(parents=True, exist_ok=True)
    _write_marker(path, _recorded(names), None)
    return created


def start_over(path: Path, stage: str) -> None:
    """Make `path` a folder `stage` keeps (claim_dir) with nothing of an earlier run in it:
    removed first when it is the stage's, else each folder in it that is the stage's (one
    lrm made without a marker of its own holds them). Nothing lrm did not write goes: a
    folder holding anyone else's is refused by claim_dir."""
    path = Path(path)
    if owned_by_lrm(path) == stage:
        shutil.rmtree(path)
    elif path.is_dir() and not path.is_symlink():
        for p in path.iterdir():
            if p.is_dir() and owned_by_lrm(p) == stage:
                shutil.rmtree(p)
    claim_dir(path, stage)


def marked_by_claim(path: Path) -> bool:
    """Whether `claim_dir(path, ...)` would mark a folder that is there already (a user's
    empty folder): `unmark` undoes it when the run fails before writing."""
    path = Path(path)
    return path.is_dir() and not path.is_symlink() and _read_marker(path) is None


def unmark(path: Path) -> None:
    """Take back the marker a claim put in a folder that was there before, while nothing but
    it is inside (a run that failed before writing leaves the folder as it found it)."""
    with contextlib.suppress(OSError):
        if _listing(Path(path)) == [] and _read_marker(Path(path)) is not None:
            (Path(path) / MARKER).unlink()


def release_claim(created: Sequence[Path]) -> None:
    """Undo a `claim_dir` that created these folders (its return), when nothing but its
    marker is in the first and nothing else in the rest: a run that failed before writing
    anything leaves no trace, not even the parent `checkpoints/` of `checkpoints/student`."""
    if not created:
        return
    path = Path(created[0])
    with contextlib.suppress(OSError):
        if path.is_dir() and not path.is_symlink() and _listing(path) == [] \
                and _read_marker(path) is not None:
            (path / MARKER).unlink()
            path.rmdir()
            for parent in created[1:]:
                Path(parent).rmdir()  # OSError when not empty: stop there


def write_json(obj: Any, path: Path, *, stage: str | None = None, force: bool = False) -> None:
    """Write JSON atomically (sorted keys, trailing newline), as write_text."""
    write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", path, stage=stage, force=force)


# ---------------------------------------------------------------- paths


def replaceable(path: Path, stage: Stage = None) -> bool:
    """Whether lrm may replace `path` for `stage` without --force (check_replaceable)."""
    try:
        return _why_not_replaceable(Path(path), _names(stage)) is None
    except OSError:
        return False


def owned_by_lrm(path: Path) -> str | None:
    """The stage that wrote `path` (a marked folder, or a ledgered file unchanged since), else
    None."""
    path = Path(path)
    if path.is_symlink():
        return None
    if path.is_dir():
        marker = _read_marker(path)
        return None if marker is None else marker["stage"]
    if not path.is_file():
        return None
    entry = _read_ledger(path.parent).get(path.name)
    if entry is None or _changed(path, entry):
        return None
    stage = entry.get("stage")
    return stage if isinstance(stage, str) else None


def _written(path: Path) -> dict[str, Any] | None:
    """What lrm recorded of the file when it wrote it (its folder's ledger, or the marker of
    the lrm folder holding it), while the file is unchanged since; else None."""
    rec = _read_ledger(path.parent).get(path.name)
    if rec is None:
        for folder in path.parents:
            marker = _read_marker(folder)
            if marker is not None:
                listed = marker.get("files")
                rel = path.relative_to(folder).as_posix()
                rec = listed.get(rel) if isinstance(listed, dict) else None
                break
    ok = isinstance(rec, dict) and "sha256" in rec and not _changed(path, rec)
    return rec if ok else None  # type: ignore[return-value]


def written_by_lrm(path: Path) -> bool:
    """Whether lrm wrote the file as it is now (recorded with its hash, unchanged since)."""
    return _written(Path(path)) is not None


def record_dir(folder: Path, stage: str = ANY_STAGE) -> None:
    """Write `folder`'s MARKER listing its files: for a folder lrm itself just made from
    bytes it verified against another record (a registered model's content hash)."""
    _write_marker(Path(folder), stage, _listing(Path(folder)))


def verify_recorded(folder: Path, names: Sequence[str]) -> None:
    """Raise DataError naming the file unless each of `names` in `folder` has the sha256 that
    lrm recorded when it wrote it: in the MARKER of `folder` or of the nearest lrm folder
    holding it (model folders written inside a stage's output). Hashed here in full: a file
    copied over with its mtime kept is caught too. What is loaded is what was written."""
    folder = Path(folder)
    home = next((d for d in (folder, *folder.resolve().parents)
                 if _read_marker(d) is not None), None)
    marker = _read_marker(home) if home is not None else None
    listed = marker.get("files") if marker is not None else None
    if home is None or not isinstance(listed, dict):
        why = "missing" if home is None else f"{home / MARKER} holds no file hashes"
        raise DataError(folder / MARKER, None, None, f"{why}: lrm cannot tell that this "
                        f"folder's files are the ones it wrote; refused unread (copy a folder "
                        f"whole, its {MARKER} too, or write it again)")
    for name in names:
        path = folder / name
        rel = path.resolve().relative_to(home.resolve()).as_posix() if home != folder else name
        rec = listed.get(rel)
        if not isinstance(rec, dict) or "sha256" not in rec:
            raise DataError(path, None, None, f"not recorded in {home / MARKER}: not a file "
                                              f"lrm wrote there; refused unread")
        try:
            now = read_sha256(path)
        except FileNotFoundError:
            raise DataError(path, None, None, f"missing (recorded in {MARKER})") from None
        if now != rec["sha256"]:
            raise DataError(path, None, None, f"changed since lrm wrote it (sha256 "
                            f"{rec['sha256'][:12]} recorded in {MARKER}, {now[:12]} now): "
                            f"refused unread; restore it or write the folder again")


def recorded_sha256(path: Path) -> str:
    """The sha256 of a file as lrm recorded it when it wrote the file, while it is unchanged
    (a dataset's identity without rereading it); else read now (read_sha256)."""
    rec = _written(Path(path))
    return str(rec["sha256"]) if rec is not None else read_sha256(path)


def _real(path: Path) -> Path:
    return Path(path).expanduser().resolve()


def _overlap(a: Path, b: Path) -> str | None:
    """How resolved path `a` relates to resolved path `b`, if they overlap."""
    if a == b:
        return "is the same path as"
    if b in a.parents:
        return "lies inside"
    if a in b.parents:
        return "contains"
    return None


def _shown(p: Path, real: Path) -> str:
    return f"{p}" if Path(os.path.abspath(p)) == real else f"{p} (= {real})"


def _linked(folder: Path) -> Iterator[tuple[Path, Path]]:
    """(link, its target resolved) of every symbolic link under `folder` (not followed): an
    input read through a linked day folder reads its target too."""
    if not folder.is_dir() or folder.is_symlink():
        return
    for d, dirs, files in os.walk(folder, onerror=lambda e: None):
        for n in (*dirs, *files):
            if os.path.islink(p := os.path.join(d, n)):
                yield Path(p), Path(p).resolve()


def _input_forms(p: Path) -> Iterator[tuple[Path, Path]]:
    """(as shown, as compared) of an input: its path as written (absolute, links not
    followed), resolved, and the targets of the links under it."""
    yield p, Path(os.path.abspath(p))
    yield p, _real(p)
    for link, target in _linked(_real(p)):
        yield link, target


def check_paths(inputs: Iterable[Path], outputs: Iterable[Path]) -> None:
    """Raise OutputError when an output is, lies inside or contains an input, or overlaps
    another output (two equal outputs included); paths are compared as written and resolved
    (symbolic links followed, the links under an input folder too: a day folder linked into
    an input is read, so an output inside its target would overwrite the input). Call it
    before anything is written."""
    ins = [form for p in inputs for form in _input_forms(Path(p))]
    outs = [(Path(p), _real(p)) for p in outputs]
    for o, ro in outs:
        for ao in dict.fromkeys([Path(os.path.abspath(o)), ro]):  # as written first
            for i, ri in ins:
                how = _overlap(ao, ri)
                if how is not None:
                    raise OutputError(
                        f"output {_shown(o, ro)} {how} input {_shown(i, ri)}: writing it "
                        "would destroy the input; choose an --out outside every input "
                        "(--force does not apply)")
    for k, (a, ra) in enumerate(outs):
        for b, rb in outs[k + 1:]:
            how = _overlap(ra, rb)
            if how is not None:
                raise OutputError(f"output {_shown(a, ra)} {how} output {_shown(b, rb)}: one "
                                  "would replace the other; give each output its own path")


def in_order(paths: Iterable[str | Path]) -> list[Path]:
    """Paths with their numbers compared as numbers (day2 before day10): where files are
    days (`--days file`, the stream's inbox), file k is day k. (A regex: the natsort package
    would be a dependency for three lines.)"""
    def key(p: Path) -> list[tuple[int, int, str]]:
        return [(0, int(t), t) if t.isdigit() else (1, 0, t)
                for t in re.split(r"(\d+)", str(p)) if t]
    return sorted(map(Path, paths), key=key)


def dir_bytes(path: Path) -> int:
    """Total size of the regular files under `path`, lrm's bookkeeping (marker, ledger) aside."""
    return sum(p.stat().st_size for p in Path(path).rglob("*")
               if p.is_file() and p.name not in (MARKER, LEDGER))

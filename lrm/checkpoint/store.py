"""lrm's checkpoint folders on disk: names, manifests, atomic commit, verification, retention.

    ROOT/000001-step-20/      a checkpoint: seq 1 (a counter over the folder), training step 20
        rows-0.pt             rank 0's embedding rows: ids, (quantized) rows, row-wise state
        rows-1.pt             rank 1's
        state.pt              rank 0: dense parameters, dense optimizer state, train state,
                              data position (exact)
        part-0.json part-1.json   each rank's list of the files it wrote (size, sha256)
        manifest.json         written last: what the checkpoint is (baseline or delta, its
                              parent and the parent manifest's sha256, the chain's baseline),
                              every file's size and sha256, and its own sha256
    ROOT/.tmp-000002-step-40-<nonce>/   a checkpoint being written

Every rank writes its files into the temporary folder, fsyncs them and writes its part
file; rank 0 waits for every part, writes the manifest, fsyncs, and renames the folder into
place (then fsyncs ROOT). A folder without a verified manifest is never read. A checkpoint
is removed by renaming it to ROOT/.old-NAME first, so a process stopped mid-removal leaves
no half-removed checkpoint; the next start removes .tmp- and .old- folders. Tensors are
`torch.save`d plain tensors loaded with `weights_only=True` (no pickle on the restore path;
safetensors is not installed), the exact ones zstd-packed as byte strings where smaller
(lrm.checkpoint.compress, unpacked only after the file's sha256 checks); metadata is JSON.

A manifest is believed only once it verifies itself: it carries the sha256 of its own
content (every other key, as canonical JSON), written in the same write as what it hashes,
so neither a torn write nor an edit leaves a matching pair; every path it names (`files`,
`dense.file`, `pieces[].file`) is a plain file name listed in `files`, so it lies inside
its folder and is hashed before any read. A delta names its parent and the parent
manifest's sha256: a parent replaced by another checkpoint breaks the chain.

A checkpoint is restorable when it and every ancestor up to its baseline verify (manifest
verified, every file a plain file present with its size and sha256). Retention keeps the
newest `keep` chains (ranked by their newest checkpoint) and the chains of pinned
checkpoints (the best validated state of a run, lrm.train.early_stop).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lrm.errors import ConfigError, LrmError, first_sentence
from lrm.io import fsync_dir, read_sha256

log = logging.getLogger("lrm")
# 3: exact tensors packed (lrm.checkpoint.compress), a piece of every row stores no ids;
# 2: the manifest's own sha256, its parent's; 1: neither
FORMAT = "lrm-checkpoint/3"
READABLE = (FORMAT, "lrm-checkpoint/2")  # 2's files are 3's with nothing packed
OLD_FORMATS = ("lrm-checkpoint/1",)
MANIFEST = "manifest.json"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_FINAL = re.compile(r"^(\d{6,})-step-(\d+)$")
_TEMP = re.compile(r"^\.tmp-(\d{6,})-step-(\d+)-([0-9a-f]+)$")
_GONE = re.compile(r"^\.old-(\d{6,})-step-(\d+)$")  # a checkpoint being removed
_LEGACY = re.compile(r"^step-(\d+)$")  # DCP checkpoints of lrm before this format
_PART = "part-{rank}.json"
COMMIT_TIMEOUT_S = 600.0  # how long rank 0 waits for the other ranks' shares


class CheckpointError(LrmError):
    """A checkpoint that is missing, incomplete or corrupt (the message names the file)."""


def final_name(seq: int, step: int) -> str:
    return f"{seq:06d}-step-{step}"


def temp_name(seq: int, step: int, nonce: str) -> str:
    return f".tmp-{final_name(seq, step)}-{nonce}"


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A file of save_tensors: weights-only (no pickle of objects), memory-mapped."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # noqa: BLE001  (any unreadable file is a bad checkpoint)
        raise CheckpointError(f"{path}: unreadable ({type(e).__name__}: "
                              f"{first_sentence(str(e))})") from None
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                            for k, v in obj.items()):
        raise CheckpointError(f"{path}: not a flat dict of tensors")
    return obj


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """The sha256 of a manifest's content: every key but "sha256", as canonical JSON."""
    body = {k: v for k, v in manifest.items() if k != "sha256"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def write_json_synced(obj: Any, path: Path) -> dict[str, Any]:
    data = (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode()
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@dataclass(frozen=True)
class Entry:
    """One checkpoint folder: its name's seq and step, and its manifest when readable."""

    path: Path
    seq: int
    step: int
    manifest: dict[str, Any] | None
    problem: str | None = None  # why the manifest is unusable

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def kind(self) -> str:
        return self.manifest["kind"] if self.manifest else "?"

    @property
    def parent(self) -> str | None:
        return self.manifest.get("parent") if self.manifest else None

    @property
    def chain(self) -> str | None:
        return self.manifest.get("chain") if self.manifest else None

    def strays(self) -> list[str]:
        """The files in this folder its manifest does not name: not lrm's (a user's note);
        [] without a readable manifest (then lrm cannot tell)."""
        if not self.manifest:
            return []
        own = {MANIFEST, *self.manifest.get("files", {})}
        return sorted(str(f.relative_to(self.path)) for f in self.path.rglob("*")
                      if not f.is_dir() and str(f.relative_to(self.path)) not in own)

    @property
    def bytes(self) -> int:
        if not self.manifest:
            return 0
        return sum(int(f["bytes"]) for f in self.manifest["files"].values())


def _safe_name(name: Any) -> bool:
    return isinstance(name, str) and bool(name) and "/" not in name and "\\" not in name \
        and name not in (".", "..") and "\0" not in name


def _count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _malformed(m: dict[str, Any]) -> str | None:
    """What is wrong with a (self-verified) manifest's structure, or None. Everything a
    restore reads from it is checked here first: every path it names is a file of its own
    listed in `files` (so inside the folder, and hashed), every offset and count a
    non-negative int."""
    from lrm.checkpoint.quantize import QUANTIZATIONS  # fbgemm: only when reading one

    files = m["files"]
    if not isinstance(files, dict) or not all(
            _safe_name(n) and isinstance(f, dict) and _count(f.get("bytes"))
            and isinstance(f.get("sha256"), str) and _SHA256.match(f["sha256"])
            for n, f in files.items()):
        return "files: not a list of plain file names with their bytes and sha256"
    if m["kind"] not in ("baseline", "delta"):
        return f"kind {m['kind']!r}"
    if m["kind"] == "delta" and not (_safe_name(m["parent"]) and _FINAL.match(m["parent"])
                                     and isinstance(m.get("parent_sha256"), str)):
        return "a delta without its parent's name and manifest sha256"
    if not (isinstance(m["chain"], str) and _FINAL.match(m["chain"])):
        return f"chain {m['chain']!r}"
    if m["quantize"] not in QUANTIZATIONS:
        return f"quantize {m['quantize']!r}"
    dense = m["dense"]
    if not (isinstance(dense, dict) and dense.get("file") in files
            and isinstance(dense.get("tensors"), dict) and isinstance(dense.get("values"), dict)):
        return "dense: its file is not one of the manifest's files"
    for key, t in dense["tensors"].items():
        if not (isinstance(t, list) and len(t) == 3 and isinstance(t[0], str) and _count(t[1])
                and isinstance(t[2], list) and all(_count(d) for d in t[2])):
            return f"dense tensor {key}: not [dtype, offset, shape]"
    if not isinstance(m["pieces"], list):
        return "pieces: not a list"
    for p in m["pieces"]:
        if not (isinstance(p, dict) and p.get("file") in files and isinstance(p.get("table"), str)
                and all(_count(p.get(k)) for k in ("group", "at", "rows", "c0", "c1"))
                and p["c0"] < p["c1"] and isinstance(p.get("states"), list)):
            return "pieces: a piece whose file is not one of the manifest's files, or bad counts"
    if not isinstance(m["tables"], dict):
        return "tables: not a mapping"
    return None


def _read_manifest(folder: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(the manifest, None) once it verifies itself and its structure; else (None, why)."""
    path = folder / MANIFEST
    if path.is_symlink():
        return None, f"{path}: a symbolic link (lrm writes plain files; not read)"
    if not path.is_file():
        return None, f"{path}: missing (an unfinished or damaged checkpoint)"
    try:
        m = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return None, f"{path}: unreadable ({str(e).splitlines()[0][:120]})"
    if isinstance(m, dict) and m.get("format") in OLD_FORMATS:
        return None, (f"{path}: written by an older lrm ({m['format']}: its manifest carries "
                      f"no hash of its own), not read")
    if not isinstance(m, dict) or m.get("format") not in READABLE:
        return None, f"{path}: not an {FORMAT} manifest"
    try:
        ok = m.get("sha256") == manifest_digest(m)
    except ValueError:  # NaN or inf in it: lrm never writes them
        ok = False
    if not ok:
        return None, f"{path}: its sha256 does not match its content (edited or corrupt)"
    need = {"format", "seq", "step", "kind", "parent", "chain", "files", "pieces", "dense",
            "tables", "quantize", "estimated_bytes"}
    if not need <= m.keys():
        return None, f"{path}: lacks {sorted(need - m.keys())}"
    bad = _malformed(m)
    if bad is not None:
        return None, f"{path}: malformed ({bad})"
    named = _FINAL.match(folder.name)
    assert named is not None
    if (m["seq"], m["step"]) != (int(named.group(1)), int(named.group(2))):
        return None, f"{path}: says seq {m['seq']}, step {m['step']}, not its folder's"
    return m, None


class Store:
    """The checkpoint folders under `root` (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._verified: dict[tuple[Path, float], list[str]] = {}

    # -- listing ----------------------------------------------------------------------
    def entries(self) -> list[Entry]:
        """Every checkpoint folder (complete or not), oldest seq first."""
        if not self.root.is_dir():
            return []
        out = []
        for p in self.root.iterdir():
            m = _FINAL.match(p.name)
            if m and p.is_dir() and not p.is_symlink():
                man, problem = _read_manifest(p)
                out.append(Entry(p, int(m.group(1)), int(m.group(2)), man, problem))
        return sorted(out, key=lambda e: e.seq)

    def temps(self) -> list[Path]:
        """Folders being written, or being removed, when a process stopped."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir()
                      if (_TEMP.match(p.name) or _GONE.match(p.name)) and p.is_dir())

    def legacy(self) -> list[Path]:
        """DCP step-N/ folders of earlier lrm versions (never read: DCP pickles metadata)."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir() if _LEGACY.match(p.name) and p.is_dir())

    def next_seq(self) -> int:
        seqs = [e.seq for e in self.entries()]
        for p in self.temps():
            m = _TEMP.match(p.name) or _GONE.match(p.name)
            seqs += [int(m.group(1))] if m else []
        return max(seqs, default=0) + 1

    # -- verification -----------------------------------------------------------------
    def verify(self, entry: Entry) -> list[str]:
        """What is wrong with one checkpoint's own files ([] when it verifies)."""
        if entry.manifest is None:
            return [entry.problem or f"{entry.path}: no manifest"]
        key = (entry.path, (entry.path / MANIFEST).stat().st_mtime)
        if key in self._verified:
            return self._verified[key]
        problems = []
        for name, f in sorted(entry.manifest["files"].items()):
            path = entry.path / name
            if path.is_symlink():
                problems.append(f"{path}: a symbolic link (lrm writes plain files; not read)")
            elif not path.is_file():
                problems.append(f"{path}: missing")
            elif path.stat().st_size != int(f["bytes"]):
                problems.append(f"{path}: {path.stat().st_size} bytes, the manifest says "
                                f"{f['bytes']} (truncated or changed)")
            elif read_sha256(path) != f["sha256"]:
                problems.append(f"{path}: sha256 differs from the manifest's (corrupt)")
        self._verified[key] = problems
        return problems

    def lineage(self, entry: Entry, by_name: Mapping[str, Entry] | None = None
                ) -> tuple[list[Entry], list[str]]:
        """(baseline ... entry, problems): the checkpoints a restore of `entry` reads, and
        what is wrong with any of them or with the links between them ([] if restorable)."""
        by_name = by_name if by_name is not None else {e.name: e for e in self.entries()}
        chain, cur, problems = [], entry, []
        while True:
            problems += self.verify(cur)
            chain.append(cur)
            if problems or cur.kind == "baseline":
                break
            parent = by_name.get(cur.parent or "")
            if parent is None:
                problems.append(f"{cur.path}: its parent {self.root / str(cur.parent)} is "
                                f"missing (a delta needs every checkpoint before it)")
                break
            if parent.seq >= cur.seq or parent.chain != cur.chain:
                problems.append(f"{cur.path}: parent {parent.name} is not an earlier "
                                f"checkpoint of its chain")
                break
            linked = (cur.manifest or {}).get("parent_sha256")
            if parent.manifest is not None and parent.manifest["sha256"] != linked:
                problems.append(f"{cur.path}: its parent {parent.name} is not the checkpoint "
                                f"it was written after (another manifest sha256)")
                break
            cur = parent
        return chain[::-1], problems

    def newest_restorable(self, bad: Mapping[str, str] | None = None
                          ) -> tuple[list[Entry] | None, list[str]]:
        """(the lineage of the newest restorable checkpoint or None, the problems of every
        newer checkpoint passed over on the way). bad: {name: why} of checkpoints a restore
        found wrong: passed over too, with every checkpoint built on them."""
        bad = bad or {}
        entries = self.entries()
        by_name = {e.name: e for e in entries}
        skipped: list[str] = []
        for e in reversed(entries):
            chain, problems = self.lineage(e, by_name)
            problems += [f"{c.path}: {bad[c.name]}" for c in chain if c.name in bad]
            if not problems:
                return chain, skipped
            skipped.append(f"{e.name}: {problems[0]}")
        return None, skipped

    # -- writing ----------------------------------------------------------------------
    def write_part(self, tmp: Path, rank: int, nonce: str,
                   files: Mapping[str, Callable[[Path], dict[str, Any]]],
                   extra: Mapping[str, Any]) -> None:
        """One rank's share of a checkpoint: each file written by its writer (which returns
        its {"bytes", "sha256"}), then the rank's part file listing them."""
        tmp.mkdir(parents=True, exist_ok=True)
        listed = {name: write(tmp / name) for name, write in files.items()}
        write_json_synced({"nonce": nonce, "rank": rank, "files": listed, **extra},
                          tmp / _PART.format(rank=rank))
        fsync_dir(tmp)

    def write_failure(self, tmp: Path, rank: int, nonce: str, err: BaseException) -> None:
        """Best effort: a part file saying this rank failed, so rank 0 stops waiting."""
        with contextlib.suppress(OSError):
            tmp.mkdir(parents=True, exist_ok=True)
            (tmp / _PART.format(rank=rank)).write_text(json.dumps(
                {"nonce": nonce, "rank": rank, "error": f"{type(err).__name__}: {err}"}))

    def commit(self, tmp: Path, manifest: dict[str, Any], world_size: int, nonce: str,
               merge: Callable[[dict[str, Any], list[dict[str, Any]]], None],
               timeout: float = COMMIT_TIMEOUT_S) -> Path:
        """Rank 0: wait for every rank's part, write the manifest, rename into place."""
        parts: dict[int, dict[str, Any]] = {}
        deadline, wait = time.monotonic() + timeout, 0.002
        while len(parts) < world_size:
            for r in range(world_size):
                p = tmp / _PART.format(rank=r)
                if r not in parts and p.is_file():
                    with contextlib.suppress(ValueError, OSError):
                        part = json.loads(p.read_text())
                        if part.get("nonce") == nonce and part.get("rank") == r:
                            parts[r] = part
                if r in parts and "error" in parts[r]:
                    raise CheckpointError(f"{tmp}: rank {r} could not write its share "
                                          f"({parts[r]['error']})")
            if len(parts) < world_size:
                if time.monotonic() > deadline:
                    missing = sorted(set(range(world_size)) - set(parts))
                    raise CheckpointError(f"{tmp}: ranks {missing} did not finish writing "
                                          f"their share within {timeout:.0f} s")
                time.sleep(wait)
                wait = min(wait * 2, 0.05)
        files: dict[str, Any] = {}
        for r in sorted(parts):
            files.update(parts[r]["files"])
            files[_PART.format(rank=r)] = {"bytes": (tmp / _PART.format(rank=r)).stat().st_size,
                                           "sha256": read_sha256(tmp / _PART.format(rank=r))}
        manifest = {**manifest, "format": FORMAT, "files": files,
                    "written": time.strftime("%Y-%m-%dT%H:%M:%S")}
        merge(manifest, [parts[r] for r in sorted(parts)])
        if manifest.get("parent"):  # the delta's link: the parent as it was committed
            parent, problem = _read_manifest(self.root / manifest["parent"])
            if parent is None:
                raise CheckpointError(f"{tmp}: its parent cannot be read ({problem})")
            manifest["parent_sha256"] = parent["sha256"]
        manifest["sha256"] = manifest_digest(manifest)
        write_json_synced(manifest, tmp / MANIFEST)
        fsync_dir(tmp)
        final = self.root / final_name(manifest["seq"], manifest["step"])
        os.rename(tmp, final)  # atomic on one file system; final does not exist (fresh seq)
        fsync_dir(self.root)
        return final

    # -- removal (only folders of lrm's own names) ---------------------------------------
    def _remove(self, path: Path) -> None:
        """Rename out of the checkpoints' names first (atomic), so a process stopped
        mid-removal leaves no half-removed checkpoint, only an .old- folder."""
        gone = path.with_name(f".old-{path.name}")
        try:
            os.rename(path, gone)
        except OSError:
            gone = path
        shutil.rmtree(gone, ignore_errors=True)

    def discard_temps(self) -> list[Path]:
        """Remove checkpoints that were being written (a crash mid-save); they are never
        read, and a later save with the same seq must not find their files."""
        gone = self.temps()
        for p in gone:
            shutil.rmtree(p, ignore_errors=True)
        return gone

    def clear(self) -> list[Path]:
        """Remove every checkpoint (complete, temporary or legacy) of this folder; the
        checkpoints removed (complete and legacy ones)."""
        gone = [e.path for e in self.entries()] + self.legacy()
        for p in gone:
            self._remove(p)
        for p in self.temps():
            shutil.rmtree(p, ignore_errors=True)
        return gone

    def prune(self, keep: int, current: str, pinned: str | None = None) -> list[Path]:
        """Keep the `keep` chains whose newest checkpoints are newest (the chains of
        `current` and `pinned` always); remove the other chains and unreadable folders
        older than the oldest kept baseline."""
        entries = self.entries()
        chains: dict[str, int] = {}
        for e in entries:
            if e.chain is not None:
                chains[e.chain] = max(chains.get(e.chain, 0), e.seq)
        ranked = sorted(chains, key=lambda c: chains[c], reverse=True)
        kept = set(ranked[:keep]) | {e.chain for e in entries
                                     if e.name in (current, pinned) and e.chain}
        oldest = min((e.seq for e in entries if e.name in kept), default=0)
        gone = [e.path for e in entries
                if ((e.chain is not None and e.chain not in kept)
                    or (e.chain is None and e.seq < oldest)) and not _kept_for(e)]
        for p in gone:
            self._remove(p)
        return gone


def _kept_for(e: Entry) -> bool:
    """A checkpoint not pruned: it holds a file lrm did not write (said in a log line)."""
    if strays := e.strays():
        log.warning("%s: not removed, it holds %s, a file lrm did not write", e.path,
                    strays[0])
    return bool(strays)


def resumable(folder: Path | None) -> None:
    """A ConfigError unless `folder` is a checkpoint folder holding at least one checkpoint
    (verified when a run restores it): a `--resume` of a mistyped or empty folder is a
    mistake to say, not a fresh start to make quietly. (A library resume of an empty
    folder starts fresh: a stream day's first run.)"""
    if folder is None:
        raise ConfigError("--resume: no checkpoint folder to resume from (--checkpoints)")
    if not Store(Path(folder)).entries():  # (a stage's runner made a missing one: empty)
        raise ConfigError(f"--resume: --checkpoints {folder} holds no checkpoint to go on "
                          f"from (mistyped? or the run stopped before its first); run "
                          f"without --resume to start afresh")

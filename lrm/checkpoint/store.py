"""lrm's checkpoint folders on disk: names, manifests, atomic commit, verification, retention.

    ROOT/000001-step-20/      a checkpoint: seq 1 (a counter over the folder), training step 20
        rows-0.pt             rank 0's embedding rows: ids, (quantized) rows, row-wise state
        rows-1.pt             rank 1's
        state.pt              rank 0: dense parameters, dense optimizer state, train state,
                              data position (exact)
        part-0.json part-1.json   each rank's list of the files it wrote (size, sha256)
        manifest.json         written last: what the checkpoint is (baseline or delta, its
                              parent, the chain's baseline), every file's size and sha256
    ROOT/.tmp-000002-step-40-<nonce>/   a checkpoint being written

Every rank writes its files into the temporary folder, fsyncs them and writes its part
file; rank 0 waits for every part, writes the manifest, fsyncs, and renames the folder into
place (then fsyncs ROOT). A folder without a verified manifest is never read. A checkpoint
is removed by renaming it to ROOT/.old-NAME first, so a process stopped mid-removal leaves
no half-removed checkpoint; the next start removes .tmp- and .old- folders. Tensors are
`torch.save`d plain tensors loaded with `weights_only=True` (no pickle on the restore path;
safetensors is not installed); metadata is JSON.

A checkpoint is restorable when it and every ancestor up to its baseline verify (manifest
readable, every file present with its size and sha256). Retention keeps the newest `keep`
chains (ranked by their newest checkpoint).
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

from lrm.errors import LrmError
from lrm.io import fsync_dir, sha256_file

log = logging.getLogger("lrm")
FORMAT = "lrm-checkpoint/1"
MANIFEST = "manifest.json"
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


class _Hashing:
    """A write-only file that hashes and counts what goes through it."""

    def __init__(self, f: Any) -> None:
        self.f, self.sha, self.size = f, hashlib.sha256(), 0

    def write(self, b: bytes) -> int:
        self.sha.update(b)
        self.size += len(b)
        return self.f.write(b)

    def flush(self) -> None:
        self.f.flush()


def save_tensors(tensors: Mapping[str, torch.Tensor], path: Path) -> dict[str, Any]:
    """torch.save a flat {name: tensor} to `path`, fsynced; its {"bytes", "sha256"}."""
    with open(path, "wb") as f:
        w = _Hashing(f)
        torch.save(dict(tensors), w)
        f.flush()
        os.fsync(f.fileno())
    return {"bytes": w.size, "sha256": w.sha.hexdigest()}


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A file of save_tensors: weights-only (no pickle of objects), memory-mapped."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # noqa: BLE001  (any unreadable file is a bad checkpoint)
        raise CheckpointError(f"{path}: unreadable ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                            for k, v in obj.items()):
        raise CheckpointError(f"{path}: not a flat dict of tensors")
    return obj


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

    @property
    def bytes(self) -> int:
        if not self.manifest:
            return 0
        return sum(int(f["bytes"]) for f in self.manifest["files"].values())


def _safe_name(name: Any) -> bool:
    return isinstance(name, str) and bool(name) and "/" not in name and "\\" not in name \
        and name not in (".", "..")


def _read_manifest(folder: Path) -> tuple[dict[str, Any] | None, str | None]:
    path = folder / MANIFEST
    if not path.is_file():
        return None, f"{path}: missing (an unfinished or damaged checkpoint)"
    try:
        m = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"{path}: unreadable ({e})"
    need = {"format", "seq", "step", "kind", "parent", "chain", "files", "pieces", "dense",
            "tables", "quantize", "estimated_bytes"}
    if not isinstance(m, dict) or m.get("format") != FORMAT or not need <= m.keys():
        return None, f"{path}: not an {FORMAT} manifest"
    if m["kind"] not in ("baseline", "delta") or not isinstance(m["files"], dict) or \
            not all(_safe_name(n) and isinstance(f, dict) and {"bytes", "sha256"} <= f.keys()
                    for n, f in m["files"].items()):
        return None, f"{path}: malformed"
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
            if not path.is_file():
                problems.append(f"{path}: missing")
            elif path.stat().st_size != int(f["bytes"]):
                problems.append(f"{path}: {path.stat().st_size} bytes, the manifest says "
                                f"{f['bytes']} (truncated or changed)")
            elif sha256_file(path) != f["sha256"]:
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
            cur = parent
        return chain[::-1], problems

    def newest_restorable(self) -> tuple[list[Entry] | None, list[str]]:
        """(the lineage of the newest restorable checkpoint or None, the problems of every
        newer checkpoint passed over on the way)."""
        entries = self.entries()
        by_name = {e.name: e for e in entries}
        skipped: list[str] = []
        for e in reversed(entries):
            chain, problems = self.lineage(e, by_name)
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
                                           "sha256": sha256_file(tmp / _PART.format(rank=r))}
        manifest = {**manifest, "format": FORMAT, "files": files,
                    "written": time.strftime("%Y-%m-%dT%H:%M:%S")}
        merge(manifest, [parts[r] for r in sorted(parts)])
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

    def clear(self) -> None:
        """Remove every checkpoint (complete, temporary or legacy) of this folder."""
        for p in [e.path for e in self.entries()]:
            self._remove(p)
        for p in self.temps() + self.legacy():
            shutil.rmtree(p, ignore_errors=True)

    def prune(self, keep: int, current: str) -> list[Path]:
        """Keep the `keep` chains whose newest checkpoints are newest (the chain of
        `current` always); remove the other chains and unreadable folders older than the
        oldest kept baseline."""
        entries = self.entries()
        chains: dict[str, int] = {}
        for e in entries:
            if e.chain is not None:
                chains[e.chain] = max(chains.get(e.chain, 0), e.seq)
        now = next((e.chain for e in entries if e.name == current), None)
        ranked = sorted(chains, key=lambda c: chains[c], reverse=True)
        kept = set(ranked[:keep]) | ({now} if now else set())
        oldest = min((e.seq for e in entries if e.name in kept), default=0)
        gone = [e.path for e in entries
                if (e.chain is not None and e.chain not in kept)
                or (e.chain is None and e.seq < oldest)]
        for p in gone:
            self._remove(p)
        return gone

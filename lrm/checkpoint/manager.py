"""The checkpoint policy the training loop calls once a step.

Everything a run needs to go on is a `Stateful` (state_dict / load_state_dict): the sharded
model, the optimizers, the train state and the data position. The manager saves them every
`CheckpointConfig.every` steps and at the end as a chain (Check-N-Run): a full baseline,
then deltas holding only the embedding rows changed since the previous checkpoint
(lrm.checkpoint.tracker) with their row-wise optimizer state, plus every dense tensor
exactly. A new baseline starts after `deltas` deltas, or when the chain's deltas would pass
`delta_budget` times its baseline's size. Rows are stored `quantize`d (fp32, int8, int4;
a quantized chain's deltas as residuals: lrm.checkpoint.snapshot).

At a save the training thread copies the rows and tensors out (lrm.checkpoint.snapshot)
and goes on; a background thread quantizes, writes, fsyncs and commits them
(lrm.checkpoint.store); the next save first waits for it. On resume the newest checkpoint
whose whole chain verifies is loaded into the parts, in whatever sharding this run has,
after checking that the run asking is the run that wrote it (`identity`: the same model,
tables, batch cut and data), so a resume with other settings is a one-line error saying
what differs. A checkpoint that does not verify is named in one log line and passed over.

A fresh start (no resume) clears the folder, saying what it removed, but refuses a folder
holding a verified checkpoint of another run (`owner`: the model folder a run trains
toward) unless forced: `--resume` goes on from it, `--force` removes it. `pin(step)` keeps
a checkpoint of this run (its chain) through retention, and `restore_model(step)` reads
its model back: the best validated state of a run that was stopped and resumed after it
(lrm.train.early_stop) lives there.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from lrm.checkpoint import quantize, snapshot
from lrm.checkpoint.store import CheckpointError, Entry, Store, final_name, temp_name
from lrm.checkpoint.tables import TableShard, table_shards
from lrm.checkpoint.tracker import RowTracker
from lrm.config import CheckpointConfig
from lrm.dist import Dist
from lrm.errors import ConfigError

log = logging.getLogger("lrm")
# identity keys a chain does not depend on: rows are stored in global row space and the
# data position counts steps, so a chain written by N processes restores under M
RESHARDABLE = frozenset({"world_size"})


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


SHOWN = 4  # differing keys named under one identity key (another kind differs in all)


def _differences(then: Mapping[str, Any], now: Mapping[str, Any], prefix: str = ""
                 ) -> list[str]:
    """`key: A then, B now` per differing key; nested settings by their dotted key (the
    model's whole JSON, cut at 120 characters, hid which one changed: model.embedding_dim)."""
    out = []
    for k in sorted(set(then) | set(now)):
        x, y = then.get(k), now.get(k)
        if x == y:
            continue
        if isinstance(x, dict) and isinstance(y, dict):
            if not prefix and k == "data":
                out.append(f"data: {_data_difference(x, y)}")
                continue
            inner = _differences(x, y, f"{prefix}{k}.")
            out += inner[:SHOWN] + ([f"{prefix}{k}: {len(inner) - SHOWN} more"]
                                    if len(inner) > SHOWN else [])
            continue
        a, b = json.dumps(x, sort_keys=True), json.dumps(y, sort_keys=True)
        out.append(f"{prefix}{k}: {a[:120]} then, {b[:120]} now")
    return out


def _data_difference(then: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    """The first file of the data identity (day -> [[name, rows, sha256], ...]) that differs."""
    for day in sorted(set(then) | set(now), key=lambda d: int(d) if str(d).isdigit() else -1):
        a, b = then.get(day), now.get(day)
        if a is None or b is None:
            return f"day {day} {'is new' if a is None else 'is gone'}"
        names_a, names_b = [f[0] for f in a], [f[0] for f in b]
        if names_a != names_b:
            return f"day {day}'s files {names_a} then, {names_b} now"
        for fa, fb in zip(a, b, strict=True):
            if fa != fb:
                what = "rows" if fa[1:2] != fb[1:2] else "content (sha256)"
                return f"day {day}'s {fa[0]} changed its {what}"
    return "differs"


def _tables(state: Mapping[str, Any]) -> dict[str, list[TableShard]]:
    return table_shards(state["model"], state.get("optim")) if "model" in state else {}


@dataclass(frozen=True)
class _Head:
    """The checkpoint the next one builds on, and its chain's size so far (rows' bytes,
    estimated the same on every rank)."""

    name: str
    chain: str  # the chain's baseline
    deltas: int  # deltas since the baseline
    base_bytes: float
    chain_bytes: float  # the deltas' bytes

    def wants_baseline(self, cfg: CheckpointConfig, delta_bytes: float) -> bool:
        return (cfg.deltas == 0 or self.deltas >= cfg.deltas
                or self.chain_bytes + delta_bytes > cfg.delta_budget * self.base_bytes)


class CheckpointManager:
    """Periodic checkpoints of one run in `root` (see the module docstring).

    identity: what makes a checkpoint resumable by this run (JSON-able): kept in every
    checkpoint's manifest, compared on resume. Call `close()` when the run ends, on every
    path (it waits for a write in flight); `finish` does it on the normal one.
    """

    def __init__(self, root: Path, env: Dist, cfg: CheckpointConfig,
                 identity: Mapping[str, Any], *, owner: str | None = None) -> None:
        self.root, self.env, self.cfg = Path(root), env, cfg
        self.identity = json.loads(json.dumps(dict(identity), sort_keys=True, default=str))
        self.owner = owner  # the run these checkpoints are of (its model folder), if any
        self._pinned: str | None = None  # a checkpoint kept through retention (pin)
        self.store = Store(self.root)
        self.saved_at = -1  # step of the newest checkpoint of this run
        self.last: Path | None = None  # the newest checkpoint (committed by the next wait)
        self.stall_s = 0.0  # time the training thread spent in saves (copy, and waits)
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future[Path | None] | None = None
        self._tracker = RowTracker()
        # a quantized chain's rows as a restore makes them (its deltas are residuals)
        self._recon = snapshot.Reconstruction() if cfg.quantize != "none" else None
        self._head: _Head | None = None
        self._seq, self._nonce = 1, ""

    # -- start ------------------------------------------------------------------------
    def start(self, parts: Mapping[str, Stateful], resume: bool, *,
              prepare: Callable[[], Any] | None = None, force: bool = False) -> int | None:
        """Fresh run: clear the folder (refused while it holds a verified checkpoint of
        another owner, unless `force`). Resume: load the newest restorable checkpoint into
        `parts` and return its step (None when there is none).

        prepare: called just before a restore, only when there is one (e.g. torchrec's
        `init_state`, a dummy step that creates AdamW's lazy state to load into: run
        without a checkpoint to overwrite it, it would change the run).
        """
        names = set(parts)
        bad: dict[str, str] = {}  # checkpoints that verified but could not be restored
        while True:
            decision = self._choose(resume, force, bad) if self.env.is_main else None
            decision = self.env.broadcast(decision)  # type: ignore[assignment]
            assert isinstance(decision, dict)
            self._seq, self._nonce = decision["seq"], decision["nonce"]
            if "error" in decision:
                raise ConfigError(decision["error"])
            if not decision.get("lineage"):
                return None
            found = {e.name: e for e in self.store.entries() if e.manifest is not None}
            if not set(decision["lineage"]) <= found.keys():
                raise CheckpointError(f"{self.root}: checkpoints {decision['lineage']} "
                                      f"changed while resuming")
            lineage = [found[n] for n in decision["lineage"]]
            if prepare is not None and not bad:
                prepare()
            t0 = time.perf_counter()
            failed: CheckpointError | None = None
            try:  # a failed restore is passed over like a damaged checkpoint: the next one
                n = self._load(lineage, parts, names)  # rewrites every value it touched
            except CheckpointError as e:
                failed = e
            if not self.env.any(failed is not None):
                break
            why = str(failed) if failed is not None else "another rank could not restore it"
            bad[lineage[-1].name] = f"cannot be restored ({why})"
        tables = _tables({k: parts[k].state_dict() for k in names})
        self._tracker.reset(tables)  # the next delta holds the rows changed from here on
        if self._recon is not None:
            self._recon.reset(tables)
        head = lineage[-1]
        sizes = [float(e.manifest["estimated_bytes"]) for e in lineage]  # type: ignore[index]
        self._head = _Head(head.name, str(head.chain), len(lineage) - 1, sizes[0],
                           sum(sizes[1:]))
        self.saved_at, self.last = head.step, head.path
        log.info("resumed from %s (step %d: a baseline and %d deltas, %d rows) in %.2f s",
                 head.path, head.step, len(lineage) - 1, n, time.perf_counter() - t0)
        return head.step

    def _foreign(self) -> str | None:
        """Why a fresh start must not clear the folder: it holds a verified checkpoint of
        another run (None: it holds none, or only this run's)."""
        entries = self.store.entries()
        by_name = {e.name: e for e in entries}
        theirs = [e for e in entries if e.manifest is not None
                  and e.manifest.get("owner") != self.owner
                  and not self.store.lineage(e, by_name)[1]]
        if not theirs:
            return None
        e = theirs[-1]
        of = e.manifest.get("owner")  # type: ignore[union-attr]
        run = f"a run of {os.path.normpath(self.root / of)}" if of else "another run"
        return (f"{self.root} holds {len(theirs)} verified checkpoint(s) of {run} (newest "
                f"{e.name}, step {e.step}); pass --resume to go on from them, or --force to "
                f"remove them and start afresh")

    def _strays(self) -> str | None:
        """Why a fresh start must not clear the folder: a checkpoint in it holds a file lrm
        did not write (a fresh start removed it with the checkpoint)."""
        for e in self.store.entries():
            if strays := e.strays():
                return (f"{e.path / strays[0]}: a file lrm did not write, in a checkpoint a "
                        f"fresh start would remove; move it away, or pass --force to remove "
                        f"it too")
        return None

    def _tidy(self, resume: bool) -> None:
        """Rank 0: remove unfinished writes; a fresh start removes every checkpoint too.
        Each removal is named in a log line."""
        gone = self.store.discard_temps()
        if gone:
            log.info("removed %d unfinished checkpoint(s) in %s: %s", len(gone), self.root,
                     ", ".join(p.name for p in gone))
        if not resume and (gone := self.store.clear()):
            log.info("starting afresh in %s: removed %d checkpoint(s) of an earlier run: %s",
                     self.root, len(gone), ", ".join(p.name for p in gone))

    def _choose(self, resume: bool, force: bool,
                bad: Mapping[str, str]) -> dict[str, Any]:
        """Rank 0: the checkpoint to resume (verified, none of `bad`) or why none; the next
        seq. A fresh start clears the folder first, unless it refuses (`_foreign`)."""
        refused = None if resume or force else self._foreign() or self._strays()
        if refused is not None:
            return {"seq": 0, "nonce": "", "error": refused}
        if not bad:
            self._tidy(resume)
        out: dict[str, Any] = {"seq": self.store.next_seq(), "nonce": secrets.token_hex(4)}
        if not resume:
            return out
        if self.store.legacy():
            log.info("%s: ignoring %d DCP step-N/ folder(s) of an older lrm (their metadata "
                     "is pickled; lrm does not read them)", self.root, len(self.store.legacy()))
        lineage, skipped = self.store.newest_restorable(bad)
        if lineage is None and bad:  # the parts hold what a failed restore wrote: no start
            out["error"] = (f"no checkpoint in {self.root} can be restored ({'; '.join(skipped)}"
                            f"); start afresh without --resume")
            return out
        if lineage is None:  # (a resume that was asked for: stages check there is one)
            why = f" ({'; '.join(skipped)})" if skipped else ""
            (log.warning if skipped else log.info)(
                "no restorable checkpoint in %s%s: starting from scratch", self.root, why)
            return out
        if skipped:
            log.warning("passing over %d checkpoint(s) that do not verify (%s); restoring %s",
                        len(skipped), "; ".join(skipped), lineage[-1].path)
        then = lineage[-1].manifest.get("identity") or {}  # type: ignore[union-attr]
        keys = (set(then) | set(self.identity)) - RESHARDABLE
        diff = _differences({k: v for k, v in then.items() if k in keys},
                            {k: v for k, v in self.identity.items() if k in keys})
        if diff:
            out["error"] = (f"cannot resume from {lineage[-1].path}: it was written by another "
                            f"run ({'; '.join(diff)}); start fresh without --resume, or resume "
                            f"with that run's settings and data")
            return out
        out["lineage"] = [e.name for e in lineage]
        return out

    # -- saving -----------------------------------------------------------------------
    def step(self, step: int, parts: Mapping[str, Stateful]) -> bool:
        """Called after every optimizer step: save when the interval says so."""
        if self.cfg.every and step % self.cfg.every == 0:
            self.save(step, parts)
            return True
        return False

    def rewritten(self) -> None:
        """The model's weights were written other than by a step (the best state put back,
        which leaves the optimizer's row states as they were: the row tracker cannot see
        it): the next save is a baseline."""
        self._tracker.forget()

    def finish(self, step: int, parts: Mapping[str, Stateful]) -> Path | None:
        """The end of the run (or of a streaming day): save unless this step is already
        saved, wait until it is committed, and stop the writer. Returns the checkpoint."""
        if self.saved_at != step:
            self.save(step, parts)
        self.wait()
        self.close()
        return self.last

    def save(self, step: int, parts: Mapping[str, Stateful]) -> Path:
        """Copy the state out now and write it in the background (a collective)."""
        if not self._nonce:
            raise RuntimeError("CheckpointManager.save before start()")
        t0 = time.perf_counter()
        self.wait()
        state = {k: v.state_dict() for k, v in parts.items()}
        tables = _tables(state)
        touched = self._tracker.take(tables)
        q = self.cfg.quantize
        # (ranks that cannot tell which rows changed: a baseline on every rank)
        est = torch.tensor([_bytes(tables, touched, q), _bytes(tables, None, q),
                            touched is None], dtype=torch.float64)
        delta_bytes, base_bytes, unknown = (float(x) for x in self.env.all_sum(est))
        head = self._head
        baseline = head is None or unknown > 0 or head.wants_baseline(self.cfg, delta_bytes)
        snap = snapshot.capture(state, tables, None if baseline else touched,
                                dense=self.env.is_main)
        seq, name = self._seq, final_name(self._seq, step)
        manifest = {
            "seq": seq, "step": step, "kind": "baseline" if baseline else "delta",
            "parent": None if head is None or baseline else head.name,
            "chain": name if head is None or baseline else head.chain,
            "quantize": q, "world_size": self.env.world_size, "identity": self.identity,
            "estimated_bytes": base_bytes if baseline else delta_bytes, "owner": self.owner,
        }
        job = _Job(self.store, self.root / temp_name(seq, step, self._nonce), manifest, snap,
                   self.env, self._nonce, keep=self.cfg.keep, pinned=self._pinned,
                   recon=self._recon)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="lrm-checkpoint")
        self._pending = self._pool.submit(job.run)
        if head is None or baseline:
            self._head = _Head(name, name, 0, base_bytes, 0.0)
        else:
            self._head = _Head(name, head.chain, head.deltas + 1, head.base_bytes,
                               head.chain_bytes + delta_bytes)
        self._seq += 1
        self.saved_at, self.last = step, self.root / name
        if not self.cfg.background:
            self.wait()
        self.stall_s += time.perf_counter() - t0
        return self.last

    def wait(self) -> None:
        """Wait for the write in flight (a collective: a failure on any rank raises on
        every rank)."""
        err: BaseException | None = None
        if self._pending is not None:
            try:
                self._pending.result()
            except Exception as e:  # noqa: BLE001  (reported on every rank below)
                err = e
            self._pending = None
        if self.env.any(err is not None):
            self._head = None  # the chain may lack this checkpoint: start a new one
            where = f": {err}" if err is not None else " on another rank"
            raise CheckpointError(f"writing a checkpoint in {self.root} failed{where}")

    def close(self) -> None:
        """Wait for the write in flight and stop the writer; never raises (it runs on
        error paths too: a failed write is logged)."""
        if self._pending is not None:
            try:
                self._pending.result()
            except Exception as e:  # noqa: BLE001
                log.warning("writing a checkpoint in %s failed: %s", self.root, e)
            self._pending = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # -- the best state: kept through retention, read back -------------------------------
    def _of_this_run(self, step: int) -> Entry | None:
        """The newest checkpoint of `step` written by this run: its identity (the same model,
        data and batch cut make the same state at a step, whichever start wrote it)."""
        found = [e for e in self.store.entries() if e.step == step and e.manifest is not None
                 and e.manifest.get("identity") == self.identity]
        return found[-1] if found else None

    def pin(self, step: int) -> bool:
        """Keep this run's checkpoint of `step` (and its chain) through retention, until
        another is pinned. The checkpoint saved last when it is of `step` (committed by
        the next wait); else one found in the folder. False when there is none."""
        if self.saved_at == step and self.last is not None:
            self._pinned = self.last.name
        else:
            entry = self._of_this_run(step) if self.env.is_main else None
            name = self.env.broadcast(entry.name if entry else None)
            self._pinned = name if isinstance(name, str) else None
        return self._pinned is not None

    def restore_model(self, step: int, parts: Mapping[str, Stateful]) -> bool:
        """Load this run's checkpoint of `step` into `parts` (a collective): the model's
        weights, and the parts the caller names beside them (not the optimizer or the data
        position: the run goes on from where it is); False when there is none that verifies
        (nothing is changed then)."""
        self.wait()
        lineage: list[str] | None = None
        if self.env.is_main:
            entry = self._of_this_run(step)
            if entry is not None:
                chain, problems = self.store.lineage(entry)
                if problems:
                    log.warning("the checkpoint of step %d does not verify: %s", step,
                                problems[0])
                else:
                    lineage = [e.name for e in chain]
        lineage = self.env.broadcast(lineage)  # type: ignore[assignment]
        if not lineage:
            return False
        found = {e.name: e for e in self.store.entries() if e.manifest is not None}
        self._load([found[n] for n in lineage], parts, set(parts))
        return True

    def _load(self, lineage: list[Entry], parts: Mapping[str, Stateful],
              names: set[str]) -> int:
        """Read a verified chain into `names` of `parts`; rows read. A chain lrm cannot fit
        into this run is a CheckpointError naming the checkpoint (never a raw error)."""
        state = {k: parts[k].state_dict() for k in names}
        try:
            n = snapshot.restore_tables(lineage, _tables(state))
            snapshot.restore_dense(lineage[-1], state, names)
            for k in names:
                parts[k].load_state_dict(state[k])
        except CheckpointError:
            raise
        except (RuntimeError, ValueError, KeyError, IndexError, TypeError) as e:
            msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
            raise CheckpointError(f"{lineage[-1].path}: cannot be restored into this run "
                                  f"({type(e).__name__}: {msg})") from None
        return n

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def latest(root: Path) -> Entry | None:
        """The newest restorable checkpoint in `root` (verified; None if none), e.g. for
        a flow to see what its last checkpoint covered (`manifest["identity"]`: the run
        identity the loop gives, train days included)."""
        lineage, _ = Store(root).newest_restorable()
        return lineage[-1] if lineage else None


def _bytes(tables: Mapping[str, list[TableShard]], touched: Mapping[str, torch.Tensor] | None,
           q: str) -> int:
    """Bytes this rank's rows take in a checkpoint: all rows (touched None) or the touched."""
    codec = quantize.codecs(q)[0 if touched is None else 1]
    n = 0
    for key, shards in tables.items():
        for s in shards:
            if touched is None:
                rows = s.weight.shape[0]
            else:
                ids = touched.get(key)
                rows = 0 if ids is None else int(((ids >= s.r0) & (ids < s.r1)).sum())
            n += snapshot.piece_bytes(rows, s.weight.shape[0], s.c1 - s.c0, len(s.states),
                                      codec, q)
    return n


class _Job:
    """One checkpoint's write on one rank (the writer thread runs `run`)."""

    def __init__(self, store: Store, tmp: Path, manifest: dict[str, Any],
                 snap: snapshot.Snapshot, env: Dist, nonce: str, keep: int,
                 pinned: str | None = None,
                 recon: snapshot.Reconstruction | None = None) -> None:
        self.store, self.tmp, self.manifest, self.snap = store, tmp, manifest, snap
        self.rank, self.world_size, self.main = env.rank, env.world_size, env.is_main
        self.nonce, self.keep, self.pinned, self.recon = nonce, keep, pinned, recon

    def run(self) -> Path | None:
        q, snap = self.manifest["quantize"], self.snap
        pieces: list[dict[str, Any]] = []
        files = {}
        if snap.pieces:
            def rows(path: Path) -> dict[str, Any]:
                info, meta = snapshot.write_rows(
                    snap, q, path, baseline=self.manifest["kind"] == "baseline",
                    recon=self.recon)
                pieces.extend(meta)
                return info
            files[snapshot.ROWS_FILE.format(rank=self.rank)] = rows
        dense: dict[str, Any] = {}
        if self.main:
            def write_dense(path: Path) -> dict[str, Any]:
                info, index = snapshot.write_dense(snap, path)
                dense.update(index)
                return info
            files[snapshot.DENSE_FILE] = write_dense
        try:
            self.store.write_part(self.tmp, self.rank, self.nonce, files,
                                  {"pieces": pieces, "rows_written": snap.num_rows(),
                                   "tables": snap.tables})
        except Exception as e:
            self.store.write_failure(self.tmp, self.rank, self.nonce, e)  # rank 0 stops waiting
            raise
        if not self.main:
            return None

        def merge(manifest: dict[str, Any], parts: list[dict[str, Any]]) -> None:
            manifest["pieces"] = [p for part in parts for p in part["pieces"]]
            manifest["rows_written"] = sum(part["rows_written"] for part in parts)
            manifest["tables"] = {k: v for part in parts for k, v in part["tables"].items()}
            manifest["dense"] = {"file": snapshot.DENSE_FILE, "tensors": dense,
                                 "values": snap.values}

        final = self.store.commit(self.tmp, self.manifest, self.world_size, self.nonce, merge)
        gone = self.store.prune(self.keep, final.name, self.pinned)
        if gone:
            log.debug("removed old checkpoints: %s", ", ".join(p.name for p in gone))
        return final

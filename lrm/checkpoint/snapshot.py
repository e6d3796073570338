"""A run's state at a step boundary, copied out, written, and read back into any layout.

`capture` copies what a checkpoint holds while training waits: the table rows to save (all
of them for a baseline, the tracked ones for a delta) with their row-wise optimizer state,
as pieces in global row space (table, global row ids, columns [c0, c1)), and the exact
copy of every other tensor of every part (dense parameters, dense optimizer state, train
state, data position). Writing (quantizing, hashing, fsync) then runs off the training
thread.

`restore_tables` reads a chain (a baseline, then its deltas in order) into whatever shards
this rank holds now: each shard takes, from every piece of every rank's file, the rows and
columns it overlaps, so a chain saved under one plan or number of processes restores under
another. Weights are exact (or dequantized); the row-wise state of a shard is the
width-weighted mean of the source pieces' states over its columns: the same value when the
layout is unchanged, exact when column shards merge (a row's mean square gradient over all
columns is the width-weighted mean of the shards' means), and the whole row's mean for
each part when a table is split into more column shards (the best estimate there is).

How rows are stored (`write_rows`): each piece's row ids as nothing when it holds every
row of its shard (a baseline's), else as a bitmap over its shard's rows where that is
smaller than the ids, and the rows in their chain's codecs (lrm.checkpoint.quantize). A
quantized chain's deltas hold residuals: each row minus what the chain restores it to so
far (`Reconstruction`, kept by the writer), so a row's error after a restore is that of
its last residual, not of a 4-bit row (the figures: lrm.checkpoint.quantize). The row-wise
optimizer state (bfloat16 in a quantized chain) and the dense part are packed without loss
(lrm.checkpoint.compress).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lrm.checkpoint import compress, quantize
from lrm.checkpoint.store import CheckpointError, Entry, load_tensors
from lrm.checkpoint.tables import TableShard, is_sharded
from lrm.io import save_tensors

ROWS_FILE = "rows-{rank}.pt"
DENSE_FILE = "state.pt"


@dataclass
class Piece:
    """Rows of one table, columns [c0, c1), in global row space (copies, not views)."""

    table: str
    c0: int
    c1: int
    r0: int  # the rows [r0, r1) of the shard it comes from
    r1: int
    ids: torch.Tensor  # [n] global row ids, ascending
    rows: torch.Tensor  # [n, c1 - c0] fp32
    states: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [n] fp32


@dataclass
class Snapshot:
    pieces: list[Piece]
    dense: dict[str, torch.Tensor]  # flat key -> copy (empty but on the writing rank)
    values: dict[str, Any]  # flat key -> a JSON-able non-tensor value
    tables: dict[str, dict[str, Any]]  # table key -> {"rows", "cols", "states"}

    def num_rows(self) -> int:
        return sum(int(p.ids.numel()) for p in self.pieces)


def _walk(obj: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from _walk(v, (*path, str(k)))
    else:
        yield path, obj


def _flat(path: tuple[str, ...]) -> str:
    return "/".join(path)


def _table_leaf(path: tuple[str, ...], tables: Mapping[str, Any]) -> bool:
    """A sharded leaf that belongs to a table: the weight, or its optimizer state."""
    return (len(path) == 2 and path[1] in tables) or \
        (len(path) == 4 and path[1] == "state" and path[2] in tables)


def capture(state: Mapping[str, Any], tables: Mapping[str, list[TableShard]],
            touched: Mapping[str, torch.Tensor] | None, *, dense: bool) -> Snapshot:
    """Copy what a checkpoint of `state` ({part: state dict}) holds (see the module docs).

    touched: {table: global row ids} for a delta; None for a baseline (every row).
    dense: whether this rank writes the exact, replicated part (rank 0).
    """
    pieces, dense_out, values = [], {}, {}
    for key, shards in tables.items():
        for s in shards:
            if touched is None:
                local = None
                ids = torch.arange(s.r0, s.r1, dtype=torch.int64)
            else:
                ids = touched.get(key, torch.empty(0, dtype=torch.int64))
                ids = ids[(ids >= s.r0) & (ids < s.r1)]
                local = ids - s.r0
            small = torch.int32 if s.rows < 2**31 else torch.int64
            with torch.no_grad():  # copies on the host (a view of a GPU table: one copy)
                rows = s.weight.detach().to("cpu", copy=True) if local is None else \
                    s.weight.detach().index_select(0, local.to(s.weight.device)).cpu()
                sts = {n: (v.detach().to("cpu", torch.float32, copy=True) if local is None
                           else v.detach().index_select(0, local.to(v.device)).cpu().float())
                       for n, v in s.states.items()}
            pieces.append(Piece(key, s.c0, s.c1, s.r0, s.r1, ids.to(small), rows, sts))
    for path, leaf in _walk(state):
        if is_sharded(leaf):
            if not _table_leaf(path, tables):
                raise NotImplementedError(f"{_flat(path)}: a sharded tensor that is not a "
                                          f"table nor a table's optimizer state")
            continue
        if not dense:
            continue
        if isinstance(leaf, torch.Tensor):
            dense_out[_flat(path)] = leaf.detach().to("cpu", copy=True)
        else:
            try:
                values[_flat(path)] = json.loads(json.dumps(leaf))
            except TypeError:
                raise TypeError(f"{_flat(path)}: a {type(leaf).__name__} in a state dict; "
                                f"checkpoints hold tensors and JSON values") from None
    meta = {key: {"rows": shards[0].rows, "cols": shards[0].cols,
                  "states": sorted(shards[0].states)}
            for key, shards in tables.items() if shards}
    return Snapshot(pieces, dense_out, values, meta)


class Reconstruction:
    """The rows a quantized chain restores to, per shard, as its writer left them: what a
    delta's residuals are taken from. Set from a baseline as it is written, moved by each
    delta, and copied from the tables after a restore (which leaves them exactly so)."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, int, int], torch.Tensor] = {}  # (table, r0, c0) -> fp32

    def reset(self, tables: Mapping[str, list[TableShard]]) -> None:
        self.rows = {(key, s.r0, s.c0): s.weight.detach().to("cpu", torch.float32, copy=True)
                     for key, shards in tables.items() for s in shards}

    def of(self, p: Piece) -> torch.Tensor:
        have = self.rows.get((p.table, p.r0, p.c0))
        if have is None or have.shape != (p.r1 - p.r0, p.c1 - p.c0):
            raise RuntimeError(f"{p.table}: no reconstruction of the shard at rows {p.r0}, "
                               f"columns {p.c0} (a delta before its chain's baseline?)")
        return have

    def update(self, p: Piece, rows: torch.Tensor, baseline: bool) -> None:
        if baseline:
            self.rows[p.table, p.r0, p.c0] = rows
        else:
            self.of(p)[p.ids.long() - p.r0] = rows


# how a piece's ids are stored (the first column of a group's `index`)
IDS, BITMAP, EVERY = 0, 1, 2  # the ids; a bitmap over the shard's rows; every row: nothing


def _ids_form(p: Piece) -> int:
    """How a piece's ids are stored: nothing for every row of its shard (ids ascend without
    repeats, so as many ids as rows are all of them), else as ids or a bitmap, the smaller."""
    if p.ids.numel() == p.r1 - p.r0:
        return EVERY
    return BITMAP if -(-(p.r1 - p.r0) // 8) < p.ids.numel() * p.ids.element_size() else IDS


def _encode_ids(pieces: list[Piece], g: int) -> dict[str, torch.Tensor]:
    """A group's ids: `index` [pieces, 4] (`_ids_form`, r0, r1, ids), the ids of the
    pieces stored as ids, the bitmaps (little-endian bits, a whole byte per piece)."""
    index, ids, bits = [], [], []
    for p in pieces:
        form = _ids_form(p)
        index.append([form, p.r0, p.r1, int(p.ids.numel())])
        if form == BITMAP:
            mask = np.zeros(p.r1 - p.r0, bool)
            mask[p.ids.numpy() - p.r0] = True
            bits.append(torch.from_numpy(np.packbits(mask, bitorder="little")))
        elif form == IDS:
            ids.append(p.ids)
    out = {f"{g}/index": torch.tensor(index, dtype=torch.int64)}
    if ids:
        out[f"{g}/ids"] = torch.cat(ids).to(torch.int32 if all(i.dtype == torch.int32
                                                                for i in ids) else torch.int64)
    if bits:
        out[f"{g}/bits"] = torch.cat(bits)
    return out


def _decode_ids(tensors: Mapping[str, torch.Tensor], g: int, where: Path) -> torch.Tensor:
    """The ids of group `g` (int64, the pieces' in order) from a file's tensors
    (`_encode_ids`, or the ids alone as lrm wrote them before bitmaps)."""
    index, ids, bits = (tensors.get(f"{g}/{k}") for k in ("index", "ids", "bits"))
    if index is None:
        if ids is None:
            raise CheckpointError(f"{where}: lacks {g}/ids")
        return ids.to(torch.int64)
    ids = torch.zeros(0, dtype=torch.int64) if ids is None else ids.to(torch.int64)
    packed = np.zeros(0, np.uint8) if bits is None else bits.numpy()
    out, at_ids, at_bits = [], 0, 0
    for form, r0, r1, n in index.tolist():
        if form == EVERY:
            got = torch.arange(r0, r1, dtype=torch.int64)
        elif form == BITMAP:
            nb = -(-(r1 - r0) // 8)
            mask = np.unpackbits(packed[at_bits:at_bits + nb], count=r1 - r0,
                                 bitorder="little")
            got = torch.from_numpy(np.flatnonzero(mask)) + r0
            at_bits += nb
        elif form == IDS:
            got = ids[at_ids:at_ids + n]
            at_ids += n
        else:
            raise CheckpointError(f"{where}: group {g} stores ids in an unknown form {form}")
        if got.numel() != n:
            raise CheckpointError(f"{where}: group {g} holds {got.numel()} ids of a piece of "
                                  f"{n}")
        out.append(got)
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.int64)


def piece_bytes(n: int, span: int, cols: int, states: int, codec: str, q: str) -> int:
    """Bytes `n` rows of a shard of `span` rows take in a piece stored with `codec` in a
    chain quantized `q` (its ids, rows and states), as `write_rows` writes them (the
    states before they are packed: what the chain policy weighs is rows)."""
    ids = 0 if n == span else min(-(-span // 8), 4 * n)
    state = torch.finfo(quantize.state_dtype(q)).bits // 8
    return ids + n * (quantize.row_bytes(cols, codec) + states * state)


def write_rows(snap: Snapshot, q: str, path: Path, *, baseline: bool,
               recon: Reconstruction | None = None
               ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Quantize and write this rank's pieces: (file info, the pieces' manifest entries).

    A baseline's rows go in its chain's baseline codec, a delta's in the delta codec: as
    residuals over `recon` (which this moves to what the rows restore to) when quantized.
    Pieces of the same width and number of states are packed into one group of tensors
    (ids, stored rows, states [n, k]): loading a weights-only file costs per tensor, and
    fbgemm's operators per call."""
    codec = quantize.codecs(q)[0 if baseline else 1]
    residual = not baseline and codec != "f32"
    if residual and recon is None:
        raise ValueError("a quantized delta needs its chain's reconstruction")
    groups: dict[tuple[int, int], list[Piece]] = {}
    for p in snap.pieces:
        groups.setdefault((p.c1 - p.c0, len(p.states)), []).append(p)
    tensors: dict[str, torch.Tensor] = {}
    meta = []
    for g, ((width, k), pieces) in enumerate(sorted(groups.items())):
        at = 0
        for p in pieces:
            meta.append({"file": path.name, "group": g, "at": at, "rows": int(p.ids.numel()),
                         "table": p.table, "c0": p.c0, "c1": p.c1, "states": sorted(p.states)})
            at += int(p.ids.numel())
        tensors.update(_encode_ids(pieces, g))
        rows = torch.cat([p.rows for p in pieces])
        if residual:
            assert recon is not None
            prev = torch.cat([recon.of(p)[p.ids.long() - p.r0] for p in pieces])
            stored = quantize.encode(rows - prev, codec)
            tensors[f"{g}/residual.{codec}"] = stored
            restores = prev + quantize.decode(stored, codec, width)
        else:
            stored = quantize.encode(rows, codec)
            tensors[f"{g}/rows.{codec}"] = stored
            restores = quantize.decode(stored, codec, width) if recon is not None else None
        if recon is not None and restores is not None:
            for p, r in zip(pieces, restores.split([int(p.ids.numel()) for p in pieces]),
                            strict=True):
                recon.update(p, r, baseline)
        if k:
            compress.put(tensors, f"{g}/states", torch.cat(
                [torch.stack([p.states[n] for n in sorted(p.states)], 1) for p in pieces]
            ).to(quantize.state_dtype(q)))
    return save_tensors(tensors, path), meta


def write_dense(snap: Snapshot, path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Write the exact tensors, one flat tensor per dtype (compressed where that is
    smaller: lrm.checkpoint.compress): (file info, {key: [dtype, offset, shape]})."""
    by_dtype: dict[str, list[torch.Tensor]] = {}
    index: dict[str, Any] = {}
    for key, t in snap.dense.items():
        dt = str(t.dtype).removeprefix("torch.")
        parts = by_dtype.setdefault(dt, [])
        index[key] = [dt, sum(x.numel() for x in parts), list(t.shape)]
        parts.append(t.reshape(-1))
    tensors: dict[str, torch.Tensor] = {}
    for dt, ts in by_dtype.items():
        compress.put(tensors, dt, torch.cat(ts))
    return save_tensors(tensors, path), index


class _Files:
    """The tensor files of one checkpoint, loaded (and rows decoded) when first needed."""

    def __init__(self, entry: Entry) -> None:
        self.entry = entry
        self._loaded: dict[str, dict[str, torch.Tensor]] = {}
        self._groups: dict[tuple[str, int], tuple[torch.Tensor, ...]] = {}

    def file(self, name: str) -> dict[str, torch.Tensor]:
        if name not in self._loaded:
            self._loaded[name] = load_tensors(self.entry.path / name)
        return self._loaded[name]

    def exact(self, name: str, key: str, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """The values of an exact tensor (packed or not) as a 1-D tensor; `dtype` and
        `numel` are what the checkpoint's layout says it holds (see compress.stored)."""
        t = compress.stored(self.file(name), key, dtype, numel, self.entry.path / name)
        if t is None:
            raise CheckpointError(f"{self.entry.path / name}: lacks {key}")
        return t

    def group(self, piece: Mapping[str, Any], q: str) -> tuple[Any, ...]:
        """(ids int64, rows fp32, states [n, k] fp32 or None, whether the rows are
        residuals) of a piece's group, decoded once."""
        key = (piece["file"], piece["group"])
        if key not in self._groups:
            g, f = piece["group"], piece["file"]
            where, tensors = self.entry.path / f, self.file(f)
            ids = _decode_ids(tensors, g, where)
            stored = [k for k in tensors if k.startswith((f"{g}/rows", f"{g}/residual"))]
            if len(stored) != 1:
                raise CheckpointError(f"{where}: group {g} has no rows" if not stored else
                                      f"{where}: group {g} has rows {stored}")
            kind, _, codec = stored[0].split("/", 1)[1].partition(".")
            try:  # a bare `rows`: written before codecs were named
                rows = quantize.decode(tensors[stored[0]], codec or quantize.LEGACY[q],
                                       piece["c1"] - piece["c0"])
            except (ValueError, KeyError) as e:
                raise CheckpointError(f"{where}: group {g}: {e}") from None
            n, k = ids.shape[0], len(piece["states"])
            states = self.exact(f, f"{g}/states", quantize.state_dtype(q), n * k) \
                if k else None
            if rows.shape[0] != n or (states is not None and states.numel() != n * k):
                raise CheckpointError(f"{where}: group {g} has {n} ids but {rows.shape[0]} "
                                      f"rows" + ("" if states is None else
                                                 f" and {states.numel()} state values"))
            if states is not None:
                states = states.float().reshape(n, k)
            self._groups[key] = (ids, rows, states, kind == "residual")
        return self._groups[key]


def restore_tables(lineage: list[Entry], tables: Mapping[str, list[TableShard]]) -> int:
    """Write a chain's rows into `tables` (this rank's shards, in place); rows read."""
    base = lineage[0].manifest
    assert base is not None and base["kind"] == "baseline"
    saved = base["tables"]
    for key, shards in tables.items():
        if not shards:
            continue
        have = saved.get(key)
        if have is None or (have["rows"], have["cols"]) != (shards[0].rows, shards[0].cols):
            raise CheckpointError(f"{lineage[0].path}: table {key} "
                                  f"{'is not in it' if have is None else 'has another shape'}")
        covered = sum(p["rows"] * (p["c1"] - p["c0"]) for p in base["pieces"] if p["table"] == key)
        if covered != have["rows"] * have["cols"]:
            raise CheckpointError(f"{lineage[0].path}: the baseline holds {covered} of the "
                                  f"{have['rows'] * have['cols']} values of {key}")
    # latest row-wise state per (shard, source columns), combined at the end
    states: dict[tuple[str, int], dict[tuple[int, int], dict[str, torch.Tensor]]] = {}
    n_read = 0
    for entry in lineage:
        m = entry.manifest
        assert m is not None
        q, files = m["quantize"], _Files(entry)
        for p in m["pieces"]:
            shards = tables.get(p["table"])
            if not shards or not p["rows"]:
                continue
            for si, s in enumerate(shards):
                lo, hi = max(s.c0, p["c0"]), min(s.c1, p["c1"])
                if lo >= hi:
                    continue
                g_ids, g_rows, g_states, residual = files.group(p, q)
                span = slice(p["at"], p["at"] + p["rows"])
                ids = g_ids[span]
                pick = ((ids >= s.r0) & (ids < s.r1)).nonzero().flatten()
                if pick.numel() == 0:
                    continue
                local = ids[pick] - s.r0
                # ids ascend without repeats: a run of consecutive rows (a baseline's) is a
                # slice, far cheaper to write than an indexed scatter
                n = int(local.numel())
                if int(local[-1]) - int(local[0]) + 1 == n:
                    pick, local = slice(int(pick[0]), int(pick[0]) + n), \
                        slice(int(local[0]), int(local[0]) + n)
                rows = g_rows[span][pick][:, lo - p["c0"]:hi - p["c0"]]
                with torch.no_grad():
                    target = s.weight[local, lo - s.c0:hi - s.c0]
                    if residual:  # exactly what the writer's Reconstruction added
                        rows = target.to("cpu", torch.float32) + rows
                    s.weight[local, lo - s.c0:hi - s.c0] = rows.to(s.weight.device,
                                                                   s.weight.dtype)
                n_read += n
                by_cols = states.setdefault((p["table"], si), {})
                for name in s.states:
                    if name not in p["states"]:
                        raise CheckpointError(f"{entry.path / p['file']}: {p['table']} has no "
                                              f"{name} state")
                    acc = by_cols.setdefault((p["c0"], p["c1"]), {}).setdefault(
                        name, torch.zeros(s.weight.shape[0]))
                    assert g_states is not None
                    acc[local] = g_states[span][pick, p["states"].index(name)]
    for (key, si), by_cols in states.items():
        s = tables[key][si]
        width = s.c1 - s.c0
        for name, target in s.states.items():
            terms = [(min(s.c1, c1) - max(s.c0, c0)) / width * v[name]
                     if (c0, c1) != (s.c0, s.c1) else v[name]
                     for (c0, c1), v in sorted(by_cols.items())]
            with torch.no_grad():
                target.copy_(sum(terms[1:], terms[0]).to(target.device, target.dtype))
    return n_read


def restore_dense(entry: Entry, state: dict[str, Any], parts: set[str]) -> None:
    """Fill the non-table leaves of `state[part]` for `parts` from `entry`, in place."""
    m = entry.manifest
    assert m is not None
    values, index, file = m["dense"]["values"], m["dense"]["tensors"], m["dense"]["file"]
    files = _Files(entry)
    extent: dict[str, int] = {}  # values of each dtype's flat tensor, as the index says
    for dt, at, shape in index.values():
        extent[dt] = max(extent.get(dt, 0), at + math.prod(shape))
    prefixes = tuple(f"{p}/" for p in parts)
    wanted = {k for k in list(index) + list(values) if k.startswith(prefixes)}
    leaves = list(_walk({k: state[k] for k in parts}))
    missing = wanted - {_flat(path) for path, _ in leaves}
    if missing:
        raise CheckpointError(f"{entry.path}: holds {sorted(missing)[:3]} that this run's "
                              f"state lacks (an optimizer whose state is made lazily must "
                              f"make it before a restore)")
    for path, leaf in leaves:
        if is_sharded(leaf):
            continue
        key = _flat(path)
        if isinstance(leaf, torch.Tensor):
            if key not in index:
                raise CheckpointError(f"{entry.path / file}: lacks {key}")
            dt, at, shape = index[key]
            if list(leaf.shape) != shape:
                raise CheckpointError(f"{entry.path / file}: {key} is {tuple(shape)}, this "
                                      f"run's is {tuple(leaf.shape)}")
            dtype = getattr(torch, dt, None)
            if not isinstance(dtype, torch.dtype):
                raise CheckpointError(f"{entry.path / file}: {key} has an unknown dtype {dt}")
            flat = files.exact(file, dt, dtype, extent[dt])
            src = flat[at:at + leaf.numel()]
            if src.numel() != leaf.numel():
                raise CheckpointError(f"{entry.path / file}: {key} runs past its {dt} data")
            with torch.no_grad():
                leaf.copy_(src.view(shape))
        else:
            if key not in values:
                raise CheckpointError(f"{entry.path}: lacks the value {key}")
            parent = state
            for k in path[:-1]:
                parent = parent[k] if k in parent else parent[int(k)]
            last = path[-1] if path[-1] in parent else int(path[-1])
            v = values[key]
            parent[last] = tuple(v) if isinstance(leaf, tuple) else v

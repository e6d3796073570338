"""`lrm checkpoint ls DIR` and `lrm checkpoint verify DIR`: what a checkpoint folder holds.

`ls` lists every checkpoint (seq, step, baseline or delta, its chain, bytes, quantization,
rows written, whether its chain verifies) and the folders being written; `verify` checks
every file of every checkpoint against its manifest and raises CheckpointError (the CLI:
exit status 2) naming each bad file, or returns a one-line summary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lrm.checkpoint.store import CheckpointError, Store


def describe(store: Store) -> list[dict[str, Any]]:
    """One JSON-able row per checkpoint: name, seq, step, kind, chain, bytes, quantization,
    rows written, world size, whether its chain verifies (ok) and if not, why (problems)."""
    entries = store.entries()
    by_name = {e.name: e for e in entries}
    out = []
    for e in entries:
        m = e.manifest or {}
        _, problems = store.lineage(e, by_name)
        out.append({"name": e.name, "seq": e.seq, "step": e.step, "kind": e.kind,
                    "chain": e.chain, "bytes": e.bytes, "quantize": m.get("quantize"),
                    "rows": m.get("rows_written"), "world_size": m.get("world_size"),
                    "ok": not problems, "problems": problems})
    return out


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _folder(root: Path) -> Store:
    if Path(root).exists() and not Path(root).is_dir():  # (it said "no such folder")
        raise CheckpointError(f"{root}: a file, not a checkpoint folder")
    if not Path(root).is_dir():
        raise CheckpointError(f"{root}: no such checkpoint folder")
    return Store(root)


def _chains_below(root: Path) -> str:
    """"; its subfolders A, B hold checkpoints" when `root` holds folders of them (a
    stream's checkpoints/: teacher/, students/NAME/), else ""."""
    found = sorted(str(p.relative_to(root)) for p in Path(root).glob("*") if p.is_dir()
                   and Store(p).entries()) + sorted(
        str(p.relative_to(root)) for p in Path(root).glob("*/*") if p.is_dir()
        and Store(p).entries())
    return f"; its subfolders {', '.join(found)} hold checkpoints" if found else ""


def ls(root: Path) -> str:
    """The listing `lrm checkpoint ls` prints."""
    store = _folder(root)
    table = describe(store)
    head = ("checkpoint", "step", "kind", "chain", "bytes", "quantize", "rows", "verified")
    lines = [head]
    for r in table:
        lines.append((r["name"], str(r["step"]), r["kind"], r["chain"] or "?", _size(r["bytes"]),
                      r["quantize"] or "?", "?" if r["rows"] is None else str(r["rows"]),
                      "yes" if r["ok"] else "NO: " + r["problems"][0]))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head) - 1)]
    out = ["  ".join(c.ljust(w) for c, w in zip(line[:-1], widths, strict=True)) + "  " + line[-1]
           for line in lines]
    if len(lines) == 1:
        out.append(f"(no checkpoints in {root}{_chains_below(root)})")
    for p in store.temps():
        out.append(f"{p.name}: unfinished (never read; the next run removes it)")
    for p in store.legacy():
        out.append(f"{p.name}: a DCP checkpoint of an older lrm (not read)")
    return "\n".join(out)


def verify(root: Path) -> str:
    """Check every checkpoint in `root`; raise CheckpointError naming what is wrong."""
    store = _folder(root)
    table = describe(store)
    bad = [p for r in table if not r["ok"] for p in r["problems"]]
    bad = list(dict.fromkeys(bad))  # a bad baseline shows in each delta after it
    if bad:
        good = [r["name"] for r in table if r["ok"]]
        fallback = f"; newest restorable: {good[-1]}" if good else "; none restorable"
        raise CheckpointError(f"{len(bad)} problem(s) in {root}: {'; '.join(bad)}{fallback}")
    if not table:
        raise CheckpointError(f"{root}: no checkpoints{_chains_below(root)}")
    newest = table[-1]
    return (f"{len(table)} checkpoint(s) in {root} verify; newest {newest['name']} "
            f"(step {newest['step']}, {newest['kind']})")

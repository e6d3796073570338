"""Corruption and tampering of a checkpoint folder, every file kind and every way: each is
caught before anything it says is believed, named in one line by `lrm checkpoint verify`
(exit 2) and in the resume's log line, and the resume restores, exactly, the newest
checkpoint whose whole chain still verifies. Nothing in a checkpoint is ever unpickled, and
no path a manifest names leads outside its folder.

Corruption (what a disk, a copy or a stray write does): each file kind (rows-0.pt, state.pt,
part-0.json, manifest.json) flipped, truncated or deleted. Tampering (what someone who
edits files does): the manifest edited (a piece's row offset, a dense tensor's offset, the
quantization, a file's hash after swapping the file), a delta's parent swapped for another
checkpoint, paths escaping the folder (dense.file, pieces[].file, a file that is a symbolic
link to an outside copy), and a pickled object with every hash recomputed.
"""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch
from typer.testing import CliRunner

from flows.cli import app
from lrm.checkpoint import CheckpointManager
from lrm.checkpoint.store import manifest_digest
from lrm.io import read_sha256
from tests.checkpoint.conftest import CFG, ID, NAMES, build, chain, env, \
    tables_and_state  # noqa: F401  (fixtures)

NEWEST = NAMES[10]


# -- the damage -------------------------------------------------------------------------

def _flip(path, at=0.5, n=64):
    data = bytearray(path.read_bytes())
    i = min(int(len(data) * at), max(len(data) - n, 0))
    data[i:i + n] = bytes(b ^ 0xFF for b in data[i:i + n])
    path.write_bytes(bytes(data))


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _manifest(folder):
    return json.loads((folder / "manifest.json").read_text())


def _rewrite(folder, edit, rehash):
    """Edit the manifest; `rehash`: recompute its own sha256 as one who knows the format."""
    m = _manifest(folder)
    edit(m)
    if rehash:
        m["sha256"] = manifest_digest(m)
    (folder / "manifest.json").write_text(json.dumps(m, indent=1, sort_keys=True))


class _Evil:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):  # unpickling it would create a file
        return (open, (self.path, "w"))


def _pickled(folder, name, marker):
    """`name` replaced by a pickled object, the manifest's hashes all made to match."""
    torch.save({"0/ids": _Evil(str(marker))}, folder / name)

    def edit(m):
        m["files"][name] = {"bytes": (folder / name).stat().st_size,
                            "sha256": read_sha256(folder / name)}
    _rewrite(folder, edit, rehash=True)


def _outside(root, folder, key):
    """A copy of state.pt outside the folder, named by the manifest (rehashed)."""
    out = root.parent / "outside"
    out.mkdir(exist_ok=True)
    shutil.copy(folder / "state.pt", out / "state.pt")

    def edit(m):
        target = "../../outside/state.pt"
        if key == "dense":
            m["dense"]["file"] = target
        else:
            m["pieces"][0]["file"] = target
    _rewrite(folder, edit, rehash=True)


def _symlinked(root, folder):
    """rows-0.pt replaced by a symbolic link to an identical copy outside the folder."""
    out = root.parent / "outside-rows.pt"
    shutil.copy(folder / "rows-0.pt", out)
    (folder / "rows-0.pt").unlink()
    (folder / "rows-0.pt").symlink_to(out)


def _swap_parent(root):
    """The delta at step 10's parent (step 8) replaced by another checkpoint under its name
    (step 6's files, its manifest rewritten and rehashed to claim the name)."""
    parent = root / NAMES[8]
    shutil.rmtree(parent)
    shutil.copytree(root / NAMES[6], parent)

    def edit(m):
        m.update(seq=4, step=8, kind="baseline", parent=None, chain=NAMES[8])
    _rewrite(parent, edit, rehash=True)


CORRUPTION = {  # case: (damage(root, newest folder), restored step, named in the messages)
    **{f"{f} {how}": (lambda r, d, f=f, how=how: {
        "flipped": _flip, "truncated": _truncate, "deleted": lambda p: p.unlink()}[how](d / f),
        8, f"{NEWEST}/{f}")
       for f in ("rows-0.pt", "state.pt", "part-0.json", "manifest.json")
       for how in ("flipped", "truncated", "deleted")},
    "a baseline flipped": (lambda r, d: _flip(r / NAMES[8] / "rows-0.pt"), 6,
                           f"{NAMES[8]}/rows-0.pt: sha256 differs"),
    "a delta gone": (lambda r, d: (shutil.rmtree(r / NAMES[4]), _flip(r / NAMES[8] / "rows-0.pt")),
                     2, f"its parent {{root}}/{NAMES[4]} is missing"),
    "every chain bad": (lambda r, d: (_flip(r / NAMES[2] / "rows-0.pt"),
                                      _flip(r / NAMES[8] / "rows-0.pt")),
                        None, f"{NAMES[8]}/rows-0.pt: sha256 differs"),
}
EDITED = "manifest.json: its sha256 does not match its content"
TAMPERING = {
    "a piece's row offset + 1": (lambda r, d: _rewrite(
        d, lambda m: m["pieces"][0].update(at=m["pieces"][0]["at"] + 1), False), 8,
        f"{NEWEST}/{EDITED}"),
    "a dense offset + 1": (lambda r, d: _rewrite(d, lambda m: next(
        t for t in m["dense"]["tensors"].values()).__setitem__(1, 1), False), 8,
        f"{NEWEST}/{EDITED}"),
    "quantize none -> int8": (lambda r, d: _rewrite(d, lambda m: m.update(quantize="int8"),
                                                    False), 8, f"{NEWEST}/{EDITED}"),
    "a file swapped, its hash edited": (lambda r, d: (
        shutil.copy(r / NAMES[8] / "rows-0.pt", d / "rows-0.pt"),
        _rewrite(d, lambda m: m["files"].update({"rows-0.pt": {
            "bytes": (d / "rows-0.pt").stat().st_size,
            "sha256": read_sha256(d / "rows-0.pt")}}), False)), 8, f"{NEWEST}/{EDITED}"),
    "a parent swapped": (lambda r, d: _swap_parent(r), 6,
                         f"{NEWEST}: its parent {NAMES[8]} is not the checkpoint it was "
                         f"written after"),
    "dense.file outside": (lambda r, d: _outside(r, d, "dense"), 8,
                           f"{NEWEST}/manifest.json: malformed (dense: its file is not one"),
    "pieces[].file outside": (lambda r, d: _outside(r, d, "pieces"), 8,
                              f"{NEWEST}/manifest.json: malformed (pieces: a piece whose "
                              f"file is not one"),
    "a file a symlink out": (lambda r, d: _symlinked(r, d), 8,
                             f"{NEWEST}/rows-0.pt: a symbolic link"),
}


def _case(cases, name, chain, tmp_path):
    src, states = chain
    root = tmp_path / "ck"
    shutil.copytree(src, root, symlinks=True)
    damage, step, named = cases[name]
    damage(root, root / NEWEST)
    return root, states, step, named.replace("{root}", str(root))


def _verify(root):
    r = CliRunner().invoke(app, ["checkpoint", "verify", str(root)])
    return r.exit_code, r.stderr.strip()


def _resume(env, root, caplog):  # noqa: F811
    _, parts = build(env)
    caplog.clear()
    caplog.set_level(logging.INFO, logger="lrm")
    with CheckpointManager(root, env, CFG, ID) as ck:
        step = ck.start(parts, True)
    return step, parts, [r.getMessage() for r in caplog.records if r.name == "lrm"]


@pytest.mark.parametrize("case", list(CORRUPTION) + list(TAMPERING))
def test_caught_named_and_the_newest_good_checkpoint_restored(env, chain, tmp_path, caplog,  # noqa: F811
                                                              case):
    cases = CORRUPTION if case in CORRUPTION else TAMPERING
    root, states, step, named = _case(cases, case, chain, tmp_path)
    code, err = _verify(root)
    assert code == 2 and "\n" not in err and named in err, err
    got_step, parts, said = _resume(env, root, caplog)
    assert got_step == step
    assert any(named in m and "\n" not in m for m in said), said  # one line names it
    if step is None:
        assert parts["train"].step == 0  # nothing restorable: a fresh start
        return
    got = tables_and_state(parts, env)
    assert all(torch.equal(got[k], v) for k, v in states[step].items())  # that state, exactly


def test_a_pickle_with_every_hash_recomputed_is_refused_unread(env, chain, tmp_path,  # noqa: F811
                                                                caplog):
    """Every hash matches (someone who knows the format): only the load can tell. It reads
    tensors only, so the object is refused, its code never runs, and the checkpoint is
    passed over like a damaged one."""
    src, states = chain
    root = tmp_path / "ck"
    shutil.copytree(src, root)
    marker = tmp_path / "pwned"
    _pickled(root / NEWEST, "rows-0.pt", marker)
    assert _verify(root)[0] == 0
    step, parts, said = _resume(env, root, caplog)
    assert step == 8 and not marker.exists()
    named = f"{NEWEST}/rows-0.pt: unreadable (UnpicklingError: Weights only load failed)"
    assert any(named in m and "\n" not in m and "\x1b" not in m for m in said), said
    got = tables_and_state(parts, env)
    assert all(torch.equal(got[k], v) for k, v in states[8].items())

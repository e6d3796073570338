"""The lossless packing of a checkpoint's exact tensors: bit for bit back, packed only where
smaller, a mostly-zero row-wise state far smaller, damage named; and what a checkpoint
writes is packed (the row-wise state, the dense part per dtype; a baseline's ids: nothing)."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pyarrow as pa
import pytest
import torch
from typer.testing import CliRunner

from flows.cli import app

from lrm.checkpoint import CheckpointManager, compress, quantize
from lrm.checkpoint.snapshot import Snapshot, restore_dense, write_dense
from lrm.checkpoint.store import CheckpointError, Entry, Store, load_tensors, manifest_digest
from lrm.io import save_tensors
from tests.checkpoint.conftest import CFG, ID, NAMES, build, tables_and_state


@pytest.mark.parametrize("dtype,numel", [(torch.uint8, 5000), (torch.float32, 1),
                                         (torch.float32, 5000)])
def test_an_unpacked_tensor_owns_writable_memory(dtype, numel, monkeypatch):
    """The decompressed bytes are read-only; a tensor over them (one-byte values or one
    value, where the transpose needs no copy) would be written into by a restore that
    updates it in place: undefined behaviour, which torch only warns of once a process."""
    made = []

    def from_numpy(a):
        made.append(a.flags.writeable)
        return real(a)

    real = torch.from_numpy
    monkeypatch.setattr(compress.torch, "from_numpy", from_numpy)
    t = torch.zeros(numel, dtype=dtype)  # all zeros: packs smaller, even one value's planes
    blob = torch.frombuffer(bytearray(pa.Codec("zstd", compression_level=1).compress(
        compress._planes(t), asbytes=True)), dtype=torch.uint8)
    got = compress.unpack(blob, dtype, numel, "f")
    assert made == [True] and torch.equal(got, t)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int64])
def test_round_trip_is_bit_exact(dtype):
    g = torch.Generator().manual_seed(0)
    t = (torch.randn(5000, generator=g) * 0.05).to(dtype)  # weights-like: packs smaller
    if dtype.is_floating_point:
        t[:4] = torch.tensor([float("nan"), float("inf"), -0.0, 1e-30]).to(dtype)
    blob = compress.pack(t)
    assert blob is not None and blob.dtype == torch.uint8
    assert blob.numel() < t.numel() * t.element_size()
    got = compress.unpack(blob, dtype, t.numel(), "f")
    assert got.dtype == dtype
    assert torch.equal(got.view(torch.uint8), t.view(torch.uint8))  # NaN, -0.0 included
    # one value (never packed smaller, but a file may hold it): its planes are its bytes
    one = t[4:5]
    blob = torch.frombuffer(bytearray(pa.Codec("zstd").compress(
        one.view(torch.uint8).numpy(), asbytes=True)), dtype=torch.uint8)
    assert torch.equal(compress.unpack(blob, dtype, 1, "f").view(torch.uint8),
                       one.view(torch.uint8))


def test_packed_only_where_smaller_and_read_either_way():
    noise = torch.randint(0, 256, (4096,), dtype=torch.uint8, generator=torch.Generator()
                          .manual_seed(1)).view(torch.float32)  # random bits: incompressible
    state = torch.zeros(100_000, 1, dtype=torch.bfloat16)  # rows no batch reached: 0
    state[::20] = torch.rand(5000, 1).to(torch.bfloat16)
    out: dict[str, torch.Tensor] = {}
    compress.put(out, "noise", noise)
    compress.put(out, "0/states", state)
    assert set(out) == {"noise", "0/states.zst"}
    assert out["0/states.zst"].numel() < state.numel() * 2 / 5
    for key, t in (("noise", noise), ("0/states", state)):
        got = compress.stored(out, key, t.dtype, t.numel(), "f")
        assert got is not None
        assert torch.equal(got.view(torch.uint8), t.reshape(-1).view(torch.uint8))
    assert compress.stored(out, "absent", torch.float32, 1, "f") is None


def test_damage_and_a_size_other_than_the_layout_says_are_named(tmp_path):
    t = torch.zeros(1000)
    blob = compress.pack(t)
    assert blob is not None
    with pytest.raises(CheckpointError, match="f: does not unpack to 999 torch.float32"):
        compress.unpack(blob, torch.float32, 999, "f")
    bad = blob.clone()
    bad[len(bad) // 2:] ^= 0x5A
    with pytest.raises(CheckpointError, match="does not unpack"):
        compress.unpack(bad, torch.float32, 1000, "f")
    with pytest.raises(CheckpointError, match="x.zst is not a packed byte string"):
        compress.stored({"x.zst": t}, "x", torch.float32, 1000, tmp_path)


def test_a_checkpoint_packs_its_exact_tensors_and_a_baseline_stores_no_ids(chain):
    """The fixture's chain (fp32: the row-wise state exact) as the manager wrote it."""
    root, _ = chain
    entries = {e.name: e for e in Store(root).entries()}
    base = load_tensors(entries[NAMES[8]].path / "rows-0.pt")
    delta = load_tensors(entries[NAMES[10]].path / "rows-0.pt")
    assert "0/states.zst" in base and "0/states" not in base
    assert not {"0/ids", "0/bits"} & set(base)  # every row of each table: nothing stored
    assert base["0/index"][:, 0].tolist() == [2, 2]
    assert "0/ids" in delta or "0/bits" in delta


def test_the_dense_part_is_packed_per_dtype_and_restores_exactly(tmp_path):
    """A dense layer's weights (packed: smaller) and an int64 step (4 bytes: not)."""
    weight = torch.randn(64, 94, generator=torch.Generator().manual_seed(2)) * 0.1
    snap = Snapshot([], {"model/w": weight, "train/step": torch.tensor(7)}, {}, {})
    folder = tmp_path / "000001-step-7"
    folder.mkdir()
    _, index = write_dense(snap, folder / "state.pt")
    assert set(load_tensors(folder / "state.pt")) == {"float32.zst", "int64"}
    entry = Entry(folder, 1, 7, {"dense": {"file": "state.pt", "tensors": index, "values": {}}})
    state = {"model": {"w": torch.zeros(64, 94)}, "train": {"step": torch.tensor(0)}}
    restore_dense(entry, state, {"model", "train"})
    assert torch.equal(state["model"]["w"], weight) and int(state["train"]["step"]) == 7



def _as_format_2(folder, parent_sha256):
    """Rewrite a checkpoint as lrm-checkpoint/2 wrote it: every exact tensor plain, a piece of
    every row of its shard as a bitmap of ones; files and manifest rehashed (a delta's link
    to its parent too). Returns the manifest's new sha256."""
    m = json.loads((folder / "manifest.json").read_text())
    extent = {}  # the number of values of each packed tensor, from the manifest's layout
    for dt, at, shape in m["dense"]["tensors"].values():
        extent[dt] = max(extent.get(dt, 0), at + math.prod(shape))
    for p in m["pieces"]:
        key = f"{p['group']}/states"
        extent[key] = extent.get(key, 0) + p["rows"] * len(p["states"])
    for name in [n for n in m["files"] if n.endswith(".pt")]:
        tensors = {k: v.clone() for k, v in load_tensors(folder / name).items()}  # unmapped
        for key in [k for k in tensors if k.endswith(compress.SUFFIX)]:
            plain = key.removesuffix(compress.SUFFIX)
            dtype = quantize.state_dtype(m["quantize"]) if "/" in plain else getattr(torch, plain)
            tensors[plain] = compress.unpack(tensors.pop(key), dtype, extent[plain], key)
            if "/" in plain:
                tensors[plain] = tensors[plain].reshape(-1, 1)  # [n, k]: one state a row
        for key in [k for k in tensors if k.endswith("/index")]:
            index = tensors[key].clone()
            if (index[:, 0] == 2).any():
                assert (index[:, 0] == 2).all()  # a baseline's group: each piece every row
                index[:, 0] = 1
                tensors[key.replace("index", "bits")] = torch.cat([torch.from_numpy(
                    np.packbits(np.ones(r1 - r0, bool), bitorder="little"))
                    for _, r0, r1, _ in index.tolist()])
                tensors[key] = index
        m["files"][name] = save_tensors(tensors, folder / name)
    m["format"] = "lrm-checkpoint/2"
    if parent_sha256 is not None:
        m["parent_sha256"] = parent_sha256
    m["sha256"] = manifest_digest(m)
    (folder / "manifest.json").write_text(json.dumps(m))
    return m["sha256"]


def test_a_chain_lrm_checkpoint_2_wrote_restores_exactly_and_1_is_refused(env, chain, tmp_path):
    """Checkpoints written before packing (format 2) still restore, exactly; format 1's
    (whose manifests carry no hash of their own) are named and passed over, exit 2."""
    src, states = chain
    root = tmp_path / "ck"
    shutil.copytree(src, root)
    sha = _as_format_2(root / NAMES[8], None)
    _as_format_2(root / NAMES[10], sha)
    for name in (NAMES[8], NAMES[10]):
        assert not any(k.endswith(compress.SUFFIX) for f in ("rows-0.pt", "state.pt")
                       for k in load_tensors(root / name / f))
    assert [e.manifest["format"] for e in Store(root).entries()][-2:] == ["lrm-checkpoint/2"] * 2
    _, parts = build(env)
    with CheckpointManager(root, env, CFG, ID) as ck:
        assert ck.start(parts, True) == 10
    got = tables_and_state(parts, env)
    assert got.keys() == states[10].keys()
    assert all(torch.equal(got[k], v) for k, v in states[10].items())
    # format 1: named, passed over (the chain before it restores), `verify` exits 2
    m = json.loads((root / NAMES[10] / "manifest.json").read_text())
    m["format"] = "lrm-checkpoint/1"
    (root / NAMES[10] / "manifest.json").write_text(json.dumps(m))
    r = CliRunner().invoke(app, ["checkpoint", "verify", str(root)])
    assert r.exit_code == 2 and "written by an older lrm (lrm-checkpoint/1" in r.stderr
    _, parts = build(env)
    with CheckpointManager(root, env, CFG, ID) as ck:
        assert ck.start(parts, True) == 8

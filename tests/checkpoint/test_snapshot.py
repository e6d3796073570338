"""How a checkpoint stores rows: no ids for a piece of every row of its shard (a
baseline's), else ids as bitmaps where smaller or as ids, damage in them named; files
written before codecs were named (bare `ids` and `rows`, int8 with fp32 scales) still
restore."""

from __future__ import annotations

import pytest
import torch

from lrm.checkpoint import quantize
from lrm.checkpoint.snapshot import Piece, _decode_ids, _encode_ids, piece_bytes, \
    restore_tables
from lrm.checkpoint.store import CheckpointError, Entry
from lrm.checkpoint.tables import TableShard
from lrm.io import save_tensors


def _piece(r0: int, r1: int, ids: list[int]) -> Piece:
    n = len(ids)
    return Piece("t", 0, 4, r0, r1, torch.tensor(ids, dtype=torch.int32), torch.zeros(n, 4))


def test_ids_are_bitmaps_where_smaller_and_come_back_in_order(tmp_path):
    every = _piece(100, 1100, list(range(100, 1100)))  # a baseline's shard: nothing stored
    sparse = _piece(0, 10**6, [5, 70_000, 999_999])  # 12 bytes of ids, not 125,000
    dense = _piece(0, 64, list(range(0, 64, 3)))  # 22 ids: 88 bytes, or 8 as bits
    most = _piece(0, 80, list(range(1, 80)))  # all but one row: 10 bytes of bits
    tensors = _encode_ids([every, sparse, dense, most], 0)
    assert tensors["0/index"][:, 0].tolist() == [2, 0, 1, 1]
    assert tensors["0/ids"].tolist() == [5, 70_000, 999_999]
    assert tensors["0/bits"].numel() == 8 + 10
    got = _decode_ids(tensors, 0, tmp_path)
    assert got.tolist() == (every.ids.tolist() + sparse.ids.tolist() + dense.ids.tolist()
                            + most.ids.tolist())
    assert got.dtype == torch.int64
    # what `piece_bytes` (the chain policy's estimate) counts for the ids is what is stored
    assert sum(piece_bytes(p.ids.numel(), p.r1 - p.r0, 4, 0, "f32", "none") - 16 * p.ids.numel()
               for p in (every, sparse, dense, most)) == 12 + 8 + 10
    # a bitmap that does not hold its piece's count of rows is named, not read wrong
    tensors["0/bits"][3] ^= 1
    with pytest.raises(CheckpointError, match="group 0 holds 21 ids of a piece of 22"):
        _decode_ids(tensors, 0, tmp_path)


def test_files_before_named_codecs_restore(tmp_path):
    """Bare `0/ids` and `0/rows`: int8 rows with fp32 scales (fused8), as lrm wrote them."""
    rows = torch.randn(6, 4)
    ids = torch.tensor([0, 1, 2, 3, 4, 5], dtype=torch.int32)
    folder = tmp_path / "000001-step-3"
    folder.mkdir()
    save_tensors({"0/ids": ids, "0/rows": quantize.encode(rows, "fused8"),
                  "0/states": torch.arange(6.0).unsqueeze(1)}, folder / "rows-0.pt")
    manifest = {"kind": "baseline", "quantize": "int8", "tables": {"t": {"rows": 6, "cols": 4}},
                "pieces": [{"file": "rows-0.pt", "group": 0, "at": 0, "rows": 6, "table": "t",
                            "c0": 0, "c1": 4, "states": ["m"]}]}
    shard = TableShard("t", 6, 4, torch.zeros(6, 4), 0, 0, {"m": torch.zeros(6)})
    assert restore_tables([Entry(folder, 1, 3, manifest)], {"t": [shard]}) == 6
    assert torch.equal(shard.weight, quantize.decode(quantize.encode(rows, "fused8"),
                                                     "fused8", 4))
    assert torch.equal(shard.states["m"], torch.arange(6.0))

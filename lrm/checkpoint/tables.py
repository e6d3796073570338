"""The embedding tables of a run's state, as shards in global row space.

A sharded model's state dict holds each table as a ShardedTensor (DMP: table-, column- or
row-wise shards, one or more on this rank), and the fused optimizer's state dict holds the
row-wise Adagrad state of each table as a 1-D ShardedTensor, one value per row of each
shard. `table_shards` pairs them: every local shard of a table is a `TableShard`, a view of
rows [r0, r0 + n) x columns [c0, c0 + w) of the table (in the table's global row and column
space) with the views of its row-wise optimizer state. Writing into the views writes into
the model and the optimizer, so a restore fills them in place.

Column-wise shards each keep their own row-wise state (the mean square gradient over the
shard's columns); torchrec lays it out as a row-wise sharded tensor of rows x shards, the
k-th block for the k-th shard by column offset (see `_state_offset`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.tensor import DTensor


@dataclass
class TableShard:
    """One local shard of a table (see the module docstring)."""

    key: str  # the table weight's state-dict key
    rows: int  # the table's rows and columns
    cols: int
    weight: torch.Tensor  # [n, w] view of rows [r0, r0 + n), columns [c0, c0 + w)
    r0: int
    c0: int
    states: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [n] view

    @property
    def r1(self) -> int:
        return self.r0 + self.weight.shape[0]

    @property
    def c1(self) -> int:
        return self.c0 + self.weight.shape[1]


def is_sharded(t: Any) -> bool:
    return isinstance(t, (ShardedTensor, DTensor))


def _state_offset(weight: ShardedTensor, r0: int, c0: int) -> int:
    """Where the row-wise state of the weight's shard at (r0, c0) starts in the 1-D state
    tensor: torchrec stacks column-wise shards' states (by column offset), else by row."""
    shards = weight.metadata().shards_metadata
    col_offsets = sorted({s.shard_offsets[1] for s in shards})
    if len(col_offsets) == 1:  # table-wise or row-wise
        return r0
    if any(s.shard_offsets[0] != 0 for s in shards) or len(col_offsets) != len(shards):
        raise NotImplementedError(f"{weight.size()} table split both ways (grid sharding): "
                                  f"its row-wise optimizer state layout is not supported")
    return col_offsets.index(c0) * weight.metadata().size[0]


def table_shards(model_state: Mapping[str, Any], optim_state: Mapping[str, Any] | None
                 ) -> dict[str, list[TableShard]]:
    """{table weight key: its local shards}, from a sharded model's and its optimizer's
    state dicts (a rank holding no shard of a table has an empty list)."""
    per_param = (optim_state or {}).get("state", {})
    out: dict[str, list[TableShard]] = {}
    for key, t in model_state.items():
        if not is_sharded(t):
            continue
        # shapes from the metadata: ShardedTensor.dim()/size() go through __torch_function__
        size = t.metadata().size if isinstance(t, ShardedTensor) else t.shape
        if not isinstance(t, ShardedTensor) or len(size) != 2:
            raise NotImplementedError(f"{key}: a {type(t).__name__} of {len(size)} dims; lrm "
                                      f"checkpoints tables held as 2-D ShardedTensors")
        rows, cols = size
        states: dict[str, dict[int, torch.Tensor]] = {}
        for name, st in per_param.get(key, {}).items():
            if not isinstance(st, ShardedTensor) or len(st.metadata().size) != 1:
                raise NotImplementedError(
                    f"{key}: optimizer state {name} is not row-wise (one value per row); lrm "
                    f"checkpoints the row-wise state of fbgemm's fused optimizers")
            states[name] = {s.metadata.shard_offsets[0]: s.tensor for s in st.local_shards()}
        shards = []
        for s in t.local_shards():
            r0, c0 = s.metadata.shard_offsets
            view = {}
            if states:
                at = _state_offset(t, r0, c0)
                for name, by_offset in states.items():
                    sv = by_offset.get(at)
                    if sv is None or sv.shape[0] != s.tensor.shape[0]:
                        raise ValueError(f"{key}: no {name} state for the shard at rows {r0}, "
                                         f"columns {c0}")
                    view[name] = sv
            shards.append(TableShard(key=key, rows=rows, cols=cols, weight=s.tensor, r0=r0,
                                     c0=c0, states=view))
        out[key] = shards
    return out

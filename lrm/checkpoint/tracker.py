"""Which embedding rows changed since the last checkpoint: read off the fused optimizer.

fbgemm's fused row-wise Adagrad keeps one value per row, the sum of the row's mean square
gradients, and adds to it in the backward of every lookup that reaches the row: the rows
whose state moved since the last checkpoint are the rows training changed. A checkpoint
compares each table's state with a copy kept from the previous one (one value per row):
no work at all in a training step, a compare per table at a save. Measured on the default
student (bench/checkpoint.py's run, 2 shared CPU cores): torchrec's ModelDeltaTracker,
which this replaces, spent 0.48 ms a step recording, merging and reading ids (record 0.13,
merges every 32 steps 0.26, read 0.09) of a 13 ms step; a per-table bitmap filled from
each batch's ids 0.22 ms; the compare 1.4 ms per save, 0.014 ms a step at a save every
100 steps. It also sees what the lookups' hooks cannot: a CUDA graph's replayed steps,
and nothing of a held-out evaluation (which updates no state).

Exactness: a step that changes a row adds mean(g^2) > 0 to its state. The sum stays the
same only when mean(g^2) is below half a float32 step of the sum (2^-24 of it): the row
then moved by less than lr * 2^-12 per value, and the next delta in which its state moves
holds it. Over the 1100 steps of the benchmark's run the rows whose weights changed were
exactly the rows whose state changed, in every table (tests/checkpoint/test_tracker.py
checks it on its toy tables).

A table without a row-wise state (not trained by a fused row-wise optimizer) has no
record of its rows: every row of it is reported.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from lrm.checkpoint.tables import TableShard


class RowTracker:
    """The rows of each table changed since the last `take()` (or `reset()`)."""

    def __init__(self) -> None:
        # (table key, r0, c0) -> the shard's row-wise state when last taken
        self._seen: dict[tuple[str, int, int], torch.Tensor] = {}

    def take(self, tables: Mapping[str, list[TableShard]]) -> dict[str, torch.Tensor] | None:
        """{table key: sorted global row ids changed since the last take}, and remember
        the tables as they are now. None when there is nothing to compare with (the first
        take, or this rank's shards changed): every row is to be saved."""
        seen = self._seen
        self.reset(tables)
        if any(seen.get(k) is None or seen[k].shape != v.shape for k, v in self._seen.items()):
            return None
        out: dict[str, torch.Tensor] = {}
        for key, shards in tables.items():
            ids = [torch.arange(s.r0, s.r1) if not s.states else
                   (self._seen[key, s.r0, s.c0] != seen[key, s.r0, s.c0]).nonzero().flatten()
                   .cpu() + s.r0 for s in shards]
            # column shards of a table hold the same rows: their ids are one set
            out[key] = torch.unique(torch.cat(ids)) if len(ids) > 1 else \
                ids[0] if ids else torch.empty(0, dtype=torch.int64)
        return out

    def forget(self) -> None:
        """The tables were written other than by the optimizer (a best state put back):
        the next `take()` reports every row."""
        self._seen = {}

    def reset(self, tables: Mapping[str, list[TableShard]]) -> None:
        """Remember the tables as they are now (after a save or a restore)."""
        self._seen = {(key, s.r0, s.c0): s.states[min(s.states)].detach().clone()
                      for key, shards in tables.items() for s in shards if s.states}

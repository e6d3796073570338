"""Which embedding rows changed since the last checkpoint: torchrec's ModelDeltaTracker.

torchrec's tracker (ID_ONLY mode) hooks the sharded EmbeddingBagCollections' post-lookup
callback and records, per table, the ids each local lookup received. With fbgemm's fused
row-wise Adagrad the rows a step updates are exactly the rows its lookups read (the update
runs in the lookup's backward; a row that is not looked up keeps its weight and state), so
the ids recorded since the last checkpoint are the rows a delta must hold. Checked on CPU
with torchrec 1.8 and the fused optimizer (tests/checkpoint/test_tracker.py). Why the
tracker rather than the ids of each batch's KJT: it records at the lookup, after the input
dist, so (a) each rank sees exactly the ids of its own shards (no all-reduce of id sets),
and (b) a pipelined loop (TrainPipelineSparseDist copies and distributes batch i + 1 during
step i) cannot attribute a batch's ids to the wrong side of a checkpoint.

Two things added here: lookups of a model in eval mode (held-out evaluation) are not
recorded (they change no row), and ids are turned into global row ids (a row-wise shard's
lookup receives ids local to its block of rows; table- and column-wise shards start at 0).
Row-wise sharding has no CPU kernel in torchrec 1.8, so that mapping is untested here.
The DeltaStore keeps every batch's ids until read: `compact()` merges them (the manager
calls it every few steps) so memory stays about the number of distinct rows touched.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torchrec.distributed.model_tracker.model_delta_tracker import ModelDeltaTrackerTrec
from torchrec.distributed.model_tracker.types import TrackingMode, UniqueRows
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lrm.checkpoint.tables import TableShard

NAME = "lrm_checkpoint"  # the tracker's name among the DMP's model_trackers


class _TrainLookups(ModelDeltaTrackerTrec):
    """ModelDeltaTrackerTrec that ignores lookups made in eval mode."""

    def record_lookup(self, kjt: KeyedJaggedTensor, states: torch.Tensor,
                      emb_module: nn.Module | None = None,
                      raw_ids: torch.Tensor | None = None) -> None:
        if emb_module is not None and not emb_module.training:
            return
        super().record_lookup(kjt, states, emb_module, raw_ids)

    def record_ids(self, kjt: KeyedJaggedTensor) -> None:
        # torchrec's reads each key with kjt[key], which recomputes the KJT's offsets per
        # key (~0.5 ms a step for the student's 11 features, ~2% of a CPU step); one
        # split by length_per_key gives the same ids per table
        per_table: dict[str, list[torch.Tensor]] = {}
        for key, ids in zip(kjt.keys(), kjt.values().split(kjt.length_per_key()), strict=True):
            per_table.setdefault(self.feature_to_fqn[key], []).append(ids)
        for fqn, ids_list in per_table.items():
            self.store.append(batch_idx=self.curr_batch_idx, fqn=fqn,
                              ids=ids_list[0] if len(ids_list) == 1 else torch.cat(ids_list),
                              states=None)

    def get_unique(self, *args: Any, **kwargs: Any) -> dict[str, UniqueRows]:
        # torchrec 1.8: a read with delete_on_read leaves a table's list of lookups empty,
        # and the next read of a table not looked up since fails on torch.cat([])
        store = self.store.per_fqn_lookups
        for fqn in [f for f, lookups in store.items() if not lookups]:
            del store[fqn]
        return super().get_unique(*args, **kwargs)


class _Holder(nn.Module):
    """A module's parent under the name `module`, as DistributedDataParallel holds it."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module


class RowTracker:
    """The rows of each table looked up in training since the last `take()`."""

    def __init__(self, dmp: nn.Module) -> None:
        """dmp: a DistributedModelParallel; its forward advances the tracker's batch count."""
        trackers = getattr(dmp, "model_trackers", None)
        if trackers is None:
            raise TypeError(f"{type(dmp).__name__} is not a DistributedModelParallel")
        # what DMP.init_torchrec_delta_tracker passes: the data-parallel wrapped module;
        # one process has no DDP wrapper (lrm.sharding.parallel), and torchrec's tracker
        # reads `.module` of what it gets: a holder gives the same names as DDP would
        wrapped = dmp._dmp_wrapped_module
        if not hasattr(wrapped, "module"):
            wrapped = _Holder(wrapped)
        self._tracker = _TrainLookups(wrapped,  # type: ignore[arg-type]
                                      mode=TrackingMode.ID_ONLY, delete_on_read=True)
        trackers[NAME] = self._tracker  # DMP.forward calls its step() before each lookup
        self._dmp = dmp

    def compact(self) -> None:
        """Merge the ids recorded so far into one unique set per table (bounds memory)."""
        self._tracker.trigger_compaction()

    def take(self, tables: Mapping[str, list[TableShard]]) -> dict[str, torch.Tensor]:
        """{table key: sorted global row ids looked up since the last take}, and forget them.

        Ids are mapped into each table's rows held by this rank (see the module docstring).
        """
        found = {f"{fqn}.weight": ids for fqn, ids in self._tracker.get_unique_ids().items()}
        out: dict[str, torch.Tensor] = {}
        for key, shards in tables.items():
            ids = found.get(key)
            if not shards or ids is None or ids.numel() == 0:
                out[key] = torch.empty(0, dtype=torch.int64)
                continue
            starts = {s.r0 for s in shards}
            if len(starts) != 1:
                raise NotImplementedError(f"{key}: shards at rows {sorted(starts)} on one rank")
            r0, n = shards[0].r0, shards[0].weight.shape[0]
            ids = ids.to("cpu", torch.int64)
            # a block of rows [r0, r0 + n) that is not the first receives ids local to it
            # (torchrec's block bucketization), so ids all below n are local ones; blocks
            # are equal but the last, so global ids of a later block are all >= n
            if r0 and bool((ids < n).all()):
                ids = ids + r0
            keep = (ids >= r0) & (ids < r0 + n)
            out[key] = ids if bool(keep.all()) else ids[keep]  # unique and sorted already
        return out

    def clear(self) -> None:
        """Forget every id recorded (e.g. after a restore wrote every row)."""
        self._tracker.get_unique_ids()

    def close(self) -> None:
        """Stop tracking (the DMP forgets the tracker; its hooks record nothing more)."""
        self._dmp.model_trackers.pop(NAME, None)  # type: ignore[union-attr]

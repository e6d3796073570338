"""Training checkpoints: incremental, quantized chains (Check-N-Run) in global row space.

    manager.py    CheckpointManager: the loop calls it once a step (interval, baseline or
                  delta, background write, retention, restore with fallback, the resume
                  identity check); it collects every stateful part like torchtitan's
    tracker.py    which embedding rows changed: read off the fused optimizer's row-wise state
    tables.py     a sharded state dict's tables as shards in global row/column space
    snapshot.py   copy rows and dense state out at a step; write; read a chain into any layout
    quantize.py   row-wise int8 / int4 with fbgemm's fused operators
    compress.py   the exact tensors (dense part, row-wise state) packed without loss (zstd)
    store.py      folders, JSON manifests with sha256, atomic commit, verification, retention
    listing.py    `lrm checkpoint ls|verify DIR`
"""

from lrm.checkpoint.manager import CheckpointManager, Stateful
from lrm.checkpoint.store import CheckpointError, Store, resumable

__all__ = ["CheckpointError", "CheckpointManager", "Stateful", "Store", "resumable"]

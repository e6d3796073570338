"""Training checkpoints: when to save, how many to keep, how to restore, what a run is.

    manager.py   CheckpointManager: the loop calls it once a step (interval, retention,
                 restore, the resume identity check); it collects every stateful part
                 (model, optimizers, train state, data position) like torchtitan's
    dcp.py       the storage: torch.distributed.checkpoint step-N/ folders
"""

from lrm.checkpoint.manager import CheckpointManager, Stateful

__all__ = ["CheckpointManager", "Stateful"]

"""Early stopping on the validation slice: keep the best state, stop when NE stops improving.

After every validation `EarlyStopping.update(ne, step)` says whether to stop: after
`patience` validations in a row without a lower NE than the best (a NaN NE, from NaN
inputs in the slice, says nothing either way: it is logged and not counted). A better NE copies the
model's weights (this rank's shards of the tables and the dense part, on their device) so
`restore()` can put the best state back at the end. The bookkeeping (best NE, its step, the
validations since, the step last validated) lives in the TrainState, a checkpointed part,
so a resumed run makes the same decisions. The copy of the weights lives in memory; where
the run keeps checkpoints, the best state is also a checkpoint of its own (the loop saves
one at a better validation unless that step was just saved, and pins it through
retention), which `fetch` reads back: a run resumed after its best validation restores the
same best state as the run never stopped.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.tensor import DTensor

from lrm.train.state import TrainState

log = logging.getLogger("lrm")


def _local_tensors(t: torch.Tensor) -> list[torch.Tensor]:
    """The tensors this rank holds of a state-dict entry (views of the model's storage)."""
    if isinstance(t, ShardedTensor):
        return [s.tensor for s in t.local_shards()]
    if isinstance(t, DTensor):
        local = t.to_local()
        return list(local.local_shards()) if hasattr(local, "local_shards") else [local]
    return [t]


class EarlyStopping:
    """fetch(step): load the model's weights of `step` from where the run keeps them (its
    checkpoint), True when it could; for a best state older than this process."""

    def __init__(self, model: nn.Module, state: TrainState, patience: int,
                 fetch: Callable[[int], bool] | None = None) -> None:
        self.model, self.state, self.patience, self.fetch = model, state, patience, fetch
        self._best: dict[str, list[torch.Tensor]] | None = None

    def _copy(self) -> None:
        self._best = {k: [x.detach().clone() for x in _local_tensors(t)]
                      for k, t in self.model.state_dict().items()}

    @torch.no_grad()
    def resumed(self, step: int) -> None:
        """After loading a checkpoint of `step`: if that was the best state, copy it."""
        if self.state.best_step == step:
            self._copy()

    @torch.no_grad()
    def update(self, ne: float, step: int) -> bool:
        """Record a validation NE at `step`; True when training should stop."""
        s = self.state
        if not math.isfinite(ne):
            log.warning("validation NE at step %d is %s (non-finite inputs in the validation "
                        "slice?): not counted for early stopping", step, ne)
            return False
        if ne < s.best_ne:
            s.best_ne, s.best_step, s.stale = ne, step, 0
            self._copy()
            return False
        s.stale += 1
        return s.stale >= self.patience

    @torch.no_grad()
    def restore(self, step: int) -> int | None:
        """Put the best state back unless it is the current one; the step restored, or None."""
        s = self.state
        if s.best_step < 0 or s.best_step == step:
            return None
        if self._best is None:
            if self.fetch is not None and self.fetch(s.best_step):
                return s.best_step
            log.warning("validation NE was best at step %d, before this run resumed, and no "
                        "checkpoint of that step is left: keeping the state of step %d",
                        s.best_step, step)
            return None
        for k, t in self.model.state_dict().items():
            for dst, src in zip(_local_tensors(t), self._best[k], strict=True):
                dst.copy_(src)
        return s.best_step

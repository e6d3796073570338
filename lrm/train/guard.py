"""The non-finite guard: a step whose loss is NaN or infinite never changes the model, and the
host learns of it without a sync inside the step.

A step's loss is checked on the device: `ok` (1.0 / 0.0) is `isfinite(loss)`, the minimum
over every rank (an all-reduce that stays on the device under nccl). Before the backward it
gates the two places an update happens:

* the tables: fbgemm's fused row-wise Adagrad updates rows inside the TBE backward, so the
  gradient reaching every TBE output passes a gate, `where(ok, grad, 0)`; a zero gradient
  leaves a row-wise Adagrad row and its state exactly as they were (no weight decay there);
* the dense part: torch's fused AdamW skips its whole update, step count included, when its
  `found_inf` tensor is 1 (the mechanism GradScaler uses), and `found_inf` is `1 - ok`.

The step of the first bad loss and its value stay on the device; `check()` (a host sync)
raises NonFiniteLossError naming them. The loop calls it at every log point (so a run stops
at most `log_every` steps after the bad batch), before every evaluation, and the train state
calls it before it is saved: no checkpoint holds a state past a bad step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from lrm.dist import Dist
from lrm.errors import LrmError


class NonFiniteLossError(LrmError):
    """The loss became NaN or infinite; that step's update was never applied."""


class _GradGate(torch.autograd.Function):
    """Identity forward; backward passes the gradient where `ok` else zeros (not NaN * 0)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
        # `ok` is written after this forward (once the loss is known): keep a reference,
        # not a saved tensor, whose version check would refuse the in-place write
        ctx.ok = ok
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return torch.where(ctx.ok.bool(), grad, torch.zeros((), dtype=grad.dtype,
                                                             device=grad.device)), None


def fused_table_modules(model: nn.Module) -> list[nn.Module]:
    """The modules of a sharded model whose backward runs a fused optimizer: the batched
    embedding kernels of every sharded EmbeddingBagCollection's lookups (torchrec keeps
    them in `_lookups[i]._emb_modules`, outside the module tree)."""
    from torchrec.distributed.types import ShardedModule

    found = []
    for m in model.modules():
        if isinstance(m, ShardedModule):
            for lookup in getattr(m, "_lookups", []):
                found.extend(getattr(lookup, "_emb_modules", []))
    return found


class NonFiniteGuard:
    """Device-side flags of one run (see the module docstring).

    `gate(model, dense_optimizer)` once, after sharding; then per step `watch(loss)` between
    forward and backward, and `check()` whenever the host may look.
    """

    def __init__(self, env: Dist, describe: Callable[[int, float], str]) -> None:
        self.env = env
        self.describe = describe  # (bad step, bad value) -> the error message
        dev = env.device
        self.ok = torch.ones((), device=dev)  # this step's loss is finite on every rank
        self.found_inf = torch.zeros((), device=dev)  # 1 - ok: fused AdamW skips on 1
        self.step = torch.zeros((), dtype=torch.int64, device=dev)  # steps watched
        self.first_bad = torch.full((), -1, dtype=torch.int64, device=dev)
        self.bad_value = torch.zeros((), dtype=torch.float32, device=dev)
        self._handles: list[Any] = []

    def gate(self, model: nn.Module, dense: torch.optim.Optimizer) -> None:
        """Gate the gradient into every fused table kernel; make `dense` skip on a bad step."""
        tables = fused_table_modules(model)
        if not tables:
            raise RuntimeError("no fused embedding kernels found in the sharded model: the "
                               "non-finite guard cannot keep a bad step off the tables")
        for m in tables:
            self._handles.append(m.register_forward_hook(
                lambda _m, _args, out: _GradGate.apply(out, self.ok)))
        if not dense.defaults.get("fused"):
            raise ValueError("the dense optimizer must be a fused torch optimizer "
                             "(fused=True): only those skip a step on found_inf")
        dense.found_inf = self.found_inf  # type: ignore[attr-defined]  # read by step()

    def watch(self, loss: torch.Tensor) -> torch.Tensor:
        """Set this step's flags from `loss` (before its backward); return `ok`."""
        ok = torch.isfinite(loss.detach()).all().to(self.ok.dtype)
        if self.env.world_size > 1:
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        self.ok.copy_(ok)
        torch.sub(1.0, ok, out=self.found_inf)
        first = (self.first_bad < 0) & (ok == 0)
        self.first_bad.copy_(torch.where(first, self.step, self.first_bad))
        self.bad_value.copy_(torch.where(first, loss.detach().float().sum(), self.bad_value))
        self.step.add_(1)
        return self.ok

    def check(self) -> None:
        """Raise NonFiniteLossError if any step so far had a bad loss (a host sync)."""
        bad = int(self.first_bad)
        if bad >= 0:
            raise NonFiniteLossError(self.describe(bad, float(self.bad_value)))

    def reset(self, step: int) -> None:
        """Start counting at `step` (a resumed run), with no bad step seen."""
        self.step.fill_(step)
        self.first_bad.fill_(-1)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

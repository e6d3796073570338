"""How a step runs: torchrec's TrainPipelineSparseDist over the sharded model, the fused dense
optimizer, and the learning-rate schedule.

TrainPipelineSparseDist keeps two batches ahead of the step: while batch i trains, batch
i+1's input distribution (the sharded EBCs' KJT all-to-all) and batch i+2's copy to the GPU
run on their own CUDA streams, so the step never waits on them (on the CPU the same calls
run in order). It finds the EBCs to pipeline by tracing the model with torch.fx; the trace
is of `forward_features(batch)`, which every lrm model has and which takes the batch alone
(ExFM students' `forward(batch, all_heads)` branches on its second argument, which fx
cannot trace). The step itself (forward, loss, the non-finite guard, the meter) is the
`custom_model_fwd` the pipeline calls; it runs backward and the optimizer step after it.

The loop runs steps in segments that end where it evaluates: a segment's iterator yields
exactly the segment's batches, so after its last step nothing is in flight, and `pause()`
hands the model back for evaluation (torchrec's `detach`: the sharded modules get their own
forwards back); the next `step()` re-attaches (re-tracing the model, ~10 ms). Detaching with
batches in flight loses the per-rank batch sizes of RecD's user-side KJTs on re-attach
(torchrec 1.8), so the loop never does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

import torch
from torch import nn
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper

from lrm.data.batch import Batch

StepFn = Callable[[Batch], tuple[torch.Tensor, None]]


class StepRunner(Protocol):
    """How the loop takes its steps: torchrec's train pipeline (`Steps`) or whole-step CUDA
    graphs (lrm.train.step_graph.GraphSteps)."""

    def step(self, batches: Iterator[Batch]) -> bool:
        """One optimizer step on the next batch; False when `batches` is exhausted."""
        ...

    def pause(self) -> None:
        """Hand the model back between segments (to evaluate it); `step` resumes."""
        ...


class _Features(nn.Module):
    """What the pipeline traces: the model's `forward_features` (the same modules)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.model.forward_features(batch)


class Steps:
    """Optimizer steps over an iterator of batches (see the module docstring)."""

    def __init__(self, dmp: DistributedModelParallel, opt: CombinedOptimizer,
                 device: torch.device, step_fn: StepFn) -> None:
        self.pipeline = TrainPipelineSparseDist(
            _Features(dmp.module), opt, device, execute_all_batches=True,
            custom_model_fwd=step_fn)  # type: ignore[arg-type]

    def step(self, batches: Iterator[Batch]) -> bool:
        """One optimizer step on the next batch; False when `batches` is exhausted."""
        try:
            self.pipeline.progress(batches)
        except StopIteration:
            return False
        return True

    def pause(self) -> None:
        """Give the model its own forward back (to evaluate it); `step` resumes. Only
        between segments: no batch may be in flight."""
        if self.pipeline.batches:
            raise RuntimeError("pause() with batches in flight: end the segment first")
        self.pipeline.detach()


def dense_parameters(dmp: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter the fused table optimizer does not own (the dense part), by name."""
    return {k: p for k, p in dmp.named_parameters()
            if not hasattr(p, "_in_backward_optimizers")}


def dense_optimizer(dmp: DistributedModelParallel, lr: float,
                    weight_decay: float) -> tuple[KeyedOptimizerWrapper, torch.optim.AdamW]:
    """AdamW (torch's fused kernel) over the dense parameters: (the keyed wrapper to combine
    and checkpoint, the torch optimizer inside it).

    Fused: one kernel for every dense parameter, and the only AdamW that skips a step on
    its `found_inf` tensor (lrm.train.guard) without a host sync."""
    params = dense_parameters(dmp)
    made: list[torch.optim.AdamW] = []

    def build(ps: list[torch.Tensor]) -> torch.optim.AdamW:
        made.append(torch.optim.AdamW(ps, lr=lr, weight_decay=weight_decay, fused=True))
        return made[-1]

    wrapper = KeyedOptimizerWrapper(params, build)
    return wrapper, made[0]


class LrSchedule:
    """Sets every param group's learning rate to its initial value x a factor (warm-up).

    The fused table optimizer reads its group's `lr` when the step zeroes the gradients,
    before the backward that applies it; AdamW reads it in its step. The groups are looked
    up at every call (loading a checkpoint may replace them)."""

    def __init__(self, opt: torch.optim.Optimizer) -> None:
        self.opt = opt
        self.base = [g["lr"] for g in opt.param_groups]

    def set(self, factor: float) -> None:
        for g, lr in zip(self.opt.param_groups, self.base, strict=True):
            g["lr"] = lr * factor


def compile_dense(model: nn.Module, device: torch.device) -> list[str]:
    """torch.compile, in place, the model's MLPs (its `nn.Sequential` children): static
    shapes [batch, width], so on a GPU CUDA graphs (mode "reduce-overhead") replay their
    ~dozens of kernels in one launch. The tables stay eager (DMP shards them) and so does
    the interaction (its per-session shapes vary batch to batch). In place
    (`Module.compile`): the state-dict keys stay those of the model. Returns the names."""
    mode = "reduce-overhead" if device.type == "cuda" else None
    names = [n for n, m in model.named_children() if isinstance(m, nn.Sequential)]
    for n in names:
        getattr(model, n).compile(mode=mode)
    return names

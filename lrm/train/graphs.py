"""CUDA graphs of the dense MLPs: on a GPU, a training step replays each MLP's forward and
its backward as one graph launch each instead of a launch per kernel.

Why: on a GPU lrm's step is bound by the host, not the device. A profile on an H100
(bench vs_torchrec's student, batch 2048, bf16 autocast): each kernel launch cost the host
~10 us, plus the op's own Python and dispatcher work, and graphing the MLPs (weight casts,
matmuls, activations, their gradients) took a step from 213 launches to 150 and 4 graph
launches. An MLP of a training batch has static shapes
([per-rank batch, width]), which is what a CUDA graph needs. `torch.cuda.make_graphed_callables`
captures both passes; this module only chooses the modules and guards the replays.
(torch.compile's "reduce-overhead" mode graphs too, but measured slower: TrainConfig.compile.)

What is graphed: a model's top-level `nn.Sequential` children made only of `nn.Linear` and
`nn.ReLU` (`graphable`), so a module FP8 dispatch has changed (lrm.fp8) or a layer stack with
its own structure (Wukong's `layers`) stays eager. The capture's sample input is float32 and
requires grad: under bf16 autocast the graph casts it as the eager forward would, a bf16 input
is copied in exactly, and a gradient nobody needs (the bottom MLP's input) is dropped by
autograd. The module's own forward runs whenever a call does not match the capture: another
shape (the last batch of a pass, evaluation), eval mode, no grad, another autocast state.

With one process on a GPU lrm.train.step_graph captures the whole step instead; these graphs
then serve its uncaptured steps (the warm-up), and they are the step's graphs where the
whole step cannot be one (several processes, shared-history batches).

Parameters must stay the same tensors: loading a state dict (checkpoints, early stopping's
best state, a warm start) copies into them in place, which the graphs see.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from lrm.models.precision import autocast

_PLAIN = (nn.Linear, nn.ReLU)


def graphable(model: nn.Module) -> list[str]:
    """Names of `model`'s top-level children that are MLPs of plain Linear and ReLU layers
    (exact types: a subclass, such as an FP8 Linear, may do what a graph cannot replay)."""
    return [n for n, m in model.named_children()
            if isinstance(m, nn.Sequential) and len(m) > 0
            and isinstance(m[0], nn.Linear)  # its width sizes the capture's input
            and all(type(layer) in _PLAIN for layer in m)]


class _Replay:
    """The forward a graphed MLP gets: the graph where the call matches the capture, else
    the module's own forward."""

    def __init__(self, module: nn.Module, graphed: Callable[..., Any], shape: torch.Size,
                 device: torch.device, amp: bool) -> None:
        self.module, self.graphed = module, graphed
        self.shape, self.device, self.amp = shape, device, amp
        self.eager = type(module).forward.__get__(module)
        self.replays = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if (self.module.training and torch.is_grad_enabled() and x.shape == self.shape
                and not torch.cuda.is_current_stream_capturing()  # inside a whole-step one
                and x.device == self.device
                and torch.is_autocast_enabled(self.device.type) == self.amp):
            self.replays += 1
            return self.graphed(x)
        return self.eager(x)


def graph_mlps(model: nn.Module, batch_size: int, device: torch.device,
               amp: bool) -> list[str]:
    """Capture the graphable MLPs of `model` (in place; the state-dict keys stay) for training
    batches of `batch_size` rows on `device`, under bf16 autocast when `amp`; returns their
    names. Nothing on a CPU (no graphs there), and nothing for a module not on `device`."""
    if device.type != "cuda":
        return []
    if device.index is None:  # "cuda": the current one, as tensors put there report it
        device = torch.device("cuda", torch.cuda.current_device())
    done = []
    for name in graphable(model):
        m = getattr(model, name)
        first = m[0]
        if first.weight.device != device:
            continue
        sample = torch.zeros(batch_size, first.in_features, device=device, requires_grad=True)
        was = m.training
        m.train()
        # make_graphed_callables refuses autocast's weight-cast cache (a cached cast would
        # be captured once and replayed stale): the capture casts inside the graph
        with autocast(device, amp, cache=False):
            torch.cuda.make_graphed_callables(m, (sample,))
        graphed = m.forward  # make_graphed_callables' own dispatch on the training flag
        m.forward = _Replay(m, graphed, sample.shape, device, amp)  # type: ignore[method-assign]
        m.train(was)
        done.append(name)
    return done

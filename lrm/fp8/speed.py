"""Speed on the device at hand: a layer, or a whole model's step, in its training precision
vs FP8, timed on the real kernels (quantization included).

The training precision is bf16 autocast when `amp` is on, on CUDA or a CPU that multiplies
bf16 natively (what lrm.train runs), float32 otherwise. A CPU has no fast FP8 GEMM
(`torch._scaled_mm` there emulates it, or is absent), so its verdicts say "slow": a finding
about the device, not a failure.

`bytes_moved(fn)` counts the memory traffic of eager code instead of timing it: the bytes
every operator reads and writes, the same on any device (what a mod that narrows dtypes
saves, measurable on a CPU).
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from lrm.fp8.linear import to_fp8
from lrm.models.precision import autocast, uses_bf16

WARMUP = 3  # untimed calls first (a compiled quantization compiles in the first)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn: Callable[[], Any], device: torch.device, reps: int) -> float:
    """Median wall time of `fn` over `reps` calls after a warm-up, in milliseconds."""
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _fwd_bwd(layer: nn.Module, x: torch.Tensor, device: torch.device, amp: bool
             ) -> Callable[[], None]:
    def step() -> None:
        with autocast(device, amp):
            y = layer(x)
        y.float().sum().backward()
        layer.zero_grad(set_to_none=True)
        x.grad = None
    return step


def time_linear(rows: int, k: int, n: int, *, bias: bool = True, input_grad: bool = True,
                device: torch.device | str = "cpu", amp: bool = True,
                recipe: str = "tensorwise", backend: str = "auto", compile: bool = True,
                reps: int = 10, seed: int = 0) -> dict[str, Any]:
    """Forward + backward of a [rows, k] -> [rows, n] linear: training precision vs FP8.

    input_grad: whether the layer's input needs a gradient (all but a first layer).
    """
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)
    base = nn.Linear(k, n, bias=bias, device=device)
    fp8 = to_fp8(copy.deepcopy(base), recipe, backend=backend, compile=compile)
    x = torch.randn(rows, k, device=device, generator=g).requires_grad_(input_grad)
    base_ms = median_ms(_fwd_bwd(base, x, device, amp), device, reps)
    fp8_ms = median_ms(_fwd_bwd(fp8, x, device, amp), device, reps)
    return {"rows": rows, "k": k, "n": n, "base_ms": base_ms, "fp8_ms": fp8_ms,
            "speedup": base_ms / fp8_ms, "precision": precision(device, amp)}


def _nbytes(t: torch.Tensor) -> int:
    """Bytes an operator touches reading or writing `t` (an expanded view: its storage's)."""
    return min(t.numel() * t.element_size(), t.untyped_storage().nbytes())


class _Traffic(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        out = func(*args, **(kwargs or {}))
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if not func._schema.is_mutable:
            # a view (or _unsafe_view) moves nothing: its output shares an input's storage
            shared = {t.untyped_storage().data_ptr() for t in ins}
            if func.is_view or any(t.untyped_storage().data_ptr() in shared for t in outs):
                return out
        self.bytes += sum(_nbytes(t) for t in ins + outs)
        self.ops += 1
        return out


def bytes_moved(fn: Callable[[], Any]) -> tuple[int, int]:
    """(bytes read and written by every operator `fn` runs, operators), eager.

    Each operator counts as reading its tensor inputs and writing its outputs once (an
    unfused kernel each, as eager execution runs them); views count nothing; an in-place
    operator counts its operands and its output. A backward run inside `fn` counts too.
    """
    with _Traffic() as t:
        fn()
    return t.bytes, t.ops


def fast_fp8(device: torch.device | str) -> bool:
    """Whether `device` has FP8 tensor cores (CUDA sm_89 and later: Ada, Hopper, Blackwell);
    elsewhere `_scaled_mm` is emulated or absent and no FP8 layer can be faster."""
    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def precision(device: torch.device, amp: bool) -> str:
    """The training precision lrm.train uses on `device` (what FP8 is compared against)."""
    return "bf16" if uses_bf16(device, amp) else "float32"


__all__ = ["bytes_moved", "fast_fp8", "median_ms", "precision", "time_linear"]

"""The train steps' precision: bf16 autocast where the hardware multiplies bf16 natively.

Weights, gradients and optimizer state stay float32; scoring (lrm.train.evaluate) is
float32 everywhere.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch


@functools.cache
def cpu_bf16() -> bool:
    """The CPU multiplies bf16 natively (AVX512-BF16 or AMX; read from /proc/cpuinfo, so
    Linux only): there bf16 halves a step's matmul time (measured on a 2-core EPYC: the
    student's MLPs 32 -> 16 ms a step at batch 1024); elsewhere it would be emulated."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def uses_bf16(device: torch.device, amp: bool) -> bool:
    """Whether the steps on `device` run under bf16 autocast: when asked, on a GPU or a CPU
    that multiplies bf16 natively."""
    return amp and (device.type == "cuda" or (device.type == "cpu" and cpu_bf16()))


def autocast(device: torch.device, amp: bool,
             cache: bool = True) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast where `uses_bf16`; float32 elsewhere. Weights, gradients and optimizer
    state stay float32. `cache`: autocast's cache of weight casts within the region (off for
    a CUDA graph capture)."""
    if uses_bf16(device, amp):
        return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=cache)
    return contextlib.nullcontext()

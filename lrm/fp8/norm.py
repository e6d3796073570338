"""LayerNorms for the model mods (lrm.fp8.mods): the FP8 cast fused in, and a bf16 stream.

    QuantizedLayerNorm  LayerNorm whose output comes out in e4m3 (a `Quantized`) for the
                        Fp8Linear it feeds: no amax pass, no full-precision output
    StreamLayerNorm     LayerNorm that reads and writes the autocast dtype (bf16) instead of
                        the float32 autocast runs LayerNorm in on CUDA
    StreamCast          the residual stream's entry, cast to the autocast dtype

The norms are built with `from_norm(norm)` and share its Parameters (as Fp8Linear does a
Linear's), so state-dict keys, shapes and values stay and saved models load strictly.

Why a static scale for the fused cast, and not the output's amax computed inside the LN:
LayerNorm's output is bounded. With x̂ = (x - mean) / sqrt(var + eps) over d values,
sum(x̂) = 0 and sum(x̂²) <= d; the other d-1 values sum to -x̂_i, so by Cauchy-Schwarz
their squares sum to at least x̂_i² / (d-1), hence x̂_i² d / (d-1) <= d: |x̂_i| <= sqrt(d-1)
(reached by a row with one value apart from d-1 equal ones) and |y_i| <= sqrt(d-1) |γ_i| +
|β_i|. That bound comes from the d values of γ and β, known before the LN runs, so the cast
is a pointwise epilogue of the LN itself: one kernel reads the LN's input and writes e4m3.
An amax taken inside the LN is a reduction over the whole output that must finish before
any element can be cast, so the output still has to be written in full precision and read
again: it would save one of the two passes over the output (the amax read), the bound saves
both and the full-precision write. Per element of the LN output (y_b bytes: 4 under
autocast, whose LayerNorm is float32 on CUDA; 2 with the bf16 residual), against LN then
Fp8Linear with its compiled quantization:

    forward   LN writes y (y_b), amax reads y (y_b), cast reads y (y_b) and writes e4m3 (1)
              -> the LN writes e4m3 (1): 3 y_b bytes and two passes (amax, cast) fewer
    kept      y (y_b) until the backward -> e4m3 (1): y_b - 1 bytes of activation memory
    backward  the weight gradient's quantization of yᵀ: amax and cast read y (2 y_b) and
              write e4m3 (1) -> a transposed copy of the e4m3 (reads 1, writes 1): 2 y_b - 1

so 5 y_b - 1 bytes of traffic per element and step (19 with a float32 LN output, 9 with
bf16). Compiled by Inductor (checked with its CPU code generator) `_norm_quant` is one kernel
whose only buffers are the e4m3 output, its scale, and the mean and rstd the backward needs.
The price is a scale looser than the batch's amax by bound / amax: e4m3 keeps the
same relative precision over its normal range, so that only moves the smallest values
toward the subnormals. On the bench's trained default teacher bound / amax was 1.5 and the
cast's SQNR 31.9 dB against 31.3-31.5 dB at the amax's scale (bench/fp8.py, fp8.mod).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lrm.fp8.formats import E4M3, E4M3_MAX
from lrm.fp8.linear import Quantized


def ln_bound(weight: torch.Tensor | None, bias: torch.Tensor | None, d: int) -> torch.Tensor:
    """max_i sqrt(d-1) |γ_i| + |β_i| (float32, 0-d): no LayerNorm output over d values exceeds it.

    weight/bias None: γ = 1 / β = 0 (a LayerNorm without them).
    """
    root = math.sqrt(d - 1)
    g = weight.detach().float().abs() * root if weight is not None else None
    b = bias.detach().float().abs() if bias is not None else None
    if g is None and b is None:
        return torch.tensor(root)
    if g is None:
        return (b + root).amax()  # type: ignore[operator]
    return (g if b is None else g + b).amax()


def fused_bytes_saved(elements: int, out_bytes: int) -> int:
    """Traffic a compiled fused norm saves per step over LN then Fp8Linear (docstring).

    elements: of the LN output; out_bytes: its element size unfused (4, or 2 in bf16).
    """
    return (5 * out_bytes - 1) * elements


def _norm_quant(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                eps: float) -> tuple[torch.Tensor, ...]:
    """LayerNorm over the last dimension, cast to e4m3 with the bound's scale.

    -> (q e4m3, inverse scale, mean, rstd). Compiled (CUDA), the normalized value is never
    stored: the cast is the norm kernel's epilogue.
    """
    d = x.shape[-1]
    y, mean, rstd = torch.native_layer_norm(x, (d,), weight, bias, eps)
    scale = E4M3_MAX / ln_bound(weight, bias, d).to(x.device).clamp_min(1e-12)
    # saturating: a value rounded just past the bound lands on +-448, not NaN
    q = (y.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q, scale.reciprocal(), mean, rstd


@functools.cache
def _compiled_norm_quant() -> Any:
    return torch.compile(_norm_quant, dynamic=True)


class _NormQuant(torch.autograd.Function):
    """(x, γ, β) -> (gradient handle, q, inv); the backward is LayerNorm's (aten's kernel).

    The quantization is straight-through: the gradient the Fp8Linear computes for its input
    (the handle's) is the gradient of the LN's output.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None,
                bias: torch.Tensor | None, eps: float, compile: bool
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        fn = _compiled_norm_quant() if compile and x.is_cuda else _norm_quant
        q, inv, mean, rstd = fn(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        ctx.mark_non_differentiable(q, inv)
        handle = x.new_zeros(()).expand(x.shape)  # no memory: the values are never read
        return handle, q, inv

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, *_: Any) -> tuple[torch.Tensor | None, ...]:
        x, weight, bias, mean, rstd = ctx.saved_tensors
        need = ctx.needs_input_grad
        mask = [need[0], weight is not None and need[1], bias is not None and need[2]]
        dx, dw, db = torch.ops.aten.native_layer_norm_backward(
            grad.to(x.dtype).contiguous(), x, [x.shape[-1]], mean, rstd, weight, bias, mask)
        return dx, dw, db, None, None


class QuantizedLayerNorm(nn.LayerNorm):
    """nn.LayerNorm over the last dimension whose output comes out as a `Quantized` (e4m3).

    Runs in its input's dtype (γ, β cast to it: CUDA's LayerNorm takes them in the input's
    dtype; the statistics accumulate in float32 inside the kernel), autocast off. Only an
    Fp8Linear (tensorwise) can consume the output: lrm.fp8.mods.fuse_norm checks that.
    """

    compile: bool = True

    @classmethod
    def from_norm(cls, norm: nn.LayerNorm, *, compile: bool = True) -> QuantizedLayerNorm:
        if len(norm.normalized_shape) != 1:
            raise ValueError(f"QuantizedLayerNorm normalizes the last dimension only, not "
                             f"{tuple(norm.normalized_shape)}")
        new = _share(cls, norm)
        new.compile = compile
        return new

    def forward(self, x: torch.Tensor) -> Quantized:  # type: ignore[override]
        with torch.autocast(x.device.type, enabled=False):
            w, b = _as(self.weight, x.dtype), _as(self.bias, x.dtype)
            handle, q, inv = _NormQuant.apply(x, w, b, self.eps, self.compile)
        return Quantized(q, inv, handle)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, out=e4m3 (static scale)"


def stream_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The autocast dtype where autocast is on for x's device, else None (no stream mod)."""
    dev = x.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None


class StreamLayerNorm(nn.LayerNorm):
    """nn.LayerNorm that, under autocast, reads and writes the autocast dtype (bf16).

    Autocast runs LayerNorm in float32 on CUDA (its float32 op list), so a residual stream
    through it is float32. Here input, γ and β are cast to the autocast dtype and the norm
    runs with autocast off: the kernel accumulates its statistics in float32 and writes
    bf16. Without autocast (float32 training, a CPU) it is nn.LayerNorm, unchanged.
    """

    @classmethod
    def from_norm(cls, norm: nn.LayerNorm) -> StreamLayerNorm:
        return _share(cls, norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dt = stream_dtype(x)
        if dt is None:
            return super().forward(x)
        with torch.autocast(x.device.type, enabled=False):
            return F.layer_norm(x.to(dt), self.normalized_shape, _as(self.weight, dt),
                                _as(self.bias, dt), self.eps)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, stream=autocast dtype"


class StreamCast(nn.Module):
    """The residual stream's entry: cast to the autocast dtype under autocast, else as is.

    Once here, not once per consumer: autocast casts an activation again for every
    GEMM that reads it (the FM's two products, the linear compress, the residual map).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dt = stream_dtype(x)
        return x if dt is None else x.to(dt)


def _as(p: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return None if p is None else p.to(dtype)


def _share(cls: type, norm: nn.LayerNorm) -> Any:
    """An instance of `cls` (a LayerNorm) holding `norm`'s own Parameters."""
    new = cls.__new__(cls)
    nn.Module.__init__(new)
    new.normalized_shape, new.eps = norm.normalized_shape, norm.eps
    new.elementwise_affine = norm.elementwise_affine
    new.weight, new.bias = norm.weight, norm.bias  # None-valued entries stay registered
    return new


__all__ = ["QuantizedLayerNorm", "StreamCast", "StreamLayerNorm", "fused_bytes_saved",
           "ln_bound", "stream_dtype"]

"""Low-precision number formats as quantize -> dequantize (the numerics, not the speed).

Each format maps a tensor to the values it would carry in that format, returned in float64
(scaling and casting run in float32, as a real cast kernel does), so the probe can compute
the error of a GEMM run in it against the same GEMM in full precision:

    bf16          round to bfloat16 (the training precision on a GPU)
    e4m3_tensor   float8 e4m3fn, one scale per tensor (amax -> 448)
    e4m3_row      float8 e4m3fn, one scale per row along the reduced dimension K
    e5m2_tensor   float8 e5m2, one scale per tensor (amax -> 57344): gradients
    mxfp8         OCP MX: e4m3 elements, blocks of 32 along K, a power-of-two (E8M0) scale
    mxfp4         OCP MX: e2m1 elements, blocks of 32 along K, a power-of-two scale

The float8 casts are torch's own (round to nearest even); e2m1 and the MX block scales are
written here because no installed library has them on a CPU (torchao's mx_formats is a
CUDA prototype and torchao is optional): the OCP MX v1.0 rules, clamped like a saturating
cast. Every function takes `x [..., K]` with K the reduced dimension of the GEMM.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
E4M3_MAX = torch.finfo(E4M3).max  # 448
E5M2_MAX = torch.finfo(E5M2).max  # 57344
MX_BLOCK = 32
# e2m1 magnitudes (OCP MX): 0, 0.5, 1, 1.5, 2, 3, 4, 6
_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
_EMAX = {"e4m3": 8, "e2m1": 2}  # exponent of the largest normal element (448 = 1.75 * 2^8)
_TINY = 1e-30  # amax below this is an all-zero tensor (its scale is irrelevant)


def _cast(x: torch.Tensor, dtype: torch.dtype, limit: float) -> torch.Tensor:
    """x rounded to `dtype` (saturating: torch < 2.12 turns values past the max into NaN)."""
    return x.clamp(-limit, limit).to(dtype).to(torch.float64)


def scaled(x: torch.Tensor, dtype: torch.dtype, amax: torch.Tensor) -> torch.Tensor:
    """x quantized with scale = max_of(dtype) / amax (amax broadcast against x), dequantized."""
    limit = torch.finfo(dtype).max
    scale = limit / amax.float().clamp_min(_TINY)
    return _cast(x.float() * scale, dtype, limit) / scale.double()


def per_tensor(x: torch.Tensor, dtype: torch.dtype = E4M3,
               amax: torch.Tensor | float | None = None) -> torch.Tensor:
    """One scale for the tensor; `amax`: the whole tensor's when `x` is a sample of it."""
    if amax is None:
        amax = x.detach().abs().amax()
    return scaled(x, dtype, torch.as_tensor(amax))


def per_row(x: torch.Tensor, dtype: torch.dtype = E4M3) -> torch.Tensor:
    """One scale per row of the last dimension (a row of A, or a column of B, of A @ B)."""
    return scaled(x, dtype, x.detach().abs().amax(-1, keepdim=True))


def _round_e2m1(v: torch.Tensor) -> torch.Tensor:
    """|v| <= 6 rounded to the nearest e2m1 value (ties away from zero), sign kept."""
    grid = _E2M1.to(v.device, v.dtype)
    mid = (grid[1:] + grid[:-1]) / 2
    idx = torch.bucketize(v.abs(), mid, right=True)
    return grid[idx] * v.sign()


def mx(x: torch.Tensor, element: str = "e4m3", block: int = MX_BLOCK) -> torch.Tensor:
    """OCP MX block scaling along the last dimension (zero-padded to whole blocks).

    Per block: X = 2^(floor(log2(amax)) - emax_element); elements v / X cast (saturating)
    to the element format. A power-of-two scale wastes up to one binade, which is why
    MXFP8 can be less accurate than a per-tensor float scale.
    """
    x = x.float()
    k = x.shape[-1]
    pad = (-k) % block
    xp = torch.nn.functional.pad(x, (0, pad)) if pad else x
    blocks = xp.reshape(*xp.shape[:-1], -1, block)
    amax = blocks.abs().amax(-1, keepdim=True)
    exp = torch.floor(torch.log2(amax.clamp_min(1e-38))) - _EMAX[element]
    scale = torch.exp2(exp.clamp(-127, 127))  # E8M0's range
    v = blocks / scale
    if element == "e4m3":
        q = _cast(v, E4M3, E4M3_MAX)
    else:
        q = _round_e2m1(v.clamp(-6.0, 6.0)).double()
    out = (q.double() * scale.double()).reshape(xp.shape)
    return out[..., :k] if pad else out


FORMATS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "bf16": lambda x: x.to(torch.bfloat16).double(),
    "e4m3_tensor": lambda x: per_tensor(x, E4M3),  # (quantize passes the whole tensor's amax)
    "e4m3_row": lambda x: per_row(x, E4M3),
    "mxfp8": lambda x: mx(x, "e4m3"),
    "mxfp4": lambda x: mx(x, "e2m1"),
}
FORWARD = tuple(FORMATS)  # the forward GEMM's formats the probe measures
# the backward GEMMs: gradient in e5m2 (one scale per tensor) against e4m3 operands
BACKWARD = ("e5m2_dgrad", "e5m2_wgrad")
RECIPES = {"tensorwise": "e4m3_tensor", "rowwise": "e4m3_row"}  # dispatch recipe -> format


def quantize(x: torch.Tensor, fmt: str, amax: torch.Tensor | float | None = None
             ) -> torch.Tensor:
    """`x [..., K]` as format `fmt` carries it (float64), scales along the last dimension.

    amax: the whole tensor's, for a per-tensor format when `x` is a sample of the tensor
    (the scale a real cast would use); other formats scale locally and ignore it.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; known: {list(FORMATS)}")
    if fmt == "e4m3_tensor":
        return per_tensor(x, E4M3, amax)
    return FORMATS[fmt](x)


__all__ = ["BACKWARD", "E4M3", "E4M3_MAX", "E5M2", "E5M2_MAX", "FORMATS", "FORWARD",
           "MX_BLOCK", "RECIPES", "mx", "per_row", "per_tensor", "quantize", "scaled"]

"""Row-wise quantization of embedding rows (Check-N-Run): fbgemm's fused operators.

A stored rows tensor is in one of these codecs:

    f32     the fp32 rows as they are
    n8      FloatToFusedNBitRowwiseQuantizedSBHalf at 8 bits: a byte a value, then an fp16
            scale and bias per row
    n4      the same at 4 bits: two values a byte
    fused8  FloatToFused8BitRowwiseQuantized (an fp32 scale and bias per row): int8 rows as
            lrm wrote them before n8; read only

A chain's `quantize` picks the codecs of its baselines and deltas (`codecs`). An int4 chain
keeps its baselines at 8 bits and its deltas, written every interval, at 4 (residuals over
what the chain restores to: lrm.checkpoint.snapshot). Measured on the default student (the
checkpoint benchmark's data, a checkpoint every 100 steps for 1100 steps, held-out NE of
the restored model vs the fp32 one at each of the 11): 4-bit rows moved it by up to 0.17%;
an 8-bit baseline with 4-bit residuals by at most 0.008%, and a 4-bit baseline with 4-bit
residuals by up to 0.016%. Quantized chains keep the
row-wise optimizer state in bfloat16 (`state_dtype`): the state scales a row's step by
1/sqrt(state), so bfloat16's 0.4% rounding moves a step by 0.2%.

What fbgemm lacks, by hand: its n-bit operator needs the packed bytes of a row to be a
multiple of 2 (the fp16 scale's alignment), i.e. an even number of columns at 8 bits and a
multiple of 4 at 4 bits. Narrower rows are padded with copies of their last column, which
leaves each row's min and max (its scale and bias) unchanged, and the padding is dropped
on the way back.
"""

from __future__ import annotations

from typing import Literal, get_args

import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)
import torch

Quantization = Literal["none", "int8", "int4"]
QUANTIZATIONS: tuple[str, ...] = get_args(Quantization)
_BITS = {"n8": 8, "n4": 4}
# the codec of a group's `rows` tensor in files written before codecs were named
LEGACY = {"none": "f32", "int8": "fused8", "int4": "n4"}


def codecs(q: str) -> tuple[str, str]:
    """(baseline codec, delta codec) of a chain quantized `q` (see the module docstring)."""
    if q not in QUANTIZATIONS:
        raise ValueError(f"quantization {q!r} is not one of {QUANTIZATIONS}")
    return {"none": ("f32", "f32"), "int8": ("n8", "n8"), "int4": ("n8", "n4")}[q]


def state_dtype(q: str) -> torch.dtype:
    """The dtype a chain quantized `q` keeps the row-wise optimizer state in."""
    return torch.float32 if q == "none" else torch.bfloat16


def _padded(cols: int, bits: int) -> int:
    per = 16 // bits  # columns that make the 2 bytes of the scale's alignment
    return -(-cols // per) * per


def row_bytes(cols: int, codec: str) -> int:
    """Bytes one stored row of `cols` values takes."""
    if codec == "f32":
        return 4 * cols
    if codec == "fused8":
        return cols + 8
    if codec in _BITS:
        return _padded(cols, _BITS[codec]) * _BITS[codec] // 8 + 4
    raise ValueError(f"unknown row codec {codec!r}")


def encode(rows: torch.Tensor, codec: str) -> torch.Tensor:
    """[n, cols] fp32 rows -> their stored form ([n, row_bytes] uint8, or fp32 for f32)."""
    rows = rows.detach().to("cpu", torch.float32).contiguous()
    if codec == "f32":
        return rows
    if codec == "fused8":
        return torch.ops.fbgemm.FloatToFused8BitRowwiseQuantized(rows)
    if codec in _BITS:
        bits, cols = _BITS[codec], rows.shape[1]
        if _padded(cols, bits) != cols:
            pad = rows[:, -1:].expand(-1, _padded(cols, bits) - cols)
            rows = torch.cat([rows, pad], 1).contiguous()
        return torch.ops.fbgemm.FloatToFusedNBitRowwiseQuantizedSBHalf(rows, bits)
    raise ValueError(f"unknown row codec {codec!r}")


def decode(stored: torch.Tensor, codec: str, cols: int) -> torch.Tensor:
    """The stored form of rows of `cols` values -> [n, cols] fp32."""
    if codec == "f32":
        out = stored.to(torch.float32)
    elif codec == "fused8":
        out = torch.ops.fbgemm.Fused8BitRowwiseQuantizedToFloat(stored.contiguous())
    elif codec in _BITS:
        out = torch.ops.fbgemm.FusedNBitRowwiseQuantizedSBHalfToFloat(stored.contiguous(),
                                                                     _BITS[codec])
    else:
        raise ValueError(f"unknown row codec {codec!r}")
    if out.dim() != 2 or out.shape[1] < cols:
        raise ValueError(f"stored rows decode to {tuple(out.shape)}, not [n, {cols}]")
    return out[:, :cols]

"""Row-wise quantization of embedding rows (Check-N-Run): fbgemm's fused operators.

`int8`: FloatToFused8BitRowwiseQuantized (uint8 values, then an fp32 scale and bias per row);
`int4`: FloatToFusedNBitRowwiseQuantizedSBHalf at bit rate 4 (two values a byte, then an
fp16 scale and bias per row); `none`: the fp32 rows as they are. Dequantizing gives back
`cols` fp32 columns.

What fbgemm lacks, by hand: its n-bit operator needs the packed bytes of a row to be a
multiple of 2 (an even number of bytes before the fp16 scale), i.e. a multiple of 4 columns
at 4 bits. Narrower rows are padded with copies of their last column, which leaves each
row's min and max (its scale and bias) unchanged, and the padding is dropped on the way back.
"""

from __future__ import annotations

from typing import Literal, get_args

import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)
import torch

Quantization = Literal["none", "int8", "int4"]
QUANTIZATIONS: tuple[str, ...] = get_args(Quantization)
_INT4_COLS = 4  # columns a 4-bit row must be a multiple of (see the module docstring)


def _padded(cols: int) -> int:
    return -(-cols // _INT4_COLS) * _INT4_COLS


def row_bytes(cols: int, q: str) -> int:
    """Bytes one stored row of `cols` values takes."""
    if q == "none":
        return 4 * cols
    if q == "int8":
        return cols + 8
    if q == "int4":
        return _padded(cols) // 2 + 4
    raise ValueError(f"quantization {q!r} is not one of {QUANTIZATIONS}")


def encode(rows: torch.Tensor, q: str) -> torch.Tensor:
    """[n, cols] fp32 rows -> their stored form ([n, row_bytes] uint8, or fp32 for none)."""
    rows = rows.detach().to("cpu", torch.float32).contiguous()
    if q == "none":
        return rows
    if q == "int8":
        return torch.ops.fbgemm.FloatToFused8BitRowwiseQuantized(rows)
    if q == "int4":
        cols = rows.shape[1]
        if cols % _INT4_COLS:
            pad = rows[:, -1:].expand(-1, _padded(cols) - cols)
            rows = torch.cat([rows, pad], 1).contiguous()
        return torch.ops.fbgemm.FloatToFusedNBitRowwiseQuantizedSBHalf(rows, 4)
    raise ValueError(f"quantization {q!r} is not one of {QUANTIZATIONS}")


def decode(stored: torch.Tensor, q: str, cols: int) -> torch.Tensor:
    """The stored form of rows of `cols` values -> [n, cols] fp32."""
    if q == "none":
        out = stored.to(torch.float32)
    elif q == "int8":
        out = torch.ops.fbgemm.Fused8BitRowwiseQuantizedToFloat(stored.contiguous())
    elif q == "int4":
        out = torch.ops.fbgemm.FusedNBitRowwiseQuantizedSBHalfToFloat(stored.contiguous(), 4)
    else:
        raise ValueError(f"quantization {q!r} is not one of {QUANTIZATIONS}")
    if out.dim() != 2 or out.shape[1] < cols:
        raise ValueError(f"stored rows decode to {tuple(out.shape)}, not [n, {cols}]")
    return out[:, :cols]

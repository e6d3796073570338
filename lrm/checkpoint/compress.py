"""Lossless packing of the exact tensors a checkpoint holds: zstd over byte planes.

Every checkpoint, a delta too, holds the dense part exactly (parameters, AdamW's two
moments) and the row-wise optimizer state of the rows it writes. Both compress without
loss: a float's sign and exponent byte repeats across a tensor and its low mantissa bytes
do not, so the bytes are laid out plane by plane (every value's first byte, then every
second byte, ...: blosc's shuffle) before zstd. And the row-wise state of a row no batch
has reached is 0: a baseline's is mostly zeros (on the checkpoint benchmark's full run
93% of rows at step 100, 82% at step 1100). Measured there (zstd level 1): the dense part
262 KB -> 222 KB, a baseline's bfloat16 row-wise state 482 KB -> 47 KB (fp32: 965 KB ->
105-273 KB), a delta's 35 KB -> 27 KB, in about a millisecond each. Embedding rows are not
packed: quantized codes are near random (zstd takes 3-5% off n4 and n8) and fp32 rows are
read memory-mapped.

A tensor is stored packed (its key + `SUFFIX`, a uint8 blob) only where that is smaller,
and a reader takes either form (`stored`, `unpack`); it knows the dtype and the number of
values from the checkpoint's own layout, which the decompressed size must match exactly.

By hand: the shuffle (a transpose of the bytes; pyarrow, lrm's already, has zstd but no
shuffle outside Parquet's writer, and blosc is not installed).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from lrm.checkpoint.store import CheckpointError

SUFFIX = ".zst"
_ZSTD = pa.Codec("zstd", compression_level=1)


def _planes(t: torch.Tensor) -> np.ndarray:
    """The bytes of `t` as [element size, numel]: plane i holds byte i of every value."""
    b = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
    return np.ascontiguousarray(b.reshape(-1, t.element_size()).T)


def pack(t: torch.Tensor) -> torch.Tensor | None:
    """`t`'s bytes shuffled and zstd-compressed as a uint8 tensor; None when not smaller."""
    blob = _ZSTD.compress(_planes(t), asbytes=True)
    if len(blob) >= t.numel() * t.element_size():
        return None
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8)


def put(tensors: dict[str, torch.Tensor], key: str, t: torch.Tensor) -> None:
    """Store `t` under `key`, or packed under `key + SUFFIX` where that is smaller."""
    blob = pack(t)
    if blob is None:
        tensors[key] = t
    else:
        tensors[key + SUFFIX] = blob


def unpack(blob: torch.Tensor, dtype: torch.dtype, numel: int, where: str) -> torch.Tensor:
    """The 1-D tensor of `numel` values of `dtype` that `pack` made `blob` of."""
    size = torch.empty(0, dtype=dtype).element_size()
    try:
        raw = _ZSTD.decompress(blob.numpy(), decompressed_size=numel * size, asbytes=True)
    except (OSError, ValueError) as e:  # pyarrow: corrupt data, or another size
        raise CheckpointError(f"{where}: does not unpack to {numel} {dtype} values "
                              f"({str(e).strip()[:120]})") from None
    planes = np.frombuffer(raw, dtype=np.uint8).reshape(size, numel)
    # a C-ordered copy: writable (the decompressed bytes are not, and ascontiguousarray
    # handed them back as they were where the transpose is contiguous already: one-byte
    # values, one value), and flat before the view (numpy calls a [1, size] transpose
    # contiguous as it is, strides (1, 1), which torch cannot view as one wider value)
    return torch.from_numpy(planes.T.copy().reshape(-1)).view(dtype)


def stored(tensors: Mapping[str, torch.Tensor], key: str, dtype: torch.dtype, numel: int,
           path: Path) -> torch.Tensor | None:
    """The values stored under `key`, packed or not, as a 1-D tensor (None: neither is
    there). A plain tensor is returned as it is (its own dtype; a packed one's is `dtype`)."""
    if key in tensors:
        return tensors[key].reshape(-1)
    blob = tensors.get(key + SUFFIX)
    if blob is None:
        return None
    if blob.dtype != torch.uint8 or blob.dim() != 1:
        raise CheckpointError(f"{path}: {key + SUFFIX} is not a packed byte string")
    return unpack(blob, dtype, numel, f"{path}: {key + SUFFIX}")

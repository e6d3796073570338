"""A batched matrix product as a module, so hooks see the models' GEMM-like interactions.

The dot interaction (DLRM) and the FM block (Wukong) multiply activations by activations;
written as `BatchedMatmul` modules, lrm.fp8's probe can attach to them like to any Linear.
The module has no parameters or buffers: state dicts and init order are unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class BatchedMatmul(nn.Module):
    """forward(a [..., M, K], b [..., K, N]) -> a @ b [..., M, N] (torch.matmul).

    pad > 1: M, K and N are zero-padded to multiples of `pad` for the product and the result
    is cut back, the same function (added zeros change no sum); on a GPU a batched matmul
    with an odd size (a 65 x 65 interaction) falls onto slow kernels.
    """

    def __init__(self, pad: int = 1) -> None:
        super().__init__()
        self.pad = pad

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.pad <= 1:
            return torch.matmul(a, b)
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        pm, pk, pn = ((-s) % self.pad for s in (m, k, n))
        if not (pm or pk or pn):
            return torch.matmul(a, b)
        out = torch.matmul(F.pad(a, (0, pk, 0, pm)), F.pad(b, (0, pn, 0, pk)))
        return out[..., :m, :n]

    def extra_repr(self) -> str:
        return f"pad={self.pad}" if self.pad > 1 else ""

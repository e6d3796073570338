"""FP8 linear layers that train: torchao's float8 training where installed, else `_scaled_mm`.

`to_fp8(linear, recipe, backend=)` returns a module with the same parameters (the same
Parameter objects, so state-dict keys and shapes stay) whose forward and backward GEMMs run
in FP8 on the device's real kernels:

* backend "torchao": `torchao.float8.Float8Linear` (its tensorwise / rowwise recipes), the
  library's float8 training; needs `torchao` (0.18.0 works with torch 2.11 to 2.13).
* backend "scaled_mm": `Fp8Linear` below, for where torchao is absent. Forward: the input
  (per tensor, or per row with recipe "rowwise") and the weight are quantized to e4m3 and
  multiplied by `torch._scaled_mm` with the bias added in the GEMM's epilogue. Backward:
  the output gradient is quantized to e5m2 (per tensor) and both gradient GEMMs run in FP8
  too. Every dimension is zero-padded to a multiple of 16 inside the quantization
  (`_scaled_mm` rejects others on CUDA; padding adds zeros to no sum, so the function is
  the same); on CUDA the quantization is compiled (`torch.compile`: amax, scale and cast fused
  into one pass over the tensor), which is what makes it pay. A device without an FP8 GEMM
  (`native_gemm`: a CPU without AVX512-FP16, a GPU before sm_89) multiplies the same FP8
  operands in float32 instead: the error training sees is FP8's, the speed is not.

`Fp8Linear` also takes a `Quantized` input: an activation its producer already cast to e4m3
with one scale (lrm.fp8.norm.QuantizedLayerNorm fuses the cast into the LayerNorm, mod
`fp8.fuse_norm`). Then the layer runs no amax or cast pass over its input, and keeps the
e4m3 tensor (1 byte an element, not the input's 2 or 4) for the weight gradient.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lrm.errors import ConfigError
from lrm.fp8.formats import E4M3, E4M3_MAX, E5M2, E5M2_MAX

log = logging.getLogger("lrm")
ALIGN = 16  # _scaled_mm on CUDA: every dimension a multiple of 16
TORCHAO = "torchao==0.18.0"  # the release whose float8 training runs on torch 2.11-2.13


def torchao_available() -> bool:
    return importlib.util.find_spec("torchao") is not None


def resolve_backend(backend: str) -> str:
    """"auto" -> torchao where installed, else scaled_mm; "torchao" without it is an error."""
    if backend == "auto":
        return "torchao" if torchao_available() else "scaled_mm"
    if backend == "torchao" and not torchao_available():
        raise ConfigError(f"fp8.backend: torchao is not installed (pip install {TORCHAO}; "
                          f"its float8 training needs torch >= 2.11), or set fp8.backend: "
                          f"scaled_mm (torch._scaled_mm)")
    return backend


def _quantize(x: torch.Tensor, dtype: torch.dtype, rowwise: bool
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (x in `dtype` zero-padded to [M', K'] multiples of 16, row-major,
    inverse scale).

    The inverse scale is [M', 1] per row, or a scalar; `_scaled_mm` multiplies it back.
    Row-major whatever x's layout (x may be a transpose, as in the backward): cuBLASLt
    multiplies only a row-major first operand by a column-major second (`_mm` passes qᵀ).
    """
    limit = E4M3_MAX if dtype == E4M3 else E5M2_MAX
    x = x.float()
    amax = x.abs().amax(-1, keepdim=True) if rowwise else x.abs().amax()
    scale = limit / amax.clamp_min(1e-12)
    q = (x * scale).clamp(-limit, limit)
    pm, pk = (-x.shape[0]) % ALIGN, (-x.shape[1]) % ALIGN
    if pm or pk:
        q = F.pad(q, (0, pk, 0, pm))
    inv = scale.reciprocal()
    if rowwise and pm:
        inv = F.pad(inv, (0, 0, 0, pm), value=1.0)
    return q.to(dtype).contiguous(), inv


@dataclass(frozen=True)
class Quantized:
    """An activation that arrives already in e4m3 with one scale: its value is `q * inv`.

    `handle` is not the activation: a zero-stride tensor of its shape and dtype that
    requires grad, so the gradient the consuming Fp8Linear computes for the activation
    flows back to whatever produced `q` (its values are never read). A Quantized is no
    Tensor: any consumer but an Fp8Linear fails on it instead of reading wrong values.
    """

    q: torch.Tensor  # [..., K] float8_e4m3fn
    inv: torch.Tensor  # 0-d float32, the inverse scale
    handle: torch.Tensor  # [..., K]: carries the gradient back to the producer

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Quantized:
        """Both tensors flattened alike (one scale: any view of q is still quantized)."""
        return Quantized(self.q.flatten(start_dim, end_dim), self.inv,
                         self.handle.flatten(start_dim, end_dim))

    def dequantize(self) -> torch.Tensor:
        return self.q.float() * self.inv


def _pad16(q: torch.Tensor) -> torch.Tensor:
    """A 2-D e4m3 tensor zero-padded to multiples of 16 (what `quantize` returns)."""
    pm, pk = (-q.shape[0]) % ALIGN, (-q.shape[1]) % ALIGN
    return F.pad(q, (0, pk, 0, pm)) if pm or pk else q.contiguous()


@functools.cache
def _compiled_quantize() -> Any:
    return torch.compile(_quantize, dynamic=True)


def quantize(x: torch.Tensor, dtype: torch.dtype, rowwise: bool = False, *,
             compile: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    fn = _compiled_quantize() if compile and x.is_cuda else _quantize
    return fn(x, dtype, rowwise)


# devices where `torch._scaled_mm` failed: their FP8 GEMMs multiply in float32 from then on
_NO_GEMM: set[str] = set()


def _no_gemm(device: torch.device, e: RuntimeError) -> None:
    _NO_GEMM.add(str(device))
    log.warning("fp8: no FP8 GEMM on %s (torch._scaled_mm: %s): its FP8 layers multiply "
                "their FP8 operands in float32 (FP8's error, not its speed)", device,
                (str(e).strip().splitlines() or ["unsupported"])[0].split(". ")[0][:120])


def native_gemm(device: torch.device | str) -> bool:
    """Whether FP8 GEMMs on `device` run on its own kernel (`torch._scaled_mm`) now, tried
    on a small product; elsewhere `Fp8Linear` multiplies the same FP8 operands in float32.

    On a CPU, torch runs oneDNN's FP8 matmul, which needs AVX512-FP16 (Intel Sapphire
    Rapids and later: not an AMD Zen 4, nor an older Intel CPU with AVX-512, where it raises
    "could not create a primitive descriptor for the matmul primitive"), or its own kernel
    where it does not use oneDNN; which one can change within a process (once oneDNN has run
    a bf16 matmul, as bf16 autocast does), so this is asked, not cached. On CUDA: FP8 tensor
    cores (sm_89 and later)."""
    device = torch.device(device)
    if str(device) in _NO_GEMM:
        return False
    a = torch.zeros(ALIGN, ALIGN, device=device).to(E4M3)
    one = torch.ones((), device=device)
    try:
        torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
    except RuntimeError:
        return False
    return True


def _mm(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor],
        out_dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a [M, K] @ b [N, K]ᵀ from quantized operands (b's rows are the output columns)."""
    (qa, sa), (qb, sb) = a, b
    if sb.dim() == 2:  # per row of b = per output column
        sb = sb.reshape(1, -1)
    if str(qa.device) not in _NO_GEMM:
        try:
            return torch._scaled_mm(qa, qb.t(), scale_a=sa, scale_b=sb, bias=bias,
                                    out_dtype=out_dtype)
        except RuntimeError as e:  # no kernel for it here (`native_gemm`)
            _no_gemm(qa.device, e)
    # the same product without the kernel: e4m3/e5m2 operands are exact in float32, and so
    # are their products; only the order of the float32 sums may differ from a kernel's
    with torch.autocast(qa.device.type, enabled=False):
        y = torch.mm(qa.float(), qb.float().t()) * sa * sb
        if bias is not None:
            y = y + bias.float()
    return y.to(out_dtype)


class _Fp8Matmul(torch.autograd.Function):
    """y = x Wᵀ + b with e4m3 operands; the backward's gradients in e5m2.

    pre: x already quantized, (q [M, K] e4m3, inverse scale), one scale per tensor; then
    `x` is only the gradient's handle (Quantized.handle) and its values are not read.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                rowwise: bool, epilogue: bool, compile: bool, out_dtype: torch.dtype,
                pre: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        m, n = x.shape[0], weight.shape[0]
        qx = quantize(x, E4M3, rowwise, compile=compile) if pre is None else \
            (_pad16(pre[0]), pre[1].float())
        qw = quantize(weight, E4M3, rowwise, compile=compile)
        pad_n = qw[0].shape[0] - n
        # the bias is added by the GEMM's epilogue, not a second pass (cuBLAS takes a bias
        # only with a 16-bit output)
        epilogue = epilogue and bias is not None and not (x.is_cuda and
                                                          out_dtype == torch.float32)
        b = F.pad(bias, (0, pad_n)).to(out_dtype) if epilogue else None
        y = _mm(qx, qw, out_dtype, b)[:m, :n]
        if bias is not None and not epilogue:
            y = y + bias.to(out_dtype)
        if pre is None:
            ctx.save_for_backward(x, weight)
        else:  # the e4m3 input serves the weight gradient: one scale, so qᵀ = quantize(xᵀ)
            ctx.save_for_backward(weight, *qx)
        ctx.pre, ctx.m, ctx.k, ctx.x_dtype = pre is not None, m, x.shape[1], x.dtype
        ctx.has_bias, ctx.compile = bias is not None, compile
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        if ctx.pre:
            weight, qx, inv = ctx.saved_tensors
        else:
            x, weight = ctx.saved_tensors
        m, k, n = ctx.m, ctx.k, weight.shape[0]
        c = ctx.compile
        g = grad.contiguous()
        dx = dw = None
        if ctx.needs_input_grad[0]:  # dX [M, K] = G [M, N] @ W [N, K]
            dx = _mm(quantize(g, E5M2, compile=c), quantize(weight.t(), E4M3, compile=c),
                     torch.float32)[:m, :k].to(ctx.x_dtype)
        if ctx.needs_input_grad[1]:  # dW [N, K] = Gᵀ [N, M] @ X [M, K]
            qxt = (qx.t().contiguous(), inv) if ctx.pre else quantize(x.t(), E4M3, compile=c)
            dw = _mm(quantize(g.t(), E5M2, compile=c), qxt, torch.float32)[:n, :k] \
                .to(weight.dtype)
        db = g.float().sum(0).to(weight.dtype) if ctx.has_bias and ctx.needs_input_grad[2] \
            else None
        return dx, dw, db, None, None, None, None, None


class Fp8Linear(nn.Linear):
    """nn.Linear whose GEMMs run in FP8 through `torch._scaled_mm` (module docstring).

    Built with `from_linear`, it shares the original's parameters. Under autocast its output
    has the autocast dtype (like nn.Linear's); otherwise the input's.
    """

    recipe: str = "tensorwise"
    epilogue: bool = True  # bias added in the GEMM's epilogue (False: a separate add)
    compile: bool = True

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe: str = "tensorwise", *,
                    epilogue: bool = True, compile: bool = True) -> Fp8Linear:
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight = linear.weight
        new.bias = linear.bias
        new.recipe, new.epilogue, new.compile = recipe, epilogue, compile
        return new

    def forward(self, x: torch.Tensor | Quantized) -> torch.Tensor:
        pre = None
        if isinstance(x, Quantized):
            if self.recipe != "tensorwise":
                raise ValueError(f"Fp8Linear({self.recipe}) got an input quantized with one "
                                 f"scale per tensor; only the tensorwise recipe takes one")
            pre = (x.q.reshape(-1, self.in_features), x.inv)
            x = x.handle
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if torch.is_autocast_enabled(x.device.type):
            out_dtype = torch.get_autocast_dtype(x.device.type)
        else:
            out_dtype = x.dtype
        with torch.autocast(x.device.type, enabled=False):
            y = _Fp8Matmul.apply(x2, self.weight, self.bias, self.recipe == "rowwise",
                                 self.epilogue, self.compile, out_dtype, pre)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, fp8={self.recipe}"


def to_fp8(linear: nn.Linear, recipe: str = "tensorwise", *, backend: str = "auto",
           compile: bool = True) -> nn.Linear:
    """An FP8 version of `linear` sharing its parameters (see the module docstring)."""
    backend = resolve_backend(backend)
    if backend == "torchao":
        from torchao.float8 import Float8LinearConfig
        from torchao.float8.float8_linear import Float8Linear

        config = Float8LinearConfig.from_recipe_name(recipe)
        return Float8Linear.from_float(linear, config=config)  # type: ignore[no-any-return]
    return Fp8Linear.from_linear(linear, recipe, compile=compile)


def is_fp8(module: nn.Module) -> bool:
    if isinstance(module, Fp8Linear):
        return True
    return type(module).__name__ == "Float8Linear"  # torchao's, without importing it


__all__ = ["ALIGN", "Fp8Linear", "Quantized", "TORCHAO", "is_fp8", "native_gemm", "quantize",
           "resolve_backend", "to_fp8", "torchao_available"]

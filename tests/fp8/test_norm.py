"""LayerNorm with its e4m3 cast fused in, and the bf16-stream LayerNorm (lrm.fp8.norm)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lrm.fp8.formats import E4M3, per_tensor
from lrm.fp8.norm import QuantizedLayerNorm, StreamCast, StreamLayerNorm, ln_bound
from lrm.fp8.probe import error_metrics

D = 32


def _norm(seed: int, d: int = D) -> nn.LayerNorm:
    """A LayerNorm with trained-looking γ, β (not the init's ones and zeros)."""
    g = torch.Generator().manual_seed(seed)
    ln = nn.LayerNorm(d)
    with torch.no_grad():
        ln.weight.copy_(torch.rand(d, generator=g) + 0.5)
        ln.bias.copy_(torch.randn(d, generator=g) * 0.3)
    return ln


def _inputs(seed: int, rows: int = 512, d: int = D) -> torch.Tensor:
    """Heavy-tailed rows, some with one large spike (the rows closest to the bound)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, d, generator=g) ** 3 * 2 + 1
    spikes = torch.randint(0, d, (rows // 4,), generator=g)
    x[torch.arange(rows // 4), spikes] += 50 * torch.randn(rows // 4, generator=g)
    return x


def test_the_bound_holds_for_every_input_and_a_spiked_row_reaches_it():
    ln = nn.LayerNorm(D)
    j = 5
    with torch.no_grad():
        ln.weight.fill_(1.2)
        ln.bias.uniform_(-0.2, 0.2)
        ln.bias[j] = 0.5  # the largest |β|, where the spike goes
    want = math.sqrt(D - 1) * 1.2 + 0.5  # sqrt(d-1) max|x̂| times γ, plus β
    assert float(ln_bound(ln.weight, ln.bias, D)) == \
        torch.tensor(want, dtype=torch.float32).item()
    with torch.no_grad():
        y = ln(_inputs(0))
        spike = torch.zeros(1, D)
        spike[0, j] = 1000.0  # one value apart from d-1 equal ones: |x̂| = sqrt(d-1)
        top = ln(spike)[0, j]
    assert float(y.abs().max()) <= want
    assert want * (1 - 1e-4) <= float(top) <= want * (1 + 1e-6)
    assert float(ln_bound(None, None, D)) == torch.tensor(math.sqrt(D - 1)).item()


def test_the_fused_norm_is_layer_norm_then_a_cast_at_the_bounds_scale():
    ln = _norm(1)
    fused = QuantizedLayerNorm.from_norm(ln, compile=False)
    assert fused.weight is ln.weight and fused.bias is ln.bias
    assert list(fused.state_dict()) == ["weight", "bias"]
    x = _inputs(2).view(16, 32, D)
    with torch.no_grad():
        out = fused(x)
        y = ln(x)
    assert out.q.dtype == E4M3 and out.shape == x.shape and out.handle.shape == x.shape
    bound = math.sqrt(D - 1) * ln.weight.abs() + ln.bias.abs()
    want = per_tensor(y, E4M3, amax=bound.max())  # the probe's emulated cast, that scale
    torch.testing.assert_close(out.dequantize().double(), want, rtol=1e-6, atol=0)
    assert error_metrics(y, out.dequantize())["sqnr_db"] > 25  # e4m3's precision, kept
    # bf16 input (the bf16 residual): the norm runs in bf16, γ and β cast to it
    xb = x.bfloat16()
    with torch.no_grad():
        outb = fused(xb)
        yb = F.layer_norm(xb, (D,), ln.weight.bfloat16(), ln.bias.bfloat16(), ln.eps)
    bound_b = math.sqrt(D - 1) * ln.weight.bfloat16().float().abs() + \
        ln.bias.bfloat16().float().abs()
    assert outb.handle.dtype == torch.bfloat16
    torch.testing.assert_close(outb.dequantize().double(), per_tensor(yb, E4M3, bound_b.max()),
                               rtol=1e-6, atol=0)


def test_the_fused_norms_backward_is_layer_norms():
    ln = _norm(3)
    x = _inputs(4).view(8, 64, D)
    dy = torch.randn(8, 64, D, generator=torch.Generator().manual_seed(5))
    xa = x.clone().requires_grad_()
    ln(xa).backward(dy)
    want = (xa.grad, ln.weight.grad.clone(), ln.bias.grad.clone())
    ln.zero_grad()
    xb = x.clone().requires_grad_()
    out = QuantizedLayerNorm.from_norm(ln, compile=False)(xb)
    (out.handle * dy).sum().backward()  # the consumer hands back d(loss)/d(LN output)
    for got, ref in zip((xb.grad, ln.weight.grad, ln.bias.grad), want):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


def test_the_stream_norm_reads_and_writes_the_autocast_dtype():
    ln = _norm(6)
    stream = StreamLayerNorm.from_norm(ln)
    x = _inputs(7)
    with torch.no_grad():
        assert torch.equal(stream(x), ln(x))  # no autocast: nn.LayerNorm, unchanged
        assert StreamCast()(x) is x
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = stream(x)  # autocast alone would run it in float32 for a float32 input
            plain = ln(x)
            cast = StreamCast()(x)
    assert plain.dtype == torch.float32
    assert y.dtype == torch.bfloat16 and cast.dtype == torch.bfloat16
    want = F.layer_norm(x.bfloat16(), (D,), ln.weight.bfloat16(), ln.bias.bfloat16(), ln.eps)
    assert torch.equal(y, want)
    assert error_metrics(ln(x).detach(), y)["sqnr_db"] > 40  # bf16's error, no more

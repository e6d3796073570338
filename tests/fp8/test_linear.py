"""FP8 linears: the real `_scaled_mm` kernels, padding to 16, bias epilogue, gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lrm.errors import ConfigError
from lrm.fp8 import linear as L
from lrm.fp8.formats import per_tensor
from lrm.fp8.probe import error_metrics


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_linear_trains_close_to_full_precision_and_shares_parameters(recipe):
    torch.manual_seed(0)
    lin = nn.Linear(40, 24)  # neither a multiple of 16: padded inside
    f8 = L.Fp8Linear.from_linear(lin, recipe)
    assert f8.weight is lin.weight and f8.bias is lin.bias
    assert list(f8.state_dict()) == ["weight", "bias"]
    x = torch.randn(37, 40, requires_grad=True)
    x8 = x.detach().clone().requires_grad_()
    g = torch.randn(37, 24)
    lin(x).backward(g)
    ref = {"x": x.grad, "w": lin.weight.grad.clone(), "b": lin.bias.grad.clone()}
    lin.zero_grad()
    y8 = f8(x8)
    y8.backward(g)
    assert y8.shape == (37, 24) and y8.dtype == torch.float32
    assert error_metrics(lin(x).detach(), y8.detach())["sqnr_db"] > 25
    assert error_metrics(ref["x"], x8.grad)["sqnr_db"] > 20  # e5m2 gradient
    assert error_metrics(ref["w"], lin.weight.grad)["sqnr_db"] > 20
    torch.testing.assert_close(lin.bias.grad, ref["b"])


def test_forward_is_the_emulated_quantized_gemm_and_padding_changes_nothing():
    torch.manual_seed(1)
    lin = nn.Linear(13, 7)  # padded to 16 x 16 inside
    x = torch.randn(5, 13)
    want = per_tensor(x) @ per_tensor(lin.weight.detach()).T + lin.bias.detach().double()
    for epilogue in (True, False):
        y = L.Fp8Linear.from_linear(lin, epilogue=epilogue)(x)
        torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5)
    # backward: G in e5m2, the other operand in e4m3, each one scale per tensor
    xg = x.clone().requires_grad_()
    g = torch.randn(5, 7)
    lin.zero_grad()
    L.Fp8Linear.from_linear(lin)(xg).backward(g)
    qg = per_tensor(g, L.E5M2)
    torch.testing.assert_close(xg.grad.double(), qg @ per_tensor(lin.weight.detach()),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lin.weight.grad.double(), qg.T @ per_tensor(x),
                               rtol=1e-5, atol=1e-5)


def test_the_quantizer_pads_to_multiples_of_16():
    q, inv = L.quantize(torch.randn(5, 13), L.E4M3, rowwise=True)
    assert q.shape == (16, 16) and q.dtype == L.E4M3 and inv.shape == (16, 1)
    assert q[5:].float().abs().sum() == 0 and q[:, 13:].float().abs().sum() == 0


def test_torchao_backend_without_torchao_says_what_to_install(monkeypatch):
    monkeypatch.setattr(L, "torchao_available", lambda: False)
    assert L.resolve_backend("auto") == "scaled_mm"
    with pytest.raises(ConfigError, match=r"torchao==0\.18\.0"):
        L.resolve_backend("torchao")

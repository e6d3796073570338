"""FP8 linears: the real `_scaled_mm` kernels, padding to 16, bias epilogue, gradients."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from lrm.errors import ConfigError
from lrm.fp8 import linear as L
from lrm.fp8.formats import per_tensor
from lrm.fp8.probe import error_metrics
from tests.conftest import REPO


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


@pytest.mark.parametrize("rowwise", [False, True])
def test_the_quantizer_returns_row_major_whatever_the_input_layout(rowwise):
    # the backward quantizes transposes (Wᵀ, Xᵀ, Gᵀ); cuBLASLt refuses a first operand
    # that is not row-major, and _mm hands it q and qᵀ as they come (no padding: no copy)
    xt = torch.randn(48, 32).t()
    q, inv = L.quantize(xt, L.E4M3, rowwise=rowwise)
    assert q.shape == (32, 48) and q.is_contiguous()
    torch.testing.assert_close(q.float() * inv, xt, rtol=0.07, atol=1e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (cuBLASLt's FP8 GEMM)")
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_linear_trains_on_a_gpu_with_aligned_shapes(recipe):
    torch.manual_seed(0)
    lin = nn.Linear(64, 32).cuda()  # multiples of 16: no padding copy anywhere
    x = torch.randn(48, 64, device="cuda", requires_grad=True)
    g = torch.randn(48, 32, device="cuda")
    lin(x).backward(g)
    ref = {"x": x.grad.clone(), "w": lin.weight.grad.clone()}
    x.grad, lin.weight.grad = None, None
    L.Fp8Linear.from_linear(lin, recipe)(x).backward(g)
    assert error_metrics(ref["x"], x.grad)["sqnr_db"] > 20
    assert error_metrics(ref["w"], lin.weight.grad)["sqnr_db"] > 20


def test_torchao_backend_without_torchao_says_what_to_install(monkeypatch):
    monkeypatch.setattr(L, "torchao_available", lambda: False)
    assert L.resolve_backend("auto") == "scaled_mm"
    with pytest.raises(ConfigError, match=r"torchao==0\.18\.0"):
        L.resolve_backend("torchao")


def _quantized(a: torch.Tensor, bound: float) -> L.Quantized:
    """`a` cast to e4m3 at the scale of `bound` (as a fused producer does); the handle is
    NaN: the Linear must never read it."""
    scale = L.E4M3_MAX / bound
    q = (a * scale).clamp(-L.E4M3_MAX, L.E4M3_MAX).to(L.E4M3)
    handle = torch.full(a.shape, float("nan"), requires_grad=True)
    return L.Quantized(q, torch.tensor(1 / scale), handle)


def test_a_prequantized_input_is_used_as_is_forward_and_backward(monkeypatch):
    torch.manual_seed(2)
    lin = nn.Linear(40, 24)  # padded to 48 x 32 inside
    a = torch.randn(37, 40)
    x = _quantized(a, bound=1.5 * float(a.abs().max()))  # a looser scale than the amax
    seen = []
    quantize = L.quantize
    monkeypatch.setattr(L, "quantize", lambda t, *a, **k: seen.append(tuple(t.shape)) or
                        quantize(t, *a, **k))
    f8 = L.Fp8Linear.from_linear(lin)
    y = f8(x)
    deq = x.dequantize().double()
    w = per_tensor(lin.weight.detach())
    torch.testing.assert_close(y.double(), deq @ w.T + lin.bias.detach().double(),
                               rtol=1e-5, atol=1e-5)
    g = torch.randn(37, 24)
    y.backward(g)
    qg = per_tensor(g, L.E5M2)
    torch.testing.assert_close(x.handle.grad.double(), qg @ w, rtol=1e-5, atol=1e-5)
    # the weight gradient uses the e4m3 input it was given, not a requantization
    torch.testing.assert_close(lin.weight.grad.double(), qg.T @ deq, rtol=1e-5, atol=1e-5)
    assert (37, 40) not in seen and (40, 37) not in seen  # no amax/cast pass over the input
    seen.clear()
    f8(a.requires_grad_()).backward(g)
    assert seen.count((37, 40)) == 1 and seen.count((40, 37)) == 1  # what it saves
    with pytest.raises(ValueError, match="tensorwise"):
        L.Fp8Linear.from_linear(lin, "rowwise")(x)


def test_a_quantized_input_flattens_alike_and_is_no_tensor():
    x = _quantized(torch.randn(4, 3, 8), bound=10.0)
    flat = x.flatten(1)
    assert flat.shape == (4, 24) and flat.handle.shape == (4, 24) and flat.inv is x.inv
    assert torch.equal(flat.dequantize(), x.dequantize().flatten(1))
    with pytest.raises(TypeError):
        nn.Linear(24, 2)(flat)  # a plain layer cannot read it by mistake


def _no_kernel(*args, **kwargs):
    raise RuntimeError("could not create a primitive descriptor for the matmul primitive.")


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_without_a_device_gemm_the_same_fp8_operands_multiply_in_float32(monkeypatch, caplog,
                                                                         recipe):
    # a device whose `_scaled_mm` raises (no FP8 kernel): the layer trains on, with the
    # product the kernel gives where there is one (the forward and every gradient)
    torch.manual_seed(3)
    lin = nn.Linear(40, 24)
    x = torch.randn(37, 40)
    g = torch.randn(37, 24)

    def run() -> list[torch.Tensor]:
        xg = x.clone().requires_grad_()
        lin.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = L.Fp8Linear.from_linear(lin, recipe)(xg)
        assert y.dtype == torch.bfloat16  # the autocast dtype, as nn.Linear's
        y.float().backward(g)
        return [y.float(), xg.grad.clone(), lin.weight.grad.clone(), lin.bias.grad.clone()]

    monkeypatch.setattr(L, "_NO_GEMM", set())
    kernel = run() if L.native_gemm("cpu") else None
    monkeypatch.setattr(torch, "_scaled_mm", _no_kernel)
    with caplog.at_level("WARNING", logger="lrm"):
        emulated = run()
    assert not L.native_gemm("cpu")
    said = [r.getMessage() for r in caplog.records if "no FP8 GEMM" in r.getMessage()]
    assert len(said) == 1 and "float32" in said[0], said  # once, not once a GEMM
    if kernel is None:
        pytest.skip("this CPU has no FP8 GEMM to compare with")
    for a, b in zip(kernel, emulated, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-3)  # (the bf16 output's ulp)


def test_a_cpu_without_an_fp8_gemm_trains_an_fp8_layer(tmp_path):
    # oneDNN's FP8 matmul needs AVX512-FP16; ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 makes this
    # CPU look like one with AVX-512 and bf16 but no FP16 (an AMD Zen 4, an Intel Cooper
    # Lake), where torch._scaled_mm raises "could not create a primitive descriptor"
    script = tmp_path / "step.py"
    script.write_text(
        "import torch\n"
        "from torch import nn\n"
        "from lrm.fp8 import linear as L\n"
        "from lrm.fp8.formats import per_tensor\n"
        "a, one = torch.zeros(16, 16).to(L.E4M3), torch.ones(())\n"
        "try:\n"
        "    torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)\n"
        "    print('kernel')\n"
        "    raise SystemExit(0)\n"
        "except RuntimeError:\n"
        "    pass\n"
        "torch.manual_seed(1)\n"
        "lin = nn.Linear(13, 7)\n"
        "x = torch.randn(5, 13, requires_grad=True)\n"
        "y = L.Fp8Linear.from_linear(lin)(x)\n"
        "want = per_tensor(x.detach()) @ per_tensor(lin.weight.detach()).T "
        "+ lin.bias.detach().double()\n"
        "torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5)\n"
        "g = torch.randn(5, 7)\n"
        "y.backward(g)\n"
        "qg = per_tensor(g, L.E5M2)\n"
        "torch.testing.assert_close(x.grad.double(), qg @ per_tensor(lin.weight.detach()), "
        "rtol=1e-5, atol=1e-5)\n"
        "assert not L.native_gemm('cpu')\n"
        "print('ok')\n")
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16", "PYTHONPATH": str(REPO)}
    env.pop("ATEN_CPU_CAPABILITY", None)
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    if r.stdout.strip() == "kernel":
        pytest.skip("torch multiplies FP8 on this CPU even so (its own kernel, not oneDNN's)")
    assert r.stdout.strip() == "ok", r.stdout

"""The formats: known values, saturation, MX block scales, e2m1's grid."""

from __future__ import annotations

import torch

from lrm.fp8.formats import mx, per_row, per_tensor, quantize


def test_per_tensor_maps_amax_to_448_and_rounds_like_a_cast():
    x = torch.tensor([[1.0, -2.0, 0.3, 4.0]])
    q = per_tensor(x)
    scale = 448 / 4.0
    want = (x * scale).to(torch.float8_e4m3fn).double() / scale
    assert torch.equal(q, want)
    assert q.abs().max() == 4.0  # amax is exact


def test_a_sample_uses_the_whole_tensors_scale():
    x = torch.tensor([[0.01, 0.02, 0.03]])
    alone, in_tensor = per_tensor(x), quantize(x, "e4m3_tensor", amax=1000.0)
    scale = torch.tensor(448 / 1000.0)  # in float32, like the cast kernel
    want = (x * scale).to(torch.float8_e4m3fn).double() / scale.double()
    assert torch.equal(in_tensor, want)  # the whole tensor's scale, not the sample's
    assert (in_tensor - x.double()).abs().max() > (alone - x.double()).abs().max()


def test_per_row_scales_each_row_on_its_own():
    x = torch.tensor([[1e-4, 2e-4], [100.0, 3.0]])
    q = per_row(x)
    assert torch.allclose(q[0], x[0].double(), rtol=0.07)
    assert torch.isclose(q[0].abs().max(), x[0].double().abs().max())
    assert torch.isclose(q[1].abs().max(), torch.tensor(100.0, dtype=torch.float64))


def test_mx_scales_are_powers_of_two_per_block_of_32():
    torch.manual_seed(0)
    x = torch.randn(3, 64)
    x[0, :32] *= 1000  # one block 1000x larger: the other blocks keep their precision
    q = mx(x, "e4m3")
    err = (q - x.double()).abs() / x.double().abs().clamp_min(1e-3)
    assert err[0, 32:].median() < 0.07 and err[1:].median() < 0.07
    # the scale is 2^(floor(log2 amax) - 8): an exactly representable block stays exact
    y = torch.tensor([[2.0 ** -20 * v for v in (1.0, 1.5, 448 / 256)] + [0.0] * 29])
    assert torch.equal(mx(y, "e4m3"), y.double())


def test_mxfp4_lands_on_the_e2m1_grid():
    x = torch.tensor([[6.0, 5.1, 2.4, 0.7, 0.2, -3.3, 0.0, 1.25] + [0.0] * 24])
    q = mx(x, "e2m1")  # amax 6 -> scale 2^(2 - 2) = 1: the grid itself
    assert q[0, :8].tolist() == [6.0, 6.0, 2.0, 0.5, 0.0, -3.0, 0.0, 1.5]

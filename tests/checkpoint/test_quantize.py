"""Row-wise quantization: fbgemm's 8- and 4-bit round trips stay within half a step of
each row's range, widths fbgemm's n-bit operator rejects are padded, the byte count per
row the chain policy plans with is what is stored, and each chain setting's codecs."""

from __future__ import annotations

import pytest
import torch

from lrm.checkpoint import quantize


@pytest.mark.parametrize("codec, levels", [("n8", 255), ("fused8", 255), ("n4", 15)])
@pytest.mark.parametrize("cols", [8, 6, 3, 64])
def test_round_trip_within_half_a_step_of_each_row(codec, levels, cols):
    g = torch.Generator().manual_seed(cols)
    rows = torch.randn(200, cols, generator=g) * torch.logspace(-3, 1, 200).unsqueeze(1)
    stored = quantize.encode(rows, codec)
    assert stored.dtype == torch.uint8
    assert stored.shape == (200, quantize.row_bytes(cols, codec))
    back = quantize.decode(stored, codec, cols)
    assert back.shape == rows.shape and back.dtype == torch.float32
    step = (rows.max(1).values - rows.min(1).values) / levels
    # half a step, plus the rounding of an fp16 scale and bias (a scale under 2^-14 is
    # subnormal: multiples of 2^-24, which `levels` steps add up)
    slack = 1e-6 if codec == "fused8" else 2e-3 * rows.abs().max(1).values + levels * 2**-24
    assert ((back - rows).abs().max(1).values <= step / 2 + slack).all()


def test_f32_is_exact_and_constant_rows_survive():
    rows = torch.randn(5, 7)
    assert torch.equal(quantize.decode(quantize.encode(rows, "f32"), "f32", 7), rows)
    assert quantize.row_bytes(7, "f32") == 28
    assert quantize.row_bytes(16, "n8") == 20 and quantize.row_bytes(16, "n4") == 12
    assert quantize.row_bytes(3, "n8") == 8 and quantize.row_bytes(3, "n4") == 6  # padded
    flat = torch.full((3, 6), 0.25)
    for codec in ("n8", "n4"):
        assert torch.allclose(quantize.decode(quantize.encode(flat, codec), codec, 6), flat,
                              atol=1e-3)
    empty = torch.zeros(0, 6)
    assert quantize.decode(quantize.encode(empty, "n4"), "n4", 6).shape == (0, 6)


def test_chain_settings_pick_baseline_and_delta_codecs():
    assert quantize.codecs("none") == ("f32", "f32")
    assert quantize.codecs("int8") == ("n8", "n8")
    assert quantize.codecs("int4") == ("n8", "n4")  # 4-bit deltas over 8-bit baselines
    assert quantize.state_dtype("none") == torch.float32
    assert quantize.state_dtype("int4") == torch.bfloat16


def test_unknown_quantization_is_refused():
    with pytest.raises(ValueError, match="int2"):
        quantize.codecs("int2")
    with pytest.raises(ValueError, match="n2"):
        quantize.encode(torch.zeros(1, 4), "n2")

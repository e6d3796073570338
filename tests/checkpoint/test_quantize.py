"""Row-wise quantization: fbgemm's int8 / int4 round trips stay within half a step of each
row's range, widths fbgemm's 4-bit operator rejects are padded, and the byte count per row
the chain policy plans with is what is stored."""

from __future__ import annotations

import pytest
import torch

from lrm.checkpoint import quantize


@pytest.mark.parametrize("q, levels", [("int8", 255), ("int4", 15)])
@pytest.mark.parametrize("cols", [8, 6, 3, 64])
def test_round_trip_within_half_a_step_of_each_row(q, levels, cols):
    g = torch.Generator().manual_seed(cols)
    rows = torch.randn(200, cols, generator=g) * torch.logspace(-3, 1, 200).unsqueeze(1)
    stored = quantize.encode(rows, q)
    assert stored.dtype == torch.uint8
    assert stored.shape == (200, quantize.row_bytes(cols, q))
    back = quantize.decode(stored, q, cols)
    assert back.shape == rows.shape and back.dtype == torch.float32
    step = (rows.max(1).values - rows.min(1).values) / levels
    # half a step, plus the rounding of int4's fp16 scale and bias
    slack = 1e-6 if q == "int8" else 2e-3 * rows.abs().max(1).values
    assert ((back - rows).abs().max(1).values <= step / 2 + slack).all()


def test_none_is_exact_and_constant_rows_survive():
    rows = torch.randn(5, 7)
    assert torch.equal(quantize.decode(quantize.encode(rows, "none"), "none", 7), rows)
    assert quantize.row_bytes(7, "none") == 28
    flat = torch.full((3, 6), 0.25)
    for q in ("int8", "int4"):
        assert torch.allclose(quantize.decode(quantize.encode(flat, q), q, 6), flat, atol=1e-3)
    empty = torch.zeros(0, 6)
    assert quantize.decode(quantize.encode(empty, "int4"), "int4", 6).shape == (0, 6)


def test_unknown_quantization_is_refused():
    with pytest.raises(ValueError, match="int2"):
        quantize.encode(torch.zeros(1, 4), "int2")

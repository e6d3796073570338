"""Memory traffic counted operator by operator (lrm.fp8.speed.bytes_moved)."""

from __future__ import annotations

import torch

from lrm.fp8.speed import bytes_moved


def test_each_operator_counts_what_it_reads_and_writes_and_views_count_nothing():
    a, b = torch.randn(1000), torch.randn(1000)
    assert bytes_moved(lambda: a + b) == (3 * 4000, 1)  # reads 2 x 4000, writes 4000
    assert bytes_moved(lambda: a.bfloat16()) == (4000 + 2000, 1)  # a cast: half the write
    assert bytes_moved(lambda: a.view(10, 100).t()) == (0, 0)
    c = a.clone()
    assert bytes_moved(lambda: c.add_(b)) == (3 * 4000, 1)  # in place: reads 2, writes 1
    row = torch.randn(1, 1000)
    assert bytes_moved(lambda: row.expand(50, 1000) * 2)[0] == 4000 + 50 * 4000  # its storage


def test_a_backward_run_inside_counts_too():
    x = torch.randn(64, 32, requires_grad=True)
    w = torch.randn(16, 32, requires_grad=True)
    fwd, _ = bytes_moved(lambda: x @ w.t())
    both, ops = bytes_moved(lambda: (x @ w.t()).backward(torch.ones(64, 16)))
    # forward: reads x, w, writes y; backward: dx = g w (reads g, w, writes dx) and
    # dw = gᵀ x (reads g, x, writes dw)
    assert fwd == 4 * (64 * 32 + 16 * 32 + 64 * 16)
    assert both - fwd >= 4 * (2 * 64 * 16 + 2 * 16 * 32 + 2 * 64 * 32) and ops >= 3

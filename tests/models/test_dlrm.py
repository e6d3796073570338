"""The deduplicated dot interaction is the plain one, pair for pair."""

from __future__ import annotations

import pytest
import torch

from lrm.models.dlrm import DotInteraction


@pytest.mark.parametrize("n_user, n_rest", [(7, 5), (1, 3), (0, 4), (3, 1)])
def test_dedup_interaction_equals_plain(n_user, n_rest):
    g = torch.Generator().manual_seed(n_user * 10 + n_rest)
    U, B, d = 4, 11, 6
    inverse = torch.randint(0, U, (B,), generator=g)
    user = torch.randn(U, n_user, d, generator=g)
    rest = torch.randn(B, n_rest, d, generator=g)
    inter = DotInteraction(n_user, n_rest)
    out = inter(user, rest, lambda t: t.index_select(0, inverse))
    want = DotInteraction.plain(torch.cat([user[inverse], rest], 1))
    assert out.shape == (B, inter.num_pairs) == want.shape
    torch.testing.assert_close(out, want, rtol=0, atol=1e-6)


def test_plain_is_the_upper_triangle():
    x = torch.arange(6.0).view(1, 3, 2)  # vectors (0,1), (2,3), (4,5)
    assert DotInteraction.plain(x).tolist() == [[0 * 2 + 1 * 3, 0 * 4 + 1 * 5, 2 * 4 + 3 * 5]]

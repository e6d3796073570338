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


@pytest.mark.parametrize("n_user, n_rest", [(7, 5), (0, 4), (2, 1)])
def test_dedup_interaction_has_the_plain_gradients(n_user, n_rest):
    g = torch.Generator().manual_seed(7)
    U, B, d = 3, 9, 4
    inverse = torch.randint(0, U, (B,), generator=g)
    inverse[:U] = torch.arange(U)  # every session has an impression
    user = torch.randn(U, n_user, d, generator=g, requires_grad=True)
    rest = torch.randn(B, n_rest, d, generator=g, requires_grad=True)
    inter = DotInteraction(n_user, n_rest)
    up = torch.randn(B, inter.num_pairs, generator=g)
    got = torch.autograd.grad((inter(user, rest, lambda t: t.index_select(0, inverse)) * up).sum(),
                              [user, rest], allow_unused=True)
    want = torch.autograd.grad((DotInteraction.plain(torch.cat([user[inverse], rest], 1))
                                * up).sum(), [user, rest], allow_unused=True)
    for a, b in zip(got, want, strict=True):
        if b is None or b.numel() == 0:  # no user vectors: nothing to compare
            assert a is None or a.numel() == 0
        else:
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_user_dots_are_computed_once_per_session():
    U, B, d, n_user, n_rest = 3, 10, 4, 5, 2
    inter = DotInteraction(n_user, n_rest)
    rows = {}
    for name in ("dot_uu", "dot_rest"):
        getattr(inter, name).register_forward_hook(
            lambda m, args, out, name=name: rows.__setitem__(name, args[0].shape[0]))
    inverse = torch.arange(B) % U
    inter(torch.randn(U, n_user, d), torch.randn(B, n_rest, d),
          lambda t: t.index_select(0, inverse))
    assert rows == {"dot_uu": U, "dot_rest": B}


def test_plain_is_the_upper_triangle():
    x = torch.arange(6.0).view(1, 3, 2)  # vectors (0,1), (2,3), (4,5)
    assert DotInteraction.plain(x).tolist() == [[0 * 2 + 1 * 3, 0 * 4 + 1 * 5, 2 * 4 + 3 * 5]]

"""The student: a DLRM-style model with RecD's deduplicated dot interaction.

bottom MLP(dense) -> one d-vector; sparse features -> pooled d-vectors; the pairwise dots
of all those vectors (upper triangle) together with the bottom output feed the top MLP,
whose last layer is the representation `forward_features` returns and `head` scores.

Dedup (RecD): the dots among user-side embeddings depend only on the session, so they
are computed once per row of `batch.user` and expanded by the inverse index; only the
user x item and item x item dots are computed per impression. The result is the plain
computation's, pair for pair, in the same order.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torchrec import EmbeddingBagConfig

from lrm.config import StudentModelConfig
from lrm.data.batch import Batch
from lrm.data.schema import FeatureSchema
from lrm.models.layers import ScoredModel, mlp
from lrm.models.matmul import BatchedMatmul
from lrm.models.tables import SparseEmbeddings, side_features


def _triu_pairs(n: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(n) for j in range(i + 1, n)]


def _columns(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x[:, idx] of a 2-D x: a gather, whose forward and backward took half the time of
    index_select along dim 1 on a 2-core CPU ([1024, 81] -> 66 columns, bf16: 0.19 vs
    0.41 ms)."""
    return torch.gather(x, 1, idx.expand(x.shape[0], -1))


class DotInteraction(nn.Module):
    """Dots of all pairs i < j of the vectors [user (n_user), rest (n_rest)], row-major.

    forward(user [U, n_user, d], rest [B, n_rest, d], expand) -> [B, num_pairs], where
    `expand` maps per-session rows [U, ...] to impressions [B, ...] (Batch.expand_user).
    Equal to `plain(cat([expand(user), rest], 1))`. Two products, `BatchedMatmul` modules
    (lrm.fp8's probe hooks them): `dot_uu`, user x user once per session, and `dot_rest`,
    rest x [user, rest] per impression; one gather puts their pairs in the plain order.
    (Two products and one gather, not one product and one gather per block: the forward
    and backward of 128 sessions / 1024 impressions, 7 user and 5 other vectors of 16,
    took 1.36 ms instead of 2.06 in float32 and 1.61 instead of 2.80 in bf16 on a 2-core
    CPU.)
    `pad` > 1 pads the products' sizes to multiples of it.
    """

    def __init__(self, n_user: int, n_rest: int, pad: int = 1) -> None:
        super().__init__()
        self.n_user, self.n_rest = n_user, n_rest
        self.dot_uu, self.dot_rest = BatchedMatmul(pad), BatchedMatmul(pad)
        n = n_user + n_rest
        uu = _triu_pairs(n_user)
        self.num_pairs = len(_triu_pairs(n))
        # the gather's input: [uu pairs (i < j < n_user), then rest x all, row r of rest
        # against column c of [user, rest], at r * n + c]; pair (i, j) with j >= n_user is
        # row j - n_user's column i
        at_uu = {p: k for k, p in enumerate(uu)}
        order = [at_uu[i, j] if j < n_user else len(uu) + (j - n_user) * n + i
                 for i, j in _triu_pairs(n)]
        self.register_buffer("_uu", torch.tensor([i * n_user + j for i, j in uu],
                                                  dtype=torch.long), persistent=False)
        self.register_buffer("_order", torch.tensor(order, dtype=torch.long), persistent=False)

    def forward(self, user: torch.Tensor, rest: torch.Tensor,
                expand: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        if self.n_user == 0:
            return _columns(self.dot_rest(rest, rest.transpose(1, 2)).flatten(1), self._order)
        uu = _columns(self.dot_uu(user, user.transpose(1, 2)).flatten(1), self._uu)
        every = torch.cat([expand(user), rest], 1)
        rx = self.dot_rest(rest, every.transpose(1, 2)).flatten(1)
        return _columns(torch.cat([expand(uu), rx], 1), self._order)  # uu once per session

    @staticmethod
    def plain(x: torch.Tensor) -> torch.Tensor:
        """The reference: all dots of x [B, n, d], upper triangle, row-major."""
        i, j = torch.triu_indices(x.shape[1], x.shape[1], offset=1, device=x.device)
        return torch.bmm(x, x.transpose(1, 2))[:, i, j]


class DLRMStudent(ScoredModel):
    """model(batch) -> logits [B]; forward_features(batch) -> [B, top_mlp[-1]] for extra heads."""

    def __init__(self, schema: FeatureSchema, tables: list[EmbeddingBagConfig],
                 cfg: StudentModelConfig, *, device: torch.device | str | None = "cpu",
                 dense_device: torch.device | str | None = None) -> None:
        super().__init__()
        d = cfg.embedding_dim
        user_f, item_f = side_features(schema, tables)
        # dense layers first: their init does not depend on where the tables are built
        self.bottom = mlp(len(schema.dense), cfg.bottom_mlp + [d]) if schema.dense else None
        n_rest = len(item_f) + (1 if self.bottom is not None else 0)
        self.interaction = DotInteraction(len(user_f), n_rest, pad=cfg.interaction_pad)
        top_in = self.interaction.num_pairs + (d if self.bottom is not None else 0)
        self.top = mlp(top_in, cfg.top_mlp)
        self._add_head(cfg.top_mlp[-1], [self.bottom, self.interaction, self.top], dense_device)
        self.embeddings = SparseEmbeddings(schema, tables, device=device)

    def forward_features(self, batch: Batch) -> torch.Tensor:
        user, item = self.embeddings(batch)
        if self.bottom is None:
            return self.top(self.interaction(user, item, batch.expand_user))
        b = self.bottom(batch.dense)
        rest = torch.cat([b.unsqueeze(1), item], 1)
        return self.top(torch.cat([b, self.interaction(user, rest, batch.expand_user)], 1))

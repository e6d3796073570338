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


class DotInteraction(nn.Module):
    """Dots of all pairs i < j of the vectors [user (n_user), rest (n_rest)], row-major.

    forward(user [U, n_user, d], rest [B, n_rest, d], expand) -> [B, num_pairs], where
    `expand` maps per-session rows [U, ...] to impressions [B, ...] (Batch.expand_user).
    Equal to `plain(cat([expand(user), rest], 1))`. The three products are `BatchedMatmul`
    modules (lrm.fp8's probe hooks them); `pad` > 1 pads their sizes to multiples of it.
    """

    def __init__(self, n_user: int, n_rest: int, pad: int = 1) -> None:
        super().__init__()
        self.n_user, self.n_rest = n_user, n_rest
        # user x user (once per session), user x rest, rest x rest; no parameters
        self.dot_uu, self.dot_ur, self.dot_rr = (BatchedMatmul(pad) for _ in range(3))
        uu, rr = _triu_pairs(n_user), _triu_pairs(n_rest)
        self.num_pairs = len(_triu_pairs(n_user + n_rest))
        # where each canonical pair lies in cat([user x user, user x rest, rest x rest])
        at_uu = {p: k for k, p in enumerate(uu)}
        at_rr = {p: len(uu) + n_user * n_rest + k for k, p in enumerate(rr)}
        order = []
        for i, j in _triu_pairs(n_user + n_rest):
            if j < n_user:
                order.append(at_uu[i, j])
            elif i < n_user:
                order.append(len(uu) + i * n_rest + (j - n_user))
            else:
                order.append(at_rr[i - n_user, j - n_user])
        for name, idx in (("uu", uu), ("rr", rr)):
            t = torch.tensor(idx, dtype=torch.long).reshape(-1, 2).T
            self.register_buffer(f"_{name}", t, persistent=False)
        self.register_buffer("_order", torch.tensor(order, dtype=torch.long), persistent=False)

    def forward(self, user: torch.Tensor, rest: torch.Tensor,
                expand: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        rr = self.dot_rr(rest, rest.transpose(1, 2))[:, self._rr[0], self._rr[1]]
        if self.n_user == 0:
            return rr
        uu = self.dot_uu(user, user.transpose(1, 2))[:, self._uu[0], self._uu[1]]
        uu = expand(uu)  # computed once per session
        ur = self.dot_ur(expand(user), rest.transpose(1, 2)).flatten(1)
        return torch.cat([uu, ur, rr], 1).index_select(1, self._order)

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

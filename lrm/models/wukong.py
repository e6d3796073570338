"""The teacher: Wukong (Zhang et al. 2024), stacked factorization-machine layers.

X0 [B, n, d]: the pooled sparse embeddings (user-side ones pooled once per session and
expanded) and the dense features projected by an MLP into `dense_embeddings` d-vectors.
Each layer maps X [B, n_i, d] to [B, n_F + n_L, d]:

    FMB(X) = MLP(flatten(X Xᵀ Y))      -> n_F embeddings  (Y [n_i, k] learnable:
                                          the optimized FM; k = 0 uses X Xᵀ itself)
    LCB(X) = W X,  W [n_L, n_i]        -> n_L embeddings  (linear compress)
    X'     = LayerNorm(concat(FMB(X), LCB(X)) + residual(X))

where residual is X itself, or a linear map of its n_i embeddings to n_F + n_L when the
counts differ; LayerNorm is over each embedding's d values. A top MLP over the flattened
last X gives the representation `forward_features` returns; `head` turns it into a logit.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torchrec import EmbeddingBagConfig

from lrm.config import TeacherModelConfig
from lrm.data.batch import Batch
from lrm.data.schema import FeatureSchema
from lrm.models.layers import ScoredModel, mlp
from lrm.models.matmul import BatchedMatmul
from lrm.models.tables import SparseEmbeddings, side_features


class WukongLayer(nn.Module):
    def __init__(self, n_in: int, dim: int, n_fm: int, n_lcb: int, rank: int,
                 fm_mlp: list[int], norm: str = "embedding") -> None:
        super().__init__()
        self.n_fm, self.dim = n_fm, dim
        # X (Xᵀ Y): two GEMM-like products, modules so lrm.fp8's probe sees them
        self.fm_compress, self.fm_dots = BatchedMatmul(), BatchedMatmul()
        if rank:
            self.fm_proj = nn.Parameter(torch.randn(n_in, rank) / math.sqrt(n_in))
        else:
            self.register_parameter("fm_proj", None)
        fm_in = n_in * (rank or n_in)
        self.fm_mlp = mlp(fm_in, fm_mlp + [n_fm * dim], last_activation=False)
        self.lcb = nn.Linear(n_in, n_lcb, bias=False) if n_lcb else None
        n_out = n_fm + n_lcb
        self.residual = nn.Linear(n_in, n_out, bias=False) if n_in != n_out else None
        self.norm: nn.Module = (nn.LayerNorm(dim) if norm == "embedding" else
                                nn.LayerNorm([n_out, dim]) if norm == "layer" else nn.Identity())
        # where the residual stream enters the layer: lrm.fp8.mods.bf16_residual casts it to
        # bf16 here (no parameters: state dict and init order are those of the plain layer)
        self.stream_in: nn.Module = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stream_in(x)
        xt = x.transpose(1, 2)  # [B, d, n]
        fm = self.fm_dots(x, xt if self.fm_proj is None else self.fm_compress(xt, self.fm_proj))
        out = [self.fm_mlp(fm.flatten(1)).view(-1, self.n_fm, self.dim)]
        if self.lcb is not None:
            out.append(self.lcb(xt).transpose(1, 2))
        res = x if self.residual is None else self.residual(xt).transpose(1, 2)
        return self.norm(torch.cat(out, 1) + res)


class Wukong(ScoredModel):
    """model(batch) -> logits [B]; forward_features(batch) -> [B, top_mlp[-1]]."""

    def __init__(self, schema: FeatureSchema, tables: list[EmbeddingBagConfig],
                 cfg: TeacherModelConfig, *, device: torch.device | str | None = "cpu",
                 dense_device: torch.device | str | None = None) -> None:
        super().__init__()
        d = cfg.embedding_dim
        user_f, item_f = side_features(schema, tables)
        # dense layers first: their init does not depend on where the tables are built
        self.n_dense = cfg.dense_embeddings if schema.dense else 0
        self.dim = d
        self.dense = (mlp(len(schema.dense), cfg.dense_mlp + [self.n_dense * d],
                          last_activation=False) if self.n_dense else None)
        n = len(user_f) + len(item_f) + self.n_dense
        layers = []
        for _ in range(cfg.layers):
            layers.append(WukongLayer(n, d, cfg.fm_embeddings, cfg.lcb_embeddings, cfg.fm_rank,
                                      cfg.fm_mlp, cfg.norm))
            n = cfg.fm_embeddings + cfg.lcb_embeddings
        self.layers = nn.Sequential(*layers)
        self.top = mlp(n * d, cfg.top_mlp)
        self._add_head(cfg.top_mlp[-1], [self.dense, self.layers, self.top], dense_device)
        self.embeddings = SparseEmbeddings(schema, tables, device=device)

    def forward_features(self, batch: Batch) -> torch.Tensor:
        user, item = self.embeddings(batch)
        parts = [batch.expand_user(user)] if self.embeddings.num_user else []
        if self.dense is not None:
            parts.append(self.dense(batch.dense).view(-1, self.n_dense, self.dim))
        parts.append(item)
        x = self.layers(torch.cat(parts, 1))
        # x: a Quantized (e4m3) where lrm.fp8.mods.fuse_norm fused the last norm's cast for
        # an FP8 top.0; its flatten keeps it quantized
        return self.top(x.flatten(1))

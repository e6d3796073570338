"""Models: embedding tables, the Wukong teacher and the DLRM-style student.

Every model maps a `Batch` to logits [B] (float32), exposes `forward_features(batch)`
[B, feature_dim] (the representation its `head` scores, where ExFM's auxiliary head will
attach) and keeps its tables in `model.embeddings.user_ebc` / `.item_ebc`, the plain
EmbeddingBagCollections that DistributedModelParallel shards.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from lrm.config import MODEL_KINDS as KINDS
from lrm.config import ModelConfig
from lrm.data.schema import FeatureSchema
from lrm.models.dlrm import DLRMStudent, DotInteraction
from lrm.models.exfm import ExFMStudent
from lrm.models.tables import SparseEmbeddings, embedding_tables, hash_sizes
from lrm.models.wukong import Wukong


__all__ = ["KINDS", "DLRMStudent", "DotInteraction", "ExFMStudent", "SparseEmbeddings",
           "Wukong", "build_model", "embedding_tables", "hash_sizes", "num_parameters"]


def build_model(kind: Literal["teacher", "student"], schema: FeatureSchema, cfg: ModelConfig,
                *, device: torch.device | str | None = "cpu",
                dense_device: torch.device | str | None = None) -> nn.Module:
    """The teacher (Wukong) or the student (DLRM) for `schema`.

    device: where the embedding tables are created ("meta" to let DistributedModelParallel
    materialize them sharded); dense_device: where the dense layers go (default CPU).
    Deterministic under torch.manual_seed; the dense layers are initialized before the
    tables, so they are the same whatever `device` is.
    """
    if kind == "teacher":
        tables = embedding_tables(schema, cfg.tables, cfg.teacher.embedding_dim)
        return Wukong(schema, tables, cfg.teacher, device=device, dense_device=dense_device)
    if kind == "student":
        tables = embedding_tables(schema, cfg.tables, cfg.student.embedding_dim)
        if cfg.student.aux_head or cfg.student.adapter:  # ExFM's parts (lrm.models.exfm)
            return ExFMStudent(schema, tables, cfg.student, device=device,
                               dense_device=dense_device)
        return DLRMStudent(schema, tables, cfg.student, device=device, dense_device=dense_device)
    raise ValueError(f"unknown model kind {kind!r}; expected one of {KINDS}")


def num_parameters(model: nn.Module, *, embeddings: bool | None = None) -> int:
    """Parameter count: all (None), only the embedding tables (True), or only dense (False)."""
    total = 0
    for name, p in model.named_parameters():
        if embeddings is None or name.startswith("embeddings.") == embeddings:
            total += p.numel()
    return total

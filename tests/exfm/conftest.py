"""A tiny teacher (saved untrained: augment only needs a model folder) and tiny configs."""

from __future__ import annotations

from pathlib import Path

import torch

from lrm.config import ModelConfig, TableConfig, TeacherModelConfig
from lrm.data.schema import read_schema
from lrm.models import build_model
from lrm.models.saved import ModelCard, save_model
from lrm.train.data import model_hash_sizes

TINY_TEACHER = ModelConfig(
    tables=TableConfig(max_rows=5000),
    teacher=TeacherModelConfig(embedding_dim=8, dense_embeddings=1, dense_mlp=[8], layers=1,
                          fm_embeddings=4, lcb_embeddings=4, fm_rank=4, fm_mlp=[16],
                          top_mlp=[16]))


def random_teacher(data: Path, out: Path, seed: int = 0) -> Path:
    """An untrained Wukong for `data`'s schema, saved as a model folder."""
    schema, _ = read_schema(data)
    torch.manual_seed(seed)
    model = build_model("teacher", schema, TINY_TEACHER)
    card = ModelCard(kind="teacher", schema=schema, model=TINY_TEACHER,
                     hash_sizes=model_hash_sizes(model), info={"seed": seed})
    return save_model(out, card, model.state_dict())

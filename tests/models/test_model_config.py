"""The `model` params section: nested sections, coercion, and errors that name the key."""

from __future__ import annotations

import pytest

from lrm.config import ModelConfig, from_dict
from lrm.errors import ConfigError


def test_nested_sections():
    cfg = from_dict(ModelConfig, {"tables": {"shared": {"user_history": "ad_id"}},
                                  "teacher": {"layers": 4, "fm_mlp": [128, 128]},
                                  "student": {"embedding_dim": 8}}, "model")
    assert cfg.tables.shared == {"user_history": "ad_id"} and cfg.tables.max_rows == 1_000_000
    assert cfg.teacher.layers == 4 and cfg.teacher.fm_mlp == [128, 128]
    assert cfg.student.embedding_dim == 8 and cfg.student.top_mlp == [128, 64]


@pytest.mark.parametrize("data, needle", [
    ({"teacher": {"layers": 0}}, "model.teacher.layers"),
    ({"teacher": {"fm_mlp": [64, 0]}}, "model.teacher.fm_mlp"),
    ({"student": {"top_mlp": []}}, "model.student.top_mlp"),
    ({"tables": {"seq_pooling": "max"}}, "model.tables.seq_pooling"),
    ({"tables": {"shared": {"a": "a"}}}, "model.tables.shared.a"),
    ({"tables": {"shared": {"a": "b", "b": "c"}}}, "model.tables.shared.a"),
    ({"student": {"emb_dim": 8}}, "unknown keys ['emb_dim']"),
])
def test_errors_name_the_key(data, needle):
    with pytest.raises(ConfigError) as e:
        from_dict(ModelConfig, data, "model")
    assert needle in str(e.value)

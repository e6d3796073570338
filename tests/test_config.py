"""Configs from params.yaml: unknown keys, wrong types and bad values fail with the key."""

from __future__ import annotations

import pytest

from lrm.config import GenerateConfig, IngestConfig, LoaderConfig, from_dict
from lrm.errors import ConfigError


def test_defaults_and_coercion():
    cfg = from_dict(GenerateConfig, {"users": 10, "base_ctr": 0.05, "mean_session_length": 3},
                    "generate")
    assert cfg.users == 10 and cfg.base_ctr == 0.05
    assert isinstance(cfg.mean_session_length, float)
    assert from_dict(IngestConfig, {"files": ["a", "b"]}, "ingest").files == ["a", "b"]


@pytest.mark.parametrize(
    "data, needle",
    [
        ({"userz": 1}, "unknown keys ['userz']"),
        ({"users": "many"}, "generate.users: expected int"),
        ({"users": 0}, "generate.users: must be >= 1"),
        ({"base_ctr": 0.9}, "generate.base_ctr"),
        ({"users": True}, "generate.users"),
    ],
)
def test_errors_name_the_key(data, needle):
    with pytest.raises(ConfigError, match=None) as e:
        from_dict(GenerateConfig, data, "generate")
    assert needle in str(e.value)


def test_loader_validation():
    with pytest.raises(ConfigError, match="loader.batch_size"):
        from_dict(LoaderConfig, {"batch_size": 0}, "loader")

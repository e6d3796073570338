"""lrm.data.schema.FeatureSchema: the vertical column (ExFM's vertical models train on one)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from lrm.data.schema import FeatureSchema, synthetic_schema


def test_the_vertical_is_a_user_side_column_and_round_trips() -> None:
    schema = synthetic_schema()
    assert schema.vertical == "vertical" and "vertical" in schema.user_sparse
    assert FeatureSchema.from_json(schema.to_json()) == schema
    old = json.loads(schema.to_json())
    del old["vertical"]  # a file written before the field: the data is one vertical
    assert FeatureSchema.from_json(json.dumps(old)).vertical is None
    with pytest.raises(ValueError, match="vertical 'ad_format' is not a user_sparse feature"):
        dataclasses.replace(schema, vertical="ad_format")
    with pytest.raises(ValueError, match="vertical 'surface' is not a user_sparse feature"):
        dataclasses.replace(schema, vertical="surface")

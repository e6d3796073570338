"""The fault suite's data: the session's tiny synthetic datasets (tests/train/conftest.py)."""

from tests.train.conftest import datasets  # noqa: F401  (a fixture)

"""The default intra-op thread count never oversubscribes the cores (lrm.dist)."""

import os

import pytest
import torch

from lrm.dist import intra_op_threads


def test_requested_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert intra_op_threads(5, loader_workers=1) == 5


def test_omp_num_threads_is_respected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert intra_op_threads(0, loader_workers=1) == torch.get_num_threads()


@pytest.mark.parametrize(("cores", "local", "workers", "want"),
                         [(2, 1, 1, 1), (2, 1, 0, 2), (16, 1, 1, 15), (16, 4, 1, 3),
                          (2, 2, 1, 1), (1, 1, 1, 1)])
def test_free_cores(monkeypatch: pytest.MonkeyPatch, cores: int, local: int, workers: int,
                    want: int) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert intra_op_threads(0, loader_workers=workers) == want

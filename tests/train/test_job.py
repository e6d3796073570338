"""The training job: what a run needs, checked when it is made."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch import nn

from lrm.config import TrainConfig
from lrm.errors import ConfigError
from lrm.train.job import TrainJob, build_job
from tests.conftest import SMALL_MODEL


def _keep(model: nn.Module) -> tuple[nn.Module, list[str]]:
    return model, []


def test_a_job_whose_train_fp8_names_a_report_needs_its_transform(tmp_path):
    """lrm.train knows no FP8: a caller that forgets the transform of train.fp8 is told at
    once, not trained without FP8. Plant: drop the check in TrainJob.__post_init__."""
    fp8 = TrainConfig(fp8=str(tmp_path / "r.json"))
    with pytest.raises(ConfigError, match="train.fp8.*no transform"):
        build_job("student", train=fp8, model=SMALL_MODEL, data=tmp_path)
    with pytest.raises(ConfigError, match="train.fp8"):
        TrainJob(kind="student", train=fp8, model=SMALL_MODEL, data=tmp_path)
    job = build_job("student", train=fp8, model=SMALL_MODEL, data=tmp_path, transform=_keep)
    assert job.transform is _keep and job.data == Path(tmp_path)
    assert build_job("student", train=TrainConfig(), model=SMALL_MODEL,
                     data=tmp_path).transform is None  # no report: no transform needed

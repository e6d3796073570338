"""Real data: the student and the teacher trained on the Criteo sample beat the base rate.

The sample's 8000 rows are ingested as 10 days of 800; the last day (10%) is held out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

pytestmark = pytest.mark.slow

# The Criteo recipe: 7200 training rows overfit large hashed tables within one epoch, so
# small tables, small batches and a gentler table learning rate (see README).
CRITEO = {"model": {"tables": {"hash_size": 2000}},
          "train": {"batch_size": 128, "epochs": 1, "embedding_lr": 0.02, "log_every": 20},
          "checkpoint": {"every": 0},
          "ingest": {"rows_per_day": 800}}


def _lrm(*args: str, cwd: Path) -> None:
    lrm = Path(sys.executable).parent / "lrm"
    r = subprocess.run([str(lrm), *args], cwd=cwd, capture_output=True, text=True,
                       timeout=600, env=os.environ)
    assert r.returncode == 0, r.stderr[-3000:]


def test_student_and_teacher_beat_base_rate_on_criteo(criteo_dir, tmp_path):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for sec, vals in CRITEO.items():
        for k, v in vals.items():
            params[sec][k] = {**params[sec][k], **v} if isinstance(v, dict) else v
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    files = [str(criteo_dir / f) for f in ("train.tsv", "dev.tsv", "test.tsv")]
    _lrm("ingest", "criteo", *files, "--out", "raw", "--metrics", "m/ingest.json", cwd=tmp_path)
    for kind in ("student", "teacher"):
        _lrm("train", "--model", kind, "--data", "raw", "--out", kind, "--checkpoints",
             f"ck/{kind}", "--metrics", f"m/train_{kind}.json", cwd=tmp_path)
    _lrm("evaluate", "--model", "student=student", "--model", "teacher=teacher", "--data", "raw",
         "--out", "m/eval.json", cwd=tmp_path)
    ev = json.loads((tmp_path / "m/eval.json").read_text())
    for kind in ("student", "teacher"):
        assert ev[kind]["day"] == 9 and ev[kind]["rows"] == 800
        assert ev[kind]["ne"] < 0.97, ev  # clearly better than predicting the base rate
        assert ev[kind]["auc"] > 0.65, ev

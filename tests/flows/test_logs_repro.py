"""End to end: `make repro-logs` (`dvc repro pipelines/logs/dvc.yaml`) in a fresh clone with
nothing beside it, on the generator's world written as a real export writes a log
(lrm.data.synthetic.export.FIELD): four surfaces of very unequal share (one under 1% of the
traffic), user attributes as text codes with unknown written -124, a numeric item attribute
(video_duration), a first day that starts 55 minutes before midnight and a last day that
ends at noon; read through the mapping a user would write for it (`vertical: surface`).

What a user checks: every stage ran; the ingest took every row, the codes as categories
(-124 a value of its own), the duration as a scaled dense feature that the sessions files
store once per item; the partial first day is a day of its own (day 0), said in one line,
not an error. (The export itself: tests/data/test_synthetic_export.py.)

Planted bugs that turn it red (each tried): the raw ids' sign rule of before (-124 refused);
the numeric item attributes left out of the dense features.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lrm.config import GenerateConfig, VerticalConfig
from lrm.data.synthetic import export
from tests.flows.clone import fresh_clone, tiny_params

pytestmark = pytest.mark.slow

SURFACES = [VerticalConfig(name="feed", share=0.80, own=0.4),
            VerticalConfig(name="search", share=0.12, base_ctr=0.05, position=2.0, own=0.4),
            VerticalConfig(name="video", share=0.072, base_ctr=0.015, position=0.5, own=0.4),
            VerticalConfig(name="live", share=0.008, own=0.4)]  # under 1% of the traffic
WORLD = GenerateConfig(users=3000, ads=400, advertisers=40, categories=8, days=5,
                       sessions_per_day=400, mean_session_length=4.0, max_history=20,
                       verticals=SURFACES)
# over the default pipeline's test settings (TINY: its smallest models): the schedule this
# log's five days give (one FM version on days 0-1), and a sessions file a day, as a user's
# would be (TINY's 100-row files are too small for an item table to pay)
PARAMS = {"exfm": {"teacher_days": 2, "teacher_every": 0, "teacher_lag": 1},
          "dedup": {"rows_per_file": 200_000}}
# the student stage's failure on a partial day (the ExFM side of issue 44, item 3): marked
# until that side lands, never otherwise
TOO_SMALL = "hold fewer than one batch"


@pytest.fixture(scope="module")
def logs_repro(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("logs")
    repo = fresh_clone(tmp)
    tiny_params(repo)
    params = yaml.safe_load((repo / "params.yaml").read_text())
    for sec, vals in PARAMS.items():
        params[sec].update(vals)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    mapping = yaml.safe_load((repo / "pipelines/logs/params.yaml").read_text())
    cfg = export.mapping(export.FIELD)
    mapping["ingest"]["logs"] = {"files": ["data/logs/in"], "label": cfg.label,
                                 "user": cfg.user, "item": cfg.item, "time": cfg.time,
                                 "session": cfg.session, "categorical": cfg.categorical,
                                 "dense": cfg.dense, "item_attributes": cfg.item_attributes,
                                 "item_dense": cfg.item_dense, "vertical": cfg.vertical}
    (repo / "pipelines/logs/params.yaml").write_text(yaml.safe_dump(mapping, sort_keys=False))
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam",
                    "the synthetic export's mapping"], cwd=repo, check=True)
    log = export.log_frame(WORLD, export.FIELD)
    (repo / "data/logs/in").mkdir(parents=True)
    log.write_csv(repo / "data/logs/in/export.csv")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db"}
    # what `make repro-logs` runs (the Makefile's target needs the clone's own venv)
    r = subprocess.run([sys.executable, "-m", "dvc", "repro", "pipelines/logs/dvc.yaml"],
                       cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    return {"repo": repo, "log": log, "run": r}


def test_make_repro_logs_on_a_real_export(logs_repro):
    repo, r = logs_repro["repo"], logs_repro["run"]
    said = r.stdout + r.stderr
    ingest = json.loads((repo / "metrics/logs/ingest.json").read_text())
    assert ingest["rows"] == logs_repro["log"].height and ingest["days"] == 5
    rows = ingest["day_rows"]
    assert rows["0"] < 0.1 * rows["2"] and rows["4"] < 0.75 * rows["2"]  # partial days
    assert "the first day (0) holds" in said  # said in one line, not an error
    assert ingest["vocab"]["user_gender"] == 3  # -124, 1, 2: the unknown is a category
    assert ingest["dense_scaling"][export.DURATION]["transform"] == "log1p"
    dedup = json.loads((repo / "metrics/logs/dedup.json").read_text())
    assert export.DURATION in dedup["item_columns"]  # once per item in the sessions files
    if r.returncode != 0 and TOO_SMALL in said and "dvc.yaml:student'" in said:
        pytest.xfail("issue 44 item 3 (the ExFM side): the student stage fails on the partial "
                     "first day instead of skipping it in one line")
    assert r.returncode == 0, said[-6000:]
    ev = json.loads((repo / "metrics/logs/eval.json").read_text())
    for kind in ("student", "teacher"):
        assert ev[kind]["rows"] > 0 and math.isfinite(ev[kind]["ne"]) and ev[kind]["day"] == 4

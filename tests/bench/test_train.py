"""bench/train.py --smoke: every training case runs and prints its lines."""

from __future__ import annotations

import pytest

from tests.bench._smoke import benches, cases, smoke
from tests.conftest import CRITEO_DIR, MIND_DIR


def test_every_train_case_prints_its_lines() -> None:
    lines = smoke("train")
    assert benches(lines) == {"train.vs_torchrec", "train.profile", "train.dedup",
                              "train.vs_plain_pytorch", "train.scaling", "train.collections",
                              "train.end_to_end", "train.real"}
    profile = [x for x in lines if x["bench"] == "train.profile"]
    total = next(x for x in profile if x["case"] == "total")
    # every category's time, both sides, adds up to the total profiled
    for side in ("candidate", "baseline"):
        assert sum(x[side] for x in profile if x is not total) == \
            pytest.approx(total[side], rel=0.01, abs=0.05)
    assert any(x["top_candidate"] for x in profile if "embedding" in x["case"])
    vs = [x for x in lines if x["bench"] == "train.vs_torchrec"]
    assert {"ne_candidate", "ne_baseline"} <= set(vs[0])  # NE beside the speed
    real = cases(lines, "train.real")
    assert "synthetic_log_student_vs_dlrm" in real
    assert ("criteo_sample_student_vs_dlrm" in real) == (CRITEO_DIR / "train.tsv").exists()
    assert ("mind_sample_student_vs_dlrm" in real) == (MIND_DIR / "behaviors.tsv").exists()


def test_train_real_runs_a_mapped_log_alone(tmp_path) -> None:
    """`--only real --log FILE --map MAP`: that log alone, named after its mapping file, the
    last day held out. Planted bug that turns this red (tried): --log dropped (the built-in
    logs run instead)."""
    import dataclasses

    import yaml

    from lrm.config import GenerateConfig
    from lrm.data.synthetic import export

    log = tmp_path / "clicks.csv"
    export.write_log(GenerateConfig(users=2000, ads=400, sessions_per_day=300, days=3), log)
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(dataclasses.asdict(export.mapping())))
    lines = smoke("train", "--only", "real", "--log", str(log), "--map",
                  str(tmp_path / "mine.yaml"))
    real = [x for x in lines if x["bench"] == "train.real"]
    assert real and {x["case"].split("_")[0] for x in real} == {"mine"}, cases(lines, "train.real")
    assert all(x["held_out_day"] == 2 and x["train_days"] == [0, 1] for x in real)

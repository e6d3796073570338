"""bench/exfm.py --smoke: the FM's lead, each vertical model's gain and the pick's regret,
augment's speed; and the same on a click log as a real export writes it (--log --map)."""

from __future__ import annotations

import dataclasses

import yaml

from lrm.config import GenerateConfig, VerticalConfig
from lrm.data.synthetic import export
from tests.bench._smoke import benches, cases, smoke

GAINS = {"exfm.teacher_gain", "exfm.table", "exfm.student_gain", "exfm.pick_regret",
         "exfm.served_vs_labels"}


def test_every_exfm_case_prints_its_lines() -> None:
    lines = smoke("exfm")
    assert benches(lines) == GAINS | {"exfm.augment"}
    assert set(cases(lines, "exfm.teacher_gain")) == {"north", "south"}  # QUICK's verticals


def test_a_field_export_through_its_mapping(tmp_path) -> None:
    """--log FILE --map MAP: the export's surfaces by name, the one under students.min_share
    served by the FM. Red when the mapping file is not read as `lrm ingest logs --map`
    reads it (the benchmark stopped on an import moved from under it)."""
    world = GenerateConfig(users=800, ads=150, advertisers=15, categories=6, days=6,
                           sessions_per_day=1000, mean_session_length=4.0, max_history=10,
                           verticals=[VerticalConfig(name="feed", share=0.6),
                                      VerticalConfig(name="search", share=0.395,
                                                     base_ctr=0.05),
                                      # under 1%, clicked often enough to score
                                      VerticalConfig(name="live", share=0.008,
                                                     base_ctr=0.2)])
    export.write_log(world, tmp_path / "export.csv", export.FIELD)
    mapping = dataclasses.asdict(export.mapping(export.FIELD))
    keys = ("label", "user", "item", "time", "session", "categorical", "dense",
            "item_attributes", "item_dense", "vertical")
    (tmp_path / "map.yaml").write_text(yaml.safe_dump({k: mapping[k] for k in keys}))
    lines = smoke("exfm", "--only", "gains", "--log", str(tmp_path / "export.csv"),
                  "--map", str(tmp_path / "map.yaml"))
    assert GAINS <= benches(lines)
    assert set(cases(lines, "exfm.teacher_gain")) == {"feed", "search"}  # live: no VM
    live = [x for x in lines if x["bench"] == "exfm.table" and x["case"].startswith("live/")]
    assert live and all(set(x["served"]) == {"fm"} and x["not_trained"] for x in live)


def test_the_stream_day_case_prints_each_setting_against_the_surfaces(tmp_path, monkeypatch):
    """--only stream at smoke sizes: 1 and 3 surfaces streamed two days with the default and
    the production settings. Each line's sides say the day's seconds, the VMs and what they
    trained, and the load; production's day 2 trains the served variant and labels only
    (students.ablation_every 7), the default every variant: red when a setting does not
    reach the stream it runs (the params file not laid over params.yaml)."""
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))  # its own server's store
    lines = smoke("exfm", "--only", "stream")
    assert benches(lines) == {"exfm.stream_day"}
    assert set(cases(lines, "exfm.stream_day")) == {
        "default/1_vs_3_surfaces", "production/1_vs_3_surfaces",
        "1_surfaces/production_vs_default", "3_surfaces/production_vs_default"}
    three = next(x for x in lines if x["case"] == "3_surfaces/production_vs_default")
    prod, default = three["candidate_detail"], three["baseline_detail"]
    for side in (prod, default):
        assert side["vms"] == 3 and side["seconds"] > 0 and len(side["load_avg_at_end"]) == 3
        assert side["cpu_seconds"] > 0
        assert side["seconds"] == (three["candidate"] if side is prod else three["baseline"])
    assert three["cpu_ratio"] == round(default["cpu_seconds"] / prod["cpu_seconds"], 4)
    assert default["vm_variant_days"] == 3 * 4  # every variant of every VM, every day
    assert prod["vm_variant_days"] < default["vm_variant_days"]  # served + labels only
    assert three["settings"]["production"]["streaming"]["workers"] == three["cores"]

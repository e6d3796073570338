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
    reads it (the benchmark stopped on an import moved from under it), and when the
    export's half last day judges the pick (bench: full_days)."""
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
    # the export ends mid-day: its last day judges no pick (the last full day does)
    regret = [x for x in lines if x["bench"] == "exfm.pick_regret"]
    assert regret and all(x["held_out_days"] == [[x["eval_day"] - 1]] for x in regret), \
        [(x["held_out_days"], x["eval_day"]) for x in regret]
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


def _day(rows: int, seed: int, better: dict[str, float]):
    """A day's scores: every candidate the same logits but `better`'s, moved toward the
    labels by that much (the truth: lower NE)."""
    import torch

    from lrm.exfm.pick import Scores

    g = torch.Generator().manual_seed(seed)
    y = (torch.rand(rows, generator=g) < 0.1).double()
    x = torch.randn(rows, generator=g, dtype=torch.float64) - 2.2
    names = ["labels_only", "distill_serving", "aux_head", "fm"]
    return Scores(y, {c: x + better.get(c, 0.0) * (2 * y - 1) for c in names})


def test_the_pick_is_judged_on_full_held_out_days_from_the_days_before_each() -> None:
    """held_out: each full day H with registry.pick.days scored days before it is judged on
    what the pick served from those days alone; the export's partial last day is no judge.
    aux_head is far better only on day 10: the pick never serves it (it has no evidence
    before day 11, the partial day, which is not judged). Red with the day H itself pooled
    (d <= H), or with the partial day judged."""
    from bench.cases.exfm_cases import held_out

    scores = {d: _day(4000, d, {"aux_head": 1.0} if d == 10 else {"distill_serving": 0.05})
              for d in range(4, 11)}
    scores[11] = _day(300, 11, {"aux_head": 1.0})  # cut mid-day, and aux_head ahead there
    judged = held_out(scores, "distill_serving", 3)
    assert sorted(judged) == [7, 8, 9, 10]
    assert [judged[h]["days"] for h in judged] == [[4, 5, 6], [5, 6, 7], [6, 7, 8], [7, 8, 9]]
    assert {j["served"] for j in judged.values()} == {"distill_serving"}
    ten = judged[10]["ne"]  # the NEs of the day judged: aux_head's lead is there
    assert ten["aux_head"] < 0.9 * ten["distill_serving"]
    # a short world (no day with the pick's days before it): its last day, on what there is
    short = held_out({4: scores[4], 5: scores[5]}, "distill_serving", 3)
    assert list(short) == [5] and short[5]["days"] == [4]

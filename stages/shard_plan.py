"""Stage `shard_plan`: table statistics -> cost model -> a sharding plan per model.

    lrm shard-plan [--world-size N --compute-device cuda ...] --out plans/sharding.json
    python -m stages.shard_plan --data data/sessions --out plans/sharding.json

Reads the dataset the way training does (lrm.sharding.stats: rows, pooling factor, skew,
unique ids and sessions per batch) and writes the statistics beside it
(`data/sessions.stats.json`: a file of this stage's own, next to dedup's folder, not in
it, so no two stages write one folder; it sits with the data it describes and is
recomputed with the plan, in seconds, whenever the data or the tables change). Then plans
every model the pipeline trains for the `sharding.topology` in params (lrm.sharding:
the cost model calibrated in `--calibration`/DEVICE.json, by default the calibrations lrm
ships, found through the package from any working folder; planner `sharding.planner`;
DMT towers with `sharding.towers`) and writes them to one file: `teacher` and `student`
(stage train, teacher) and `students.NAME` (stage student). Prints one table per plan.
A topology that cannot hold a model's tables stops with exit 2, saying how much memory
is missing on which rank.
"""

from __future__ import annotations

import logging
from pathlib import Path

from lrm.config import ShardingConfig, StudentModelConfig, TableConfig
from stagekit import Arg, Metrics, Stage, main

NAME = "shard_plan"
log = logging.getLogger("lrm")


def run(*, cfg: ShardingConfig, tables: TableConfig, teacher_dim: int, student_dim: int,
        students: dict[str, StudentModelConfig], batch_size: int, recd: bool,
        data: Path = Path("data/sessions"),
        calibration: Path | None = None,
        out: Path = Path("plans/sharding.json"), stats: Path | None = None,
        metrics: Path | None = Path("metrics/shard_plan.json"), force: bool = False
        ) -> Metrics:
    """Plan where every embedding table goes on the ranks of `sharding.topology`."""
    from rich.console import Console

    from lrm import io
    from lrm.config import ModelConfig, StudentModelConfig, TeacherModelConfig
    from lrm.data.schema import read_schema
    from lrm.dist import quiet_libraries
    from lrm.models import build_model
    from lrm.sharding import planner
    from lrm.sharding import stats as S
    from lrm.sharding.cost import CALIBRATIONS, Calibration, CostModel
    from lrm.sharding.plan import summary_table, write_file
    from lrm.sharding.topology import Topology

    quiet_libraries()  # torchrec logs every table; torch.fx warns on its import
    schema, _ = read_schema(data)
    shapes = {"teacher": ("teacher", ModelConfig(
        tables=tables, teacher=TeacherModelConfig(embedding_dim=teacher_dim))),
        "student": ("student", ModelConfig(
            tables=tables, student=StudentModelConfig(embedding_dim=student_dim)))}
    for name, size in students.items():
        shapes[f"students.{name}"] = ("student", ModelConfig(
            tables=tables, student=StudentModelConfig(embedding_dim=size.embedding_dim)))
    models = {k: build_model(kind, schema, mc, device="meta", dense_device="meta")
              for k, (kind, mc) in shapes.items()}
    topo = Topology.from_config(cfg.topology)
    cal = Calibration.load(CALIBRATIONS if calibration is None else calibration, topo)
    if elsewhere := cal.elsewhere():
        log.warning("shard-plan: %s", elsewhere)
    cost = CostModel(topo, cal)

    st = S.compute(data, S.table_specs(models["student"]), batch_size=batch_size, recd=recd,
                   batches=cfg.stats_batches)
    if stats is not None:
        io.write_json(st.to_json(), stats, stage=NAME, force=force)

    plans, report = {}, {}
    console = Console(width=160)
    for key, module in models.items():
        loads = S.loads(module, st)
        p = planner.plan_model(loads, topo, cost, method=cfg.planner, towers=cfg.towers,
                               time_limit=cfg.time_limit, cooccurrence=st.cooccurrence,
                               module=module, label=key)
        p.check(topo.memory_bytes)
        greedy = planner.plan(loads, topo, cost, method="greedy", label=key)
        plans[key] = p
        report[key] = {"max_ms": p.max_cost * 1e3, "imbalance": p.imbalance,
                       "lower_bound_ms": p.lower_bound * 1e3, "plan_seconds": p.seconds,
                       "greedy_max_ms": greedy.max_cost * 1e3,
                       "greedy_imbalance": greedy.imbalance,
                       "sharding_types": p.to_json()["sharding_types"]}
        console.print(summary_table(p, key))
    write_file(plans, out, calibration={"source": cal.source, "fit": cal.fit,
                                        **({"note": elsewhere} if elsewhere else {})},
               stats=str(stats or ""), stage=NAME, force=force)
    return Metrics({"world_size": topo.world_size, "hosts": topo.hosts, "device": topo.device,
                    "planner": cfg.planner, "towers": cfg.towers, "calibration": cal.source,
                    **({"calibration_note": elsewhere} if elsewhere else {}),
                    "stats": {"batches": st.batches, "impressions": st.impressions,
                              "batch_size": st.batch_size, "recd": st.recd},
                    "models": report})


STAGE = Stage(
    name=NAME, run=run, cli_name="shard-plan", short=("sharding", "sharding.topology"),
    reads={"cfg": "sharding", "tables": "model.tables",
           "teacher_dim": "model.teacher.embedding_dim",
           "student_dim": "model.student.embedding_dim", "students": "students.models",
           "batch_size": "train.batch_size", "recd": "loader.recd"},
    args={"data": Arg("--data", "dataset folder (the table statistics)", "in"),
          "calibration": Arg("--calibration", "folder of cost-model calibrations (DEVICE.json) "
                             "[default: those lrm ships, lrm/sharding/calibration]", "in"),
          "out": Arg("--out", "the plans (JSON)", "out", file=True),
          "stats": Arg("--stats", "table statistics (JSON) [default: DATA.stats.json]", "out",
                       file=True),
          "metrics": Arg("--metrics", "stage metrics file", "metrics")},
    derived={"stats": "{data}.stats.json"},
)

if __name__ == "__main__":
    main(STAGE)

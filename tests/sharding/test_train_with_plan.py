"""A 2-process training run (gloo, mp.spawn) with a plan from lrm's planner: every rank
holds exactly the shards the plan gives it, in the sharded module training used; its
checkpoint restores under another plan (torchrec's)."""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from lrm.config import ModelConfig, StudentModelConfig
from lrm.data.schema import read_schema
from lrm.models import build_model
from lrm.sharding import planner
from lrm.sharding import stats as S
from lrm.sharding.plan import write_file
from lrm.sharding.topology import COLUMN_WISE, GIB
from tests.sharding.conftest import cost_model, topology

pytestmark = pytest.mark.slow

MODEL = ModelConfig(student=StudentModelConfig(embedding_dim=8, bottom_mlp=[16],
                                               top_mlp=[16, 8]))


def _worker(rank: int, port: int, data: str, plan: str | None, out: str, run: str) -> None:
    import torch
    import torch.distributed as dist

    from lrm.config import LoaderConfig, TrainConfig
    from lrm.sharding import parallel
    from lrm.sharding.plan import training_plan
    from lrm.train import TrainJob, train

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
                      LOCAL_WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    held: dict[str, list] = {}
    shard = parallel.shard

    def spy(model, env, **kw):  # the sharded module the training loop builds
        dmp = shard(model, env, **kw)
        for key, t in dmp.state_dict().items():
            m = re.search(r"embedding_bags\.(\w+)\.weight$", key)
            local = sorted([r0, c0, *s.shape] for s, r0, c0 in parallel._local_shards(t)
                           if s.numel())
            if m and local:
                held[m.group(1)] = local
        return dmp

    parallel.shard = spy
    try:
        torch.set_num_threads(1)
        from lrm.config import CheckpointConfig

        sp = None if plan is None else training_plan(
            Path(plan), "student", kind="student", model_cfg=MODEL, data=Path(data),
            device="cpu")
        cfg = TrainConfig(batch_size=256, steps=3, log_every=1, threads=1, device="cpu")
        r = train(TrainJob(kind="student", train=cfg, model=MODEL, data=Path(data), plan=sp,
                           loader=LoaderConfig(prefetch=0, num_workers=0),
                           checkpoint=CheckpointConfig(every=0), checkpoints=Path(out, "ck"),
                           out=Path(out, run), start="resume" if run == "resume" else "fresh"))
        Path(out, f"{run}-rank{rank}.json").write_text(json.dumps(
            {"held": held, "steps": r.steps, "resumed_from": r.resumed_from}))
    finally:
        dist.destroy_process_group()


def test_two_processes_train_with_the_plan_and_hold_its_shards(tiny_data, tmp_path):
    schema, _ = read_schema(tiny_data)
    model = build_model("student", schema, MODEL, device="meta", dense_device="meta")
    st = S.compute(tiny_data, S.table_specs(model), batch_size=256, recd=True, batches=8)
    loads = S.loads(model, st)
    total = sum(t.rows * (t.dim * 4 + 4) for t in loads)
    user_id = next(t for t in loads if t.name == "t_user_id")
    whole = user_id.rows * (user_id.dim * 4 + 4)
    # each rank holds 60% of the tables: t_user_id (over half of them) must be split
    assert whole > 0.6 * total
    topo = topology(2, gib=0.6 * total / GIB)
    plan = planner.plan(loads, topo, cost_model(topo), time_limit=2)
    assert plan.placements["t_user_id"].kind == COLUMN_WISE
    path = tmp_path / "plan.json"
    write_file({"student": plan}, path, calibration={}, stats="", stage="test")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(port, str(tiny_data), str(path), str(tmp_path), "plan"),
             nprocs=2)
    for rank in (0, 1):
        got = json.loads((tmp_path / f"plan-rank{rank}.json").read_text())
        assert got["steps"] == 3
        want = {name: sorted([s.row0, s.col0, s.rows, s.cols] for s in p.shards
                             if s.rank == rank) for name, p in plan.placements.items()}
        want = {k: v for k, v in want.items() if v}
        assert got["held"] == want, (rank, got["held"], want)

    # its last checkpoint restores under torchrec's plan (another placement) exactly
    mp.spawn(_worker, args=(port, str(tiny_data), None, str(tmp_path), "resume"), nprocs=2)
    got = [json.loads((tmp_path / f"resume-rank{r}.json").read_text()) for r in (0, 1)]
    assert got[0]["resumed_from"] == 3 and got[0]["steps"] == 3
    before = json.loads((tmp_path / "plan-rank0.json").read_text())["held"]
    assert got[0]["held"] != before  # the shards moved
    a, b = (torch.load(tmp_path / run / "state_dict.pt", weights_only=True)
            for run in ("plan", "resume"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

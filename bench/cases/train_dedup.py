"""train.dedup: student training samples/s on RecD batches vs plain batches (session data).

Same impressions, same model and optimizers (the project's step: DMP, fused row-wise
Adagrad, AdamW); the RecD batch carries user-side features once per session and the model
pools them (and their pairwise dots) once per session, the plain batch once per impression.
RecD (Zhao et al.) reports up to 2.49x training throughput. The end_to_end case (full run
only) is lrm.train.train itself, loader included.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

from bench.cases.train_common import BATCH, MODEL, batches, dataset, project_step, \
    student_hash_sizes, time_steps
from bench.common import emit
from lrm.config import LoaderConfig, TrainConfig
from lrm.train import train


def run(quick: bool = False, data: dict[str, Any] | None = None) -> None:
    steps, repeat = (12, 3) if quick else (40, 5)
    with (dataset(quick) if data is None else nullcontext(data)) as d:
        sizes = student_hash_sizes(d["sessions"])
        recd = batches(d["sessions"], True, steps, sizes)
        plain = batches(d["sessions"], False, steps, sizes)
        sessions_per_batch = sum(b.num_sessions for b in recd) / len(recd)
        with project_step(d["sessions"]) as step:
            t = time_steps({"plain": (step, plain), "recd": (step, recd)}, 3, repeat)
        t_plain, t_recd = t["plain"], t["recd"]
        n = steps * BATCH
        info = {"batch_size": BATCH, "steps": steps, "user_rows_per_batch": sessions_per_batch,
                "mean_session_length": d["mean_session_length"],
                "embedding_dim": MODEL.student.embedding_dim}
        emit("train.dedup", "student_step", "samples/s", n / t_recd, n / t_plain, "higher",
             candidate_is="RecD batches (user features once per session)",
             baseline_is="plain batches (user features once per impression)", **info)
        if quick:
            return
        rates = {}
        for dedup in (True, False):
            cfg = TrainConfig(batch_size=BATCH, steps=2 * steps, log_every=steps)
            r = train("student", cfg, MODEL, d["sessions"], loader_cfg=LoaderConfig(recd=dedup))
            rates[dedup] = r.samples_per_s
        emit("train.dedup", "student_end_to_end", "samples/s", rates[True], rates[False],
             "higher", candidate_is="lrm.train.train, loader.dedup=true",
             baseline_is="lrm.train.train, loader.dedup=false", **{**info, "steps": 2 * steps})

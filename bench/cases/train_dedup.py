"""train.dedup: student training samples/s on RecD batches vs plain batches (session data).

Same impressions, same model and optimizers (the project's step: DMP, fused row-wise
Adagrad, AdamW); the RecD batch carries user-side features once per session, and where
histories are long (lrm.data.loader.WINDOWS_MIN_HISTORY) a user's history once per batch
(the sessions layout stores it once per run of her sessions; the loader's windows form
looks it up as shared segments); the model pools them (and their pairwise dots) once per
session. The plain batch carries everything once per impression. RecD (Zhao et al.)
reports up to 2.49x training throughput.

Cases: `student_step` on the default data (histories of ~80 ads), `student_step_history_
heavy` on bench.cases.data_profiles.history_heavy (histories of ~840 ads, RecD's setting;
its own day), and `..._vs_session_rows`: the same
RecD batches against RecD with one history per session (`windows=False`), what sharing a
user's history adds. The end_to_end case (full run only) is lrm.train.train itself,
loader included.
"""

from __future__ import annotations

import tempfile
from contextlib import nullcontext
from itertools import islice
from pathlib import Path
from typing import Any

import torch

from bench.cases.data_profiles import history_heavy
from bench.cases.train_common import MODEL, batch_size, batches, dataset, project_step, \
    sessions_for, steps as steps_of, student_hash_sizes, time_steps
from bench.common import emit
from lrm.config import DedupConfig, LoaderConfig, TrainConfig
from lrm.data import dedup, synthetic
from lrm.data.batch import Batch
from lrm.data.loader import BatchLoader
from lrm.train import TrainJob, train


def _info(forms: dict[str, list[Batch]], steps: int) -> dict[str, Any]:
    recd = forms["recd"]
    return {"batch_size": batch_size(), "steps": steps,
            "sessions_per_batch": sum(b.num_sessions for b in recd) / len(recd),
            "shared_histories": recd[0].windows is not None,
            "history_values_per_batch": {
                k: sum(b.user["user_history"].values().numel() for b in bs) / len(bs)
                for k, bs in forms.items()},
            "embedding_dim": MODEL.student.embedding_dim, "threads": torch.get_num_threads()}


def _heavy(quick: bool, steps: int) -> None:
    cfg = history_heavy(quick, sessions=sessions_for(steps * batch_size()))
    with tempfile.TemporaryDirectory(prefix="lrm-bench-heavy-") as tmp:
        root = Path(tmp)
        synthetic.generate(cfg, root / "raw")
        m = dedup.dedup_dataset(root / "raw", root / "sessions", DedupConfig())
        sizes = student_hash_sizes(root / "sessions")
        own = list(islice(iter(BatchLoader(root / "sessions", batch_size(), days=[0],
                                           hash_sizes=sizes, drop_last=True, windows=False)),
                          steps))
        forms = {"recd": batches(root / "sessions", True, steps, sizes),
                 "session_rows": own,
                 "plain": batches(root / "sessions", False, steps, sizes)}
        with project_step(root / "sessions") as step:
            t = time_steps({k: (step, v) for k, v in forms.items()}, 2,
                           steps_of(quick, 5, 3, 1))
    n = steps * batch_size()
    info = {**_info(forms, steps), "mean_history_length": round(
        m["history_values"] / m["sessions"], 1), "max_history": cfg.max_history,
        "sessions_per_day": cfg.sessions_per_day}
    emit("train.dedup", "student_step_history_heavy", "samples/s", n / t["recd"],
         n / t["plain"], "higher", candidate_is="RecD batches (user features once per "
         "session, a user's history once per batch)",
         baseline_is="plain batches (user features once per impression)", **info)
    emit("train.dedup", "student_step_history_heavy_vs_session_rows", "samples/s",
         n / t["recd"], n / t["session_rows"], "higher",
         candidate_is="RecD batches, a user's history once per batch",
         baseline_is="RecD batches, the history once per session (windows=False)", **info)


def run(quick: bool = False, data: dict[str, Any] | None = None) -> None:
    steps, repeat = steps_of(quick, 40, 12, 3), steps_of(quick, 5, 3, 1)
    with (dataset(quick) if data is None else nullcontext(data)) as d:
        sizes = student_hash_sizes(d["sessions"])
        recd = batches(d["sessions"], True, steps, sizes)
        plain = batches(d["sessions"], False, steps, sizes)
        with project_step(d["sessions"]) as step:
            t = time_steps({"plain": (step, plain), "recd": (step, recd)}, 3, repeat)
        t_plain, t_recd = t["plain"], t["recd"]
        n = steps * batch_size()
        info = {**_info({"recd": recd, "plain": plain}, steps),
                "mean_session_length": d["mean_session_length"]}
        emit("train.dedup", "student_step", "samples/s", n / t_recd, n / t_plain, "higher",
             candidate_is="RecD batches, the loader's default form (user features once per "
             "session; histories this short are not shared across sessions)",
             baseline_is="plain batches (user features once per impression)", **info)
        _heavy(quick, steps_of(quick, 24, 8, 2))
        if quick:
            return
        rates = {}
        for dedup_ in (True, False):
            cfg = TrainConfig(batch_size=batch_size(), steps=2 * steps, log_every=steps)
            r = train(TrainJob(kind="student", train=cfg, model=MODEL, data=d["sessions"],
                               loader=LoaderConfig(recd=dedup_)))
            rates[dedup_] = r.samples_per_s
        emit("train.dedup", "student_end_to_end", "samples/s", rates[True], rates[False],
             "higher", candidate_is="lrm.train.train, loader.dedup=true",
             baseline_is="lrm.train.train, loader.dedup=false", **{**info, "steps": 2 * steps})

"""train.end_to_end: lrm.train.train's steady samples/s (loader, loop and step) against the
step alone on the same batches built beforehand.

The ratio is the share of the step's speed the run keeps: 1.0 when the loader (reading,
assembling, pinning each batch in its threads) and the loop's per-step host work cost
nothing beside the step. On a GPU, where whole-step graphs make the step short, this is
where the host shows. Steady: the median of the run's log points over its second half,
past the learning-rate warm-up's uncaptured steps and the capture; `run_samples_per_s` is
the whole run's rate, those included.
"""

from __future__ import annotations

import statistics

import torch

from bench.cases.train_common import MODEL, batch_size, batches, dataset, device, \
    project_step, steps as steps_of, student_hash_sizes, time_steps
from bench.common import emit
from lrm.config import LoaderConfig, TrainConfig
from lrm.dist import loader_workers
from lrm.train import TrainJob, train

DAYS = {True: 3, False: 4}  # days (the last held out), of the default size or --quick's


def run(quick: bool = False) -> None:
    """Its own data: one pass over several days (repeated passes over one day would
    overfit, and the held-out NE it reports would say so)."""
    steps, repeat = steps_of(quick, 40, 12, 3), steps_of(quick, 5, 3, 1)
    log_every = steps_of(quick, 10, 5, 5)
    with dataset(quick, DAYS[quick]) as d:
        sizes = student_hash_sizes(d["sessions"])
        recd = batches(d["sessions"], True, steps, sizes)
        with project_step(d["sessions"]) as step:
            alone = steps * batch_size() / time_steps({"step": (step, recd)}, 3,
                                                      repeat)["step"]
        cfg = TrainConfig(batch_size=batch_size(), steps=0, epochs=1, val_fraction=0.0,
                          log_every=log_every, device=device())
        loader = LoaderConfig()
        r = train(TrainJob(kind="student", train=cfg, model=MODEL, data=d["sessions"],
                           loader=loader))
        rates = [p["samples_per_s"] for p in r.history if "samples_per_s" in p]
        if len(rates) < 2:
            raise ValueError(f"{r.steps} steps gave {len(rates)} log points; more wanted")
        steady = statistics.median(rates[len(rates) // 2:])
        emit("train.end_to_end", "student_steady", "samples/s", steady, alone, "higher",
             candidate_is="lrm.train.train (RecD batches from the loader's threads, the "
             "loop, the step), median of its log points over the run's second half",
             baseline_is="the same step alone on RecD batches built beforehand",
             run_samples_per_s=round(r.samples_per_s), steps=r.steps,
             warmup_steps=r.schedule["warmup"], batch_size=batch_size(),
             loader_workers=loader_workers(loader.num_workers, torch.device(device())),
             loader_prefetch=loader.prefetch,
             train_days=r.train_days, ne=round(r.eval["ne"], 5))

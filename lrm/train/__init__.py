"""Training: a job put together in one place, the loop that runs it, and what it reads and writes.

    job.py         TrainJob (what a run needs) and build_job (the one way one is made: configs,
                   data, how it starts, the sharding plan and FP8 dispatch resolved)
    loop.py        train(job): build, run, finish (read top to bottom)
    days.py        a model carried from day to day (per-day checkpoint chains): ExFM's
                   students and the stream's models
    data.py        the run's data looked at once, train / held-out days, per-rank loaders,
                   the data position (EpochStream), the checkpoint identity
    schedule.py    the schedule fitted to the data: batch, epochs, validation, warm-up
    steps.py       one step: torchrec's train pipeline, the fused dense optimizer, warm-up
    step_graph.py  one step as a whole-step CUDA graph (one process on a GPU)
    graphs.py      CUDA graphs of the dense MLPs alone (several processes)
    guard.py       a non-finite loss skips its update and stops the run cleanly
    early_stop.py  the best validated state kept, and restored at the end
    meter.py       loss, windowed NE, samples/s over every rank
    state.py       the train state a checkpoint carries, and per-step seeding
    evaluate.py    scoring a model on a held-out day

The process group is lrm.dist's, sharding lrm.sharding's, checkpoints lrm.checkpoint's, the
saved model folder and bf16 autocast lrm.models' (saved, precision), the MLflow pyfunc
lrm.serving's. Training knows nothing of its callers: the ExFM students hand a job their
loss, teacher column and grown parts, FP8 its layer transform (lrm.exfm.distill,
lrm.fp8.dispatch).
"""

from lrm.train.evaluate import evaluate
from lrm.train.job import TrainJob, build_job
from lrm.train.loop import NonFiniteLossError, TrainResult, train

__all__ = ["NonFiniteLossError", "TrainJob", "TrainResult", "build_job", "evaluate", "train"]

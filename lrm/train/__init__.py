"""Training: the loop, distributed wrapping (DMP), checkpoints, the saved model, evaluation.

    loop.py        train(): the loop a reader takes in at one glance
    data.py        train / held-out days, per-rank loaders, the data position
    meter.py       loss, windowed NE, samples/s over every rank
    dist.py        the process group (torchrun's, or a 1-rank gloo group of our own)
    parallel.py    DMP with the planner's plan, fused row-wise Adagrad + AdamW, unsharding
    checkpoint.py  DCP checkpoints in step-N/ folders (resume)
    state.py       the train state (data position) and per-step seeding
    export.py      the final model folder (config JSON + plain state dict)
    evaluate.py    scoring a model on a held-out day
    pyfunc.py      the MLflow pyfunc wrapper over the final model folder
"""

from lrm.train.evaluate import evaluate
from lrm.train.export import ModelCard, load_model, save_model
from lrm.train.loop import NonFiniteLossError, TrainResult, train

__all__ = ["ModelCard", "NonFiniteLossError", "TrainResult", "evaluate", "load_model",
           "save_model", "train"]

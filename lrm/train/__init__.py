"""Training: the loop, the data it reads, evaluation and the saved model folder.

    loop.py        train(): build, shard, optimize, evaluate, checkpoint, save (read top to bottom)
    data.py        train / held-out days, per-rank loaders, the data position (EpochStream)
    meter.py       loss, windowed NE, samples/s over every rank
    state.py       the train state a checkpoint carries, and per-step seeding
    evaluate.py    scoring a model on a held-out day
    export.py      the final model folder (config JSON + plain state dict)

The process group is lrm.dist's, sharding lrm.sharding's, checkpoints lrm.checkpoint's,
the MLflow pyfunc lrm.serving's.
"""

from lrm.train.evaluate import evaluate
from lrm.train.export import ModelCard, load_model, save_model
from lrm.train.loop import NonFiniteLossError, TrainResult, train

__all__ = ["ModelCard", "NonFiniteLossError", "TrainResult", "evaluate", "load_model",
           "save_model", "train"]

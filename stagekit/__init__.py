"""What every stage is built with: its declaration, the params, its command line, the runner.

    declare.py   Stage and Arg: a stage's typed `run`, its paths and switches, the params
                 keys it reads (the one declaration DVC, Prefect and the CLI all use); the
                 Result `run` returns (typed fields; its metrics JSON)
    params.py    load_params: params.yaml files laid over each other, dotted overrides
    cli.py       the stage's command line built from the declaration (`lrm NAME`)
    runner.py    execute: check and lock the outputs, log the MLflow run, call `run`,
                 write the metrics

A stage module (`stages/NAME.py`) imports from here; flows/ too (tasks and the `lrm`
command call the same `execute`). stagekit knows nothing of any one stage, and lrm/ knows
nothing of stagekit.
"""

from stagekit.cli import main
from stagekit.declare import OFF, Arg, Metrics, Result, Stage, split_named
from stagekit.params import PARAMS, load_params
from stagekit.runner import execute

__all__ = ["OFF", "PARAMS", "Arg", "Metrics", "Result", "Stage", "execute", "load_params",
           "main", "split_named"]

"""DAG stages: thin entry points (`python -m stages.NAME`) over the lrm library.

Each stage reads its params.yaml section into a typed config, calls lrm, writes its
outputs atomically, writes `metrics/NAME.json` and logs one MLflow run. DVC, Prefect and
the `lrm` CLI all call the same `run` function of each stage module.
"""

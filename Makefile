# Two commands do everything on a fresh machine: `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
CONSTRAINTS := requirements/constraints.txt
STAMP := $(VENV)/.installed
# Pinned builds that must go in before the rest (see README: torchrec --no-deps trap).
TORCH_SPEC ?= torch==2.13.0
FBGEMM_SPEC ?= fbgemm-gpu-cpu==1.8.0
TORCHREC_SPEC ?= torchrec==1.8.0
PIP := $(BIN)/python -m pip install --disable-pip-version-check -q
# Prefect's ephemeral server (make run, the tests) gets 20 s to start by default: on a loaded
# 2-core machine that was not enough ("Timed out while attempting to connect")
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 120
# make test: test files spread over this many pytest-xdist workers (a file stays on one, with
# its module fixtures). 2 = CI's cores: the end-to-end tests wait on servers, schedules and
# subprocesses, so two at a time fill the cores (suite wall time about 17 -> 11 min here)
TEST_WORKERS ?= 2

.PHONY: setup run repro repro-criteo repro-logs dag test bench lock clean ui

setup: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) -c $(CONSTRAINTS) "$(TORCH_SPEC)"
	$(PIP) -c $(CONSTRAINTS) "$(FBGEMM_SPEC)"
	$(PIP) --no-deps "$(TORCHREC_SPEC)"
	$(PIP) -c $(CONSTRAINTS) -e ".[dev]"
	$(BIN)/python -c "import torch, fbgemm_gpu, torchrec, polars, mlflow, prefect"
	touch $(STAMP)

# The whole pipeline on the embedded defaults (synthetic data, local MLflow, ephemeral Prefect).
run: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m flows.pipeline

# The same DAG through DVC (skips stages whose deps and params did not change).
repro: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/dvc repro

# Real logs: your Criteo TSV files in data/criteo/tsv/ (see README).
repro-criteo: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/dvc repro pipelines/criteo/dvc.yaml

# Any click log: your files in data/logs/in/, the mapping in pipelines/logs/params.yaml.
repro-logs: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/dvc repro pipelines/logs/dvc.yaml

# Re-render dvc.yaml (and pipelines/*/dvc.yaml) from the DAG table in flows/dag.py.
dag: $(STAMP)
	$(BIN)/python -m flows.dag

test: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

BENCHES := $(filter-out bench/common.py bench/__init__.py,$(wildcard bench/*.py))
bench: $(STAMP)
	for b in $(BENCHES); do $(BIN)/python $$b --quick || exit 1; done

# Regenerate the constraints file from the current environment (after changing pyproject.toml);
# its leading comment lines (why some pins are what they are) are kept.
lock: $(STAMP)
	{ grep '^#' $(CONSTRAINTS); $(BIN)/python -m pip freeze --exclude-editable | \
	  grep -vE '^(torchrec|fbgemm-gpu)'; } > $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)

# MLflow's UI opens on GenAI traces until its top-left switch says "Model training": the
# address printed opens on the training runs (lrm.tracking.ui_url). Printed once the server
# is warm: `mlflow ui` on ./mlflow.db, 127.0.0.1:5000, one worker, whose first requests are
# made alone, past MLflow 3.17's race (a first page's registry request answered 500,
# "expression 'SqlUserRoleAssignment.user_id' failed to locate a name"): lrm/mlflow_ui.py
ui: $(STAMP)
	$(BIN)/python -m lrm.mlflow_ui

clean:
	rm -rf $(VENV) .pytest_cache

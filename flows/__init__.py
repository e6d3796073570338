"""Prefect flows that chain the stages: the pipeline and the streaming retraining flow."""

import os

# The sandboxed default: no telemetry calls out of the machine from the ephemeral server.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

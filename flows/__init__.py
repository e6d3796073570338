"""Prefect flows that chain the stages: the pipeline and the streaming retraining flow."""

"""lrm: large recommendation model pipeline (library; knows nothing of DVC or Prefect)."""

__version__ = "0.1.0"

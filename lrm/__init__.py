"""lrm: large recommendation model pipeline (library; knows nothing of DVC or Prefect)."""

import os

__version__ = "0.1.0"

# Arrow's C++ default pool is chosen from this variable once, when pyarrow is imported:
# the C library's malloc unless the user chose one (why: lrm.data.parquet.ARROW_POOL)
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

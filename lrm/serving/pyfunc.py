"""The final model as an MLflow pyfunc: impressions in (a DataFrame), click probabilities out.

A model fed KeyedJaggedTensors does not torch.export cleanly, so what MLflow logs is this
wrapper over the plain model folder (lrm.models.saved, artifact "model"), logged as code
(`mlflow_model.py`, MLflow's models-from-code: nothing is pickled). Its input is the
impressions layout's columns (session id, user-side ids and sequences, item-side ids,
dense floats), each optional: a missing value is null and a missing column is missing
everywhere; its output one column, `probability`. Rows are converted exactly as training
read them (the same BatchLoader, plain form, the model's hash sizes).

The logged signature has the output only; the input columns and their types are in the
MLmodel's metadata (`input_columns`) and `check_frame` enforces them. MLflow's own schema
enforcement would turn a null id into an HTTP 400 ("Failed to convert column user_id to
type 'int64'": a long column cannot hold one) and drop an unknown column with a warning
only the server's log shows; here a null is missing, as documented, and an unknown column
is a 400 that names it (an MlflowException with INVALID_PARAMETER_VALUE, as a value of the
wrong type is).

    model = mlflow.pyfunc.load_model(f"runs:/{run_id}/model")
    model.predict(frame)  # -> DataFrame {"probability": [...]}
"""

from __future__ import annotations

import importlib.metadata
import logging
import tempfile
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from mlflow.models import ModelSignature
from mlflow.types.schema import ColSpec, Schema

from lrm.data import parquet
from lrm.data.batch import Batch
from lrm.data.loader import BatchLoader
from lrm.data.schema import DAY, LABEL, POSITION, SESSION, FeatureSchema, day_files, read_schema
from lrm.errors import DataError, first_sentence
from lrm.models.saved import ModelCard, copy_model, load_model, read_card

OUTPUT = "probability"
REQUEST = "request"  # what a DataError about served input names as its file
MODEL_CODE = Path(__file__).with_name("mlflow_model.py")
_log = logging.getLogger(__name__)
REQUIREMENTS = ("torch", "fbgemm-gpu-cpu", "torchrec", "numpy", "pandas", "pyarrow",
                "polars", "tensordict", "torchmetrics", "pyre-extensions", "mlflow")


def input_columns(schema: FeatureSchema) -> list[str]:
    return [SESSION, *schema.user_sparse, *schema.user_seq, *schema.item_sparse, *schema.dense]


def column_types(schema: FeatureSchema) -> dict[str, str]:
    """Every input column and its type (all optional; a null is a missing value)."""
    return {SESSION: "long", **{c: "long" for c in schema.user_sparse},
            **{c: "array<long>" for c in schema.user_seq},
            **{c: "long" for c in schema.item_sparse}, **{c: "float" for c in schema.dense}}


def signature() -> ModelSignature:
    """The output only: the inputs are checked by `check_frame` (module docstring)."""
    return ModelSignature(inputs=None, outputs=Schema([ColSpec("double", OUTPUT)]))


def check_frame(frame: pd.DataFrame, schema: FeatureSchema) -> None:
    """A column the model does not read, or one named twice, is an error that names it."""
    known = input_columns(schema)
    twice = sorted({str(c) for c in frame.columns[frame.columns.duplicated()]})
    if twice:
        raise DataError(REQUEST, None, ", ".join(twice), "column named twice")
    unknown = [str(c) for c in frame.columns if c not in known]
    if unknown:
        raise DataError(REQUEST, None, ", ".join(unknown),
                        f"unknown column{'s' if len(unknown) > 1 else ''}: the model reads "
                        f"{', '.join(known)} (each optional)")


def _why_not_id(v: Any) -> str | None:
    """Why `v` is not an id (a JSON whole number in the 64-bit range, or null); None if it is.
    pandas holds an id column with a null as floats, so a whole float is an id."""
    if isinstance(v, (bool, np.bool_)):
        return f"{str(v).lower()} is not an id"
    if isinstance(v, (int, np.integer)):
        return None if -2**63 <= v < 2**63 else f"{v} is outside the 64-bit id range"
    if isinstance(v, (float, np.floating)):
        if np.isnan(v):
            return None
        return None if v.is_integer() and -2.0**63 <= v < 2.0**63 else f"{v} is not an id"
    return None if v is None else f"{type(v).__name__} {str(v)[:40]!r} is not an id"


def _why_not_float(v: Any) -> str | None:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.number)):
        return None if v is None else f"{str(v)[:40]!r} is not a number"
    return None


def _why_not_ids(v: Any) -> str | None:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return None
    if not isinstance(v, (list, tuple, np.ndarray)):
        return f"{str(v)[:40]!r} is not a list of ids"
    return next((f"in the list: {w}" for w in map(_why_not_id, v) if w is not None), None)


def _check_values(col: pd.Series, kind: pa.DataType) -> None:
    """A DataError naming the field and the request's row (from 1) of the first value that is
    not of the column's type: a bool, a string, an id past 64 bits, a number for a list.
    Checked here, not left to pyarrow: it takes true as 1 and "3" as 3, and an id past 64
    bits or a scalar for a list escaped as a traceback (issue 45)."""
    dtype = col.dtype
    if pa.types.is_list(kind):
        why = _why_not_ids
    elif dtype.kind in "iu" and not (dtype.kind == "u" and len(col) and col.max() >= 2**63):
        return  # whole numbers in range, no null: nothing to check per value
    else:
        why = _why_not_id if pa.types.is_integer(kind) else _why_not_float
        if dtype.kind == "f" and why is _why_not_float:
            return
    for row, v in enumerate(col.tolist(), 1):
        w = why(v)
        if w is not None:
            raise DataError(REQUEST, None, str(col.name), f"row {row}: {w}")


def _to_table(frame: pd.DataFrame, schema: FeatureSchema) -> pa.Table:
    """The frame as an impressions-layout table (absent bookkeeping columns filled in)."""
    target = schema.arrow("impressions")
    n = len(frame)
    filled = {DAY: np.zeros(n, np.int32), SESSION: np.arange(n, dtype=np.int64),
              POSITION: np.zeros(n, np.int16), LABEL: np.zeros(n, np.int8)}
    arrays = []
    for f in target:
        if f.name in frame.columns:
            col = frame[f.name]
            _check_values(col, f.type)
            if pa.types.is_list(f.type):  # lists (or numpy arrays) of ids; None: no value
                col = [None if v is None or (np.isscalar(v) and pd.isna(v)) else list(v)
                       for v in col.tolist()]
            try:
                arrays.append(pa.array(col, type=f.type, from_pandas=True))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
                raise DataError(REQUEST, None, f.name, f"not {f.type}: {first_sentence(str(e))}"
                                ) from None
        elif f.name in filled:
            arrays.append(pa.array(filled[f.name], type=f.type))
        else:
            arrays.append(pa.nulls(n, type=f.type))  # an absent feature: missing everywhere
    return pa.Table.from_arrays(arrays, schema=target)


def frame_to_batch(frame: pd.DataFrame, card: ModelCard) -> Batch:
    """One plain Batch of the frame's rows, in order, converted as the training loader does."""
    with tempfile.TemporaryDirectory(prefix="lrm-pyfunc-") as tmp:
        path = Path(tmp) / "day=0" / "part-00000.parquet"
        path.parent.mkdir()
        pq.write_table(_to_table(frame, card.schema), path)
        loader = BatchLoader(Path(tmp), max(len(frame), 1), dedup=False,
                             hash_sizes=card.hash_sizes, prefetch=0, num_workers=0)
        return next(iter(loader))


def predict_frame(model: torch.nn.Module, card: ModelCard, frame: pd.DataFrame) -> pd.DataFrame:
    if len(frame) == 0:
        return pd.DataFrame({OUTPUT: np.zeros(0, np.float64)})
    with torch.no_grad():
        p = torch.sigmoid(model(frame_to_batch(frame, card)).float())
    return pd.DataFrame({OUTPUT: p.double().numpy()})


class LrmModel(mlflow.pyfunc.PythonModel):
    """pyfunc over a model folder: predict(DataFrame of impressions) -> {probability}."""

    def load_context(self, context: Any) -> None:
        self.model, self.card = load_model(Path(context.artifacts["model"]))

    def predict(self, context: Any, model_input: pd.DataFrame,
                params: dict[str, Any] | None = None) -> pd.DataFrame:
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import INTERNAL_ERROR, INVALID_PARAMETER_VALUE

        frame = pd.DataFrame(model_input)
        try:
            check_frame(frame, self.card.schema)
            return predict_frame(self.model, self.card, frame)
        except DataError as e:  # the scoring server answers it with HTTP 400
            raise MlflowException(str(e), error_code=INVALID_PARAMETER_VALUE) from None
        except Exception:  # the trace goes to the server's log, not to the client
            _log.exception("scoring a request failed")
            raise MlflowException("lrm could not score the request (the server's log has why)",
                                  error_code=INTERNAL_ERROR) from None


def example_frame(data: Path, day: int, rows: int = 5) -> pd.DataFrame:
    """The first `rows` impressions of `day` as a model input frame (either layout)."""
    from lrm.data.dedup import flatten_sessions

    schema, layout = read_schema(data)
    files = day_files(data).get(day)
    if not files:
        raise DataError(data, None, None, f"no day {day}")
    pf = parquet.open_file(files[0])
    batches: list[pa.RecordBatch] = []
    for rb in parquet.iter_batches(files[0], rows, file=pf):  # a batch ends with its row group
        batches.append(rb)
        if sum(map(len, batches)) >= rows:
            break
    table = pa.Table.from_batches(batches) if batches else pf.schema_arrow.empty_table()
    if layout == "sessions":
        table = flatten_sessions(table, schema)
    table = table.slice(0, rows).select(input_columns(schema))
    # MLflow's schema enforcement cannot carry a missing value in a `long` column (pandas
    # NA -> int fails), so columns with a null here are left out of the example: every
    # column is optional in the signature and an absent one means "missing" (_to_table).
    table = table.select([c for c in table.column_names if table.column(c).null_count == 0])
    return table.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)


def _requirements() -> list[str]:
    reqs = []
    for name in REQUIREMENTS:
        try:
            reqs.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return reqs


def log_model(model_dir: Path, data: Path, day: int, name: str = "model") -> Any:
    """Log the model folder as a pyfunc to the active MLflow run; returns MLflow's ModelInfo.
    A verified copy of the folder is packaged, with its own record (lrm.models.saved.copy_model):
    what is served is what was scored, and serving checks it again when it loads it."""
    card = read_card(model_dir)
    example = example_frame(data, day)
    with tempfile.TemporaryDirectory(prefix="lrm-package-") as tmp:
        packaged = copy_model(model_dir, Path(tmp) / "model")  # with its own record
        return mlflow.pyfunc.log_model(
            name=name, python_model=str(MODEL_CODE), artifacts={"model": str(packaged)},
            signature=signature(), input_example=example,
            metadata={"input_columns": column_types(card.schema)},
            code_paths=[str(Path(__file__).resolve().parents[1])],  # the lrm package
            pip_requirements=_requirements(),
        )

"""MLflow models-from-code entry: the file MLflow copies into the logged model and runs.

It names the pyfunc object (lrm.serving.pyfunc.LrmModel); its weights and config come from
the "model" artifact (the model folder), so nothing is pickled.
"""

from mlflow.models import set_model

from lrm.serving.pyfunc import LrmModel

set_model(LrmModel())
